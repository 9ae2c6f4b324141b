#!/usr/bin/env bash
# rnbd-server's memory per idle session, and what it gives back (issue 17):
# the server's RSS at start, with N sessions open (each a device mapped
# read-only by rnbd-clientd over one path, no IO), and after they all
# closed. Goals: an idle session <= 0.5 MiB of RSS; after N sessions close,
# RSS within 2 MiB of its value before they opened. N (32) sessions; the
# measure is repeated ROUNDS (3) times on one server, so that a second
# round shows whether memory comes back for good. --record appends the
# section to bench/RESULTS.md with a plot in bench/plots/ (TAG=name: the plot's
# file name ends in -name, so that runs of one day keep theirs). While the
# sessions are open and idle, the server's wake-ups (voluntary context
# switches of all its threads) and CPU are counted over IDLE_S (10)
# seconds: idle sessions carry only heartbeats. BUILD (build-release, from
# the tree's top) is the build tree whose rnbd-server, rnbd-clientd and
# rnbd run: another revision's, for a before-and-after.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-32}
ROUNDS=${ROUNDS:-3}
IDLE_S=${IDLE_S:-10}
[[ "$IDLE_S" =~ ^[1-9][0-9]*$ ]] || { echo "session-memory: IDLE_S: whole seconds, at least 1" >&2; exit 2; }
record=false
[ "${1:-}" = --record ] && record=true
dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q "install ok installed" ||
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		python3-matplotlib >/dev/null
. bench/lib.sh
bench_processes
bin=$(realpath "${BUILD:-build-release}")
[ -x "$bin/daemons/rnbd-server" ] || { echo "session-memory: no $bin/daemons/rnbd-server" >&2; exit 2; }

"$bin/daemons/rnbd-server" --port 0 --mem-device "m0:$((64 << 20))" --quiet \
	--control "$tmp/sctl" ${SERVER_OPTS:-} >"$tmp/server.log" 2>&1 &
