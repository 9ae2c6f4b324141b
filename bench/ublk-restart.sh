#!/usr/bin/env bash
# What a restart of rnbd-clientd costs the IO of its block devices (issue
# 36): fio on /dev/ublkbN (4 KiB random writes, QD 16, libaio, O_DIRECT)
# in ONE QEMU guest on Debian's 6.12 backports kernel, rnbd-server
# (-m mem0:64M) and rnbd-clientd over tcp on the guest's 127.0.0.1. Three
# runs alternate, RUNS times each:
#   none:  no restart (the peer: what the same fio gets undisturbed);
#   term:  a planned restart DURATION/3 into the run (SIGTERM: the daemon
#          answers what it sent and hands the device over; a new one takes
#          it over), as systemctl restart and a package upgrade do;
#   kill:  the daemon killed (SIGKILL) there, and started again at once.
# Reported, medians: IOPS, completion latency p50, p99, p99.9 and the
# worst (the IO that waited through the restart), and the time from the
# signal to the new daemon's "taken over: its IO goes on" (IO resumes).
# fio must end with no error in every run.
#   bench/ublk-restart.sh [--record]
# --record appends the section to bench/RESULTS.md with its plot,
# bench/plots/ublk-restart-DATE[-TAG].png. Environment: RUNS (3),
# DURATION (fio seconds, 12), SMP (2).
set -euo pipefail
cd "$(dirname "$0")/.."
record=false
[ "${1:-}" = --record ] && { record=true; shift; }
RUNS=${RUNS:-3}
DURATION=${DURATION:-12}
SMP=${SMP:-2}
vm=tests/vm/rtrs-vm
vmdir=${RTRS_VM_DIR:-/var/tmp/rtrs-vm}

. bench/lib.sh
"$vm" image --bpo >/dev/null
dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q "install ok installed" ||
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		python3-matplotlib >/dev/null
command -v fio >/dev/null || { echo "bench: fio is needed (scripts/install-deps.sh)" >&2; exit 1; }
run=$(mktemp -d /tmp/ublk-restart.XXXXXX)
trap 'rm -rf "$run"' EXIT

cat >"$run/guest.sh" <<'EOF'
#!/usr/bin/env bash
set -u
run=$1 build=$2 runs=$3 dur=$4
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
wait_for() { # SECONDS CMD...
	local end=$((SECONDS + $1)); shift
	until "$@" 2>/dev/null; do [ $SECONDS -lt $end ] || return 1; sleep 0.05; done
}
check() { # NAME STATUS [DETAIL]: a failure ends the run
	if [ "$2" -eq 0 ]; then echo "CHECK $1 ok ${3:-}"; else echo "CHECK $1 FAIL ${3:-}"; exit 1; fi
}
R() { "$build/tools/rnbd" --socket /tmp/c.sock --timeout 120000 "$@"; }
nc=0
clientd() {
	clog=/tmp/c$((++nc)).log
	"$build/daemons/rnbd-clientd" --control /tmp/c.sock --runtime-dir /tmp/rt \
		--log-level info >"$clog" 2>&1 &
	cpid=$!
	wait_for 60 grep -q 'rnbd-clientd ready' "$clog"
}
[ -e /dev/ublk-control ]; check ublk-control $?
"$build/daemons/rnbd-server" --provider tcp -a 127.0.0.1 -p 1234 -m mem0:64M \
	--log-level info >/tmp/s.log 2>&1 &
spid=$!
wait_for 60 grep -q 'listening on port' /tmp/s.log; check rnbd-server-started $?
clientd; check rnbd-clientd-started $?
R client map mem0 --session bench --server 127.0.0.1:1234 --provider tcp -o json >/tmp/map.json
check rnbd-mapped $? "$(cat /tmp/map.json)"
dev=$(python3 -c 'import json; print(json.load(open("/tmp/map.json"))["block_device"] or "")')
dd if=/dev/zero of="$dev" bs=1M count=64 oflag=direct status=none; check device-written $?
n=0
for r in $(seq "$runs"); do
	for mode in none term kill; do
		n=$((n + 1))
		fio --name=restart --filename="$dev" --rw=randwrite --bs=4k --iodepth=16 \
			--ioengine=libaio --direct=1 --time_based --runtime="$dur" --size=64M \
			--norandommap --randrepeat=0 --percentile_list=50:99:99.9 \
			--output-format=json >"$run/fio-$n.json" 2>"$run/fio-$n.err" &
		fpid=$!
		sleep $((dur / 3))
		ms=0
		if [ "$mode" != none ]; then
			t0=$(date +%s%N)
			if [ "$mode" = term ]; then kill -TERM "$cpid"; else kill -KILL "$cpid"; fi
			wait "$cpid" 2>/dev/null
			clientd || { echo "CHECK restart-$n FAIL no daemon"; exit 1; }
			wait_for 60 grep -q 'taken over: its IO goes on' "$clog"
			check "takeover-$n" $?
			ms=$((($(date +%s%N) - t0) / 1000000))
		fi
		wait "$fpid"; check "fio-$n-$mode" $? "$(head -c 300 "$run/fio-$n.err")"
		echo "$n $mode $ms" >>"$run/order"
	done
