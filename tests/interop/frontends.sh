#!/usr/bin/env bash
# The client front ends take the session options from one table
# (lib/front/clt-opts.c) and their paths through one parser
# (rtrs_addr_parse in librtrs): rtrs-perf client, rnbd-client and the
# nbdkit plugin offer the same options and refuse the same bad value with
# the same reason, each after its own spelling of the option:
#   rtrs-perf    "rtrs-perf: --NAME VALUE: why"      exit 2
#   rnbd-client  "rnbd-client: --NAME VALUE: why"    exit 2
#   nbdkit       "KEY=VALUE: why"                    exit 1
# (a secret is never repeated: "--secret: why", "secret=: why"); the good
# values of every option get past the parsing, to a refused connection
# (nothing listens on 127.0.0.1 port 1); a 17th path (9th for the plugin)
# is refused; every front end's --help lists every session option.
# A sanitizer build skips the plugin's part (nbdkit-sanitizer.sh says why).
# Usage: frontends.sh BUILD_DIR.
set -euo pipefail
build=$(cd "${1:?usage: frontends.sh BUILD_DIR}" && pwd)
perf=$build/tools/rtrs-perf
client=$build/tools/rnbd-client
plugin=$build/nbdkit/nbdkit-rnbd-plugin.so

. "$(dirname "$0")/../lib/common.sh"
dir=$(mktemp -d /var/tmp/rtrs-frontends.XXXXXX)
trap 'rm -rf "$dir"' EXIT

nbdkit_too=1
if ! command -v nbdkit >/dev/null; then
	echo "note: nbdkit is not installed: the plugin's part is skipped"
	nbdkit_too=0
elif ldd "$plugin" 2>/dev/null | grep -Eq 'lib(a|ub|t)san'; then
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

# The session options: rtrs-perf's name, rnbd-client's, the nbdkit key, a
# bad value and the reason. rtrs-perf's --port is its server's (0..65535).
bad=(
	"dst|server|server|127.0.0.1:0|port '0' is not a number in 1..65535"
	"dst|server|server|@127.0.0.1|no source address before '@'"
	"dst|server|server|[::1|no ']' after '['"
	"dst|server|server|10.0.0.1:5@h|the source address takes no port"
	"dst|server|server|a@b@c|more than one '@'"
	"dst|server|server|a b|expected [SRC@]HOST[:PORT], printable and without blanks"
	"-|port|port|0|expected a number in 1..65535"
	"sessname|session|session|a/b|expected 1..255 printable characters without blanks or '/', not '.' or '..'"
	"provider|provider|provider|a b|expected printable characters without blanks"
	"cons|io-connections|io_connections|2000|expected a number in 0..1024"
	"policy|policy|policy|fastest|expected round-robin, min-inflight or min-latency"
	"hb-interval|hb-interval|hb_interval_ms|5|expected a number in 10..600000"
	"fast-io-fail|fast-io-fail|fast_io_fail_ms|soon|expected a number in 0..3600000"
	"reconnect-delay|reconnect-delay|reconnect_delay_ms|3600001|expected a number in 0..3600000"
	"host-name|host-name|host_name|a b|expected 1..223 printable characters without blanks"
	"server-name|server-name|server_name|a b|expected 1..223 printable characters without blanks"
	"log-level|log-level|log_level|loud|expected error, warn, info or debug"
)
for b in "${bad[@]}"; do
	IFS='|' read -r pname cname key value why <<<"$b"
	if [ "$pname" != - ]; then
		check "rtrs-perf --$pname $value: $why" \
			refused 2 "rtrs-perf: --$pname $value: $why" "$perf" client --"$pname" "$value"
	fi
	check "rnbd-client --$cname $value: $why" \
		refused 2 "rnbd-client: --$cname $value: $why" "$client" info --"$cname" "$value"
	if [ "$nbdkit_too" = 1 ]; then
		check "nbdkit $key=$value: $why" \
			refused 1 "$key=$value: $why" nbdkit -f -U "$dir/n.sock" "$plugin" "$key=$value"
	fi
done

