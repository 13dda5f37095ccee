"""libtier.integrations.sglang: SGLang's HiCacheStorage over libtier, with numpy host pools."""

import importlib

import pytest

np = pytest.importorskip("numpy")

import libtier  # noqa: E402
from libtier.integrations import sglang as lts  # noqa: E402

CPU_PROFILE = {"tiers": [{"name": "cpu", "capacity": "64MiB", "backend": {"type": "cpu"}}]}


class KvHostPool:
    """An MHA host KV pool in SGLang's page_first layout: kv[2][slot][layer][head][dim].

    get_page_buffer_meta gives, per page, the K part then the V part (two buffers)."""

    def __init__(self, slots=64, page_size=4, layers=2, heads=2, dim=8):
        self.page_size = page_size
        self.layout = "page_first"
        self.kv_buffer = np.zeros((2, slots, layers, heads, dim), dtype=np.float32)
        self.slot_bytes = layers * heads * dim * 4

    def get_page_buffer_meta(self, indices):
        idx = indices.tolist()
        assert len(idx) % self.page_size == 0
        base = self.kv_buffer.ctypes.data
        v_offset = self.kv_buffer[0].nbytes
        ptrs, sizes = [], []
        for first in idx[:: self.page_size]:
            k = base + first * self.slot_bytes
            ptrs += [k, k + v_offset]
            sizes += [self.slot_bytes * self.page_size] * 2
        return ptrs, sizes

    def fill_page(self, first, seed):
        rng = np.random.default_rng(seed)
        page = slice(first, first + self.page_size)
        self.kv_buffer[:, page] = rng.standard_normal(self.kv_buffer[:, page].shape)

    def page(self, first):
        return self.kv_buffer[:, first : first + self.page_size].copy()


class StatePool:
    """A state pool (Mamba-like): one state per slot, page_size 1."""

    def __init__(self, slots=16, state_bytes=96):
        self.page_size = 1
        self.buf = np.zeros((slots, state_bytes), dtype=np.uint8)

    def get_page_buffer_meta(self, indices):
        row = self.buf.shape[1]
        return [self.buf.ctypes.data + i * row for i in indices.tolist()], [row] * len(indices)


def config(**kw):
    fields = dict(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="test/model",
        extra_config={"profile": CPU_PROFILE, "interface_v1": 1},
    )
    fields.update(kw)
    return lts.HiCacheStorageConfig(**fields)


def pages(pool, first_pages):
    """host_indices of the pages that start at slot page*page_size for each page number."""
    return np.concatenate(
        [np.arange(p * pool.page_size, (p + 1) * pool.page_size) for p in first_pages]
    ).astype(np.int64)


KEYS = [f"{i:064x}" for i in range(1, 9)]  # SGLang page hashes are hex strings


@pytest.fixture
def backend():
    b = lts.LibtierHiCacheStorage(config(), {})
    b.register_mem_pool_host(KvHostPool())
    yield b
    b.close()


def test_the_factory_contract_loads_the_class_by_module_path_and_name():
    # What SGLang's StorageBackendFactory does for --hicache-storage-backend dynamic.
    extra = {"backend_name": "libtier", "module_path": "libtier.integrations.sglang",
             "class_name": "LibtierHiCacheStorage", "profile": CPU_PROFILE, "interface_v1": 1}
    cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
    assert issubclass(cls, lts.HiCacheStorage)
    b = cls(config(extra_config=extra), {})
    b.close()


def test_a_profile_is_required():
    with pytest.raises(ValueError, match="profile"):
        lts.LibtierHiCacheStorage(config(extra_config={"interface_v1": 1}), {})


def test_v1_set_then_get_moves_the_pages_bit_exact_between_host_slots(backend):
    pool = backend.mem_pool_host
    for p in range(3):
        pool.fill_page(p * pool.page_size, seed=p)
    expected = [pool.page(p * pool.page_size) for p in range(3)]
    assert backend.batch_set_v1(KEYS[:3], pages(pool, [0, 1, 2])) == [True] * 3
    # Into other slots (pages 5, 6, 7), in the order given.
    assert backend.batch_get_v1(KEYS[:3], pages(pool, [7, 5, 6])) == [True] * 3
    for got_page, want in zip([7, 5, 6], expected):
        np.testing.assert_array_equal(pool.page(got_page * pool.page_size), want)


def test_v1_get_reports_each_missing_page_false(backend):
    pool = backend.mem_pool_host
    pool.fill_page(0, seed=1)
    assert backend.batch_set_v1([KEYS[0]], pages(pool, [0])) == [True]
    assert backend.batch_get_v1([KEYS[0], KEYS[1]], pages(pool, [4, 5])) == [True, False]


