#!/usr/bin/env bash
# rnbd-clientd's ublk device, two builds of rnbd-clientd in ONE QEMU guest
# (Debian's 6.12 backports kernel, ublk_drv): BASE (a git revision, built
# in a scratch worktree) and the tree as it is (build-release), started in
# turn against the same rnbd-server (this tree's, -m mem0:64M, tcp
# on the guest's 127.0.0.1), RUNS times each, alternating. Each turn starts
# that build's rnbd-clientd, maps mem0 as /dev/ublkbN, runs one fio job on
# it and unmaps. Reported per build, medians: IOPS, and CPU time per IO of
# rnbd-clientd, of rnbd-server (utime + stime) and of the whole guest (its
# non-idle time from /proc/stat, fio and ublk's kernel work included); and
# the ratios new / base, overall and pair by pair. Before the runs each
# build writes a random 16 MiB through its device and reads it back equal,
# or the script stops.
#   BASE=6d74a28 bench/ublk-compare-builds.sh [--record]
# --record appends the section to bench/RESULTS.md, with its plot in
# bench/plots/ublk-compare-builds-DATE[-TAG].png.
# Environment: BASE (HEAD~1), RUNS (4), DURATION (fio seconds, 10), BS
# (4k), QD (16), RW (randrw, 50/50), SMP (2, the guest's vCPUs).
set -euo pipefail
cd "$(dirname "$0")/.."
record=false
[ "${1:-}" = --record ] && { record=true; shift; }
[ $# -eq 0 ] || { echo "usage: $0 [--record]" >&2; exit 2; }
BASE=${BASE:-HEAD~1}
RUNS=${RUNS:-4}
DURATION=${DURATION:-10}
BS=${BS:-4k}
QD=${QD:-16}
RW=${RW:-randrw}
SMP=${SMP:-2}
for v in RUNS DURATION QD SMP; do
	[[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "$0: $v: a whole number, at least 1" >&2; exit 2; }
done
[[ "$BS" =~ ^[0-9]+[kKmM]?$ ]] || { echo "$0: BS: a size (4k, 64k, 1m)" >&2; exit 2; }
case "$RW" in read|write|randread|randwrite|rw|randrw) ;;
*) echo "$0: RW: read, write, randread, randwrite, rw or randrw" >&2; exit 2 ;;
esac
base_rev=$(git rev-parse --short "$BASE^{commit}") || { echo "$0: no revision $BASE" >&2; exit 2; }
new_rev=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- lib daemons include || new_rev="$new_rev+"

. bench/lib.sh
dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q "install ok installed" ||
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		python3-matplotlib >/dev/null
vm=tests/vm/rtrs-vm
"$vm" image --bpo >/dev/null

run=$(mktemp -d /var/tmp/rtrs-ublk-ab.XXXXXX)
base_src=$run/base
trap 'git worktree remove --force "$base_src" >/dev/null 2>&1; rm -rf "$run"' EXIT
git worktree add --detach "$base_src" "$base_rev" >/dev/null 2>&1
meson setup "$base_src/build" "$base_src" -Dbuildtype=release -Dfault_injection=false >/dev/null
meson compile -C "$base_src/build" daemons/rnbd-clientd tools/rnbd >/dev/null

cat >"$run/guest.sh" <<'EOF'
#!/usr/bin/env bash
set -u
run=$1 new=$2 base=$3 runs=$4 dur=$5 bs=$6 qd=$7 rw=$8
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
wait_for() { # SECONDS CMD...
	local end=$((SECONDS + $1)); shift
	until "$@" 2>/dev/null; do [ $SECONDS -lt $end ] || return 1; sleep 0.2; done
}
check() { # NAME STATUS [DETAIL]: a failure ends the run
	if [ "$2" -eq 0 ]; then echo "CHECK $1 ok ${3:-}"; else echo "CHECK $1 FAIL ${3:-}"; exit 1; fi
}
ticks() { cut -d')' -f2 "/proc/$1/stat" | awk '{ print $12 + $13 }'; }
busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
[ -e /dev/ublk-control ]; check ublk-control $?
"$new/daemons/rnbd-server" --provider tcp -a 127.0.0.1 -p 1234 -m mem0:64M \
	--log-level info >/tmp/s.log 2>&1 &
