"""libtier.integrations.sglang driven with torch tensors in pools shaped like SGLang's host pools:
MHA page_first and layer_first, MLA, DeepSeek-V4's logical KV anchor with its side pools, and a
hybrid model's Mamba state at TP 2. Each test runs with the pools in CPU memory and again in CUDA
memory when torch sees a CUDA device (skipped otherwise): on the H200,
`python3 -m pytest -q python/tests/test_sglang_torch.py` (PYTHONPATH=build/python).

The pool classes are written from the interface SGLang's controller uses (get_page_buffer_meta,
page_size, layout, kv_buffer, size_per_token, device, dtype), not copied from SGLang."""

import logging
import os
import uuid

import pytest

torch = pytest.importorskip("torch")

import libtier  # noqa: E402
from libtier.integrations import sglang as lts  # noqa: E402

CPU_PROFILE = {"tiers": [{"name": "cpu", "capacity": "64MiB", "backend": {"type": "cpu"}}]}

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))]


def config(**kw):
    fields = dict(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="test/model", extra_config={"profile": CPU_PROFILE, "interface_v1": 1},
    )
    extra = kw.pop("extra", None)
    fields.update(kw)
    if extra:
        fields["extra_config"] = {**fields["extra_config"], **extra}
    return lts.HiCacheStorageConfig(**fields)


def idx(pool, pages, device="cpu"):
    """SGLang's host_indices: the slots of each page, page after page."""
    ps = pool.page_size
    return torch.cat([torch.arange(p * ps, (p + 1) * ps) for p in pages]).to(torch.int64)


def seeded(shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype).to(device)
    return torch.randint(0, 256, shape, generator=g, dtype=torch.int64).to(dtype).to(device)


class DevicePool:
    """What every pool below shares: a device, a dtype and pointer arithmetic on its tensors."""

    dtype = torch.bfloat16

    @staticmethod
    def ptr(t, elem_offset):
        return t.data_ptr() + elem_offset * t.element_size()


class MhaPool(DevicePool):
    """SGLang's MHA host pool: page_first kv[2][slot][layer][head][dim] (per page a K and a V
    buffer), or layer_first kv[2][layer][slot][head][dim] (per page and layer a K and a V)."""

    def __init__(self, device, layout="page_first", slots=32, page_size=4, layers=2, heads=2,
                 dim=8, dtype=torch.bfloat16):
        self.device, self.layout, self.page_size, self.dtype = device, layout, page_size, dtype
        self.layers, self.token = layers, heads * dim
        shape = (2, slots, layers, heads, dim) if layout == "page_first" else (
            2, layers, slots, heads, dim)
        self.kv_buffer = torch.zeros(shape, dtype=dtype, device=device)
        self.size_per_token = 2 * layers * heads * dim * self.kv_buffer.element_size()

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        es = self.kv_buffer.element_size()
        for first in indices.tolist()[:: self.page_size]:
            if self.layout == "page_first":
                for kv in range(2):
                    ptrs.append(self.ptr(self.kv_buffer[kv], first * self.layers * self.token))
                    sizes.append(self.page_size * self.layers * self.token * es)
            else:
                for layer in range(self.layers):
                    for kv in range(2):
                        ptrs.append(self.ptr(self.kv_buffer[kv, layer], first * self.token))
                        sizes.append(self.page_size * self.token * es)
        return ptrs, sizes

    def fill(self, page, seed):
        sl = slice(page * self.page_size, (page + 1) * self.page_size)
        view = self.kv_buffer[:, sl] if self.layout == "page_first" else self.kv_buffer[:, :, sl]
        view.copy_(seeded(view.shape, self.dtype, self.device, seed))

    def page(self, page):
        sl = slice(page * self.page_size, (page + 1) * self.page_size)
        view = self.kv_buffer[:, sl] if self.layout == "page_first" else self.kv_buffer[:, :, sl]
        return view.clone()


