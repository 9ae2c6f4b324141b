#!/usr/bin/env bash
# One IO connection lost by the network while its path's connection 0, the
# only one with heartbeats, goes on: a flow that an ECMP route or a LAG
# member drops, both ways, from one instant (nftables drops by the
# connection's port in the client's namespace). rnbd-server in a "server"
# namespace, rnbd-client perf (one path: connection 0 and one IO
# connection, verified randrw at QD 8) in a "client" namespace. Without a
# bound on unacknowledged bytes (fab_con_cfg.live_ms, TCP_USER_TIMEOUT),
# the requests on that connection wait for the system's retransmissions,
# about 15 minutes, while the heartbeats say the path is fine. With it,
# the connection fails within twice the heartbeat budget (2 x 1 s x 3),
# the path reconnects, the requests go again: perf ends on time with 0
# errors and 0 bad bytes. (Heartbeats would not see even connection 0
# lost here: anything heard on any connection of the path counts.)
# Usage: [BH_DEBUG=1] blackhole.sh BUILD_DIR (BH_DEBUG: show the sockets and
# the logs). Root, iproute2, nftables and ss; exits 77
# without them.
set -euo pipefail
build=$(cd "${1:?usage: blackhole.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root for network namespaces"; exit 77; }
for t in ip nft ss python3; do
	command -v "$t" >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
done
. "$here/lib.sh"
. "$here/../lib/common.sh"

netns_test_begin blackhole

truncate -s 64M "$dir/disk.img"
rnbd_server_start "$dir/server.log" ip netns exec "$S" -- --port 1234 --dev-search-path "$dir" || exit 1
ip netns exec "$C" "$build/tools/rnbd-client" perf --server 198.18.1.1:1234 --session blackhole \
	--device disk.img --io-connections 1 --rw randrw --bs 4k --iodepth 8 --runtime 16 --verify \
	--json >"$dir/perf.json" 2>"$dir/perf.log" &
perf=$!
pids+=($perf)

# The client's sockets to the server: connection 0 carries a heartbeat a
# second, the IO connection the IO; its local port is the busier one's.
conns() { ip netns exec "$C" ss -tniH state established dst 198.18.1.1:1234 2>/dev/null; }
two() { [ "$(conns | grep -c '^[0-9]')" -eq 2 ]; }
wait_until 10 two || { conns; cat "$dir/perf.log"; echo "FAIL: no path of 2 connections"; exit 1; }
sleep 3 # verified IO under way
[ -z "${BH_DEBUG:-}" ] || conns
io_port=$(conns | python3 -c '
import re, sys
socks, port = [], None
for line in sys.stdin:
    if re.match(r"\d", line):  # a socket line; its details follow on the next
        port = line.split()[2].rsplit(":", 1)[1]
        continue
    b = sum(int(x) for x in re.findall(r"bytes_(?:acked|received):(\d+)", line))
    socks.append((b, port))
print(max(socks)[1])')
ip netns exec "$C" nft -f - <<NFT
table inet blackhole {
	chain out { type filter hook output priority 0; tcp sport $io_port drop; }
	chain in { type filter hook input priority 0; tcp dport $io_port drop; }
}
NFT
cut=$SECONDS
rc=0
if wait_until 40 bash -c "! kill -0 $perf 2>/dev/null"; then
	wait "$perf" || rc=$?
	took=$((SECONDS - cut))
else
	rc=124
	took=timeout
fi

check "perf ended on time after the IO connection (port $io_port) was lost: $took s" test "$rc" -ne 124
check "perf exited 0 (rc $rc)" test "$rc" -eq 0
check "0 IO errors and 0 bad bytes" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if d["errors"] == 0 and d["bad"] == 0 and d["reads"] > 0 and d["writes"] > 0 else 1)' "$dir/perf.json"
# Either side's bound may end it first: the client's (its requests
# unacknowledged) or the server's (its answers), which closes the path.
check "the lost connection (not connection 0) failed as timed out, at either end" \
	grep -q 'connection [1-9][0-9]* went down: Connection timed out' "$dir/perf.log" "$dir/server.log"
check "no heartbeat was missed (connection 0 went on)" bash -c "! grep -q 'no heartbeat' '$dir/perf.log'"
if [ "$fails" -ne 0 ] || [ -n "${BH_DEBUG:-}" ]; then
	conns || true
	tail -20 "$dir/perf.log"
	tail -20 "$dir/server.log"
fi
finish blackhole
