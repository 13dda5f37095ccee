#!/usr/bin/env python3
"""Checks that the words of the tree name what exists (issue 27: docs that match the code).

Usage: check_refs.py ROOT      exit 0 when clean, 1 with one line per stale reference

1. Every repo path named in a comment of a source file, in a Markdown page or a build file
   (a word that starts with one of the project's top-level folders and ends in a file
   extension, like `backends/cpu/shm/store.hpp`) names a file or folder that exists; a
   `{hpp,cpp}` group names each member.
2. Every file name a source comment names on its own (`gpu.hpp`, `kv_memory.cpp`) is the name of
   a file somewhere in the tree, unless it is a header of the system or a dependency (`<...>`
   includes are not comments and are not read).
3. The plugin ABI version that docs/plugins.md states equals TIER_PLUGIN_ABI_VERSION in
   libtier/include/tier/plugin.h, and plugin.h's prose states no number of its own.
"""
import os
import re
import subprocess
import sys

TOPS = ("libtier", "hip", "engine", "sizing", "backends", "codecs", "layouts", "capi", "python",
        "apps", "tests", "docs", "profiles", ".ci", "subprojects")
EXT = r"(?:hpp|cpp|h|c|hip|cu|py|pyi|sh|md|json|map|build|txt|toml|in)"
PATH_RE = re.compile(r"(?<![\w./-])((?:%s)/[\w./{},*-]*?\.(?:%s|\{[\w,]+\}))(?![\w])" %
                     ("|".join(re.escape(t) for t in TOPS), EXT))
NAME_RE = re.compile(r"(?<![\w./-])([a-z][\w-]*\.(?:hpp|cpp|hip|cu))(?![\w./])")
SOURCE_EXT = (".hpp", ".cpp", ".h", ".c", ".hip", ".cu", ".py", ".pyi", ".sh")
# File names of other projects that comments name on purpose (what a format or a fix follows).
FOREIGN = {"io_uring-cp.c", "xxhash.h", "xxh_x86dispatch.h", "zlib.h", "hip_runtime.h",
           "cuda_runtime.h"}
# Paths of other projects that start like ours (SGLang's python/ tree, HIP's include folder).
FOREIGN_PATHS = ("python/sglang/", "hip/hip_")


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard"],
                         capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if os.path.exists(os.path.join(root, p))]


def comments(path, text):
    """The comment text of a source file (line comments and block comments), line by line."""
    if path.endswith((".py", ".pyi", ".sh", "meson.build")):
        for n, line in enumerate(text.splitlines(), 1):
            i = line.find("#")
            if i >= 0 and not line.lstrip().startswith("#include"):
                yield n, line[i:]
            for m in re.finditer(r'"""(.*?)"""|\'\'\'(.*?)\'\'\'', line):
                yield n, m.group(0)
        return
    in_block = False
    for n, line in enumerate(text.splitlines(), 1):
        if in_block:
            end = line.find("*/")
            yield n, line if end < 0 else line[:end]
            in_block = end < 0
            continue
        i = line.find("//")
        j = line.find("/*")
        if i >= 0 and (j < 0 or i < j):
            yield n, line[i:]
        elif j >= 0:
            end = line.find("*/", j)
            yield n, line[j:] if end < 0 else line[j:end]
            in_block = end < 0


def expand(ref):
    m = re.search(r"\{([\w,]+)\}", ref)
    if not m:
        return [ref]
    return [ref[:m.start()] + part + ref[m.end():] for part in m.group(1).split(",")]


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = tracked(root)
    names = {os.path.basename(f) for f in files}
    dirs = {os.path.dirname(f) for f in files}
    exists = set(files) | dirs
    problems = []

    def check_path(where, ref):
        if "*" in ref or ref.startswith(FOREIGN_PATHS):
            return
        for p in expand(ref.rstrip(".,")):
            if p not in exists and not os.path.exists(os.path.join(root, p)):
                problems.append(f"{where}: names {p}, which does not exist")

    for f in files:
        full = os.path.join(root, f)
        if f.endswith(".md") or os.path.basename(f) in ("meson.build", "Makefile"):
            with open(full, encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    for m in PATH_RE.finditer(line):
                        check_path(f"{f}:{n}", m.group(1))
            continue
        if not f.endswith(SOURCE_EXT) or f.startswith("tests/fuzz/corpus/"):
            continue
        with open(full, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for n, c in comments(f, text):
            for m in PATH_RE.finditer(c):
                check_path(f"{f}:{n}", m.group(1))
            for m in NAME_RE.finditer(c):
                name = m.group(1)
                if name not in names and name not in FOREIGN:
                    problems.append(f"{f}:{n}: names {name}, which no file of the tree is called")

    plugin_h = open(os.path.join(root, "libtier/include/tier/plugin.h"), encoding="utf-8").read()
    abi = re.search(r"#define TIER_PLUGIN_ABI_VERSION (\d+)u", plugin_h).group(1)
    prose = plugin_h.split("#define TIER_PLUGIN_ABI_VERSION")[0]
    if re.search(r"version \d", prose, re.I):
        problems.append("libtier/include/tier/plugin.h: its leading comment states an ABI version "
                        "number; name TIER_PLUGIN_ABI_VERSION instead")
    doc = open(os.path.join(root, "docs/plugins.md"), encoding="utf-8").read()
    for m in re.finditer(r"ABI version is (\d+)", doc):
        if m.group(1) != abi:
            problems.append(f"docs/plugins.md: says the ABI version is {m.group(1)}; plugin.h "
                            f"says {abi}")
    for p in problems:
        print(p)
    print(f"references: {len(files)} files read, {len(problems)} stale")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