class MlaPool(DevicePool):
    """SGLang's MLA host pool, page_first: kv[slot][layer][1][kv_lora_rank + rope] (one buffer
    per page)."""

    def __init__(self, device, slots=32, page_size=4, layers=3, dim=24, dtype=torch.bfloat16):
        self.device, self.layout, self.page_size, self.dtype = device, "page_first", page_size, dtype
        self.kv_buffer = torch.zeros((slots, layers, 1, dim), dtype=dtype, device=device)
        self.row = layers * dim
        self.size_per_token = self.row * self.kv_buffer.element_size()

    def get_page_buffer_meta(self, indices):
        es = self.kv_buffer.element_size()
        firsts = indices.tolist()[:: self.page_size]
        return ([self.ptr(self.kv_buffer, f * self.row) for f in firsts],
                [self.page_size * self.row * es] * len(firsts))

    def fill(self, page, seed):
        v = self.kv_buffer[page * self.page_size:(page + 1) * self.page_size]
        v.copy_(seeded(v.shape, self.dtype, self.device, seed))

    def page(self, page):
        return self.kv_buffer[page * self.page_size:(page + 1) * self.page_size].clone()


class LogicalAnchor:
    """DeepSeek-V4's KV anchor (SGLang's LogicalHostPool): slots, no tensor."""

    def __init__(self, page_size=4):
        self.page_size, self.layout, self.device = page_size, "layer_first", "cpu"
        self.dtype = torch.uint8
        self.kv_buffer = None
        self.size_per_token = 0

    def get_page_buffer_meta(self, indices):
        return None


class V4PagedPool(DevicePool):
    """A DeepSeek-V4 paged side pool (compressed KV, indexer): per layer rows[page][item_bytes];
    per page, one buffer per layer (SGLang's DeepSeekV4PagedHostPool). A state pool is the same
    shape over SWA pages (DeepSeekV4StateHostPool)."""

    dtype = torch.uint8

    def __init__(self, device, page_size=4, pages=8, layers=2, item_bytes=96):
        self.device, self.layout, self.page_size = device, "layer_first", page_size
        self.item_bytes, self.layers = item_bytes, layers
        self.kv_buffer = [torch.zeros((pages, item_bytes), dtype=torch.uint8, device=device)
                          for _ in range(layers)]
        self.size_per_token = item_bytes

    def get_page_buffer_meta(self, indices):
        rows = indices.reshape(-1, self.page_size)[:, 0] // self.page_size
        ptrs = [self.ptr(self.kv_buffer[layer], int(r) * self.item_bytes)
                for r in rows.tolist() for layer in range(self.layers)]
        return ptrs, [self.item_bytes] * len(ptrs)

    def fill(self, page, seed):
        for layer in range(self.layers):
            self.kv_buffer[layer][page].copy_(
                seeded((self.item_bytes,), torch.uint8, self.device, seed * 31 + layer))

    def page(self, page):
        return torch.stack([self.kv_buffer[layer][page] for layer in range(self.layers)]).clone()


class MambaPoolHost(DevicePool):
    """A Mamba state host pool (one state per slot, page_size 1): per slot a temporal and a conv
    buffer, each a TP shard (the class name is SGLang's)."""

    dtype = torch.float32

    def __init__(self, device, slots=8, temporal=40, conv=24):
        self.device, self.layout, self.page_size = device, "page_first", 1
        self.temporal = torch.zeros((slots, temporal), dtype=torch.float32, device=device)
        self.conv = torch.zeros((slots, conv), dtype=torch.float32, device=device)
        self.size_per_token = (temporal + conv) * 4

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for i in indices.tolist():
            ptrs += [self.ptr(self.temporal, i * self.temporal.shape[1]),
                     self.ptr(self.conv, i * self.conv.shape[1])]
            sizes += [self.temporal.shape[1] * 4, self.conv.shape[1] * 4]
        return ptrs, sizes


KEYS = [f"{i:064x}" for i in range(1, 9)]


def backend(device, pool_factory, **cfg):
    b = lts.LibtierHiCacheStorage(config(**cfg), {})
    b.register_mem_pool_host(pool_factory(device))
    return b


# --- the KV pool through v1, in SGLang's layouts ------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make", [
    lambda d: MhaPool(d, "page_first"),
    lambda d: MhaPool(d, "layer_first"),
    lambda d: MlaPool(d),
], ids=["mha_page_first", "mha_layer_first", "mla"])
def test_v1_round_trips_pages_bit_exact_in_each_layout(device, make):
    b = backend(device, make, is_mla_model=isinstance(make(device), MlaPool))
    pool = b.mem_pool_host
    for p in range(3):
        pool.fill(p, seed=p + 1)
    want = [pool.page(p) for p in range(3)]
    assert b.batch_set_v1(KEYS[:3], idx(pool, [0, 1, 2])) == [True] * 3
    assert b.batch_exists(KEYS[:4]) == 3
    assert b.batch_get_v1(KEYS[:3], idx(pool, [6, 4, 5])) == [True] * 3
    for got, w in zip([6, 4, 5], want):
        assert torch.equal(pool.page(got), w)
    b.close()


