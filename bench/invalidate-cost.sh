#!/usr/bin/env bash
# The cost of always_invalidate: the same client load against two servers
# in the same run, one revoking and re-registering every chunk key per IO
# (the default) and one keeping its keys (--no-invalidate). Runs alternate
# between the two so that drift hits both. Goal: at most 10 % cost (the
# kernel pays up to 20 %). Two measures: throughput, which on a small
# loopback machine moves with whatever else the CPUs do, and the server's
# CPU time per IO (utime + stime of the server process over the run), the
# work always_invalidate adds; and that work alone, revoke + register of a
# chunk key timed in a loop (bench/mr-cycle.c), set against the server's CPU
# per IO. Each number is the median of RUNS runs of DURATION seconds, the
# throughput with its range; with --record the section is appended to
# bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
SIZES=${SIZES:-4k 128k} # IO sizes to compare: 4k (QD 64), 128k (QD 16)
DURATION=${DURATION:-5}
record=false
[ "${1:-}" = --record ] && record=true

. bench/lib.sh

bench_processes

start() { # name [server options]: sets $port and $spid (no subshell: the trap must see the pid)
	local name=$1
	shift
	# 256 KiB chunks: a 128 KiB IO and its header fit one.
	"$perf" server --addr 127.0.0.1 --port 0 --queue-depth 128 --chunk-size 256k --quiet \
		"$@" >"$tmp/$name" &
	pids+=($!)
	spid=$!
	for _ in $(seq 100); do grep -q port "$tmp/$name" && break; sleep 0.05; done
	port=$(grep -o 'port [0-9]*' "$tmp/$name" | cut -d' ' -f2)
}
start on
port_on=$port pid_on=$spid
start off --no-invalidate
port_off=$port pid_off=$spid

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

one() { # port server-pid mode size qd: prints "ops/s server-cpu-us-per-op"
	local t0 t1 json
	t0=$(cpu_ticks "$2")
	json=$("$perf" client --server "127.0.0.1:$1" --mode "$3" --io-size "$4" --queue-depth "$5" \
		--duration "$DURATION" --json)
	t1=$(cpu_ticks "$2")
	python3 -c "import json,sys; r=json.loads(sys.argv[1]); assert r['errors']==0 and r['bad']==0
print(r['ops_per_sec'], ($t1 - $t0) / $(getconf CLK_TCK) * 1e6 / r['ops'])" "$json"
}

declare -A res cpu span
for mode in write read; do
	for size in $SIZES; do
		case $size in
		4k) set -- 4k 64 ;;
		128k) set -- 128k 16 ;;
		*) echo "invalidate-cost: size $size is not 4k or 128k" >&2; exit 1 ;;
		esac
		for _ in $(seq "$RUNS"); do
			one "$port_on" "$pid_on" "$mode" "$1" "$2" >>"$tmp/$mode-$1-on"
			one "$port_off" "$pid_off" "$mode" "$1" "$2" >>"$tmp/$mode-$1-off"
		done
		for w in on off; do
			res[$mode-$1-$w]=$(cut -d' ' -f1 "$tmp/$mode-$1-$w" | median)
			span[$mode-$1-$w]=$(cut -d' ' -f1 "$tmp/$mode-$1-$w" | sort -g |
				awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.0f-%.0fk", lo / 1000, hi / 1000 }')
			cpu[$mode-$1-$w]=$(cut -d' ' -f2 "$tmp/$mode-$1-$w" | median)
		done
	done
done

cost() { python3 -c "print(f'{(1 - $1 / $2) * 100:.1f} %')"; }   # throughput lost
more() { python3 -c "print(f'{($1 / $2 - 1) * 100:+.1f} %')"; }  # CPU added
row() { # mode size qd
	[ -n "${res[$1-$2-on]:-}" ] || return 0
	local on=${res[$1-$2-on]} off=${res[$1-$2-off]} con=${cpu[$1-$2-on]} coff=${cpu[$1-$2-off]}
	echo "| $1 $2, QD $3 | $(printf %.0f "$on") op/s (${span[$1-$2-on]}), $(printf %.2f "$con") us | $(printf %.0f "$off") op/s (${span[$1-$2-off]}), $(printf %.2f "$coff") us | $(cost "$on" "$off") | $(more "$con" "$coff") | <= 10 % |"
}
# Revoke + register alone: 128 chunks of 256 KiB registered, as the servers above.
cycle_ns=$(for _ in 1 2 3; do "$cycle"; done | median)
share() { [ -n "$1" ] && python3 -c "print(f'{$cycle_ns / ($1 * 1000) * 100:.1f} %')" || echo "(not run)"; }
machine=$(machine)
report=$(cat <<MD

### $(date -u +%Y-%m-%d) always_invalidate on vs off, loopback, tcp provider

Machine: $machine. Load average before the run: $(cut -d' ' -f1-3 /proc/loadavg).
Command: \`SIZES="$SIZES" RUNS=$RUNS DURATION=$DURATION bench/invalidate-cost.sh\` (medians of $RUNS alternating runs of ${DURATION} s; one IO connection per CPU).

| load | always_invalidate on: throughput, server CPU per IO | off (same run) | throughput cost | server CPU cost | goal |
|---|---|---|---|---|---|
$(row write 4k 64)
$(row read 4k 64)
$(row write 128k 16)
$(row read 128k 16)

Revoke + register of one chunk key alone (\`build-release/bench/mr-cycle\`, median of 3 runs of
500 000 cycles among 128 registered chunks of 256 KiB): $cycle_ns ns, that is
$(share "${cpu[write-4k-off]:-}") of the server's CPU per 4 KiB write and $(share "${cpu[read-4k-off]:-}") per 4 KiB read
without always_invalidate, $(share "${cpu[read-128k-off]:-}") per 128 KiB read.
MD
)
echo "$report"
if $record; then
	echo "$report" >>bench/RESULTS.md
fi
