"""The console scripts ``tierctl`` and ``tierbench`` of a pip-installed libtier.

The wheel keeps the programs inside the package (``libtier/_bin/``, beside the libraries they
link, which RPATH finds there); pip's scripts in the environment's ``bin/`` call these functions,
which replace the Python process with the program, its arguments and exit status unchanged. In a
build tree or a ``meson install`` the programs are ordinary executables and this is not used.
"""

from __future__ import annotations

import os
import sys


def _run(name: str) -> int:
    program = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", name)
    if not os.access(program, os.X_OK):
        sys.stderr.write(
            f"{name}: {program} is missing: this libtier package was not installed from a "
            f"wheel (in a build tree, run build/apps/{name}/{name})\n"
        )
        return 127
    os.execv(program, [name] + sys.argv[1:])
    return 127  # not reached


def tierctl() -> int:
    """Runs the packaged tierctl with this process's arguments."""
    return _run("tierctl")


def tierbench() -> int:
    """Runs the packaged tierbench with this process's arguments."""
    return _run("tierbench")
