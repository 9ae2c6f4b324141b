#!/usr/bin/env bash
# Installs the Debian packages the project needs. Does nothing when they are
# all present.
#   install-deps.sh          everything: the build, every test suite,
#                            fuzzing, benchmarks, packaging (scripts/test.sh)
#   install-deps.sh --demo   what scripts/demo.sh needs: the build, and
#                            nbdkit, nbdinfo and qemu-img for its NBD part
set -euo pipefail

# The build (README.md, "To build only"), and python3 for the man pages.
build=(
	gcc libc6-dev meson ninja-build pkg-config python3
	libibverbs-dev librdmacm-dev libssl-dev liburing-dev
	libjson-c-dev libmicrohttpd-dev nbdkit-plugin-dev scdoc libsystemd-dev
)
# What the demo runs besides the build.
demo=(nbdkit libnbd-bin qemu-utils)
# The tests, fuzzing, benchmarks and the Debian packages.
tests=(
	libasan8 libubsan1 libtsan2 clang libclang-rt-14-dev
	iproute2 nftables
	iperf3 gnuplot-nox
	nvme-cli
	python3-prometheus-client curl
	fio fuse3 e2fsprogs mdadm
	tcpdump tshark
	systemd man-db
	build-essential debhelper dpkg-dev lintian fakeroot
)

case "${1:-}" in
"") packages=("${build[@]}" "${demo[@]}" "${tests[@]}") ;;
--demo) packages=("${build[@]}" "${demo[@]}") ;;
*) echo "usage: install-deps.sh [--demo]" >&2; exit 2 ;;
esac

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
