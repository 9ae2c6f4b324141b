#!/usr/bin/env bash
# The transport at 4 KiB against the least loop TCP on io_uring allows
# (issues 17, 35): bench/raw-loop (one connection, a header and the data per
# request and per answer, no frames, permits, keys or heartbeats) against rtrs-perf on
# one IO connection, the same size and queue depth, writes and reads, over
# loopback tcp; runs alternate (bench/chains.py), and per contender the
# ops/s and CPU time per op of client and server together. Goal (issue 35):
# rtrs-perf >= 1.0x the raw loop in ops/s with CPU per op <= 1.1x. rtrs-perf runs
# twice: as deployed (always_invalidate: a new chunk key per IO) and with
# --no-invalidate, the raw loop's terms (its keys never change). The raw loop
# runs a second time with --syscalls (readiness from a poll on its ring, then
# recv(2) and send(2), the tcp fabric's model): what moving the fabric's data
# onto the ring could still gain. RUNS (5) runs of
# DURATION (5) s; SIZE (4k), QD (64); --record appends the section to
# bench/RESULTS.md with its plot.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
DURATION=${DURATION:-5}
SIZE=${SIZE:-4096}
QD=${QD:-64}
record=false
[ "${1:-}" = --record ] && record=true
dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q "install ok installed" ||
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		python3-matplotlib >/dev/null
. bench/lib.sh
bench_processes
raw=$PWD/build-release/bench/raw-loop

"$raw" server --port 0 >"$tmp/raw.log" 2>&1 &
pids+=($!)
rawpid=$!
"$raw" server --port 0 --syscalls >"$tmp/raw-sc.log" 2>&1 &
pids+=($!)
scpid=$!
"$perf" server --port 0 >"$tmp/perf.log" 2>&1 &
pids+=($!)
perfpid=$!
"$perf" server --port 0 --no-invalidate >"$tmp/perf-ni.log" 2>&1 &
pids+=($!)
nipid=$!
for _ in $(seq 100); do
	grep -q 'listening on port' "$tmp/raw.log" && grep -q 'port [0-9]' "$tmp/perf.log" &&
		grep -q 'listening on port' "$tmp/raw-sc.log" &&
		grep -q 'port [0-9]' "$tmp/perf-ni.log" && break
	sleep 0.05
done
rport=$(grep -o 'listening on port [0-9]*' "$tmp/raw.log" | grep -o '[0-9]*$')
scport=$(grep -o 'listening on port [0-9]*' "$tmp/raw-sc.log" | grep -o '[0-9]*$')
pport=$(grep -o 'port [0-9]*' "$tmp/perf.log" | head -1 | grep -o '[0-9]*$')
niport=$(grep -o 'port [0-9]*' "$tmp/perf-ni.log" | head -1 | grep -o '[0-9]*$')

/usr/bin/python3 - "$tmp/spec.json" "$RUNS" "$rawpid" "$perfpid" "$raw" "$perf" "$rport" "$pport" \
	"$SIZE" "$QD" "$DURATION" "$nipid" "$niport" "$scpid" "$scport" <<'PY'
import json, sys
(out, runs, rawpid, perfpid, raw, perf, rport, pport, size, qd, dur, nipid, niport, scpid,
 scport) = sys.argv[1:16]
chains = []
for mode in ("write", "read"):
    chains.append({"name": "raw-" + mode, "label": "raw loop, %s" % mode, "kind": "ops",
                   "procs": {"server": int(rawpid)},
                   "cmd": [raw, "client", "--dst", "127.0.0.1:" + rport, "--mode", mode,
                           "--size", size, "--queue-depth", qd, "--duration", dur, "--json"]})
    chains.append({"name": "raw-sc-" + mode, "label": "raw loop --syscalls, %s" % mode,
                   "kind": "ops", "procs": {"server": int(scpid)},
                   "cmd": [raw, "client", "--dst", "127.0.0.1:" + scport, "--mode", mode,
                           "--size", size, "--queue-depth", qd, "--duration", dur, "--json",
                           "--syscalls"]})
    chains.append({"name": "rtrs-" + mode, "label": "rtrs-perf, %s" % mode, "kind": "ops",
                   "procs": {"server": int(perfpid)},
                   "cmd": [perf, "client", "--server", "127.0.0.1:" + pport, "--mode", mode,
                           "--io-size", size, "--queue-depth", qd, "--duration", dur,
                           "--io-connections", "1", "--json"]})
    chains.append({"name": "rtrs-ni-" + mode, "label": "rtrs-perf --no-invalidate, %s" % mode,
                   "kind": "ops", "procs": {"server": int(nipid)},
                   "cmd": [perf, "client", "--server", "127.0.0.1:" + niport, "--mode", mode,
                           "--io-size", size, "--queue-depth", qd, "--duration", dur,
                           "--io-connections", "1", "--json"]})
