#!/usr/bin/env bash
# The client front ends take the session options from one table
# (lib/front/clt-opts.c) and their paths through one parser
# (rtrs_addr_parse in librtrs): rtrs-perf client, rnbd-client, the rnbd
# command's client map (rnbd-clientd's options) and the nbdkit plugin
# offer the same options under one name each (the command line's --NAME,
# the plugin's NAME with '_' for '-': a time ends in its unit), with one
# default each, and refuse the same bad value with the same reason, each
# after its own spelling of the option:
#   rtrs-perf    "rtrs-perf: --NAME VALUE: why"      exit 2
#   rnbd-client  "rnbd-client: --NAME VALUE: why"    exit 2
#   rnbd         "rnbd: --NAME VALUE: why"           exit 2
#   nbdkit       "KEY=VALUE: why"                    exit 1
# (a secret is never repeated: "--secret: why", "secret=: why"); the good
# values of every option get past the parsing, to a refused connection
# (nothing listens on 127.0.0.1 port 1; the rnbd command: no daemon on its
# socket, exit 3); a 17th path (9th for the plugin) is refused; every front
# end's --help lists every session option it takes, with the same defaults
# (fast_io_fail_ms 30000, reconnect_delay_ms 1000, the jitter half of it);
# the names they had before are refused with the new one.
# A sanitizer build skips the plugin's part (nbdkit-sanitizer.sh says why).
# Usage: frontends.sh BUILD_DIR.
set -euo pipefail
build=$(cd "${1:?usage: frontends.sh BUILD_DIR}" && pwd)
perf=$build/tools/rtrs-perf
client=$build/tools/rnbd-client
rnbd=$build/tools/rnbd
plugin=$build/nbdkit/nbdkit-rnbd-plugin.so

. "$(dirname "$0")/../lib/common.sh"
dir=$(mktemp -d /var/tmp/rtrs-frontends.XXXXXX)
trap 'rm -rf "$dir"' EXIT

nbdkit_too=1
if ! command -v nbdkit >/dev/null; then
	echo "note: nbdkit is not installed: the plugin's part is skipped"
	nbdkit_too=0
elif ldd "$plugin" 2>/dev/null | grep -E 'lib(a|ub|t)san' >/dev/null; then
	echo "note: the plugin is built with a sanitizer, which nbdkit cannot load: its part is skipped"
	nbdkit_too=0
fi

# refused WANT_RC WANT_TEXT CMD...: CMD exits WANT_RC with WANT_TEXT on stderr.
refused() {
	local want_rc=$1 want=$2 rc=0
	shift 2
	timeout 60 "$@" >"$dir/out" 2>"$dir/err" || rc=$?
	if [ "$rc" -ne "$want_rc" ] || ! grep -qF -- "$want" "$dir/err"; then
		echo "  exit $rc (want $want_rc); stderr: $(cat "$dir/err")"
		return 1
	fi
}

# no_secret CMD...: CMD's stderr does not hold the secret it was given.
no_secret() {
	timeout 60 "$@" >"$dir/out" 2>"$dir/err" || true
	! grep -q hunter2 "$dir/err"
}

