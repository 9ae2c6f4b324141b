#!/usr/bin/env bash
# rnbd-server's CPU time per IO, the build before its per-request slots
# (BASE: by default the parent of the commit "rnbd-server: per-request
# slots instead of a calloc/free per IO") against the current tree, in the
# same run: the same rnbd-client perf load (this tree's client) against a
# server of each build, alternating, on a memory device and on a file (page
# cache). CPU = utime + stime of the server process over the run, divided
# by the IOs the client completed. As root, where perf can place uprobes,
# a short extra run per build also counts the server's calls of libc's
# malloc, calloc and realloc per IO (not during the timed runs: a uprobe
# costs microseconds per call), with always_invalidate (the fabric's MR
# registration of the new chunk key allocates) and without. Each number is the median of RUNS runs of
# DURATION seconds; with --record the section is appended to
# bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
DURATION=${DURATION:-5}
if [ -z "${BASE:-}" ]; then
	slots=$(git log --format=%h -1 --fixed-strings \
		--grep='rnbd-server: per-request slots instead of a calloc/free per IO')
	[ -n "$slots" ] || { echo "rnbd-server-cost: no slots commit in this history; set BASE" >&2; exit 1; }
	BASE=$slots^
fi
record=false
[ "${1:-}" = --record ] && record=true

. bench/lib.sh
bench_processes

base_src=$(mktemp -d /var/tmp/rnbd-bench-base.XXXXXX)
probes=""
cleanup_base() {
	[ -z "$probes" ] || perf probe -q -d "$probes:*" >/dev/null 2>&1 || true
	git worktree remove --force "$base_src" >/dev/null 2>&1 || rm -rf "$base_src"
}
trap 'cleanup_base; for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
git worktree add --detach "$base_src" "$BASE" >/dev/null 2>&1
# The source directory named: without it meson would build this tree again.
meson setup "$base_src/build" "$base_src" -Dbuildtype=release >/dev/null
meson compile -C "$base_src/build" daemons/rnbd-server >/dev/null
declare -A server=([base]=$base_src/build/daemons/rnbd-server
		   [new]=$PWD/build-release/daemons/rnbd-server)
client=$PWD/build-release/tools/rnbd-client

size=256M
truncate -s "$size" "$tmp/disk.img"
declare -A port spid
for b in base new; do
	"${server[$b]}" --addr 127.0.0.1 --port 0 --dev-search-path "$tmp" \
		--mem-device "mem0:$size" --quiet >"$tmp/server-$b.log" 2>&1 &
	pids+=($!)
	spid[$b]=$!
	for _ in $(seq 100); do grep -q 'listening on port' "$tmp/server-$b.log" && break; sleep 0.05; done
	port[$b]=$(grep -o 'port [0-9]*' "$tmp/server-$b.log" | cut -d' ' -f2)
done

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# perf_run BUILD DEVICE BS SECONDS: the client's JSON in $tmp/perf.json.
perf_run() {
	"$client" perf --server "127.0.0.1:${port[$1]}" --session "bench-$1" --device "$2" \
		--rw randrw --rwmixread 50 --bs "$3" --iodepth 32 --size "$size" \
		--runtime "$4" --json >"$tmp/perf.json" 2>"$tmp/perf.err"
}

ios() {
	python3 -c "import json; j = json.load(open('$tmp/perf.json'))
assert j['errors'] == 0 and j['bad'] == 0, j
print(j['reads'] + j['writes'], j['iops'])"
}

one() { # build device bs: prints "iops server-cpu-us-per-io"
	local t0 t1 n iops
	t0=$(cpu_ticks "${spid[$1]}")
	perf_run "$1" "$2" "$3" "$DURATION"
	t1=$(cpu_ticks "${spid[$1]}")
	read -r n iops < <(ios)
	python3 -c "print($iops, ($t1 - $t0) / $(getconf CLK_TCK) * 1e6 / $n)"
}

