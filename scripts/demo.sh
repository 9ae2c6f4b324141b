#!/usr/bin/env bash
# The demo: builds everything, then
#  1. RTRS: a server on 127.0.0.1 and a client session that verifies every
#     byte it moves;
#  2. RNBD as a block device: rnbd-server exports a file, nbdkit's rnbd plugin
#     maps it over two paths (two loopback source addresses, policy
#     round-robin so that both carry IO) and serves it as an NBD export,
#     qemu-img converts a disk image onto it and compares, the server's file
#     is checked against the image, and each path's share of the IO is shown.
# Installs only what it needs (scripts/install-deps.sh --demo).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --demo

[ -f build/build.ninja ] || meson setup build >/dev/null
meson compile -C build >/dev/null
perf=build/tools/rtrs-perf

out=$(mktemp)
dir=$(mktemp -d /var/tmp/rnbd-demo.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$out" "$dir"
}
trap cleanup EXIT

"$perf" server --addr 127.0.0.1 --port 0 --quiet >"$out" &
pids+=($!)
for _ in $(seq 100); do grep -q "port" "$out" && break; sleep 0.05; done
port=$(grep -o 'port [0-9]*' "$out" | cut -d' ' -f2)
[ -n "$port" ] || { echo "demo: the server did not start" >&2; exit 1; }

echo "RTRS server listening on 127.0.0.1:$port (tcp fabric)."
echo "A client session connects one path: an admin connection plus one IO"
echo "connection per CPU, then keeps 64 requests in flight for 2 s per run."
echo
total=0
for mode in write read; do
	for size in 4096 65536 126976; do
		line=$("$perf" client --server "127.0.0.1:$port" --mode "$mode" --io-size "$size" \
			--queue-depth 64 --duration 2 --verify --json)
		read -r ops gbs p50 p99 errs bad < <(python3 -c '
import json, sys
r = json.loads(sys.argv[1])
print(r["ops"], r["gb_per_sec"], r["lat_us"]["p50"], r["lat_us"]["p99"], r["errors"], r["bad"])' "$line")
		printf '%-5s %7d B: %8d IOs verified, %6.3f GB/s, latency p50 %5d us, p99 %5d us, errors %d, bad IOs %d\n' \
			"$mode" "$size" "$ops" "$gbs" "$p50" "$p99" "$errs" "$bad"
		[ "$errs" = 0 ] && [ "$bad" = 0 ] || { echo "demo: verification failed" >&2; exit 1; }
		total=$((total + ops * size))
	done
done
echo
echo "Moved $((total / 1000000)) MB through RTRS; every byte was checked on arrival."

# ---- RNBD: a file on the server as a block device ----------------------------
echo
size=$((256 << 20))
truncate -s "$size" "$dir/disk.img"
build/daemons/rnbd-server --addr 127.0.0.1 --port 0 --dev-search-path "$dir" \
	>"$dir/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q 'listening on port' "$dir/server.log" && break; sleep 0.05; done
rport=$(grep -o 'port [0-9]*' "$dir/server.log" | cut -d' ' -f2)
[ -n "$rport" ] || { echo "demo: rnbd-server did not start" >&2; exit 1; }
nbdkit -f -v -U "$dir/nbd.sock" build/nbdkit/nbdkit-rnbd-plugin.so session=demo \
	server="127.0.0.2@127.0.0.1:$rport" server="127.0.0.3@127.0.0.1:$rport" policy=round-robin \
	device=disk.img control="$dir/client.sock" >"$dir/nbdkit.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -S "$dir/nbd.sock" ] && break; sleep 0.05; done
uri="nbd+unix:///disk.img?socket=$dir/nbd.sock"
echo "rnbd-server exports $dir/disk.img ($((size >> 20)) MiB); nbdkit maps it through"
echo "session \"demo\" over two paths (from 127.0.0.2 and 127.0.0.3) and serves it as $uri"
echo "The session's policy is round-robin: requests take the paths in turn. (The default,"
echo "min-inflight, sends a request to the path with the fewest in flight, the first on a tie:"
echo "at the low queue depth qemu-img reaches here, that leaves the second path idle.)"
nbdinfo "$uri" | grep -E 'export-size|can_(flush|fua|trim|zero|multi_conn)' | sed 's/^/  /'

# A disk image: 192 MiB of random data and a zero tail.
head -c $((192 << 20)) /dev/urandom >"$dir/image.raw"
truncate -s "$size" "$dir/image.raw"
start=$(date +%s.%N)
qemu-img convert -n -f raw -O raw "$dir/image.raw" "$uri"
end=$(date +%s.%N)
qemu-img compare -q -f raw -F raw "$dir/image.raw" "$uri" ||
	{ echo "demo: qemu-img compare found a difference" >&2; exit 1; }
img_sum=$(sha256sum <"$dir/image.raw" | cut -c1-16)
dev_sum=$(sha256sum <"$dir/disk.img" | cut -c1-16)
[ "$img_sum" = "$dev_sum" ] || { echo "demo: the server's file differs" >&2; exit 1; }
paths_up=$(grep -c 'path connected' "$dir/server.log" || true)
python3 -c "print(f'qemu-img convert: {$size / 2**20:.0f} MiB onto the RNBD device in {$end - $start:.2f} s')"
echo "qemu-img compare: images are identical"
echo "the server saw $paths_up paths of session demo connect (the nbdkit plugin checks the"
echo "server with one session before nbdkit starts serving, then connects for good):"
grep 'path connected' "$dir/server.log" | sed -E 's/^[0-9T:.-]+ //; s/^rtrs info: /  /'
echo "sha256 of the image $img_sum... = sha256 of the server's file $dev_sum..."
echo
echo "the plugin's session, from its control socket (rnbd client list paths):"
build/tools/rnbd --socket "$dir/client.sock" client list paths | sed 's/^/  /'
# Each path's share, from the same method as JSON: round-robin gives both some.
build/tools/rnbd --socket "$dir/client.sock" -o json client list paths | python3 -c '
import json, sys
paths = [p for s in json.load(sys.stdin) for p in s["paths"]]
total = sum(p["reads"] + p["writes"] for p in paths) or 1
share = ["path %d (from %s) %.0f %%" % (p["index"], p["src"], 100.0 * (p["reads"] + p["writes"]) / total)
         for p in paths]
print("round-robin: of the requests, " + " and ".join(share))
idle = ["path %d" % p["index"] for p in paths if p["reads"] + p["writes"] == 0]
if idle or len(paths) != 2:
    sys.exit("demo: " + (", ".join(idle) or "a path") + " carried no IO")'
echo "(docs/management.md: the same with -o json, paths added and removed at run time, metrics)"
