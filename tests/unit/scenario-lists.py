#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Every scenario a fake-fabric program has (its `scenarios[]` table) is one
meson test (the *_scenarios lists in tests/unit/meson.build), and the lists
name no scenario the program lacks: a scenario left out of its list never
ran in CI. Usage: scenario-lists.py SOURCE_ROOT"""
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
meson = open(f"{root}/tests/unit/meson.build").read()
bad = 0
checked = 0
for m in re.finditer(r"(\w+)_scenarios = \[(.*?)\]\s*\nexe = executable\('([\w-]+)', '([\w.-]+)'",
                     meson, re.S):
    listed = re.findall(r"'(\w+)'", m.group(2))
    src = open(f"{root}/tests/unit/{m.group(4)}").read()
    table = re.search(r"scenarios\[\] = \{(.*?)\n\};", src, re.S)
    if not table:
        print(f"{m.group(4)}: no scenarios[] table")
        bad += 1
        continue
    have = re.findall(r'\{ "(\w+)",', table.group(1))
    for s in have:
        if s not in listed:
            print(f"{m.group(4)}: scenario {s} is not in {m.group(1)}_scenarios (meson.build)")
            bad += 1
    for s in listed:
        if s not in have:
            print(f"meson.build: {m.group(1)}_scenarios names {s}, which {m.group(4)} lacks")
            bad += 1
    for s in set(listed):
        if listed.count(s) > 1:
            print(f"meson.build: {m.group(1)}_scenarios names {s} twice")
            bad += 1
    checked += 1
if checked < 4:
    print(f"only {checked} scenario lists found in meson.build (the pattern is stale)")
    bad += 1
print(f"scenario-lists: {checked} programs, {bad} problems")
sys.exit(1 if bad else 0)
