#!/usr/bin/env bash
# What TLS costs on the tcp fabric (issue 37 item 1, docs/security.md section
# 9): rtrs-perf over loopback tcp, one session, one IO connection, without TLS
# and with it, 4 KiB IO at QD 64 and 1 MiB IO at QD 8 (the servers -c 2M -q 16:
# a chunk holds a 1 MiB IO and its header), writes and reads. Every chain
# authenticates with DH-HMAC-CHAP (--auth-keys and --secret; the TLS chains
# also --tls-key): only TLS differs.
#   host:  plain against TLS; this host's kernel has no TLS module, so its TLS
#          is OpenSSL's records in user space (the log says which);
#   guest: one QEMU guest (tests/vm/rtrs-vm, Debian 12's kernel, TCG) with
#          tls.ko and AES-GCM loaded from the image's kernel tree: plain,
#          kernel TLS (the default where the kernel has it) and user-space TLS
#          (--no-ktls on both sides). rtrs-vm's CPU model (qemu64) has no
#          AES-NI: AES-GCM is generic code under TCG there, and its ratios
#          are mostly that (the section's "CPU flags" and "kernel gcm(aes)").
# Before the measured runs every chain runs once with --verify and
# --log-level debug: no error, no bad byte, and the TLS its log names (kernel
# or user space; in the guest also /proc/net/tls_stat's TlsTxSw and TlsRxSw
# counting the kernel TLS sockets of both sides). The runs alternate
# (bench/chains.py: every chain once per round, the order rotating), medians
# over the rounds; CPU per IO = utime + stime of client and server over the
# run, divided by the ops; in the guest also the whole guest's non-idle CPU
# (/proc/stat: the kernel's work in softirqs and kworkers counts). Goal: CPU
# per 4 KiB IO with kernel TLS <= 1.3x without TLS.
#   bench/tls.sh [--record]
# --record appends the section to bench/RESULTS.md with its plot,
# bench/plots/tls-DATE[-TAG].png. Environment: RUNS (5) and DURATION (5 s)
# on the host; GUEST (1; 0 leaves the guest out), GUEST_RUNS (3),
# GUEST_DURATION (3 s), SMP (2) and MEM (1536 MiB) for the guest; CONNS (1,
# IO connections); TAG (runs of one day keep their plots); KEEP (a folder: the
# runs' results, logs and the plot are copied there, not the keys nor the
# command lines that hold them).
set -euo pipefail
cd "$(dirname "$0")/.."
record=false
[ "${1:-}" = --record ] && { record=true; shift; }
RUNS=${RUNS:-5}
DURATION=${DURATION:-5}
GUEST=${GUEST:-1}
GUEST_RUNS=${GUEST_RUNS:-3}
GUEST_DURATION=${GUEST_DURATION:-3}
SMP=${SMP:-2}
MEM=${MEM:-1536}
CONNS=${CONNS:-1}
vm=tests/vm/rtrs-vm
vmdir=${RTRS_VM_DIR:-/var/tmp/rtrs-vm}

. bench/lib.sh
dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q "install ok installed" ||
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		python3-matplotlib >/dev/null
command -v nvme >/dev/null || { echo "bench: nvme (nvme-cli) is needed for the keys" >&2; exit 1; }
# The folder the guest shares (its /tmp is its own); the keys are in it.
run=$(mktemp -d /tmp/tls-bench.XXXXXX)
trap 'rm -rf "$run"' EXIT

umask 077
echo "host1 $(nvme gen-dhchap-key -m 0 -n host1) tls=$(nvme gen-tls-key)" >"$run/keys"
umask 022

