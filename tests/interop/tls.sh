#!/usr/bin/env bash
# TLS on the tcp fabric (docs/security.md section 9), rnbd-server and
# rnbd-client over loopback, with PSKs that nvme-cli made:
#   - a capture (tcpdump on lo) of 1 MiB of a known pattern written and
#     read back over a TLS path holds none of its bytes; the same over a
#     plain path holds them (the capture can see them);
#   - a PSK from `nvme gen-tls-key` (SHA-256 and SHA-384) works, and so does
#     one derived from the host's DH-HMAC-CHAP secret (no tls= key);
#   - secure channel concatenation (--tls concat): each path's PSK comes
#     from a DH-HMAC-CHAP exchange in the clear; the pattern's round holds
#     none of the pattern either; a wrong secret is EKEYREJECTED once, a
#     server without TLS EPROTONOSUPPORT once; 40 concat sessions opened
#     at one instant all open and verify their IO;
#   - each refusal fails the first attempt with its errno and is not tried
#     again (the server sees it once): a wrong PSK and a host the server
#     has no key for (EKEYREJECTED), a client without a key (ENOKEY, no
#     connection at all), a plain client to a server that requires TLS and
#     a TLS client to a server without it (EPROTONOSUPPORT);
#   - floods at a TLS server (connections that send nothing, handshakes
#     that stop after their first bytes, garbage after a record header)
#     while a TLS client's verified IO goes on: 0 errors, the server's
#     descriptors bounded, every flood connection closed;
#   - a host removed from the key file (keys reload): its TLS path closes
#     and its reconnect fails the handshake, without retrying.
# Usage: tls.sh BUILD_DIR.
set -euo pipefail
build=$(cd "${1:?usage: tls.sh BUILD_DIR}" && pwd)
client=$build/tools/rnbd-client
for t in python3 tcpdump nvme; do
	command -v "$t" >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: tcpdump on lo needs root"; exit 77; }

. "$(dirname "$0")/../lib/common.sh"
dir=$(mktemp -d /var/tmp/rnbd-tls.XXXXXX)
trap 'kill_pids; [ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT

mkdir -p "$dir/export"
(
	umask 077
	for h in a b c; do nvme gen-dhchap-key -m 0 -n "host-$h" >"$dir/$h.secret"; done
	nvme gen-tls-key --hmac=1 >"$dir/a.tls"
	nvme gen-tls-key --hmac=2 >"$dir/b.tls"
	# host-c has no tls= key: its PSK is derived from its secret.
	printf 'host-a %s tls=%s\nhost-b %s tls=%s\nhost-c %s\n' \
		"$(cat "$dir/a.secret")" "$(cat "$dir/a.tls")" \
		"$(cat "$dir/b.secret")" "$(cat "$dir/b.tls")" "$(cat "$dir/c.secret")" >"$dir/keys"
	grep -v '^host-b' "$dir/keys" >"$dir/keys.no-b"
)
printf '* sessions=* rw=*\n' >"$dir/access"
# 1 MiB of a pattern that nothing else sends: a line with its number, repeated.
python3 -c '
import sys
sys.stdout.write("".join("RTRS-TLS-CAPTURE-PATTERN line %08d -- the bytes a tap must not see\n" % i
                         for i in range(16384))[:1 << 20])' >"$dir/pattern"
head -c $((8 << 20)) /dev/zero >"$dir/export/disk.img"

