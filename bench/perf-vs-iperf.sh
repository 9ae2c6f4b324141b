#!/usr/bin/env bash
# rtrs-perf against iperf3 on loopback, measured in the same run.
#   - 1 MiB writes and reads (queue depth 16) vs one iperf3 TCP stream:
#     goal >= 70 % of iperf3;
#   - 4 KiB writes and reads at queue depth 64: goal >= 80k op/s.
# Each number is the median of RUNS runs of DURATION seconds. Prints a
# markdown section; with --record it is also appended to bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
DURATION=${DURATION:-5}
record=false
[ "${1:-}" = --record ] && record=true

. bench/lib.sh

bench_processes

# --- iperf3 peers ------------------------------------------------------------
# One stream with its default 128 KiB writes and with 1 MiB writes: the
# better of the two is the single-stream peer. Two streams (-P 2) are the
# peer of rtrs-perf's default of one IO connection per CPU.
iperf_port=$((20000 + RANDOM % 20000))
iperf3 -s -B 127.0.0.1 -p "$iperf_port" >/dev/null 2>&1 &
pids+=($!)
sleep 0.5
iperf() {
	for _ in $(seq "$RUNS"); do
		iperf3 -c 127.0.0.1 -p "$iperf_port" -t "$DURATION" -J "$@" |
			python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9)'
	done | median
}
iperf_128k=$(iperf)
iperf_1m=$(iperf -l 1M)
iperf_p2=$(iperf -P 2)
iperf_gbs=$(python3 -c "print(max($iperf_128k, $iperf_1m))")

# --- rtrs-perf server: 2 MiB chunks so 1 MiB IOs fit --------------------------
"$perf" server --addr 127.0.0.1 --port 0 --queue-depth 64 --chunk-size 2M --quiet >"$tmp/srv" &
pids+=($!)
for _ in $(seq 100); do grep -q port "$tmp/srv" && break; sleep 0.05; done
port=$(grep -o 'port [0-9]*' "$tmp/srv" | cut -d' ' -f2)

run() { # mode size qd field [client options]
	local mode=$1 size=$2 qd=$3 field=$4
	shift 4
	for _ in $(seq "$RUNS"); do
		"$perf" client --server "127.0.0.1:$port" --mode "$mode" --io-size "$size" \
			--queue-depth "$qd" --duration "$DURATION" --json "$@" |
			python3 -c "import json,sys; r=json.load(sys.stdin); assert r['errors']==0; print(r['$field'])"
	done | median
}

w1m_1=$(run write 1M 16 gb_per_sec --io-connections 1)
r1m_1=$(run read 1M 16 gb_per_sec --io-connections 1)
w1m=$(run write 1M 16 gb_per_sec)
r1m=$(run read 1M 16 gb_per_sec)
w4k=$(run write 4k 64 ops_per_sec)
r4k=$(run read 4k 64 ops_per_sec)
w4k_1=$(run write 4k 64 ops_per_sec --io-connections 1)
qd1=$(run write 4k 1 ops_per_sec --io-connections 1)

ratio() { python3 -c "print(f'{$1 / $2 * 100:.0f} %')"; }
machine=$(machine)

report=$(cat <<MD

### $(date -u +%Y-%m-%d) loopback, tcp provider

Machine: $machine. Load average before the run: $(cut -d' ' -f1-3 /proc/loadavg).
Command: \`RUNS=$RUNS DURATION=$DURATION bench/perf-vs-iperf.sh\` (medians of $RUNS runs of ${DURATION} s).

| measurement | result | peer (same run) | ratio | goal |
|---|---|---|---|---|
| write 1 MiB, QD 16, 1 IO connection | $(printf %.2f "$w1m_1") GB/s | iperf3 1 stream $(printf %.2f "$iperf_gbs") GB/s | $(ratio "$w1m_1" "$iperf_gbs") | >= 70 % |
| read 1 MiB, QD 16, 1 IO connection | $(printf %.2f "$r1m_1") GB/s | iperf3 1 stream $(printf %.2f "$iperf_gbs") GB/s | $(ratio "$r1m_1" "$iperf_gbs") | >= 70 % |
| write 1 MiB, QD 16, 2 IO connections | $(printf %.2f "$w1m") GB/s | iperf3 -P 2 $(printf %.2f "$iperf_p2") GB/s | $(ratio "$w1m" "$iperf_p2") | |
| read 1 MiB, QD 16, 2 IO connections | $(printf %.2f "$r1m") GB/s | iperf3 -P 2 $(printf %.2f "$iperf_p2") GB/s | $(ratio "$r1m" "$iperf_p2") | |
| write 4 KiB, QD 64, 2 IO connections | $(printf %.0f "$w4k") op/s | | | >= 80 000 op/s |
| read 4 KiB, QD 64, 2 IO connections | $(printf %.0f "$r4k") op/s | | | >= 80 000 op/s |
| write 4 KiB, QD 64, 1 IO connection | $(printf %.0f "$w4k_1") op/s | | | |
| write 4 KiB, QD 1, 1 IO connection | $(printf %.0f "$qd1") op/s | | | |

iperf3 single stream: $(printf %.2f "$iperf_128k") GB/s with 128 KiB writes, $(printf %.2f "$iperf_1m") GB/s with 1 MiB writes (the better one is the peer).
MD
)
echo "$report"
if $record; then
	[ -f bench/RESULTS.md ] || printf '# Benchmark results\n\nEach section is one run of a script in bench/, with its command and machine.\n' >bench/RESULTS.md
	echo "$report" >>bench/RESULTS.md
fi
