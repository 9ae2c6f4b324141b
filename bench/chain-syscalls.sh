#!/usr/bin/env bash
# Where the chains' kernel time goes (issue 17): the block chains of
# bench/block-chains.sh (4 KiB randrw 50/50, QD 32) and the raw loop, each
# process watched by perf stat: its system calls per IO by kind and its
# context switches per IO, next to its CPU time per IO.
#   rnbd-mem     fio (rnbd engine) -> rnbd-server memory
#   nbdkit-mem   fio (nbd) -> nbdkit memory
#   rnbd-file    fio (rnbd engine) -> rnbd-server, a file export
#   nbdkit-file  fio (nbd) -> nbdkit file plugin, the same file
#   raw-write, raw-read  bench/raw-loop at the same QD
# perf stat's counting costs CPU in every system call: the CPU figures here
# are well above block-chains.sh's (which runs without it), and compare only
# within one run of this script. RUNS (3) rounds of DURATION (8) s,
# the window DURATION - 3 s from 1.5 s in; --record appends the section to
# bench/RESULTS.md with its plot in bench/plots/.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
DURATION=${DURATION:-8}
QD=${QD:-32}
record=false
[ "${1:-}" = --record ] && record=true
[ "$DURATION" -ge 5 ] || { echo "DURATION must be at least 5 s (the window is DURATION - 3)" >&2; exit 2; }
command -v perf >/dev/null || { echo "perf is needed (linux-perf)" >&2; exit 2; }

. bench/lib.sh
fio_with_engine

bench_processes
size=1G
dd if=/dev/zero of="$tmp/disk.img" bs=1M count=1024 conv=notrunc status=none
"$PWD/build-release/daemons/rnbd-server" --port 0 --dev-search-path "$tmp" \
	--mem-device "mem0:$size" --quiet >"$tmp/server.log" 2>&1 &
pids+=($!)
spid=$!
base=$((20000 + $$ % 20000))
nbdkit -f --threads 64 -i 127.0.0.1 -p "$base" memory "$size" >"$tmp/nbdkit-mem.log" 2>&1 &
pids+=($!)
mempid=$!
nbdkit -f --threads 64 -i 127.0.0.1 -p $((base + 1)) file "$tmp/disk.img" \
	>"$tmp/nbdkit-file.log" 2>&1 &
pids+=($!)
filepid=$!
"$PWD/build-release/bench/raw-loop" server --port 0 >"$tmp/raw.log" 2>&1 &
pids+=($!)
rawpid=$!
for _ in $(seq 100); do
	grep -q 'listening on port' "$tmp/server.log" && grep -q 'listening on port' "$tmp/raw.log" &&
		break
	sleep 0.05
done
port=$(grep -o 'port [0-9]*' "$tmp/server.log" | cut -d' ' -f2)
rport=$(grep -o 'listening on port [0-9]*' "$tmp/raw.log" | grep -o '[0-9]*$')
sleep 1
# The memory exports written whole once: no chain pays for first touches.
"$fio" --name=fill --ioengine=nbd --uri="nbd://127.0.0.1:$base/" --rw=write --bs=1M \
	--size="$size" --iodepth=8 --thread >/dev/null
"$fio" --name=fill --ioengine="external:$engine" --rnbd_server="127.0.0.1:$port" \
	--filename=mem0 --rw=write --bs=1M --size="$size" --iodepth=8 --thread >/dev/null

job=(--name=bench --rw=randrw --rwmixread=50 --bs=4k --size="$size" --iodepth="$QD"
	--runtime="$DURATION" --time_based --thread --norandommap --randrepeat=0
	--output-format=json)
rnbd_job() { # DEVICE SESSION
	printf '%s\n' "$fio" "${job[@]}" --ioengine="external:$engine" \
		--rnbd_server="127.0.0.1:$port" --rnbd_session="$2" --filename="$1"
}
nbd_job() { # URI
	printf '%s\n' "$fio" "${job[@]}" --ioengine=nbd --uri="$1"
}
raw_job() { # MODE
	printf '%s\n' "$PWD/build-release/bench/raw-loop" client --dst "127.0.0.1:$rport" \
		--mode "$1" --size 4096 --queue-depth "$QD" --duration "$DURATION" --json
}
python3 - "$tmp/spec.json" "$RUNS" "$QD" "$((DURATION - 3))" "$spid" "$mempid" "$filepid" \
	"$rawpid" \
	"$(rnbd_job mem0 sys-mem | paste -sd'\t')" \
	"$(nbd_job "nbd://127.0.0.1:$base/" | paste -sd'\t')" \
	"$(rnbd_job disk.img sys-file | paste -sd'\t')" \
	"$(nbd_job "nbd://127.0.0.1:$((base + 1))/" | paste -sd'\t')" \
	"$(raw_job write | paste -sd'\t')" \
	"$(raw_job read | paste -sd'\t')" <<'PY'