# as HOST VERB PORT ARGS...: rnbd-client as host-HOST.
as() {
	local h=$1 verb=$2 p=$3
	shift 3
	"$client" "$verb" --server "127.0.0.1:$p" --host-name "host-$h" \
		--secret "@$dir/$h.secret" --reconnect-delay-ms 100 "$@"
}
# pattern_round PORT ARGS...: the pattern written at 1 MiB and read back equal.
pattern_round() {
	local p=$1
	shift
	rm -f "$dir/back"
	as a write "$p" --device disk.img --file "$dir/pattern" --offset 1M "$@" >/dev/null &&
		as a read "$p" --device disk.img --file "$dir/back" --offset 1M --length 1M "$@" \
			>/dev/null && cmp -s "$dir/pattern" "$dir/back"
}
# in_capture FILE: how often a 64-byte piece of the pattern is in the capture.
in_capture() {
	python3 -c '
import sys
cap = open(sys.argv[1], "rb").read()
print(sum(cap.count(("RTRS-TLS-CAPTURE-PATTERN line %08d" % i).encode()) for i in range(0, 16384, 7)))' "$1"
}
# capture NAME PORT ARGS...: the pattern's round over PORT while tcpdump records lo.
capture() {
	local name=$1 p=$2 tp
	shift 2
	: >"$dir/$name.tcpdump"
	tcpdump -i lo -U -s 0 -w "$dir/$name.pcap" "tcp port $p" 2>"$dir/$name.tcpdump" &
	tp=$!
	wait_until 10 grep -q 'listening on' "$dir/$name.tcpdump" || { kill $tp; return 1; }
	pattern_round "$p" "$@" || { kill $tp; wait $tp || true; return 1; }
	sleep 0.3
	kill -INT $tp
	wait $tp || true
}
# refused WANT SERVER_LOG LINE CMD...: exit 1 within 5 s saying WANT; after
# another second the server's log has LINE exactly once (no retry).
refused() {
	local want=$1 log=$2 line=$3 rc=0 t0=$SECONDS
	shift 3
	"$@" >/dev/null 2>"$dir/refused.err" || rc=$?
	if [ "$rc" -ne 1 ] || [ $((SECONDS - t0)) -gt 5 ] || ! grep -qF -- "$want" "$dir/refused.err"; then
		echo "  exit $rc after $((SECONDS - t0)) s: $(tail -1 "$dir/refused.err")"
		return 1
	fi
	[ -z "$line" ] && return 0
	sleep 1
	local n
	n=$(grep -cF -- "$line" "$log" || true)
	[ "$n" -eq 1 ] || { echo "  the server saw it $n times"; return 1; }
}

# ---- servers: TLS required, TLS off, TLS offered --------------------------------------

rnbd_server_start "$dir/req.log" -- --port 0 --dev-search-path "$dir/export" \
	--auth-keys "$dir/keys" --access "$dir/access" --tls required --control "$dir/req.ctl" \
	--log-level info || exit 1
req=$port req_pid=${pids[-1]}
rnbd_server_start "$dir/off.log" -- --port 0 --dev-search-path "$dir/export" \
	--auth-keys "$dir/keys" --access "$dir/access" --log-level info || exit 1
off=$port
rnbd_server_start "$dir/offer.log" -- --port 0 --dev-search-path "$dir/export" \
	--auth-keys "$dir/keys" --access "$dir/access" --tls offered --log-level info || exit 1
offer=$port

check "rnbd-server without --auth-keys refuses --tls at start" \
	bash -c "! timeout 10 '$build/daemons/rnbd-server' --port 0 --tls required \
		>'$dir/early.log' 2>&1 && grep -q 'needs --auth-keys' '$dir/early.log'"

# ---- what a tap sees ----------------------------------------------------------------

check "TLS: the pattern written and read back (a PSK of nvme gen-tls-key, SHA-256)" \
	capture tls "$req" --tls required --tls-key "@$dir/a.tls"
check "... the capture holds none of it" test "$(in_capture "$dir/tls.pcap")" -eq 0
check "... and is not empty (it saw the session)" \
	test "$(stat -c %s "$dir/tls.pcap")" -gt $((2 << 20))
check "plain: the same round without TLS" capture plain "$off"
check "... the capture holds the pattern" test "$(in_capture "$dir/plain.pcap")" -gt 100

# ---- keys -----------------------------------------------------------------------------

check "a SHA-384 PSK (nvme gen-tls-key --hmac=2)" \
	bash -c "'$client' write --server 127.0.0.1:$req --host-name host-b \
		--secret @$dir/b.secret --tls required --tls-key @$dir/b.tls --device disk.img \
		--file $dir/pattern >/dev/null"
check "a PSK derived from the DH-HMAC-CHAP secret (host-c, no tls= key)" \
	bash -c "'$client' info --server 127.0.0.1:$req --host-name host-c \
		--secret @$dir/c.secret --tls required --device disk.img >/dev/null"
check "a TLS client to a server that offers TLS" pattern_round "$offer" --tls required \
	--tls-key "@$dir/a.tls"
check "a plain client to a server that offers TLS" pattern_round "$offer"

# ---- secure channel concatenation ------------------------------------------------------

n0=$(grep -c 'a TLS PSK generated for its path' "$dir/req.log" || true)
check "concat: the pattern written and read back, each path's PSK from its exchange" \
	capture concat "$req" --tls concat
