"""An SGLang HiCache storage backend (L3) over libtier: ``libtier.integrations.sglang``.

SGLang selects it with its dynamic backend loader (docs/integration.md has the whole command)::

    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "libtier",
        "module_path": "libtier.integrations.sglang", "class_name": "LibtierHiCacheStorage",
        "interface_v1": 1, "profile": "/etc/libtier/profile.json"}'

SGLang's ``StorageBackendFactory`` imports ``module_path``, checks that ``class_name`` derives
from its ``HiCacheStorage`` and calls ``LibtierHiCacheStorage(storage_config, kwargs)``; the
HiCache controller then calls :meth:`register_mem_pool_host` with its host KV pool (for a hybrid
model the pool group, whose KV part is its anchor) and :meth:`register_mem_host_pool_v2` once per
pool. With ``"interface_v1": 1`` the controller moves KV pages through :meth:`batch_get_v1` /
:meth:`batch_set_v1`, zero-copy between libtier and the host pool's memory; without it, through
:meth:`batch_get` / :meth:`batch_set` on flat page copies. The other pools of a hybrid model
(DeepSeek-V4's compressed KV, indexer and state pools, Mamba state, SWA, draft pools) go through
:meth:`batch_get_v2` / :meth:`batch_set_v2` / :meth:`batch_exists_v2`.

Extra-config keys read here (besides SGLang's own ``backend_name``, ``module_path``,
``class_name``, ``interface_v1``):

- ``profile`` (required): the libtier profile, as a path, JSON text or an object.
- ``namespace`` (optional): any JSON value added to the namespace identity, to keep deployments
  that share tiers apart (e.g. a model revision).
- ``kv_cache_dtype`` (optional): the KV cache dtype (``"fp8_e4m3"``, ...) when the host pools
  do not tell it (a pool of bytes).
- ``tp_sharded_pools`` (optional): names of pools that hold a TP shard per rank although the model
  is MLA (``is_mla_model``); ``mamba`` and pools of an MHA or Mamba host pool class are so already.

Objects: one libtier ``Store`` per backend, namespace = ``namespace_id`` of
``{"integration": "sglang-hicache", "model", "tp_size", "pp_size", "pp_rank", "attn_cp_size",
"attn_cp_rank", "is_mla", "interface_v1", "kv_cache_dtype", "namespace"}``, rank = the TP rank
(0 for an MLA model, whose KV is the same on every rank and is saved by rank 0 only). A page of
pool ``P`` whose SGLang hash is ``H`` is the object ``external_key("<P's tag>/<extra>/H")``; its
bytes are the page's host-pool buffers (``get_page_buffer_meta``) concatenated in order. The tag
names the pool and its shape: its name, KV dtype, stored dtype, host layout, page size and bytes
per token (so a bf16 pool is never served an fp16 page of the same size, nor an e4m3 pool an
e5m2 one), and for a TP-sharded pool of an MLA model the TP rank and size (each rank loads its
own shard). ``<extra>`` is the request's extra key when SGLang passes one (LoRA adapter,
multimodal hashes, cache salt: ``HiCacheStorageExtraInfo.extra_info`` keys ``"extra_key"``,
``"lora_id"``, ``"cache_salt"``, ``"mm_hashes"``), empty otherwise. SGLang's ``H`` chains the
hashes of every earlier page, so an object names its whole prefix.

The logical KV anchor (DeepSeek-V4, SGLang's ``LogicalHostPool``): a KV host pool that holds no
tensor (``kv_buffer is None``, no bytes per token, ``get_page_buffer_meta()`` gives ``None``) is
an index space only; the bytes live in the side pools. Nothing is stored for it: a set of anchor
pages succeeds at once, and an anchor page is present (``batch_exists``, ``batch_get_v1``, the
``kv`` part of ``batch_exists_v2``) when every all-pages side pool holds it (the compressed KV and
indexer pools: ``deepseek_v4_c4``, ``deepseek_v4_c4_indexer``, ``deepseek_v4_c4_indexer_scale``,
``deepseek_v4_c128``).

Hit policies (``batch_exists_v2``): a state pool (``TRAILING_PAGES``: Mamba, SWA, the DeepSeek-V4
state pools) is usable only together with its whole page prefix, in every ``ALL_PAGES`` pool:
libtier's SLOT rule (docs/engine.md). The restorable endpoints are the ``p`` such that pages
``[0, p)`` are present in the KV pool and in every ``ALL_PAGES`` pool, and every ``TRAILING_PAGES``
pool holds its last ``len(transfer.keys)`` pages before ``p``; ``restorable_prefix_pages`` lists
them (ascending, as SGLang intersects them across ranks) and ``kv_hit_pages`` is the largest.
``batch_set_v2`` stores the ``ALL_PAGES`` pools before any state, and stores no state of a call in
which a page failed.

Errors: no exception ever leaves a storage call. A failure is ``False`` (or 0, or ``None`` for
the generic ``get``), counted per call in ``metrics()["sglang"]`` and logged once per call and
kind of error (later ones at debug level): SGLang's prefetch and backup threads catch nothing
but ``queue.Empty``, and a thread that dies turns L3 off for the life of the process.

Threads: SGLang calls a backend from its prefetch, backup and scheduler threads at once. The
Store runs concurrent calls' transfers in parallel and releases the GIL during every one; this class
keeps no other mutable state after registration but its error counters (under a lock), so every
method may be called from any thread.

Without SGLang installed (tests, docs), the interface types are defined here with SGLang's names
and fields: ``HiCacheStorage``, ``HiCacheStorageConfig``, ``HiCacheStorageExtraInfo``,
``PoolName``, ``PoolHitPolicy``, ``PoolTransfer``, ``PoolTransferResult``. With SGLang installed,
SGLang's own classes are used, so the factory's ``issubclass`` check passes.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import logging
import threading
from typing import Any, Callable, Optional, Sequence

import libtier

log = logging.getLogger(__name__)

try:
    from sglang.srt.mem_cache.hicache_storage import (
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
        PoolHitPolicy,
        PoolTransfer,
        PoolTransferResult,
    )

    HAVE_SGLANG = True
except ImportError:
    HAVE_SGLANG = False

    class HiCacheStorage:  # type: ignore[no-redef]
        """Stand-in for SGLang's abstract storage base: the two registration hooks."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: str) -> None:
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

    @dataclasses.dataclass
    class HiCacheStorageConfig:  # type: ignore[no-redef]
        """Stand-in for SGLang's per-rank storage configuration (same fields)."""

        tp_rank: int
        tp_size: int
        pp_rank: int
        pp_size: int
        attn_cp_rank: int
        attn_cp_size: int
        is_mla_model: bool
        enable_storage_metrics: bool
        is_page_first_layout: bool
        model_name: Optional[str]
        dp_rank: int = 0
        dp_size: int = 1
        tp_lcm_size: Optional[int] = None
        should_split_heads: bool = False
        extra_config: Optional[dict] = None

    @dataclasses.dataclass
    class HiCacheStorageExtraInfo:  # type: ignore[no-redef]
        """Stand-in: the hashes of the pages before a batch, and backend-specific data."""

        prefix_keys: Optional[list] = None
        extra_info: Optional[dict] = None

    class PoolHitPolicy(str, enum.Enum):  # type: ignore[no-redef]
        """Stand-in: how a pool's pages must be present for a prefix hit."""

        ALL_PAGES = "all_pages"  # every page of the prefix
        TRAILING_PAGES = "trailing_pages"  # only the last len(keys) pages (a state)

    @dataclasses.dataclass
    class PoolTransfer:  # type: ignore[no-redef]
        """Stand-in: one pool's part of a v2 transfer (host_indices + keys to storage)."""

        name: Any
        host_indices: Any = None
        device_indices: Any = None
        keys: Optional[list] = None
        hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
        nodes_to_load: Optional[list] = None
        indices_from_pool: Any = None

    @dataclasses.dataclass
    class PoolTransferResult:  # type: ignore[no-redef]
        """Stand-in: the usable KV prefix in pages, each pool's page count, and every restorable
        prefix length (ascending)."""

        kv_hit_pages: int
        extra_pool_hit_pages: dict
        restorable_prefix_pages: Optional[list] = None


