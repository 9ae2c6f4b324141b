#!/usr/bin/env bash
# rnbd-clientd's ublk block device against the kernel's NBD device, both
# serving 64 MiB of memory, in ONE QEMU guest booted on Debian's 6.12
# backports kernel (rtrs-vm run --bpo: ublk_drv; Debian's nbd.ko of the same
# kernel package, taken from the image's kernel tree and loaded by insmod):
#   ours: fio -> /dev/ublkbN -> rnbd-clientd (librnbd) -> RTRS -> rnbd-server
#         (-m mem0:64M), over tcp on the guest's 127.0.0.1
#         (PROVIDER=verbs: soft-RoCE, rxe on the guest's eth0 instead);
#   nbd:  fio -> /dev/nbd0 -> the kernel's nbd client (nbd-client, NBD_CONNS
#         connections) -> NBD over TCP on 127.0.0.1 -> nbdkit memory 64M.
# Before timing, each device gets a 64 MiB random pattern written (O_DIRECT)
# and read back, which must be equal (cmp): the script stops otherwise. This
# also writes both devices whole, so no run pays for the servers' first
# touches. Then the same fio job runs on each in turn, RUNS times,
# alternating. Reported: IOPS and CPU time per IO of the whole guest (its
# non-idle time from /proc/stat over the fio run: ublk's and nbd's kernel
# work, in fio's context, io_uring task work and kernel threads, is in no
# one process), the part of it spent in the daemons' processes (rnbd-server
# and rnbd-clientd, or nbdkit; utime + stime), medians, and ours / nbd.
#   bench/ublk-vs-nbd.sh [--record]
# --record appends the section to bench/RESULTS.md, with its plot in
# bench/plots/ublk-vs-nbd-DATE[-verbs][-TAG].png (TAG: runs of one day keep their plots).
# Environment: RUNS (3), DURATION (fio seconds, 10), BS (4k), QD (16),
# RW (randrw, 50/50), ENGINE (libaio; or io_uring), PROVIDER (tcp; or verbs),
# NBD_CONNS (2: nbd-client's connections, one per guest CPU as RTRS opens
# one IO connection per CPU), SMP (2, the guest's vCPUs).
set -euo pipefail
cd "$(dirname "$0")/.."
record=false
[ "${1:-}" = --record ] && { record=true; shift; }
RUNS=${RUNS:-3}
DURATION=${DURATION:-10}
BS=${BS:-4k}
QD=${QD:-16}
RW=${RW:-randrw}
ENGINE=${ENGINE:-libaio}
PROVIDER=${PROVIDER:-tcp}
NBD_CONNS=${NBD_CONNS:-2}
SMP=${SMP:-2}
case "$PROVIDER" in
tcp) addr=127.0.0.1 ;;
verbs) addr=198.18.0.1 ;;
*) echo "bench: PROVIDER is tcp or verbs" >&2; exit 2 ;;
esac
vm=tests/vm/rtrs-vm
vmdir=${RTRS_VM_DIR:-/var/tmp/rtrs-vm}

. bench/lib.sh
"$vm" image --bpo >/dev/null
for p in nbd-client python3-matplotlib; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" >/dev/null
done
command -v fio nbdkit nbdinfo >/dev/null ||
	{ echo "bench: fio, nbdkit and nbdinfo are needed (scripts/install-deps.sh)" >&2; exit 1; }
run=$(mktemp -d /tmp/ublk-vs-nbd.XXXXXX)
trap 'rm -rf "$run"' EXIT

# nbd.ko of the guest's kernel: the image keeps the unpacked package.
kver=$(cut -d' ' -f1 "$vmdir/image-bpo/version")
ko=$(ls "$vmdir/scratch/kroot-bpo/lib/modules/$kver/kernel/drivers/block/nbd.ko"* 2>/dev/null | head -1)
[ -n "$ko" ] || { echo "bench: no nbd.ko for the guest's Linux $kver" >&2; exit 1; }
case "$ko" in
*.xz) xz -dc "$ko" >"$run/nbd.ko" ;;
*.zst) zstd -qdc "$ko" >"$run/nbd.ko" ;;
*) cp "$ko" "$run/nbd.ko" ;;
esac

