#!/usr/bin/env bash
# Runs every test: unit and functional suites in a normal build, in an
# ASan+UBSan build and in a TSan build; the NBD interop suite, the
# functional suite over verbs on soft-RoCE and soft-iWARP in QEMU guests,
# the netns suite, the kernel-interop suite (the kernel's RTRS/RNBD in
# QEMU guests) and the ublk suite (rnbd-clientd's block devices in a guest
# on Linux 6.12) (normal build); then the fuzz smoke run in a clang build.
# The test builds have fault injection (-Dfault_injection=true), which the
# tests that inject faults need; the fuzz build is made as one to ship
# (without it) and also checks that such a build has none of it (suite lint).
# Ends with "N passed, N failed". Under CI=true warnings are errors and a skipped test
# counts as a failure (CI must have every tool).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

werror=false
[ "${CI:-}" = true ] && werror=true
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
# A TSan report fails the test (exit code 66); tests/tsan.supp says why each
# suppression is there.
export TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp second_deadlock_stack=1"

passed=0 failed=0 skipped=0

# run_build DIR CC SUITES... -- MESON_OPTIONS...
run_build() {
	local dir=$1 cc=$2; shift 2
	local suites=() opts=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do suites+=(--suite "$1"); shift; done
	[ $# -gt 0 ] && shift
	opts=("$@" -Dwerror=$werror)
	echo "=== $dir ($cc ${opts[*]})"
	if [ -f "$dir/build.ninja" ]; then
		# Not meson configure: it refuses an option added since the
		# directory was made (fault_injection, for one).
		meson setup --reconfigure "$dir" "${opts[@]}" >/dev/null
	else
		CC=$cc meson setup "$dir" "${opts[@]}" >/dev/null
	fi
	if ! meson compile -C "$dir" >"$dir/compile.log" 2>&1; then
		cat "$dir/compile.log"
		echo "build failed: $dir"
		failed=$((failed + 1))
		return
	fi
	meson test -C "$dir" "${suites[@]}" --print-errorlogs || true
	read -r p f s < <(python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, sys
p = f = s = 0
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    if r in ("OK", "EXPECTEDFAIL"): p += 1
    elif r == "SKIP": s += 1
    else: f += 1
print(p, f, s)
PY
)
	passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
}

# fio from the source of the fio Debian ships, for its RNBD engine's test
# (tests/interop/fio-engine.sh): without it that test skips, which CI counts
# as a failure.
fio_src=$(bench/fio-build.sh) || fio_src=
run_build build gcc unit functional interop verbs netns kernel-interop ublk -- -Dfault_injection=true \
	-Dfio_src="$fio_src"
run_build build-asan gcc unit functional -- -Db_sanitize=address,undefined -Db_lundef=false \
	-Dfault_injection=true
run_build build-tsan gcc unit functional -- -Db_sanitize=thread -Db_lundef=false \
	-Dfault_injection=true
run_build build-fuzz clang fuzz lint -- -Dfuzz=true -Dbuildtype=debug -Dfault_injection=false

if [ "${CI:-}" = true ] && [ "$skipped" -gt 0 ]; then
	echo "CI: $skipped tests were skipped; CI must run everything"
	failed=$((failed + skipped))
	skipped=0
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
