"""python/examples/transformers_offload.py on a GPU: greedy tokens identical after libtier restores
the whole prefix in one call (from a pinned cpu tier, and from a disk tier in a fresh process).

Skipped where torch, transformers or a CUDA device is missing (the example exits 77 there)."""

import json
import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "transformers_offload.py"


def test_tokens_identical_after_layer_offload_and_after_a_fresh_process_restore():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--json", "--layers", "4", "--prompt", "512",
         "--chunk", "128", "--new-tokens", "16", "--repeat", "2"],
        capture_output=True, text=True,
    )
    if run.returncode == 77:
        pytest.skip(run.stderr.strip())
    assert run.returncode in (0, 1), run.stderr
    report = json.loads(run.stdout)
    plain = report["plain"]
    assert len(plain["tokens"]) == 16
    for mode in ("pinned", "fresh_process"):
        assert report[mode]["tokens"] == plain["tokens"], mode
        assert report[mode]["logits"] == plain["logits"], mode
    assert report["fresh_process"]["bytes"] == report["pinned"]["bytes"] > 0
    # 4 layers x 4 chunks, each object 2 x 8 heads regions; the ratios are reported, not judged.
    assert report["pinned"]["objects"] == 16 and report["pinned"]["regions"] == 256
    assert report["ratios"]["pinned_restore_vs_bulk_h2d"] > 0
    assert report["fresh_process"]["disk_read_gbps"] > 0
    passes = report["fresh_process"]["disk_read_passes_gbps"]
    assert len(passes) == 4 and min(passes) > 0
    # The rate is the passes' bytes over their time: between the slowest and fastest pass.
    assert min(passes) * 0.999 <= report["fresh_process"]["disk_read_gbps"] <= max(passes) * 1.001
    assert report["fresh_process"]["new_file_read_gbps"] > 0
