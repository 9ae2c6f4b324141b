#!/usr/bin/env bash
# Per-host authorization (docs/security.md section 2.6): rnbd-server with
# --auth-keys and --access, two hosts, A and B, over tcp on loopback:
#   - A writes and reads back its own device; opens the shared image
#     read-only, not read-write;
#   - A is refused B's device (EACCES, a log line naming host and device)
#     and B's session name (EACCES, at the first attempt, never again);
#     B's device holds exactly its own bytes and the server counted no IO
#     of A on it;
#   - B uses its own session and device meanwhile;
#   - A's line removed and the file read again (rnbd server access reload):
#     A opens nothing new, B goes on; A's line back (SIGHUP): A opens again;
#   - a file broken at run time: the reload names file and line, and
#     nothing new is granted to anyone until it is fixed;
#   - at start: --auth-keys without --access, --access without --auth-keys
#     and a bad line each stop the server with the cause;
#   - host B removed from the key file under verified IO of A and B, the
#     file read again (rnbd server keys reload): B's path closes, its
#     reconnect is refused and not retried, its IO fails within 5 s; A's
#     goes on without an error.
# Usage: access.sh BUILD_DIR.
set -euo pipefail
build=$(cd "${1:?usage: access.sh BUILD_DIR}" && pwd)
client=$build/tools/rnbd-client
command -v python3 >/dev/null || { echo "SKIP: python3 is not installed"; exit 77; }

. "$(dirname "$0")/../lib/common.sh"
dir=$(mktemp -d /var/tmp/rnbd-access.XXXXXX)
trap 'kill_pids; [ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT

mkdir -p "$dir/export/images"
head -c $((4 << 20)) /dev/urandom >"$dir/export/a.img"
head -c $((4 << 20)) /dev/urandom >"$dir/export/b.img"
head -c $((1 << 20)) /dev/urandom >"$dir/export/images/base.img"
cp "$dir/export/b.img" "$dir/b.orig"
(
	umask 077
	for h in A B; do "$build/tools/rtrs-key" gen --hmac 1 >"$dir/$h.key"; done
	printf 'host-a %s\nhost-b %s\n' "$(cat "$dir/A.key")" "$(cat "$dir/B.key")" >"$dir/keys"
)
cat >"$dir/access.full" <<'EOF'
# host   what it may use
host-a   sessions=a-*   rw=a.img   ro=images/*
host-b   sessions=b-*   rw=b.img
EOF
grep -v '^host-a' "$dir/access.full" >"$dir/access.no-a"
cp "$dir/access.full" "$dir/access"

# as HOST VERB SESSION ARGS...: rnbd-client as host-a or host-b.
as() {
	local h=$1 verb=$2 sess=$3
	shift 3
	"$client" "$verb" --server "127.0.0.1:$port" --session "$sess" \
		--host-name "host-$(tr 'AB' 'ab' <<<"$h")" --secret "@$dir/$h.key" \
		--reconnect-delay-ms 100 "$@"
}
# refused WANT CMD...: fails (exit 1) within 5 s, saying WANT.
refused() {
	local want=$1 rc=0 t0=$SECONDS
	shift
	"$@" >/dev/null 2>"$dir/refused.err" || rc=$?
	[ "$rc" -eq 1 ] && [ $((SECONDS - t0)) -le 5 ] && grep -qF -- "$want" "$dir/refused.err" ||
		{ echo "  exit $rc after $((SECONDS - t0)) s: $(tail -1 "$dir/refused.err")"; return 1; }
}
# round_trip HOST SESSION DEVICE: 1 MiB written at 1 MiB and read back equal.
round_trip() {
	head -c $((1 << 20)) /dev/urandom >"$dir/in-$1"
	as "$1" write "$2" --device "$3" --file "$dir/in-$1" --offset 1M >/dev/null &&
		as "$1" read "$2" --device "$3" --file "$dir/out-$1" --offset 1M --length 1M \
			>/dev/null && cmp -s "$dir/in-$1" "$dir/out-$1"
}

# ---- at start ---------------------------------------------------------------------

# early NAME WANT ARGS...: rnbd-server ARGS ends at once (exit 2: configuration), saying WANT.
early() {
	local name=$1 want=$2 rc=0
	shift 2
	timeout 10 "$build/daemons/rnbd-server" --port 0 --dev-search-path "$dir/export" "$@" \
		>"$dir/early-$name.log" 2>&1 || rc=$?
	[ "$rc" -eq 2 ] && grep -qF -- "$want" "$dir/early-$name.log" ||
		{ echo "  exit $rc: $(tail -2 "$dir/early-$name.log")"; return 1; }
}
check "--auth-keys without --access: refused at start, fail closed" \
	early noaccess "--auth-keys needs --access FILE" --auth-keys "$dir/keys"
check "--access without --auth-keys: refused (hosts are named by authentication)" \
	early nokeys "needs --auth-keys" --access "$dir/access"
printf 'host-a sessions=a-*\nhost-b rw=b.img wr=x\n' >"$dir/bad.access"
check "a line not understood: the file, the line and the cause" \
	early badline "$dir/bad.access:2: unknown kind" --auth-keys "$dir/keys" \
	--access "$dir/bad.access"
printf 'host-a\n' >"$dir/bare.access"
check "a host granted nothing: refused, its line named" \
	early bare "$dir/bare.access:1: a host with nothing granted" --auth-keys "$dir/keys" \
	--access "$dir/bare.access"
printf 'host-a rw=/a.img sessions=a\n' >"$dir/slash.access"
check "a device pattern with a leading /: refused" \
	early slash "$dir/slash.access:1: a device pattern starting with '/'" \
	--auth-keys "$dir/keys" --access "$dir/slash.access"

# ---- two hosts ----------------------------------------------------------------------

rnbd_server_start "$dir/server.log" -- --port 0 --dev-search-path "$dir/export" \
	--auth-keys "$dir/keys" --access "$dir/access" --control "$dir/ctl" || exit 1
server_pid=${pids[-1]}
check "the server says what it read" grep -q "access file $dir/access: 2 hosts' lines" \
	"$dir/server.log"
check "A writes and reads back its own device" round_trip A a-1 a.img
check "... the server's file holds A's bytes" \
	cmp -s "$dir/in-A" <(tail -c +$(((1 << 20) + 1)) "$dir/export/a.img" | head -c $((1 << 20)))
check "A reads the shared image (ro)" \
	as A read a-1 --device images/base.img --file "$dir/base.out" --length 1M
check "... its bytes" cmp -s "$dir/base.out" "$dir/export/images/base.img"
check "A may not open the shared image read-write" \
	refused "Permission denied" as A info a-1 --device images/base.img --mode rw
check "A is refused B's device (EACCES)" \
	refused "Permission denied" as A read a-1 --device b.img --file "$dir/stolen" --length 1M
check "... a write too" \
	refused "Permission denied" as A write a-1 --device b.img --file "$dir/in-A"
check "... the server's log names host, session and device" \
	grep -q "rnbd: a-1: host host-a may not open b.img (ro): not granted by $dir/access" \
	"$dir/server.log"
check "... nothing of B's device reached A" test ! -s "$dir/stolen"
check "A is refused B's session name (EACCES), at the first attempt" \
	refused "Permission denied" as A info b-1 --device a.img
check "... the server refused it once and names the host" \
	test "$(grep -c 'session b-1 refused: host host-a may not use that name' \
		"$dir/server.log")" -eq 1
sleep 1
check "... and the client never tried again" \
	test "$(grep -c 'session b-1 refused' "$dir/server.log")" -eq 1
check "B writes and reads back its own device" round_trip B b-1 b.img
cp "$dir/b.orig" "$dir/b.want"
dd if="$dir/in-B" of="$dir/b.want" bs=1M seek=1 conv=notrunc status=none
check "B's device holds exactly its own bytes (none of A's)" cmp -s "$dir/b.want" "$dir/export/b.img"

# ---- at run time --------------------------------------------------------------------

cp "$dir/access.no-a" "$dir/access.new" && mv "$dir/access.new" "$dir/access"
check "A's line removed: the file read again (rnbd server access reload)" \
	ctl "$dir/ctl" server access reload
check "... A opens nothing new (its own device: EACCES)" \
	refused "Permission denied" as A info a-2 --device a.img
check "... B goes on" round_trip B b-2 b.img
cp "$dir/access.full" "$dir/access.new" && mv "$dir/access.new" "$dir/access"
kill -HUP "$server_pid"
check "A's line back, SIGHUP: read again" \
	wait_until 10 grep -q "SIGHUP: access file $dir/access read again" "$dir/server.log"
check "... A opens its device again" round_trip A a-3 a.img
printf 'host-a sessions=a-* rw=a.img\nhost-b sessions=b-* rw=b.img ro=\n' >"$dir/access.new"
mv "$dir/access.new" "$dir/access"
rc=0
ctl "$dir/ctl" server access reload >"$dir/reload.out" 2>&1 || rc=$?
check "a broken file: the reload fails, naming the file and the line" \
	bash -c "[ $rc -ne 0 ] && grep -qF '$dir/access:2: an empty pattern' '$dir/reload.out'"
check "... nothing new is granted to anyone (B: EACCES)" \
	refused "Permission denied" as B info b-3 --device b.img
cp "$dir/access.full" "$dir/access.new" && mv "$dir/access.new" "$dir/access"
check "fixed and read again: B opens again" \
	bash -c "'$build/tools/rnbd' --socket '$dir/ctl' server access reload >/dev/null" 
check "... its device" round_trip B b-4 b.img
# ---- a host revoked at run time (its key removed) -----------------------------------

# A and B under verified IO; B's line leaves the key file, which is read
# again: B's path closes, its reconnect is refused and never tried again,
# its IO fails once it has no path (fast_io_fail 2 s); A's goes on.
cp "$dir/export/a.img" "$dir/export/a.keep"
as A perf a-rot --device a.img --rw randrw --runtime 8 --verify --iodepth 8 \
	>"$dir/perf-a.out" 2>&1 &
pa=$!
as B perf b-rot --device b.img --rw randrw --runtime 8 --verify --iodepth 8 \
	--fast-io-fail-ms 2000 >"$dir/perf-b.out" 2>&1 &
pb=$!
sleep 2
(umask 077 && grep -v '^host-b ' "$dir/keys" >"$dir/keys.new" && mv "$dir/keys.new" "$dir/keys")
t0=$SECONDS
ctl "$dir/ctl" server keys reload -o json >"$dir/revoke.json" 2>&1
check "host B's key removed, the key file read again (rnbd server keys reload): its path closed" \
	python3 -c "import json; j = json.load(open('$dir/revoke.json')); assert j['paths_closed'] >= 1, j"
rc=0
wait "$pb" || rc=$?
check "... B's IO stops within 5 s, failed (no path), not hung" \
	bash -c "[ $rc -ne 0 ] && [ $((SECONDS - t0)) -le 5 ]"
check "... its reconnect was refused as a verdict, and not tried again" \
	bash -c "grep -Eq 'rejected|No key|do not retry' '$dir/perf-b.out'"
sleep 2
check "... the server saw one attempt after the reload, no more" \
	test "$(grep -c "host host-b is not in $dir/keys" "$dir/server.log")" -eq 1
rc=0
wait "$pa" || rc=$?
check "A's verified IO went on without an error meanwhile" \
	bash -c "[ $rc -eq 0 ] && grep -q 'errors 0' '$dir/perf-a.out'"
check "the server is still up" kill -0 "$server_pid"

finish access
