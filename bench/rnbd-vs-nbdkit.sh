#!/usr/bin/env bash
# RNBD against nbdkit's own plugins, 4 KiB random read/write 50/50 at QD 32
# (fio's nbd engine for everything NBD), all in the same run:
#   memory: rnbd-server's memory device, through
#           - rnbd-client perf (librnbd directly, no NBD hop; the same job
#             parameters as the fio job: fio has no engine for librnbd), and
#           - fio -> nbdkit rnbd plugin (unix socket) -> RTRS/tcp,
#           against fio -> nbdkit memory plugin over NBD/TCP (goal >= 1.5x);
#   file:   the same two chains to a file export, against nbdkit's file
#           plugin exporting the same file over NBD/TCP (goal >= 0.8x).
# Runs alternate; each number is the median of RUNS runs of DURATION s.
# With --record the section is appended to bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
DURATION=${DURATION:-8}
record=false
[ "${1:-}" = --record ] && record=true

. bench/lib.sh

bench_processes
size=1G
truncate -s "$size" "$tmp/disk.img"
"$PWD/build-release/daemons/rnbd-server" --port 0 --dev-search-path "$tmp" \
	--mem-device "mem0:$size" --quiet >"$tmp/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q 'listening on port' "$tmp/server.log" && break; sleep 0.05; done
port=$(grep -o 'port [0-9]*' "$tmp/server.log" | cut -d' ' -f2)
nbdkit -f --threads 64 -U "$tmp/rnbd.sock" "$PWD/build-release/nbdkit/nbdkit-rnbd-plugin.so" \
	server="127.0.0.1:$port" session=bench >"$tmp/nbdkit-rnbd.log" 2>&1 &
pids+=($!)
base=$((20000 + $$ % 20000))
nbdkit -f --threads 64 -i 127.0.0.1 -p "$base" memory "$size" >"$tmp/nbdkit-mem.log" 2>&1 &
pids+=($!)
nbdkit -f --threads 64 -i 127.0.0.1 -p $((base + 1)) file "$tmp/disk.img" \
	>"$tmp/nbdkit-file.log" 2>&1 &
pids+=($!)
# The NBD hop on its own: fio to nbdkit's null plugin over a unix socket,
# no data kept. No NBD front end on this machine can beat it.
nbdkit -f --threads 64 -U "$tmp/null.sock" null "$size" >"$tmp/nbdkit-null.log" 2>&1 &
pids+=($!)
sleep 2

iops() { # uri: prints the IOPS of one run
	fio --name=bench --ioengine=nbd --uri="$1" --rw=randrw --bs=4k --size="$size" \
		--iodepth=32 --runtime="$DURATION" --time_based --output-format=json \
		--output="$tmp/fio.json" >/dev/null 2>&1
	python3 -c "import json; j = json.load(open('$tmp/fio.json'))['jobs'][0]
assert j['error'] == 0
print(j['read']['iops'] + j['write']['iops'])"
}

native() { # device: prints the IOPS of one rnbd-client perf run
	"$PWD/build-release/tools/rnbd-client" perf --server "127.0.0.1:$port" --session bench-native \
		--device "$1" --rw randrw --rwmixread 50 --bs 4k --iodepth 32 \
		--runtime "$DURATION" --json >"$tmp/native.json" 2>"$tmp/native.err"
	python3 -c "import json; j = json.load(open('$tmp/native.json'))
assert j['errors'] == 0 and j['bad'] == 0
print(j['iops'])"
}

declare -A uri=(
	[rnbd-mem]="nbd+unix:///mem0?socket=$tmp/rnbd.sock"
	[nbdkit-mem]="nbd://127.0.0.1:$base/"
	[rnbd-file]="nbd+unix:///disk.img?socket=$tmp/rnbd.sock"
	[nbdkit-file]="nbd://127.0.0.1:$((base + 1))/"
	[null]="nbd+unix:///?socket=$tmp/null.sock"
)
declare -A res
for set in "mem mem0" "file disk.img"; do
	set -- $set
	for _ in $(seq "$RUNS"); do
		native "$2" >>"$tmp/native-$1"
		iops "${uri[rnbd-$1]}" >>"$tmp/rnbd-$1"
		iops "${uri[nbdkit-$1]}" >>"$tmp/nbdkit-$1"
		iops "${uri[null]}" >>"$tmp/null"
	done
	for k in native-$1 rnbd-$1 nbdkit-$1; do
		res[$k]=$(median <"$tmp/$k")
	done
done
res[null]=$(median <"$tmp/null")

ratio() { python3 -c "print(f'{$1 / $2:.2f}x')"; }
n() { printf %.0f "$1"; }
# Two hops on the same two vCPUs: their costs per IO add up.
chain() { python3 -c "print(1 / (1 / $1 + 1 / $2))"; }
for set in mem file; do
	res[ceiling-$set]=$(chain "${res[null]}" "${res[native-$set]}")
done
report=$(cat <<MD

### $(date -u +%Y-%m-%d) RNBD (native and through nbdkit) vs nbdkit's own plugins, loopback

Machine: $(machine). Command: \`RUNS=$RUNS DURATION=$DURATION bench/rnbd-vs-nbdkit.sh\`
(4 KiB randrw 50/50, QD 32, medians of $RUNS alternating runs of ${DURATION} s; fio's nbd engine for
every NBD export, nbdkit --threads 64; native: \`rnbd-client perf --rw randrw --bs 4k --iodepth 32\`).

| export | rnbd native (rnbd-client -> RTRS tcp -> rnbd-server) | rnbd through NBD (fio -> nbdkit rnbd plugin -> RTRS tcp) | nbdkit plugin over NBD/TCP (fio) | native / nbdkit | through NBD / nbdkit | goal |
|---|---|---|---|---|---|---|
| memory | $(n "${res[native-mem]}") IOPS | $(n "${res[rnbd-mem]}") IOPS | $(n "${res[nbdkit-mem]}") IOPS (memory) | $(ratio "${res[native-mem]}" "${res[nbdkit-mem]}") | $(ratio "${res[rnbd-mem]}" "${res[nbdkit-mem]}") | >= 1.5x |
| file | $(n "${res[native-file]}") IOPS | $(n "${res[rnbd-file]}") IOPS | $(n "${res[nbdkit-file]}") IOPS (file) | $(ratio "${res[native-file]}" "${res[nbdkit-file]}") | $(ratio "${res[rnbd-file]}" "${res[nbdkit-file]}") | >= 0.8x |

Ceiling of any NBD front end here: fio to nbdkit's null plugin over a unix
socket (the NBD hop with no work behind it) gives $(n "${res[null]}") IOPS. With the RTRS
hop on the same two vCPUs, a front end that cost nothing at all would reach
1 / (1/null + 1/native): $(n "${res[ceiling-mem]}") IOPS for memory ($(ratio "${res[ceiling-mem]}" "${res[nbdkit-mem]}") of nbdkit's memory plugin),
$(n "${res[ceiling-file]}") IOPS for the file ($(ratio "${res[ceiling-file]}" "${res[nbdkit-file]}") of nbdkit's file plugin).
MD
)
echo "$report"
if $record; then
	echo "$report" >>bench/RESULTS.md
fi
