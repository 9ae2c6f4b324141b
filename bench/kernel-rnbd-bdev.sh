#!/usr/bin/env bash
# Block devices served to the kernel's rnbd-client by the kernel's
# rnbd-server and by ours in both of its modes, in one pair of QEMU guests
# (rtrs-vm pair --kmods, soft-RoCE): guest A has three brd RAM disks of
# 64 MiB (no write cache, no FUA): /dev/ram0 exported by the kernel's
# rnbd-server (port 1234), /dev/ram1 by rnbd-server with O_DIRECT, its
# default, announcing what the device has (port 1235), /dev/ram2 by
# rnbd-server --buffered-bdev, through the page cache, announcing a write
# cache and FUA (port 1236); always_invalidate on in all three, their
# default. Guest B maps the three with the kernel's rnbd-client and runs
# each fio job on each device in turn, RUNS times:
#   plain  --rw=RW --bs=BS --iodepth=QD --ioengine=libaio --direct=1
#   sync   the same with --fdatasync=SYNC: a flush after every SYNC writes,
#          as a file system or md sends them; on a device announced without
#          a write cache the client completes them itself
# Reported: IOPS medians per job and server, ours over the kernel's; the
# write cache and FUA each mapping shows in B's sysfs; the flushes each of
# our servers received (server.devices 'other', over the control socket);
# before the runs, fio's verify (kg_fio_verify, 16 MiB of 4 KiB random
# writes, each read back and checked) through each of our two servers; the
# host's load average at start and end (the host may be shared).
#   bench/kernel-rnbd-bdev.sh [--record]
# Environment: RUNS (3), DURATION (fio seconds, 10), BS (4k), QD (16),
# RW (randrw), SYNC (16).
set -euo pipefail
cd "$(dirname "$0")/.."
record=false
[ "${1:-}" = --record ] && { record=true; shift; }
RUNS=${RUNS:-3}
DURATION=${DURATION:-10}
BS=${BS:-4k}
QD=${QD:-16}
RW=${RW:-randrw}
SYNC=${SYNC:-16}
vm=tests/vm/rtrs-vm

. bench/lib.sh
"$vm" image --kmods >/dev/null
command -v fio >/dev/null || { echo "bench: fio is needed (rtrs-vm image installs it)" >&2; exit 1; }
run=$(mktemp -d /tmp/kernel-rnbd-bdev.XXXXXX)
trap 'rm -rf "$run"' EXIT
load0=$(cut -d' ' -f1 /proc/loadavg)

guest=$run/guest.sh
cat >"$guest" <<'EOF'
#!/usr/bin/env bash
set -u
role=$1 run=$2 build=$3 here=$4 runs=$5 dur=$6 bs=$7 qd=$8 rw=$9 sync=${10}
. "$here/tests/vm/kernel-guest.sh"
KG_NAME=$role KG_RUN=$run
kg_in_guest || exit 1
# flushes PORT: what our server on PORT counted as flush, discard and the like
flushes() {
	"$build/tools/rnbd" --socket "/tmp/ctl-$1" server list devices -o json |
		python3 -c 'import json, sys; print(sum(d["other"] for d in json.load(sys.stdin)))'
}
if [ "$role" = A ]; then
	kg_insmod brd rd_nr=3 rd_size=$((64 * 1024)) && kg_load_server always_invalidate=1 ||
		{ echo "A: brd or the kernel server not loaded"; exit 1; }
	for i in $(seq 50); do [ -b /dev/ram2 ] && break; sleep 0.1; done
	for d in ram0 ram1 ram2; do
		echo "$d: write_cache $(cat /sys/block/$d/queue/write_cache), fua $(cat /sys/block/$d/queue/fua)" \
			>>"$run/A-devices"
	done
	srvs=()
	for p in 1235 1236; do
		mode=
		[ "$p" = 1236 ] && mode=--buffered-bdev
		"$build/daemons/rnbd-server" --provider verbs -a 198.18.0.1 -p "$p" -s /dev $mode \
			--control "/tmp/ctl-$p" --log-level info >"$run/A-rnbd-server-$p.log" 2>&1 &
		srvs+=($!)
	done
	sleep 1
	for s in "${srvs[@]}"; do kill -0 "$s" || { cat "$run"/A-rnbd-server-*.log; exit 1; }; done
	kg_signal A-ready
	n=0
	while :; do
		n=$((n + 1))
		kg_wait "go-$n B-done" 900
		[ -e "$run/B-done" ] && break
		echo "$(flushes 1235) $(flushes 1236)" >"$run/A-$n.start"
		kg_signal "ack-$n"
		kg_wait "end-$n" 600
		echo "$(flushes 1235) $(flushes 1236)" >"$run/A-$n.end"
		kg_signal "ackend-$n"
	done
	kill "${srvs[@]}"
	wait "${srvs[@]}"
	exit 0