pids+=($!)
spid=$!
for _ in $(seq 100); do grep -q 'listening on port' "$tmp/server.log" && break; sleep 0.05; done
port=$(grep -o 'listening on port [0-9]*' "$tmp/server.log" | grep -o '[0-9]*$')
"$bin/daemons/rnbd-clientd" --control "$tmp/cctl" --quiet >"$tmp/clientd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$tmp/cctl" ] && break; sleep 0.05; done
rnbd=$bin/tools/rnbd
rss() { awk '/^VmRSS/ { print $2 }' "/proc/$spid/status"; }   # kB
threads() { ls "/proc/$spid/task" | wc -l; }
# A thread that ends between the glob and the read takes its count along: clamped below.
switches() { { cat "/proc/$spid"/task/*/status 2>/dev/null || true; } |
	awk '/^voluntary_ctxt_switches/ { s += $2 } END { print s + 0 }'; }
cputicks() { awk '{ print $14 + $15 }' "/proc/$spid/stat"; }

sleep 1
start=$(rss)
: >"$tmp/rounds"
for r in $(seq "$ROUNDS"); do
	for i in $(seq "$N"); do
		"$rnbd" --socket "$tmp/cctl" client map m0 --session "mem-$r-$i" \
			--server "127.0.0.1:$port" --mode ro --no-block-device >/dev/null
	done
	# Measured once the server has every session.
	for _ in $(seq 300); do
		[ "$("$rnbd" --socket "$tmp/sctl" server list -o json | python3 -c 'import json, sys; print(len(json.load(sys.stdin)))')" = "$N" ] && break
		sleep 0.1
	done
	sleep 1
	open=$(rss)
	open_threads=$(threads)
	w0=$(switches) c0=$(cputicks)
	sleep "$IDLE_S"
	wakes=$(($(switches) - w0)) ticks=$(($(cputicks) - c0))
	[ "$wakes" -ge 0 ] || wakes=0
	for i in $(seq "$N"); do
		"$rnbd" --socket "$tmp/cctl" client unmap m0 --session "mem-$r-$i" >/dev/null
	done
	# Measured once the server has let every session go (that is asynchronous).
	for _ in $(seq 300); do
		[ "$("$rnbd" --socket "$tmp/sctl" server list -o json)" = "[]" ] && break
		sleep 0.1
	done
	[ "$("$rnbd" --socket "$tmp/sctl" server list -o json)" = "[]" ] ||
		{ echo "session-memory: the server still has sessions 30 s after they closed" >&2; exit 1; }
	sleep 1
	echo "$r $open $(rss) $open_threads $(threads) $wakes $ticks" >>"$tmp/rounds"
done

report=$(/usr/bin/python3 - "$tmp/rounds" "$start" "$N" "$(machine)" "$ROUNDS" "${SERVER_OPTS:-}" \
	"$tmp/plot.png" "$IDLE_S" "$(getconf CLK_TCK)" "${BUILD:-}" <<'PY'
import sys
rounds = [list(map(int, l.split())) for l in open(sys.argv[1])]
start, n, machine, nrounds, opts, plot = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7]
idle_s, hz, build = int(sys.argv[8]), int(sys.argv[9]), sys.argv[10]
print()
print("### %s rnbd-server memory per idle session" % __import__("time").strftime("%Y-%m-%d", __import__("time").gmtime()))
print()
print("Machine: %s. Command: `N=%d ROUNDS=%s IDLE_S=%d %s%sbench/session-memory.sh` (server RSS from "
      "/proc; each session maps a 64 MiB memory device read-only through rnbd-clientd, one "
      "path, tcp, no IO; idle wake-ups and CPU: the server's voluntary context switches and "
      "utime + stime over %d s with the sessions open)." % (machine, n, nrounds, idle_s,
      ("SERVER_OPTS='%s' " % opts) if opts else "", ("BUILD=%s " % build) if build else "", idle_s))
print()
print("| round | RSS at start | with %d sessions | per idle session | after they closed | above start | threads open/closed | idle: wake-ups/s | idle: CPU |" % n)
print("|---|---|---|---|---|---|---|---|---|")
for r, op, cl, t1, t2, wk, tk in rounds:
    print("| %d | %.1f MiB | %.1f MiB | %.0f KiB | %.1f MiB | %.1f MiB | %d / %d | %.0f | %.2f %% |" % (
        r, start / 1024, op / 1024, (op - start) / n, cl / 1024, (cl - start) / 1024, t1, t2,
        wk / idle_s, 100.0 * tk / hz / idle_s))
print()
print("Goals: an idle session <= 512 KiB; after the sessions close, RSS within 2 MiB of the start.")
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(8, 3.5))
xs, ys, labels = [0], [start / 1024], ["start"]
for r, op, cl, *_ in rounds:
    xs += [len(xs), len(xs) + 1]
    ys += [op / 1024, cl / 1024]
    labels += ["%d open (r%d)" % (n, r), "closed (r%d)" % r]
ax.bar(xs, ys, color=["tab:gray"] + ["tab:red", "tab:blue"] * len(rounds))
ax.set_xticks(xs, labels, rotation=30, ha="right", fontsize="small")
ax.set_ylabel("rnbd-server RSS, MiB")
ax.axhline(start / 1024 + 2, color="k", linestyle=":", linewidth=1)
fig.tight_layout()
fig.savefig(plot, dpi=90)
PY
)
echo "$report"
if $record; then
	mkdir -p bench/plots
	name=bench/plots/session-memory-$(date -u +%Y-%m-%d)${TAG:+-$TAG}.png
	cp "$tmp/plot.png" "$name"
	echo "$report" >>bench/RESULTS.md
	echo "" >>bench/RESULTS.md
	echo "Plot: \`$name\`." >>bench/RESULTS.md
fi
