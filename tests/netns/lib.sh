# Shared by the namespace tests and benchmarks (sourced). Two network
# namespaces, server $S and client $C, joined by two veth links on two
# subnets: 198.18.1.0/24 and 198.18.2.0/24 (server .1, client .2). The
# addresses exist only inside these namespaces; cleanup removes them.
# Needs root and iproute2.
netns_setup() {
	tag=rtrs$$
	S=${tag}s C=${tag}c
	ip netns add $S && ip netns add $C || return 1
	for i in 1 2; do
		ip link add ${tag}c$i netns $C type veth peer name ${tag}s$i netns $S || return 1
		ip -n $C addr add 198.18.$i.2/24 dev ${tag}c$i
		ip -n $S addr add 198.18.$i.1/24 dev ${tag}s$i
		ip -n $C link set ${tag}c$i up
		ip -n $S link set ${tag}s$i up
	done
	ip -n $C link set lo up
	ip -n $S link set lo up
}

netns_cleanup() {
	for ns in $S $C; do
		ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
		ip netns del "$ns" 2>/dev/null
	done
}

# netns_test_begin NAME: a test's scratch directory ($dir, under /var/tmp),
# the namespaces, and an EXIT trap that kills the test's processes
# (common.sh's pids) and removes both. Exits 1 when the namespaces cannot be
# made.
netns_test_begin() {
	dir=$(mktemp -d "/var/tmp/rnbd-$1.XXXXXX")
	trap 'kill_pids; netns_cleanup; rm -rf "$dir"' EXIT
	netns_setup || { echo "FAIL: cannot set up the namespaces"; exit 1; }
}
