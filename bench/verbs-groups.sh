#!/usr/bin/env bash
# The rdma-core fabric's poll groups against BASE (a revision before them,
# with a completion thread per connection), in one QEMU guest on soft-RoCE
# (rxe, TCG, 2 vCPUs), alternating the two builds of rtrs-perf run after
# run so that both meet the same guest. Loads (4 KiB writes, verified):
# one session at QD 64, and SESSIONS sessions of 4 connections each with
# the same total QD 64, both at 1 s heartbeats. For each: IO/s, CPU time
# per IO summed over client and server (utime + stime of both from the
# moment every session is open to the end of the IO), and the most threads
# each process had meanwhile. Medians of
# RUNS runs; ratios are new over base.
#   BASE=15678e4 RUNS=3 DURATION=5 SESSIONS=50 bench/verbs-groups.sh [--record]
# --record: a table and a plot (bench/plots/verbs-groups-DATE.png) into
# bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${BASE:-15678e4}
RUNS=${RUNS:-3}
DURATION=${DURATION:-5}
SESSIONS=${SESSIONS:-50}
record=false
[ "${1:-}" = --record ] && record=true
base_rev=$(git rev-parse --short "$BASE^{commit}") || { echo "$0: no revision $BASE" >&2; exit 2; }
new_rev=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- lib tools || echo +)

. bench/lib.sh
dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q "install ok installed" ||
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		python3-matplotlib >/dev/null

run=$(mktemp -d /var/tmp/rtrs-bench-vg.XXXXXX)
base_src=$run/base
trap 'git worktree remove --force "$base_src" >/dev/null 2>&1 || true; [ -n "${KEEP:-}" ] || rm -rf "$run"' EXIT
git worktree add --detach "$base_src" "$base_rev" >/dev/null 2>&1
meson setup "$base_src/build" "$base_src" -Dbuildtype=release >/dev/null
meson compile -C "$base_src/build" tools/rtrs-perf >/dev/null

cat >"$run/guest.sh" <<'GUEST'
#!/bin/bash
# guest.sh RUN NEW_PERF BASE_PERF RUNS DURATION SESSIONS, run at real-time
# priority so that its samples come when due however busy the guest is;
# the programs it measures run at normal priority (chrt -o 0).
run=$1 new=$2 base=$3 runs=$4 dur=$5 sessions=$6
addr=198.18.0.1 port=4900
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
threads() { ls "/proc/$1/task" 2>/dev/null | wc -l; }
# one NAME PERF N: a line "NAME N ops client_ticks server_ticks sthreads cthreads"
one() {
	local name=$1 perf=$2 n=$3 qd=64 out err
	port=$((port + 1))
	chrt -o 0 "$perf" server --provider verbs --addr $addr --port $port --queue-depth 64 --chunk-size 16k \
		--max-sessions $((n + 16)) --max-sessions-per-peer $((n + 16)) --quiet 2>/dev/null &
	local spid=$!
	sleep 2
	out=$run/out-$name-$n err=$run/err-$name-$n
	local smax=0 cmax=0 s0="" c0="" s1="" c1=""
	chrt -o 0 "$perf" client --provider verbs -d $addr:$port --sessions "$n" --io-connections 3 \
		--queue-depth $qd --duration "$dur" --hold 2 --verify --json >"$out" 2>"$err" &
	local cpid=$!
	# CPU over the IO phase: from "sessions opened" to "holding" (both at once on stderr).
	while kill -0 $cpid 2>/dev/null; do
		if [ -z "$s0" ] && grep -q "sessions opened" "$err"; then
			s0=$(ticks $spid) c0=$(ticks $cpid)
		fi
		if [ -n "$s0" ] && [ -z "$s1" ]; then
			if grep -q "holding" "$err"; then
				s1=$(ticks $spid) c1=$(ticks $cpid)
			else
				local s c
				s=$(threads $spid) c=$(threads $cpid)
				[ "$s" -gt $smax ] && smax=$s
				[ "$c" -gt $cmax ] && cmax=$c
			fi
		fi
		sleep 0.1
	done
	wait $cpid
	local rc=$?
	kill $spid
	wait $spid 2>/dev/null
	[ -n "$s1" ] || rc=99
	local last=$((${c1:-0} - ${c0:-0})) sv=$((${s1:-0} - ${s0:-0}))
	echo "$name $n $rc $(tr -d '\n' <"$out" | sed 's/ //g') $last $sv $smax $cmax" >>"$run/results"
}
for r in $(seq "$runs"); do
	for n in 1 "$sessions"; do
		one base "$base" "$n"
		one new "$new" "$n"
	done
