#!/usr/bin/env bash
# Builds fio from the source of the fio Debian ships (apt-get source, with
# a deb-src list in scratch space: /etc/apt is not touched), in
# /var/tmp/rnbd-fio (kept between runs), configured as Debian configures
# it, with its nbd engine (libnbd), and prints the tree's path. The
# benchmarks run this fio for every contender, and build fio's external
# engine for RNBD (bench/fio/rnbd-fio.c) against the same tree
# (meson -Dfio_src=THAT_PATH): an engine shares fio's structures, so
# engine and fio must come from one build. Nothing of fio is committed.
set -euo pipefail
top=/var/tmp/rnbd-fio
mkdir -p "$top/apt/lists/partial" "$top/apt/cache/archives/partial"
cd "$top"

need=(dpkg-dev libnbd-dev libaio-dev zlib1g-dev pkg-config make gcc)
missing=()
for p in "${need[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
		>/dev/null
fi

# The version Debian ships here: the one apt would install.
version=$(apt-cache policy fio | awk '/Candidate:/ { print $2 }')
[ -n "$version" ] && [ "$version" != "(none)" ] || { echo "fio-build: no fio in apt" >&2; exit 1; }
upstream=${version%-*}
upstream=${upstream#*:}
src=$top/fio-$upstream
if [ ! -x "$src/fio" ] || [ "$(cat "$src/.debian-version" 2>/dev/null)" != "$version" ]; then
	rm -rf "$src"
	suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
	echo "deb-src http://deb.debian.org/debian $suite main" >apt/sources.list
	apto=(-o Dir::Etc::SourceList="$top/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
		-o Dir::State::Lists="$top/apt/lists" -o Dir::Cache="$top/apt/cache")
	apt-get "${apto[@]}" update -qq
	apt-get "${apto[@]}" source -qq "fio=$version" >/dev/null 2>&1
	[ -d "$src" ] || { echo "fio-build: apt-get source fio=$version made no $src" >&2; exit 1; }
	(cd "$src" && ./configure --disable-native --prefix=/usr --enable-libnbd >configure.log 2>&1 &&
		grep -q 'CONFIG_LIBNBD' config-host.h &&
		make -j"$(nproc)" fio >make.log 2>&1) ||
		{ echo "fio-build: building fio $version failed (logs in $src)" >&2; exit 1; }
	echo "$version" >"$src/.debian-version"
fi
echo "$src"
