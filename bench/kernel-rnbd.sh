#!/usr/bin/env bash
# The kernel's rnbd-client reading and writing through the project's
# rnbd-server against the same client through the kernel's rnbd-server, in
# the same pair of QEMU guests (rtrs-vm pair --kmods, soft-RoCE): guest A
# serves 64 MiB of memory both ways (brd /dev/ram0 by the kernel's
# rnbd-server on port 1234, a memory device by rnbd-server on port 1235,
# always_invalidate on in both, their default), guest B maps both with the
# kernel's rnbd-client and runs the same fio job on each in turn, RUNS
# times. Reported: IOPS, and CPU time per IO in each guest (the whole
# guest's non-idle time from /proc/stat over the run: the kernel server
# works in softirq and kernel threads, which no process accounts), medians,
# and ours over the kernel's. Goal: ours >= 90 % of the kernel's IOPS.
#   bench/kernel-rnbd.sh [--record]
# Environment: RUNS (3), DURATION (fio seconds, 10), BS (4k), QD (16), RW (randrw),
# INVAL (1: always_invalidate on in both servers; 0: off in both),
# SERVER_OPTS (more rnbd-server options, e.g. "--busy-poll 200"),
# PERF (1: a system-wide perf profile of the server guest during the first
# run of each server, printed at the end; not for recorded figures).
set -euo pipefail
cd "$(dirname "$0")/.."
record=false
[ "${1:-}" = --record ] && { record=true; shift; }
RUNS=${RUNS:-3}
DURATION=${DURATION:-10}
BS=${BS:-4k}
QD=${QD:-16}
RW=${RW:-randrw}
INVAL=${INVAL:-1}
PERF=${PERF:-0}
SERVER_OPTS=${SERVER_OPTS:-}
export SERVER_OPTS
vm=tests/vm/rtrs-vm

. bench/lib.sh
"$vm" image --kmods >/dev/null
command -v fio >/dev/null || { echo "bench: fio is needed (rtrs-vm image installs it)" >&2; exit 1; }
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null ||
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-matplotlib >/dev/null
run=$(mktemp -d /tmp/kernel-rnbd-bench.XXXXXX)
trap 'rm -rf "$run"' EXIT
printf '%s\n' "$SERVER_OPTS" >"$run/server-opts"

# The guests' parts, in the shared run folder.
guest=$run/guest.sh
cat >"$guest" <<'EOF'
#!/usr/bin/env bash
set -u
role=$1 run=$2 build=$3 here=$4 runs=$5 dur=$6 bs=$7 qd=$8 rw=$9 inval=${10} prof=${11}
. "$here/tests/vm/kernel-guest.sh"
. "$here/bench/kernel-bench-guest.sh"
KG_NAME=$role KG_RUN=$run
kg_in_guest || exit 1
if [ "$role" = A ]; then
	kg_load_brd 64 && kg_load_server "always_invalidate=$inval" ||
		{ echo "A: kernel server not loaded"; exit 1; }
	opt=--invalidate
	[ "$inval" = 1 ] || opt=--no-invalidate
	"$build/daemons/rnbd-server" --provider verbs -a 198.18.0.1 -p 1235 -m ram1:64M "$opt" \
		$(cat "$run/server-opts") --log-level warn >"$run/A-rnbd-server.log" 2>&1 &
	srv=$!
	sleep 1
	kill -0 "$srv" || { cat "$run/A-rnbd-server.log"; exit 1; }
	kg_signal A-ready
	for n in $(seq $((2 * runs))); do
		kg_wait "go-$n B-done" 600
		[ -e "$run/B-done" ] && break
		kb_cpu >"$run/A-$n.start"
		if [ "$prof" = 1 ] && [ "$n" -le 2 ]; then
			perf record -a -g -q -o "/tmp/perf-$n.data" 2>/dev/null &
			perf_pid=$!
		fi
		kg_signal "ack-$n"
		kg_wait "end-$n" 600
		kb_cpu >"$run/A-$n.end"
		if [ "$prof" = 1 ] && [ "$n" -le 2 ]; then
			kill -INT "$perf_pid"
			wait "$perf_pid"
			perf report -i "/tmp/perf-$n.data" --no-children --sort comm,dso,sym \
				--stdio 2>/dev/null | grep -v '^#' | grep '%' | head -60 >"$run/perf-$n.txt"
		fi
		kg_signal "ackend-$n"
	done
	kg_wait B-done 600
	kill "$srv"
	wait "$srv"
	exit 0
fi
trap 'kg_signal B-done' EXIT
kg_load_client || exit 1
kg_wait A-ready 120 || exit 1
dk=$(kg_map kern 198.18.0.1 /dev/ram0) || exit 1
do=$(kg_map ours 198.18.0.1 ram1 1235) || exit 1
# Both devices written whole once first: otherwise the first run of each
# pays for its server's first touch of the memory (brd's page allocations,
# the memory device's page faults), not for the IO path.
for dev in "$dk" "$do"; do
	dd if=/dev/zero of="$dev" bs=1M count=64 oflag=direct status=none || exit 1
done
n=0
for r in $(seq "$runs"); do
	for target in kernel ours; do
		n=$((n + 1))
		dev=$dk
		[ "$target" = ours ] && dev=$do
		kb_b_run "$n" "$target" "$dev" "$rw" "$bs" "$qd" "$dur" 64M
	done
done
kg_unmap "$dk"
kg_unmap "$do"
dmesg | grep -cE 'BUG:|Oops|WARNING:' >"$run/B-oops" || true
EOF
chmod +x "$guest"

