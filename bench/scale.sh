#!/usr/bin/env bash
# A server for a fleet (issue 35): what N sessions cost. One rtrs-perf
# server (tcp, QD chunks of 16 KiB per session, limits raised) and one rtrs-perf
# client holding N sessions of CONS IO connections (--sessions N, 4 by
# default: 5 connections each), opened together, for N in NS
# ("1 10 100 1000"). Per N: the time for all N to be open; then a constant
# total load, 4 KiB writes at total queue depth QD (64) spread over the
# sessions for DURATION (5) s: ops/s and CPU per IO of server and generator
# together (their CPU clocks over the window); then the sessions idle for
# HOLD (6) s: the server's CPU over 4 s of it (heartbeats only), threads,
# fds and RSS of both processes. EXTRA ("100:32") adds points of
# SESSIONS:IO-CONNECTIONS after the sweep (100 sessions of 33 connections:
# a rack of 32-CPU hypervisors), plotted as points of their own. Prints
# a table; --record appends it to
# bench/RESULTS.md with a plot in bench/plots/. BUILD (build-release) is the
# build tree that runs. SERVER=rnbd measures rnbd-server instead, exporting
# N files of 256 KiB (sparse, below a --dev-search-path), with
# rnbd-client perf --sessions N as the generator, each session mapping its
# own file, 4 KiB random reads and writes (half each) at total QD QD.
# Beside each point, the floor: bench/raw-loop with as many connections as
# the sessions have IO connections (N x CONS), the same total QD and IO
# size, each IO on the next connection, its ops/s and CPU per IO (server
# and client) over the same window (raw_ops_per_s, raw_cpu_us_per_io); a
# transport cannot do with less than one segment each way per IO once the
# connections outnumber the IOs in flight, and the floor shows what that
# costs.
set -euo pipefail
cd "$(dirname "$0")/.."
NS=${NS:-"1 10 100 1000"}
CONS=${CONS:-4}
EXTRA=${EXTRA-"100:32"}
QD=${QD:-64}
DURATION=${DURATION:-5}
HOLD=${HOLD:-6}
SERVER=${SERVER:-rtrs}
case $SERVER in rtrs|rnbd) ;; *) echo "scale.sh: SERVER is rtrs or rnbd, not $SERVER" >&2; exit 2;; esac
record=false
[ "${1:-}" = --record ] && record=true
dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q "install ok installed" ||
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		python3-matplotlib >/dev/null
. bench/lib.sh
bench_processes
bin=$(realpath "${BUILD:-build-release}")
perf=$bin/tools/rtrs-perf
rnbd_server=$bin/daemons/rnbd-server
rnbd_client=$bin/tools/rnbd-client
raw=$bin/bench/raw-loop
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
hz=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
rss() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }
nthreads() { ls "/proc/$1/task" | wc -l; }
nfds() { ls "/proc/$1/fd" | wc -l; }

echo "N cons open_s ops_per_s cpu_us_per_io srv_threads gen_threads srv_fds srv_rss_kb gen_rss_kb srv_idle_cpu_pct raw_ops_per_s raw_cpu_us_per_io" >"$tmp/table"

