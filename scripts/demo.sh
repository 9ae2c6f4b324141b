#!/usr/bin/env bash
# The demo: builds librtrs, starts an RTRS server on 127.0.0.1 and drives a
# client session against it. Every byte written is checked by the server and
# every byte read is checked by the client; then it reports what moved.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

[ -f build/build.ninja ] || meson setup build >/dev/null
meson compile -C build >/dev/null
perf=build/tools/rtrs-perf

out=$(mktemp)
server=
cleanup() {
	[ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
	rm -f "$out"
}
trap cleanup EXIT

"$perf" server --addr 127.0.0.1 --port 0 --quiet >"$out" &
server=$!
for _ in $(seq 100); do grep -q "port" "$out" && break; sleep 0.05; done
port=$(grep -o 'port [0-9]*' "$out" | cut -d' ' -f2)
[ -n "$port" ] || { echo "demo: the server did not start" >&2; exit 1; }

echo "RTRS server listening on 127.0.0.1:$port (libfabric tcp provider)."
echo "A client session connects one path: an admin connection plus one IO"
echo "connection per CPU, then keeps 64 requests in flight for 2 s per run."
echo
total=0
for mode in write read; do
	for size in 4096 65536 126976; do
		line=$("$perf" client --dst "127.0.0.1:$port" --mode "$mode" --io-size "$size" \
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