# side.sh RUN BUILD TOP RUNS DURATION CONNS PREFIX SYSCPU MODES...: on the
# host and in the guest alike, the servers of MODES (plain; tls: TLS as it
# comes, kernel TLS where the kernel has it; utls: --no-ktls on both sides),
# a 4 KiB and a 1 MiB one each, the verify pass, then bench/chains.py into
# RUN/PREFIX-out.json; SYSCPU 1 also the whole machine's CPU per run into
# RUN/PREFIX-sys.txt. "CHECK name ok|FAIL" lines (bench_guest counts them).
cat >"$run/side.sh" <<'EOF'
#!/usr/bin/env bash
set -u
run=$1 build=$2 top=$3 runs=$4 dur=$5 conns=$6 prefix=$7 syscpu=$8
shift 8
modes=("$@")
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
perf=$build/tools/rtrs-perf
check() { # NAME STATUS [DETAIL]: a failure ends the run
	if [ "$2" -eq 0 ]; then echo "CHECK $1 ok ${3:-}"; else echo "CHECK $1 FAIL ${3:-}"; exit 1; fi
}
key=$(awk '{ print $2 }' "$run/keys")
psk=$(awk '{ sub(/^tls=/, "", $3); print $3 }' "$run/keys")
srv_opts() { # MODE
	case $1 in
	tls) echo "--tls required" ;;
	utls) echo "--tls required --no-ktls" ;;
	esac
}
clt_opts() { # MODE
	echo "--secret $key --host-name host1"
	case $1 in
	tls) echo "--tls required --tls-key $psk" ;;
	utls) echo "--tls required --tls-key $psk --no-ktls" ;;
	esac
}
# The servers log at debug level: a fall back to user-space records ("no
# kernel TLS") or a refusal would show.
declare -A spid sport
for m in "${modes[@]}"; do
	for sz in 4k 1M; do
		c=()
		[ "$sz" = 1M ] && c=(-c 2M -q 16)
		# shellcheck disable=SC2046
		"$perf" server --port 0 --auth-keys "$run/keys" "${c[@]}" $(srv_opts "$m") \
			--log-level debug >"$run/$prefix-srv-$m-$sz.log" 2>&1 &
		spid[$m-$sz]=$!
	done
done
trap 'kill "${spid[@]}" 2>/dev/null; wait' EXIT
: >"$run/$prefix-servers.txt"
for k in "${!spid[@]}"; do
	for _ in $(seq 1200); do
		grep -q 'port [0-9]' "$run/$prefix-srv-$k.log" && break
		sleep 0.05
	done
	sport[$k]=$(grep -o 'port [0-9]*' "$run/$prefix-srv-$k.log" | head -1 | grep -o '[0-9]*$')
	[ -n "${sport[$k]}" ]
	check "$prefix-server-$k" $? "$(tail -3 "$run/$prefix-srv-$k.log" | tr '\n' ' ')"
	echo "$k ${spid[$k]}" >>"$run/$prefix-servers.txt"
done
# The kernel's TLS sockets installed so far: "TlsTxSw TlsRxSw TlsDecryptError".
tls_stat() {
	if [ -r /proc/net/tls_stat ]; then
		awk '{ v[$1] = $2 } END { print v["TlsTxSw"] + 0, v["TlsRxSw"] + 0, v["TlsDecryptError"] + 0 }' /proc/net/tls_stat
	else
		echo "- - -"
	fi
}
cmd() { # MODE SIZE OP [MORE...]: the client's command line, one word a line
	local m=$1 sz=$2 op=$3 q=64
	shift 3
	[ "$sz" = 1M ] && q=8
	# shellcheck disable=SC2046
	printf '%s\n' "$perf" client -d "127.0.0.1:${sport[$m-$sz]}" $(clt_opts "$m") -m "$op" \
		-s "$sz" -q "$q" -n "$conns" -j "$@"
}
field() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@" 2>/dev/null; }
# The verify pass: every chain once, every byte checked, its TLS named.
: >"$run/$prefix-verify.txt"
: >"$run/$prefix-cmds.txt"
for m in "${modes[@]}"; do
	for sz in 4k 1M; do
		for op in write read; do
			n=$m-$sz-$op
			mapfile -t c <<<"$(cmd "$m" "$sz" "$op")" # (the guest has no /dev/fd)
			printf '%s\t%s\n' "$n" "${c[*]}" >>"$run/$prefix-cmds.txt"
			s0=$(tls_stat)
			"${c[@]}" -t 2 -V --log-level debug >"$run/$prefix-verify-$n.json" \
				2>"$run/$prefix-verify-$n.log"
			rc=$?
			s1=$(tls_stat)
			ops=$(field "$run/$prefix-verify-$n.json" ops)
			bad=$(($(field "$run/$prefix-verify-$n.json" errors || echo 1) + $(field "$run/$prefix-verify-$n.json" bad || echo 1)))
			what=$(grep -o 'TLS: .*' "$run/$prefix-verify-$n.log" | sort | uniq -c |
				sed 's/^ *//' | paste -sd';' -)
			[ "$m" = plain ] && what=${what:-no TLS}
			read -r a0 b0 e0 <<<"$s0"
			read -r a1 b1 e1 <<<"$s1"
			ks="tls_stat: none"
			[ "$a0" = - ] || ks="TlsTxSw +$((a1 - a0)) TlsRxSw +$((b1 - b0)) TlsDecryptError +$((e1 - e0))"
			echo "$n: exit $rc, ${ops:-no} ops verified, errors+bad $bad; client log: ${what:-no TLS line}; $ks" \
				>>"$run/$prefix-verify.txt"
			[ "$rc" -eq 0 ] && [ "${ops:-0}" -gt 0 ] && [ "$bad" -eq 0 ]
			check "$prefix-verify-$n" $? "$(tail -c 400 "$run/$prefix-verify-$n.log" | tr '\n' ' ')"
			# The TLS asked for and no other: with tls.ko, kernel TLS on both
			# sides (every socket of the session, client's and server's, in
			# tls_stat); --no-ktls and a kernel without it: user space.
			ktls=false
			grep -qw tls /proc/sys/net/ipv4/tcp_available_ulp && ktls=true
			case $m in
			plain) [ -z "${what#no TLS}" ] ;;
			utls) ! grep -q 'kernel TLS' <<<"$what" && grep -q 'user-space TLS' <<<"$what" ;;
			tls) if $ktls && [ "$a0" != - ]; then
				! grep -q 'user-space' <<<"$what" && grep -q ', kernel TLS' <<<"$what" &&
					[ $((a1 - a0)) -eq $((2 * (conns + 1))) ] &&
					[ $((b1 - b0)) -eq $((2 * (conns + 1))) ] && [ $((e1 - e0)) -eq 0 ]
			else
				grep -q 'TLS: ' <<<"$what"
			fi ;;
			esac
			check "$prefix-tls-$n" $? "${what:-no TLS line}; $ks"
		done
	done
