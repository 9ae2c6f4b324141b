#!/usr/bin/python3
"""Runs block IO chains alternately and reports, per chain, the IO/s and
the CPU time per IO summed over every process of the chain: the client
(fio or rnbd-client perf: its rusage) and each long-lived process behind it
(nbdkit, rnbd-server: utime + stime from /proc over the run).

Usage: chains.py SPEC.json OUT.json [PLOT.png]
SPEC: {"runs": N, "title": "...", "chains": [{"name": ..., "cmd": [...],
        "kind": "fio" | "perf" | "ops", "procs": {"label": PID, ...}}, ...],
       "syscalls": SECONDS (optional)}
OUT: per chain the runs (in round order) and their medians (CPU per IO in
all, and per process: all, and user time alone); PLOT: IO/s and CPU per IO per
chain, side by side (python3-matplotlib).

With "syscalls", every process of the chain is also watched by perf stat
(its system calls by kind and its context switches) over a window of that
many seconds, from 1.5 s into the run (the sessions and their threads are
up by then): per run "sys" gives, per process, the counts per IO, taken
with the run's IO/s over the window. Counting costs CPU, so the scripts
that report CPU per IO do not ask for it.
"""
import json
import os
import statistics
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def ticks(pid, user_only=False):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + (0 if user_only else int(fields[12]))  # utime, stime


def ios_of(kind, text):
    """(ios, iops, errors) from the client's JSON."""
    # fio's nbd engine says "fio: connected to NBD server" before its JSON.
    j = json.loads(text[text.index("{"):])
    if kind == "ops":  # rtrs-perf and raw-loop
        return j["ops"], j["ops_per_sec"], j["errors"]
    if kind == "fio":
        job = j["jobs"][0]
        n = job["read"]["total_ios"] + job["write"]["total_ios"]
        return n, job["read"]["iops"] + job["write"]["iops"], job["error"]
    return j["reads"] + j["writes"], j["iops"], j["errors"] + j.get("bad", 0)


# What perf stat counts per process in "syscalls" mode.
SYSCALLS = ["sendmsg", "sendto", "recvfrom", "recvmsg", "epoll_wait", "epoll_pwait", "poll", "ppoll",
            "read", "write", "readv", "writev", "futex", "io_uring_enter", "pread64", "pwrite64",
            "preadv2", "pwritev2"]
EVENTS = ["raw_syscalls:sys_enter", "context-switches"] + \
    ["syscalls:sys_enter_" + n for n in SYSCALLS]