spid=$!
wait_for 60 grep -q 'listening on port' /tmp/s.log; check rnbd-server-started $?
head -c 16M /dev/urandom >/tmp/pattern
turn() { # BUILD NAME N: one run of that build's rnbd-clientd; N 0 checks the data instead
	local b=$1 name=$2 n=$3 cpid dev c0 c1 s0 s1 g0 g1
	rm -f /tmp/c.sock
	"$b/daemons/rnbd-clientd" --control /tmp/c.sock --log-level info >"/tmp/c-$name.log" 2>&1 &
	cpid=$!
	wait_for 60 grep -q 'rnbd-clientd ready' "/tmp/c-$name.log"; check "clientd-$name" $?
	"$b/tools/rnbd" --socket /tmp/c.sock --timeout 120000 client map mem0 --session ab \
		--server 127.0.0.1:1234 --provider tcp -o json >/tmp/map.json
	check "map-$name" $?
	dev=$(python3 -c 'import json; print(json.load(open("/tmp/map.json"))["block_device"] or "")')
	[ -b "$dev" ]; check "block-device-$name" $? "($dev)"
	if [ "$n" -eq 0 ]; then
		dd if=/tmp/pattern of="$dev" bs=1M oflag=direct status=none &&
			dd if="$dev" of=/tmp/back bs=1M count=16 iflag=direct status=none &&
			cmp /tmp/pattern /tmp/back
		check "pattern-read-back-equal-$name" $? "(16 MiB, O_DIRECT)"
	else
		c0=$(ticks $cpid) s0=$(ticks $spid) g0=$(busy)
		fio --name=ab --filename="$dev" --rw="$rw" --rwmixread=50 --bs="$bs" \
			--iodepth="$qd" --ioengine=libaio --direct=1 --time_based --runtime="$dur" \
			--size=64M --norandommap --randrepeat=0 --output-format=json \
			>"$run/fio-$name-$n.json" 2>/dev/null
		check "fio-$name-$n" $?
		g1=$(busy) c1=$(ticks $cpid) s1=$(ticks $spid)
		echo "$name $n $((c1 - c0)) $((s1 - s0)) $((g1 - g0))" >>"$run/ticks"
	fi
	"$b/tools/rnbd" --socket /tmp/c.sock client unmap mem0 --session ab >/dev/null
	check "unmap-$name" $?
	kill $cpid
	wait $cpid
}
turn "$base" base 0
turn "$new" new 0
for r in $(seq "$runs"); do
	turn "$base" base "$r"
	turn "$new" new "$r"
done
kill $spid
wait
echo "CLK_TCK $(getconf CLK_TCK)" >>"$run/ticks"
EOF

load=$(cut -d' ' -f1-3 /proc/loadavg)
"$vm" run --bpo --rdma rxe --smp "$SMP" --mem 1536 \
	--timeout $((600 + 2 * RUNS * (DURATION + 60))) --share "$run" --share-ro "$PWD" -- \
	bash "$run/guest.sh" "$run" "$PWD/build-release" "$base_src/build" "$RUNS" "$DURATION" \
	"$BS" "$QD" "$RW" >"$run/guest.log" 2>&1 || true
grep '^CHECK' "$run/guest.log" || true
if grep -q '^CHECK .* FAIL' "$run/guest.log" || ! grep -q '^CLK_TCK' "$run/ticks" 2>/dev/null; then
	tail -n 40 "$run/guest.log"
	echo "ublk-compare-builds: the guest run failed" >&2
	exit 1
