"""python/examples/tp_processes.py with each rank's KV in CUDA device memory (--device): every
restore goes through the DSV4 layout's staging row (the sidecar fetched with the PAGE chunks,
committed only once every chunk loaded; docs/engine.md "All-or-nothing resume"), from a pageable
and from a page-locked shared tier, and is checked bit for bit on every rank. Skipped where
torch or a CUDA device is missing (runs on the H200 device machine: .ci/gpu-tests python)."""

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
import tp_processes  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("pinned", [False, True])
def test_rank_processes_with_kv_in_cuda_memory_restore_bit_exact(pinned, capsys):
    args = ["--ranks", "2", "--device", "--conversations", "4", "--turns", "3",
            "--concurrency", "3"] + (["--pinned"] if pinned else [])
    r = tp_processes.main(args)
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out == f"ranks 2, requests 12, restores {r['restores']}, wrong 0"
    assert r["restores"] == 8
    assert r["agree"], r["disagreements"]
    assert r["engine"]["load_failures"] == 0
    for w in r["workers"]:
        assert w["loads_ok"] == 8 and w["slot_restores"] == 8 and w["loads_failed"] == 0
