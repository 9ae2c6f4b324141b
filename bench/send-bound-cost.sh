#!/usr/bin/env bash
# The cost of bounding the send queue on tcp (issue 13): since then every
# send asks the tcp provider for a completion, which the connection's
# thread reads, so that no more than the connection's tx depth is ever
# queued behind a peer that stops reading. The build before that change
# (BASE, default 10c00f4^) against the tree, alternating, through
# bench/compare-builds.sh; --record adds the result to bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export BASE=${BASE:-10c00f4^}
export LOADS=${LOADS:-write 4k 64;read 4k 64;write 128k 16}
if [ "${1:-}" = --record ]; then
	exec bench/compare-builds.sh --record send-bound \
		"Bounded send queues on tcp: CPU per IO before and after"
fi
exec bench/compare-builds.sh
