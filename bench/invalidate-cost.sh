#!/usr/bin/env bash
# The cost of always_invalidate: the same client load against two servers
# in the same run, one revoking and re-registering every chunk key per IO
# (the default) and one keeping its keys (--no-invalidate). Runs alternate
# between the two so that drift hits both. Goal: at most 10 % cost (the
# kernel pays up to 20 %). Each number is the median of RUNS runs of
# DURATION seconds; with --record the section is appended to bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
DURATION=${DURATION:-5}
record=false
[ "${1:-}" = --record ] && record=true

. bench/lib.sh

bench_processes

start() { # name [server options]: sets $port (no subshell: the trap must see the pid)
	local name=$1
	shift
	# 256 KiB chunks: a 128 KiB IO and its header fit one.
	"$perf" server --addr 127.0.0.1 --port 0 --queue-depth 128 --chunk-size 256k --quiet \
		"$@" >"$tmp/$name" &
	pids+=($!)
	for _ in $(seq 100); do grep -q port "$tmp/$name" && break; sleep 0.05; done
	port=$(grep -o 'port [0-9]*' "$tmp/$name" | cut -d' ' -f2)
}
start on
port_on=$port
start off --no-invalidate
port_off=$port

one() { # port mode size qd
	"$perf" client --dst "127.0.0.1:$1" --mode "$2" --io-size "$3" --queue-depth "$4" \
		--duration "$DURATION" --json |
		python3 -c "import json,sys; r=json.load(sys.stdin); assert r['errors']==0; print(r['ops_per_sec'])"
}

declare -A res
for mode in write read; do
	for spec in "4k 64" "128k 16"; do
		set -- $spec
		for _ in $(seq "$RUNS"); do
			one "$port_on" "$mode" "$1" "$2" >>"$tmp/$mode-$1-on"
			one "$port_off" "$mode" "$1" "$2" >>"$tmp/$mode-$1-off"
		done
		res[$mode-$1-on]=$(median <"$tmp/$mode-$1-on")
		res[$mode-$1-off]=$(median <"$tmp/$mode-$1-off")
	done
done

cost() { python3 -c "print(f'{(1 - $1 / $2) * 100:.1f} %')"; }
row() { # mode size qd
	local on=${res[$1-$2-on]} off=${res[$1-$2-off]}
	echo "| $1 $2, QD $3 | $(printf %.0f "$on") op/s | $(printf %.0f "$off") op/s | $(cost "$on" "$off") | <= 10 % |"
}
machine=$(machine)
report=$(cat <<MD

### $(date -u +%Y-%m-%d) always_invalidate on vs off, loopback, tcp provider

Machine: $machine. Load average before the run: $(cut -d' ' -f1-3 /proc/loadavg).
Command: \`RUNS=$RUNS DURATION=$DURATION bench/invalidate-cost.sh\` (medians of $RUNS alternating runs of ${DURATION} s; one IO connection per CPU).

| load | always_invalidate on | off (same run) | cost | goal |
|---|---|---|---|---|
$(row write 4k 64)
$(row read 4k 64)
$(row write 128k 16)
$(row read 128k 16)
MD
)
echo "$report"
if $record; then
	echo "$report" >>bench/RESULTS.md
fi
