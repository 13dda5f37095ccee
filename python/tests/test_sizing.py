"""libtier.miss_ratio_curve (docs/sizing.md) against `tierctl size --json` on the same trace: the
same curve through the C API (tier_curve_from_trace), exact and sampled; its errors."""

import json
import os
import subprocess

import pytest

import libtier


def tierctl():
    build = os.environ.get("TIER_BUILD_ROOT")
    path = os.path.join(build, "apps", "tierctl", "tierctl") if build else None
    if not path or not os.path.exists(path):
        pytest.skip("tierctl of the build tree is not here")
    return path


@pytest.fixture
def small_trace(tmp_path):
    lines = []
    for i in range(300):
        ids = list(range(i % 11 * 50, i % 11 * 50 + 2 + i % 6)) + [5000 + i % 40]
        lines.append(json.dumps({"timestamp": i, "input_length": 512 * len(ids),
                                 "output_length": 8, "hash_ids": ids}))
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def size_json(trace, *args):
    out = subprocess.run([tierctl(), "size", "--trace", trace, "--json", *args], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def test_curve_equals_tierctl_size(small_trace):
    c = libtier.miss_ratio_curve(small_trace, block_bytes=4096)
    ref = size_json(small_trace, "--block-bytes", "4096", "--at", "20")
    assert c.exact and c.sample_rate == 1.0
    assert (c.requests, c.blocks, c.tracked_blocks) == (ref["requests"], ref["blocks"],
                                                        ref["tracked_blocks"])
    assert c.image_bytes == ref["image_bytes"] == 4096 + 96
    assert c.saturation == ref["saturation"]["blocks"]
    assert c.max_hit_ratio == ref["max_hit_ratio"]
    assert c.hit_ratio(20) == ref["at"]["hit_ratio"]
    assert c.miss_ratio(20) == 1 - ref["at"]["hit_ratio"]
    assert c.capacity_bytes(20) == 20 * (4096 + 96)
    assert c.knee == (ref["knee"]["blocks"], ref["knee"]["hit_ratio"])
    assert [b for b, _ in c.steps()] == ref["curve"]["blocks"]
    assert [r for _, r in c.steps()] == ref["curve"]["hit_ratio"]
    assert c.error(20) == 0.0


def test_sampled_curve_states_its_error(small_trace):
    c = libtier.miss_ratio_curve(small_trace, sample=0.5)
    ref = size_json(small_trace, "--sample", "0.5", "--at", "30")
    assert not c.exact
    assert c.sample_rate == ref["sample_rate"]
    assert c.hit_ratio(30) == ref["at"]["hit_ratio"]
    assert c.error(30) == ref["at"]["error"]


def test_real_trace_at_8192_blocks(source_root):
    """The acceptance figure of docs/sizing.md: 0.1812 at 8192 blocks, as tierbench replay."""
    trace = os.path.join(os.environ.get("TIER_TEST_DATA", os.path.join(source_root, "..",
                                                                      "shared", "data")),
                         "mooncake_conversation_trace.jsonl")
    if not os.path.exists(trace):
        pytest.skip(f"no trace at {trace}")
    c = libtier.miss_ratio_curve(trace)
    assert round(c.hit_ratio(8192), 4) == 0.1812


def test_errors(tmp_path, small_trace):
    with pytest.raises(libtier.NotFound):
        libtier.miss_ratio_curve(tmp_path / "absent.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1.5]}\n')
    with pytest.raises(libtier.InvalidArgument, match=":1"):
        libtier.miss_ratio_curve(str(bad))
    for sample in (0.0, 1.5, float("nan")):
        with pytest.raises(libtier.InvalidArgument):
            libtier.miss_ratio_curve(small_trace, sample=sample)
    with pytest.raises(libtier.InvalidArgument):
        libtier.miss_ratio_curve(small_trace, block_bytes=0)
    with pytest.raises(libtier.NoSpace):
        libtier.miss_ratio_curve(small_trace, max_tracked=10)
