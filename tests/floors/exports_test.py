#!/usr/bin/env python3
"""Checks that a shared object exports exactly the symbols its version script lists.

Usage: exports_test.py MAP SO [SO ...]     exit 0 when every SO's exported set equals MAP's list

A version script (liburing's src/liburing.map is the model) names each exported symbol: a C
symbol bare (`tier_plugin_entry;`), a C++ one as its demangled name in quotes inside
`extern "C++" { ... }` (quotes make ld match the name exactly, not as a pattern). The `local: *;`
section hides the rest. A pattern in the global section is refused: the list must be the API.
Reported: symbols exported but not listed (a leak) and listed but not exported (a stale entry).
"""
import re
import subprocess
import sys

LINKER = {"_init", "_fini", "_edata", "_end", "__bss_start"}


def listed(path):
    text = re.sub(r"/\*.*?\*/", "", open(path, encoding="utf-8").read(), flags=re.S)
    text = re.sub(r"#[^\n]*", "", text)
    glob = text.split("global:", 1)[1].split("local:", 1)[0]
    names = set()
    for block in re.finditer(r'extern\s+"C\+\+"\s*\{(.*?)\};', glob, re.S):
        for entry in re.findall(r'"((?:[^"\\]|\\.)*)"\s*;', block.group(1)):
            names.add(entry)
        rest = re.sub(r'"(?:[^"\\]|\\.)*"\s*;', "", block.group(1)).strip()
        if rest:
            sys.exit(f"{path}: unquoted C++ entries (patterns) in the global section: {rest[:80]}")
    plain = re.sub(r'extern\s+"C\+\+"\s*\{.*?\};', "", glob, flags=re.S)
    for entry in re.findall(r"([^\s;]+)\s*;", plain):
        if any(c in entry for c in "*?["):
            sys.exit(f"{path}: a pattern in the global section: {entry}")
        names.add(entry)
    return names


def exported(so):
    out = subprocess.run(["nm", "-D", "--defined-only", "-C", so], capture_output=True, text=True,
                         check=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[2] not in LINKER:
            names.add(parts[2])
    return names


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    want = listed(sys.argv[1])
    bad = 0
    for so in sys.argv[2:]:
        have = exported(so)
        leak, stale = sorted(have - want), sorted(want - have)
        for s in leak:
            print(f"{so}: exports {s}, which {sys.argv[1]} does not list")
        for s in stale:
            print(f"{so}: does not export {s}, which {sys.argv[1]} lists")
        bad += len(leak) + len(stale)
        if not leak and not stale:
            print(f"{so}: {len(have)} exported symbols, exactly the list of {sys.argv[1]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
