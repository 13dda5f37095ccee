"""Store: batches, zero-copy buffers, errors, asynchronous batches, threads, the GIL."""

import ctypes
import json
import sys
import threading

import numpy as np
import pytest

import libtier
from conftest import CPU_PROFILE


def keys_of(n, tag="k"):
    return [libtier.external_key(f"{tag}-{i}") for i in range(n)]


def test_codes_match_the_c_api():
    assert libtier.Code.OK == 0 and libtier.Code.NOT_FOUND == 1
    assert libtier.Code.CHECKSUM_MISMATCH == 8 and libtier.Code.NO_SPACE == 13
    assert libtier.Code.TIMED_OUT.code_name == "timed_out"
    assert libtier.abi_version() == libtier.ABI_VERSION
    assert libtier.version()


def test_bad_profile_raises_invalid_argument_with_the_path():
    with pytest.raises(libtier.InvalidArgument) as e:
        libtier.Store.open({"tiers": [{"name": 3}]})
    assert e.value.code == libtier.Code.INVALID_ARGUMENT
    assert e.value.code_name == "invalid_argument"
    assert "/tiers/0" in e.value.message
    assert isinstance(e.value, ValueError)
    with pytest.raises(libtier.Error):
        libtier.Store.open("/nonexistent/profile.json")


def test_open_from_path_and_json_text(source_root, tmp_path):
    p = tmp_path / "p.json"
    p.write_text(json.dumps(CPU_PROFILE))
    with libtier.Store.open(p) as s:
        assert s.tier_names == ["cpu"]
    with libtier.Store.open(json.dumps(CPU_PROFILE), namespace={"model": "m"}, rank=3) as s:
        assert s.namespace == libtier.namespace_id({"model": "m"}) and s.rank == 3


def test_keys_golden_vectors():
    ns = libtier.namespace_id(
        {"model": "deepseek-v4-pro", "layout_version": 1, "kv_dtype": "fp8", "block_size": 256,
         "chunk_size": 256, "tp_size": 8})
    assert ns == "6fe91321d1cb766be97f553a73bcd7f3"
    keys = libtier.chunk_keys(ns, [1, 2, 3, 4, 5, 6, 7, 8], 4)
    assert keys == ["91035bd943d14336f4aa8f1f7f8852c3", "9d2bcacea2eb4ce4329f22197e47b870"]
    assert libtier.chunk_keys(ns, np.arange(1, 9, dtype=np.int64), 4) == keys
    assert len(libtier.chunk_keys(ns, range(1, 10), 4, include_partial=True)) == 3
    # An extra key (LoRA adapter, multimodal hashes, cache salt) changes every key.
    assert libtier.chunk_keys(ns, range(1, 9), 4, extra_key=None) == keys
    assert libtier.chunk_keys(ns, range(1, 9), 4, extra_key=b"") == keys
    lora_a = libtier.chunk_keys(ns, range(1, 9), 4, extra_key="lora:adapter-a")
    assert lora_a[0] == "15777650889c860dcf6e03a608eaec08"
    assert lora_a == libtier.chunk_keys(ns, range(1, 9), 4, extra_key=b"lora:adapter-a")
    lora_b = libtier.chunk_keys(ns, range(1, 9), 4, extra_key="lora:adapter-b")
    assert not set(lora_a) & set(lora_b) and not set(lora_a) & set(keys)
    with pytest.raises(libtier.InvalidArgument):
        libtier.chunk_keys(ns, [1, 2], 1, extra_key=3)
    assert libtier.external_key("page-0") == "eacce5cdadeb584f87deaea30152654f"
    assert libtier.external_key(b"page-0") == libtier.external_key("page-0")
    with pytest.raises(libtier.InvalidArgument):
        libtier.chunk_keys(ns, [1, 2], 0)


def test_save_load_round_trip_and_lookup(store):
    keys = keys_of(5)
    src = [np.arange(1000, dtype=np.float32) * (i + 1) for i in range(4)]
    assert store.lookup_prefix(keys) == 0
    assert store.save(keys[:4], src) == [libtier.Code.OK] * 4
    assert store.save(keys[:1], src[:1]) == [libtier.Code.OK]  # put-if-absent
    assert store.lookup_prefix(keys) == 4
    assert store.exists(keys) == [True, True, True, True, False]
    dst = [np.zeros(1000, dtype=np.float32) for _ in range(5)]
    codes, tiers = store.load_with_tiers(keys, dst)
    assert codes == [libtier.Code.OK] * 4 + [libtier.Code.NOT_FOUND]
    assert tiers == [0, 0, 0, 0, -1]
    for a, b in zip(src, dst):
        np.testing.assert_array_equal(a, b)
    assert store.remove(keys[:1]) == [libtier.Code.OK]
    assert store.lookup_prefix(keys) == 0