# The guest's part, in the shared run folder. Lines "CHECK name ok|FAIL".
cat >"$run/guest.sh" <<'EOF'
#!/usr/bin/env bash
set -u
run=$1 build=$2 runs=$3 dur=$4 bs=$5 qd=$6 rw=$7 engine=$8 provider=$9 addr=${10} conns=${11}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
wait_for() { # SECONDS CMD...
	local end=$((SECONDS + $1)); shift
	until "$@" 2>/dev/null; do [ $SECONDS -lt $end ] || return 1; sleep 0.2; done
}
# STATUS is the step's $?: given before any $(...) of the arguments, which resets it.
check() { # NAME STATUS [DETAIL]: a failure ends the run
	if [ "$2" -eq 0 ]; then echo "CHECK $1 ok ${3:-}"; else echo "CHECK $1 FAIL ${3:-}"; exit 1; fi
}
ticks() { # PID...: "utime stime" of each, on one line
	local p
	for p; do cut -d')' -f2 "/proc/$p/stat" | awk '{ print $12, $13 }'; done | paste -sd' '
}
R() { "$build/tools/rnbd" --socket /tmp/c.sock --timeout 120000 "$@"; }
[ -e /dev/ublk-control ]; check ublk-control $?
insmod "$run/nbd.ko" nbds_max=1; check nbd-module-loaded $?

"$build/daemons/rnbd-server" --provider "$provider" -a "$addr" -p 1234 -m mem0:64M \
	--log-level info >/tmp/s.log 2>&1 &
spid=$!
wait_for 60 grep -q 'listening on port' /tmp/s.log; check rnbd-server-started $?
"$build/daemons/rnbd-clientd" --control /tmp/c.sock --log-level info >/tmp/c.log 2>&1 &
cpid=$!
wait_for 60 grep -q 'rnbd-clientd ready' /tmp/c.log; check rnbd-clientd-started $?
R client map mem0 --session bench --server "$addr:1234" --provider "$provider" \
	-o json >/tmp/map.json
check rnbd-mapped $? "$(cat /tmp/map.json)"
ours=$(python3 -c 'import json; print(json.load(open("/tmp/map.json"))["block_device"] or "")')
[ -b "$ours" ]; check ublk-block-device $? "($ours)"

nbdkit -f -i 127.0.0.1 -p 10809 memory 64M >/tmp/nbdkit.log 2>&1 &
npid=$!
wait_for 30 nbdinfo --size nbd://127.0.0.1:10809 >/dev/null; check nbdkit-started $?
nbd-client 127.0.0.1 10809 /dev/nbd0 -C "$conns" >/tmp/nbd-client.log 2>&1
check nbd-connected $? "($(tr '\n' ' ' </tmp/nbd-client.log))"
nbd=/dev/nbd0
wait_for 30 test "$(blockdev --getsize64 $nbd)" = 67108864; check nbd-size $?

# The same random 64 MiB through each device and back.
head -c 64M /dev/urandom >/tmp/pattern
for dev in "$ours" "$nbd"; do
	dd if=/tmp/pattern of="$dev" bs=1M oflag=direct status=none &&
		dd if="$dev" of=/tmp/back bs=1M count=64 iflag=direct status=none &&
		cmp /tmp/pattern /tmp/back
	check "pattern-read-back-equal-${dev#/dev/}" $? "(64 MiB, O_DIRECT)"
	rm -f /tmp/back
done
rm -f /tmp/pattern

n=0
for r in $(seq "$runs"); do
	for target in ours nbd; do
		n=$((n + 1))
		if [ "$target" = ours ]; then dev=$ours procs="$spid $cpid"; else dev=$nbd procs=$npid; fi
		ticks $procs >"$run/procs-$n.start"
		grep '^cpu ' /proc/stat >"$run/cpu-$n.start"
		fio --name=bench --filename="$dev" --rw="$rw" --rwmixread=50 --bs="$bs" \
			--iodepth="$qd" --ioengine="$engine" --direct=1 --time_based --runtime="$dur" \
			--size=64M --norandommap --randrepeat=0 \
			--output-format=json >"$run/fio-$n.json" 2>"$run/fio-$n.err"
		grep '^cpu ' /proc/stat >"$run/cpu-$n.end"
		ticks $procs >"$run/procs-$n.end"
		echo "$n $target" >>"$run/order"
	done
done
nbd-client -d "$nbd" >/dev/null 2>&1; check nbd-disconnected $?
R client unmap mem0 >/dev/null; check rnbd-unmapped $?
kill "$cpid" "$spid" "$npid"
wait
dmesg | grep -cE 'BUG:|Oops|WARNING:|Call Trace' >"$run/oops" || true
EOF