def test_v1_rejects_indices_that_do_not_cover_the_pages(backend):
    pool = backend.mem_pool_host
    assert backend.batch_set_v1(KEYS[:2], pages(pool, [0])) == [False, False]
    assert backend.batch_exists(KEYS[:2]) == 0


def test_set_is_put_if_absent_and_reports_success(backend):
    pool = backend.mem_pool_host
    assert backend.batch_set_v1(KEYS[:1], pages(pool, [0])) == [True]
    assert backend.batch_set_v1(KEYS[:1], pages(pool, [1])) == [True]


def test_batch_exists_is_the_longest_present_prefix(backend):
    pool = backend.mem_pool_host
    assert backend.batch_exists(KEYS[:4]) == 0
    assert backend.batch_set_v1([KEYS[0], KEYS[1], KEYS[3]], pages(pool, [0, 1, 3])) == [True] * 3
    assert backend.batch_exists(KEYS[:4]) == 2
    assert backend.exists(KEYS[3]) and not backend.exists(KEYS[2])
    assert backend.batch_exists([]) == 0


def test_tp_ranks_are_kept_apart_unless_the_model_is_mla():
    # Each backend has its own process-local CPU tier, so compare the Stores' namespaces and
    # ranks (what keys the objects) instead of their contents.
    def store_of(**kw):
        b = lts.LibtierHiCacheStorage(config(**kw), {})
        ns, rank = b.store.namespace, b.store.rank
        b.close()
        return ns, rank

    assert store_of(tp_rank=0, tp_size=2) == (store_of(tp_rank=1, tp_size=2)[0], 0)
    assert store_of(tp_rank=1, tp_size=2)[1] == 1
    mla0, mla1 = store_of(tp_rank=0, tp_size=2, is_mla_model=True), store_of(
        tp_rank=1, tp_size=2, is_mla_model=True)
    assert mla0 == mla1 and mla0[1] == 0
    assert store_of(model_name="other")[0] != store_of()[0]


def test_generic_path_round_trips_flat_pages():
    b = lts.LibtierHiCacheStorage(config(extra_config={"profile": CPU_PROFILE}), {})
    page = np.arange(64, dtype=np.float32)
    assert b.set(KEYS[0], page)
    assert b.batch_set(KEYS[1:3], [page + 1, page + 2])
    out = [np.zeros(64, dtype=np.float32) for _ in range(4)]
    got = b.batch_get(KEYS[:4], out)
    assert got[3] is None and all(g is o for g, o in zip(got[:3], out[:3]))
    for i in range(3):
        np.testing.assert_array_equal(out[i], page + i)
    assert b.get(KEYS[5], np.zeros(64, dtype=np.float32)) is None
    b.close()


# --- v2 ----------------------------------------------------------------------------------------


@pytest.fixture
def hybrid(backend):
    """KV pool (v1), an ALL_PAGES indexer pool and a TRAILING_PAGES state pool."""
    backend.register_mem_host_pool_v2(KvHostPool(), "indexer")
    backend.register_mem_host_pool_v2(StatePool(), "mamba")
    return backend


def put(b, pool, keys, first_slot=0):
    host = b.registered_pools[pool]
    idx = np.arange(first_slot, first_slot + len(keys) * host.page_size, dtype=np.int64)
    t = lts.PoolTransfer(name=pool, host_indices=idx, keys=list(keys))
    return b.batch_set_v2([t])[pool]


def exists_v2(b, n_pages, trailing=1, with_indexer=True):
    transfers = []
    if with_indexer:
        transfers.append(lts.PoolTransfer(name="indexer", hit_policy=lts.PoolHitPolicy.ALL_PAGES))
    transfers.append(lts.PoolTransfer(name="mamba", keys=["x"] * trailing,
                                      hit_policy=lts.PoolHitPolicy.TRAILING_PAGES))
    return b.batch_exists_v2(KEYS[:n_pages], transfers)


def test_v2_all_pages_pool_shortens_the_prefix_to_its_leading_run(hybrid):
    kv = hybrid.mem_pool_host
    assert hybrid.batch_set_v1(KEYS[:4], pages(kv, range(4))) == [True] * 4
    assert put(hybrid, "indexer", [KEYS[0], KEYS[1], KEYS[3]]) == [True] * 3
    r = hybrid.batch_exists_v2(KEYS[:4], [lts.PoolTransfer(name="indexer")])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (2, {"kv": 4, "indexer": 2})


