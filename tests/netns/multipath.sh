#!/usr/bin/env bash
# Multipath under real network faults: two network namespaces (server,
# client) joined by two veth links on two subnets = two real paths. The
# addresses exist only inside the namespaces this script creates. Verified
# IO (rtrs-perf --verify) runs while the script:
#   a. takes link 1 down for 3 s: no IO error, path 0 fails, reconnects;
#   b. drops link 1's packets silently (nftables): no IO error, and IO is
#      never stuck longer than the heartbeat bound (+ fence and slack);
#   c. takes both links down for less than fast_io_fail: IO waits and
#      completes; for longer: IO fails with ETIMEDOUT;
#   d. kills the server and starts it again: the paths reconnect and the
#      IO in flight and waiting completes, verified.
# With TLS=1 every connection runs in TLS (the server requires it, with a
# PSK of nvme gen-tls-key in its key file); with TLS=concat the client's
# PSKs come from each attempt's DH-HMAC-CHAP exchange (secure channel
# concatenation), so every reconnect makes a new one.
# Usage: [TLS=1|concat] multipath.sh BUILD_DIR. Prints "N passed, N failed"; 77 = skipped.
set -uo pipefail
build=$(cd "${1:?usage: multipath.sh BUILD_DIR}" && pwd)
perf=$build/tools/rtrs-perf

if [ "$(id -u)" -ne 0 ]; then echo "multipath: needs root (namespaces); skipping"; exit 77; fi
for t in ip nft python3; do
	command -v "$t" >/dev/null || { echo "multipath: $t missing; skipping"; exit 77; }
done

. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
trap 'netns_cleanup; rm -rf "$tmp"' EXIT
netns_setup || exit 1

HB=500 MISSED=3
srv_tls=() clt_tls=()
if [ "${TLS:-0}" != 0 ]; then
	command -v nvme >/dev/null || { echo "multipath: nvme (nvme-cli) missing; skipping"; exit 77; }
	(
		umask 077
		nvme gen-dhchap-key -m 0 -n mp-host >"$tmp/secret"
		nvme gen-tls-key >"$tmp/tls"
		echo "mp-host $(cat "$tmp/secret") tls=$(cat "$tmp/tls")" >"$tmp/keys"
	)
	srv_tls=(--auth-keys "$tmp/keys" --tls required)
	clt_tls=(--host-name mp-host --secret "@$tmp/secret" --tls required --tls-key "@$tmp/tls")
	[ "$TLS" = concat ] && clt_tls=(--host-name mp-host --secret "@$tmp/secret" --tls concat)
	if [ "$TLS" = concat ]; then echo "multipath: on TLS, PSKs by secure channel concatenation"
	else echo "multipath: on TLS"; fi
fi
start_server() {
	: >"$tmp/srv.log"
	ip netns exec $S "$perf" server --addr 0.0.0.0 --port 4791 --queue-depth 64 \
		--hb-interval $HB --quiet "${srv_tls[@]}" >"$tmp/srv.log" 2>&1 &
	srv=$!
	disown $srv
	for _ in $(seq 100); do grep -q port "$tmp/srv.log" && break; sleep 0.05; done
}
start_server

passed=0 failed=0
check() { # name condition-exit-status detail
	if [ "$2" -eq 0 ]; then passed=$((passed + 1)); echo "ok   $1"
	else failed=$((failed + 1)); echo "FAIL $1: $3"; fi
}

# client SECONDS FAST_IO_FAIL_MS > JSON on stdout
client() {
	ip netns exec $C "$perf" client --server 198.18.1.1:4791 --server 198.18.2.1:4791 \
		--queue-depth 16 --io-size 16k --duration "$1" --verify --json \
		--hb-interval-ms $HB --reconnect-delay-ms 300 --fast-io-fail-ms "$2" "${clt_tls[@]}" \
		2>"$tmp/clt.err"
}
field() { python3 -c "import json,sys; r=json.loads(sys.argv[1]); print(eval(sys.argv[2]))" "$1" "$2"; }