load=$(cut -d' ' -f1-3 /proc/loadavg)
bench_guest "$run" --bpo --rdma rxe --smp "$SMP" --mem 1536 \
	--timeout $((600 + 2 * RUNS * (DURATION + 60))) --share "$run" --share-ro "$PWD" -- \
	bash "$run/guest.sh" "$run" "$PWD/build-release" "$RUNS" "$DURATION" "$BS" "$QD" "$RW" \
	"$ENGINE" "$PROVIDER" "$addr" "$NBD_CONNS"

date=$(date -u +%Y-%m-%d)
suffix=
[ "$PROVIDER" = tcp ] || suffix=-$PROVIDER
png=bench/plots/ublk-vs-nbd-$date$suffix${TAG:+-$TAG}.png
report=$(/usr/bin/python3 - "$run" "$run/plot.png" "$PROVIDER" <<'EOF'
import json, statistics, sys
run, png, provider = sys.argv[1:4]
hz = 100  # USER_HZ in /proc/stat and /proc/PID/stat


def stat(path):  # user nice system idle iowait irq softirq steal
    return [int(x) for x in open(path).read().split()[1:9]]


rows = {"ours": [], "nbd": []}
for line in open(run + "/order"):
    n, target = line.split()
    j = json.load(open("%s/fio-%s.json" % (run, n)))["jobs"][0]
    assert j["error"] == 0, "fio run %s: error %d" % (n, j["error"])
    ios = j["read"]["total_ios"] + j["write"]["total_ios"]
    secs = j["job_runtime"] / 1000.0
    a, b = stat("%s/cpu-%s.start" % (run, n)), stat("%s/cpu-%s.end" % (run, n))
    d = [y - x for x, y in zip(a, b)]
    busy = d[0] + d[1] + d[2] + d[5] + d[6] + d[7]
    kern = d[2] + d[5] + d[6]
    # utime, stime of each process (ours: rnbd-server, rnbd-clientd; nbd: nbdkit)
    p = [y - x for x, y in zip(map(int, open("%s/procs-%s.start" % (run, n)).read().split()),
                               map(int, open("%s/procs-%s.end" % (run, n)).read().split()))]
    us = 1e6 / hz / ios
    rows[target].append([ios / secs, busy * us, sum(p) * us, kern * us, (d[0] + d[1]) * us]
                        + [x * us for x in p])
med = {t: [statistics.median(r[i] for r in v) for i in range(len(v[0]))] for t, v in rows.items()}
o, k = med["ours"], med["nbd"]
print("| IOPS | %.0f | %.0f | %.2fx |" % (o[0], k[0], o[0] / k[0]))
print("| guest CPU us per IO (all non-idle time) | %.1f | %.1f | %.2fx |" % (o[1], k[1], o[1] / k[1]))
print("| of which the daemons (rnbd-server + rnbd-clientd; nbdkit) | %.1f | %.1f | %.2fx |" % (o[2], k[2], o[2] / k[2]))
print("| of which rest of the guest (fio, kernel threads, interrupts) | %.1f | %.1f | %.2fx |"
      % (o[1] - o[2], k[1] - k[2], (o[1] - o[2]) / (k[1] - k[2])))
print("| guest kernel time us per IO (system, irq, softirq) | %.1f | %.1f | %.2fx |" % (o[3], k[3], o[3] / k[3]))
print("| guest user time us per IO | %.1f | %.1f | %.2fx |" % (o[4], k[4], o[4] / k[4]))
print("SPLIT rnbd-server %.1f (user %.1f, system %.1f), rnbd-clientd %.1f (user %.1f, system %.1f),"
      " nbdkit %.1f (user %.1f, system %.1f)"
      % (o[5] + o[6], o[5], o[6], o[7] + o[8], o[7], o[8], k[5] + k[6], k[5], k[6]))
# Each run of ours against the nbd run right after it: the host's load
# drifts less within a pair than over the whole command.
pairs = list(zip(rows["ours"], rows["nbd"]))
print("PAIRS IOPS %s; CPU per IO %s" % (
    " ".join("%.2fx" % (a[0] / b[0]) for a, b in pairs),
    " ".join("%.2fx" % (a[1] / b[1]) for a, b in pairs)))
print("RUNS " + "; ".join("%s %s" % (t, " ".join("%.0f IOPS/%.0f us" % (r[0], r[1]) for r in v))
                          for t, v in rows.items()))
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
names = ["ublk (rnbd-clientd,\nrnbd-server, %s)" % ("tcp" if provider == "tcp" else "rxe"),
         "nbd (kernel client,\nnbdkit memory, tcp)"]
fig, ax = plt.subplots(1, 2, figsize=(9, 3.8))
ax[0].bar(names, [o[0], k[0]], color=["#3366aa", "#888888"])
ax[0].set_ylabel("IOPS (median)")
ax[0].set_title("fio 4 KiB randrw, one TCG guest")
ax[1].bar(names, [o[2], k[2]], label="daemons (rnbd-server + rnbd-clientd; nbdkit)", color="#cc7733")
ax[1].bar(names, [o[1] - o[2], k[1] - k[2]], bottom=[o[2], k[2]],
          label="rest of the guest (fio, kernel)", color="#55aa55")
ax[1].set_ylabel("guest CPU us per IO (median)")
ax[1].set_title("ours / nbd: %.2fx IOPS, %.2fx CPU per IO" % (o[0] / k[0], o[1] / k[1]), fontsize=10)
ax[1].set_ylim(0, 1.4 * max(o[1], k[1]))
ax[1].legend(fontsize=8, loc="upper center")
fig.tight_layout()
fig.savefig(png, dpi=100)
EOF
)
echo "$report"
oops=$(cat "$run/oops" 2>/dev/null || echo "?")
echo "kernel warnings or oopses in the guest: $oops"
$record || exit 0
cp "$run/plot.png" "$png"
cat >>bench/RESULTS.md <<MD