try:
    from sglang.srt.mem_cache.hicache_storage import PoolName
except ImportError:

    class PoolName(str, enum.Enum):  # type: ignore[no-redef]
        """Stand-in: SGLang's well-known pool names."""

        KV = "kv"
        MAMBA = "mamba"
        SWA = "swa"
        INDEXER = "indexer"
        DEEPSEEK_V4_C4 = "deepseek_v4_c4"
        DEEPSEEK_V4_C4_INDEXER = "deepseek_v4_c4_indexer"
        DEEPSEEK_V4_C4_INDEXER_SCALE = "deepseek_v4_c4_indexer_scale"
        DEEPSEEK_V4_C128 = "deepseek_v4_c128"
        DEEPSEEK_V4_C4_STATE = "deepseek_v4_c4_state"
        DEEPSEEK_V4_C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
        DEEPSEEK_V4_C128_STATE = "deepseek_v4_c128_state"
        DRAFT = "draft"
        DRAFT_INDEXER = "draft_indexer"
        DRAFT_SWA = "draft_swa"

        def __str__(self) -> str:
            return self.value


KV_POOL = "kv"
"""The pool name of the v1 calls (SGLang's ``PoolName.KV``)."""

ALL_PAGES_POOLS = frozenset({
    "kv", "indexer", "deepseek_v4_c4", "deepseek_v4_c4_indexer", "deepseek_v4_c4_indexer_scale",
    "deepseek_v4_c128", "draft", "draft_indexer",
})
"""Pools whose every page of a prefix must be present: KV and what is derived from it per page."""

