"""CUDA tensors through the package, zero-copy: the store reads a tensor's device memory in place
and writes a load into another tensor's device memory (no Python bytes in between). Skipped where
torch or a CUDA device is missing (runs on the H200 device machine)."""
import json
import os

import pytest

torch = pytest.importorskip("torch")
import libtier  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

PROFILE = {"tiers": [{"name": "cpu", "capacity": "256MiB", "backend": {"type": "cpu"}}]}


def test_cuda_tensors_round_trip_in_place():
    with libtier.Store.open(json.dumps(PROFILE), namespace={"model": "cuda-test"}) as store:
        keys = libtier.chunk_keys({"model": "cuda-test"}, list(range(64)), 16)
        src = [torch.randint(0, 255, (1 << 20,), dtype=torch.uint8, device="cuda")
               for _ in keys]
        assert store.save(keys, [[t] for t in src]) == [libtier.Code.OK] * len(keys)
        dst = [torch.zeros_like(t) for t in src]
        ptrs = [t.data_ptr() for t in dst]
        assert store.load(keys, [[t] for t in dst]) == [libtier.Code.OK] * len(keys)
        torch.cuda.synchronize()
        for a, b in zip(src, dst):
            assert torch.equal(a, b)
        assert [t.data_ptr() for t in dst] == ptrs  # written in place
        assert store.lookup_prefix(keys) == len(keys)