# Secrets: the same reason, without the value.
for s in "secret|secret" "ctrl-secret|ctrl_secret"; do
	IFS='|' read -r name key <<<"$s"
	why="expected DHHC-1:..., @FILE or file:FILE"
	check "rtrs-perf --$name: $why" refused 2 "rtrs-perf: --$name: $why" \
		"$perf" client --"$name" hunter2
	check "... not repeated" no_secret "$perf" client --"$name" hunter2
	check "rnbd-client --$name: $why" refused 2 "rnbd-client: --$name: $why" \
		"$client" info --"$name" hunter2
	check "... not repeated" no_secret "$client" info --"$name" hunter2
	if [ "$nbdkit_too" = 1 ]; then
		check "nbdkit $key=: $why" refused 1 "$key=: $why" \
			nbdkit -f -U "$dir/n.sock" "$plugin" "$key=hunter2"
		check "... not repeated" no_secret nbdkit -f -U "$dir/n.sock" "$plugin" "$key=hunter2"
	fi
done

# Every option's good value gets past the parsing: the session is refused.
check "rtrs-perf client: every session option accepted" \
	refused 1 "rtrs-perf: cannot open session to 127.0.0.1: Connection refused" \
	"$perf" client --port 1 --dst 127.0.0.1 --policy round-robin --hb-interval 50 --cons 1 \
	--sessname good --provider tcp --fast-io-fail 0 --reconnect-delay 10 --host-name h \
	--server-name s --log-level error
check "rnbd-client: every session option accepted" \
	refused 1 "rnbd-client: session good to 127.0.0.1: Connection refused" \
	"$client" info --server 127.0.0.1 --port 1 --session good --provider tcp \
	--io-connections 1 --policy min-latency --hb-interval 50 --fast-io-fail 0 \
	--reconnect-delay 10 --host-name h --server-name s --log-level error --device d
if [ "$nbdkit_too" = 1 ]; then
	check "nbdkit: every session option accepted" \
		refused 1 "session good to 127.0.0.1: Connection refused" \
		nbdkit -f -U "$dir/n.sock" "$plugin" server=127.0.0.1 port=1 session=good \
		provider=tcp io_connections=1 policy=round-robin hb_interval_ms=50 \
		fast_io_fail_ms=0 reconnect_delay_ms=10 host_name=h server_name=s log_level=error
fi
# The address forms get past the parsing too: IPv6 in brackets and bare, a
# source, a port of the path's own or the session's.
check "rtrs-perf: IPv6, a source, a default port" \
	refused 1 "rtrs-perf: cannot open session to [::1]:1: " \
	"$perf" client --port 1 --dst '[::1]:1' --dst 127.0.0.1@127.0.0.1 --dst ::1 --fast-io-fail 0

# The limit on paths: 16 for the tools (the plugin's 8 is in nbdkit-plugin.sh).
many=()
for i in $(seq 1 17); do many+=(--server "127.0.0.1:$i"); done
check "rnbd-client: a 17th path refused" \
	refused 2 "rnbd-client: --server 127.0.0.1:17: at most 16 paths" "$client" info "${many[@]}"
check "rtrs-perf: a 17th path refused" \
	refused 2 "rtrs-perf: --dst 127.0.0.1:17: at most 16 paths" \
	"$perf" client "${many[@]/--server/--dst}"

# Every front end's --help lists every session option.
"$perf" --help >"$dir/perf.help"
"$client" --help >"$dir/client.help"
for o in dst policy fast-io-fail reconnect-delay provider cons hb-interval sessname secret \
	ctrl-secret host-name server-name log-level port; do
	check "rtrs-perf --help: --$o" grep -q -- "--$o " "$dir/perf.help"
done
for o in server port session provider io-connections policy hb-interval fast-io-fail \
	reconnect-delay secret ctrl-secret host-name server-name log-level; do
	check "rnbd-client --help: --$o" grep -q -- "--$o " "$dir/client.help"
done
if [ "$nbdkit_too" = 1 ]; then
	nbdkit "$plugin" --help >"$dir/nbdkit.help" 2>&1 || true
	for k in server port session provider io_connections policy hb_interval_ms \
		fast_io_fail_ms reconnect_delay_ms secret ctrl_secret host_name server_name \
		log_level device mode; do
		check "nbdkit --help: $k=" grep -q "^$k=" "$dir/nbdkit.help"
	done
fi

finish frontends
