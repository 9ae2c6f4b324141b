#!/usr/bin/env bash
# The block path against nbdkit, with fio as the yardstick (issue 17): one
# fio job, 4 KiB randrw 50/50 at QD 32, against every contender, runs
# alternating, and per chain the IO/s and the CPU time per IO summed over
# every process of it (bench/chains.py):
#   rnbd-mem      fio (rnbd engine, bench/fio/rnbd-fio.c) -> RTRS tcp -> rnbd-server memory
#   rnbd-mem-thr  the same with rnbd_poll=0: completions on librnbd's threads, not fio's
#   rnbd-mem-noinv the same as rnbd-mem against a second rnbd-server started with
#                 --no-invalidate: what always_invalidate's key rotation costs
#   perf-mem      rnbd-client perf, the same job -> rnbd-server memory (polled completions)
#   perf-mem-thr  the same with --completions threads, as rnbd-mem-thr
#   gateway-mem   fio (nbd) -> nbdkit with the rnbd plugin (unix socket) -> rnbd-server memory
#   nbdkit-mem    fio (nbd) -> nbdkit memory plugin (NBD over loopback TCP)
#   rnbd-file     fio (rnbd engine) -> rnbd-server, a file export
#   nbdkit-file   fio (nbd) -> nbdkit file plugin, the same file
#   raw-write     bench/raw-loop (a minimal request/response loop over the same
#   raw-read      TCP on io_uring), 4 KiB writes or reads at the same QD: the
#                 floor the memory chain is held to (goal: within 1.15x of the
#                 mean of the two in CPU per IO)
# Each round runs every chain once, the order rotating from round to round;
# each ratio is taken within a round and reported as the median over the
# rounds with its range, since this machine's speed drifts between rounds.
# fio is built from the source of Debian's fio (bench/fio-build.sh) and the
# engine against it. RUNS (5) runs of DURATION (8) s each; --record appends
# the section to bench/RESULTS.md with its plot in bench/plots/.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
DURATION=${DURATION:-8}
QD=${QD:-32}
record=false
[ "${1:-}" = --record ] && record=true

. bench/lib.sh
fio_with_engine

bench_processes
size=1G
# Written once, so that no chain pays for first touches.
dd if=/dev/zero of="$tmp/disk.img" bs=1M count=1024 conv=notrunc status=none
"$PWD/build-release/daemons/rnbd-server" --port 0 --dev-search-path "$tmp" \
	--mem-device "mem0:$size" --quiet >"$tmp/server.log" 2>&1 &
pids+=($!)
spid=$!
# The same server without always_invalidate (no key rotation per IO), for its cost.
"$PWD/build-release/daemons/rnbd-server" --port 0 --dev-search-path "$tmp" \
	--mem-device "mem0:$size" --no-invalidate --quiet >"$tmp/server-noinv.log" 2>&1 &
pids+=($!)
nipid=$!
for _ in $(seq 100); do
	grep -q 'listening on port' "$tmp/server.log" && grep -q 'listening on port' \
		"$tmp/server-noinv.log" && break
	sleep 0.05
done
port=$(grep -o 'port [0-9]*' "$tmp/server.log" | cut -d' ' -f2)
niport=$(grep -o 'port [0-9]*' "$tmp/server-noinv.log" | cut -d' ' -f2)
nbdkit -f --threads 64 -U "$tmp/rnbd.sock" "$PWD/build-release/nbdkit/nbdkit-rnbd-plugin.so" \
	server="127.0.0.1:$port" session=bench-gw >"$tmp/nbdkit-rnbd.log" 2>&1 &
pids+=($!)
gwpid=$!
base=$((20000 + $$ % 20000))
nbdkit -f --threads 64 -i 127.0.0.1 -p "$base" memory "$size" >"$tmp/nbdkit-mem.log" 2>&1 &
pids+=($!)
mempid=$!
nbdkit -f --threads 64 -i 127.0.0.1 -p $((base + 1)) file "$tmp/disk.img" \
	>"$tmp/nbdkit-file.log" 2>&1 &
pids+=($!)
filepid=$!
"$PWD/build-release/bench/raw-loop" server --port 0 >"$tmp/raw.log" 2>&1 &
pids+=($!)
rawpid=$!
for _ in $(seq 100); do grep -q 'listening on port' "$tmp/raw.log" && break; sleep 0.05; done
rport=$(grep -o 'listening on port [0-9]*' "$tmp/raw.log" | grep -o '[0-9]*$')
sleep 2
# Every memory export written whole once (first touches), through its own path.
for uri in "nbd+unix:///mem0?socket=$tmp/rnbd.sock" "nbd://127.0.0.1:$base/"; do
	"$fio" --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --size="$size" \
		--iodepth=8 --thread >/dev/null
done
"$fio" --name=fill --ioengine="external:$engine" --rnbd_server="127.0.0.1:$niport" \
	--filename=mem0 --rw=write --bs=1M --size="$size" --iodepth=8 --thread >/dev/null

