#!/usr/bin/env bash
# Shared receive queues on the rdma-core fabric, measured with the kernel's
# rnbd-client (and so with the kernel's RTRS client on the wire): guest A
# runs two rnbd-servers from the same build, one with its IO connections
# taking their receives from a shared receive queue per poll group and
# device (--srq-depth SRQ, port 1235) and one with a receive queue per
# connection (--srq-depth 0, port 1236); guest B maps SESSIONS devices
# (files on A's tmpfs) from each with the kernel's rnbd-client, one session
# per device (the guest has one vCPU: a session is an admin and one IO
# connection), then runs the same fio job on the first device of each in
# turn, RUNS times. Both servers keep the default queue depth (512: the
# receives a connection of its own posts are 528) with 8 KiB chunks, so
# that the chunk memory, registered and so resident on rxe, stays 4 MiB a
# session.
# Reported: each server's RSS and threads with no session and with
# SESSIONS, per session; IOPS and CPU per IO (both guests' non-idle time
# from /proc/stat), medians, and shared over per-connection.
#   bench/kernel-rnbd-srq.sh [--record]
# Environment: RUNS (3), DURATION (fio seconds, 10), SESSIONS (24),
# SRQ (4096), BS (4k), QD (32), RW (randrw).
set -euo pipefail
cd "$(dirname "$0")/.."
record=false
[ "${1:-}" = --record ] && { record=true; shift; }
RUNS=${RUNS:-3}
DURATION=${DURATION:-10}
SESSIONS=${SESSIONS:-24}
SRQ=${SRQ:-4096}
BS=${BS:-4k}
QD=${QD:-32}
RW=${RW:-randrw}
vm=tests/vm/rtrs-vm

. bench/lib.sh
"$vm" image --kmods >/dev/null
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null ||
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-matplotlib >/dev/null
run=$(mktemp -d /tmp/kernel-rnbd-srq.XXXXXX)
trap 'rm -rf "$run"' EXIT

guest=$run/guest.sh
cat >"$guest" <<'EOF'
#!/usr/bin/env bash
set -u
role=$1 run=$2 build=$3 here=$4 runs=$5 dur=$6 sessions=$7 srq=$8 bs=$9 qd=${10} rw=${11}
. "$here/tests/vm/kernel-guest.sh"
. "$here/bench/kernel-bench-guest.sh"
KG_NAME=$role KG_RUN=$run
kg_in_guest || exit 1
mem() { # PID NAME: "NAME rss_kib threads"
	echo "$2 $(awk '/^VmRSS/ { print $2 }' "/proc/$1/status") $(ls "/proc/$1/task" | wc -l)"
}
if [ "$role" = A ]; then
	srv() { # PORT SRQ: its own folder of SESSIONS files of 4 MiB (the guest's tmpfs)
		mkdir -p "/tmp/srq-$1"
		for i in $(seq "$sessions"); do truncate -s 4M "/tmp/srq-$1/f$i"; done
		"$build/daemons/rnbd-server" --provider verbs -a 198.18.0.1 -p "$1" --srq-depth "$2" \
			--queue-depth 512 --chunk-size 8k \
			--max-sessions $((sessions + 8)) --max-sessions-per-peer $((sessions + 8)) \
			-s "/tmp/srq-$1" --log-level warn >"$run/A-server-$1.log" 2>&1 &
		echo $!
	}
	shared=$(srv 1235 "$srq")
	own=$(srv 1236 0)
	sleep 2
	kill -0 "$shared" "$own" || { cat "$run"/A-server-*.log; exit 1; }
	{ mem "$shared" shared-idle; mem "$own" own-idle; } >"$run/mem"
	kg_signal A-ready
	kg_wait "mapped B-done" 900
	[ -e "$run/B-done" ] && { cat "$run"/A-server-*.log >&2; exit 1; }
	sleep 2
	{ mem "$shared" shared-mapped; mem "$own" own-mapped; } >>"$run/mem"
	kg_signal A-measured
	for n in $(seq $((2 * runs))); do
		kg_wait "go-$n B-done" 600
		[ -e "$run/B-done" ] && break
		kb_cpu >"$run/A-$n.start"
		kg_signal "ack-$n"
		kg_wait "end-$n" 600
		kb_cpu >"$run/A-$n.end"
		kg_signal "ackend-$n"
	done
	kg_wait B-done 900
	kill "$shared" "$own"
	wait
	cat "$run"/A-server-*.log >&2
	exit 0
fi
trap 'kg_signal B-done' EXIT
kg_load_client || exit 1
kg_wait A-ready 120 || exit 1
declare -A first
for port in 1235 1236; do
	for i in $(seq "$sessions"); do
		d=$(kg_map "p$port-s$i" 198.18.0.1 "f$i" "$port") || exit 1
		[ "$i" = 1 ] && first[$port]=$d
	done
done
for port in 1235 1236; do
	dd if=/dev/zero of="${first[$port]}" bs=1M count=4 oflag=direct status=none || exit 1
done
kg_signal mapped
kg_wait A-measured 120 || exit 1
n=0
for r in $(seq "$runs"); do
	for port in 1235 1236; do
		n=$((n + 1))
		kb_b_run "$n" "$port" "${first[$port]}" "$rw" "$bs" "$qd" "$dur" 4M
	done
done
for d in /sys/block/rnbd*; do echo normal >"$d/rnbd/unmap_device"; done
dmesg | grep -cE 'BUG:|Oops|WARNING:' >"$run/B-oops" || true
EOF
chmod +x "$guest"

