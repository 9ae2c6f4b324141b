#!/usr/bin/env bash
# Key rotation without a reconnect (docs/security.md section 3.8):
# rnbd-server with --auth-keys, three hosts each running rnbd-client perf
# --verify on one path, their secrets in files. Then:
#   - hosts A and B get new secrets on both sides (their files, then the
#     server's key file), host C only on the server (its client keeps the
#     old one), and the server reads its file again (rnbd server keys
#     reload): A's and B's paths authenticate again in place, their IO runs
#     to its end without an error and every byte verified, and their paths
#     never went down; C's re-authentication is refused: its path closes at
#     once (well within a heartbeat budget), its IO fails, and it never
#     connects again;
#   - a reload that changes nothing asks nobody to authenticate;
#   - the same once more with TLS (the PSKs derived from the secrets, so
#     rotating a secret rotates the TLS key of the next handshake too).
# Usage: rotate.sh BUILD_DIR.
set -euo pipefail
build=$(cd "${1:?usage: rotate.sh BUILD_DIR}" && pwd)
client=$build/tools/rnbd-client
for t in python3 nvme; do
	command -v "$t" >/dev/null || { echo "SKIP: $t is not installed"; exit 77; }
done

. "$(dirname "$0")/../lib/common.sh"
dir=$(mktemp -d /var/tmp/rnbd-rotate.XXXXXX)
trap 'kill_pids; [ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT
umask 077
mkdir -p "$dir/export"
printf '* sessions=* rw=*\n' >"$dir/access"
for h in a b c; do head -c $((16 << 20)) /dev/zero >"$dir/export/$h.img"; done

keyfile() { # the server's file from each host's server-side secret
	printf 'host-a %s\nhost-b %s\nhost-c %s\n' "$(cat "$dir/a.srv")" "$(cat "$dir/b.srv")" \
		"$(cat "$dir/c.srv")" >"$dir/keys.new"
	mv "$dir/keys.new" "$dir/keys"
}
newkey() { nvme gen-dhchap-key -m 0 -n "host-$1"; }

# round NAME TLSARGS...: one rotation under IO.
round() {
	local name=$1 log
	shift
	local tls=("$@")
	for h in a b c; do
		newkey $h >"$dir/$h.key"
		cp "$dir/$h.key" "$dir/$h.srv"
	done
	keyfile
	log=$dir/$name.log
	rnbd_server_start "$log" -- --port 0 --dev-search-path "$dir/export" \
		--auth-keys "$dir/keys" --access "$dir/access" --control "$dir/$name.ctl" \
		--log-level info "${tls[@]}" || return 1
	local srv=${pids[-1]}
	declare -A perf
	for h in a b c; do
		"$client" perf --server "127.0.0.1:$port" --session "$name-$h" --host-name "host-$h" \
			--secret "@$dir/$h.key" --device "$h.img" --verify -t 12 -q 8 --json \
			--reconnect-delay-ms 200 --log-level info "${tls[@]}" \
			>"$dir/$name-$h.json" 2>"$dir/$name-$h.err" &
		perf[$h]=$!
	done
	wait_until 10 bash -c "[ \$(grep -c 'authenticated (' '$log') -ge 3 ]" ||
		{ echo "  the hosts did not all authenticate"; return 1; }
	sleep 2
	check "$name: a reload that changes nothing asks nobody" \
		bash -c "'$build/tools/rnbd' --socket '$dir/$name.ctl' server keys reload >/dev/null &&
			sleep 0.5 && ! grep -q 'asked to authenticate again' '$log'"
	# A and B: new secrets on both sides (the client's file first); C: the server's only.
	for h in a b; do
		newkey $h >"$dir/$h.new"
		mv "$dir/$h.new" "$dir/$h.key"
		cp "$dir/$h.key" "$dir/$h.srv"
	done
	newkey c >"$dir/c.srv"
	keyfile
	local t0
	t0=$(date +%s%N)
	check "$name: keys reload" "$build/tools/rnbd" --socket "$dir/$name.ctl" server keys reload
	local rc_c=0
	wait "${perf[c]}" || rc_c=$?
	local ms=$((($(date +%s%N) - t0) / 1000000))
	for h in a b; do
		local rc=0
		wait "${perf[$h]}" || rc=$?
		check "$name: host $h: IO ran to its end, no error, every byte verified" \
			bash -c "[ $rc -eq 0 ] && python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
sys.exit(0 if j[\"errors\"] == 0 and j[\"bad\"] == 0 and j[\"reads\"] + j[\"writes\"] > 1000 else 1)' '$dir/$name-$h.json'"
		check "$name: host $h authenticated again, on the live path" \
			grep -q "host host-$h re-authenticated" "$log"
		check "$name: ... and its path never went down" \
			bash -c "! grep -q 'went down\|path closed\|reconnect' '$dir/$name-$h.err'"
	done
	check "$name: host c's re-authentication refused: its IO failed ($rc_c) within 3 s ($ms ms)" \
		test "$rc_c" -ne 0 -a "$ms" -le 3000
	check "$name: ... the server says why" grep -q "host host-c failed to re-authenticate" "$log"
	check "$name: ... the client that the key was rejected" \
		grep -q "re-authentication failed: Key was rejected by service" "$dir/$name-c.err"
	sleep 1.5
	check "$name: ... and it never connected again" \
		bash -c "[ \$(grep -c 'host host-c authenticated' '$log') -eq 1 ]"
	kill "$srv"
	wait "$srv" 2>/dev/null || true
}

round plain
round tls --tls required
finish rotate
