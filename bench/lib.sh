# Shared by the bench scripts, sourced from the top of the tree: installs
# what is needed, builds the release tree, and gives $perf (rtrs-perf),
# $cycle (bench/mr-cycle),
# median (of numbers on stdin) and machine (a line for RESULTS.md).
scripts/install-deps.sh
[ -f build-release/build.ninja ] || meson setup build-release -Dbuildtype=release >/dev/null
meson compile -C build-release >/dev/null
perf=$PWD/build-release/tools/rtrs-perf
cycle=$PWD/build-release/bench/mr-cycle

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# base_tree REV [TARGET...]: REV in a scratch worktree, $base_src, with a
# release build in $base_src/build (TARGETs compiled; all without); the
# worktree goes when the script exits (its EXIT trap).
base_tree() {
	local rev=$1; shift
	base_src=$(mktemp -d /var/tmp/rtrs-bench-base.XXXXXX)
	trap 'git worktree remove --force "$base_src" >/dev/null 2>&1 || rm -rf "$base_src"' EXIT
	git worktree add --detach "$base_src" "$rev" >/dev/null 2>&1
	meson setup "$base_src/build" "$base_src" -Dbuildtype=release >/dev/null
	meson compile -C "$base_src/build" "$@" >/dev/null
}

machine() {
	echo "$(nproc) vCPU, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r), liburing $(pkg-config --modversion liburing)"
}

# Background processes of a loopback benchmark: start them with "... &
# pids+=($!)"; they and $tmp go when the script exits.
bench_processes() {
	tmp=$(mktemp -d)
	pids=()
	trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
}

# The block benchmarks' fio: built from the source of Debian's fio
# (bench/fio-build.sh), with the RNBD engine built against it into
# build-release; sets $fio and $engine. Also python3-matplotlib for the plots.
fio_with_engine() {
	local src
	src=$(bench/fio-build.sh)
	fio=$src/fio
	dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q "install ok installed" ||
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			python3-matplotlib >/dev/null
	meson configure build-release -Dfio_src="$src" >/dev/null
	meson compile -C build-release >/dev/null
	engine=$PWD/build-release/bench/rnbd-fio.so
}

# bench_guest RUN VM-RUN-ARGS...: tests/vm/rtrs-vm run VM-RUN-ARGS... into
# RUN/guest.log, booted once more when the guest gave no "CHECK" line at
# all (a TCG boot now and then dies before its init); exits, with the log,
# when the guest failed: an exit status, a "CHECK name FAIL" line, or no
# RUN/order (the runs it made).
bench_guest() {
	local run=$1 rc attempt
	shift
	for attempt in 1 2; do
		rc=0
		tests/vm/rtrs-vm run "$@" >"$run/guest.log" 2>&1 || rc=$?
		[ "$rc" -eq 125 ] && ! grep -q '^CHECK' "$run/guest.log" || break
		echo "bench: the guest gave no result; booting it again" >&2
	done
	grep '^CHECK' "$run/guest.log" || true
	if [ "$rc" -ne 0 ] || grep -q '^CHECK .* FAIL' "$run/guest.log" || [ ! -s "$run/order" ]; then
		cat "$run/guest.log"
		echo "bench: the guest failed (exit $rc)" >&2
		exit 1
	fi
}