job=(--name=bench --rw=randrw --rwmixread=50 --bs=4k --size="$size" --iodepth="$QD"
	--runtime="$DURATION" --time_based --thread --norandommap --randrepeat=0
	--output-format=json)
rnbd_job() { # DEVICE SESSION [ENGINE OPTION [PORT]]
	printf '%s\n' "$fio" "${job[@]}" --ioengine="external:$engine" \
		--rnbd_server="127.0.0.1:${4:-$port}" --rnbd_session="$2" --filename="$1" ${3:+"$3"}
}
nbd_job() { # URI
	printf '%s\n' "$fio" "${job[@]}" --ioengine=nbd --uri="$1"
}
perf_job() { # DEVICE COMPLETIONS
	printf '%s\n' "$PWD/build-release/tools/rnbd-client" perf --server "127.0.0.1:$port" \
		--session bench-perf --device "$1" --rw randrw --rwmixread 50 --bs 4k \
		--iodepth "$QD" --size "$size" --runtime "$DURATION" --completions "$2" --json
}
raw_job() { # MODE
	printf '%s\n' "$PWD/build-release/bench/raw-loop" client --dst "127.0.0.1:$rport" \
		--mode "$1" --size 4096 --queue-depth "$QD" --duration "$DURATION" --json
}
python3 - "$tmp/spec.json" "$RUNS" "$QD" "$spid" "$gwpid" "$mempid" "$filepid" "$rawpid" "$nipid" \
	"$(rnbd_job mem0 bench-fio | paste -sd'\t')" \
	"$(rnbd_job mem0 bench-fio-thr --rnbd_poll=0 | paste -sd'\t')" \
	"$(rnbd_job mem0 bench-fio-noinv "" "$niport" | paste -sd'\t')" \
	"$(perf_job mem0 poll | paste -sd'\t')" \
	"$(perf_job mem0 threads | paste -sd'\t')" \
	"$(nbd_job "nbd+unix:///mem0?socket=$tmp/rnbd.sock" | paste -sd'\t')" \
	"$(nbd_job "nbd://127.0.0.1:$base/" | paste -sd'\t')" \
	"$(rnbd_job disk.img bench-fio-file | paste -sd'\t')" \
	"$(nbd_job "nbd://127.0.0.1:$((base + 1))/" | paste -sd'\t')" \
	"$(raw_job write | paste -sd'\t')" \
	"$(raw_job read | paste -sd'\t')" <<'PY'
import json, sys
out, runs, qd = sys.argv[1], int(sys.argv[2]), sys.argv[3]
srv, gw, mem, fil, raw, noinv = map(int, sys.argv[4:10])
cmds = [a.split("\t") for a in sys.argv[10:]]
chains = [
    ("rnbd-mem", "fio rnbd engine -> rnbd-server memory", "fio", {"rnbd-server": srv}),
    ("rnbd-mem-thr", "the same, completions on librnbd's threads (rnbd_poll=0)", "fio",
     {"rnbd-server": srv}),
    ("rnbd-mem-noinv", "fio rnbd engine -> rnbd-server memory, --no-invalidate", "fio",
     {"rnbd-server": noinv}),
    ("perf-mem", "rnbd-client perf -> rnbd-server memory", "perf", {"rnbd-server": srv}),
    ("perf-mem-thr", "the same, --completions threads", "perf", {"rnbd-server": srv}),
    ("gateway-mem", "fio nbd -> nbdkit rnbd plugin -> rnbd-server memory", "fio",
     {"nbdkit": gw, "rnbd-server": srv}),
    ("nbdkit-mem", "fio nbd -> nbdkit memory", "fio", {"nbdkit": mem}),
    ("rnbd-file", "fio rnbd engine -> rnbd-server file", "fio", {"rnbd-server": srv}),
    ("nbdkit-file", "fio nbd -> nbdkit file", "fio", {"nbdkit": fil}),
    ("raw-write", "raw io_uring loop, 4 KiB writes (bench/raw-loop)", "ops", {"raw-loop": raw}),
    ("raw-read", "raw io_uring loop, 4 KiB reads", "ops", {"raw-loop": raw}),
]
json.dump({"runs": runs, "title": "4 KiB randrw 50/50, QD %s, loopback" % qd,
           "chains": [{"name": n, "label": l, "kind": k, "procs": p, "cmd": c}
                      for (n, l, k, p), c in zip(chains, cmds)]}, open(out, "w"))
PY
day=$(date -u +%Y-%m-%d)
plot=bench/plots/block-chains-$day${TAG:+-$TAG}.png  # TAG: names the run's plot
i=2
while $record && [ -e "$plot" ]; do # a recorded run of the same day keeps its plot
	plot=bench/plots/block-chains-$day${TAG:+-$TAG}-$i.png
	i=$((i + 1))
done
/usr/bin/python3 bench/chains.py "$tmp/spec.json" "$tmp/out.json" "$tmp/plot.png"

