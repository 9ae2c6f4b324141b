#!/usr/bin/env bash
# Two builds of rnbd-server under the same fio jobs, alternating: BASE (a
# git revision, built in a scratch worktree) and the tree as it is
# (build-release). Both serve a memory device (MEM, 1G) over loopback tcp;
# the client is one fio with this tree's RNBD engine (bench/fio/rnbd-fio.c),
# the same for both, so a difference is the server's. Per build and load
# (4 KiB randrw 50/50 and randwrite, QD 32): IO/s and CPU time per IO of
# rnbd-server and of fio (utime + stime over the run), medians of RUNS runs
# of DURATION s (bench/chains.py), and the ratios new / base. Before the
# runs each server takes a write of every block through fio's verify
# (crc32c in each block, read back and checked), or the script stops.
#   BASE=4fefb38 bench/server-compare-builds.sh [--record]
# --record appends the section to bench/RESULTS.md, with its plot in
# bench/plots/server-compare-builds-DATE[-TAG].png.
# Environment: BASE (HEAD~1), RUNS (5), DURATION (8), QD (32), MEM (1G),
# SERVER_OPTS (more rnbd-server options for both, e.g. --no-invalidate),
# DEVICE (mem: the memory device; file: a file of MEM bytes in /var/tmp,
# served through the engine), FSYNC (N: fio sends a flush after every N
# writes; 0, the default: none).
set -euo pipefail
cd "$(dirname "$0")/.."
record=false
[ "${1:-}" = --record ] && { record=true; shift; }
[ $# -eq 0 ] || { echo "usage: $0 [--record]" >&2; exit 2; }
BASE=${BASE:-HEAD~1}
RUNS=${RUNS:-5}
DURATION=${DURATION:-8}
QD=${QD:-32}
MEM=${MEM:-1G}
SERVER_OPTS=${SERVER_OPTS:-}
DEVICE=${DEVICE:-mem}
FSYNC=${FSYNC:-0}
[ "$DEVICE" = mem ] || [ "$DEVICE" = file ] || { echo "$0: DEVICE: mem or file" >&2; exit 2; }
[[ "$FSYNC" =~ ^[0-9]+$ ]] || { echo "$0: FSYNC: a whole number" >&2; exit 2; }
export DEVICE FSYNC # for the report
for v in RUNS DURATION QD; do
	[[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "$0: $v: a whole number, at least 1" >&2; exit 2; }
done
[[ "$MEM" =~ ^[1-9][0-9]*[MG]$ ]] || { echo "$0: MEM: a size in M or G (1G)" >&2; exit 2; }
base_rev=$(git rev-parse --short "$BASE^{commit}") || { echo "$0: no revision $BASE" >&2; exit 2; }
new_rev=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- lib daemons include || new_rev="$new_rev+"

. bench/lib.sh
fio_with_engine
bench_processes
base_src=$tmp/base
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
	git worktree remove --force "$base_src" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
git worktree add --detach "$base_src" "$base_rev" >/dev/null 2>&1
meson setup "$base_src/build" "$base_src" -Dbuildtype=release >/dev/null
meson compile -C "$base_src/build" daemons/rnbd-server >/dev/null

if [ "$DEVICE" = file ]; then
	dev=disk.img
	truncate -s "$MEM" "$tmp/$dev"
else
	dev=mem0
fi
start_server() { # NAME BINARY: sets port_NAME and pid_NAME
	# shellcheck disable=SC2086 # SERVER_OPTS: words
	"$2" --port 0 --dev-search-path "$tmp" --mem-device "mem0:$MEM" --quiet $SERVER_OPTS \
		>"$tmp/$1.log" 2>&1 &
	pids+=($!)
	printf -v "pid_$1" %s $!
	for _ in $(seq 100); do grep -q 'listening on port' "$tmp/$1.log" && break; sleep 0.05; done
	printf -v "port_$1" %s "$(grep -o 'port [0-9]*' "$tmp/$1.log" | cut -d' ' -f2)"
	[ -n "$(eval echo "\$port_$1")" ] || { echo "$0: $1's rnbd-server did not start:" >&2
		cat "$tmp/$1.log" >&2; exit 1; }
}
start_server base "$base_src/build/daemons/rnbd-server"
start_server new "$PWD/build-release/daemons/rnbd-server"

for b in base new; do
	port=port_$b
	if ! "$fio" --name=verify --ioengine="external:$engine" --rnbd_server="127.0.0.1:${!port}" \
		--rnbd_session="verify-$b" --filename="$dev" --rw=randwrite --bs=4k --size="$MEM" \
		--iodepth=16 --thread --verify=crc32c --do_verify=1 --verify_fatal=1 \
		>"$tmp/verify-$b.out" 2>&1; then
		echo "$0: the $b server's data did not verify:" >&2
		tail -20 "$tmp/verify-$b.out" >&2
		exit 1
	fi
done

job() { # BUILD RW
	local port=port_$1
	printf '%s\n' "$fio" --name=bench --rw="$2" --rwmixread=50 --bs=4k --size="$MEM" \
		--iodepth="$QD" --runtime="$DURATION" --time_based --thread --norandommap \
		--randrepeat=0 --output-format=json --ioengine="external:$engine" \
		--rnbd_server="127.0.0.1:${!port}" --rnbd_session="bench-$1-$2" --filename="$dev" \
		--fsync="$FSYNC"
}
python3 - "$tmp/spec.json" "$RUNS" "$QD" "$pid_base" "$pid_new" "$base_rev" "$new_rev" \
	"$(job base randrw | paste -sd'\t')" "$(job new randrw | paste -sd'\t')" \
	"$(job base randwrite | paste -sd'\t')" "$(job new randwrite | paste -sd'\t')" <<'PY'
import json, sys
out, runs, qd, pb, pn, rb, rn = sys.argv[1:8]
cmds = [a.split("\t") for a in sys.argv[8:]]
chains = [("base-randrw", "base %s, randrw" % rb, int(pb)), ("new-randrw", "new %s, randrw" % rn, int(pn)),
          ("base-randwrite", "base %s, randwrite" % rb, int(pb)),
          ("new-randwrite", "new %s, randwrite" % rn, int(pn))]
import os
what = "memory device" if os.environ["DEVICE"] == "mem" else "file"
if os.environ["FSYNC"] != "0":
    what += ", a flush every %s writes" % os.environ["FSYNC"]
json.dump({"runs": int(runs), "title": "rnbd-server %s vs %s, 4 KiB, QD %s, %s" % (rn, rb, qd, what),
           "chains": [{"name": n, "label": l, "kind": "fio", "procs": {"rnbd-server": p}, "cmd": c}
                      for (n, l, p), c in zip(chains, cmds)]}, open(out, "w"))
PY
day=$(date -u +%Y-%m-%d)
plot=bench/plots/server-compare-builds-$day${TAG:+-$TAG}.png
/usr/bin/python3 bench/chains.py "$tmp/spec.json" "$tmp/out.json" "$tmp/plot.png"

report=$(python3 - "$tmp/out.json" "$RUNS" "$DURATION" "$QD" "$MEM" "$(machine)" "$plot" "$day" \
	"$base_rev" "$new_rev" "$BASE" "$SERVER_OPTS" <<'PY'
import json, sys
o = json.load(open(sys.argv[1]))
runs, dur, qd, mem, machine, plot, day, rb, rn, base, opts = sys.argv[2:13]
c = {x["name"]: x for x in o["chains"]}
print()
import os
dev, fsync = os.environ["DEVICE"], os.environ["FSYNC"]
what = "memory device" if dev == "mem" else "a %s file on /var/tmp" % mem
if fsync != "0":
    what += ", a flush (fio `--fsync=%s`) after every %s writes" % (fsync, fsync)
env = "".join(" %s=%s" % (k, v) for k, v in (("DEVICE", dev), ("FSYNC", fsync))
              if v not in ("mem", "0"))
print("### %s rnbd-server: %s against %s, loopback tcp, %s" % (day, rn, rb, what))
print()
print("Machine: %s. Command: `BASE=%s RUNS=%s DURATION=%s QD=%s%s%s bench/server-compare-builds.sh` "
      "(4 KiB, QD %s, medians of %s alternating runs of %s s against `rnbd-server --mem-device mem0:%s%s`, "
      "device: %s; the client is the same fio and RNBD engine for both; CPU per IO = utime + stime "
      "over the run, divided by its IOs (flushes not counted as IOs); each server's data verified by "
      "fio's crc32c first). Plot: `%s`."
      % (machine, base, runs, dur, qd, " SERVER_OPTS='%s'" % opts if opts else "", env, qd, runs, dur,
         mem, " " + opts if opts else "", what, plot))
print()
print("| load | build | IO/s | rnbd-server CPU us per IO | fio CPU us per IO | both |")
print("|---|---|---|---|---|---|")
for load in ("randrw", "randwrite"):
    for b, rev in (("base", rb), ("new", rn)):
        x = c["%s-%s" % (b, load)]
        p = x["cpu_parts_us_per_io"]
        print("| %s | %s %s | %.0f | %.2f | %.2f | %.2f |" % (load, b, rev, x["iops"], p["rnbd-server"],
              p["client"], x["cpu_us_per_io"]))
print()
print("| load | new / base: IO/s | rnbd-server CPU per IO | both, CPU per IO |")
print("|---|---|---|---|")
for load in ("randrw", "randwrite"):
    n, b = c["new-" + load], c["base-" + load]
    print("| %s | %.2fx | %.2fx | %.2fx |" % (load, n["iops"] / b["iops"],
          n["cpu_parts_us_per_io"]["rnbd-server"] / b["cpu_parts_us_per_io"]["rnbd-server"],
          n["cpu_us_per_io"] / b["cpu_us_per_io"]))
print()
def srv(r):
    return r["cpu"]["rnbd-server"] * 1e6 / r["ios"]
for load in ("randrw", "randwrite"):
    pairs = zip(c["new-" + load]["runs"], c["base-" + load]["runs"])
    print("Pair by pair, %s, new / base rnbd-server CPU per IO: %s." % (load, " ".join(
        "%.2fx" % (srv(n) / srv(b)) for n, b in pairs)))
PY
)
echo "$report"
if $record; then
	mkdir -p bench/plots
	cp "$tmp/plot.png" "$plot"
	echo "$report" >>bench/RESULTS.md
fi
