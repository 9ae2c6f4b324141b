#!/usr/bin/env bash
# kernel-guest.sh: the kernel's RTRS and RNBD inside an rtrs-vm guest booted
# with --kmods (tests/vm/rtrs-vm image --kmods builds them). Run it to load
# modules in one line:
#   kernel-guest.sh brd [MIB]          /dev/ram0 of MIB MiB (64)
#   kernel-guest.sh server [PARAM=V...]
#                                      rtrs-core, rtrs-server, rnbd-server;
#                                      port_nr= and dev_search_path= go to
#                                      rnbd-server, the rest (always_invalidate=,
#                                      sess_queue_depth=, max_chunk_size=) to
#                                      rtrs-server
#   kernel-guest.sh client             rtrs-core, rtrs-client, rnbd-client
#   kernel-guest.sh unload-server | unload-client
# or source it for the kg_* functions tests use (map, write and verify,
# unmap, captures, checks, guest-to-guest sync). A check prints
#   CHECK <name> <status> [detail]
# which tests/vm/kernel-interop-suite.sh counts as a named result.
# KG_NAME names the guest in log lines (A, B); KG_RUN is a folder shared
# by both guests of a pair (markers, captures, digests).

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
KG_NAME=${KG_NAME:-guest}
KG_RUN=${KG_RUN:-}
KG_CTL=/sys/devices/virtual/rnbd-client/ctl

kg_log() { echo "[$KG_NAME $(cut -d' ' -f1 /proc/uptime)] $*"; }

# kg_check NAME STATUS [DETAIL]: reports one named result; returns STATUS.
kg_check() {
	echo "CHECK $1 $2${3:+ $3}"
	return "$2"
}

kg_in_guest() {
	grep -q 'rtrsvm\.guest=1' /proc/cmdline 2>/dev/null ||
		{ echo "kernel-guest: not in an rtrs-vm guest; refusing to load modules here" >&2; return 1; }
}

kg_kmod_dir() {
	[ -s /run/rtrs-vm/kmods ] ||
		{ echo "kernel-guest: no kernel modules in this guest (rtrs-vm run/pair --kmods)" >&2; return 1; }
	cat /run/rtrs-vm/kmods
}

# kg_insmod NAME [PARAM=V...]: loads NAME.ko from the modules' folder,
# unless it is loaded already.
kg_insmod() {
	local name=$1 dir
	shift
	[ -d "/sys/module/${name//-/_}" ] && return 0
	dir=$(kg_kmod_dir) || return 1
	insmod "$dir/$name.ko" "$@" || { echo "kernel-guest: insmod $name.ko $* failed" >&2; return 1; }
}

kg_load_brd() { # [MIB]
	local mib=${1:-64} i
	kg_in_guest || return 1
	kg_insmod brd rd_nr=1 "rd_size=$((mib * 1024))" || return 1
	for i in $(seq 50); do [ -b /dev/ram0 ] && return 0; sleep 0.1; done
	echo "kernel-guest: brd loaded but no /dev/ram0" >&2
	return 1
}

kg_load_server() { # [PARAM=V...]
	local p srv=() rnbd=()
	kg_in_guest || return 1
	for p in "$@"; do
		case "$p" in
		port_nr=* | dev_search_path=*) rnbd+=("$p") ;;
		*) srv+=("$p") ;;
		esac
	done
	kg_insmod rtrs-core && kg_insmod rtrs-server "${srv[@]}" && kg_insmod rnbd-server "${rnbd[@]}"
}

kg_unload_server() { rmmod rnbd_server rtrs_server; }

kg_load_client() {
	kg_in_guest || return 1
	kg_insmod rtrs-core && kg_insmod rtrs-client && kg_insmod rnbd-client
}

kg_unload_client() { rmmod rnbd_client rtrs_client; }

# kg_reach ADDR: waits (up to 30 s) until ADDR answers a ping: the cable is
# up and its neighbour known, so that a connection fails for what it meets
# at the other end, not for a guest still bringing its link up (seen once
# with both host CPUs busy: no packet from B reached A).
kg_reach() {
	local t0=$SECONDS
	until /bin/busybox ping -c 1 -W 1 "$1" >/dev/null 2>&1; do
		[ $((SECONDS - t0)) -lt 30 ] || { kg_log "$1 does not answer a ping after 30 s"; return 1; }
	done
	[ $((SECONDS - t0)) -eq 0 ] || kg_log "$1 answers a ping after $((SECONDS - t0)) s"
}