report=$(python3 - "$tmp/out.json" "$RUNS" "$DURATION" "$QD" "$(machine)" "$plot" "$day" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from chains import round_ratio, spread
o = json.load(open(sys.argv[1]))
runs, dur, qd, machine, plot, day = sys.argv[2:8]
c = {x["name"]: x for x in o["chains"]}
rounds = range(len(o["chains"][0]["runs"]))
def run(a, i):
    return c[a]["runs"][i]
def part(a, i, proc):  # one process's CPU per IO in round i
    return run(a, i)["cpu"][proc] * 1e6 / run(a, i)["ios"]
def raw(i):  # the raw loop in round i: the mean of its writes and reads
    return (run("raw-write", i)["cpu_us_per_io"] + run("raw-read", i)["cpu_us_per_io"]) / 2
def per_round(f):  # f(i): a ratio in round i
    return spread([f(i) for i in rounds])
def r(a, b, k="cpu_us_per_io"):
    return round_ratio(c[a], c[b], k)
print()
print("### %s Block chains with fio as the yardstick, loopback tcp" % day)
print()
print("Machine: %s. Command: `RUNS=%s DURATION=%s QD=%s bench/block-chains.sh` (4 KiB randrw 50/50, "
      "QD %s, medians of %s rounds of %s s runs, every chain once per round, the order rotating; fio built from Debian's fio source, "
      "`--thread`; CPU per IO = utime + stime of every process of the chain over the run, "
      "divided by its IOs). Plot: `%s`." % (machine, runs, dur, qd, qd, runs, dur, plot))
print()
print("| chain | IO/s | CPU us per IO (all processes) | of which servers |")
print("|---|---|---|---|")
for x in o["chains"]:
    srv = sum(v for k, v in x["cpu_parts_us_per_io"].items() if k != "client")
    print("| %s | %.0f | %.2f | %.2f |" % (x["label"], x["iops"], x["cpu_us_per_io"], srv))
print()
print("Ratios are taken in each round, the two chains' runs of one round against each other, "
      "then their median over the %s rounds, with the lowest and highest in brackets." % runs)
print()
print("| ratio | value (range over the rounds) | goal |")
print("|---|---|---|")
print("| rnbd memory chain / nbdkit memory, CPU per IO | %s | <= 0.7x |" % r("rnbd-mem", "nbdkit-mem"))
print("| rnbd memory chain / raw loop (mean of its writes and reads), CPU per IO | %s | <= 1.15x |"
      % per_round(lambda i: run("rnbd-mem", i)["cpu_us_per_io"] / raw(i)))
print("| the same without always_invalidate (a server with --no-invalidate) / raw loop, CPU per IO | %s | |"
      % per_round(lambda i: run("rnbd-mem-noinv", i)["cpu_us_per_io"] / raw(i)))
print("| rnbd memory chain / the same without always_invalidate, CPU per IO | %s | |"
      % r("rnbd-mem", "rnbd-mem-noinv"))
print("| rnbd file chain / nbdkit file, CPU per IO | %s | <= 0.8x |" % r("rnbd-file", "nbdkit-file"))
print("| rnbd-server / nbdkit file plugin, CPU per file IO | %s | <= 1.0x |"
      % per_round(lambda i: part("rnbd-file", i, "rnbd-server") / part("nbdkit-file", i, "nbdkit")))
print("| NBD gateway chain / nbdkit memory, CPU per IO | %s | <= 1.5x |" % r("gateway-mem", "nbdkit-mem"))
print("| fio rnbd engine / rnbd-client perf, IO/s, both polled | %s | within 10 %% |" % r("rnbd-mem", "perf-mem", "iops"))
print("| fio rnbd engine / rnbd-client perf, IO/s, both on librnbd's threads | %s | within 10 %% |" % r("rnbd-mem-thr", "perf-mem-thr", "iops"))
print("| fio rnbd engine / rnbd-client perf, CPU per IO, both polled | %s | |" % r("rnbd-mem", "perf-mem"))
print("| fio rnbd engine, polled / on librnbd's threads, CPU per IO | %s | |" % r("rnbd-mem", "rnbd-mem-thr"))
# The gateway is both other chains end to end: fio and nbdkit as in the
# nbdkit memory chain, then an RTRS client and rnbd-server as in the perf
# chain on librnbd's threads, as the plugin's are. Their sum (less the
# memory plugin's copy and perf's own IO generation, both small) is what
# the gateway cannot go below.
def floor(i):
    return run("nbdkit-mem", i)["cpu_us_per_io"] + run("perf-mem-thr", i)["cpu_us_per_io"]
print("| NBD gateway chain / (nbdkit memory + rnbd-client perf chains), CPU per IO | %s | |"
      % per_round(lambda i: run("gateway-mem", i)["cpu_us_per_io"] / floor(i)))
print("| (nbdkit memory + rnbd-client perf chains) / nbdkit memory, CPU per IO | %s | |"
      % per_round(lambda i: floor(i) / run("nbdkit-mem", i)["cpu_us_per_io"]))
PY
)
echo "$report"
if $record; then
	mkdir -p bench/plots
	cp "$tmp/plot.png" "$plot"
	echo "$report" >>bench/RESULTS.md
fi