check "... the capture holds none of it" test "$(in_capture "$dir/concat.pcap")" -eq 0
check "... and is not empty (it saw the session)" \
	test "$(stat -c %s "$dir/concat.pcap")" -gt $((2 << 20))
check "... the server generated one PSK per session (the write's and the read's)" \
	test "$(grep -c 'a TLS PSK generated for its path' "$dir/req.log")" -eq $((n0 + 2))
check "... and the generated identities, not the derived one, opened TLS" \
	bash -c "! grep -q 'RTRS0D01 host-a' '$dir/req.log'"
check "concat to a server that offers TLS" pattern_round "$offer" --tls concat
check "concat with a wrong secret: EKEYREJECTED at the first attempt, never again" \
	refused "Key was rejected by service" "$dir/req.log" "host host-b failed authentication" \
	"$client" info --server "127.0.0.1:$req" --host-name host-b --secret "@$dir/a.secret" \
	--tls concat --device disk.img
check "concat to a server without TLS: EPROTONOSUPPORT at the first attempt, never again" \
	refused "Protocol not supported" "$dir/off.log" \
	"a secure channel concatenation, and this server has no TLS" \
	as a info "$off" --device disk.img --tls concat
check "concat with a TLS key: refused at open" \
	refused "generates its PSK" "$dir/req.log" "" \
	as a info "$req" --device disk.img --tls concat --tls-key "@$dir/a.tls"

# A storm of concatenations: 40 sessions opened at one instant. Each path's
# concatenation comes back under the same name when the server, busy,
# made it wait, so admission lets it through in its turn.
for i in $(seq 40); do head -c 1M /dev/zero >"$dir/export/s$i.img"; done
rm -f "$dir/go"
mkfifo "$dir/go"
storm=()
for i in $(seq 40); do
	( read -r _ <"$dir/go"
	  # The default reconnect delay: a busy server's refusals are retried
	  # over seconds, not the 100 ms of the other rounds.
	  "$client" perf --server "127.0.0.1:$req" --host-name host-a --secret "@$dir/a.secret" \
		--device "s$i.img" --tls concat --verify -t 2 -q 4 --io-connections 2 \
		--json >"$dir/storm.$i.json" 2>"$dir/storm.$i.err" ) &
	storm+=($!)
done
sleep 0.5
python3 -c 'import sys; open(sys.argv[1], "w").write("go\n" * 40)' "$dir/go"
storm_fail=0
for p in "${storm[@]}"; do wait "$p" || storm_fail=$((storm_fail + 1)); done
check "a storm of 40 concat sessions at once: every one opens and verifies its IO ($storm_fail failed)" \
	python3 -c '
import glob, json, sys
n = 0
for f in glob.glob(sys.argv[1] + "/storm.*.json"):
    j = json.load(open(f))
    if j["errors"] or j["bad"] or j["reads"] + j["writes"] == 0:
        sys.exit(1)
    n += 1
sys.exit(0 if n == 40 else 1)' "$dir"
[ "$storm_fail" -eq 0 ] || cat "$dir"/storm.*.err | sort | uniq -c | head -5

# ---- refusals -------------------------------------------------------------------------

nvme gen-tls-key --hmac=1 >"$dir/wrong.tls"
check "a wrong PSK: EKEYREJECTED at the first attempt, never again" \
	refused "Key was rejected by service" "$dir/req.log" "binder does not verify" \
	as a info "$req" --device disk.img --tls required --tls-key "@$dir/wrong.tls"
check "a host the server has no key for: EKEYREJECTED, once" \
	refused "Key was rejected by service" "$dir/req.log" "host host-d is not in the key file" \
	"$client" info --server "127.0.0.1:$req" --host-name host-d --secret "@$dir/a.secret" \
	--tls required --device disk.img
check "host-c asking for a configured PSK it does not have: EKEYREJECTED, once" \
	refused "Key was rejected by service" "$dir/req.log" "host host-c has no tls= key" \
	as c info "$req" --device disk.img --tls required --tls-key "@$dir/a.tls"
conns=$(grep -c . "$dir/req.log")
check "no key at all (neither a PSK nor a secret): ENOKEY" \
	refused "TLS needs a key" "$dir/req.log" "" \
	"$client" info --server "127.0.0.1:$req" --host-name host-a --tls required --device disk.img
check "... and no connection was made" test "$(grep -c . "$dir/req.log")" -eq "$conns"
check "a plain client to a server that requires TLS: EPROTONOSUPPORT, once" \
	refused "Protocol not supported" "$dir/req.log" "a connection without TLS (this server requires it)" \
	as a info "$req" --device disk.img
