#!/usr/bin/env bash
# rnbd-server's file backend, engine by engine (issue 17, item 3): the same
# fio job (the rnbd engine, polled; 4 KiB randrw 50/50 at QD 32 on a 1 GiB
# file written whole first) against rnbd-server with --engine io_uring and
# --engine threads, each buffered and with --direct, io_uring buffered with
# --no-inline-writes (every write through the ring), and against nbdkit's
# file plugin on the same file (buffered, fio's nbd engine), alternating;
# per chain the IO/s and the CPU per IO of the server and of the whole chain
# (bench/chains.py). Every rnbd-server engine tries RWF_NOWAIT first:
# what the page cache holds is done on the completion thread that received
# the request; where the file system cannot write so (ext4), buffered
# writes are done there all the same (--inline-writes, the default).
# RUNS (3) runs of DURATION (8) s; --record appends the section to
# bench/RESULTS.md with its plot.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
DURATION=${DURATION:-8}
QD=${QD:-32}
record=false
[ "${1:-}" = --record ] && record=true

. bench/lib.sh
fio_with_engine

bench_processes
dd if=/dev/zero of="$tmp/disk.img" bs=1M count=1024 status=none
declare -A spid sport
for cfg in uring:io_uring uring-ring:io_uring:--no-inline-writes uring-direct:io_uring:--direct \
	threads:threads threads-direct:threads:--direct; do
	IFS=: read -r name eng direct <<<"$cfg"
	"$PWD/build-release/daemons/rnbd-server" --port 0 --dev-search-path "$tmp" \
		--engine "$eng" ${direct:+"$direct"} --quiet >"$tmp/$name.log" 2>&1 &
	pids+=($!)
	spid[$name]=$!
	for _ in $(seq 100); do grep -q 'listening on port' "$tmp/$name.log" && break; sleep 0.05; done
	sport[$name]=$(grep -o 'port [0-9]*' "$tmp/$name.log" | cut -d' ' -f2)
done
base=$((20000 + $$ % 20000))
nbdkit -f --threads 64 -i 127.0.0.1 -p "$base" file "$tmp/disk.img" >"$tmp/nbdkit.log" 2>&1 &
pids+=($!)
nbdpid=$!
sleep 1
# The file in the page cache for the buffered chains, as for nbdkit.
cat "$tmp/disk.img" >/dev/null

job=(--name=bench --rw=randrw --rwmixread=50 --bs=4k --size=1G --iodepth="$QD"
	--runtime="$DURATION" --time_based --thread --norandommap --randrepeat=0
	--output-format=json)
rnbd_job() { # NAME
	printf '%s\n' "$fio" "${job[@]}" --ioengine="external:$engine" \
		--rnbd_server="127.0.0.1:${sport[$1]}" --rnbd_session="bench-$1" --filename=disk.img
}
/usr/bin/python3 - "$tmp/spec.json" "$RUNS" "$QD" "${spid[uring]}" "${spid[uring-ring]}" \
	"${spid[uring-direct]}" "${spid[threads]}" "${spid[threads-direct]}" "$nbdpid" \
	"$(rnbd_job uring | paste -sd'\t')" "$(rnbd_job uring-ring | paste -sd'\t')" \
	"$(rnbd_job uring-direct | paste -sd'\t')" \
	"$(rnbd_job threads | paste -sd'\t')" "$(rnbd_job threads-direct | paste -sd'\t')" \
	"$(printf '%s\n' "$fio" "${job[@]}" --ioengine=nbd --uri="nbd://127.0.0.1:$base/" |
		paste -sd'\t')" <<'PY'
import json, sys
out, runs, qd = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pids = list(map(int, sys.argv[4:10]))
cmds = [a.split("\t") for a in sys.argv[10:]]
chains = [
    ("uring", "rnbd-server --engine io_uring, buffered", {"rnbd-server": pids[0]}),
    ("uring-ring", "rnbd-server --engine io_uring --no-inline-writes", {"rnbd-server": pids[1]}),
    ("uring-direct", "rnbd-server --engine io_uring --direct", {"rnbd-server": pids[2]}),
    ("threads", "rnbd-server --engine threads, buffered", {"rnbd-server": pids[3]}),
    ("threads-direct", "rnbd-server --engine threads --direct", {"rnbd-server": pids[4]}),
    ("nbdkit", "nbdkit file plugin, buffered", {"nbdkit": pids[5]}),
]
json.dump({"runs": runs, "title": "4 KiB randrw 50/50 on a file, QD %s, loopback" % qd,
           "chains": [{"name": n, "label": l, "kind": "fio", "procs": p, "cmd": c}
                      for (n, l, p), c in zip(chains, cmds)]}, open(out, "w"))
PY
day=$(date -u +%Y-%m-%d)
plot=bench/plots/file-engines-$day.png
/usr/bin/python3 bench/chains.py "$tmp/spec.json" "$tmp/out.json" "$tmp/plot.png"

report=$(python3 - "$tmp/out.json" "$RUNS" "$DURATION" "$QD" "$(machine)" "$plot" "$day" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from chains import round_ratio
o = json.load(open(sys.argv[1]))
runs, dur, qd, machine, plot, day = sys.argv[2:8]
c = {x["name"]: x for x in o["chains"]}
srv = lambda x: sum(v for k, v in x["cpu_parts_us_per_io"].items() if k != "client")
def srv_runs(x):  # each run with its servers' CPU per IO
    return {"runs": [dict(y, srv_us=sum(v for k, v in y["cpu"].items() if k != "client") * 1e6 /
                          y["ios"]) for y in x["runs"]]}
print()
print("### %s rnbd-server's file engines against nbdkit's file plugin, loopback tcp" % day)
print()
print("Machine: %s. Command: `RUNS=%s DURATION=%s QD=%s bench/file-engines.sh` (fio, 4 KiB randrw "
      "50/50, QD %s, on a 1 GiB file written whole and read into the page cache first; the rnbd "
      "engine polled for rnbd-server, fio's nbd engine for nbdkit; medians of %s rounds "
      "of %s s runs, the order rotating). Plot: `%s`." % (machine, runs, dur, qd, qd, runs, dur, plot))
print()
print("| server | IO/s | server CPU us per IO | chain CPU us per IO | server / nbdkit's, per round (range) |")
print("|---|---|---|---|---|")
for x in o["chains"]:
    print("| %s | %.0f | %.2f | %.2f | %s |" % (x["label"], x["iops"], srv(x), x["cpu_us_per_io"],
                                              round_ratio(srv_runs(x), srv_runs(c["nbdkit"]),
                                                          "srv_us")))
PY
)
echo "$report"
if $record; then
	mkdir -p bench/plots
	cp "$tmp/plot.png" "$plot"
	echo "$report" >>bench/RESULTS.md
fi