# The floor at CONNS connections: raw-loop's ops/s and CPU per IO (us), over 3 s of a 5 s run.
raw_floor() {
	local conns=$1 rs rc port r0 c0 r1 c1
	"$raw" server --port 0 >"$tmp/raw-srv.log" 2>&1 &
	rs=$!
	pids+=("$rs")
	for _ in $(seq 100); do grep -q 'listening on port' "$tmp/raw-srv.log" && break; sleep 0.05; done
	port=$(grep -o 'listening on port [0-9]*' "$tmp/raw-srv.log" | grep -o '[0-9]*$')
	"$raw" client --dst "127.0.0.1:$port" --connections "$conns" --queue-depth "$QD" \
		--size 4096 --duration 5 --json >"$tmp/raw.json" &
	rc=$!
	sleep 1.5
	r0=$(ticks "$rs") c0=$(ticks "$rc")
	sleep 3
	r1=$(ticks "$rs") c1=$(ticks "$rc")
	wait "$rc"
	kill "$rs"
	wait "$rs" 2>/dev/null || true
	python3 - "$tmp/raw.json" "$((r1 - r0 + c1 - c0))" "$hz" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
ticks, hz = int(sys.argv[2]), int(sys.argv[3])
print(round(j["ops_per_sec"]), "%.1f" % (ticks / hz * 1e6 / (3 * j["ops_per_sec"])))
PY
}
points=()
for n in $NS; do points+=("$n:$CONS"); done
for x in $EXTRA; do points+=("$x"); done
for point in "${points[@]}"; do
	n=${point%%:*} cons=${point##*:}
	if [ "$SERVER" = rtrs ]; then
		"$perf" server --port 0 --queue-depth "$QD" --chunk-size 16k --max-sessions $((n + 64)) \
			--max-sessions-per-peer $((n + 64)) >"$tmp/srv-$n.log" 2>&1 &
	else
		rm -rf "$tmp/exp" && mkdir "$tmp/exp"
		for i in $(seq "$n"); do truncate -s 256K "$tmp/exp/d-$i"; done
		"$rnbd_server" --port 0 --dev-search-path "$tmp/exp" --queue-depth $((QD + 1)) \
			--chunk-size 16k --max-sessions $((n + 64)) --max-sessions-per-peer $((n + 64)) \
			--quiet >"$tmp/srv-$n.log" 2>&1 &
	fi
	pids+=($!)
	spid=$!
	for _ in $(seq 100); do grep -q 'listening on port' "$tmp/srv-$n.log" && break; sleep 0.05; done
	port=$(grep -o 'listening on port [0-9]*' "$tmp/srv-$n.log" | grep -o '[0-9]*$')
	if [ "$SERVER" = rtrs ]; then
		"$perf" client --server "127.0.0.1:$port" --sessions "$n" --io-connections "$cons" \
			--queue-depth "$QD" --duration "$DURATION" --hold "$HOLD" --json \
			>"$tmp/gen-$n.json" 2>"$tmp/gen-$n.err" &
	else
		"$rnbd_client" perf --server "127.0.0.1:$port" --sessions "$n" --device d \
			--io-connections "$cons" --rw randrw --bs 4k --iodepth "$QD" \
			--runtime "$DURATION" --hold "$HOLD" --completions threads --json \
			>"$tmp/gen-$n.json" 2>"$tmp/gen-$n.err" &
	fi
	pids+=($!)
	cpid=$!
	until grep -q 'sessions opened' "$tmp/gen-$n.err" 2>/dev/null; do
		kill -0 "$cpid" 2>/dev/null || { cat "$tmp/gen-$n.err" >&2; exit 1; }
		sleep 0.02
	done
	s0=$(ticks "$spid") c0=$(ticks "$cpid")
	until grep -q 'holding' "$tmp/gen-$n.err" 2>/dev/null; do sleep 0.02; done
	s1=$(ticks "$spid") c1=$(ticks "$cpid")
	sleep 1
	i0=$(ticks "$spid")
	sleep 4
	i1=$(ticks "$spid")
	row=$(python3 - "$tmp/gen-$n.json" "$n" "$cons" "$((s1 - s0 + c1 - c0))" "$hz" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
n, cons, ticks, hz = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
assert j["errors"] == 0 and j["sessions"] == n, j
if "ops" not in j:  # rnbd-client perf
    j["ops"], j["ops_per_sec"] = j["reads"] + j["writes"], j["iops"]
print(n, cons + 1, j["open_seconds"], j["ops_per_sec"], "%.1f" % (ticks / hz * 1e6 / max(j["ops"], 1)), end=" ")
PY
)
	row="$row $(nthreads "$spid") $(nthreads "$cpid") $(nfds "$spid") $(rss "$spid") $(rss "$cpid") $(awk -v t=$((i1 - i0)) -v hz="$hz" 'BEGIN { printf "%.1f", t / hz / 4 * 100 }')"
	wait "$cpid" || { cat "$tmp/gen-$n.err" >&2; exit 1; }
	kill "$spid"
	wait "$spid" 2>/dev/null || true
	echo "$row $(raw_floor $((n * cons)))" >>"$tmp/table"
done
column -t "$tmp/table"
if $record; then
	day=$(date +%F)
	suffix=; [ "$SERVER" = rnbd ] && suffix=-rnbd
	plot=bench/plots/scale-$day$suffix.png
	i=2
	while [ -e "$plot" ]; do # a run of the same day keeps its plot
		plot=bench/plots/scale-$day$suffix-$i.png
		i=$((i + 1))
	done
	/usr/bin/python3 - "$tmp/table" "$plot" "$((CONS + 1))" <<'PY'
import sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
allrows = [l.split() for l in open(sys.argv[1])][1:]
rows = [r for r in allrows if r[1] == sys.argv[3]]
extra = [r for r in allrows if r[1] != sys.argv[3]]
n = [int(r[0]) for r in rows]
fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
ax[0].plot(n, [float(r[2]) for r in rows], "o-"); ax[0].set_title("all N open (s)")
ax[1].plot(n, [float(r[4]) for r in rows], "o-", label="server + generator")
ax[1].plot(n, [float(r[12]) for r in rows], "v--", label="raw-loop floor, N x cons connections")
ax[1].set_title("CPU per IO (us)")
ax[2].plot(n, [int(r[8]) / 1024 for r in rows], "o-", label="server RSS (MiB)")
ax[2].plot(n, [int(r[6]) for r in rows], "^-", label="generator threads")
ax[2].plot(n, [int(r[5]) for r in rows], "s-", label="server threads")
for r in extra:
    lab = "%s x %s cons" % (r[0], r[1])
    ax[0].plot([int(r[0])], [float(r[2])], "D", label=lab)
    ax[1].plot([int(r[0])], [float(r[4])], "D", label=lab)
    ax[2].plot([int(r[0])], [int(r[8]) / 1024], "D", label="server RSS, " + lab)
if extra:
    ax[0].legend()
ax[1].legend()
ax[2].legend(); ax[2].set_yscale("log"); ax[2].set_title("threads and RSS")
for a in ax:
    a.set_xscale("log"); a.set_xlabel("sessions (N)")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=90)