fi
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
date=$(date +%F)
png=bench/plots/ublk-compare-builds-$date${TAG:+-$TAG}.png
report=$(/usr/bin/python3 - "$run" "$run/plot.png" "$base_rev" "$new_rev" "$DURATION" <<'EOF'
import json, statistics, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

run, png, base_rev, new_rev, dur = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
lines = open(f"{run}/ticks").read().split("\n")
tck = int([l for l in lines if l.startswith("CLK_TCK")][0].split()[1])
runs = {"base": {}, "new": {}}
for l in lines:
    p = l.split()
    if len(p) != 5:
        continue
    name, n, c, s, g = p[0], int(p[1]), int(p[2]), int(p[3]), int(p[4])
    j = json.load(open(f"{run}/fio-{name}-{n}.json"))["jobs"][0]
    ios = j["read"]["total_ios"] + j["write"]["total_ios"]
    us = 1e6 / tck / ios
    runs[name][n] = (ios / (j["job_runtime"] / 1000), c * us, s * us, g * us)
med = {b: [statistics.median(v[i] for v in runs[b].values()) for i in range(4)] for b in runs}
rows = [("IOPS", 0), ("rnbd-clientd CPU us per IO", 1), ("rnbd-server CPU us per IO", 2),
        ("guest CPU us per IO (all non-idle time)", 3)]
out = [f"| measurement | base {base_rev} | new {new_rev} | new / base |", "|---|---|---|---|"]
for label, i in rows:
    fmt = "%.0f" if i == 0 else "%.1f"
    out.append(f"| {label} | {fmt % med['base'][i]} | {fmt % med['new'][i]} | "
               f"{med['new'][i] / med['base'][i]:.2f}x |")
pairs = sorted(set(runs["base"]) & set(runs["new"]))
out.append("")
out.append("Pair by pair, new / base: rnbd-clientd CPU per IO " +
           " ".join(f"{runs['new'][n][1] / runs['base'][n][1]:.2f}x" for n in pairs) +
           "; guest CPU per IO " +
           " ".join(f"{runs['new'][n][3] / runs['base'][n][3]:.2f}x" for n in pairs) +
           "; IOPS " + " ".join(f"{runs['new'][n][0] / runs['base'][n][0]:.2f}x" for n in pairs) + ".")
print("\n".join(out))

fig, ax = plt.subplots(1, 2, figsize=(9, 3.8))
names = [f"base {base_rev}", f"new {new_rev}"]
ax[0].bar(names, [med["base"][0], med["new"][0]], color=["#999999", "#1f77b4"])
ax[0].set_title("IOPS (median)")
w = 0.38
x = range(3)
labels = ["rnbd-clientd", "rnbd-server", "guest"]
ax[1].bar([i - w / 2 for i in x], [med["base"][i] for i in (1, 2, 3)], w, label=names[0],
          color="#999999")
ax[1].bar([i + w / 2 for i in x], [med["new"][i] for i in (1, 2, 3)], w, label=names[1],
          color="#1f77b4")
ax[1].set_xticks(list(x))
ax[1].set_xticklabels(labels)
ax[1].set_title("CPU us per IO (median)")
ax[1].legend()
fig.suptitle("rnbd-clientd's ublk device, two builds in one guest")
fig.tight_layout()
fig.savefig(png, dpi=100)
EOF
)
section="### $date rnbd-clientd's ublk device: $base_rev against $new_rev, one guest

Machine: $(machine); host load average $load at the start, $load_end at the end; one guest,
Debian's 6.12 backports kernel under TCG ($SMP vCPU, no KVM).
Command: \`BASE=$base_rev RUNS=$RUNS DURATION=$DURATION BS=$BS QD=$QD RW=$RW bench/ublk-compare-builds.sh\`
(medians of $RUNS runs, the two builds' rnbd-clientd alternating against one rnbd-server, tcp on the guest's
127.0.0.1, \`-m mem0:64M\`; fio \`--rw=$RW --rwmixread=50 --bs=$BS --iodepth=$QD --ioengine=libaio --direct=1
--runtime=$DURATION\` on /dev/ublkbN; each build's device first wrote and read back a random 16 MiB, equal).
Plot: \`$png\`.

$report"
echo "$section"
if $record; then
	mkdir -p bench/plots
	cp "$run/plot.png" "$png"
	printf '\n%s\n' "$section" >>bench/RESULTS.md
fi