def test_the_namespace_separates_kv_dtypes_of_equal_size():
    # bf16 and fp16 pages have the same bytes per token: the second pool must not be served the
    # first one's pages (a restart with another dtype).
    shared = {"tiers": [{"name": "cpu", "capacity": "64MiB", "backend": {"type": "cpu"}}]}
    b = lts.LibtierHiCacheStorage(config(extra={"profile": shared}), {})
    bf16 = MhaPool("cpu", dtype=torch.bfloat16)
    b.register_mem_pool_host(bf16)
    tag_bf16 = b.pool_tag("kv")
    b.register_mem_pool_host(MhaPool("cpu", dtype=torch.float16))
    assert b.pool_tag("kv") != tag_bf16
    b.register_mem_pool_host(MhaPool("cpu", layout="layer_first"))
    assert b.pool_tag("kv") != tag_bf16
    b.register_mem_pool_host(MhaPool("cpu", page_size=8))
    assert b.pool_tag("kv") != tag_bf16
    b.close()


# --- DeepSeek-V4: the logical anchor and its side pools ----------------------------------------


def v4_backend(device, **cfg):
    b = lts.LibtierHiCacheStorage(config(is_mla_model=True, **cfg), {})
    b.register_mem_pool_host(LogicalAnchor())
    for name in ("deepseek_v4_c4", "deepseek_v4_c4_indexer", "deepseek_v4_c128"):
        b.register_mem_host_pool_v2(V4PagedPool(device), lts.PoolName(name))
    b.register_mem_host_pool_v2(V4PagedPool(device, item_bytes=64), lts.PoolName.SWA)
    b.register_mem_host_pool_v2(V4PagedPool(device, item_bytes=48),
                                lts.PoolName.DEEPSEEK_V4_C4_STATE)
    return b


PAGED = ["deepseek_v4_c4", "deepseek_v4_c4_indexer", "deepseek_v4_c128"]
STATES = ["swa", "deepseek_v4_c4_state"]


def v4_transfers(b, pages, keys, states_keys=None):
    out = [lts.PoolTransfer(name=lts.PoolName(n), host_indices=idx(b.registered_pools[n], pages),
                            keys=list(keys)) for n in PAGED]
    if states_keys is not None:
        last = pages[-len(states_keys):]
        out += [lts.PoolTransfer(name=lts.PoolName(n),
                                 host_indices=idx(b.registered_pools[n], last),
                                 keys=list(states_keys),
                                 hit_policy=lts.PoolHitPolicy.TRAILING_PAGES) for n in STATES]
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_v4_anchor_set_succeeds_side_pools_round_trip_and_exists_reports_the_prefix(device):
    b = v4_backend(device)
    for n in PAGED + STATES:
        for p in range(4):
            b.registered_pools[n].fill(p, seed=hash(n) % 1000 + p)
    want = {n: [b.registered_pools[n].page(p) for p in range(4)] for n in PAGED + STATES}
    # The controller's order: the side pools (batch_set_v2), then the anchor (batch_set_v1).
    res = b.batch_set_v2(v4_transfers(b, [0, 1, 2, 3], KEYS[:4], KEYS[3:4]))
    assert all(all(v) for v in res.values()), res
    assert b.batch_set_v1(KEYS[:4], idx(b.mem_pool_host, [0, 1, 2, 3])) == [True] * 4
    # The anchor is present where its side pools are: 4 pages, and no KV object was stored.
    assert b.batch_exists(KEYS[:6]) == 4
    assert not b.store.exists([b.object_key("kv", KEYS[0])])[0]
    trailing = [lts.PoolTransfer(name=lts.PoolName(n), keys=["x"],
                                 hit_policy=lts.PoolHitPolicy.TRAILING_PAGES) for n in STATES]
    paged = [lts.PoolTransfer(name=lts.PoolName(n)) for n in PAGED]
    r = b.batch_exists_v2(KEYS[:6], paged + trailing)
    assert r.kv_hit_pages == 4
    assert r.restorable_prefix_pages == [4]  # states only after page 4
    assert r.extra_pool_hit_pages["kv"] == 4
    # Into other rows, bit exact.
    for n in PAGED + STATES:
        for t in b.registered_pools[n].kv_buffer:
            t.zero_()
    got = b.batch_get_v2(v4_transfers(b, [7, 6, 5, 4], KEYS[:4], KEYS[3:4]))
    assert all(all(v) for v in got.values()), got
    assert b.batch_get_v1(KEYS[:4], idx(b.mem_pool_host, [0, 1, 2, 3])) == [True] * 4
    for n in PAGED:
        for src, dst in zip(range(4), [7, 6, 5, 4]):
            assert torch.equal(b.registered_pools[n].page(dst), want[n][src])
    for n in STATES:
        assert torch.equal(b.registered_pools[n].page(4), want[n][3])
    b.close()