# The session options: the name (the command line's; the plugin's key is
# it with '_' for '-'), the front ends that take it (p rtrs-perf, c
# rnbd-client, r the rnbd command, n the plugin), a bad value and the
# reason. rtrs-perf's --port is its own (its server's, 0..65535).
bad=(
	"server|pcrn|127.0.0.1:0|port '0' is not a number in 1..65535"
	"server|pcrn|@127.0.0.1|no source address before '@'"
	"server|pcrn|[::1|no ']' after '['"
	"server|pcrn|10.0.0.1:5@h|the source address takes no port"
	"server|pcrn|a@b@c|more than one '@'"
	"server|pcrn|a b|expected [SRC@]HOST[:PORT], printable and without blanks"
	"port|crn|0|expected a number in 1..65535"
	"session|pcrn|a/b|expected 1..255 printable characters without blanks or '/', not '.' or '..'"
	"provider|pcrn|a b|expected tcp, verbs or rdma"
	"provider|pcrn|sockets|expected tcp, verbs or rdma"
	"io-connections|pcrn|2000|expected a number in 0..1024"
	"policy|pcrn|fastest|expected round-robin, min-inflight or min-latency"
	"hb-interval-ms|pcrn|5|expected a number in 10..600000"
	"fast-io-fail-ms|pcrn|soon|expected a number in 0..3600000"
	"reconnect-delay-ms|pcrn|3600001|expected a number in 0..3600000"
	"reconnect-jitter-ms|pcrn|-1|expected a number in 0..3600000"
	"reconnect-loss-timeout-ms|pcrn|86400001|expected a number in 0..86400000"
	"max-reconnect-attempts|pcrn|-2|expected -1 (no limit) or a number in 0..1000000"
	"busy-poll-us|pcrn|1000001|expected a number in 0..1000000"
	"host-name|pcrn|a b|expected 1..223 printable characters without blanks"
	"server-name|pcrn|a b|expected 1..223 printable characters without blanks"
	"log-level|pcn|loud|expected error, warn, info or debug"
)
map=("$rnbd" --socket "$dir/no.sock" client map d --session good --no-block-device)
for b in "${bad[@]}"; do
	IFS='|' read -r name fronts value why <<<"$b"
	key=${name//-/_}
	if [[ $fronts == *p* ]]; then
		check "rtrs-perf --$name $value: $why" \
			refused 2 "rtrs-perf: --$name $value: $why" "$perf" client --"$name" "$value"
	fi
	check "rnbd-client --$name $value: $why" \
		refused 2 "rnbd-client: --$name $value: $why" "$client" info --"$name" "$value"
	if [[ $fronts == *r* ]]; then
		check "rnbd client map --$name $value: $why" \
			refused 2 "rnbd: --$name $value: $why" "${map[@]}" --"$name" "$value"
	fi
	if [ "$nbdkit_too" = 1 ]; then
		check "nbdkit $key=$value: $why" \
			refused 1 "$key=$value: $why" nbdkit -f -U "$dir/n.sock" "$plugin" "$key=$value"
	fi
done

# Secrets: the same reason, without the value.
for name in secret ctrl-secret; do
	key=${name//-/_}
	why="expected DHHC-1:..., @FILE or file:FILE"
	check "rtrs-perf --$name: $why" refused 2 "rtrs-perf: --$name: $why" \
		"$perf" client --"$name" hunter2
	check "... not repeated" no_secret "$perf" client --"$name" hunter2
	check "rnbd-client --$name: $why" refused 2 "rnbd-client: --$name: $why" \
		"$client" info --"$name" hunter2
	check "... not repeated" no_secret "$client" info --"$name" hunter2
	check "rnbd client map --$name: $why" refused 2 "rnbd: --$name: $why" \
		"${map[@]}" --"$name" hunter2
	check "... not repeated" no_secret "${map[@]}" --"$name" hunter2
	if [ "$nbdkit_too" = 1 ]; then
		check "nbdkit $key=: $why" refused 1 "$key=: $why" \
			nbdkit -f -U "$dir/n.sock" "$plugin" "$key=hunter2"
		check "... not repeated" no_secret nbdkit -f -U "$dir/n.sock" "$plugin" "$key=hunter2"
	fi
done

# Every option's good value gets past the parsing: the session is refused.
check "rtrs-perf client: every session option accepted" \
	refused 1 "rtrs-perf: cannot open session to 127.0.0.1: Connection refused" \
	"$perf" client --port 1 --server 127.0.0.1 --policy round-robin --hb-interval-ms 50 \
	--io-connections 1 --session good --provider tcp --fast-io-fail-ms 0 \
	--reconnect-delay-ms 10 --reconnect-jitter-ms 5 --reconnect-loss-timeout-ms 0 \
	--max-reconnect-attempts -1 --busy-poll-us 0 --host-name h --server-name s --log-level error
check "rnbd-client: every session option accepted" \
	refused 1 "rnbd-client: session good to 127.0.0.1: Connection refused" \
	"$client" info --server 127.0.0.1 --port 1 --session good --provider tcp \
	--io-connections 1 --policy min-latency --hb-interval-ms 50 --fast-io-fail-ms 0 \
	--reconnect-delay-ms 10 --reconnect-jitter-ms 5 --reconnect-loss-timeout-ms 0 \
	--max-reconnect-attempts -1 --busy-poll-us 0 --host-name h --server-name s \
	--log-level error --device d
check "rnbd client map: every session option accepted (to the socket: no daemon, exit 3)" \
	refused 3 "rnbd: $dir/no.sock: No such file or directory" \
	"${map[@]}" --server 127.0.0.1 --port 1 --provider tcp \
	--io-connections 1 --policy min-latency --hb-interval-ms 50 --fast-io-fail-ms 0 \
	--reconnect-delay-ms 10 --reconnect-jitter-ms 5 --reconnect-loss-timeout-ms 0 \
	--max-reconnect-attempts -1 --busy-poll-us 0 --host-name h --server-name s
if [ "$nbdkit_too" = 1 ]; then
	check "nbdkit: every session option accepted" \
		refused 1 "session good to 127.0.0.1: Connection refused" \
		nbdkit -f -U "$dir/n.sock" "$plugin" server=127.0.0.1 port=1 session=good \
		provider=tcp io_connections=1 policy=round-robin hb_interval_ms=50 \
		fast_io_fail_ms=0 reconnect_delay_ms=10 reconnect_jitter_ms=5 \
		reconnect_loss_timeout_ms=0 max_reconnect_attempts=-1 busy_poll_us=0 host_name=h \
		server_name=s log_level=error
fi
# The address forms get past the parsing too: IPv6 in brackets and bare, a
# source, a port of the path's own or the session's.
check "rtrs-perf: IPv6, a source, a default port" \
	refused 1 "rtrs-perf: cannot open session to [::1]:1: " \
	"$perf" client --port 1 --server '[::1]:1' --server 127.0.0.1@127.0.0.1 --server ::1 \
	--fast-io-fail-ms 0

# The limit on paths: 16 for the tools (the plugin's 8 is in nbdkit-plugin.sh).
many=()
for i in $(seq 1 17); do many+=(--server "127.0.0.1:$i"); done
check "rnbd-client: a 17th path refused" \
	refused 2 "rnbd-client: --server 127.0.0.1:17: at most 16 paths" "$client" info "${many[@]}"
check "rtrs-perf: a 17th path refused" \
	refused 2 "rtrs-perf: --server 127.0.0.1:17: at most 16 paths" "$perf" client "${many[@]}"
check "rnbd client map: a 17th path refused" \
	refused 2 "rnbd: --server 127.0.0.1:17: at most 16 paths" "${map[@]}" "${many[@]}"

# Every front end's --help lists every session option it takes, with the same default.
"$perf" --help >"$dir/perf.help"
"$client" --help >"$dir/client.help"
"$rnbd" --help >"$dir/rnbd.help"
[ "$nbdkit_too" = 1 ] && { nbdkit "$plugin" --help >"$dir/nbdkit.help" 2>&1 || true; }
all="server port session provider io-connections policy hb-interval-ms fast-io-fail-ms
	reconnect-delay-ms reconnect-jitter-ms reconnect-loss-timeout-ms max-reconnect-attempts
	busy-poll-us secret ctrl-secret host-name server-name log-level"
for o in $all; do
	[ "$o" = port ] || check "rtrs-perf --help: --$o" grep -q -- "--$o " "$dir/perf.help"
	check "rnbd-client --help: --$o" grep -q -- "--$o " "$dir/client.help"
	[ "$o" = log-level ] || check "rnbd --help: --$o" grep -q -- "--$o " "$dir/rnbd.help"
	[ "$nbdkit_too" = 1 ] && check "nbdkit --help: ${o//-/_}=" grep -q "^${o//-/_}=" "$dir/nbdkit.help"
done
[ "$nbdkit_too" = 1 ] && for k in device mode; do
	check "nbdkit --help: $k=" grep -q "^$k=" "$dir/nbdkit.help"
done
# One default each: fast_io_fail_ms 30000, reconnect_delay_ms 1000 (the jitter half of it).
default_is() { # FILE OPTION-LINE-PATTERN VALUE
	grep -E -- "$2" "$1" | grep -qF "(default $3)"
}
for f in perf client rnbd; do
	check "$f --help: --fast-io-fail-ms default 30000" \
		default_is "$dir/$f.help" "--fast-io-fail-ms " 30000
	check "$f --help: --reconnect-delay-ms default 1000" \
		default_is "$dir/$f.help" "--reconnect-delay-ms " 1000
	check "$f --help: --reconnect-jitter-ms default 500" \
		default_is "$dir/$f.help" "--reconnect-jitter-ms " 500
done
if [ "$nbdkit_too" = 1 ]; then
	check "nbdkit --help: fast_io_fail_ms default 30000" \
		default_is "$dir/nbdkit.help" "^fast_io_fail_ms=" 30000
	check "nbdkit --help: reconnect_delay_ms default 1000" \
		default_is "$dir/nbdkit.help" "^reconnect_delay_ms=" 1000
	check "nbdkit --help: reconnect_jitter_ms default half the delay" \
		default_is "$dir/nbdkit.help" "^reconnect_jitter_ms=" "half the reconnect delay"
fi

# The names of before are refused with the one to use.
check "rtrs-perf --dst: refused with its new name" \
	refused 2 "rtrs-perf: --dst is now --server" "$perf" client --dst 127.0.0.1
check "rtrs-perf --cons: refused with its new name" \
	refused 2 "rtrs-perf: --cons is now --io-connections" "$perf" client --cons 1
check "rnbd client map --fast-io-fail-tmo (seconds): refused with its new name and unit" \
	refused 2 "rnbd: --fast-io-fail-tmo is now --fast-io-fail-ms (milliseconds; it took seconds)" \
	"${map[@]}" --fast-io-fail-tmo 5
check "rnbd client map --reconnect-delay (seconds): refused, not taken as milliseconds" \
	refused 2 "rnbd: --reconnect-delay is now --reconnect-delay-ms" \
	"${map[@]}" --reconnect-delay 1

finish frontends
