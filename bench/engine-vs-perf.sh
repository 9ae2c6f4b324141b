#!/usr/bin/env bash
# fio's rnbd engine against rnbd-client perf on the same job (issue 17 item
# 1: perf is checked against the yardstick). Both run 4 KiB randrw 50/50 at
# QD 32 on an rnbd-server memory device over loopback tcp, alternating, each
# with its completions polled on its own thread (the default of both) and
# on librnbd's threads (rnbd_poll=0, --completions threads). Also fio with
# its null engine, the same job: what fio itself costs per IO. Per
# contender the IO/s and the CPU time per IO of client and server
# (bench/chains.py). Goal: the engine's IO/s within 10 % of perf's.
# RUNS (7) runs of DURATION (6) s; --record appends the section to
# bench/RESULTS.md with its plot.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-7}
DURATION=${DURATION:-6}
QD=${QD:-32}
record=false
[ "${1:-}" = --record ] && record=true

. bench/lib.sh
fio_with_engine

bench_processes
size=1G
"$PWD/build-release/daemons/rnbd-server" --port 0 --dev-search-path "$tmp" \
	--mem-device "mem0:$size" --quiet >"$tmp/server.log" 2>&1 &
pids+=($!)
spid=$!
for _ in $(seq 100); do grep -q 'listening on port' "$tmp/server.log" && break; sleep 0.05; done
port=$(grep -o 'port [0-9]*' "$tmp/server.log" | cut -d' ' -f2)
# The device written whole once, so that no contender pays for first touches.
"$fio" --name=fill --ioengine="external:$engine" --rnbd_server="127.0.0.1:$port" \
	--rnbd_session=bench-fill --filename=mem0 --rw=write --bs=1M --size="$size" --iodepth=8 \
	--thread >/dev/null

job=(--name=bench --rw=randrw --rwmixread=50 --bs=4k --size="$size" --iodepth="$QD"
	--runtime="$DURATION" --time_based --thread --norandommap --randrepeat=0
	--output-format=json)
fio_job() { # SESSION [ENGINE OPTION]
	printf '%s\n' "$fio" "${job[@]}" --ioengine="external:$engine" \
		--rnbd_server="127.0.0.1:$port" --rnbd_session="$1" --filename=mem0 ${2:+"$2"}
}
perf_job() { # COMPLETIONS
	printf '%s\n' "$PWD/build-release/tools/rnbd-client" perf --server "127.0.0.1:$port" \
		--session bench-perf --device mem0 --rw randrw --rwmixread 50 --bs 4k \
		--iodepth "$QD" --size "$size" --runtime "$DURATION" --completions "$1" --json
}
python3 - "$tmp/spec.json" "$RUNS" "$QD" "$spid" \
	"$(fio_job bench-fio | paste -sd'\t')" \
	"$(perf_job poll | paste -sd'\t')" \
	"$(fio_job bench-fio-thr --rnbd_poll=0 | paste -sd'\t')" \
	"$(perf_job threads | paste -sd'\t')" \
	"$(printf '%s\n' "$fio" "${job[@]}" --ioengine=null | paste -sd'\t')" <<'PY'
import json, sys
out, runs, qd, srv = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
cmds = [a.split("\t") for a in sys.argv[5:]]
chains = [
    ("fio-poll", "fio rnbd engine, polled", "fio", {"rnbd-server": srv}),
    ("perf-poll", "rnbd-client perf, polled", "perf", {"rnbd-server": srv}),
    ("fio-thr", "fio rnbd engine, rnbd_poll=0", "fio", {"rnbd-server": srv}),
    ("perf-thr", "rnbd-client perf, --completions threads", "perf", {"rnbd-server": srv}),
    ("fio-null", "fio null engine (fio alone)", "fio", {}),
]
json.dump({"runs": runs, "title": "4 KiB randrw 50/50, QD %s, rnbd-server memory, loopback" % qd,
           "chains": [{"name": n, "label": l, "kind": k, "procs": p, "cmd": c}
                      for (n, l, k, p), c in zip(chains, cmds)]}, open(out, "w"))
PY
day=$(date -u +%Y-%m-%d)
plot=bench/plots/engine-vs-perf-$day${TAG:+-$TAG}.png  # TAG: runs of one day keep their plots
/usr/bin/python3 bench/chains.py "$tmp/spec.json" "$tmp/out.json" "$tmp/plot.png"

report=$(python3 - "$tmp/out.json" "$RUNS" "$DURATION" "$QD" "$(machine)" "$plot" "$day" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from chains import round_ratio
o = json.load(open(sys.argv[1]))
runs, dur, qd, machine, plot, day = sys.argv[2:8]
c = {x["name"]: x for x in o["chains"]}
def r(a, b, k="cpu_us_per_io"):
    return round_ratio(c[a], c[b], k)
def client(x):  # the client's CPU per IO in each run
    return [dict(y, client_us=y["cpu"]["client"] * 1e6 / y["ios"]) for y in x["runs"]]
print()
print("### %s fio's rnbd engine against rnbd-client perf, loopback tcp" % day)
print()
print("Machine: %s. Command: `RUNS=%s DURATION=%s QD=%s bench/engine-vs-perf.sh` (4 KiB randrw "
      "50/50, QD %s, rnbd-server memory device, medians of %s rounds of %s s runs, the order rotating; CPU per "
      "IO = utime + stime of the client process and rnbd-server over the run, divided by the "
      "IOs). Plot: `%s`." % (machine, runs, dur, qd, qd, runs, dur, plot))
print()
print("| contender | IO/s | CPU us per IO | of which client | of which rnbd-server |")
print("|---|---|---|---|---|")
for x in o["chains"]:
    p = x["cpu_parts_us_per_io"]
    print("| %s | %.0f | %.2f | %.2f | %s |" % (x["label"], x["iops"], x["cpu_us_per_io"],
          p["client"], "%.2f" % p["rnbd-server"] if "rnbd-server" in p else "-"))
print()
print("Ratios are taken in each round, then their median over the rounds, with the lowest and "
      "highest in brackets.")
print()
print("| ratio | value (range over the rounds) | goal |")
print("|---|---|---|")
print("| fio engine / perf, IO/s, both polled | %s | 0.9-1.1x |" % r("fio-poll", "perf-poll", "iops"))
print("| fio engine / perf, IO/s, both on librnbd's threads | %s | 0.9-1.1x |" % r("fio-thr", "perf-thr", "iops"))
print("| fio engine / perf, CPU per IO, both polled | %s | |" % r("fio-poll", "perf-poll"))
print("| fio engine / perf, client CPU per IO, both polled | %s | |" %
      round_ratio({"runs": client(c["fio-poll"])}, {"runs": client(c["perf-poll"])}, "client_us"))
PY
)
echo "$report"
if $record; then
	mkdir -p bench/plots
	cp "$tmp/plot.png" "$plot"
	echo "$report" >>bench/RESULTS.md
fi