"$vm" pair --kmods --timeout $((300 + 4 * RUNS * (DURATION + 20))) --share "$run" \
	--share-ro "$PWD" \
	--a "$guest A $run $PWD/build-release $PWD $RUNS $DURATION $BS $QD $RW $INVAL $PERF" \
	--b "$guest B $run $PWD/build-release $PWD $RUNS $DURATION $BS $QD $RW $INVAL $PERF" >"$run/pair.log" 2>&1 ||
	{ cat "$run/pair.log"; echo "bench: the guests failed" >&2; exit 1; }
[ -s "$run/order" ] || { cat "$run/pair.log"; echo "bench: no runs" >&2; exit 1; }

date=$(date -u +%Y-%m-%d)
png=bench/plots/kernel-rnbd-$date-inval$INVAL.png
$record || png=$run/plot.png # the plot goes into bench/plots with --record only
report=$(/usr/bin/python3 - "$run" "$png" <<'EOF'
import json, statistics, sys
run, png = sys.argv[1], sys.argv[2]
hz = 100  # USER_HZ in /proc/stat
rows = {"kernel": [], "ours": []}
for line in open(run + "/order"):
    n, target = line.split()
    j = json.load(open("%s/fio-%s.json" % (run, n)))["jobs"][0]
    ios = j["read"]["total_ios"] + j["write"]["total_ios"]
    secs = j["job_runtime"] / 1000.0
    a = (int(open("%s/A-%s.end" % (run, n)).read()) - int(open("%s/A-%s.start" % (run, n)).read())) / hz
    b = (int(open("%s/B-%s.end" % (run, n)).read()) - int(open("%s/B-%s.start" % (run, n)).read())) / hz
    rows[target].append((ios / secs, a * 1e6 / ios, b * 1e6 / ios))
med = {t: [statistics.median(r[i] for r in v) for i in range(3)] for t, v in rows.items()}
k, o = med["kernel"], med["ours"]
print("| IOPS | %.0f | %.0f | %.0f %% | >= 90 %% |" % (k[0], o[0], 100 * o[0] / k[0]))
print("| server guest (A) CPU us per IO | %.1f | %.1f | %.2fx | |" % (k[1], o[1], o[1] / k[1]))
print("| client guest (B) CPU us per IO | %.1f | %.1f | %.2fx | |" % (k[2], o[2], o[2] / k[2]))
print("| server + client CPU us per IO | %.1f | %.1f | %.2fx | |"
      % (k[1] + k[2], o[1] + o[2], (o[1] + o[2]) / (k[1] + k[2])))
print("RUNS " + " ".join("%s:%.0f" % (t, r[0]) for t, v in rows.items() for r in v))
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
names = ["kernel rnbd-server", "our rnbd-server"]
ax[0].bar(names, [k[0], o[0]], color=["#888888", "#3366aa"])
ax[0].set_ylabel("IOPS (median)")
ax[0].set_title("kernel rnbd-client, fio")
w = 0.35
ax[1].bar([0 - w / 2, 1 - w / 2], [k[1], o[1]], w, label="server guest", color="#cc7733")
ax[1].bar([0 + w / 2, 1 + w / 2], [k[2], o[2]], w, label="client guest", color="#55aa55")
ax[1].set_xticks([0, 1])
ax[1].set_xticklabels(names)
ax[1].set_ylabel("CPU us per IO")
ax[1].legend()
fig.tight_layout()
fig.savefig(png, dpi=100)
EOF
)
echo "$report"
for n in 1 2; do
	[ -s "$run/perf-$n.txt" ] || continue
	echo "--- server guest profile, run $n ($(sed -n "${n}p" "$run/order" | cut -d' ' -f2))"
	cat "$run/perf-$n.txt"
done
oops=$(cat "$run/B-oops" 2>/dev/null || echo "?")
$record || exit 0
cat >>bench/RESULTS.md <<MD

### $date the kernel's rnbd-client through our rnbd-server vs the kernel's rnbd-server (soft-RoCE, two guests, always_invalidate $([ "$INVAL" = 1 ] && echo on || echo off))

Machine: $(machine); guests Linux $(cut -d' ' -f1 /var/tmp/rtrs-vm/image/version) under TCG (1 vCPU each, no KVM), rxe on a virtual cable.
Command: \`RUNS=$RUNS DURATION=$DURATION BS=$BS QD=$QD RW=$RW INVAL=$INVAL${SERVER_OPTS:+ SERVER_OPTS=\"$SERVER_OPTS\"} bench/kernel-rnbd.sh --record\` (medians of $RUNS runs, the two servers alternating).
Both devices written whole once (dd, 64 MiB) before the runs.
fio in guest B: \`--rw=$RW --bs=$BS --iodepth=$QD --ioengine=libaio --direct=1 --runtime=$DURATION\` on /dev/rnbdX, the kernel's
rnbd-client mapping A's brd /dev/ram0 from the kernel's rnbd-server, then a 64 MiB memory device from rnbd-server
(\`--provider verbs -m ram1:64M\`); always_invalidate $([ "$INVAL" = 1 ] && echo "on in both (the kernel's \`always_invalidate=1\`, our default)" || echo "off in both (\`always_invalidate=0\`, \`--no-invalidate\`)"). CPU: each guest's non-idle time from /proc/stat over the run,
per IO. Kernel warnings or oopses in B: $oops. Plot: [$(basename "$png")](plots/$(basename "$png")).

| measurement | kernel rnbd-server | our rnbd-server | ours / kernel | goal |
|---|---|---|---|---|
$(grep '^|' <<<"$report")

Runs (IOPS): $(grep '^RUNS' <<<"$report" | cut -d' ' -f2-).
MD
echo "recorded in bench/RESULTS.md and $png"