TRAILING_PAGES_POOLS = frozenset({
    "mamba", "swa", "deepseek_v4_c4_state", "deepseek_v4_c4_indexer_state",
    "deepseek_v4_c128_state", "draft_swa",
})
"""State pools: only the last pages before a prefix's end are needed (SGLang's TRAILING_PAGES)."""

EXTRA_KEY_FIELDS = ("extra_key", "lora_id", "cache_salt", "mm_hashes")
"""HiCacheStorageExtraInfo.extra_info entries that make a request's KV differ (docs/keys.md)."""


def pool_name(name: Any) -> str:
    """The string of a pool name (an SGLang ``PoolName`` enum member or a str)."""
    return str(getattr(name, "value", name))


def _is_trailing(transfer: Any) -> bool:
    policy = getattr(transfer, "hit_policy", None)
    if policy is not None:
        return pool_name(policy) == PoolHitPolicy.TRAILING_PAGES.value
    return pool_name(transfer.name) in TRAILING_PAGES_POOLS


def is_logical_pool(host_pool: Any) -> bool:
    """Whether `host_pool` is an index space without bytes (SGLang's V4 ``LogicalHostPool``, or a
    pool group whose anchor is one)."""
    if host_pool is None:
        return False
    try:
        return getattr(host_pool, "kv_buffer", 0) is None and not getattr(
            host_pool, "size_per_token", 1)
    except Exception:  # a pool whose attribute access fails is not one we understand
        return False


def _result(kv: int, hits: dict, restorable: list) -> Any:
    """A PoolTransferResult, with restorable_prefix_pages where SGLang's class has the field."""
    try:
        return PoolTransferResult(kv, hits, restorable)
    except TypeError:  # an SGLang whose result has two fields
        return PoolTransferResult(kv, hits)


def _extra_key(extra_info: Any) -> str:
    """The request's extra key from SGLang's HiCacheStorageExtraInfo (empty: none)."""
    info = getattr(extra_info, "extra_info", None)
    if not isinstance(info, dict):
        return ""
    parts = {f: info[f] for f in EXTRA_KEY_FIELDS if info.get(f) not in (None, "", [], ())}
    if not parts:
        return ""
    return json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))