import json, sys
out, runs, qd, window = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
srv, mem, fil, raw = map(int, sys.argv[5:9])
cmds = [a.split("\t") for a in sys.argv[9:]]
chains = [
    ("rnbd-mem", "fio rnbd engine -> rnbd-server memory", "fio", {"rnbd-server": srv}),
    ("nbdkit-mem", "fio nbd -> nbdkit memory", "fio", {"nbdkit": mem}),
    ("rnbd-file", "fio rnbd engine -> rnbd-server file", "fio", {"rnbd-server": srv}),
    ("nbdkit-file", "fio nbd -> nbdkit file", "fio", {"nbdkit": fil}),
    ("raw-write", "raw io_uring loop, 4 KiB writes", "ops", {"raw-loop": raw}),
    ("raw-read", "raw io_uring loop, 4 KiB reads", "ops", {"raw-loop": raw}),
]
json.dump({"runs": runs, "syscalls": window,
           "title": "4 KiB randrw 50/50, QD %s, loopback: system calls per IO" % qd,
           "chains": [{"name": n, "label": l, "kind": k, "procs": p, "cmd": c}
                      for (n, l, k, p), c in zip(chains, cmds)]}, open(out, "w"))
PY
day=$(date -u +%Y-%m-%d)
plot=bench/plots/chain-syscalls-$day${TAG:+-$TAG}.png
/usr/bin/python3 bench/chains.py "$tmp/spec.json" "$tmp/out.json"

report=$(/usr/bin/python3 - "$tmp/out.json" "$RUNS" "$DURATION" "$QD" "$(machine)" "$plot" "$day" \
	"$tmp/plot.png" <<'PY'
import json, sys
o = json.load(open(sys.argv[1]))
runs, dur, qd, machine, plot, day, png = sys.argv[2:9]
sys.path.insert(0, "bench")
from chains import SYSCALLS as kinds
print()
print("### %s Where the chains' kernel time goes: system calls per IO, loopback tcp" % day)
print()
print("Machine: %s. Command: `RUNS=%s DURATION=%s QD=%s bench/chain-syscalls.sh` (4 KiB randrw "
      "50/50, QD %s, the chains of bench/block-chains.sh and the raw loop, medians of %s rounds; "
      "each process watched by `perf stat -p` over %d s from 1.5 s into the run; CPU per IO = "
      "utime + stime over the run, raised by the counting in every system call: "
      "compare it only within this table). Plot: `%s`."
      % (machine, runs, dur, qd, qd, runs, int(dur) - 3, plot))
print()
print("| chain | IO/s | process | CPU us per IO | system calls per IO | of which | context switches per IO |")
print("|---|---|---|---|---|---|---|")
for c in o["chains"]:
    for k, s in sorted(c["sys_per_io"].items(), key=lambda x: x[0] != "client"):
        top = sorted(((s.get(n, 0.0), n) for n in kinds), reverse=True)
        which = ", ".join("%s %.2f" % (n, v) for v, n in top if v >= 0.05)
        print("| %s | %.0f | %s | %.2f | %.2f | %s | %.2f |" % (
            c["label"], c["iops"], k, c["cpu_parts_us_per_io"][k], s.get("syscalls", 0.0),
            which or "-", s.get("context-switches", 0.0)))

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [(c["label"].replace(" -> ", "\n-> ") + ": " + k, c["sys_per_io"][k], c["cpu_parts_us_per_io"][k])
        for c in o["chains"] for k in sorted(c["sys_per_io"], key=lambda x: x != "client")]
fig, (a, b) = plt.subplots(1, 2, figsize=(13, 0.55 * len(rows) + 2))
y = list(range(len(rows)))
left = [0.0] * len(rows)
shown = [n for n in kinds if max(r[1].get(n, 0.0) for r in rows) >= 0.05]
for i, n in enumerate(shown):
    v = [r[1].get(n, 0.0) for r in rows]
    a.barh(y, v, left=left, label=n, color=plt.cm.tab20(i % 20))
    left = [l + x for l, x in zip(left, v)]
rest = [max(r[1].get("syscalls", 0.0) - l, 0.0) for r, l in zip(rows, left)]
a.barh(y, rest, left=left, label="other", color="lightgrey")
a.set_yticks(y, [r[0] for r in rows], fontsize="small")
a.invert_yaxis()
a.set_xlabel("system calls per IO, by kind (median)")
a.legend(fontsize="small")
b.barh(y, [r[2] for r in rows], color="tab:blue", label="CPU us per IO")
b.barh(y, [r[1].get("context-switches", 0.0) * 10 for r in rows], color="tab:orange",
       height=0.3, label="context switches per IO x 10")
b.set_yticks(y, [""] * len(rows))
b.invert_yaxis()
b.set_xlabel("CPU us per IO; context switches per IO x 10")
b.legend(fontsize="small")
fig.suptitle(o["title"])
fig.tight_layout()
fig.savefig(png, dpi=90)
PY
)
echo "$report"
if $record; then
	mkdir -p bench/plots
	cp "$tmp/plot.png" "$plot"
	echo "$report" >>bench/RESULTS.md
	echo "recorded in bench/RESULTS.md, plot $plot"
fi