done
# The servers' word on TLS (a fall back to user space or a refusal).
for k in "${!spid[@]}"; do
	grep -E 'kernel TLS|TLS: |TLS required' "$run/$prefix-srv-$k.log" | sort | uniq -c |
		sed "s|^|server $k: |" >>"$run/$prefix-verify.txt"
done
python3 - "$run" "$prefix" "$runs" "$dur" "$syscpu" "$run/syscpu.sh" <<'PY'
import json, shlex, sys
run, prefix, runs, dur, syscpu, wrap = sys.argv[1:7]
srv = dict(l.split() for l in open("%s/%s-servers.txt" % (run, prefix)))
chains = []
for l in open("%s/%s-cmds.txt" % (run, prefix)):
    n, c = l.rstrip("\n").split("\t")
    c = shlex.split(c) + ["-t", dur]
    if syscpu == "1":
        c = ["bash", wrap, "%s/%s-sys.txt" % (run, prefix), n] + c
    m, sz, op = n.split("-")
    chains.append({"name": n, "label": n, "kind": "ops", "cmd": c,
                   "procs": {"server": int(srv[m + "-" + sz])}})
# 4 KiB first, then 1 MiB; the modes side by side.
chains.sort(key=lambda c: (c["name"].split("-")[1] != "4k", c["name"].split("-")[2] != "write"))
json.dump({"runs": int(runs), "title": prefix, "chains": chains},
          open("%s/%s-spec.json" % (run, prefix), "w"))
PY
check "$prefix-spec" $?
python3 "$top/bench/chains.py" "$run/$prefix-spec.json" "$run/$prefix-out.json"
check "$prefix-runs" $?
EOF
# syscpu.sh FILE NAME CMD...: CMD; "NAME TICKS" appended to FILE, the whole
# machine's non-idle CPU time over it (user, nice, system, irq, softirq,
# steal; bash's own read: no process of its own to count).
cat >"$run/syscpu.sh" <<'EOF'
f=$1 n=$2
shift 2
read -r _ a b c _ _ d e g _ </proc/stat
"$@"
rc=$?
read -r _ A B C _ _ D E G _ </proc/stat
echo "$n $((A + B + C + D + E + G - a - b - c - d - e - g))" >>"$f"
exit $rc
EOF

load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "bench: host: plain and TLS, $RUNS rounds of $DURATION s runs" >&2
bash "$run/side.sh" "$run" "$PWD/build-release" "$PWD" "$RUNS" "$DURATION" "$CONNS" host 0 \
	plain tls >"$run/host.log" 2>&1 || { cat "$run/host.log"; echo "bench: the host part failed" >&2; exit 1; }
