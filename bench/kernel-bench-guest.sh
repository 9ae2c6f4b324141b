# Sourced by the guest side of the kernel-client benchmarks
# (bench/kernel-rnbd.sh, bench/kernel-rnbd-srq.sh), after
# tests/vm/kernel-guest.sh (KG_RUN set): one fio run of guest B's
# alternating series, each marked to guest A (go-N, ack-N, end-N, ackend-N)
# so that A reads its CPU time around the same run.

# The guest's non-idle CPU time in USER_HZ ticks (the kernel's work in
# softirq and kernel threads counts, which no process accounts).
kb_cpu() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }

# kb_b_run N LABEL DEV RW BS QD SECONDS SIZE: run N of the series, fio on
# DEV; its result in KG_RUN/fio-N.json, B's CPU in B-N.start and B-N.end,
# "N LABEL" appended to KG_RUN/order.
kb_b_run() {
	local n=$1 label=$2 dev=$3
	kg_signal "go-$n"
	kg_wait "ack-$n" 60
	kb_cpu >"$KG_RUN/B-$n.start"
	fio --name=bench --filename="$dev" --rw="$4" --bs="$5" --iodepth="$6" \
		--ioengine=libaio --direct=1 --time_based --runtime="$7" --size="$8" \
		--output-format=json >"$KG_RUN/fio-$n.json" 2>"$KG_RUN/fio-$n.err"
	kb_cpu >"$KG_RUN/B-$n.end"
	echo "$n $label" >>"$KG_RUN/order"
	kg_signal "end-$n"
	kg_wait "ackend-$n" 60
}
