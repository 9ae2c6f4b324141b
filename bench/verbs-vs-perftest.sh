#!/usr/bin/env bash
# rtrs-perf over the native RDMA fabric (provider verbs: librdmacm and
# libibverbs, lib/rtrs/rtrs-fabric-rdma.c) against perftest's ib_write_bw
# on the same emulated RDMA device, in the same guest run (rtrs-vm): soft-
# RoCE (rxe) and soft-iWARP (siw). Absolute numbers are bound by software
# emulation under TCG; the ratio shows our stack's overhead over raw verbs.
# Goal: rtrs-perf >= 90 % of ib_write_bw at 64 KiB on rxe.
#   bench/verbs-vs-perftest.sh [--record] [rxe|siw ...]
set -euo pipefail
cd "$(dirname "$0")/.."
record=false
[ "${1:-}" = --record ] && { record=true; shift; }
devices=("$@")
[ ${#devices[@]} -gt 0 ] || devices=(rxe siw)
DURATION=${DURATION:-5}
RUNS=${RUNS:-3}
vm=tests/vm/rtrs-vm

. bench/lib.sh
"$vm" image --siw >/dev/null 2>&1

report=""
for dev in "${devices[@]}"; do
	# perftest and rtrs-perf alternate RUNS times in one guest: medians.
	out=$("$vm" run --rdma "$dev" --timeout 900 --share "$PWD/build-release" -- bash -c "
		$perf server --provider verbs --addr 198.18.0.1 --port 0 --queue-depth 64 >/tmp/s.out 2>&1 &
		for i in \$(seq 100); do grep -q port /tmp/s.out && break; sleep 0.1; done
		port=\$(grep -o 'port [0-9]*' /tmp/s.out | cut -d' ' -f2)
		for run in \$(seq $RUNS); do
			ib_write_bw -R -d ${dev}0 -s 65536 -D $DURATION -F --report_gbits -p 18515 >/dev/null 2>&1 &
			sleep 1
			ib_write_bw -R -d ${dev}0 -s 65536 -D $DURATION -F --report_gbits -p 18515 198.18.0.1 |
				awk '/^ *65536 /{print \"PERFTEST\", \$4}'
			wait %2 2>/dev/null
			$perf client --provider verbs --dst 198.18.0.1:\$port --mode write --io-size 64k \
				--queue-depth 64 --cons 1 --duration $DURATION --json | sed 's/^/RTRS /'
		done
		kill %1; wait" 2>&1)
	pt=$(awk '/^PERFTEST/ {print $2}' <<<"$out" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
	rt=$(awk '/^RTRS/ {sub(/^RTRS /, ""); print}' <<<"$out" | python3 -c '
import json, sys
v = sorted(json.loads(l)["gb_per_sec"] * 8 for l in sys.stdin if l.strip())
print(v[(len(v) - 1) // 2])')
	[ -n "$pt" ] && [ -n "$rt" ] || { echo "$out" >&2; echo "bench: no result for $dev" >&2; exit 1; }
	ratio=$(python3 -c "print(f'{$rt / $pt * 100:.0f} %')")
	goal=">= 80 %"
	[ "$dev" = rxe ] && goal=">= 90 %"
	report+="| $dev | $(printf %.2f "$pt") Gbit/s | $(printf %.2f "$rt") Gbit/s | $ratio | $goal |"$'\n'
done

section=$(cat <<MD

### $(date -u +%Y-%m-%d) verbs in a QEMU guest (TCG), 64 KiB writes

Machine: $(nproc) vCPU host, guest Linux $(cut -d' ' -f1 /var/tmp/rtrs-vm/image/version) under TCG (2 vCPU, no KVM), the native RDMA fabric (rdma-core $(dpkg-query -W -f='${Version}' libibverbs-dev 2>/dev/null)).
Command: \`RUNS=$RUNS DURATION=$DURATION bench/verbs-vs-perftest.sh\` (medians of $RUNS alternating runs). Peer: \`ib_write_bw -R -s 65536 -D $DURATION\`
(perftest, one QP, 128 writes in flight) on the same device in the same guest; rtrs-perf: \`client --provider verbs --mode write
--io-size 64k --queue-depth 64 --cons 1\` (every write also waits for the server's response).

| device | ib_write_bw | rtrs-perf write | ratio | goal |
|---|---|---|---|---|
$report
MD
)
echo "$section"
$record && echo "$section" >>bench/RESULTS.md
exit 0
