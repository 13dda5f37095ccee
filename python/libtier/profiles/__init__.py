"""The profiles that ship with libtier (the repository's profiles/ folder, docs/profiles.md).

``libtier.Store.open(libtier.profiles.path("cpu"))`` opens the CPU tier profile. A profile
resolves relative paths against its own folder, so the profiles with a disk tier ("default",
"disk") would keep their data inside the installed package: set ``TIER_DATA_DIR`` for them, or
open ``load(name)`` (a dict: relative paths then resolve against the working directory).
"""

from __future__ import annotations

import json
import os

_DIR = os.path.dirname(os.path.abspath(__file__))


def names() -> list[str]:
    """The names of the shipped profiles, sorted ("cpu", "default", "disk", ...)."""
    return sorted(f[: -len(".json")] for f in os.listdir(_DIR) if f.endswith(".json"))


def path(name: str) -> str:
    """The file of the shipped profile `name` ("cpu" or "cpu.json"). Raises ValueError for a
    name that is not shipped, listing those that are."""
    base = name[: -len(".json")] if name.endswith(".json") else name
    if base not in names():
        raise ValueError(f"no profile {name!r} ships with libtier; there are: {', '.join(names())}")
    return os.path.join(_DIR, base + ".json")


def load(name: str) -> dict:
    """The shipped profile `name` as a dict, for Store.open or to change before opening."""
    with open(path(name), encoding="utf-8") as f:
        return json.load(f)