# a. link 1 down for 3 s, then up again.
client 9 10000 >"$tmp/a.json" &
pid=$!
sleep 2; ip -n $C link set ${tag}c1 down
sleep 3; ip -n $C link set ${tag}c1 up
wait $pid
out=$(cat "$tmp/a.json")
errs=$(field "$out" 'r["errors"] + r["bad"]')
rec=$(field "$out" 'r["paths"][0]["reconnects"]')
check "a. link down: no IO error, every byte verified" "$([ "$errs" = 0 ] && [ -n "$out" ]; echo $?)" "$out $(tail -3 "$tmp/clt.err")"
check "a. link down: path 0 reconnected after the link came back" "$([ "$rec" -ge 1 ]; echo $?)" "reconnects $rec"

# b. silent loss on link 1: nothing on the wire says so.
client 10 10000 >"$tmp/b.json" &
pid=$!
sleep 2
ip netns exec $C nft -f - <<EOF
table inet $tag {
	chain out { type filter hook output priority 0; ip daddr 198.18.1.1 drop; }
	chain in { type filter hook input priority 0; ip saddr 198.18.1.1 drop; }
}
EOF
sleep 5; ip netns exec $C nft delete table inet $tag
wait $pid
out=$(cat "$tmp/b.json")
errs=$(field "$out" 'r["errors"] + r["bad"]')
max=$(field "$out" 'r["lat_us"]["max"]')
bound=$(( (HB * (MISSED + 1) + 1500) * 1000 ))
check "b. silent loss: no IO error, every byte verified" "$([ "$errs" = 0 ] && [ -n "$out" ]; echo $?)" "$out $(tail -3 "$tmp/clt.err")"
check "b. silent loss: IO moved on within $((bound / 1000)) ms (worst IO $((max / 1000)) ms)" "$([ "$max" -le "$bound" ]; echo $?)" "max latency ${max} us"

# c. both links down: shorter than fast_io_fail, then longer.
client 9 10000 >"$tmp/c1.json" &
pid=$!
sleep 2; ip -n $C link set ${tag}c1 down; ip -n $C link set ${tag}c2 down
sleep 2.5; ip -n $C link set ${tag}c1 up; ip -n $C link set ${tag}c2 up
wait $pid
out=$(cat "$tmp/c1.json")
errs=$(field "$out" 'r["errors"] + r["bad"]')
check "c. both links down 2.5 s < fast_io_fail 10 s: IO waited and completed" "$([ "$errs" = 0 ] && [ -n "$out" ]; echo $?)" "$out $(tail -3 "$tmp/clt.err")"

client 8 1500 >"$tmp/c2.json" &
pid=$!
sleep 2; ip -n $C link set ${tag}c1 down; ip -n $C link set ${tag}c2 down
sleep 4; ip -n $C link set ${tag}c1 up; ip -n $C link set ${tag}c2 up
wait $pid
grep -q "first: Connection timed out" "$tmp/clt.err"
check "c. both links down 4 s > fast_io_fail 1.5 s: IO failed with ETIMEDOUT" $? "$(tail -3 "$tmp/clt.err")"

# d. the server killed and started again.
client 10 10000 >"$tmp/d.json" &
pid=$!
sleep 2; kill -9 $srv
sleep 2; start_server
wait $pid
out=$(cat "$tmp/d.json")
errs=$(field "$out" 'r["errors"] + r["bad"]')
rec=$(field "$out" 'min(p["reconnects"] for p in r["paths"])')
check "d. server restarted: no IO error, every byte verified" "$([ "$errs" = 0 ] && [ -n "$out" ]; echo $?)" "$out $(tail -3 "$tmp/clt.err")"
check "d. server restarted: both paths reconnected" "$([ "$rec" -ge 1 ]; echo $?)" "reconnects $rec"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
