#!/usr/bin/env python3
"""Checks that no #include points up a floor (README.md, "Architecture").

Usage: check_floors.py ROOT        exit 0 when clean, 1 with one line per violation

Each source file under the library folders belongs to a component on a floor:
  0  core          libtier/include, libtier/src
  1  gpu           hip/
  2  plugins       backends/<name>/, codecs/<name>/ (each its own component), libtier/plugins/
  2  engine        libtier/engine/
  3  dsv4 layout   codecs/dsv4/layout/
  4  c api         capi/ (libtier_c: may include every floor below)
A file may include headers of its own component and of components on lower floors, never of a
component on its own floor or above (a backend does not include another backend's header, the
core includes no backend, codec, engine or GPU header). apps/ and tests/ sit on top and are not
checked. An include is resolved as the compiler would: beside the including file first, then by
matching the path's tail against the project's headers.
"""
import os
import re
import sys

SOURCE_EXT = (".hpp", ".cpp", ".h", ".c", ".hip", ".cu")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def component(rel):
    """(floor, component name) of a repo-relative path, or None when it is not checked."""
    parts = rel.split("/")
    if parts[0] == "libtier":
        if len(parts) > 1 and parts[1] in ("include", "src"):
            return 0, "core"
        if len(parts) > 1 and parts[1] == "engine":
            return 2, "engine"
        if len(parts) > 1 and parts[1] == "plugins":
            return 2, "plugin glue"
        return None
    if parts[0] == "capi":
        return 4, "c api"
    if parts[0] == "hip":
        return 1, "gpu"
    if parts[0] == "codecs" and len(parts) > 2:
        if parts[1] == "dsv4" and parts[2] == "layout":
            return 3, "dsv4 layout"
        return 2, "codec " + parts[1]
    if parts[0] == "backends" and len(parts) > 2:
        return 2, "backend " + parts[1]
    return None


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = []
    for top in ("libtier", "hip", "codecs", "backends", "capi"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for n in names:
                if n.endswith(SOURCE_EXT):
                    files.append(os.path.relpath(os.path.join(dirpath, n), root))
    headers = [f for f in files if component(f) is not None]
    violations = []
    for rel in sorted(files):
        own = component(rel)
        if own is None:
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for lineno, line in enumerate(text.splitlines(), 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            target = m.group(1)
            beside = os.path.normpath(os.path.join(os.path.dirname(rel), target))
            if beside in files:
                resolved = [beside]
            else:
                resolved = [h for h in headers if h == target or h.endswith("/" + target)]
            for dep in resolved:
                floor, name = component(dep)
                if name == own[1]:
                    continue
                if floor >= own[0]:
                    violations.append(
                        f"{rel}:{lineno}: {own[1]} (floor {own[0]}) includes {dep} of {name} "
                        f"(floor {floor}): an include may only point down a floor")
    for v in violations:
        print(v)
    print(f"floors: {len(files)} files checked, {len(violations)} upward or sideways includes")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
