#!/usr/bin/env bash
# The cost of bounding the send queue on tcp (issue 13): since then every
# send asks the tcp provider for a completion, which the connection's
# thread reads, so that no more than the connection's tx depth is ever
# queued behind a peer that stops reading. This runs the same rtrs-perf
# load with the build before that change (BASE, default 10c00f4^) and the
# current tree, alternating, and compares the CPU time per IO summed over
# client and server (utime + stime of both processes) and the throughput.
# Each number is the median of RUNS runs of DURATION seconds; with --record
# the section is appended to bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
DURATION=${DURATION:-5}
BASE=${BASE:-10c00f4^}
record=false
[ "${1:-}" = --record ] && record=true

. bench/lib.sh

base_src=$(mktemp -d /var/tmp/rtrs-bench-base.XXXXXX)
trap 'git worktree remove --force "$base_src" >/dev/null 2>&1 || rm -rf "$base_src"' EXIT
git worktree add --detach "$base_src" "$BASE" >/dev/null 2>&1
meson setup "$base_src/build" "$base_src" -Dbuildtype=release >/dev/null
meson compile -C "$base_src/build" tools/rtrs-perf >/dev/null
base_perf=$base_src/build/tools/rtrs-perf

# one PERF MODE SIZE QD: "ops/s cpu-us-per-io" over client and server.
one() {
	python3 - "$@" "$DURATION" <<'PY'
import json, os, re, subprocess, sys, time
perf, mode, size, qd, dur = sys.argv[1:6]
srv = subprocess.Popen([perf, "server", "--addr", "127.0.0.1", "--port", "0",
                        "--queue-depth", "128", "--chunk-size", "256k"],
                       stdout=subprocess.PIPE, text=True)
line = srv.stdout.readline()
port = re.search(r"port (\d+)", line).group(1)
tick = os.sysconf("SC_CLK_TCK")
def ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
t0 = ticks(srv.pid)
clt = subprocess.Popen([perf, "client", "--dst", f"127.0.0.1:{port}", "--mode", mode,
                        "--io-size", size, "--queue-depth", qd, "--duration", dur, "--json"],
                       stdout=subprocess.PIPE, text=True)
out = clt.stdout.read()
_, status, ru = os.wait4(clt.pid, 0)
t1 = ticks(srv.pid)
srv.terminate()
srv.wait()
r = json.loads(out)
assert status == 0 and r["errors"] == 0 and r["bad"] == 0, out
cpu = ru.ru_utime + ru.ru_stime + (t1 - t0) / tick
print(r["ops_per_sec"], cpu * 1e6 / r["ops"])
PY
}

declare -A ops cpu
cases=("write 4k 64" "read 4k 64" "write 128k 16")
for c in "${cases[@]}"; do
	for b in base new; do ops[$b:$c]= cpu[$b:$c]=; done
	for _ in $(seq "$RUNS"); do
		for b in base new; do
			p=$perf
			[ $b = base ] && p=$base_perf
			read -r o u < <(one "$p" $c)
			ops[$b:$c]+="$o "
			cpu[$b:$c]+="$u "
		done
	done
done

table() {
	echo "| load | before: IO/s | before: CPU us/IO | bounded: IO/s | bounded: CPU us/IO | CPU ratio |"
	echo "|---|---|---|---|---|---|"
	for c in "${cases[@]}"; do
		bo=$(tr ' ' '\n' <<<"${ops[base:$c]}" | grep . | median)
		bc=$(tr ' ' '\n' <<<"${cpu[base:$c]}" | grep . | median)
		no=$(tr ' ' '\n' <<<"${ops[new:$c]}" | grep . | median)
		nc=$(tr ' ' '\n' <<<"${cpu[new:$c]}" | grep . | median)
		printf '| %s | %.0f | %.2f | %.0f | %.2f | %.2fx |\n' "$c" "$bo" "$bc" "$no" "$nc" \
			"$(python3 -c "print($nc / $bc)")"
	done
}
out=$(table)
echo "$out"
if $record; then
	{
		echo
		echo "### $(date +%F) Bounded send queues on tcp: CPU per IO before and after"
		echo
		echo "Machine: $(machine). Command: \`RUNS=$RUNS DURATION=$DURATION bench/send-bound-cost.sh\`"
		echo "(rtrs-perf client and server on 127.0.0.1, builds before and after the send bound"
		echo "($BASE vs $(git rev-parse --short HEAD)), alternating; medians of $RUNS runs of ${DURATION} s;"
		echo "CPU = utime + stime of client and server per IO)."
		echo
		echo "$out"
	} >>bench/RESULTS.md
fi