def test_v2_a_trailing_state_counts_only_with_its_whole_page_prefix(hybrid):
    kv = hybrid.mem_pool_host
    assert hybrid.batch_set_v1(KEYS[:4], pages(kv, range(4))) == [True] * 4
    assert put(hybrid, "indexer", KEYS[:3]) == [True] * 3
    # States after page 2 and after page 4; pages [0, 3) are complete in every pool.
    assert put(hybrid, "mamba", [KEYS[1], KEYS[3]]) == [True, True]
    r = exists_v2(hybrid, 4)
    # The state at 4 lacks indexer page 3; the state at 2 has its whole prefix. A per-pool
    # minimum (kv 4, indexer 3, mamba 4) would offer 3 pages, for which no state exists.
    assert r.kv_hit_pages == 2
    assert r.extra_pool_hit_pages == {"kv": 4, "indexer": 3, "mamba": 2}


def test_v2_without_any_usable_state_nothing_hits(hybrid):
    kv = hybrid.mem_pool_host
    assert hybrid.batch_set_v1(KEYS[:3], pages(kv, range(3))) == [True] * 3
    assert put(hybrid, "indexer", KEYS[:3]) == [True] * 3
    r = exists_v2(hybrid, 3)
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (0, {"kv": 3, "indexer": 3})
    # A state keyed by a page beyond the stored prefix is never offered either.
    assert put(hybrid, "mamba", [KEYS[5]]) == [True]
    assert exists_v2(hybrid, 6).kv_hit_pages == 0


def test_v2_trailing_width_needs_every_trailing_page(hybrid):
    kv = hybrid.mem_pool_host
    assert hybrid.batch_set_v1(KEYS[:4], pages(kv, range(4))) == [True] * 4
    assert put(hybrid, "mamba", [KEYS[3]]) == [True]
    assert exists_v2(hybrid, 4, trailing=1, with_indexer=False).kv_hit_pages == 4
    assert exists_v2(hybrid, 4, trailing=2, with_indexer=False).kv_hit_pages == 0
    assert put(hybrid, "mamba", [KEYS[2]], first_slot=1) == [True]
    assert exists_v2(hybrid, 4, trailing=2, with_indexer=False).kv_hit_pages == 4


def test_v2_get_and_set_move_each_pool_bit_exact(hybrid):
    states = hybrid.registered_pools["mamba"]
    states.buf[:4] = np.arange(4 * states.buf.shape[1], dtype=np.uint8).reshape(4, -1)
    idx = hybrid.registered_pools["indexer"]
    idx.fill_page(0, seed=9)
    want_idx = idx.page(0)
    set_res = hybrid.batch_set_v2([
        lts.PoolTransfer(name="mamba", host_indices=np.array([2, 3]), keys=KEYS[:2],
                         hit_policy=lts.PoolHitPolicy.TRAILING_PAGES),
        lts.PoolTransfer(name="indexer", host_indices=pages(idx, [0]), keys=KEYS[:1]),
    ])
    assert set_res == {"mamba": [True, True], "indexer": [True]}
    get_res = hybrid.batch_get_v2([
        lts.PoolTransfer(name="mamba", host_indices=np.array([9, 8, 7]), keys=KEYS[:3],
                         hit_policy=lts.PoolHitPolicy.TRAILING_PAGES),
        lts.PoolTransfer(name="indexer", host_indices=pages(idx, [5]), keys=KEYS[:1]),
    ])
    assert get_res == {"mamba": [True, True, False], "indexer": [True]}
    np.testing.assert_array_equal(states.buf[9], states.buf[2])
    np.testing.assert_array_equal(states.buf[8], states.buf[3])
    np.testing.assert_array_equal(idx.page(5 * idx.page_size), want_idx)


def test_v2_no_state_is_stored_in_a_call_whose_pages_failed(hybrid):
    states = hybrid.registered_pools["mamba"]
    bad_pages = lts.PoolTransfer(name="indexer", host_indices=np.arange(2), keys=KEYS[:1])
    state = lts.PoolTransfer(name="mamba", host_indices=np.array([0]), keys=KEYS[:1],
                             hit_policy=lts.PoolHitPolicy.TRAILING_PAGES)
    res = hybrid.batch_set_v2([state, bad_pages])
    assert res == {"indexer": [False], "mamba": [False]}
    assert not hybrid.store.exists([hybrid.object_key("mamba", KEYS[0])])[0]
    assert not states.buf.any()


def test_v2_unregistered_pool_reports_false(hybrid):
    t = lts.PoolTransfer(name="swa", host_indices=np.arange(1), keys=KEYS[:1])
    assert hybrid.batch_get_v2([t]) == {"swa": [False]}