fi
trap 'kg_signal B-done' EXIT
kg_load_client || exit 1
kg_wait A-ready 120 || exit 1
dk=$(kg_map kern 198.18.0.1 /dev/ram0) || exit 1
dd_=$(kg_map direct 198.18.0.1 ram1 1235) || exit 1
db=$(kg_map buffered 198.18.0.1 ram2 1236) || exit 1
for t in "kernel $dk" "direct $dd_" "buffered $db"; do
	set -- $t
	q=/sys/block/$(basename "$2")/queue
	echo "$1 $(cat "$q/write_cache" | tr ' ' _) $(cat "$q/fua")" >>"$run/B-announced"
	# Written whole once: the runs then measure the IO path, not first touches.
	dd if=/dev/zero of="$2" bs=1M count=64 oflag=direct status=none || exit 1
done
for t in "direct $dd_" "buffered $db"; do
	set -- $t
	if kg_fio_verify "$2" 16 >"$run/B-verify-$1.log" 2>&1; then
		echo "$1 verified" >>"$run/B-verify"
	else
		echo "$1 FAILED" >>"$run/B-verify"
	fi
done
n=0
for r in $(seq "$runs"); do
	for job in plain sync; do
		for target in kernel direct buffered; do
			n=$((n + 1))
			dev=$dk
			[ "$target" = direct ] && dev=$dd_
			[ "$target" = buffered ] && dev=$db
			extra=
			[ "$job" = sync ] && extra=--fdatasync=$sync
			kg_signal "go-$n"
			kg_wait "ack-$n" 60
			fio --name=bench --filename="$dev" --rw="$rw" --bs="$bs" --iodepth="$qd" \
				--ioengine=libaio --direct=1 --time_based --runtime="$dur" --size=64M \
				$extra --output-format=json >"$run/fio-$n.json" 2>"$run/fio-$n.err"
			echo "$n $job $target" >>"$run/order"
			kg_signal "end-$n"
			kg_wait "ackend-$n" 60
		done
	done
done
for d in "$dk" "$dd_" "$db"; do kg_unmap "$d"; done
dmesg | grep -cE 'BUG:|Oops|WARNING:' >"$run/B-oops" || true
EOF
chmod +x "$guest"

"$vm" pair --kmods --timeout $((400 + 6 * RUNS * (DURATION + 25))) --share "$run" \
	--share-ro "$PWD" \
	--a "$guest A $run $PWD/build-release $PWD $RUNS $DURATION $BS $QD $RW $SYNC" \
	--b "$guest B $run $PWD/build-release $PWD $RUNS $DURATION $BS $QD $RW $SYNC" >"$run/pair.log" 2>&1 ||
	{ cat "$run/pair.log"; echo "bench: the guests failed" >&2; exit 1; }
[ -s "$run/order" ] || { cat "$run/pair.log"; echo "bench: no runs" >&2; exit 1; }