def _guarded(default: Callable[..., Any]):
    """Turns any exception of a storage call into `default(*args)`, counted and logged once."""

    def wrap(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except Exception as e:  # never into SGLang's storage threads
                self._failed(method.__name__, e)
                return default(*args, **kwargs)

        return call

    return wrap


def _false_per_key(keys=(), *_, **__):
    return [False] * len(keys or [])


def _false_per_transfer(transfers=(), *_, **__):
    return {pool_name(t.name): [False] * len(getattr(t, "keys", None) or []) for t in transfers or []}


class LibtierHiCacheStorage(HiCacheStorage):
    """SGLang's ``HiCacheStorage`` over a libtier ``Store`` (module docstring: the mapping)."""

    def __init__(self, storage_config: Any, kwargs: Optional[dict] = None) -> None:
        """Opens the Store of ``extra_config["profile"]`` for this rank.

        Raises ValueError without a profile, libtier.Error when the profile cannot be opened (at
        construction only: SGLang then reports the backend as not created)."""
        extra = dict(storage_config.extra_config or {})
        profile = extra.get("profile")
        if profile is None:
            raise ValueError(
                'libtier HiCache backend: --hicache-storage-backend-extra-config needs "profile" '
                "(a libtier profile path, JSON text or object)"
            )
        if isinstance(profile, str) and profile.lstrip().startswith("{"):
            profile = json.loads(profile)
        self.is_mla = bool(storage_config.is_mla_model)
        self.interface_v1 = bool(extra.get("interface_v1", 0))
        self.tp_rank = int(storage_config.tp_rank)
        self.tp_size = int(storage_config.tp_size)
        self.kv_cache_dtype = extra.get("kv_cache_dtype")
        self.tp_sharded = frozenset(pool_name(n) for n in extra.get("tp_sharded_pools", []))
        self.identity = {
            "integration": "sglang-hicache",
            "model": storage_config.model_name or "",
            "tp_size": 1 if self.is_mla else self.tp_size,
            "pp_size": int(storage_config.pp_size),
            "pp_rank": int(storage_config.pp_rank),
            "attn_cp_size": int(getattr(storage_config, "attn_cp_size", 1)),
            "attn_cp_rank": int(getattr(storage_config, "attn_cp_rank", 0)),
            "is_mla": self.is_mla,
            "interface_v1": self.interface_v1,
            "kv_cache_dtype": self.kv_cache_dtype,
            "namespace": extra.get("namespace"),
        }
        rank = 0 if self.is_mla else self.tp_rank
        self.store = libtier.Store.open(profile, namespace=self.identity, rank=rank)
        self.registered_pools: dict = {}
        self.mem_pool_host: Any = None
        self._tags: dict = {}
        self._lock = threading.Lock()
        self._failures: dict = {}
        self._logged: set = set()
        self.anchor_pages_set = 0  # logical anchor pages "stored" (nothing to store)

    # --- errors -------------------------------------------------------------------------------

    def _failed(self, call: str, error: BaseException) -> None:
        kind = type(error).__name__
        with self._lock:
            self._failures[call] = self._failures.get(call, 0) + 1
            first = (call, kind) not in self._logged
            self._logged.add((call, kind))
        (log.error if first else log.debug)(
            "libtier HiCache %s failed (%s: %s)%s", call, kind, error,
            "; further failures of this kind are logged at debug level" if first else "")

    def _count_anchor_pages(self, n: int) -> None:
        with self._lock:
            self.anchor_pages_set += n

    # --- registration (SGLang's controller, once at start) -------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """The host KV pool of the v1 calls (also the v2 pool named "kv" unless registered)."""
        previous = self.mem_pool_host
        self.mem_pool_host = mem_pool_host
        if self.registered_pools.get(KV_POOL, previous) is previous:
            self.registered_pools[KV_POOL] = mem_pool_host
        self._tags.pop(KV_POOL, None)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """The host pool of v2 transfers named `host_pool_name`."""
        name = pool_name(host_pool_name)
        self.registered_pools[name] = host_pool
        self._tags.pop(name, None)

    # --- keys and regions ----------------------------------------------------------------------

    def tp_sharded_pool(self, pool: str) -> bool:
        """Whether pool `pool` holds one TP shard per rank although the Store is rank 0's (an MLA
        model: its KV is replicated, but a Mamba/KDA state or an MHA draft pool is not)."""
        if not self.is_mla:
            return False  # every object is keyed by this rank already (the Store's rank)
        if pool == "mamba" or pool in self.tp_sharded:
            return True
        cls = type(self.registered_pools.get(pool)).__name__
        return "MHA" in cls or "Mamba" in cls

    def pool_tag(self, pool: str) -> str:
        """The key prefix of pool `pool`: its name and shape (module docstring)."""
        tag = self._tags.get(pool)
        if tag is not None:
            return tag
        host = self.registered_pools.get(pool)
        shape: dict = {"pool": pool}
        if host is not None:
            device_pool = getattr(host, "device_pool", None)
            kv_dtype = getattr(device_pool, "dtype", None) or self.kv_cache_dtype
            shape.update({
                "kv_dtype": None if kv_dtype is None else str(kv_dtype),
                "store_dtype": None if getattr(host, "dtype", None) is None else str(host.dtype),
                "layout": getattr(host, "layout", None),
                "page_size": int(getattr(host, "page_size", 1) or 1),
                "bytes_per_token": int(getattr(host, "size_per_token", 0) or 0),
            })
        if self.tp_sharded_pool(pool):
            shape.update({"tp_rank": self.tp_rank, "tp_size": self.tp_size})
        tag = libtier.namespace_id(shape)
        self._tags[pool] = tag
        return tag

    def object_key(self, pool: str, key: str, extra: str = "") -> str:
        """The libtier key of page `key` (an SGLang page hash) of pool `pool`."""
        return libtier.external_key(f"{self.pool_tag(pool)}/{extra}/{key}")

    def _keys(self, pool: str, keys: Sequence[str], extra: str = "") -> list:
        tag = self.pool_tag(pool)
        return [libtier.external_key(f"{tag}/{extra}/{k}") for k in keys]

    @staticmethod
    def _region_kind(host_pool: Any) -> tuple:
        device = str(getattr(host_pool, "device", "cpu"))
        if device.startswith("cuda"):
            index = device.partition(":")[2]
            return libtier.MemoryKind.DEVICE, int(index) if index else 0
        return libtier.MemoryKind.HOST, -1

    @staticmethod
    def _page_regions(host_pool: Any, host_indices: Any, pages: int) -> Optional[list]:
        """Per page, the host pool's buffers of that page (get_page_buffer_meta), as Regions;
        None for a pool without bytes (a logical anchor).

        Raises ValueError when the indices do not cover exactly `pages` pages of the pool."""
        page_size = int(getattr(host_pool, "page_size", 1) or 1)
        if host_indices is None or len(host_indices) != pages * page_size:
            got = 0 if host_indices is None else len(host_indices)
            raise ValueError(f"{got} host indices for {pages} pages of {page_size} slots")
        if pages == 0:
            return []
        meta = host_pool.get_page_buffer_meta(host_indices)
        if meta is None:
            return None
        ptrs, sizes = meta
        if len(ptrs) != len(sizes) or len(ptrs) % pages != 0:
            raise ValueError(f"get_page_buffer_meta gave {len(ptrs)} buffers for {pages} pages")
        per = len(ptrs) // pages
        kind, device = LibtierHiCacheStorage._region_kind(host_pool)
        return [
            [libtier.Region(int(p), int(n), kind, device)
             for p, n in zip(ptrs[i * per:(i + 1) * per], sizes[i * per:(i + 1) * per])]
            for i in range(pages)
        ]

    def _all_pages_side_pools(self, names: Optional[Sequence[str]] = None) -> list:
        """The all-pages pools with bytes among `names` (default: every registered one)."""
        cands = names if names is not None else list(self.registered_pools)
        return [n for n in cands
                if n != KV_POOL and n not in TRAILING_PAGES_POOLS
                and n in self.registered_pools
                and not is_logical_pool(self.registered_pools[n])]

    def _anchor_present(self, keys: Sequence[str], extra: str = "",
                        side: Optional[list] = None) -> list:
        """Per key, whether every all-pages side pool holds that page (a logical anchor's
        presence). No such pool: nothing is present (there are no bytes to restore)."""
        side = self._all_pages_side_pools() if side is None else side
        if not keys or not side:
            return [False] * len(keys)
        present = [True] * len(keys)
        for name in side:
            have = self.store.exists(self._keys(name, keys, extra))
            present = [a and b for a, b in zip(present, have)]
        return present

    def _kv_logical(self) -> bool:
        return is_logical_pool(self.mem_pool_host)

    def _transfer(self, op: str, pool: str, host_pool: Any, keys: Sequence[str],
                  host_indices: Any, extra: str = "") -> list:
        """Saves or loads `keys` of `pool` from / into the host pool; one bool per key. A pool
        without bytes (a logical anchor) stores nothing: a save succeeds, a load reports whether
        its side pools hold the page. Raises for the caller's guard."""
        if not keys:
            return []
        regions = self._page_regions(host_pool, host_indices, len(keys))
        if regions is None:
            if op == "save":
                self._count_anchor_pages(len(keys))
                return [True] * len(keys)
            return self._anchor_present(keys, extra)
        call = self.store.save if op == "save" else self.store.load
        codes = call(self._keys(pool, keys, extra), regions)
        return [c == libtier.Code.OK for c in codes]

    # --- v1: the KV pool, zero-copy ------------------------------------------------------------

    @_guarded(_false_per_key)
    def batch_get_v1(self, keys: list, host_indices: Any,
                     extra_info: Optional[Any] = None) -> list:
        """Loads each page straight into its host-pool slots; True per page loaded.

        `host_indices` holds len(keys) * page_size slots: page i at [i, i + 1) * page_size."""
        return self._transfer("load", KV_POOL, self.mem_pool_host, keys, host_indices,
                              _extra_key(extra_info))

    @_guarded(_false_per_key)
    def batch_set_v1(self, keys: list, host_indices: Any,
                     extra_info: Optional[Any] = None) -> list:
        """Stores each page from its host-pool slots; True per page stored (or stored already)."""
        return self._transfer("save", KV_POOL, self.mem_pool_host, keys, host_indices,
                              _extra_key(extra_info))

    @_guarded(lambda *a, **k: 0)
    def batch_exists(self, keys: list, extra_info: Optional[Any] = None) -> int:
        """The number of leading pages of `keys` stored (libtier's longest-prefix lookup; for a
        logical anchor, the leading run its side pools hold)."""
        if not keys:
            return 0
        extra = _extra_key(extra_info)
        if self._kv_logical():
            present = self._anchor_present(keys, extra)
            return present.index(False) if False in present else len(present)
        return self.store.lookup_prefix(self._keys(KV_POOL, keys, extra))

    @_guarded(lambda *a, **k: False)
    def exists(self, key: str) -> bool:
        if self._kv_logical():
            return self._anchor_present([key])[0]
        return self.store.exists(self._keys(KV_POOL, [key]))[0]

    # --- the generic path (extra_config without "interface_v1"): flat page copies --------------

    @_guarded(lambda *a, **k: None)
    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Any:
        """Loads page `key` into `target_location` (a flat page buffer); it, or None on a miss."""
        if target_location is None:
            return None
        if self._kv_logical():
            return target_location if self._anchor_present([key])[0] else None
        code = self.store.load(self._keys(KV_POOL, [key]), [target_location])[0]
        return target_location if code == libtier.Code.OK else None

    @_guarded(lambda keys=(), *a, **k: [None] * len(keys or []))
    def batch_get(self, keys: list, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> list:
        """Loads each page into its buffer: the buffer, or None for a page not loaded."""
        if not keys:
            return []
        if target_locations is None:
            return [None] * len(keys)
        if self._kv_logical():
            present = self._anchor_present(keys)
            return [t if p else None for t, p in zip(target_locations, present)]
        codes = self.store.load(self._keys(KV_POOL, keys), list(target_locations))
        return [t if c == libtier.Code.OK else None for t, c in zip(target_locations, codes)]

    @_guarded(lambda *a, **k: False)
    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        """Stores the flat page `value` under `key`."""
        return value is not None and self.batch_set([key], [value])

    @_guarded(lambda *a, **k: False)
    def batch_set(self, keys: list, values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Stores each flat page; True when every page is stored."""
        if not keys:
            return True
        if self._kv_logical():
            self._count_anchor_pages(len(keys))
            return True
        if values is None:
            return False
        codes = self.store.save(self._keys(KV_POOL, keys), list(values))
        return all(c == libtier.Code.OK for c in codes)

    # --- v2: several pools, hit policies -------------------------------------------------------

    @_guarded(lambda *a, **k: _result(0, {}, []))
    def batch_exists_v2(self, keys: list, pool_transfers: Optional[list] = None,
                        extra_info: Optional[Any] = None) -> Any:
        """The restorable prefixes of `keys` over the KV pool and every pool of `pool_transfers`.

        restorable_prefix_pages: every p such that pages [0, p) are present in the KV pool (for a
        logical anchor: in its all-pages side pools) and in every ALL_PAGES pool of the
        transfers, and every TRAILING_PAGES pool holds the len(transfer.keys) (at least 1) pages
        before p; kv_hit_pages is the largest (0 when none). extra_pool_hit_pages maps "kv" and
        each ALL_PAGES pool to its leading run and each TRAILING_PAGES pool to kv_hit_pages, for
        the pools with a non-zero count."""
        extra = _extra_key(extra_info)
        transfers = list(pool_transfers or [])
        hits: dict = {}
        if not keys:
            return _result(0, {}, [])
        if self._kv_logical():
            names = [pool_name(t.name) for t in transfers if not _is_trailing(t)]
            side = self._all_pages_side_pools(names) or self._all_pages_side_pools()
            present = self._anchor_present(keys, extra, side)
            limit = present.index(False) if False in present else len(present)
        else:
            limit = self.store.lookup_prefix(self._keys(KV_POOL, keys, extra))
        if limit:
            hits[KV_POOL] = limit
        for t in transfers:
            name = pool_name(t.name)
            if limit == 0 or _is_trailing(t) or name == KV_POOL:
                continue
            if is_logical_pool(self.registered_pools.get(name)):
                continue
            run = self.store.lookup_prefix(self._keys(name, keys[:limit], extra))
            if run:
                hits[name] = run
            limit = min(limit, run)
        restorable = list(range(1, limit + 1))
        trailing = [t for t in transfers if _is_trailing(t)]
        for t in trailing:
            if not restorable:
                break
            width = max(1, len(t.keys or []))
            have = self.store.exists(self._keys(pool_name(t.name), keys[:limit], extra))
            restorable = [p for p in restorable if all(have[max(0, p - width):p])]
        usable = restorable[-1] if restorable else 0
        for t in trailing:
            if usable:
                hits[pool_name(t.name)] = usable
        return _result(usable, hits, restorable)

    def _batch_v2(self, op: str, transfers: list, extra: str) -> dict:
        results: dict = {}
        page_failed = False
        # Pages first: a state is stored only after every page of its call (the SLOT rule).
        ordered = sorted(transfers or [], key=_is_trailing) if op == "save" else transfers or []
        for t in ordered:
            name = pool_name(t.name)
            keys = list(t.keys or [])
            host_pool = self.registered_pools.get(name)
            try:
                if host_pool is None:
                    raise KeyError(f"no host pool registered as {name!r}")
                if op == "save" and _is_trailing(t) and page_failed:
                    ok = [False] * len(keys)
                else:
                    ok = self._transfer(op, name, host_pool, keys, t.host_indices, extra)
            except Exception as e:  # this pool fails; the others go on
                self._failed(f"batch_{'set' if op == 'save' else 'get'}_v2[{name}]", e)
                ok = [False] * len(keys)
            if not _is_trailing(t) and not all(ok):
                page_failed = True
            results[name] = ok
        return results

    @_guarded(_false_per_transfer)
    def batch_get_v2(self, transfers: list, extra_info: Optional[Any] = None) -> dict:
        """Loads each transfer's pages into its registered host pool: pool name -> bool per key."""
        return self._batch_v2("load", transfers, _extra_key(extra_info))

    @_guarded(_false_per_transfer)
    def batch_set_v2(self, transfers: list, extra_info: Optional[Any] = None) -> dict:
        """Stores each transfer's pages from its registered host pool: pool name -> bool per key.

        ALL_PAGES pools go first; when one of their pages fails, no TRAILING_PAGES state of the
        call is stored (False for each)."""
        return self._batch_v2("save", transfers, _extra_key(extra_info))

    # --- operations ----------------------------------------------------------------------------

    @_guarded(lambda *a, **k: False)
    def clear(self) -> bool:
        """Removes every object of this backend's namespace from every tier (SGLang's
        clear_storage_backend, e.g. after a weight update): True when nothing of it is left."""
        removed = self.store.clear()
        log.info("libtier HiCache: cleared %d objects of namespace %s", removed,
                 self.store.namespace)
        return True

    def metrics(self) -> dict:
        """libtier's counters for this rank's Store (docs/metrics.md), plus "sglang": the storage
        calls that failed, by call, and the logical anchor pages set."""
        try:
            m = dict(self.store.metrics())
        except Exception as e:
            self._failed("metrics", e)
            m = {}
        with self._lock:
            m["sglang"] = {"failures": dict(self._failures),
                           "anchor_pages_set": self.anchor_pages_set}
        return m

    def get_stats(self) -> Any:
        """SGLang's storage metrics hook: None (libtier's counters are in metrics())."""
        return None

    def close(self) -> None:
        """Waits for background work and closes the Store (SGLang calls it at shutdown)."""
        try:
            self.store.close()
        except Exception as e:
            self._failed("close", e)
