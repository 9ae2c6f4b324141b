#!/usr/bin/env bash
# rtrs-perf over the native RDMA fabric (provider verbs: librdmacm and
# libibverbs, lib/rtrs/rtrs-fabric-rdma.c) against perftest's ib_write_bw
# on the same emulated RDMA device, in the same guest run (rtrs-vm): soft-
# RoCE (rxe) and soft-iWARP (siw). Absolute numbers are bound by software
# emulation under TCG; the ratio shows our stack's overhead over raw verbs.
# Three contenders alternate RUNS times in one guest: ib_write_bw (which
# busy-polls), rtrs-perf with its defaults (threads sleep on an empty
# completion queue), and rtrs-perf with --busy-poll $POLL_US on both ends.
# Each run also gives the CPU time of both ends per IO (utime + stime).
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
POLL_US=${POLL_US:-1000}
vm=tests/vm/rtrs-vm

. bench/lib.sh
"$vm" image --siw >/dev/null 2>&1
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null ||
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-matplotlib >/dev/null

date=$(date -u +%Y-%m-%d)
report=""
data=""
for dev in "${devices[@]}"; do
	# Lines: "NAME GBITS IOS CPU_SECONDS" per contender and run.
	out=$("$vm" run --rdma "$dev" --timeout 1200 --share "$PWD/build-release" -- bash -c "
		cpu() { awk '{ print (\$14 + \$15) / 100 }' /proc/\$1/stat; }
		$perf server --provider verbs --addr 198.18.0.1 --port 0 --queue-depth 64 >/tmp/s0.out 2>&1 &
		s0=\$!
		$perf server --provider verbs --addr 198.18.0.1 --port 0 --queue-depth 64 --busy-poll $POLL_US >/tmp/s1.out 2>&1 &
		s1=\$!
		for i in \$(seq 100); do grep -q port /tmp/s0.out && grep -q port /tmp/s1.out && break; sleep 0.1; done
		p0=\$(grep -o 'port [0-9]*' /tmp/s0.out | cut -d' ' -f2)
		p1=\$(grep -o 'port [0-9]*' /tmp/s1.out | cut -d' ' -f2)
		rtrs() { # NAME PORT SERVER_PID [OPTS]
			local c0=\$(cpu \$3)
			/usr/bin/time -f 'TIME %U %S' -o /tmp/t.out $perf client --provider verbs --server 198.18.0.1:\$2 \
				--mode write --io-size 64k --queue-depth 64 --io-connections 1 --duration $DURATION --json \$4 >/tmp/c.out
			local c1=\$(cpu \$3)
			python3 -c \"import json; r = json.load(open('/tmp/c.out')); t = open('/tmp/t.out').read().split()
print('\$1', r['gb_per_sec'] * 8, r['ops'], float(t[1]) + float(t[2]) + \$c1 - \$c0)\"
		}
		for run in \$(seq $RUNS); do
			/usr/bin/time -f 'TIME %U %S' -o /tmp/ts.out ib_write_bw -R -d ${dev}0 -s 65536 -D $DURATION -F --report_gbits -p 18515 >/dev/null 2>&1 &
			sleep 1
			/usr/bin/time -f 'TIME %U %S' -o /tmp/tc.out ib_write_bw -R -d ${dev}0 -s 65536 -D $DURATION -F --report_gbits -p 18515 198.18.0.1 >/tmp/ib.out
			wait %3 2>/dev/null
			awk -v s=\"\$(cat /tmp/ts.out /tmp/tc.out | awk '/^TIME/ { t += \$2 + \$3 } END { print t }')\" \
				'/^ *65536 / { print \"perftest\", \$4, \$2, s }' /tmp/ib.out
			rtrs rtrs \$p0 \$s0
			rtrs rtrs-poll \$p1 \$s1 '--busy-poll $POLL_US'
		done
		kill \$s0 \$s1; wait" 2>&1)
	res=$(grep -E '^(perftest|rtrs|rtrs-poll) [0-9.]+ [0-9]+ [0-9.]+$' <<<"$out" || true)
	[ "$(wc -l <<<"$res")" -eq $((3 * RUNS)) ] || { echo "$out" >&2; echo "bench: no result for $dev" >&2; exit 1; }
	data+=$(sed "s/^/$dev /" <<<"$res")$'\n'
	med() { awk -v n="$1" -v f="$2" '$1 == n { print $f }' <<<"$res" | median; }
	cpu_io() { awk -v n="$1" '$1 == n { print $4 / $3 * 1e6 }' <<<"$res" | median; }
	pt=$(med perftest 2); r0=$(med rtrs 2); r1=$(med rtrs-poll 2)
	goal=">= 80 %"
	[ "$dev" = rxe ] && goal=">= 90 %"
	report+=$(python3 -c "
pt, r0, r1 = $pt, $r0, $r1
c = [$(cpu_io perftest), $(cpu_io rtrs), $(cpu_io rtrs-poll)]
print(f'| $dev | {pt:.2f} Gbit/s, {c[0]:.0f} us | {r0:.2f} Gbit/s, {c[1]:.0f} us | {r0 / pt * 100:.0f} % '
      f'| {r1:.2f} Gbit/s, {c[2]:.0f} us | {r1 / pt * 100:.0f} % | $goal |')")$'\n'
done

png=bench/plots/verbs-vs-perftest-$date.png
DATA="$data" /usr/bin/python3 - "$png" <<'PY'
import os, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [l.split() for l in os.environ["DATA"].splitlines() if l.strip()]
devs = sorted({r[0] for r in rows})
names = ["perftest", "rtrs", "rtrs-poll"]
fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
for i, dev in enumerate(devs):
    for j, n in enumerate(names):
        g = [float(r[2]) for r in rows if r[0] == dev and r[1] == n]
        c = [float(r[4]) / float(r[3]) * 1e6 for r in rows if r[0] == dev and r[1] == n]
        x = i * 4 + j
        ax[0].scatter([x] * len(g), g, label=n if i == 0 else None, color=f"C{j}")
        ax[1].scatter([x] * len(c), c, color=f"C{j}")
for a, t in zip(ax, ["Gbit/s (64 KiB writes)", "CPU us per IO, both ends"]):
    a.set_xticks([i * 4 + 1 for i in range(len(devs))], devs)
    a.set_title(t)
    a.set_ylim(bottom=0)
    a.set_xlim(-0.7, len(devs) * 4 - 1.3)
ax[0].legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[1], dpi=100)
PY

section=$(cat <<MD

### $date verbs in a QEMU guest (TCG), 64 KiB writes

Machine: $(nproc) vCPU host, guest Linux $(cut -d' ' -f1 /var/tmp/rtrs-vm/image/version) under TCG (2 vCPU, no KVM), the native RDMA fabric (rdma-core $(dpkg-query -W -f='${Version}' libibverbs-dev 2>/dev/null)).
Command: \`RUNS=$RUNS DURATION=$DURATION POLL_US=$POLL_US bench/verbs-vs-perftest.sh\` (medians of $RUNS runs, the three contenders alternating).
Peer: \`ib_write_bw -R -s 65536 -D $DURATION\` (perftest: one QP, 128 writes in flight, busy-polling); rtrs-perf: \`client --provider verbs
--mode write --io-size 64k --queue-depth 64 --io-connections 1\` from one registered buffer area (every write also waits for the server's
response), with the defaults (threads sleep when their completion queue is empty) and with \`--busy-poll $POLL_US\` on both ends.
CPU: utime + stime of both ends per IO. Plot: [$(basename "$png")](plots/$(basename "$png")).

| device | ib_write_bw | rtrs-perf | ratio | rtrs-perf --busy-poll | ratio | goal |
|---|---|---|---|---|---|---|
$report
MD
)
echo "$section"
$record && echo "$section" >>bench/RESULTS.md
exit 0
