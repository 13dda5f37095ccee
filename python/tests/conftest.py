"""Fixtures of the libtier package's tests (run by `make test` through run_pytest.sh, with
PYTHONPATH at build/python and TIER_PLUGIN_DIR, TIER_SOURCE_ROOT, TIER_BUILD_ROOT set)."""

import os

import pytest

import libtier

CPU_PROFILE = {
    "tiers": [{"name": "cpu", "capacity": "64MiB", "backend": {"type": "cpu"}}],
}


@pytest.fixture
def store():
    with libtier.Store.open(CPU_PROFILE) as s:
        yield s


@pytest.fixture
def source_root():
    return os.environ.get("TIER_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