done
echo "CLK_TCK $(getconf CLK_TCK)" >>"$run/results"
GUEST
load=$(cut -d' ' -f1-3 /proc/loadavg)
tests/vm/rtrs-vm run --rdma rxe --smp 2 --mem 1536 --ip 198.18.0.1/24 \
	--timeout $((300 + 4 * RUNS * (DURATION + 40))) --share "$run" --share-ro "$PWD" -- \
	chrt -f 10 bash "$run/guest.sh" "$run" "$PWD/build-release/tools/rtrs-perf" \
	"$base_src/build/tools/rtrs-perf" "$RUNS" "$DURATION" "$SESSIONS" >"$run/guest.log" 2>&1 || true
grep -q '^CLK_TCK' "$run/results" 2>/dev/null || { tail -n 30 "$run/guest.log"; echo "$0: the guest run failed" >&2; exit 1; }
date=$(date +%F)
png=bench/plots/verbs-groups-$date.png
report=$(/usr/bin/python3 - "$run/results" "$run/plot.png" "$base_rev" "$new_rev" "$DURATION" "$SESSIONS" <<'PY'
import json, statistics, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
path, png, base_rev, new_rev, dur, sessions = sys.argv[1:7]
lines = open(path).read().split("\n")
tck = int([l for l in lines if l.startswith("CLK_TCK")][0].split()[1])
rows = {}
bad = []
for l in lines:
    f = l.split(" ")
    if len(f) != 8:
        continue
    name, n, rc, js, cl, sv, st, ct = f
    try:
        j = json.loads(js)
    except ValueError:
        bad.append(l); continue
    if rc != "0" or j.get("errors") or j.get("bad"):
        bad.append(l); continue
    ops = j["ops"]
    rows.setdefault((name, int(n)), []).append((j["ops_per_sec"], (int(cl) + int(sv)) / tck / ops * 1e6, int(st), int(ct)))
if bad:
    print("FAILED RUNS:\n" + "\n".join(bad)); sys.exit(1)
med = lambda v: statistics.median(v)
out = ["| load | build | IO/s (runs) | CPU per IO, us (runs) | server threads | client threads |", "|---|---|---|---|---|---|"]
plot = {}
for n in sorted({k[1] for k in rows}):
    load = "1 session, QD 64" if n == 1 else f"{n} sessions x 4 connections, QD 64 in all"
    for name, rev in (("base", base_rev), ("new", new_rev)):
        r = rows[(name, n)]
        iops, cpu = med([x[0] for x in r]), med([x[1] for x in r])
        st, ct = max(x[2] for x in r), max(x[3] for x in r)
        plot[(name, n)] = (iops, cpu)
        span = lambda i, f: f"{f % min(x[i] for x in r)}-{f % max(x[i] for x in r)}"
        out.append(f"| {load} | {name} ({rev}{', thread per connection' if name == 'base' else ', poll groups'}) | {iops:.0f} ({span(0, '%.0f')}) | {cpu:.1f} ({span(1, '%.0f')}) | {st} | {ct} |")
    b, w = plot[("base", n)], plot[("new", n)]
    out.append(f"| {load} | **new / base** | **{w[0] / b[0]:.2f}x** | **{w[1] / b[1]:.2f}x** | | |")
fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
ns = sorted({k[1] for k in rows})
for i, (idx, title) in enumerate(((0, "IO/s"), (1, "CPU per IO (us), client + server"))):
    for k, name in enumerate(("base", "new")):
        ax[i].bar([x * 3 + k for x in range(len(ns))], [plot[(name, n)][idx] for n in ns],
                  label=f"{name}: {'thread per connection' if name == 'base' else 'poll groups'}")
    ax[i].set_xticks([x * 3 + 0.5 for x in range(len(ns))])
    ax[i].set_xticklabels([f"{n} session{'s' if n > 1 else ''}" for n in ns])
    ax[i].set_title(title)
ax[0].legend(fontsize=7)
fig.suptitle("rtrs-perf on rxe (TCG guest, 2 vCPU): 4 KiB verified writes, QD 64 in all")
fig.tight_layout()
fig.savefig(png, dpi=90)
print("\n".join(out))
PY
) || { echo "$report"; exit 1; }
echo "$report"
if $record; then
	cp "$run/plot.png" "$png"
	{
		echo
		echo "## RDMA poll groups against a thread per connection ($date)"
		echo
		echo "\`BASE=$base_rev RUNS=$RUNS DURATION=$DURATION SESSIONS=$SESSIONS bench/verbs-groups.sh --record\`"
		echo "Machine: $(machine); load before $load. One guest (Linux $(cut -d' ' -f1 /var/tmp/rtrs-vm/image/version), TCG, 2 vCPU, 1.5 GiB), rxe; client and server in it, the two builds alternated run after run; medians of $RUNS runs of $DURATION s; every byte verified. CPU per IO: utime + stime of client and server from all sessions open to the end of the IO, over the IOs; threads: the most seen while the sessions were open."
		echo
		echo "$report"
		echo
		echo "![verbs groups]($(basename "$(dirname "$png")")/$(basename "$png"))"
	} >>bench/RESULTS.md
	echo "recorded in bench/RESULTS.md and $png"
fi
