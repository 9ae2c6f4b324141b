#!/usr/bin/env bash
# rtrs-perf's log level: librtrs reads no environment, so the program takes
# RTRS_LOG_LEVEL and sets the library's level: --log-level wins, then
# RTRS_LOG_LEVEL, then warn; a bad value stops it (exit 2) naming it.
# --event: every entry is checked before the run (exit 2, the entry and
# why), against a live server that would otherwise serve the run; a good
# one runs. An option without its argument says so.
# Usage: rtrs-perf.sh BUILD_DIR.
set -euo pipefail
build=$(cd "${1:?usage: rtrs-perf.sh BUILD_DIR}" && pwd)
perf=$build/tools/rtrs-perf

. "$(dirname "$0")/../lib/common.sh"
dir=$(mktemp -d /var/tmp/rtrs-perf-log.XXXXXX)
trap 'kill_pids; rm -rf "$dir"' EXIT
unset RTRS_LOG_LEVEL

# serves NAME ENV ARGS...: a server with RTRS_LOG_LEVEL=ENV (- unset) and
# ARGS comes up; its stderr and stdout are left in $dir/NAME.log.
serves() {
	local name=$1 level=$2 envs=(-u RTRS_LOG_LEVEL) pid
	shift 2
	[ "$level" = - ] || envs=("RTRS_LOG_LEVEL=$level")
	env "${envs[@]}" "$perf" server --port 0 "$@" >"$dir/$name.log" 2>&1 &
	pid=$!
	pids+=($pid)
	wait_until 10 grep -q 'listening on port' "$dir/$name.log" || { cat "$dir/$name.log"; return 1; }
	kill "$pid"
	wait "$pid" 2>/dev/null || true
}
# refused LEVEL WANT ARGS...: exit 2 at once, saying WANT.
refused() {
	local level=$1 want=$2 rc=0
	shift 2
	RTRS_LOG_LEVEL=$level timeout 10 "$perf" server --port 0 "$@" >"$dir/refused.log" 2>&1 ||
		rc=$?
	[ "$rc" = 2 ] && grep -qF "$want" "$dir/refused.log" || { cat "$dir/refused.log"; return 1; }
}
has() { grep -q "$2" "$dir/$1.log"; }

check "RTRS_LOG_LEVEL unset: serves" serves unset -
check "  at warn: no info line" bash -c "! grep -q ' info: ' '$dir/unset.log'"
check "RTRS_LOG_LEVEL=info: the library's info lines" serves env-info info
check "  (listening, at info)" has env-info 'rtrs info: listening on'
check "RTRS_LOG_LEVEL=debug: debug lines" serves env-debug debug
check "  (debug line)" has env-debug 'rtrs debug: '
check "--log-level error wins over RTRS_LOG_LEVEL=debug" serves cli-error debug --log-level error
check "  (no info or debug line)" bash -c "! grep -Eq ' (info|debug): ' '$dir/cli-error.log'"
check "a bad RTRS_LOG_LEVEL: exit 2, said" \
	refused loud "rtrs-perf: RTRS_LOG_LEVEL=loud: expected error, warn, info or debug"
check "a bad --log-level: exit 2, said" \
	refused info "rtrs-perf: --log-level 5: expected error, warn, info or debug" --log-level 5

# ---- --event: checked before the run ---------------------------------------------

"$perf" server --port 0 >"$dir/ev-srv.log" 2>&1 &
pids+=($!)
wait_until 10 grep -q 'listening on port' "$dir/ev-srv.log" || cat "$dir/ev-srv.log"
evport=$(grep -o 'listening on port [0-9]*' "$dir/ev-srv.log" | grep -o '[0-9]*$' || true)
# event_refused SPEC WANT: the client exits 2 within 3 s, saying WANT; it never ran.
event_refused() {
	local rc=0 t0=$SECONDS
	timeout 20 "$perf" client --server "127.0.0.1:${evport:-1}" --duration 2 --event "$1" \
		>"$dir/ev.log" 2>&1 || rc=$?
	[ "$rc" = 2 ] && [ $((SECONDS - t0)) -le 3 ] && grep -qF -- "$2" "$dir/ev.log" &&
		! grep -q 'op/s' "$dir/ev.log" || { echo "  exit $rc: $(cat "$dir/ev.log")"; return 1; }
}
check "--event 1:explode:0: exit 2 before the run, the action named" \
	event_refused 1:explode:0 '--event 1:explode:0: unknown action "explode" (remove, cut or add)'
check "--event with no ARG" event_refused 1:cut '--event 1:cut: expected SEC:ACTION:ARG'
check "--event with a SEC that is no number" event_refused x:cut:0 '--event x:cut:0: SEC must be'
check "--event after the run's end" event_refused 2:cut:0 'less than the run'"'"'s --duration 2'
check "--event cut of no path index" event_refused 1:cut:one '--event 1:cut:one: cut takes a path index'
check "--event add of a bad address" event_refused '1:add:[::1' "--event 1:add:[::1: no ']' after '['"
event_runs() {
	timeout 20 "$perf" client --server "127.0.0.1:${evport:-1}" --duration 2 --event 1:cut:0 \
		>"$dir/ev-ok.log" 2>&1 && grep -q 'at 1\.[0-9] s: cut 0: done' "$dir/ev-ok.log" ||
		{ cat "$dir/ev-ok.log"; return 1; }
}
check "a good --event runs: the path is cut at 1 s" event_runs
# --sessions: 8 sessions of 3 connections opened at once from one process,
# verified writes and then reads with the queue depth spread over them.
sessions_run() {
	local m
	for m in write read; do
		timeout 60 "$perf" client --server "127.0.0.1:${evport:-1}" --duration 2 --sessions 8 \
			--io-connections 2 --queue-depth 16 --verify --mode "$m" --json \
			>"$dir/sess-$m.json" 2>"$dir/sess-$m.err" || { cat "$dir/sess-$m.err"; return 1; }
		python3 - "$dir/sess-$m.json" <<'PY' || return 1
import json, sys
j = json.load(open(sys.argv[1]))
assert j["sessions"] == 8 and j["errors"] == 0 and j["bad"] == 0 and j["ops"] > 100, j
PY
	done
}
check "--sessions 8: every session opens, verified writes and reads, 0 errors" sessions_run
check "--sessions with --event: refused (an event acts on one session)" \
	bash -c "'$perf' client --server 127.0.0.1:1 --sessions 2 --duration 2 --event 1:cut:0 \
		>'$dir/se.log' 2>&1; [ \$? = 2 ] && grep -q 'acts on one session' '$dir/se.log'"
check "-p without its argument: exit 2, said so" \
	refused warn "rtrs-perf: option -p needs an argument" -p

finish rtrs-perf
