# Named results of the QEMU guest suites (sourced by verbs-suite.sh and
# kernel-interop-suite.sh):
#   result NAME STATUS [DETAIL]   0 passed, 77 skipped, else failed
#   suite_end                     prints "N passed, N failed, N skipped" and
#                                 exits 1 if any failed, else 77 if any
#                                 skipped, else 0
passed=0 failed=0 skipped=0

result() {
	if [ "$2" -eq 0 ]; then
		passed=$((passed + 1)); echo "ok   $1${3:+ $3}"
	elif [ "$2" -eq 77 ]; then
		skipped=$((skipped + 1)); echo "SKIP $1${3:+ $3}"
	else
		failed=$((failed + 1)); echo "FAIL $1 ${3:-(exit $2)}"
	fi
}

suite_end() {
	echo "$passed passed, $failed failed, $skipped skipped"
	[ "$failed" -eq 0 ] || exit 1
	[ "$skipped" -eq 0 ] || exit 77
	exit 0
}