### $date rnbd-clientd's ublk device vs the kernel's nbd device, one guest, $([ "$PROVIDER" = tcp ] && echo "both over loopback TCP" || echo "RTRS over soft-RoCE, NBD over loopback TCP")

Machine: $(machine); host load average $load at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end; one guest,
Linux $kver under TCG ($SMP vCPU, no KVM).
Command: \`RUNS=$RUNS DURATION=$DURATION BS=$BS QD=$QD RW=$RW ENGINE=$ENGINE PROVIDER=$PROVIDER NBD_CONNS=$NBD_CONNS bench/ublk-vs-nbd.sh --record\`
(medians of $RUNS runs, the two devices alternating). Ours: rnbd-server \`--provider $PROVIDER -a $addr -m mem0:64M\` and
rnbd-clientd mapping it (\`rnbd client map mem0 --provider $PROVIDER\`) as /dev/ublkbN. The peer: \`nbdkit memory 64M\`
on 127.0.0.1 and Debian's nbd.ko, \`nbd-client 127.0.0.1 PORT /dev/nbd0 -C $NBD_CONNS\`. A 64 MiB random pattern was written
through each device and read back equal (O_DIRECT) before the runs. fio on each: \`--rw=$RW --rwmixread=50 --bs=$BS
--iodepth=$QD --ioengine=$ENGINE --direct=1 --runtime=$DURATION\`. CPU: the guest's non-idle time from /proc/stat over the
run, per IO; the daemons (rnbd-server + rnbd-clientd, or nbdkit) from their utime + stime. Kernel
warnings or oopses in the guest: $oops. Plot: [$(basename "$png")](plots/$(basename "$png")).

| measurement | ublk: rnbd-clientd + rnbd-server | nbd: kernel client + nbdkit | ours / nbd |
|---|---|---|---|
$(grep '^|' <<<"$report")

The daemons apart (CPU us per IO): $(grep '^SPLIT' <<<"$report" | cut -d' ' -f2-).
Ours / nbd within each pair of runs: $(grep '^PAIRS' <<<"$report" | cut -d' ' -f2-).
Runs (IOPS / guest CPU us per IO): $(grep '^RUNS' <<<"$report" | cut -d' ' -f2-).

How to read it: both contenders run in the same TCG-emulated guest, so every absolute figure is inflated many
times over a real machine (TCG translates every guest instruction in software); the ratio of the two, taken
in one guest with the runs alternating, is what carries. The guest's CPU per IO counts everything that
happened in it while fio ran, fio included, which is the same job on both sides. A busy host slows
the guest's vCPUs unevenly and TCG has no steal time to show it: the time lost lands in whatever the guest
was doing, so runs of one contender vary; the pairs' ratios say how far.
MD
echo "recorded in bench/RESULTS.md and $png"