def watch(pids, window):
    """perf stat on each process (label: pid) for window seconds; started now."""
    out = {}
    for k, p in pids.items():
        f = "/tmp/chains-perf-%d-%s.csv" % (os.getpid(), k)
        out[k] = (f, subprocess.Popen(["perf", "stat", "-x,", "-e", ",".join(EVENTS), "-p",
                                       str(p), "-o", f, "--", "sleep", str(window)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return out


def counts(watched):
    """{label: {event: count}} of watch()'s processes, once they ended."""
    res = {}
    for k, (f, proc) in watched.items():
        proc.wait()
        c = {}
        with open(f) as fh:
            for line in fh:
                x = line.strip().split(",")
                if len(x) > 2 and x[0].isdigit():
                    name = x[2].replace("syscalls:sys_enter_", "")
                    c["syscalls" if name == "raw_syscalls:sys_enter" else name] = int(x[0])
        os.unlink(f)
        res[k] = c
    return res


def run(chain, window=None):
    t0 = {k: ticks(p) for k, p in chain["procs"].items()}
    u0 = {k: ticks(p, True) for k, p in chain["procs"].items()}
    start = time.monotonic()
    proc = subprocess.Popen(chain["cmd"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    watched = None
    if window:
        time.sleep(1.5)
        watched = watch(dict(chain["procs"], client=proc.pid), window)
    out, err = proc.communicate()
    wall = time.monotonic() - start
    t1 = {k: ticks(p) for k, p in chain["procs"].items()}
    u1 = {k: ticks(p, True) for k, p in chain["procs"].items()}
    if proc.returncode != 0:
        raise SystemExit("%s failed (%d): %s" % (chain["name"], proc.returncode,
                                                  err.decode(errors="replace")[-2000:]))
    try:
        n, iops, errors = ios_of(chain["kind"], out.decode())
    except (ValueError, KeyError) as e:
        raise SystemExit("%s: no result (%s): %s %s" % (chain["name"], e,
                                                       out.decode(errors="replace")[:500],
                                                       err.decode(errors="replace")[-1500:]))
    if errors or n == 0:
        raise SystemExit("%s: %d errors, %d IOs" % (chain["name"], errors, n))
    r = {"ios": n, "iops": iops, "wall": wall, "cpu": {k: (t1[k] - t0[k]) / TICK for k in t0},
         "user": {k: (u1[k] - u0[k]) / TICK for k in u0}}
    if watched:
        r["sys"] = {k: {e: v / (iops * window) for e, v in c.items()}
                    for k, c in counts(watched).items()}
    return r


def spread(values):
    """Ratios taken one per round: their median, then the lowest and highest."""
    return "%.2fx (%.2f-%.2f)" % (statistics.median(values), min(values), max(values))


def round_ratio(a, b, key="cpu_us_per_io"):
    """Chain a against chain b (two of OUT's chains), key of a run over the
    same of b's run in the same round, as spread() gives it. The reports of
    the scripts import this (sys.path gets bench/)."""
    return spread([x[key] / y[key] for x, y in zip(a["runs"], b["runs"])])


def main():
    spec = json.load(open(sys.argv[1]))
    chains = spec["chains"]
    results = {c["name"]: [] for c in chains}
    # The client's own CPU: rusage of the children, taken around each run.
    # Round i starts at chain i (mod their number): none runs first in every
    # round, after a quiet pause or right behind the same neighbour. The runs
    # of every chain stay in round order, so runs[i] of two chains are of one
    # round and can be compared pair by pair.
    for i in range(spec["runs"]):
        k = i % len(chains)
        for c in chains[k:] + chains[:k]:
            before = os.times()
            r = run(c, spec.get("syscalls"))
            after = os.times()
            r["cpu"]["client"] = (after.children_user - before.children_user +
                                  after.children_system - before.children_system)
            r["user"]["client"] = after.children_user - before.children_user
            r["cpu_us_per_io"] = sum(r["cpu"].values()) * 1e6 / r["ios"]
            results[c["name"]].append(r)
    out = {"title": spec.get("title", ""), "chains": []}
    for c in chains:
        rs = results[c["name"]]
        parts = {k: statistics.median(r["cpu"][k] * 1e6 / r["ios"] for r in rs)
                 for k in rs[0]["cpu"]}
        out["chains"].append({
            "name": c["name"], "label": c.get("label", c["name"]), "runs": rs,
            "iops": statistics.median(r["iops"] for r in rs),
            "cpu_us_per_io": statistics.median(r["cpu_us_per_io"] for r in rs),
            "cpu_parts_us_per_io": parts,
            # of which user time (the rest is the kernel's)
            "user_parts_us_per_io": {k: statistics.median(r["user"][k] * 1e6 / r["ios"]
                                                          for r in rs) for k in rs[0]["user"]},
        })
        if "sys" in rs[0]:
            out["chains"][-1]["sys_per_io"] = {
                k: {e: statistics.median(r["sys"][k].get(e, 0.0) for r in rs)
                    for e in rs[0]["sys"][k]} for k in rs[0]["sys"]}
    json.dump(out, open(sys.argv[2], "w"), indent=1)
    if len(sys.argv) > 3:
        plot(out, sys.argv[3])


def plot(out, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [c["label"] for c in out["chains"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 0.6 * len(names) + 2))
    y = range(len(names))
    a.barh(y, [c["iops"] for c in out["chains"]], color="tab:blue")
    a.set_yticks(list(y), names)
    a.invert_yaxis()
    a.set_xlabel("IO/s (median)")
    left = [0.0] * len(names)
    keys = sorted({k for c in out["chains"] for k in c["cpu_parts_us_per_io"]})
    for k in keys:
        vals = [c["cpu_parts_us_per_io"].get(k, 0.0) for c in out["chains"]]
        b.barh(y, vals, left=left, label=k)
        left = [l + v for l, v in zip(left, vals)]
    b.set_yticks(list(y), [""] * len(names))
    b.invert_yaxis()
    b.set_xlabel("CPU us per IO, every process of the chain (median)")
    b.legend(fontsize="small")
    fig.suptitle(out["title"])
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