def test_v4_a_missing_side_page_shortens_the_anchor_and_the_restorable_endpoints():
    b = v4_backend("cpu")
    res = b.batch_set_v2(v4_transfers(b, [0, 1, 2, 3], KEYS[:4], KEYS[1:2] + KEYS[3:4]))
    assert all(all(v) for v in res.values()), res
    b.store.remove([b.object_key("deepseek_v4_c128", KEYS[2])])
    assert b.batch_exists(KEYS[:4]) == 2
    trailing = [lts.PoolTransfer(name=lts.PoolName(n), keys=["x"],
                                 hit_policy=lts.PoolHitPolicy.TRAILING_PAGES) for n in STATES]
    r = b.batch_exists_v2(KEYS[:4], [lts.PoolTransfer(name=lts.PoolName(n)) for n in PAGED]
                          + trailing)
    # States at 2 and 4; pages 0..1 complete: only 2 is restorable.
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (2, [2])
    b.close()


def test_v4_every_pool_name_and_policy_is_known():
    names = {n.value for n in lts.PoolName}
    for n in ("deepseek_v4_c4", "deepseek_v4_c4_indexer", "deepseek_v4_c128",
              "deepseek_v4_c4_state", "deepseek_v4_c4_indexer_state", "deepseek_v4_c128_state",
              "swa", "mamba", "indexer", "kv", "draft", "draft_indexer", "draft_swa"):
        assert n in names
        assert (n in lts.ALL_PAGES_POOLS) != (n in lts.TRAILING_PAGES_POOLS)
    assert lts.is_logical_pool(LogicalAnchor()) and not lts.is_logical_pool(MlaPool("cpu"))


# --- a hybrid model's Mamba state at TP 2 on an MLA model --------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_mamba_state_at_tp2_on_an_mla_model_loads_each_ranks_own_shard(device, tmp_path):
    # Both ranks share one tier (a shared-memory segment, as TP ranks on one host do).
    seg = f"libtier-test-{uuid.uuid4().hex[:12]}"
    profile = {"tiers": [{"name": "cpu", "capacity": "16MiB",
                          "backend": {"type": "cpu", "mode": "shm", "segment": seg}}]}
    try:
        ranks = [lts.LibtierHiCacheStorage(
            config(is_mla_model=True, tp_rank=r, tp_size=2, extra={"profile": profile}), {})
            for r in range(2)]
    except libtier.Error as e:
        pytest.skip(f"no shared-memory tier here: {e}")
    try:
        pools = []
        for r, b in enumerate(ranks):
            b.register_mem_pool_host(MlaPool(device))
            m = MambaPoolHost(device)
            b.register_mem_host_pool_v2(m, lts.PoolName.MAMBA)
            m.temporal[0].fill_(float(r + 1))
            m.conv[0].fill_(float(10 * (r + 1)))
            pools.append(m)
            assert b.tp_sharded_pool("mamba") and not b.tp_sharded_pool("kv")
        # The replicated KV: rank 0 saves it, rank 1 finds it under the same key.
        assert ranks[0].object_key("kv", KEYS[0]) == ranks[1].object_key("kv", KEYS[0])
        assert ranks[0].object_key("mamba", KEYS[0]) != ranks[1].object_key("mamba", KEYS[0])
        for b in ranks:
            t = lts.PoolTransfer(name=lts.PoolName.MAMBA, host_indices=torch.tensor([0]),
                                 keys=KEYS[:1], hit_policy=lts.PoolHitPolicy.TRAILING_PAGES)
            assert b.batch_set_v2([t]) == {"mamba": [True]}
        for r, (b, m) in enumerate(zip(ranks, pools)):
            t = lts.PoolTransfer(name=lts.PoolName.MAMBA, host_indices=torch.tensor([3]),
                                 keys=KEYS[:1], hit_policy=lts.PoolHitPolicy.TRAILING_PAGES)
            assert b.batch_get_v2([t]) == {"mamba": [True]}
            assert torch.all(m.temporal[3] == float(r + 1))
            assert torch.all(m.conv[3] == float(10 * (r + 1)))
    finally:
        for b in ranks:
            b.clear()
            b.close()


