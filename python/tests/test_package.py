"""The package as a user meets it (issue 25): its version, its declared dependency, the profiles it
ships, token validation (a float is never a token), Store.stat and NoSpace, and the console
scripts' runner."""

import os
import subprocess
import sys

import numpy as np
import pytest

import libtier


def test_version(source_root):
    assert libtier.__version__ == libtier.version()
    with open(os.path.join(source_root, "meson.build"), encoding="utf-8") as f:
        assert f"version: '{libtier.__version__}'" in f.read()
    with open(os.path.join(source_root, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    assert f'version = "{libtier.__version__}"' in text
    assert 'dependencies = ["numpy"]' in text  # every buffer but a Region is an array


def test_profiles_ship_with_the_package(source_root):
    shipped = libtier.profiles.names()
    in_repo = sorted(f[:-5] for f in os.listdir(os.path.join(source_root, "profiles"))
                     if f.endswith(".json"))
    assert shipped == in_repo
    path = libtier.profiles.path("cpu")
    assert os.path.isfile(path) and path == libtier.profiles.path("cpu.json")
    with libtier.Store.open(path) as s:
        assert s.tier_names == ["cpu"]
    assert libtier.profiles.load("cpu")["tiers"][0]["name"] == "cpu"
    with pytest.raises(ValueError, match="there are: "):
        libtier.profiles.path("nope")


@pytest.mark.parametrize("tokens", [
    [1, 2.5, 3],
    [1, "2"],
    [True, 1],
    [1, None],
    "1234",
    3,
    np.array([0.5, 1.0, 2.0]),
    np.array([1, 2], dtype=np.float32),
    np.array([1 + 1j]),
])
def test_non_integer_tokens_are_a_type_error(tokens):
    with pytest.raises(TypeError):
        libtier.chunk_keys(libtier.namespace_id({"m": 1}), tokens, 1)


@pytest.mark.parametrize("tokens", [[-1], [2**32], np.array([-3], dtype=np.int64),
                                    np.array([2**40], dtype=np.uint64)])
def test_tokens_out_of_range_are_invalid(tokens):
    with pytest.raises(libtier.InvalidArgument):
        libtier.chunk_keys(libtier.namespace_id({"m": 1}), tokens, 1)


def test_integer_tokens_of_any_form_agree():
    ns = libtier.namespace_id({"m": 1})
    expect = libtier.chunk_keys(ns, [1, 2, 3, 4], 2)
    assert libtier.chunk_keys(ns, (1, 2, 3, 4), 2) == expect
    assert libtier.chunk_keys(ns, np.array([1, 2, 3, 4], dtype=np.int64), 2) == expect
    assert libtier.chunk_keys(ns, np.array([1, 2, 3, 4], dtype=np.uint16), 2) == expect
    assert libtier.chunk_keys(ns, [np.int32(1), np.uint8(2), 3, 4], 2) == expect
    assert libtier.chunk_keys(ns, [2**32 - 1], 1) == libtier.chunk_keys(
        ns, np.array([2**32 - 1], dtype=np.uint32), 1)


def test_stat_and_no_space(store):
    keys = [libtier.external_key(f"stat-{i}") for i in range(3)]
    assert store.save(keys[:2], [np.zeros(10, np.uint8), [np.zeros(5, np.uint8)] * 2]) == [
        libtier.Code.OK] * 2
    a, b, c = store.stat(keys)
    assert (a.tier, a.tier_name, a.nbytes, a.stored_bytes) == (0, "cpu", 10, 106)
    assert b.nbytes == 10
    assert c is None
    assert "nbytes=10" in repr(a)
    with libtier.Store.open({"tiers": [{"name": "small", "capacity": "64KiB",
                                        "backend": "cpu"}]}) as s:
        assert s.save([keys[2]], [np.zeros(128 * 1024, np.uint8)]) == [libtier.Code.NO_SPACE]


def test_console_script_runner_without_a_wheel():
    """In a build tree there is no libtier/_bin: the runner says so instead of failing oddly."""
    out = subprocess.run([sys.executable, "-c",
                          "import sys, libtier._programs as p; sys.exit(p.tierctl())"],
                         capture_output=True, text=True)
    bin_dir = os.path.join(os.path.dirname(libtier.__file__), "_bin")
    if os.path.isdir(bin_dir):
        pytest.skip("an installed wheel: its programs are tested by the install test")
    assert out.returncode == 127
    assert "not installed from a wheel" in out.stderr