args="$run $PWD/build-release $PWD $RUNS $DURATION $SESSIONS $SRQ $BS $QD $RW"
"$vm" pair --kmods --mem 2048 --timeout $((600 + 4 * RUNS * (DURATION + 20))) --share "$run" \
	--share-ro "$PWD" --a "$guest A $args" --b "$guest B $args" >"$run/pair.log" 2>&1 ||
	{ cat "$run/pair.log"; echo "bench: the guests failed" >&2; exit 1; }
[ -s "$run/order" ] && [ -s "$run/mem" ] || { cat "$run/pair.log"; echo "bench: no runs" >&2; exit 1; }

date=$(date -u +%Y-%m-%d)
png=bench/plots/kernel-rnbd-srq-$date.png
$record || png=$run/plot.png # the plot goes into bench/plots with --record only
report=$(/usr/bin/python3 - "$run" "$png" "$SESSIONS" <<'EOF'
import json, statistics, sys
run, png, sessions = sys.argv[1], sys.argv[2], int(sys.argv[3])
hz = 100
mem = {}
for line in open(run + "/mem"):
    name, rss, threads = line.split()
    mem[name] = (int(rss), int(threads))
rows = {"1235": [], "1236": []}
for line in open(run + "/order"):
    n, port = line.split()
    j = json.load(open("%s/fio-%s.json" % (run, n)))["jobs"][0]
    ios = j["read"]["total_ios"] + j["write"]["total_ios"]
    secs = j["job_runtime"] / 1000.0
    a = (int(open("%s/A-%s.end" % (run, n)).read()) - int(open("%s/A-%s.start" % (run, n)).read())) / hz
    b = (int(open("%s/B-%s.end" % (run, n)).read()) - int(open("%s/B-%s.start" % (run, n)).read())) / hz
    rows[port].append((ios / secs, (a + b) * 1e6 / ios))
med = {p: [statistics.median(r[i] for r in v) for i in range(2)] for p, v in rows.items()}
s, o = med["1235"], med["1236"]
si, sm = mem["shared-idle"], mem["shared-mapped"]
oi, om = mem["own-idle"], mem["own-mapped"]
ps, po = (sm[0] - si[0]) / sessions, (om[0] - oi[0]) / sessions
print("| server RSS, no session (KiB) | %d | %d | |" % (si[0], oi[0]))
print("| server RSS, %d sessions (KiB) | %d | %d | %.2fx |" % (sessions, sm[0], om[0], sm[0] / om[0]))
print("| RSS per session (KiB) | %.0f | %.0f | %.2fx |" % (ps, po, ps / po if po else 0))
print("| server threads, %d sessions | %d | %d | |" % (sessions, sm[1], om[1]))
print("| IOPS (fio on one device) | %.0f | %.0f | %.2fx |" % (s[0], o[0], s[0] / o[0]))
print("| both guests' CPU us per IO | %.1f | %.1f | %.2fx |" % (s[1], o[1], s[1] / o[1]))
print("RUNS " + " ".join("%s:%.0f" % ("shared" if p == "1235" else "own", r[0])
                          for p, v in rows.items() for r in v))
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
names = ["shared receive queue", "receive queue per connection"]
ax[0].bar(names, [ps, po], color=["#3366aa", "#888888"])
ax[0].set_ylabel("server RSS per session (KiB)")
ax[0].set_title("%d kernel rnbd-client sessions" % sessions)
ax[1].bar(names, [s[0], o[0]], color=["#3366aa", "#888888"])
ax[1].set_ylabel("IOPS (median)")
for a in ax:
    a.tick_params(axis="x", labelsize=8)
fig.tight_layout()
fig.savefig(png, dpi=100)
EOF
)
echo "$report"
oops=$(cat "$run/B-oops" 2>/dev/null || echo "?")
$record || exit 0
cat >>bench/RESULTS.md <<MD

### $date Shared receive queues with the kernel's rnbd-client (soft-RoCE, two guests)

Machine: $(machine); guests Linux $(cut -d' ' -f1 /var/tmp/rtrs-vm/image/version) under TCG (1 vCPU each), rxe on a virtual cable.
Command: \`RUNS=$RUNS DURATION=$DURATION SESSIONS=$SESSIONS SRQ=$SRQ BS=$BS QD=$QD RW=$RW bench/kernel-rnbd-srq.sh --record\`
(two rnbd-servers of one release build in guest A, \`--srq-depth $SRQ\` and \`--srq-depth 0\`, both \`--queue-depth 512 --chunk-size 8k\`
(4 MiB of chunks a session, registered and so resident, the same in both); the kernel's rnbd-client
in guest B maps $SESSIONS devices from each, one session apiece (an admin and one IO connection); RSS from
/proc/PID/status 2 s after the last map; the devices are 4 MiB files on A's tmpfs; fio \`--rw=$RW --bs=$BS --iodepth=$QD\` on the first device of each,
alternating, medians of $RUNS; CPU: both guests' non-idle time per IO). Kernel warnings or oopses in B: $oops.
Plot: [$(basename "$png")](plots/$(basename "$png")).

| measurement | shared receive queue | receive queue per connection | shared / own |
|---|---|---|---|
$(grep '^|' <<<"$report")

Runs (IOPS): $(grep '^RUNS' <<<"$report" | cut -d' ' -f2-).
MD
echo "recorded in bench/RESULTS.md and $png"
