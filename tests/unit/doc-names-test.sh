#!/usr/bin/env bash
# doc-names.py fails when a document names what the tree does not have:
#   - a scratch copy of the tree where a function the documents cite is
#     renamed in the code (clt_path_stop), a file they cite is renamed
#     (rtrs-clt-fence.c) and an option of rtrs-perf's table is renamed
#     (--queue-depth): the check fails and names each;
#   - a document citing a function, a file, an option and a section that do
#     not exist: four findings, no more (the same document's names that
#     exist, or that it says are another project's, pass);
#   - the unchanged copy passes.
# Usage: doc-names-test.sh SOURCE_DIR
set -euo pipefail
src=$(cd "${1:?usage: doc-names-test.sh SOURCE_DIR}" && pwd)
command -v python3 >/dev/null || { echo "SKIP: python3 is not installed"; exit 77; }
. "$src/tests/lib/common.sh"
check_py=$src/tests/unit/doc-names.py

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# What the check reads: the documents and the sources (no build folders).
tree=$tmp/tree
mkdir "$tree"
dirs=()
for d in bench daemons debian docs fuzz include lib nbdkit scripts systemd tests tools; do
	[ -d "$src/$d" ] && dirs+=("$d")
done
tar -C "$src" --exclude=fuzz/corpus -cf - README.md "${dirs[@]}" | tar -C "$tree" -xf -

check "the copy of the tree passes" python3 "$check_py" "$tree"

# fails_naming WHAT PATTERN: the check fails on the copy and prints PATTERN.
fails_naming() {
	local out rc=0
	out=$(python3 "$check_py" "$tree" 2>&1) || rc=$?
	echo "$out" | grep -E "$2" | head -3 | sed 's/^/  /'
	[ "$rc" -eq 1 ] && grep -Eq "$2" <<<"$out"
}

# A function the documents cite, renamed in the code only.
n=$(grep -c 'clt_path_stop' "$tree"/docs/*.md | awk -F: '{ s += $2 } END { print s }')
check "the documents cite clt_path_stop ($n lines)" test "$n" -gt 0
sed -i 's/\bclt_path_stop\b/clt_path_halt/g' "$tree"/lib/rtrs/*.[ch]
check "clt_path_stop renamed in the code: the check fails and names it" \
	fails_naming "renamed function" '`clt_path_stop` is not in the tree'
sed -i 's/\bclt_path_halt\b/clt_path_stop/g' "$tree"/lib/rtrs/*.[ch]
check "renamed back: the check passes" python3 "$check_py" "$tree"

# A file the documents cite, renamed.
mv "$tree/lib/rtrs/rtrs-clt-fence.c" "$tree/lib/rtrs/rtrs-clt-fencing.c"
check "rtrs-clt-fence.c renamed: the check fails and names it" \
	fails_naming "renamed file" 'file rtrs-clt-fence.c is not in the tree'
mv "$tree/lib/rtrs/rtrs-clt-fencing.c" "$tree/lib/rtrs/rtrs-clt-fence.c"

# An option of rtrs-perf that README's command lines use, renamed in its table.
sed -i 's/"queue-depth"/"qdepth"/' "$tree/tools/rtrs-perf.c"
check "rtrs-perf's --queue-depth renamed: the check fails and names it" \
	fails_naming "renamed option" 'option --queue-depth is not an option of rtrs-perf'
sed -i 's/"qdepth"/"queue-depth"/' "$tree/tools/rtrs-perf.c"

# A document with four names the tree does not have, and names it has or
# that belong to others.
cat >"$tmp/doc.md" <<'EOF'
# A document

`clt_path_stop` stops a path and `rtrs_clt_open()` opens a session; the
kernel's `process_io_rsp` and Linux's `nvmf_should_reconnect` are theirs.
`io_uring_submit()` is liburing's, called by `lib/rtrs/rtrs-fabric-tcp.c`.
See docs/protocol.md section 7.2 and `include/rtrs.h`.

Missing: `clt_path_vanish()`, `lib/rtrs/rtrs-gone.c`, docs/protocol.md
section 99.

```sh
build/tools/rtrs-perf client --dst 127.0.0.1:1234 --queue-depth 8 --no-such-option
meson test -C build --suite unit --whatever-meson-takes
```
EOF
out=$(python3 "$check_py" "$tree" "$tmp/doc.md" 2>&1) && rc=0 || rc=$?
echo "$out" | sed 's/^/  /'
check "a document with four missing names fails" test "$rc" -eq 1
for want in 'function clt_path_vanish\(\) is not in the tree' \
	'file lib/rtrs/rtrs-gone.c is not in the tree' \
	'option --no-such-option is not an option of rtrs-perf' \
	'docs/protocol.md has no section 99'; do
	check "... it names: $want" grep -Eq "$want" <<<"$out"
done
check "... and nothing else" test "$(grep -c ': ' <<<"$(grep -v '^doc-names:' <<<"$out")")" -eq 4

finish doc-names-test
