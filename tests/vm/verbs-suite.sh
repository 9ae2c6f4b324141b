#!/usr/bin/env bash
# The functional suite over RDMA devices (the native rdma-core fabric, provider
# "verbs"), on soft-RoCE (rxe)
# and soft-iWARP (siw), in QEMU guests made by rtrs-vm:
#   - one guest: test-io, test-close, test-peer-death, test-connect,
#     test-reconnect, test-auth, and RNBD's test-rnbd-srv and test-rnbd;
#     test-io-post-fail (test-io --fault-post-fail 3000: a post the
#     provider reports failed after queuing its requests goes only once),
#     client and server through the guest's own RDMA device; test-multipath
#     and test-fence with their paths from three addresses of that device's
#     netdev (198.18.0.1, .11, .12: RTRS_TEST_ADDR, RTRS_TEST_ADDR2 and 3);
#     198.18.0.99 is a dead host (RTRS_TEST_DEAD_ADDR: a permanent neighbour
#     entry with a MAC nobody has, so its SYNs vanish), where test-multipath
#     connects while other connections of its poll group work;
#     then verbs-scale.sh: 50 rtrs-perf sessions of 4 connections, verified,
#     with the server's and the client's threads within the guest's CPUs + 4;
#   - two guests on a virtual cable: rtrs-test-server in guest A, test-io in
#     guest B.
# The same test binaries as on tcp; the provider is chosen at run time.
# Each test in a guest is bounded (run-bounded, 240 s): one that hangs
# prints every thread's stack and is killed; it runs once more, and its
# result says so. Every result carries the test's time.
# Usage: verbs-suite.sh BUILD_DIR [rxe|siw ...]   (default: rxe siw)
# Prints "N passed, N failed, N skipped"; exits 77 when guests cannot be run
# here, or when a test skipped a part it needs fault injection for (a build
# without -Dfault_injection=true) and nothing failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: verbs-suite.sh BUILD_DIR [rxe|siw ...]}" && pwd)
shift
devices=("$@")
[ ${#devices[@]} -gt 0 ] || devices=(rxe siw)
vm=$here/rtrs-vm

if [ "$(id -u)" -ne 0 ]; then
	echo "verbs-suite: needs root (QEMU guests, packages); skipping"
	exit 77
fi
need_siw=false
for d in "${devices[@]}"; do [ "$d" = siw ] && need_siw=true; done
if $need_siw; then img_opt=--siw; else img_opt=; fi
logs=$(mktemp -d /tmp/rtrs-verbs-suite.XXXXXX)
trap 'rm -rf "$logs"' EXIT
if ! "$vm" image $img_opt >"$logs/image.log" 2>&1; then
	cat "$logs/image.log"
	echo "verbs-suite: cannot build the guest image"
	echo "0 passed, 1 failed"
	exit 1
fi

# shellcheck source=suite-results.sh
. "$here/suite-results.sh"

env_common="cd $build && export RTRS_TEST_PROVIDER=verbs RTRS_TEST_SERVER=$build/tests/functional/rtrs-test-server RTRS_PERF=$build/tools/rtrs-perf"
one_guest=(test-io test-close test-peer-death test-connect test-reconnect test-multipath test-fence test-poll
	test-auth test-rnbd-srv test-rnbd test-io-post-fail)

for dev in "${devices[@]}"; do
	# One guest: each test in turn; the guest reports one status per test.
	# The guests' kernel (Debian's) has oopsed in siw's transmit path
	# (siw_tx_hdt) under test-io now and then; a guest whose kernel oopsed
	# there is run once more, after showing the oops, since its results say
	# nothing about ours. Any other oops stands. So is a guest whose kernel
	# locked up (a CPU stuck in the kernel: an RCU stall under test-rnbd on
	# siw, once; rtrs-vm stops such a guest), after showing the report.
	for attempt in 1 2; do
		out=$("$vm" run --rdma "$dev" --timeout 1200 --ip 198.18.0.1/24,198.18.0.11/24,198.18.0.12/24 --share-ro "$here" \
			--share "$build" -- bash -c "$env_common RTRS_TEST_RDMA_DEV=$dev RTRS_TEST_ADDR=198.18.0.1 \
				RTRS_TEST_ADDR2=198.18.0.11 RTRS_TEST_ADDR3=198.18.0.12
			ip neigh replace 198.18.0.99 lladdr 02:00:00:00:00:99 dev eth0 nud permanent &&
				export RTRS_TEST_DEAD_ADDR=198.18.0.99
			for t in ${one_guest[*]}; do
				cmd=./tests/functional/\$t
				[ \$t != test-io-post-fail ] || cmd='./tests/functional/test-io --fault-post-fail 3000'
				for try in 1 2; do
					s=\$SECONDS
					$here/run-bounded 240 \$cmd >/tmp/\$t.log 2>&1
					rc=\$?
					[ \$rc -eq 124 ] || break
					echo \"TIMEOUT \$t (try \$try): where it hung\"
					sed -n '/^run-bounded:/,\$p' /tmp/\$t.log
					tail -n 30 /tmp/\$t.log | grep -v '^#'
				done
				echo \"RESULT \$t \$rc \$((SECONDS - s)) \$try\"
				[ \$rc -eq 0 ] || [ \$rc -eq 124 ] || { grep -m 20 'CHECK(.*) failed' /tmp/\$t.log; tail -n 30 /tmp/\$t.log; }
			done
			s=\$SECONDS
			$here/run-bounded 240 $here/verbs-scale.sh ./tools/rtrs-perf 198.18.0.1 50 3 >/tmp/scale.log 2>&1
			rc=\$?
			tail -n 8 /tmp/scale.log
			echo \"RESULT verbs-scale \$rc \$((SECONDS - s)) 1\"" 2>&1)
		vmrc=$?
		if [ $attempt -eq 1 ] && grep -qE 'console: .*(Oops|BUG: |RIP: )' <<<"$out" &&
			grep -q 'console: .*siw_tx_hdt' <<<"$out"; then
			grep -E 'console: .*(Oops|BUG: |RIP: |Modules linked)' <<<"$out" | sed "s/^/  [$dev] /"
			echo "  [$dev] the guest's kernel oopsed (above): running the guest again"
			continue
		fi
		if [ $attempt -eq 1 ] && grep -q 'guest: kernel lockup' <<<"$out"; then
			grep -E 'RESULT |kernel lockup|console: ' <<<"$out" | sed "s/^/  [$dev] /"
			echo "  [$dev] the guest's kernel locked up (above): running the guest again"
			continue
		fi
		break
	done
	grep -v '^RESULT ' <<<"$out" | sed "s/^/  [$dev] /" | grep -v '^\s*\[.*\] *$' | tail -n 400
	n=0
	while read -r _ t rc secs try; do
		note="(${secs} s)"
		[ "${try:-1}" -eq 1 ] || note="(${secs} s, after a try that timed out: its stacks are above)"
		result "verbs/$dev one guest: $t" "$rc" "$note"
		n=$((n + 1))
	done < <(grep '^RESULT ' <<<"$out")
	[ $n -eq $((${#one_guest[@]} + 1)) ] || result "verbs/$dev one guest: guest finished (vm exit $vmrc)" 1

	# Two guests: server in A, test-io in B over the cable.
	"$vm" pair --rdma "$dev" --timeout 600 --share "$build" \
		--a "$env_common; exec timeout 500 ./tests/functional/rtrs-test-server --provider verbs --addr 198.18.0.1 --port 4790 --queue-depth 512 --store-size 128M --exit-after 1" \
		--b "$env_common RTRS_TEST_ADDR=198.18.0.2 RTRS_TEST_SERVER_AT=198.18.0.1:4790
		     exec timeout 400 ./tests/functional/test-io" >"$logs/pair.log" 2>&1
	rc=$?
	[ $rc -eq 0 ] || tail -n 40 "$logs/pair.log"
	result "verbs/$dev two guests: test-io" "$rc"
done
suite_end