# --- clear, errors ----------------------------------------------------------------------------


def test_clear_leaves_no_object_of_the_namespace_in_any_tier(tmp_path):
    two_tiers = {"tiers": [
        {"name": "cpu", "capacity": "8MiB", "backend": {"type": "cpu"}},
        {"name": "disk", "capacity": "64MiB",
         "backend": {"type": "disk", "path": str(tmp_path / "disk")}},
    ]}
    b = lts.LibtierHiCacheStorage(config(extra={"profile": two_tiers}), {})
    pool = MhaPool("cpu")
    b.register_mem_pool_host(pool)
    assert b.batch_set_v1(KEYS[:5], idx(pool, range(5))) == [True] * 5
    b.store.flush()
    keys = [b.object_key("kv", k) for k in KEYS[:5]]
    assert all(b.store.exists(keys))
    assert b.clear() is True
    assert not any(b.store.exists(keys))
    assert b.batch_exists(KEYS[:5]) == 0
    b.close()


class Broken(MhaPool):
    def get_page_buffer_meta(self, indices):
        raise RuntimeError("host pool is gone")


class Unsupported(MhaPool):
    def get_page_buffer_meta(self, indices):
        raise NotImplementedError("no zero-copy here")


@pytest.mark.parametrize("pool_cls", [Broken, Unsupported])
def test_a_host_pool_that_raises_yields_false_never_an_exception(pool_cls, caplog):
    b = lts.LibtierHiCacheStorage(config(), {})
    b.register_mem_pool_host(pool_cls("cpu"))
    b.register_mem_host_pool_v2(pool_cls("cpu"), lts.PoolName.INDEXER)
    pool = b.mem_pool_host
    with caplog.at_level(logging.DEBUG, logger=lts.__name__):
        for _ in range(3):
            assert b.batch_set_v1(KEYS[:2], idx(pool, [0, 1])) == [False, False]
            assert b.batch_get_v1(KEYS[:2], idx(pool, [0, 1])) == [False, False]
        t = lts.PoolTransfer(name=lts.PoolName.INDEXER, host_indices=idx(pool, [0]), keys=KEYS[:1])
        assert b.batch_set_v2([t]) == {"indexer": [False]}
        assert b.batch_get_v1(None, None) == []  # garbage in: still no exception
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "batch_set_v1" in r.message]
    assert len(errors) == 1  # logged once
    assert b.metrics()["sglang"]["failures"]["batch_set_v1"] == 3
    b.close()


def test_extra_keys_sglang_passes_keep_requests_apart():
    b = backend("cpu", MhaPool)
    pool = b.mem_pool_host
    pool.fill(0, seed=5)
    lora = lts.HiCacheStorageExtraInfo(extra_info={"lora_id": "adapter-a"})
    assert b.batch_set_v1(KEYS[:1], idx(pool, [0]), lora) == [True]
    assert b.batch_exists(KEYS[:1], lora) == 1
    assert b.batch_exists(KEYS[:1]) == 0
    assert b.batch_exists(KEYS[:1], lts.HiCacheStorageExtraInfo(
        extra_info={"lora_id": "adapter-b"})) == 0
    b.close()


def test_restorable_prefix_pages_is_filled_for_a_plain_kv_pool():
    b = backend("cpu", MhaPool)
    pool = b.mem_pool_host
    assert b.batch_set_v1(KEYS[:3], idx(pool, [0, 1, 2])) == [True] * 3
    r = b.batch_exists_v2(KEYS[:5], [])
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (3, [1, 2, 3])
    b.close()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([os.path.abspath(__file__), "-q"]))