json.dump({"runs": int(runs), "title": "%s B, QD %s, one connection, loopback tcp" % (size, qd),
           "chains": chains}, open(out, "w"))
PY
day=$(date -u +%Y-%m-%d)
plot=bench/plots/raw-vs-rtrs-$day${TAG:+-$TAG}.png  # TAG: runs of one day keep their plots
/usr/bin/python3 bench/chains.py "$tmp/spec.json" "$tmp/out.json" "$tmp/plot.png"

report=$(/usr/bin/python3 - "$tmp/out.json" "$RUNS" "$DURATION" "$SIZE" "$QD" "$(machine)" "$plot" \
	"$day" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from chains import round_ratio
o = json.load(open(sys.argv[1]))
runs, dur, size, qd, machine, plot, day = sys.argv[2:9]
c = {x["name"]: x for x in o["chains"]}
print()
print("### %s The transport against a raw io_uring loop, %s B, loopback tcp" % (day, size))
print()
print("Machine: %s. Command: `RUNS=%s DURATION=%s SIZE=%s QD=%s bench/raw-vs-rtrs.sh` (one "
      "connection, QD %s, medians of %s rounds of %s s runs, each chain once per round, the order rotating; CPU per op = utime + stime "
      "of client and server over the run, divided by the ops). Plot: `%s`." %
      (machine, runs, dur, size, qd, qd, runs, dur, plot))
print()
print("| op | rtrs-perf server | raw loop: ops/s | raw: CPU us/op | rtrs-perf: ops/s | rtrs: CPU us/op | ops/s ratio | CPU ratio | goal |")
print("|---|---|---|---|---|---|---|---|---|")
for m in ("write", "read"):
    for k, how in (("rtrs-", "always_invalidate"), ("rtrs-ni-", "--no-invalidate")):
        r, t = c["raw-" + m], c[k + m]
        print("| %s | %s | %.0f | %.2f | %.0f | %.2f | %s | %s | >= 1.0x, CPU <= 1.1x |" % (
            m, how, r["iops"], r["cpu_us_per_io"], t["iops"], t["cpu_us_per_io"],
            round_ratio(t, r, "iops"), round_ratio(t, r)))
print()
print("The ratios are taken in each round, then their median over the rounds, with the "
      "lowest and highest in brackets.")
print()
print("The raw loop's own model against the tcp fabric's (`--syscalls`: a poll on the ring, "
      "then `recv` and `send` as system calls), the same loop otherwise:")
print()
print("| op | io_uring: ops/s | CPU us/op | --syscalls: ops/s | CPU us/op | ops/s ratio | CPU ratio |")
print("|---|---|---|---|---|---|---|")
for m in ("write", "read"):
    r, t = c["raw-" + m], c["raw-sc-" + m]
    print("| %s | %.0f | %.2f | %.0f | %.2f | %s | %s |" % (
        m, r["iops"], r["cpu_us_per_io"], t["iops"], t["cpu_us_per_io"],
        round_ratio(t, r, "iops"), round_ratio(t, r)))
print()
print("Where the CPU goes (us per op, medians): user and kernel time of each side.")
print()
print("| op | chain | client user | client kernel | server user | server kernel |")
print("|---|---|---|---|---|---|")
for m in ("write", "read"):
    for k, how in (("raw-", "raw loop"), ("raw-sc-", "raw loop --syscalls"),
                   ("rtrs-", "rtrs-perf, always_invalidate"),
                   ("rtrs-ni-", "rtrs-perf, --no-invalidate")):
        x = c[k + m]
        a, u = x["cpu_parts_us_per_io"], x["user_parts_us_per_io"]
        print("| %s | %s | %.2f | %.2f | %.2f | %.2f |" % (
            m, how, u["client"], a["client"] - u["client"], u["server"],
            a["server"] - u["server"]))
PY
)
echo "$report"
if $record; then
	mkdir -p bench/plots
	cp "$tmp/plot.png" "$plot"
	echo "$report" >>bench/RESULTS.md
fi