# kg_map SESSNAME ADDR DEVICE_PATH [PORT [OPTION...]]: maps a remote device
# through rnbd-client's sysfs and prints its /dev/rnbdN. The write blocks
# while RTRS connects; it is given 120 s.
kg_map() {
	local sess=$1 addr=$2 path=$3 port=${4:-} opts link
	shift 3
	[ $# -gt 0 ] && shift
	opts="sessname=$sess"
	# dest_port= must come before path=: the kernel applies the port while
	# it parses path=, so a later dest_port= is silently ignored (1234).
	[ -n "$port" ] && opts="dest_port=$port $opts"
	opts="$opts path=ip:$addr device_path=$path access_mode=rw${*:+ $*}"
	kg_reach "$addr" >&2
	kg_log "map: $opts" >&2
	timeout -k 5 120 sh -c 'echo "$1" >"$2/map_device"' _ "$opts" "$KG_CTL" || {
		echo "kernel-guest: map_device '$opts' failed; the kernel said:" >&2
		dmesg | grep -E 'rtrs|rnbd' | tail -n 8 >&2
		return 1
	}
	# rnbd-client links the disk as devices/<device_path, / as !>@<sessname>
	link=$KG_CTL/devices/${path//\//!}@$sess
	[ -L "$link" ] || { echo "kernel-guest: mapped, but no $link" >&2; return 1; }
	echo "/dev/$(basename "$(readlink -f "$link")")"
}

kg_unmap() { # /dev/rnbdN
	echo normal >"/sys/block/$(basename "$1")/rnbd/unmap_device"
}

# kg_pattern FILE MIB: MIB MiB of random data.
kg_pattern() { head -c "$(($2 << 20))" /dev/urandom >"$1"; }

# kg_write_verify DEV FILE: writes FILE to DEV (O_DIRECT, 1 MiB blocks),
# reads it back the same way, compares.
kg_write_verify() {
	local dev=$1 file=$2 mib t0 t1 t2
	mib=$(($(stat -c %s "$file") >> 20))
	t0=$(date +%s.%N)
	dd if="$file" of="$dev" bs=1M count="$mib" oflag=direct status=none || return 1
	t1=$(date +%s.%N)
	dd if="$dev" of=/tmp/kg-back bs=1M count="$mib" iflag=direct status=none || return 1
	t2=$(date +%s.%N)
	kg_log "$mib MiB: write $(kg_rate "$t0" "$t1" "$mib"), read $(kg_rate "$t1" "$t2" "$mib")"
	cmp "$file" /tmp/kg-back
	local rc=$?
	rm -f /tmp/kg-back
	return $rc
}

kg_rate() { awk -v a="$1" -v b="$2" -v m="$3" 'BEGIN { printf "%.2f s (%.1f MB/s)", b - a, m * 1.048576 / (b - a) }'; }

kg_sha256() { # FILE|DEV [MIB]: digest of the first MIB MiB (all of a file)
	if [ -n "${2:-}" ]; then
		head -c "$(($2 << 20))" "$1" | sha256sum | cut -d' ' -f1
	else
		sha256sum <"$1" | cut -d' ' -f1
	fi
}

# Markers in KG_RUN, for the two guests of a pair.
kg_signal() { touch "$KG_RUN/$1"; }
kg_wait() { # "NAME..." [SECONDS]: until one of the markers is there
	local i n
	for i in $(seq $((${2:-300} * 10))); do
		for n in $1; do
			[ -e "$KG_RUN/$n" ] && return 0
		done
		sleep 0.1
	done
	kg_log "timed out waiting for $1"
	return 1
}

# kg_fio_verify DEV MIB: random 4 KiB writes, 16 in flight, over the first
# MIB MiB, each block then read back and checked (crc32c).
kg_fio_verify() {
	command -v fio >/dev/null || { echo "kernel-guest: no fio" >&2; return 77; }
	fio --name=kg-verify --filename="$1" --size="${2}M" --rw=randwrite --bs=4k \
		--ioengine=libaio --iodepth=16 --direct=1 --verify=crc32c --verify_fatal=1 \
		--output=/tmp/kg-fio.log
	local rc=$?
	grep -E 'WRITE:|READ:|err=|verify' /tmp/kg-fio.log | sed 's/^ */fio: /'
	return $rc
}

# kg_capture_start: RoCEv2 (UDP 4791) on eth0 into guest memory, with a
# large buffer: under TCG tcpdump falls behind during bulk IO.
kg_capture_start() {
	tcpdump -i eth0 -U -s 0 -B 32768 -w /tmp/kg.pcap udp port 4791 2>/tmp/kg-tcpdump.log &
	KG_CAPTURE=$!
	for _ in $(seq 100); do
		grep -q 'listening on' /tmp/kg-tcpdump.log && return 0
		kill -0 "$KG_CAPTURE" 2>/dev/null || break
		sleep 0.1
	done
	cat /tmp/kg-tcpdump.log >&2
	return 1
}

# kg_capture_stop FILE: stops the capture and moves it to FILE; logs what
# tcpdump says it dropped. tcpdump falls behind under TCG and drops what
# is still in its buffer when stopped: it is stopped once the file has
# stopped growing (at most 60 s).
kg_capture_stop() {
	local last=-1 size
	for _ in $(seq 120); do
		size=$(stat -c %s /tmp/kg.pcap 2>/dev/null || echo 0)
		[ "$size" = "$last" ] && break
		last=$size
		sleep 0.5
	done
	kill -INT "$KG_CAPTURE" 2>/dev/null
	wait "$KG_CAPTURE" 2>/dev/null
	kg_log "capture: $(grep -E 'captured|dropped' /tmp/kg-tcpdump.log | tr '\n' ' ')"
	mv /tmp/kg.pcap "$1"
}

# kg_dmesg_check NAME: the kernel log has no oops, BUG or warning trace;
# the log goes to KG_RUN/NAME.dmesg.
kg_dmesg_check() {
	local hits
	dmesg >"$KG_RUN/$1.dmesg"
	hits=$(grep -cE 'BUG:|Oops|Call Trace|WARNING:' "$KG_RUN/$1.dmesg")
	[ "$hits" -eq 0 ] || grep -E -A5 'BUG:|Oops|Call Trace|WARNING:' "$KG_RUN/$1.dmesg" | head -40
	kg_check "$1-kernel-log-clean" "$([ "$hits" -eq 0 ] && echo 0 || echo 1)" "($hits oops/BUG/trace lines)"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	set -u
	cmd=${1:-}
	[ $# -gt 0 ] && shift
	case "$cmd" in
	brd) kg_load_brd "$@" ;;
	server) kg_load_server "$@" ;;
	client) kg_load_client ;;
	unload-server) kg_unload_server ;;
	unload-client) kg_unload_client ;;
	*) sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
	esac
fi