done
R client unmap mem0 >/dev/null; check rnbd-unmapped $?
kill "$cpid" "$spid"
wait
dmesg | grep -cE 'BUG:|Oops|WARNING:|Call Trace' >"$run/oops" || true
EOF

load=$(cut -d' ' -f1-3 /proc/loadavg)
bench_guest "$run" --bpo --smp "$SMP" --mem 1536 \
	--timeout $((600 + 3 * RUNS * (DURATION + 30))) --share "$run" --share-ro "$PWD" -- \
	bash "$run/guest.sh" "$run" "$PWD/build-release" "$RUNS" "$DURATION"

date=$(date -u +%Y-%m-%d)
png=bench/plots/ublk-restart-$date${TAG:+-$TAG}.png
report=$(/usr/bin/python3 - "$run" "$run/plot.png" <<'EOF'
import json, statistics, sys
run, png = sys.argv[1:3]
rows = {"none": [], "term": [], "kill": []}
for line in open(run + "/order"):
    n, mode, ms = line.split()
    j = json.load(open("%s/fio-%s.json" % (run, n)))["jobs"][0]
    assert j["error"] == 0, "fio run %s: error %d" % (n, j["error"])
    w = j["write"]
    pct = w["clat_ns"]["percentile"]
    rows[mode].append([w["iops"], pct["50.000000"] / 1e6, pct["99.000000"] / 1e6,
                       pct["99.900000"] / 1e6, w["clat_ns"]["max"] / 1e6, int(ms)])
med = {m: [statistics.median(r[i] for r in v) for i in range(6)] for m, v in rows.items()}
label = {"none": "no restart", "term": "planned restart (SIGTERM, handover)",
         "kill": "crash (SIGKILL), started again"}
for m in ("none", "term", "kill"):
    o = med[m]
    print("| %s | %.0f | %.2f | %.2f | %.2f | %.0f | %s |" % (
        label[m], o[0], o[1], o[2], o[3], o[4], "%.0f" % o[5] if m != "none" else "-"))
print("RUNS " + "; ".join("%s: %s" % (m, ", ".join(
    "%.0f IOPS p99 %.1f max %.0f ms%s" % (r[0], r[2], r[4], (" takeover %d ms" % r[5]) if m != "none" else "")
    for r in v)) for m, v in rows.items()))
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
names = ["no restart", "planned\nrestart", "crash,\nrestarted"]
x = range(3)
for i, (k, c) in enumerate([(2, "#3366aa"), (3, "#55aa55"), (4, "#cc7733")]):
    ax[0].bar([v + (i - 1) * 0.27 for v in x], [med[m][k] for m in ("none", "term", "kill")],
              width=0.27, color=c, label=["p99", "p99.9", "worst"][i])
ax[0].set_xticks(list(x), names)
ax[0].set_yscale("log")
ax[0].set_ylabel("completion latency, ms (median of runs)")
ax[0].set_title("fio 4 KiB randwrite QD 16 on /dev/ublkbN")
ax[0].legend(fontsize=8)
ax[1].bar(names, [med[m][0] for m in ("none", "term", "kill")], color="#888888")
ax[1].set_ylabel("IOPS over the run (median)")
ax[1].set_title("takeover: planned %.0f ms, crash %.0f ms" % (med["term"][5], med["kill"][5]),
                fontsize=10)
fig.tight_layout()
fig.savefig(png, dpi=100)
EOF
)
echo "$report"
oops=$(cat "$run/oops" 2>/dev/null || echo "?")
echo "kernel warnings or oopses in the guest: $oops"
$record || exit 0
cp "$run/plot.png" "$png"
kver=$(cut -d' ' -f1 "$vmdir/image-bpo/version")
cat >>bench/RESULTS.md <<MD

### $date What a restart of rnbd-clientd costs its block device's IO (ublk user recovery)

Machine: $(machine); host load average $load at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end; one guest,
Linux $kver under TCG ($SMP vCPU, no KVM): the absolute times are TCG's, far above a real host's.
Command: \`RUNS=$RUNS DURATION=$DURATION bench/ublk-restart.sh --record\` (medians of $RUNS runs of each, alternating).
rnbd-server \`--provider tcp -m mem0:64M\` and rnbd-clientd over the guest's 127.0.0.1; fio on /dev/ublkbN
\`--rw=randwrite --bs=4k --iodepth=16 --ioengine=libaio --direct=1 --runtime=$DURATION\`; the restart $((DURATION / 3)) s
into the run. Takeover: from the signal to the new daemon's "taken over: its IO goes on". Every fio run ended
without an error. Kernel warnings or oopses in the guest: $oops. Plot: [$(basename "$png")](plots/$(basename "$png")).

| run | IOPS | p50 ms | p99 ms | p99.9 ms | worst ms | takeover ms |
|---|---|---|---|---|---|---|
$(grep '^|' <<<"$report")

Each run: $(grep '^RUNS' <<<"$report" | cut -d' ' -f2-).
MD
echo "bench: appended to bench/RESULTS.md"
