#!/usr/bin/env bash
# What a session costs in memory over RDMA (soft-RoCE in one QEMU guest):
# two builds of rtrs-perf, the tree as it is and BASE (a git revision, built
# in a scratch worktree), in turn, ROUNDS rounds. Each time an rtrs-perf
# server (--queue-depth 512 --chunk-size 8k) and one client that holds
# SESSIONS sessions of CONS IO connections (queue depth 32, a 3 s run, then
# idle): the server's VmRSS and the guest's VmallocUsed (the queue pairs'
# rings and CQs that rxe allocates in the kernel, of client and server)
# before and while the sessions are held, per session. With --record NAME
# "TITLE" the table goes into bench/RESULTS.md under TITLE and a plot into
# bench/plots/NAME.svg.
#
#   BASE=HEAD~1 bench/rdma-session-memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${BASE:-HEAD~1}
ROUNDS=${ROUNDS:-2}
SESSIONS=${SESSIONS:-12}
CONS=${CONS:-8}
name= title=
if [ "${1:-}" = --record ]; then
	[ $# -eq 3 ] || { echo "usage: $0 [--record NAME TITLE]" >&2; exit 2; }
	name=$2 title=$3
	[[ "$name" =~ ^[a-z0-9-]+$ ]] || { echo "$0: NAME: lower case, digits and -" >&2; exit 2; }
elif [ $# -ne 0 ]; then
	echo "usage: $0 [--record NAME TITLE]" >&2
	exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "rdma-session-memory: needs root (a QEMU guest)" >&2
	exit 77
fi
base_rev=$(git rev-parse --short "$BASE^{commit}") || { echo "$0: no revision $BASE" >&2; exit 2; }

. bench/lib.sh
tests/vm/rtrs-vm image >/dev/null

work=$(mktemp -d /var/tmp/rtrs-bench-mem.XXXXXX)
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1; rm -rf "$work"' EXIT
git worktree add --detach "$work/base" "$base_rev" >/dev/null 2>&1
meson setup "$work/base/build" "$work/base" -Dbuildtype=release >/dev/null
meson compile -C "$work/base/build" tools/rtrs-perf >/dev/null

cat >"$work/guest.sh" <<'EOF'
#!/bin/bash
# In the guest: ROUNDS x (base, new); one line per run.
set -u
rounds=$1 sessions=$2 cons=$3
shift 3
rss() { awk '/^VmRSS/ {print $2}' /proc/$1/status; }
vmalloc() { awk '/^VmallocUsed/ {print $2}' /proc/meminfo; }
for round in $(seq "$rounds"); do
	for pair in "$@"; do
		label=${pair%%=*} perf=${pair#*=}
		"$perf" server --provider verbs --addr 198.18.0.1 --port 0 --queue-depth 512 \
			--chunk-size 8k >/tmp/srv.log 2>&1 &
		sp=$!
		for _ in $(seq 100); do grep -q 'port [0-9]' /tmp/srv.log && break; sleep 0.1; done
		port=$(grep -o 'port [0-9]*' /tmp/srv.log | head -1 | grep -o '[0-9]*$')
		sleep 1
		r0=$(rss $sp) v0=$(vmalloc)
		"$perf" client --provider verbs --server 198.18.0.1:$port --sessions "$sessions" \
			--io-connections "$cons" --queue-depth 32 --duration 3 --hold 6 >/tmp/clt.log 2>&1 &
		cp=$!
		for _ in $(seq 900); do grep -q 'holding' /tmp/clt.log && break; sleep 0.1; done
		sleep 1
		r1=$(rss $sp) v1=$(vmalloc)
		wait $cp
		crc=$?
		kill $sp
		wait $sp 2>/dev/null
		echo "RUN $label $(( (r1 - r0) / sessions )) $(( (v1 - v0) / sessions )) $crc"
		[ $crc -eq 0 ] || tail -n 5 /tmp/clt.log
	done
done
EOF
chmod +x "$work/guest.sh"
out=$(tests/vm/rtrs-vm run --rdma rxe --timeout 1500 --ip 198.18.0.1/24 --share "$work" \
	-- "$work/guest.sh" "$ROUNDS" "$SESSIONS" "$CONS" \
	"base=$work/base/build/tools/rtrs-perf" "new=$perf" 2>&1)
grep -q '^RUN ' <<<"$out" || { echo "$out" | tail -n 30; exit 1; }
if grep '^RUN ' <<<"$out" | awk '$5 != 0 { bad = 1 } END { exit !bad }'; then
	echo "$out" | tail -n 30
	echo "rdma-session-memory: a client run failed" >&2
	exit 1
fi

new_rev=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- lib include tools || echo +)
med() { grep "^RUN $1 " <<<"$out" | awk -v f="$2" '{ print $f }' | median; }
rb=$(med base 3) vb=$(med base 4) rn=$(med new 3) vn=$(med new 4)
table=$(
	echo "| per session | $base_rev | $new_rev | ratio |"
	echo "|---|---|---|---|"
	printf '| server VmRSS (KiB) | %s | %s | %.2fx |\n' "$rb" "$rn" "$(python3 -c "print($rn / $rb)")"
	printf '| guest VmallocUsed, client and server (KiB) | %s | %s | %.2fx |\n' "$vb" "$vn" \
		"$(python3 -c "print($vn / $vb)")"
)
echo "$table"
echo "runs: $(grep '^RUN ' <<<"$out" | awk '{ printf "%s:%s/%s ", $2, $3, $4 }')"
[ -n "$name" ] || exit 0

mkdir -p bench/plots
gnuplot <<GP
set terminal svg size 700,380 font "sans,11"
set output "bench/plots/$name.svg"
set title "$title ($base_rev vs $new_rev, medians of $ROUNDS rounds)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set key top right
set grid ytics
set ylabel "KiB per session"
\$d << EOD
"server VmRSS" $rb $rn
"guest VmallocUsed" $vb $vn
EOD
plot \$d using 2:xtic(1) title "$base_rev", "" using 3 title "$new_rev"
GP
{
	echo
	echo "### $(date +%F) $title"
	echo
	echo "Machine: $(machine); one QEMU guest (TCG, 2 vCPUs, soft-RoCE). Command:"
	echo "\`BASE=$BASE ROUNDS=$ROUNDS SESSIONS=$SESSIONS CONS=$CONS bench/rdma-session-memory.sh\`"
	echo "(rtrs-perf server \`--queue-depth 512 --chunk-size 8k\`, one client holding $SESSIONS sessions"
	echo "of $CONS IO connections after a 3 s run at queue depth 32; builds alternating; medians)."
	echo
	echo "$table"
	echo
	echo "Runs (RSS/vmalloc KiB per session): $(grep '^RUN ' <<<"$out" | awk '{ printf "%s:%s/%s ", $2, $3, $4 }')"
	echo
	echo "![$title](plots/$name.svg)"
} >>bench/RESULTS.md
