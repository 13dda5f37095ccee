"""libtier's log in Python's logging (docs/logging.md): the level calls, the routing of library
messages (also from a library thread) into the logger "libtier", TIER_LOG_LEVEL, and the two
warnings a caller needs: the default namespace over a persistent tier (once per process) and a
load into buffers of the wrong size."""

import logging
import os
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

import libtier

from conftest import CPU_PROFILE


@pytest.fixture
def records():
    """The records of the "libtier" logger while the test runs."""
    got = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append(record)

    handler = Keep(level=logging.DEBUG)
    logger = logging.getLogger("libtier")
    level = logger.level
    logger.setLevel(logging.DEBUG)  # Python's own filter: WARNING by default, from the root
    logger.addHandler(handler)
    yield got
    logger.removeHandler(handler)
    logger.setLevel(level)


def run_python(code, **env):
    """Runs `code` in a fresh interpreter with this one's environment plus `env`."""
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                          capture_output=True, text=True, timeout=120)


def test_levels_set_and_read():
    before = libtier.log_level()
    try:
        libtier.set_log_level("debug")
        assert libtier.log_level() == "debug"
        libtier.set_log_level("off")
        assert libtier.log_level() == "off"
    finally:
        libtier.set_log_level(before)
    with pytest.raises(ValueError):
        libtier.set_log_level("loud")
    with pytest.raises(ValueError):
        libtier.set_log_level(10)


def test_wrong_size_load_is_logged_with_both_sizes(store, records):
    key = libtier.external_key("wrong-size")
    assert store.save([key], [np.arange(1000, dtype=np.uint8)]) == [libtier.Code.OK]
    [stat] = store.stat([key])
    assert stat.nbytes == 1000 and stat.tier_name == "cpu" and stat.stored_bytes == 1096
    small = np.zeros(600, dtype=np.uint8)
    assert store.load([key], [small]) == [libtier.Code.INVALID_ARGUMENT]
    assert not small.any()  # nothing written
    assert libtier.flush_logs()
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert warnings, [r.getMessage() for r in records]
    text = warnings[-1].getMessage()
    assert "stored payload is 1000 bytes, these regions take 600" in text, text
    assert warnings[-1].name == "libtier"


def test_messages_from_a_library_thread_reach_logging(records):
    """A store's transfer thread logs the wrong-size warning; the package's thread delivers it."""
    with libtier.Store.open(CPU_PROFILE) as s:
        key = libtier.external_key("async-wrong-size")
        s.save([key], [np.ones(256, dtype=np.uint8)])
        ticket = s.load_async([key], [np.zeros(100, dtype=np.uint8)])
        done = s.wait(ticket, timeout=30)
        assert done.codes == [libtier.Code.INVALID_ARGUMENT]
    assert libtier.flush_logs()
    assert any("these regions take 100" in r.getMessage() for r in records)


def test_info_messages_only_at_info(records):
    before = libtier.log_level()
    profile = dict(CPU_PROFILE, tiers=CPU_PROFILE["tiers"] + [
        {"name": "gone", "capacity": "1MiB", "optional": True,
         "backend": {"type": "gpu", "device": 0}}])
    try:
        libtier.set_log_level("warn")
        try:
            store = libtier.Store.open(profile)
        except libtier.InvalidArgument as e:
            if 'unknown backend "gpu"' not in str(e):
                raise
            pytest.skip("no gpu plugin in this build (sanitizer builds leave the GPU out)")
        store.close()
        assert libtier.flush_logs()
        assert not any("optional tier left out" in r.getMessage() for r in records)
        libtier.set_log_level("info")
        with libtier.Store.open(profile) as s:
            if "gone" in s.tier_names:
                pytest.skip("a GPU is here: the optional tier is not left out")
        assert libtier.flush_logs()
        infos = [r for r in records if "optional tier left out" in r.getMessage()]
        assert infos and infos[0].levelno == logging.INFO
    finally:
        libtier.set_log_level(before)


def test_tier_log_level_from_the_environment_and_quiet_by_default():
    code = """
        import libtier
        print(libtier.log_level())
    """
    assert run_python(code, TIER_LOG_LEVEL="debug").stdout.split() == ["debug"]
    env = dict(os.environ)
    env.pop("TIER_LOG_LEVEL", None)
    out = subprocess.run([sys.executable, "-c", "import libtier; print(libtier.log_level())"],
                         env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["warn"]
    bad = run_python(code, TIER_LOG_LEVEL="loud")
    assert bad.stdout.split() == ["warn"]
    assert "TIER_LOG_LEVEL" in bad.stderr and "not a log level" in bad.stderr


def test_profile_level_applies_unless_the_program_set_one():
    code = """
        import libtier
        p = {"log": {"level": "debug"},
             "tiers": [{"name": "cpu", "capacity": "1MiB", "backend": {"type": "cpu"}}]}
        libtier.Store.open(p).close()
        print(libtier.log_level())
        libtier.set_log_level("error")
        libtier.Store.open(p).close()
        print(libtier.log_level())
    """
    env = {k: v for k, v in os.environ.items() if k != "TIER_LOG_LEVEL"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["debug", "error"], out.stderr


def test_default_namespace_on_a_persistent_tier_warns_once():
    segment = "libtier-test-ns-" + uuid.uuid4().hex[:12]
    code = f"""
        import logging, libtier
        seen = []
        class Keep(logging.Handler):
            def emit(self, r): seen.append(r.getMessage())
        logging.getLogger("libtier").addHandler(Keep())
        p = {{"tiers": [{{"name": "shared", "capacity": "4MiB",
               "backend": {{"type": "cpu", "mode": "shm", "segment": "{segment}"}}}}]}}
        libtier.Store.open(p, namespace={{"model": "m"}}).close()   # a namespace: no warning
        libtier.flush_logs()
        print(len([m for m in seen if "default namespace" in m]))
        libtier.Store.open(p).close()
        libtier.Store.open(p).close()                              # once per process
        libtier.flush_logs()
        hits = [m for m in seen if "default namespace" in m]
        print(len(hits))
        print(hits[0])
    """
    try:
        out = run_python(code)
    finally:
        path = os.path.join("/dev/shm", segment)
        if os.path.exists(path):
            os.unlink(path)
    lines = out.stdout.splitlines()
    assert lines[:2] == ["0", "1"], out.stdout + out.stderr
    assert "tier shared is persistent" in lines[2] and "docs/integration.md" in lines[2]
