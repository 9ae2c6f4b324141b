#!/usr/bin/env bash
# In a verbs-suite guest: many sessions over the guest's RDMA device, and the
# threads they cost. rtrs-perf holds SESSIONS sessions of IO_CONS IO
# connections each against an rtrs-perf server, with every byte verified;
# the threads of the server, all along, and of the client once its sessions
# are open (it opens them from up to 256 threads at once), must stay within
# the guest's CPUs + 4 (the poll groups: no thread per connection). On
# iWARP the client's connects ran on connect threads (rtrs-rdma-conn, as
# many as connected at once): those are not counted, but must have ended
# (idle 5 s) by the client's last sample, 9 s after its sessions opened.
# The server's IO connections share a receive queue per poll group of
# SRQ receives (32), fewer than the client keeps in flight (64): on rxe,
# senders find it empty and retry (RNR NAKs, counted by the device, must
# be seen) and no IO fails; the server's log must name the queue. siw
# (iWARP, no RNR) keeps a receive queue per connection.
# Usage: verbs-scale.sh RTRS_PERF ADDR [SESSIONS [IO_CONS]]
# Exits 0 when every session opened, moved verified data with 0 errors and
# both processes kept to the bound; prints what it saw.
set -uo pipefail
perf=${1:?usage: verbs-scale.sh RTRS_PERF ADDR [SESSIONS [IO_CONS]]}
addr=${2:?address}
sessions=${3:-50}
io_cons=${4:-3}
port=4801
srq=${SRQ:-32}
cpus=$(nproc)
bound=$((cpus + 4))
out=$(mktemp /tmp/verbs-scale.XXXXXX)
err=$(mktemp /tmp/verbs-scale.XXXXXX)
slog=$(mktemp /tmp/verbs-scale.XXXXXX)
trap 'kill "$spid" 2>/dev/null; wait 2>/dev/null; rm -f "$out" "$err" "$slog"' EXIT

threads() { ls "/proc/$1/task" 2>/dev/null | wc -l; }
connect_threads() { cat /proc/"$1"/task/*/comm 2>/dev/null | grep -c '^rtrs-rdma-conn'; }
# RNR NAKs the guest's rxe device sent (its receive queue empty), 0 on siw.
rnr_sent() { cat /sys/class/infiniband/rxe*/ports/1/hw_counters/send_rnr_err 2>/dev/null || echo 0; }
rxe=false
ls /sys/class/infiniband/ 2>/dev/null | grep -q '^rxe' && rxe=true
rnr0=$(rnr_sent)

RTRS_LOG_LEVEL=debug "$perf" server --provider verbs --addr "$addr" --port $port --queue-depth 16 \
	--chunk-size 16k --srq-depth "$srq" --max-sessions $((sessions + 16)) \
	--max-sessions-per-peer $((sessions + 16)) --quiet 2>"$slog" &
spid=$!
sleep 2 # listening (an RDMA listener shows in no socket table)
"$perf" client --provider verbs -d "$addr:$port" --sessions "$sessions" --io-connections "$io_cons" \
	--queue-depth 64 --duration 4 --hold 5 --verify --json >"$out" 2>"$err" &
cpid=$!
smax=0 cmax=0 csamples=0 cconn=0
while kill -0 $cpid 2>/dev/null; do
	s=$(threads $spid)
	[ "$s" -gt "$smax" ] && smax=$s
	if grep -q "sessions opened" "$err"; then
		cconn=$(connect_threads $cpid)
		c=$(($(threads $cpid) - cconn))
		[ "$c" -gt "$cmax" ] && cmax=$c
		csamples=$((csamples + 1))
	fi
	sleep 0.2
done
wait $cpid
crc=$?
grep -v "refused\|rejected" "$err" | tail -n 5
cat "$out"
rnr=$(($(rnr_sent) - rnr0))
echo "verbs-scale: $sessions sessions x $((io_cons + 1)) connections: server threads at most $smax, client $cmax and $cconn connect threads at the end (bound: $cpus CPUs + 4 = $bound); client exit $crc; shared receive queue of $srq: $rnr RNR NAKs sent"
rc=0
if $rxe; then
	grep -q "a shared receive queue of $srq receives" "$slog" ||
		{ echo "verbs-scale: the server made no shared receive queue of $srq"; rc=1; }
	[ "$rnr" -gt 0 ] || { echo "verbs-scale: no sender found the shared receive queue empty"; rc=1; }
elif grep -q "shared receive queue" "$slog"; then
	echo "verbs-scale: a shared receive queue on iWARP"
	rc=1
fi
[ $crc -eq 0 ] || { echo "verbs-scale: the client failed"; rc=1; }
grep -q '"errors":0,"bad":0' "$out" || { echo "verbs-scale: errors or bad bytes"; rc=1; }
grep -q "\"sessions\":$sessions," "$out" || { echo "verbs-scale: not every session opened"; rc=1; }
[ "$smax" -le $bound ] || { echo "verbs-scale: the server ran $smax threads"; rc=1; }
[ "$cmax" -le $bound ] || { echo "verbs-scale: the client ran $cmax threads"; rc=1; }
[ "$cconn" -eq 0 ] || { echo "verbs-scale: the client's connect threads did not end: $cconn"; rc=1; }
[ "$csamples" -ge 3 ] || { echo "verbs-scale: the client's threads were sampled $csamples times"; rc=1; }
kill -0 $spid 2>/dev/null || { echo "verbs-scale: the server died"; rc=1; }
exit $rc
