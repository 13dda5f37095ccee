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


def test_an_object_of_many_regions_of_two_tensors_round_trips():
    """An object made of a region per head of a K and a V tensor, as an engine names its KV
    (the C API looks each tensor's allocation up once per object, then checks every region
    against it): saved and loaded exactly, in place."""
    heads, run, n = 8, 64 << 10, 4
    with libtier.Store.open(json.dumps(PROFILE), namespace={"model": "cuda-heads"}) as store:
        keys = [libtier.external_key(f"heads-{i}") for i in range(n)]

        def regions(k, v, i):
            return [libtier.Region(t.data_ptr() + (h * n + i) * run, run,
                                   libtier.MemoryKind.DEVICE, 0)
                    for t in (k, v) for h in range(heads)]

        k, v = (torch.randint(0, 255, (heads * n * run,), dtype=torch.uint8, device="cuda")
                for _ in range(2))
        assert store.save(keys, [regions(k, v, i) for i in range(n)]) == [libtier.Code.OK] * n
        k2, v2 = torch.zeros_like(k), torch.zeros_like(v)
        assert store.load(keys, [regions(k2, v2, i) for i in range(n)]) == [libtier.Code.OK] * n
        torch.cuda.synchronize()
        assert torch.equal(k, k2) and torch.equal(v, v2)


def test_registering_a_cuda_tensor_prepares_its_gpu_and_checks_the_memory():
    """Store.register of a CUDA tensor (as an engine registers its KV when it allocates it)
    prepares the GPU's copy resources; loads into it then work as before. A buffer that is not
    that GPU's memory is refused, whatever the caller claims."""
    with libtier.Store.open(json.dumps(PROFILE), namespace={"model": "cuda-register"}) as store:
        keys = [libtier.external_key(f"reg-{i}") for i in range(4)]
        src = torch.randint(0, 255, (4 << 20,), dtype=torch.uint8, device="cuda")
        dst = torch.zeros_like(src)
        with store.register(dst) as reg:
            assert reg.region.kind == libtier.MemoryKind.DEVICE
            parts = [[t] for t in src.chunk(4)]
            assert store.save(keys, parts) == [libtier.Code.OK] * 4
            assert store.load(keys, [[t] for t in dst.chunk(4)]) == [libtier.Code.OK] * 4
            torch.cuda.synchronize()
            assert torch.equal(src, dst)
        host = torch.zeros(1 << 20, dtype=torch.uint8)
        with pytest.raises(libtier.InvalidArgument, match="does not know it as device memory"):
            store.register((host.data_ptr(), host.numel()), kind=libtier.MemoryKind.DEVICE,
                           device=0)


def test_a_disk_store_restores_into_registered_cuda_memory(tmp_path):
    """Once device memory is registered, the store's images are page-locked: a disk tier reads
    each object straight into memory the GPU copies by DMA (the transformers example's fresh
    restore). Objects saved from CUDA tensors come back bit-exact, in place, into the registered
    tensor and into one that is not registered."""
    profile = {"tiers": [{"name": "disk", "capacity": "256MiB",
                          "backend": {"type": "disk", "path": str(tmp_path / "store")}}]}
    with libtier.Store.open(json.dumps(profile), namespace={"model": "cuda-disk"}) as store:
        if store.tier_names != ["disk"]:
            pytest.skip("no disk tier here (io_uring or O_DIRECT refused)")
        keys = [libtier.external_key(f"disk-{i}") for i in range(8)]
        src = torch.randint(0, 255, (8 << 20,), dtype=torch.uint8, device="cuda")
        assert store.save(keys, [[t] for t in src.chunk(8)]) == [libtier.Code.OK] * 8
        dst, other = torch.zeros_like(src), torch.zeros_like(src)
        with store.register(dst):
            assert store.load(keys, [[t] for t in dst.chunk(8)]) == [libtier.Code.OK] * 8
            assert store.load(keys, [[t] for t in other.chunk(8)]) == [libtier.Code.OK] * 8
            torch.cuda.synchronize()
            assert torch.equal(src, dst) and torch.equal(src, other)