PY
	{
		echo
		echo "### $day Sessions at scale (bench/scale.sh${suffix:+, rnbd-server})"
		echo
		echo "\`SERVER=$SERVER NS=\"$NS\" CONS=$CONS EXTRA=\"$EXTRA\" QD=$QD DURATION=$DURATION bench/scale.sh --record\` on $(machine)."
		if [ "$SERVER" = rtrs ]; then
			echo "One rtrs-perf server (tcp, $QD chunks of 16 KiB per session) and one rtrs-perf client holding N sessions of"
			echo "$((CONS + 1)) connections (and the EXTRA points: sessions:IO connections), opened together; 4 KiB writes at"
		else
			echo "One rnbd-server (tcp, $QD chunks of 16 KiB per session, N files of 256 KiB) and one rnbd-client perf holding"
			echo "N sessions of $((CONS + 1)) connections, each mapping its own file (and the EXTRA points: sessions:IO"
			echo "connections), opened together; 4 KiB random reads and writes (half each) at"
		fi
		echo "total QD $QD spread over the sessions. Columns: sessions, connections each, seconds until all were open,"
		echo "ops/s, CPU per IO of server and generator together (us), threads, server fds, RSS (KiB), server CPU idle (%),"
		echo "and the floor: bench/raw-loop over N x cons connections at the same total QD, each IO on the next connection"
		echo "(ops/s, CPU per IO of its server and client, us)."
		echo
		echo '```'
		column -t "$tmp/table"
		echo '```'
		echo
		echo "![scale]($(basename "$plot" | sed 's|^|plots/|'))"
	} >>bench/RESULTS.md
	echo "recorded in bench/RESULTS.md, plot $plot"
fi
