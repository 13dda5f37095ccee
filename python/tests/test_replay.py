"""python/examples/replay_trace.py against `tierbench replay` on a prefix of the real trace:
the same blocks, hits per tier and failures (the workload is replayed call for call)."""

import json
import os
import subprocess
import sys

import pytest

LIMIT = "1500"


def test_replay_matches_tierbench(source_root, tmp_path):
    trace = os.path.join(source_root, "..", "shared", "data", "mooncake_conversation_trace.jsonl")
    trace = os.environ.get("TIER_TRACE", trace)
    if not os.path.exists(trace):
        pytest.skip(f"no trace at {trace}")
    build = os.environ.get("TIER_BUILD_ROOT", os.path.join(source_root, "build"))
    tierbench = os.path.join(build, "apps", "tierbench", "tierbench")
    if not os.path.exists(tierbench):
        pytest.skip(f"no tierbench at {tierbench}")
    profile = os.path.join(source_root, "profiles", "cpu.json")
    # A small CPU tier so that the prefix of the trace evicts (exact LRU on both sides).
    env = dict(os.environ, TIER_CPU_CAPACITY="24MiB")
    args = ["--profile", profile, "--trace", trace, "--limit", LIMIT, "--json"]
    cpp = json.loads(subprocess.run([tierbench, "replay"] + args, env=env, check=True,
                                    capture_output=True, text=True).stdout)
    script = os.path.join(source_root, "python", "examples", "replay_trace.py")
    py = json.loads(subprocess.run([sys.executable, script] + args, env=env, check=True,
                                   capture_output=True, text=True).stdout)
    assert cpp["requests"] == py["requests"] == int(LIMIT)
    assert py["blocks"] == cpp["blocks"]
    assert py["hit_blocks"] == cpp["hit_blocks"]
    assert {k: v["hit_blocks"] for k, v in py["tiers"].items()} == {
        k: v["hit_blocks"] for k, v in cpp["tiers"].items()}
    assert py["hit_blocks"] > 0 and cpp["tiers"]["cpu"]["evictions"] > 0
    assert py["failed_loads"] == cpp["failed_loads"] == 0
    assert py["wrong_data"] == cpp["wrong_data"] == 0
