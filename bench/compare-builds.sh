#!/usr/bin/env bash
# Two builds of rtrs-perf under the same loads, alternating, so that both
# meet the same machine: the tree as it is and BASE (a git revision, built
# in a scratch worktree). For each load: IO/s, and CPU time per IO summed
# over client and server (utime + stime of both processes); each number
# is the median of RUNS runs of DURATION seconds, the builds' order turning
# each round, and a ratio (new over base) the median of the rounds' own
# ratios, with their range. With --record NAME "TITLE" the table goes into
# bench/RESULTS.md under TITLE and a plot into bench/plots/NAME.svg.
# SYSCALLS=1 also counts, with perf stat, each side's sendmsg, recvmsg and
# io_uring_enter calls per IO (a second table); counting costs CPU in every
# call, so the CPU figures of such a run compare only within it.
#
#   BASE=2bd45d8 RUNS=5 DURATION=5 bench/compare-builds.sh
#   LOADS="write 4k 64;read 1m 16" bench/compare-builds.sh
#   LOADS="write 4k 64 1"   (a fourth field: IO connections; default one per CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
DURATION=${DURATION:-5}
BASE=${BASE:-HEAD~1}
LOADS=${LOADS:-write 4k 64;read 4k 64;write 1m 16;read 1m 16}
name= title=
if [ "${1:-}" = --record ]; then
	[ $# -eq 3 ] || { echo "usage: $0 [--record NAME TITLE]" >&2; exit 2; }
	name=$2 title=$3
	[[ "$name" =~ ^[a-z0-9-]+$ ]] || { echo "$0: NAME: lower case, digits and -" >&2; exit 2; }
elif [ $# -ne 0 ]; then
	echo "usage: $0 [--record NAME TITLE]" >&2
	exit 2
fi
base_rev=$(git rev-parse --short "$BASE^{commit}") || { echo "$0: no revision $BASE" >&2; exit 2; }

. bench/lib.sh

base_tree "$base_rev" tools/rtrs-perf
base_perf=$base_src/build/tools/rtrs-perf

# one PERF MODE SIZE QD: "IO/s CPU-us-per-IO" over client and server.
one() {
	python3 - "$@" "$DURATION" <<'PY'
import json, os, re, subprocess, sys
perf, mode, size, qd = sys.argv[1:5]
cons, dur = (sys.argv[5], sys.argv[6]) if len(sys.argv) > 6 else (None, sys.argv[5])
srv = subprocess.Popen([perf, "server", "--addr", "127.0.0.1", "--port", "0",
                        "--queue-depth", "128", "--chunk-size", "2m"],
                       stdout=subprocess.PIPE, text=True)
line = srv.stdout.readline()
port = re.search(r"port (\d+)", line).group(1)
tick = os.sysconf("SC_CLK_TCK")
def ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
t0 = ticks(srv.pid)
EV = ["sendmsg", "recvmsg", "io_uring_enter"]
count = os.environ.get("SYSCALLS") == "1"
pre, stat = [], None
if count:
    evs = ",".join("syscalls:sys_enter_" + e for e in EV)
    stat = subprocess.Popen(["perf", "stat", "-x,", "-e", evs, "-p", str(srv.pid), "-o",
                             "/tmp/cb-srv-%d.csv" % os.getpid(), "--", "sleep",
                             str(float(dur) + 0.5)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pre = ["perf", "stat", "-x,", "-e", evs, "-o", "/tmp/cb-clt-%d.csv" % os.getpid(), "--"]
clt = subprocess.Popen(pre + [perf, "client", "--server", f"127.0.0.1:{port}", "--mode", mode,
                        "--io-size", size, "--queue-depth", qd, "--duration", dur, "--json"] +
                       (["--io-connections", cons] if cons else []),
                       stdout=subprocess.PIPE, text=True)
out = clt.stdout.read()
_, status, ru = os.wait4(clt.pid, 0)
t1 = ticks(srv.pid)
srv.terminate()
srv.wait()
r = json.loads(out)
assert status == 0 and r["errors"] == 0 and r["bad"] == 0, out
cpu = ru.ru_utime + ru.ru_stime + (t1 - t0) / tick
calls = []
if count:
    stat.wait()
    for side in ("clt", "srv"):
        f = "/tmp/cb-%s-%d.csv" % (side, os.getpid())
        c = {}
        for line in open(f):
            x = line.strip().split(",")
            if len(x) > 2 and x[0].isdigit():
                c[x[2].replace("syscalls:sys_enter_", "")] = int(x[0])
        os.unlink(f)
        calls += ["%.4f" % (c.get(e, 0) / r["ops"]) for e in EV]
print(r["ops_per_sec"], cpu * 1e6 / r["ops"], *calls)
PY
}

IFS=';' read -r -a cases <<<"$LOADS"
declare -A ops cpu calls
for c in "${cases[@]}"; do
	for b in base new; do ops[$b:$c]= cpu[$b:$c]=; for i in 0 1 2 3 4 5; do calls[$b:$c:$i]=; done; done
	for r in $(seq "$RUNS"); do
		# The order turns each round: the second of a pair runs on a
		# machine the first has just warmed (or heated), and a fixed order
		# put 5-6 % between two builds of the same tree on 4 KiB writes.
		order="base new"
		[ $((r % 2)) -eq 0 ] && order="new base"
		for b in $order; do
			p=$perf
			[ $b = base ] && p=$base_perf
			read -r -a v < <(one "$p" $c)
			ops[$b:$c]+="${v[0]} "
			cpu[$b:$c]+="${v[1]} "
			for i in "${!v[@]}"; do
				[ "$i" -lt 2 ] || calls[$b:$c:$((i - 2))]+="${v[$i]} "
			done
		done
	done
done

new_rev=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- lib include tools || echo +)
data=$(mktemp)
trap 'rm -f "$data"; git worktree remove --force "$base_src" >/dev/null 2>&1 || rm -rf "$base_src"' EXIT
# ratios "NEW..." "BASE...": the two builds' runs of each round against each
# other, then the median over the rounds with the lowest and highest: this
# machine's speed shifts by a third for minutes at a time, and a pair of
# runs meets the same one where the medians of each build need not.
ratios() {
	python3 - "$1" "$2" <<'PY'
import statistics, sys
r = sorted(float(n) / float(b) for n, b in zip(sys.argv[1].split(), sys.argv[2].split()))
print("%.2fx (%.2f-%.2f)" % (statistics.median(r), r[0], r[-1]))
PY
}
table() {
	echo "| load (mode size QD) | $base_rev: IO/s | $base_rev: CPU us/IO | $new_rev: IO/s | $new_rev: CPU us/IO | IO/s ratio | CPU/IO ratio |"
	echo "|---|---|---|---|---|---|---|"
	for c in "${cases[@]}"; do
		bo=$(tr ' ' '\n' <<<"${ops[base:$c]}" | grep . | median)
		bc=$(tr ' ' '\n' <<<"${cpu[base:$c]}" | grep . | median)
		no=$(tr ' ' '\n' <<<"${ops[new:$c]}" | grep . | median)
		nc=$(tr ' ' '\n' <<<"${cpu[new:$c]}" | grep . | median)
		printf '"%s" %s %s %s %s\n' "$c" "$bo" "$bc" "$no" "$nc" >>"$data"
		printf '| %s | %.0f | %.2f | %.0f | %.2f | %s | %s |\n' "$c" "$bo" "$bc" "$no" "$nc" \
			"$(ratios "${ops[new:$c]}" "${ops[base:$c]}")" \
			"$(ratios "${cpu[new:$c]}" "${cpu[base:$c]}")"
	done
}
# The system calls per IO (SYSCALLS=1): medians, client then server.
calls_table() {
	echo "| load (mode size QD) | build | client sendmsg | client recvmsg | client io_uring_enter | server sendmsg | server recvmsg | server io_uring_enter |"
	echo "|---|---|---|---|---|---|---|---|"
	for c in "${cases[@]}"; do
		for b in base new; do
			local row="| $c | $([ $b = base ] && echo "$base_rev" || echo "$new_rev") |"
			for i in 0 1 2 3 4 5; do
				row+=" $(tr ' ' '\n' <<<"${calls[$b:$c:$i]}" | grep . | median) |"
			done
			echo "$row"
		done
	done
}
out=$(table)
[ "${SYSCALLS:-}" = 1 ] && out+=$'\n\nSystem calls per IO (medians):\n\n'$(calls_table)
echo "$out"
[ -n "$name" ] || exit 0

mkdir -p bench/plots
gnuplot <<GP
set terminal svg size 900,420 font "sans,11"
set output "bench/plots/$name.svg"
set multiplot layout 1,2 title "$title ($base_rev vs $new_rev, medians of $RUNS runs)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set xtics rotate by -20 scale 0
set key top left
set grid ytics
set ylabel "CPU us per IO (client + server)"
plot "$data" using 3:xtic(1) title "$base_rev", "" using 5 title "$new_rev"
set ylabel "IO/s"
set logscale y
plot "$data" using 2:xtic(1) title "$base_rev", "" using 4 title "$new_rev"
unset multiplot
GP
{
	echo
	echo "### $(date +%F) $title"
	echo
	echo "Machine: $(machine). Command: \`BASE=$BASE RUNS=$RUNS DURATION=$DURATION LOADS=\"$LOADS\"${SYSCALLS:+ SYSCALLS=$SYSCALLS} bench/compare-builds.sh\`"
	echo "(rtrs-perf client and server on 127.0.0.1, release builds of $base_rev and $new_rev, alternating;"
	echo "medians of $RUNS runs of $DURATION s, the order turning each round; a ratio is the median over the"
	echo "rounds of the two runs of a round against each other, the lowest and highest in brackets;"
	echo "CPU = utime + stime of client and server per IO)."
	echo
	echo "$out"
	echo
	echo "![$title](plots/$name.svg)"
} >>bench/RESULTS.md