check "... the client says the server requires TLS" grep -q "the server requires TLS" "$dir/refused.err"
check "a TLS client to a server without TLS: EPROTONOSUPPORT, once" \
	refused "Protocol not supported" "$dir/off.log" "a TLS connection (this server has no TLS)" \
	as a info "$off" --device disk.img --tls required --tls-key "@$dir/a.tls"
check "... the client says the server has no TLS" grep -q "the server has no TLS" "$dir/refused.err"

# ---- floods while a TLS client works ---------------------------------------------------

fds() { ls "/proc/$req_pid/fd" | wc -l; }
fds0=$(fds)
as a perf "$req" --device disk.img --tls required --tls-key "@$dir/a.tls" --verify -t 8 \
	-q 16 --json >"$dir/perf.json" 2>"$dir/perf.err" &
perf=$!
sleep 1
python3 - "$req" >"$dir/flood.out" <<'EOF' &
import socket, sys, time
port = int(sys.argv[1])
held, opened = [], 0
end = time.time() + 4
while time.time() < end:
    for kind in range(3):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:
            continue
        opened += 1
        if kind == 1:
            s.send(b"\x16\x03\x01")                    # a handshake record's start, then nothing
        elif kind == 2:
            s.send(b"\x16\x03\x01\x00\x30" + b"\xee" * 48)  # a record of garbage
        held.append(s)
    time.sleep(0.005)
    if len(held) > 900:
        for s in held[:300]:
            s.close()
        del held[:300]
print(opened)
EOF
flood=$!
peak=0
while kill -0 $flood 2>/dev/null; do
	n=$(fds)
	[ "$n" -le "$peak" ] || peak=$n
	sleep 0.1
done
wait $flood
rc=0
wait $perf || rc=$?
check "a TLS client's verified IO through the floods: no error" \
	bash -c "[ $rc -eq 0 ] && python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
sys.exit(0 if j[\"errors\"] == 0 and j[\"bad\"] == 0 and j[\"reads\"] + j[\"writes\"] > 1000 else 1)' '$dir/perf.json'"
check "... the floods made connections ($(cat "$dir/flood.out"))" test "$(cat "$dir/flood.out")" -gt 300
check "... the server's descriptors stayed bounded ($fds0, at most $peak during the floods)" \
	test "$peak" -lt $((fds0 + 600))
check "... and every flood connection went (fds back within 10 s)" \
	wait_until 10 bash -c "[ \$(ls /proc/$req_pid/fd | wc -l) -le $((fds0 + 4)) ]"

# ---- revocation --------------------------------------------------------------------------

as b perf "$req" --device disk.img --tls required --tls-key "@$dir/b.tls" --verify -t 30 -q 4 \
	--json >"$dir/b.json" 2>"$dir/b.err" &
bperf=$!
wait_until 10 grep -q "host-b" "$dir/req.log"
sleep 1
cp "$dir/keys.no-b" "$dir/keys.new" && mv "$dir/keys.new" "$dir/keys"
check "host-b removed from the key file: keys reload" ctl "$dir/req.ctl" server keys reload
t0=$SECONDS
rc=0
wait $bperf || rc=$?
check "... host-b's IO stops with an error within 10 s, not at the end of its run" \
	test "$rc" -ne 0 -a $((SECONDS - t0)) -le 10
# Its reconnect (100 ms after the close) may or may not have come before the
# client stopped on the error: at most one handshake, never retried.
n0=$(grep -c 'host host-b is not in the key file' "$dir/req.log" || true)
check "... its reconnect, if it came before the client stopped, failed once ($n0)" test "$n0" -le 1
sleep 1
check "... and was not retried" \
	test "$(grep -c 'host host-b is not in the key file' "$dir/req.log")" -eq "$n0"
rc=0
as b info "$req" --device disk.img --tls required --tls-key "@$dir/b.tls" \
	>/dev/null 2>"$dir/b-again.err" || rc=$?
check "a new open as host-b: EKEYREJECTED" \
	bash -c "[ $rc -eq 1 ] && grep -q 'Key was rejected by service' '$dir/b-again.err'"
sleep 1
check "... at the first attempt, never again" \
	test "$(grep -c 'host host-b is not in the key file' "$dir/req.log")" -eq $((n0 + 1))
check "host-a still opens" pattern_round "$req" --tls required --tls-key "@$dir/a.tls"

finish tls
