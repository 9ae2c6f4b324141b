#!/usr/bin/env bash
# RNBD through the NBD front end against nbdkit's own plugins, the same fio
# job (nbd engine, 4 KiB random read/write 50/50, QD 32) in the same run:
#   memory: fio -> nbdkit rnbd plugin (unix socket) -> RTRS/tcp -> rnbd-server
#           memory device, against fio -> nbdkit memory plugin over NBD/TCP
#           (goal >= 1.5x);
#   file:   the same chain to a file export, against nbdkit's file plugin
#           exporting the same file over NBD/TCP (goal >= 0.8x).
# Runs alternate; each number is the median of RUNS runs of DURATION s.
# With --record the section is appended to bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
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
sleep 2

iops() { # uri: prints the IOPS of one run
	fio --name=bench --ioengine=nbd --uri="$1" --rw=randrw --bs=4k --size="$size" \
		--iodepth=32 --runtime="$DURATION" --time_based --output-format=json \
		--output="$tmp/fio.json" >/dev/null 2>&1
	python3 -c "import json; j = json.load(open('$tmp/fio.json'))['jobs'][0]
assert j['error'] == 0
print(j['read']['iops'] + j['write']['iops'])"
}

declare -A uri=(
	[rnbd-mem]="nbd+unix:///mem0?socket=$tmp/rnbd.sock"
	[nbdkit-mem]="nbd://127.0.0.1:$base/"
	[rnbd-file]="nbd+unix:///disk.img?socket=$tmp/rnbd.sock"
	[nbdkit-file]="nbd://127.0.0.1:$((base + 1))/"
)
declare -A res
for pair in "rnbd-mem nbdkit-mem" "rnbd-file nbdkit-file"; do
	set -- $pair
	for _ in $(seq "$RUNS"); do
		iops "${uri[$1]}" >>"$tmp/$1"
		iops "${uri[$2]}" >>"$tmp/$2"
	done
	res[$1]=$(median <"$tmp/$1")
	res[$2]=$(median <"$tmp/$2")
done

ratio() { python3 -c "print(f'{$1 / $2:.2f}x')"; }
report=$(cat <<MD

### $(date -u +%Y-%m-%d) RNBD through nbdkit vs nbdkit's own plugins, loopback

Machine: $(machine). Command: \`RUNS=$RUNS DURATION=$DURATION bench/rnbd-vs-nbdkit.sh\`
(fio nbd engine, 4 KiB randrw 50/50, QD 32, medians of $RUNS alternating runs of ${DURATION} s;
nbdkit --threads 64 for every export).

| export | rnbd (fio -> nbdkit rnbd plugin -> RTRS tcp -> rnbd-server) | nbdkit plugin over NBD/TCP | ratio | goal |
|---|---|---|---|---|
| memory | $(printf %.0f "${res[rnbd-mem]}") IOPS | $(printf %.0f "${res[nbdkit-mem]}") IOPS (memory) | $(ratio "${res[rnbd-mem]}" "${res[nbdkit-mem]}") | >= 1.5x |
| file | $(printf %.0f "${res[rnbd-file]}") IOPS | $(printf %.0f "${res[nbdkit-file]}") IOPS (file) | $(ratio "${res[rnbd-file]}" "${res[nbdkit-file]}") | >= 0.8x |
MD
)
echo "$report"
if $record; then
	echo "$report" >>bench/RESULTS.md
fi