report=$(/usr/bin/python3 - "$run" <<'EOF'
import json, statistics, sys
run = sys.argv[1]
iops, fl = {}, {}
for line in open(run + "/order"):
    n, job, target = line.split()
    j = json.load(open("%s/fio-%s.json" % (run, n)))["jobs"][0]
    ios = j["read"]["total_ios"] + j["write"]["total_ios"]
    iops.setdefault((job, target), []).append(ios / (j["job_runtime"] / 1000.0))
    a = [int(x) for x in open("%s/A-%s.start" % (run, n)).read().split()]
    b = [int(x) for x in open("%s/A-%s.end" % (run, n)).read().split()]
    col = {"direct": 0, "buffered": 1}.get(target)
    if col is not None:
        fl.setdefault((job, target), []).append(b[col] - a[col])
for job in ("plain", "sync"):
    k = statistics.median(iops[(job, "kernel")])
    row = ["%.0f" % k]
    for t in ("direct", "buffered"):
        o = statistics.median(iops[(job, t)])
        row.append("%.0f (%.0f %%, %d flushes)" % (o, 100 * o / k, statistics.median(fl[(job, t)])))
    print("| %s | %s |" % (job, " | ".join(row)))
print("RUNS " + " ".join("%s/%s:%.0f" % (jb, t, v) for (jb, t), vs in sorted(iops.items())
                         for v in vs))
EOF
)
load1=$(cut -d' ' -f1 /proc/loadavg)
echo "$report"
echo "fio verify through our servers: $(tr '\n' ' ' <"$run/B-verify")"
echo "host load average (1 min): $load0 at start, $load1 at end"
echo "A's devices:"; cat "$run/A-devices"
echo "as B's rnbd-client maps them (write_cache fua):"; cat "$run/B-announced"
oops=$(cat "$run/B-oops" 2>/dev/null || echo "?")
$record || exit 0
date=$(date -u +%Y-%m-%d)
cat >>bench/RESULTS.md <<MD

### $date block devices: the kernel's rnbd-server vs ours, O_DIRECT and --buffered-bdev (soft-RoCE, two guests)

Machine: $(machine); guests Linux $(cut -d' ' -f1 /var/tmp/rtrs-vm/image/version) under TCG (1 vCPU each, no KVM), rxe on a virtual cable.
Command: \`RUNS=$RUNS DURATION=$DURATION BS=$BS QD=$QD RW=$RW SYNC=$SYNC bench/kernel-rnbd-bdev.sh --record\` (medians of $RUNS runs, the servers alternating).
Guest A: three brd RAM disks of 64 MiB ($(tr '\n' ';' <"$run/A-devices" | sed 's/;$//; s/;/; /g')): ram0 from the kernel's rnbd-server,
ram1 from rnbd-server (\`--provider verbs -s /dev\`, O_DIRECT), ram2 from rnbd-server \`--buffered-bdev\`; always_invalidate on in all.
Guest B's rnbd-client shows them as (write_cache, fua): $(tr '\n' ';' <"$run/B-announced" | sed 's/;$//; s/;/; /g').
fio in guest B on /dev/rnbdX: plain \`--rw=$RW --bs=$BS --iodepth=$QD --ioengine=libaio --direct=1 --runtime=$DURATION\`; sync: the same
with \`--fdatasync=$SYNC\`. Flushes: what each of our servers counted (server.devices \`other\`) over a run. Kernel warnings or oopses in B: $oops.
fio verify (16 MiB of 4 KiB random writes, each read back and checked) through our servers before the runs: $(tr '\n' ' ' <"$run/B-verify" | sed 's/ $//').
Host load average (1 min; the host is shared): $load0 at start, $load1 at end.

| job | kernel rnbd-server IOPS | ours, O_DIRECT (default) | ours, --buffered-bdev |
|---|---|---|---|
$(grep '^|' <<<"$report")

Runs (IOPS): $(grep '^RUNS' <<<"$report" | cut -d' ' -f2-).
MD
echo "recorded in bench/RESULTS.md"
