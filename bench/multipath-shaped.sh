#!/usr/bin/env bash
# Two paths each shaped to the same rate (tc tbf) against one of them, in
# network namespaces (tests/netns/lib.sh): goal >= 1.8x the throughput.
# Then, with the default heartbeat (1000 ms x 3), how long IO stalls when
# one path goes silent (nftables drop): goal <= 5 s (the kernel: 25-35 s).
#   bench/multipath-shaped.sh [--record]      (root)
set -euo pipefail
cd "$(dirname "$0")/.."
record=false
[ "${1:-}" = --record ] && record=true
RATE=${RATE:-200mbit}
DURATION=${DURATION:-6}
. bench/lib.sh
. tests/netns/lib.sh
tmp=$(mktemp -d)
trap 'netns_cleanup; rm -rf "$tmp"' EXIT
netns_setup
for i in 1 2; do
	for ns_dev in "$C ${tag}c$i" "$S ${tag}s$i"; do
		set -- $ns_dev
		ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 256kb latency 100ms
	done
done
ip netns exec $S "$perf" server --addr 0.0.0.0 --port 4791 --queue-depth 64 --quiet >"$tmp/srv" 2>&1 &
for _ in $(seq 100); do grep -q port "$tmp/srv" && break; sleep 0.05; done

run() { # dsts... -> GB/s
	local args=()
	for d in "$@"; do args+=(--server "$d"); done
	ip netns exec $C "$perf" client "${args[@]}" --mode write --io-size 64k --queue-depth 32 \
		--duration "$DURATION" --json |
		python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["errors"]==0; print(r["gb_per_sec"])'
}
one=$(run 198.18.1.1:4791)
two=$(run 198.18.1.1:4791 198.18.2.1:4791)
ratio=$(python3 -c "print(f'{$two / $one:.2f}')")

# Silent path with the default heartbeat.
ip netns exec $C "$perf" client --server 198.18.1.1:4791 --server 198.18.2.1:4791 --mode write \
	--io-size 4k --queue-depth 16 --duration 14 --json >"$tmp/silent.json" &
pid=$!
sleep 3
ip netns exec $C nft -f - <<NFT
table inet $tag {
	chain out { type filter hook output priority 0; ip daddr 198.18.1.1 drop; }
	chain in { type filter hook input priority 0; ip saddr 198.18.1.1 drop; }
}
NFT
wait $pid
stall=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["errors"]==0; print(r["lat_us"]["max"] / 1000)' "$tmp/silent.json")

section=$(cat <<MD

### $(date -u +%Y-%m-%d) two shaped paths (network namespaces, tcp)

Machine: $(nproc) vCPU, kernel $(uname -r). Command: \`RATE=$RATE DURATION=$DURATION bench/multipath-shaped.sh\`.
Each veth link is shaped with \`tc tbf rate $RATE\` in both directions; rtrs-perf writes 64 KiB at queue depth 32.

| measurement | result | goal |
|---|---|---|
| one path | $(printf %.3f "$one") GB/s | |
| two paths (min-inflight) | $(printf %.3f "$two") GB/s | |
| two paths / one path | ${ratio}x | >= 1.8x |
| worst IO stall when one path goes silent (nftables drop), default heartbeat 1000 ms x 3 | $(printf %.0f "$stall") ms, no IO error | <= 5000 ms (kernel: 25-35 s) |
MD
)
echo "$section"
$record && echo "$section" >>bench/RESULTS.md
exit 0