cases=("mem0 4k" "disk.img 4k" "mem0 64k")
declare -A res cpu
for c in "${cases[@]}"; do
	for _ in $(seq "$RUNS"); do
		for b in base new; do
			one "$b" $c >>"$tmp/$b-${c// /-}"
		done
	done
	for b in base new; do
		res[$b:$c]=$(cut -d' ' -f1 "$tmp/$b-${c// /-}" | median)
		cpu[$b:$c]=$(cut -d' ' -f2 "$tmp/$b-${c// /-}" | median)
	done
done

# Allocations per IO, counted by uprobes on libc (root, perf with uprobes).
declare -A allocs
libc=$(ldd "${server[new]}" | awk '/libc.so/ { print $3 }')
group=rnbdbench$$
if [ "$(id -u)" = 0 ] && command -v perf >/dev/null && [ -n "$libc" ] &&
   perf probe -q -x "$libc" -a "$group:m=malloc" -a "$group:c=calloc" -a "$group:r=realloc" \
	>/dev/null 2>&1; then
	probes=$group
	count_allocs() { # build key: allocations per IO of the server of build in allocs[key]
		perf stat -x, -e "$group:m,$group:c,$group:r" -p "${spid[$1]}" -o "$tmp/stat-$2" &
		stat_pid=$!
		sleep 0.5
		perf_run "$1" mem0 4k 2
		kill -INT "$stat_pid"
		wait "$stat_pid" || true
		read -r n _ < <(ios)
		calls=$(awk -F, -v g="$group" '$0 ~ g { s += $1 } END { print s + 0 }' "$tmp/stat-$2")
		allocs[$2]=$(python3 -c "print(f'{$calls / $n:.3f}')")
	}
	for b in base new; do
		count_allocs "$b" "$b"
	done
	# Without always_invalidate: no chunk key is registered per IO (by the fabric).
	for b in base new; do
		kill "${spid[$b]}"
		wait "${spid[$b]}" 2>/dev/null || true
		"${server[$b]}" --addr 127.0.0.1 --port 0 --mem-device "mem0:$size" --quiet \
			--no-invalidate >"$tmp/server-$b-noinv.log" 2>&1 &
		pids+=($!)
		spid[$b]=$!
		for _ in $(seq 100); do grep -q 'listening on port' "$tmp/server-$b-noinv.log" && break; sleep 0.05; done
		port[$b]=$(grep -o 'port [0-9]*' "$tmp/server-$b-noinv.log" | cut -d' ' -f2)
		count_allocs "$b" "$b-noinv"
	done
fi

table() {
	echo "| load (randrw 50/50, QD 32) | before: IO/s | before: server CPU us/IO | slots: IO/s | slots: server CPU us/IO | CPU ratio |"
	echo "|---|---|---|---|---|---|"
	for c in "${cases[@]}"; do
		printf '| %s | %.0f | %.2f | %.0f | %.2f | %.3fx |\n' "$c" "${res[base:$c]}" \
			"${cpu[base:$c]}" "${res[new:$c]}" "${cpu[new:$c]}" \
			"$(python3 -c "print(${cpu[new:$c]} / ${cpu[base:$c]})")"
	done
	if [ -n "${allocs[new]:-}" ]; then
		echo
		echo "Server calls of malloc, calloc and realloc per IO (uprobes on libc, mem0 4k randrw, 2 s,"
		echo "the whole process: librtrs too): before ${allocs[base]}, slots ${allocs[new]};"
		echo "with --no-invalidate (no chunk key registered per IO) before ${allocs[base-noinv]},"
		echo "slots ${allocs[new-noinv]}."
	fi
}
out=$(table)
echo "$out"
if $record; then
	{
		echo
		echo "### $(date +%F) rnbd-server per-request slots: CPU per IO before and after"
		echo
		echo "Machine: $(machine). Command: \`RUNS=$RUNS DURATION=$DURATION bench/rnbd-server-cost.sh\`"
		echo "(rnbd-client perf against an rnbd-server of each build on 127.0.0.1, $BASE vs"
		echo "$(git rev-parse --short HEAD), alternating; medians of $RUNS runs of ${DURATION} s)."
		echo
		echo "$out"
	} >>bench/RESULTS.md
fi
