#!/usr/bin/env bash
# What a DH-HMAC-CHAP NEGOTIATE's key-file lookup costs the server as its
# key file grows (a rack's hosts, one line each): bench/keyfile-lookup
# built against the tree as it is and against BASE (a scratch worktree),
# run alternately, HOSTS lines, THREADS lookups at a time (as NEGOTIATEs of
# a storm of opens arrive). Prints, per file size, lookups/s and CPU time
# per lookup for each build (medians of RUNS) and their ratios.
#
#   BASE=54851d5 RUNS=5 bench/keyfile-lookup.sh
#   PLOT=bench/plots/keyfile-lookup.png ...   (also a plot: CPU per lookup against hosts)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
SECONDS_EACH=${SECONDS_EACH:-2}
THREADS=${THREADS:-4}
HOSTS=${HOSTS:-100 1000 10000}
BASE=${BASE:-HEAD~1}
base_rev=$(git rev-parse --short "$BASE^{commit}") || { echo "$0: no revision $BASE" >&2; exit 2; }

. bench/lib.sh

base_tree "$base_rev"
# The program is this tree's, linked with each tree's libraries (the API it
# uses, rtrs_keyfile_new/lookup, is older than both).
build_one() { # TREE BUILD OUT
	cc -O2 -I"$1/include" -I"$1/lib/rtrs" -I"$1/lib/common" bench/keyfile-lookup.c -o "$3" \
		-Wl,--start-group "$2"/lib/rtrs/*.a "$2"/lib/common/*.a -Wl,--end-group \
		$(pkg-config --libs libcrypto liburing libibverbs librdmacm) -lpthread
}
bin=$base_src/keyfile-bench # goes with the worktree
mkdir -p "$bin"
build_one "$base_src" "$base_src/build" "$bin/base"
build_one "$PWD" "$PWD/build-release" "$bin/new"

echo "# $(machine); BASE $base_rev, new $(git rev-parse --short HEAD)$(git diff --quiet || echo +)"
echo "# hosts threads | base lookups/s  base CPU us | new lookups/s  new CPU us | lookups/s ratio  CPU ratio"
for h in $HOSTS; do
	: >"$bin/base.txt"; : >"$bin/new.txt"
	for r in $(seq "$RUNS"); do
		order="base new"; [ $((r % 2)) -eq 0 ] && order="new base"
		for w in $order; do
			"$bin/$w" --hosts "$h" --threads "$THREADS" --seconds "$SECONDS_EACH" >>"$bin/$w.txt"
		done
	done
	bo=$(cut -d' ' -f3 "$bin/base.txt" | median); bc=$(cut -d' ' -f4 "$bin/base.txt" | median)
	no=$(cut -d' ' -f3 "$bin/new.txt" | median); nc=$(cut -d' ' -f4 "$bin/new.txt" | median)
	awk -v h="$h" -v t="$THREADS" -v bo="$bo" -v bc="$bc" -v no="$no" -v nc="$nc" \
		'BEGIN { printf "%s %s | %.0f %.1f | %.0f %.1f | %.2fx %.3fx\n", h, t, bo, bc, no, nc, no / bo, nc / bc }'
	echo "$h $bc $nc" >>"$bin/rows"
done
if [ -n "${PLOT:-}" ]; then
	dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q "install ok installed" ||
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			python3-matplotlib >/dev/null
	/usr/bin/python3 - "$bin/rows" "$PLOT" "$base_rev" <<'PY'
import sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
h = [r[0] for r in rows]
fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(h, [r[1] for r in rows], "o-", label=f"base {sys.argv[3]}")
ax.plot(h, [r[2] for r in rows], "s-", label="new")
ax.set_xscale("log"); ax.set_yscale("log")
ax.set_xlabel("hosts in the key file"); ax.set_ylabel("CPU us per lookup")
ax.set_title("A NEGOTIATE's key-file lookup"); ax.legend(); ax.grid(True, which="both", alpha=.3)
fig.tight_layout(); fig.savefig(sys.argv[2], dpi=90)
PY
fi
