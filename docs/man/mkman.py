#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Makes a man page: an scdoc(5) source with its option lists filled in from
the programs' own option tables, rendered by scdoc(1).

    mkman.py SCDOC VERSION TEMPLATE OUTPUT [MARKER FORMAT PROG [ARG...] ---]...

Each line of TEMPLATE that is exactly "@MARKER@" is replaced by what PROG
ARG... prints with RTRS_HELP_FORMAT=FORMAT in its environment (opts_help in
lib/common/opts.c: "man" for command-line options, "man-config" for the
names a config file takes; FORMAT "-" runs PROG as it is, for a generator
such as nbdkit/rnbd-plugin-man). "@VERSION@" anywhere becomes VERSION. A
marker left unfilled, a filler that fails (an exit status but 0, or 1 after
--help) or prints nothing, or scdoc refusing the result stops the build with
the page's name.
"""
import os
import subprocess
import sys


def fail(msg):
    sys.stderr.write("mkman: %s\n" % msg)
    sys.exit(1)


def main(argv):
    if len(argv) < 5:
        fail("usage: mkman.py SCDOC VERSION TEMPLATE OUTPUT [MARKER FORMAT PROG [ARG...] ---]...")
    scdoc, version, template, output = argv[1:5]
    fills = {}
    rest = argv[5:]
    while rest:
        if "---" not in rest or rest.index("---") < 3:
            fail("%s: a filler is MARKER FORMAT PROG [ARG...] ---" % template)
        end = rest.index("---")
        marker, fmt, cmd = rest[0], rest[1], rest[2:end]
        rest = rest[end + 1:]
        env = dict(os.environ)
        env.pop("RTRS_HELP_FORMAT", None)
        if fmt != "-":
            env["RTRS_HELP_FORMAT"] = fmt
        run = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             universal_newlines=True)
        if run.returncode not in (0, 1):  # opts_parse returns 1 after --help
            fail("%s: %s exited with %d: %s" % (template, " ".join(cmd), run.returncode,
                                                 run.stderr.strip()))
        if not run.stdout.strip():
            fail("%s: %s printed nothing" % (template, " ".join(cmd)))
        fills[marker] = run.stdout.rstrip("\n")

    with open(template, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, used = [], set()
    for line in lines:
        if len(line) > 2 and line.startswith("@") and line.endswith("@") and line != "@VERSION@":
            name = line[1:-1]
            if name not in fills:
                fail("%s: no filler for %s" % (template, line))
            used.add(name)
            out += [fills[name], ""]
            continue
        out.append(line.replace("@VERSION@", version))
    unused = set(fills) - used
    if unused:
        fail("%s: no line for %s" % (template, ", ".join(sorted(unused))))

    run = subprocess.run([scdoc], input="\n".join(out), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True)
    if run.returncode != 0:
        fail("%s: scdoc: %s" % (template, run.stderr.strip()))
    with open(output, "w", encoding="utf-8") as f:
        f.write(run.stdout)


if __name__ == "__main__":
    main(sys.argv)
