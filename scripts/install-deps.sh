#!/usr/bin/env bash
# Installs the Debian packages the project needs (build, tests, fuzzing,
# benchmarks). Does nothing when they are all present.
set -euo pipefail

packages=(
	gcc libasan8 libubsan1 libtsan2 clang libclang-rt-14-dev meson ninja-build pkg-config python3
	libfabric-dev libfabric-bin libibverbs-dev librdmacm-dev iproute2 nftables
	iperf3 gnuplot-nox
	libssl-dev nvme-cli
	liburing-dev
	libjson-c-dev libmicrohttpd-dev python3-prometheus-client curl
	nbdkit nbdkit-plugin-dev libnbd-bin fio qemu-utils fuse3 e2fsprogs
	tcpdump tshark
	systemd man-db scdoc
	build-essential debhelper dpkg-dev lintian fakeroot
)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=
if [ "$(id -u)" -ne 0 ]; then
	command -v sudo >/dev/null || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
	sudo=sudo
fi
echo "install-deps: installing ${missing[*]}"
# tshark's package asks whether non-root users may capture: no.
echo "wireshark-common wireshark-common/install-setuid boolean false" | $sudo debconf-set-selections
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