def test_remove_many_keys_each_gets_its_code(store):
    keys = keys_of(150, "rm")
    src = [np.full(100, i, dtype=np.uint8) for i in range(0, 150, 2)]
    assert store.save(keys[::2], src) == [libtier.Code.OK] * 75
    assert store.remove(keys) == [libtier.Code.OK] * 150  # absent ones too: gone either way
    assert store.exists(keys) == [False] * 150
    assert store.remove([]) == []


def test_scatter_gather_and_buffer_forms(store):
    data = np.random.default_rng(1).integers(0, 255, 4096, dtype=np.uint8)
    key = keys_of(1, "sg")
    # Saved as three pieces: a numpy view, a Region and a (ptr, nbytes) tuple.
    pieces = [data[:1000], libtier.Region(data[1000:].ctypes.data, 2000), (data.ctypes.data + 3000, 1096)]
    assert store.save(key, [pieces]) == [libtier.Code.OK]
    out = np.zeros(4096, dtype=np.uint8)
    halves = (out[:2048], out[2048:])  # a tuple of buffers is a scatter list too
    assert store.load(key, [halves]) == [libtier.Code.OK]
    np.testing.assert_array_equal(out, data)


def test_zero_copy_views():
    a = np.zeros((4, 8), dtype=np.float64)
    r = libtier.region_of(a)
    assert r.ptr == a.ctypes.data and r.nbytes == a.nbytes and r.kind == libtier.MemoryKind.HOST

    class FakeCuda:  # only what __cuda_array_interface__ consumers read
        def __init__(self, ptr, nbytes, device):
            self.__cuda_array_interface__ = {
                "data": (ptr, False), "shape": (nbytes // 2,), "typestr": "<f2", "version": 3,
                "strides": None}
            self.device = type("Dev", (), {"index": device})()

    r = libtier.region_of(FakeCuda(0x10000, 4096, 1))
    assert (r.ptr, r.nbytes, r.kind, r.device) == (0x10000, 4096, libtier.MemoryKind.DEVICE, 1)


def test_an_object_of_many_regions_mixed_with_a_region_subclass_round_trips(store):
    """Regions are read with one class lookup per batch: a list of many, a subclass of Region
    among them and another buffer form after them, still round trips exactly."""

    class Tagged(libtier.Region):
        pass

    src = np.random.default_rng(7).integers(0, 256, 64 * 100, dtype=np.uint8)
    dst = np.zeros_like(src)

    def regions(a):
        out = [(Tagged if i % 3 == 0 else libtier.Region)(
            a.ctypes.data + 64 * i, 64, libtier.MemoryKind.HOST, -1) for i in range(99)]
        return out + [a[64 * 99:]]  # an array after the Regions

    keys = [libtier.external_key("many-regions")]
    assert store.save(keys, [regions(src)]) == [libtier.Code.OK]
    assert store.load(keys, [regions(dst)]) == [libtier.Code.OK]
    assert np.array_equal(src, dst)
    with pytest.raises(libtier.InvalidArgument, match="expected a numpy array"):
        store.save(keys, [[libtier.Region(src.ctypes.data, 64, libtier.MemoryKind.HOST, -1),
                           object()]])


def test_device_regions_are_refused_without_touching_them(store):
    class FakeCuda:
        __cuda_array_interface__ = {"data": (0x1000, False), "shape": (64,), "typestr": "|u1",
                                    "version": 3}

    codes = store.save(keys_of(1, "dev"), [FakeCuda()])
    assert codes[0] in (libtier.Code.NOT_SUPPORTED, libtier.Code.INVALID_ARGUMENT)


def test_bad_buffers_raise(store):
    k = keys_of(1)
    with pytest.raises(libtier.InvalidArgument, match="C-contiguous"):
        store.save(k, [np.zeros((4, 4))[:, 1]])
    ro = np.zeros(16)
    ro.flags.writeable = False
    store.save(k, [ro])
    with pytest.raises(libtier.InvalidArgument, match="read-only"):
        store.load(k, [ro])
    with pytest.raises(libtier.InvalidArgument, match="keys for"):
        store.save(k, [ro, ro])
    with pytest.raises(libtier.InvalidArgument):
        store.save(["not-hex"], [ro])
    with pytest.raises(libtier.InvalidArgument):
        store.save(k, [object()])
    # A buffer of the wrong size fails that key only, and nothing is written.
    wrong = np.full(15, 7.0)
    assert store.load(k, [wrong]) == [libtier.Code.INVALID_ARGUMENT]
    assert (wrong == 7.0).all()


def test_a_key_as_its_16_canonical_bytes_is_the_same_key_as_its_hex(store):
    key = libtier.external_key("bytes-key")
    canonical = bytes.fromhex(key)[::-1]  # low64 then high64, each little-endian (docs/keys.md)
    src = np.arange(100, dtype=np.uint8)
    assert store.save([canonical], [src]) == [libtier.Code.OK]
    dst = np.zeros(100, dtype=np.uint8)
    assert store.load([key], [dst]) == [libtier.Code.OK]
    assert np.array_equal(src, dst)
    assert store.load([bytes.fromhex(key)], [dst]) == [libtier.Code.NOT_FOUND]  # not the text order
    for bad in (bytes(15), bytes(17), b""):
        with pytest.raises(libtier.InvalidArgument, match="16 bytes"):
            store.save([bad], [src])
    with pytest.raises(libtier.InvalidArgument):
        store.save([bytearray(16)], [src])  # bytes only, as before


def test_torch_tensors_round_trip_and_mix_with_other_buffers(store):
    """CPU tensors of several dtypes and shapes (a region of numel x element_size bytes), in one
    batch with a numpy array between them (the batch remembers the tensor type; another type is
    not taken for a tensor); a non-contiguous tensor raises; an object with a tensor's method
    names but a negative pointer or an overflowing size is refused, not read."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(5)
    src = [torch.randint(0, 256, (3, 7), generator=g, dtype=torch.uint8),
           torch.randn(5, 3, generator=g),
           torch.randn(64, generator=g).to(torch.float64),
           np.arange(40, dtype=np.int16),
           torch.randn(2, 2, 2, generator=g).to(torch.bfloat16)]
    dst = [torch.zeros_like(src[0]), torch.zeros_like(src[1]), torch.zeros_like(src[2]),
           np.zeros(40, dtype=np.int16), torch.zeros_like(src[4])]
    keys = keys_of(len(src), "torch")
    assert store.save(keys, src) == [libtier.Code.OK] * len(src)
    assert store.load(keys, dst) == [libtier.Code.OK] * len(src)
    for a, b in zip(src, dst):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b)
        else:
            assert torch.equal(a, b)
    # The size is the tensor's bytes: a destination of other bytes fails that key alone.
    assert store.load(keys[:2], [torch.zeros(21, dtype=torch.uint8),
                                 torch.zeros(16)]) == [libtier.Code.OK,
                                                       libtier.Code.INVALID_ARGUMENT]
    with pytest.raises(libtier.InvalidArgument, match="not contiguous"):
        store.save(keys_of(1, "t-nc"), [torch.zeros(4, 4)[:, 1]])

    class Forged:
        is_cuda = False

        def __init__(self, ptr, numel):
            self.ptr, self.n = ptr, numel

        def data_ptr(self):
            return self.ptr

        def is_contiguous(self):
            return True

        def numel(self):
            return self.n

        def element_size(self):
            return 8

        def is_pinned(self):
            return False

    with pytest.raises(libtier.InvalidArgument, match="data_ptr"):
        store.save(keys_of(1, "t-forged"), [Forged(-1, 1)])
    with pytest.raises(libtier.InvalidArgument, match="does not fit"):
        store.save(keys_of(1, "t-forged"), [Forged(4096, 2**62)])  # 2^65 bytes: no wrap to 0


def test_async_batches(store):
    keys = keys_of(8, "async")
    src = [np.full(5000, i, dtype=np.int32) for i in range(8)]
    t1 = store.save_async(keys, src)
    c = store.wait(t1)
    assert c.ticket == t1 and c.op == "save" and c.ok and c.codes == [libtier.Code.OK] * 8
    dst = [np.zeros(5000, dtype=np.int32) for _ in range(8)]
    t2 = store.load_async(keys, dst)
    done = []
    while not done:
        done = store.poll() or [store.wait(timeout=10.0)]
    assert done[0].ticket == t2 and done[0].op == "load" and done[0].tiers == [0] * 8
    for a, b in zip(src, dst):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(libtier.NotFound):
        store.wait(t2)
    with pytest.raises(libtier.NotFound):
        store.wait()


def test_closed_store_raises_bad_state():
    s = libtier.Store.open(CPU_PROFILE)
    s.close()
    s.close()
    assert s.closed
    with pytest.raises(libtier.BadState, match="closed"):
        s.lookup_prefix([])


def test_registration(store):
    buf = np.zeros(1 << 16, dtype=np.uint8)
    with store.register(buf) as reg:
        assert reg.region.ptr == buf.ctypes.data and reg.region.nbytes == buf.nbytes
    try:
        store.register(buf, kind=libtier.MemoryKind.PINNED).release()
    except libtier.NotSupported:
        pass  # no GPU runtime or no GPU here
    with pytest.raises(libtier.InvalidArgument):
        store.register(buf, kind=libtier.MemoryKind.DEVICE, device=-1)


def test_metrics(store):
    store.save(keys_of(1), [np.zeros(100)])
    m = store.metrics()
    assert isinstance(m, dict) and "cpu" in json.dumps(m)
    assert "libtier_" in store.metrics_prometheus()


def test_host_arrays_move_once(store):
    # Issue 24: a save gathers straight from the arrays and a load scatters the verified payload
    # straight into them (the C API's codec is direct): no byte goes through the library's own
    # buffers. Fails when that path is lost (a codec without direct(), a second copy).
    keys = keys_of(8, "once")
    src = [np.arange(5000 + 13 * i, dtype=np.int32) for i in range(8)]
    dst = [np.zeros_like(a) for a in src]
    halves = [[a[: len(a) // 2], a[len(a) // 2:]] for a in dst]  # scattered into two regions
    assert store.save(keys, src) == [libtier.Code.OK] * 8
    assert store.load(keys, halves) == [libtier.Code.OK] * 8
    assert all(np.array_equal(a, b) for a, b in zip(src, dst))
    stack = store.metrics()["stack"]
    assert stack["loaded_bytes"] == sum(a.nbytes for a in src)
    assert stack["staging_copy_bytes"] == 0
    assert "libtier_stack_staging_copy_bytes_total 0\n" in store.metrics_prometheus()


def test_saves_sealed_by_the_tier_load_back_verified(store):
    # The cpu tier hashes a save's payload as it copies it (Capabilities::seals_puts): payloads of
    # one region and of regions whose 64 KiB checksum chunks span them, small, of many chunks on
    # the verification threads and large enough for streamed stores, each loaded back verified
    # into other splits. A wrong checksum would fail the load (ChecksumMismatch).
    rng = np.random.default_rng(11)
    sizes = [[1], [241], [65536 + 7], [40000, 70000, 100000], [3, 65533, 5, 131072], [600000]]
    keys = keys_of(len(sizes), "sealed")
    src = [[rng.integers(0, 256, n, dtype=np.uint8) for n in parts] for parts in sizes]
    dst = [np.zeros(sum(parts), dtype=np.uint8) for parts in sizes]
    assert store.save(keys, src) == [libtier.Code.OK] * len(keys)
    splits = [[d[: len(d) // 3], d[len(d) // 3:]] for d in dst]
    assert store.load(keys, splits) == [libtier.Code.OK] * len(keys)
    for parts, d in zip(src, dst):
        assert np.array_equal(np.concatenate(parts), d)


def test_a_batch_larger_than_the_caches_round_trips(store):
    # A save or load of a batch holding a quarter of the CPU's last-level cache or more writes its
    # copies with non-temporal stores (IoRequest::batch_bytes, tier/object.hpp stores_for_batch;
    # 8 MiB on the build machine): 36 MiB of payloads of one region, of several, small and of many
    # checksum chunks, come back exact, with no staging copy.
    rng = np.random.default_rng(12)
    sizes = [[1 << 20]] * 32 + [[5000, 65536 + 3, 1 << 20]] * 4 + [[4096]] * 64
    keys = keys_of(len(sizes), "streamed")
    src = [[rng.integers(0, 256, n, dtype=np.uint8) for n in parts] for parts in sizes]
    dst = [np.zeros(sum(parts), dtype=np.uint8) for parts in sizes]
    assert sum(d.nbytes for d in dst) > 36 << 20
    assert store.save(keys, src) == [libtier.Code.OK] * len(keys)
    splits = [[d[: len(d) // 2], d[len(d) // 2:]] for d in dst]
    assert store.load(keys, splits) == [libtier.Code.OK] * len(keys)
    for parts, d in zip(src, dst):
        assert np.array_equal(np.concatenate(parts), d)
    assert store.metrics()["stack"]["staging_copy_bytes"] == 0


def test_many_small_arrays_move_at_once_and_evict_in_one_call():
    # The cpu tier moves the puts (gets) of one submit of objects under 96 KiB on several threads
    # at once (backends/cpu/cpu_backend.hpp), evicting for them first: a save of 2.5x the tier's
    # capacity in one call stores every object in turn (the earliest evicted for the latest), and
    # a load of them all finds exactly the ones that stayed, each with its own bytes.
    tiny = {"tiers": [{"name": "cpu", "capacity": "1MiB", "backend": {"type": "cpu"}}]}
    with libtier.Store.open(tiny) as s:
        rng = np.random.default_rng(13)
        keys = keys_of(64, "small")
        src = [rng.integers(0, 256, 40000, dtype=np.uint8) for _ in keys]
        assert s.save(keys, src) == [libtier.Code.OK] * 64
        dst = [np.zeros(40000, dtype=np.uint8) for _ in keys]
        codes = s.load(keys, [[d[:10000], d[10000:]] for d in dst])
        kept = [i for i, c in enumerate(codes) if c == libtier.Code.OK]
        assert set(codes) <= {libtier.Code.OK, libtier.Code.NOT_FOUND}
        assert 20 <= len(kept) <= 26  # 1 MiB of 40 KiB objects, headers included
        assert kept == list(range(64 - len(kept), 64))  # the latest ones stayed
        assert all(np.array_equal(src[i], dst[i]) for i in kept)
        assert s.metrics()["tiers"]["cpu"]["evictions"] == 64 - len(kept)


def test_staging_copy_bytes_counts_an_encoded_save():
    # Written through to two tiers, a save is encoded once into the stack's image: counted.
    two = {"tiers": [{"name": "a", "capacity": "4MiB", "backend": {"type": "cpu"}},
                     {"name": "b", "capacity": "4MiB", "backend": {"type": "cpu"}}]}
    with libtier.Store.open(two) as s:
        a = np.ones(3000, dtype=np.uint8)
        assert s.save(keys_of(1, "enc"), [a]) == [libtier.Code.OK]
        assert s.metrics()["stack"]["staging_copy_bytes"] == 3000


def test_threads_share_a_store(store):
    errors = []

    def run(t):
        for r in range(30):
            k = [libtier.external_key(f"t{t}-{r}")]
            a = np.full(4096, t * 1000 + r, dtype=np.int64)
            b = np.zeros_like(a)
            if store.save(k, [a]) != [libtier.Code.OK]:
                errors.append("save")
            c = store.wait(store.load_async(k, [b]))
            if not c.ok or not np.array_equal(a, b):
                errors.append("load")

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_transfers_release_the_gil(store):
    # With a switch interval far beyond the test, the main thread gets the GIL back while the
    # other thread is inside save() only if save() releases it. The saver saves new keys until
    # the main thread has looked (at most 200 saves of 4 MiB): one save of a few milliseconds
    # could end before a loaded machine scheduled the main thread, which then saw it done.
    bufs = [np.ones(1 << 16, dtype=np.uint8) for _ in range(64)]
    started, looked = threading.Event(), threading.Event()
    state = {"in_call": False}

    def saver():
        state["in_call"] = True
        started.set()
        for i in range(200):
            if looked.is_set():
                break
            store.save(keys_of(64, f"gil{i}"), bufs)
        state["in_call"] = False

    old = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        t = threading.Thread(target=saver)
        t.start()
        started.wait()
        observed = state["in_call"]
        looked.set()
        t.join()
    finally:
        sys.setswitchinterval(old)
    assert observed is True


def test_clear_removes_the_namespace_from_every_tier_and_nothing_else():
    profile = {"tiers": [{"name": "cpu", "capacity": "8MiB", "backend": {"type": "cpu"}}]}
    with libtier.Store.open(profile, namespace={"model": "a"}) as a:
        keys = [libtier.external_key(f"page-{i}") for i in range(3)]
        data = [np.full(64, i, dtype=np.uint8) for i in range(3)]
        assert a.save(keys, data) == [libtier.Code.OK] * 3
        assert a.clear() == 3
        assert a.exists(keys) == [False] * 3
        assert a.clear() == 0
