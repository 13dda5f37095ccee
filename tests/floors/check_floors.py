#!/usr/bin/env python3
"""Checks that no #include points up a floor (README.md, "Architecture").

Usage: check_floors.py ROOT        exit 0 when clean, 1 with one line per violation

Every library of the project has a folder of its own; FLOORS maps each top-level folder to its
floor. A folder that holds one library is one component (`libtier/`, `hip/`, `engine/`,
`capi/`); a folder that holds one library per subfolder (`backends/`, `codecs/`, `layouts/`)
makes each subfolder a component of its own:
  0  libtier/         the core, with the entry glue every plugin links (libtier/plugins/)
  1  hip/             the GPU runtime and kernels
  2  engine/          the generic offload engine
  2  sizing/          request traces and their LRU hit-ratio curves
  2  backends/<name>/ one backend plugin each
  2  codecs/<name>/   one codec each
  3  layouts/<name>/  the engine's KV layout for a model family
  4  capi/            the C API (libtier_c: may include every floor below)
A file may include headers of its own component and of components on lower floors, never of a
component on its own floor or above (a backend does not include another backend's header, the
core includes no backend, codec, engine or GPU header). apps/, tests/ and python/ sit on top and
are not checked. An include is resolved as the compiler would: beside the including file first,
then by matching the path's tail against the project's headers.
"""
import os
import re
import sys

SOURCE_EXT = (".hpp", ".cpp", ".h", ".c", ".hip", ".cu")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


# top-level folder -> (floor, whether each subfolder is a component of its own)
FLOORS = {
    "libtier": (0, False),
    "hip": (1, False),
    "engine": (2, False),
    "sizing": (2, False),
    "backends": (2, True),
    "codecs": (2, True),
    "layouts": (3, True),
    "capi": (4, False),
}


def component(rel):
    """(floor, component name) of a repo-relative path, or None when it is not checked."""
    parts = rel.split("/")
    if parts[0] not in FLOORS:
        return None
    floor, per_subfolder = FLOORS[parts[0]]
    if not per_subfolder:
        return floor, parts[0]
    if len(parts) < 3:  # a file beside the subfolders (none has sources)
        return None
    return floor, parts[0] + "/" + parts[1]


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = []
    for top in FLOORS:
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