load1=$(cut -d' ' -f1-3 /proc/loadavg)
kver=-
if [ "$GUEST" = 1 ]; then
	[ -f "$vmdir/image/version" ] || "$vm" image >/dev/null
	kver=$(cut -d' ' -f1 "$vmdir/image/version")
	# tls.ko and the AES-GCM it asks the crypto API for, from the image's
	# kernel tree: the guest's modules are not the host's /lib/modules, and its
	# kernel cannot load a module by itself (no modprobe in its initramfs).
	kroot=$vmdir/scratch/kroot
	[ -d "$kroot/lib/modules/$kver" ] || { echo "bench: no $kroot/lib/modules/$kver" >&2; exit 1; }
	cat >"$run/guest.sh" <<'EOF'
#!/usr/bin/env bash
set -u
run=$1 kroot=$2
shift 2
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
modprobe -d "$kroot" -a tls gcm ghash_generic ctr seqiv
rc=$?
# AES-NI and PCLMULQDQ where the guest's CPU model has them (rtrs-vm's
# qemu64 has not: then AES-GCM is the kernel's generic C, and OpenSSL's).
cpu=$(grep -m1 -o -w -E 'aes|pclmulqdq' /proc/cpuinfo | sort -u | paste -sd, -)
if grep -qw aes <<<"$cpu"; then
	modprobe -d "$kroot" -a aesni_intel ghash_clmulni_intel || echo "CHECK modprobe-aesni FAIL"
fi
echo "CPU flags: ${cpu:-no aes, no pclmulqdq}" >"$run/guest-crypto.txt"
ulp=$(cat /proc/sys/net/ipv4/tcp_available_ulp)
echo "CHECK modprobe-tls $([ $rc -eq 0 ] && echo ok || echo FAIL) exit $rc; tcp_available_ulp: $ulp"
grep -qw tls <<<"$ulp" || { echo "CHECK tls-ulp FAIL tcp_available_ulp: $ulp"; exit 1; }
echo "CHECK tls-ulp ok $ulp"
bash "$run/side.sh" "$run" "$@"
rc=$?
dmesg | grep -cE 'BUG:|Oops|WARNING:|Call Trace' >"$run/oops" || true
# The kernel's AES-GCM that kernel TLS got (instantiated on its first use).
awk '/^name/ { n = $3 } /^driver/ && n == "gcm(aes)" { print "kernel gcm(aes): " $3 }' \
	/proc/crypto | sort -u >>"$run/guest-crypto.txt"
[ $rc -eq 0 ] && echo done >"$run/order"
exit $rc
EOF
	echo "bench: guest: plain, kernel TLS, user-space TLS, $GUEST_RUNS rounds of $GUEST_DURATION s runs" >&2
	bench_guest "$run" --rdma none --smp "$SMP" --mem "$MEM" \
		--timeout $((600 + GUEST_RUNS * 12 * (GUEST_DURATION + 10) + 12 * 20)) \
		--share "$run" --share-ro "$PWD" --share-ro "$kroot" -- \
		bash "$run/guest.sh" "$run" "$kroot" "$PWD/build-release" "$PWD" "$GUEST_RUNS" \
		"$GUEST_DURATION" "$CONNS" guest 1 plain tls utls >&2
fi

day=$(date -u +%Y-%m-%d)
plot=bench/plots/tls-$day${TAG:+-$TAG}.png
report=$(/usr/bin/python3 - "$run" "$RUNS" "$DURATION" "$GUEST" "$GUEST_RUNS" "$GUEST_DURATION" \
	"$SMP" "$CONNS" "$(machine)" "$plot" "$day" "$load0" "$load1" "$kver" <<'PY'
import json, os, statistics, sys
sys.path.insert(0, "bench")
from chains import round_ratio, spread
(run, runs, dur, guest, gruns, gdur, smp, conns, machine, plot, day, load0, load1,
 kver) = sys.argv[1:15]
guest = guest == "1"
SIZE = {"4k": 4096, "1M": 1 << 20}
sides = [("host", "host")] + ([("guest", "guest")] if guest else [])
out = {p: {c["name"]: c for c in json.load(open("%s/%s-out.json" % (run, p)))["chains"]}
       for p, _ in sides}
# The guest's whole CPU per run, in round order per chain.
sysd = {}
if guest:
    tick = os.sysconf("SC_CLK_TCK")
    for l in open(run + "/guest-sys.txt"):
        n, t = l.split()
        sysd.setdefault(n, []).append(int(t) / tick)
    for n, c in out["guest"].items():
        for r, t in zip(c["runs"], sysd[n]):
            r["sys_us_per_io"] = t * 1e6 / r["ios"]
        c["sys_us_per_io"] = statistics.median(r["sys_us_per_io"] for r in c["runs"])
# What each side's TLS chain was (its verify run's log).
def what(p, m):
    if m == "plain":
        return "no TLS"
    if m == "utls":
        return "user-space TLS (--no-ktls)"
    v = [l for l in open("%s/%s-verify.txt" % (run, p)) if l.startswith("tls-4k-write:")][0]
    return "kernel TLS" if ", kernel TLS" in v else "user-space TLS (no kernel TLS here)"
label = {p: {m: what(p, m) for m in ("plain", "tls", "utls") if (m + "-4k-write") in out[p]}
         for p, _ in sides}

def table(p, sysc):
    rows = []
    h = ("| IO | op | chain | op/s | GB/s | CPU us/IO client | server | sum | "
         "throughput vs plain | CPU/IO vs plain |" + (" guest CPU us/IO (all) | vs plain |" if sysc else ""))
    rows.append(h)
    rows.append("|" + "---|" * (h.count("|") - 1))
    for sz in ("4k", "1M"):
        for op in ("write", "read"):
            base = out[p]["plain-%s-%s" % (sz, op)]
            for m in ("plain", "tls", "utls"):
                n = "%s-%s-%s" % (m, sz, op)
                if n not in out[p]:
                    continue
                c = out[p][n]
                parts = c["cpu_parts_us_per_io"]
                r = "| %s | %s | %s | %.0f | %.3f | %.2f | %.2f | %.2f | %s | %s |" % (
                    "4 KiB, QD 64" if sz == "4k" else "1 MiB, QD 8", op, label[p][m],
                    c["iops"], c["iops"] * SIZE[sz] / 1e9, parts["client"], parts["server"],
                    c["cpu_us_per_io"],
                    "-" if m == "plain" else round_ratio(c, base, "iops"),
                    "-" if m == "plain" else round_ratio(c, base))
                if sysc:
                    r += " %.2f | %s |" % (c["sys_us_per_io"],
                                           "-" if m == "plain" else round_ratio(c, base, "sys_us_per_io"))
                rows.append(r)
    return "\n".join(rows)

print()
print("### %s What TLS costs on the tcp fabric: user-space and kernel TLS, loopback" % day)
print()
print("Machine: %s; host load average %s at the start of the host part, %s at its end%s. "
      "Command: `RUNS=%s DURATION=%s GUEST=%d GUEST_RUNS=%s GUEST_DURATION=%s SMP=%s CONNS=%s "
      "bench/tls.sh --record`. rtrs-perf over 127.0.0.1, one session, %s IO connection(s), "
      "DH-HMAC-CHAP on every chain (`--auth-keys`, `--secret`), TLS 1.3 with a configured PSK "
      "(`--tls required --tls-key`, TLS_AES_128_GCM_SHA256) on the TLS chains; 4 KiB IO at QD 64, "
      "1 MiB at QD 8 (servers `-c 2M -q 16`: a chunk holds an IO and its header). Medians of the rounds, each chain once per round, the "
      "order rotating (bench/chains.py); CPU per IO = utime + stime of client and server over the "
      "run, divided by the ops; the ratios are taken in each round, then their median with the "
      "lowest and highest in brackets. Every chain first ran once with `--verify` and "
      "`--log-level debug`: no error, no bad byte, and the TLS named below. Plot: [%s](plots/%s)." % (
          machine, load0, load1,
          ("; the guest: Linux %s under TCG (%s vCPU, no KVM; %s), tls.ko loaded" % (
              kver, smp, "; ".join(l.strip() for l in open(run + "/guest-crypto.txt"))))
          if guest else "",
          runs, dur, guest, gruns, gdur, smp, conns, conns, os.path.basename(plot),
          os.path.basename(plot)))
print()
print("Host (%s rounds of %s s; this kernel has no TLS module, so TLS is OpenSSL's records in "
      "user space):" % (runs, dur))
print()
print(table("host", False))
if guest:
    print()
    print("In the guest (%s rounds of %s s; TCG: the absolute numbers are far below a real "
          "host's, the ratios are what to read; \"guest CPU (all)\" is the whole guest's "
          "non-idle time from /proc/stat over the run, the kernel's softirqs and kworkers "
          "included):" % (gruns, gdur))
    print()
    print(table("guest", True))
    print()
    for op in ("write", "read"):
        k, b = out["guest"]["tls-4k-" + op], out["guest"]["plain-4k-" + op]
        med = statistics.median(x["cpu_us_per_io"] / y["cpu_us_per_io"]
                                for x, y in zip(k["runs"], b["runs"]))
        print("Goal, 4 KiB %s: CPU per IO with kernel TLS %s of plain's (client and server "
              "processes; whole guest %s): the goal of <= 1.3x %s." % (
                  op, round_ratio(k, b), round_ratio(k, b, "sys_us_per_io"),
                  "holds" if med <= 1.3 else "is missed"))
        print()
if guest:
    print("Which TLS ran (the verify runs; a kernel TLS socket counts once per side and "
          "connection in /proc/net/tls_stat: %d for an admin and %s IO connection(s)):" % (
              2 * (int(conns) + 1), conns))
    print()
    for l in open(run + "/guest-verify.txt"):
        if l.startswith(("tls-4k", "utls-4k")):
            print("- guest %s" % l.strip().replace("`", ""))
    print()
print("BENCH-END")
for p, _ in sides:
    print("VERIFY %s" % p)
    print(open("%s/%s-verify.txt" % (run, p)).read().rstrip())

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
groups, series = [], {}
for p, _ in sides:
    for sz in ("4k", "1M"):
        for op in ("write", "read"):
            groups.append("%s\n%s %s" % (p, "4 KiB" if sz == "4k" else "1 MiB", op))
            for m in ("tls", "utls"):
                n = "%s-%s-%s" % (m, sz, op)
                key = "%s: %s" % (p, label[p][m]) if m in label[p] else None
                if key is None:
                    continue
                base = out[p]["plain-%s-%s" % (sz, op)]
                c = out[p][n]
                for what_, k in (("cpu", "cpu_us_per_io"), ("tput", "iops")):
                    v = [x[k] / y[k] for x, y in zip(c["runs"], base["runs"])]
                    series.setdefault((what_, key), {})[len(groups) - 1] = (
                        statistics.median(v), min(v), max(v))
keys = []
for (w, k) in series:
    if k not in keys:
        keys.append(k)
fig, axes = plt.subplots(1, 2, figsize=(13, 5))
colors = dict(zip(keys, ["tab:blue", "tab:orange", "tab:green", "tab:red"]))
for ax, w, title in ((axes[0], "cpu", "CPU per IO (client + server), TLS / plain (log)"),
                     (axes[1], "tput", "throughput, TLS / plain (log)")):
    for g in range(len(groups)):
        here = [k for k in keys if g in series.get((w, k), {})]
        width = 0.8 / max(1, len(keys))
        for i, k in enumerate(here):
            med, lo, hi = series[(w, k)][g]
            x = g + (i - (len(here) - 1) / 2) * width
            ax.bar(x, med, width=width, color=colors[k], yerr=[[med - lo], [hi - med]],
                   capsize=2, label=k if g == min(d for d in series[(w, k)]) else None)
            ax.annotate("%.2g" % med, (x, med), ha="center", va="bottom", fontsize=6,
                        xytext=(0, 2), textcoords="offset points")
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    if w == "cpu":
        ax.axhline(1.3, color="red", linestyle="--", linewidth=0.9,
                   label="goal: kernel TLS, 4 KiB <= 1.3x")
    ax.set_xticks(range(len(groups)), groups, fontsize=7)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
fig.suptitle("rtrs-perf over loopback tcp, one session: what TLS costs (medians of the rounds, "
             "bars: lowest and highest round)", fontsize=10)
fig.tight_layout()
fig.savefig(run + "/plot.png", dpi=90)
PY
)
echo "$report"
if [ -n "${KEEP:-}" ]; then
	mkdir -p "$KEEP"
	(cd "$run" && cp -- *-out.json *-verify.txt *-sys.txt *.log plot.png "$KEEP"/ 2>/dev/null) || true
fi
if [ "$GUEST" = 1 ]; then
	echo "kernel warnings or oopses in the guest: $(cat "$run/oops" 2>/dev/null || echo '?')"
fi
$record || exit 0
mkdir -p bench/plots
cp "$run/plot.png" "$plot"
sed '/^BENCH-END$/,$d' <<<"$report" >>bench/RESULTS.md
echo "bench: appended to bench/RESULTS.md" >&2
