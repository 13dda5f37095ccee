"""An SGLang HiCache storage backend (L3) over libtier: ``libtier.integrations.sglang``.

SGLang selects it with its dynamic backend loader (docs/integration.md has the whole command)::

    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "libtier",
        "module_path": "libtier.integrations.sglang", "class_name": "LibtierHiCacheStorage",
        "interface_v1": 1, "profile": "/etc/libtier/profile.json"}'

SGLang's ``StorageBackendFactory`` imports ``module_path``, checks that ``class_name`` derives
from its ``HiCacheStorage`` and calls ``LibtierHiCacheStorage(storage_config, kwargs)``; the
HiCache controller then calls :meth:`register_mem_pool_host` with its host KV pool (and
:meth:`register_mem_host_pool_v2` once per pool of a hybrid model). With ``"interface_v1": 1``
the controller moves pages through :meth:`batch_get_v1` / :meth:`batch_set_v1`, zero-copy
between libtier and the host pool's memory; without it, through :meth:`batch_get` /
:meth:`batch_set` on flat page copies.

Extra-config keys read here (besides SGLang's own ``backend_name``, ``module_path``,
``class_name``, ``interface_v1``):

- ``profile`` (required): the libtier profile, as a path, JSON text or an object.
- ``namespace`` (optional): any JSON value added to the namespace identity, to keep deployments
  that share tiers apart (e.g. a model revision).

Objects: one libtier ``Store`` per backend, namespace = ``namespace_id`` of
``{"integration": "sglang-hicache", "model", "tp_size", "pp_size", "pp_rank", "attn_cp_size",
"attn_cp_rank", "is_mla", "interface_v1", "namespace"}``, rank = the TP rank (0 for an MLA model,
whose KV is the same on every rank and is saved by rank 0 only). A page of pool ``P`` whose
SGLang hash is ``H`` is the object ``external_key("P/H")``; its bytes are the page's host-pool
buffers (``get_page_buffer_meta``) concatenated in order. SGLang's ``H`` chains the hashes of
every earlier page, so an object names its whole prefix.

Hit policies (``batch_exists_v2``): a state pool (``TRAILING_PAGES``, Mamba/SWA/DeepSeek-V4 state)
is usable only together with its whole PAGE prefix, in every ``ALL_PAGES`` pool: libtier's SLOT
rule (docs/engine.md). The usable prefix is therefore the longest ``p`` such that pages
``[0, p)`` are present in the KV pool and in every ``ALL_PAGES`` pool, and every ``TRAILING_PAGES``
pool holds its last ``len(transfer.keys)`` pages before ``p``. (SGLang's file backend takes the
minimum of per-pool answers instead, which can offer a state of a longer prefix than the pages
present.) ``batch_set_v2`` stores the ``ALL_PAGES`` pools before any state, and stores no state
of a call in which a page failed.

Threads: SGLang calls a backend from its prefetch, backup and scheduler threads at once. The
Store serializes its calls on one lock and releases the GIL during every transfer; this class
keeps no other mutable state after registration, so every method may be called from any thread.

Without SGLang installed (tests, docs), the interface types are defined here with SGLang's names
and fields: ``HiCacheStorage``, ``HiCacheStorageConfig``, ``HiCacheStorageExtraInfo``,
``PoolHitPolicy``, ``PoolTransfer``, ``PoolTransferResult``. With SGLang installed, SGLang's own
classes are used, so the factory's ``issubclass`` check passes.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Optional, Sequence

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
    import dataclasses
    import enum

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
        """Stand-in: the usable KV prefix in pages and each pool's page count."""

        kv_hit_pages: int
        extra_pool_hit_pages: dict


KV_POOL = "kv"
"""The pool name of the v1 calls (SGLang's ``PoolName.KV``)."""


def pool_name(name: Any) -> str:
    """The string of a pool name (an SGLang ``PoolName`` enum member or a str)."""
    return str(getattr(name, "value", name))


def _is_trailing(transfer: Any) -> bool:
    return pool_name(transfer.hit_policy) == PoolHitPolicy.TRAILING_PAGES.value


class LibtierHiCacheStorage(HiCacheStorage):
    """SGLang's ``HiCacheStorage`` over a libtier ``Store`` (module docstring: the mapping)."""

    def __init__(self, storage_config: Any, kwargs: Optional[dict] = None) -> None:
        """Opens the Store of ``extra_config["profile"]`` for this rank.

        Raises ValueError without a profile, libtier.Error when the profile cannot be opened."""
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
        self.identity = {
            "integration": "sglang-hicache",
            "model": storage_config.model_name or "",
            "tp_size": 1 if self.is_mla else int(storage_config.tp_size),
            "pp_size": int(storage_config.pp_size),
            "pp_rank": int(storage_config.pp_rank),
            "attn_cp_size": int(getattr(storage_config, "attn_cp_size", 1)),
            "attn_cp_rank": int(getattr(storage_config, "attn_cp_rank", 0)),
            "is_mla": self.is_mla,
            "interface_v1": self.interface_v1,
            "namespace": extra.get("namespace"),
        }
        rank = 0 if self.is_mla else int(storage_config.tp_rank)
        self.store = libtier.Store.open(profile, namespace=self.identity, rank=rank)
        self.registered_pools: dict = {}
        self.mem_pool_host: Any = None

    # --- registration (SGLang's controller, once at start) -------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """The host KV pool of the v1 calls (also the v2 pool named "kv" unless registered)."""
        self.mem_pool_host = mem_pool_host
        self.registered_pools.setdefault(KV_POOL, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """The host pool of v2 transfers named `host_pool_name`."""
        self.registered_pools[pool_name(host_pool_name)] = host_pool

    # --- keys and regions ----------------------------------------------------------------------

    @staticmethod
    def object_key(pool: str, key: str) -> str:
        """The libtier key of page `key` (an SGLang page hash) of pool `pool`."""
        return libtier.external_key(f"{pool}/{key}")

    def _keys(self, pool: str, keys: Sequence[str]) -> list:
        return [self.object_key(pool, k) for k in keys]

    @staticmethod
    def _page_regions(host_pool: Any, host_indices: Any, pages: int) -> list:
        """Per page, the host pool's buffers of that page (get_page_buffer_meta), as Regions.

        Raises ValueError when the indices do not cover exactly `pages` pages of the pool."""
        page_size = int(getattr(host_pool, "page_size", 1) or 1)
        if host_indices is None or len(host_indices) != pages * page_size:
            got = 0 if host_indices is None else len(host_indices)
            raise ValueError(f"{got} host indices for {pages} pages of {page_size} slots")
        if pages == 0:
            return []
        ptrs, sizes = host_pool.get_page_buffer_meta(host_indices)
        if len(ptrs) != len(sizes) or len(ptrs) % pages != 0:
            raise ValueError(f"get_page_buffer_meta gave {len(ptrs)} buffers for {pages} pages")
        per = len(ptrs) // pages
        return [
            [libtier.Region(int(p), int(n)) for p, n in zip(ptrs[i * per : (i + 1) * per],
                                                          sizes[i * per : (i + 1) * per])]
            for i in range(pages)
        ]

    def _transfer(self, op: str, pool: str, host_pool: Any, keys: Sequence[str],
                  host_indices: Any) -> list:
        """Saves or loads `keys` of `pool` from / into the host pool; one bool per key.

        Never raises: SGLang's storage threads are not restarted after an exception, so every
        failure is logged and reported as False."""
        if not keys:
            return []
        try:
            regions = self._page_regions(host_pool, host_indices, len(keys))
            call = self.store.save if op == "save" else self.store.load
            codes = call(self._keys(pool, keys), regions)
        except (libtier.Error, ValueError, AttributeError) as e:
            log.error("libtier HiCache %s of %d pages of pool %s failed: %s", op, len(keys), pool,
                      e)
            return [False] * len(keys)
        return [c == libtier.Code.OK for c in codes]

    # --- v1: the KV pool, zero-copy ------------------------------------------------------------

    def batch_get_v1(self, keys: list, host_indices: Any,
                     extra_info: Optional[Any] = None) -> list:
        """Loads each page straight into its host-pool slots; True per page loaded.

        `host_indices` holds len(keys) * page_size slots: page i at [i, i + 1) * page_size."""
        return self._transfer("load", KV_POOL, self.mem_pool_host, keys, host_indices)

    def batch_set_v1(self, keys: list, host_indices: Any,
                     extra_info: Optional[Any] = None) -> list:
        """Stores each page from its host-pool slots; True per page stored (or stored already)."""
        return self._transfer("save", KV_POOL, self.mem_pool_host, keys, host_indices)

    def batch_exists(self, keys: list, extra_info: Optional[Any] = None) -> int:
        """The number of leading pages of `keys` stored (libtier's longest-prefix lookup)."""
        if not keys:
            return 0
        try:
            return self.store.lookup_prefix(self._keys(KV_POOL, keys))
        except libtier.Error as e:
            log.error("libtier HiCache lookup failed: %s", e)
            return 0

    def exists(self, key: str) -> bool:
        try:
            return self.store.exists(self._keys(KV_POOL, [key]))[0]
        except libtier.Error as e:
            log.error("libtier HiCache exists failed: %s", e)
            return False

    # --- the generic path (extra_config without "interface_v1"): flat page copies --------------

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Any:
        """Loads page `key` into `target_location` (a flat page buffer); it, or None on a miss."""
        if target_location is None:
            return None
        try:
            code = self.store.load(self._keys(KV_POOL, [key]), [target_location])[0]
        except libtier.Error as e:
            log.error("libtier HiCache get failed: %s", e)
            return None
        return target_location if code == libtier.Code.OK else None

    def batch_get(self, keys: list, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> list:
        """Loads each page into its buffer: the buffer, or None for a page not loaded."""
        if not keys:
            return []
        if target_locations is None:
            return [None] * len(keys)
        try:
            codes = self.store.load(self._keys(KV_POOL, keys), list(target_locations))
        except libtier.Error as e:
            log.error("libtier HiCache batch_get failed: %s", e)
            return [None] * len(keys)
        return [t if c == libtier.Code.OK else None for t, c in zip(target_locations, codes)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        """Stores the flat page `value` under `key`."""
        return value is not None and self.batch_set([key], [value])

    def batch_set(self, keys: list, values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Stores each flat page; True when every page is stored."""
        if not keys:
            return True
        if values is None:
            return False
        try:
            codes = self.store.save(self._keys(KV_POOL, keys), list(values))
        except libtier.Error as e:
            log.error("libtier HiCache batch_set failed: %s", e)
            return False
        return all(c == libtier.Code.OK for c in codes)

    # --- v2: several pools, hit policies -------------------------------------------------------

    def batch_exists_v2(self, keys: list, pool_transfers: Optional[list] = None,
                        extra_info: Optional[Any] = None) -> Any:
        """The usable prefix of `keys` over the KV pool and every pool of `pool_transfers`.

        ALL_PAGES pools shorten the page prefix to their own leading run; then the prefix is
        cut back to the longest p at which every TRAILING_PAGES pool holds the
        len(transfer.keys) (at least 1) pages before p. kv_hit_pages = p; extra_pool_hit_pages
        maps "kv" and each ALL_PAGES pool to its leading run and each TRAILING_PAGES pool to p,
        for the pools with a non-zero count."""
        hits: dict = {}
        try:
            limit = self.store.lookup_prefix(self._keys(KV_POOL, keys)) if keys else 0
            if limit:
                hits[KV_POOL] = limit
            transfers = list(pool_transfers or [])
            for t in transfers:
                if limit == 0:
                    break
                if _is_trailing(t):
                    continue
                name = pool_name(t.name)
                run = self.store.lookup_prefix(self._keys(name, keys[:limit]))
                if run:
                    hits[name] = run
                limit = min(limit, run)
            trailing = [t for t in transfers if _is_trailing(t)]
            if trailing and limit:
                present = [self.store.exists(self._keys(pool_name(t.name), keys[:limit]))
                           for t in trailing]
                widths = [max(1, len(t.keys or [])) for t in trailing]
                usable = 0
                for p in range(limit, 0, -1):
                    if all(all(have[max(0, p - w):p]) for have, w in zip(present, widths)):
                        usable = p
                        break
                limit = usable
                for t in trailing:
                    if usable:
                        hits[pool_name(t.name)] = usable
        except libtier.Error as e:
            log.error("libtier HiCache batch_exists_v2 failed: %s", e)
            return PoolTransferResult(0, {})
        return PoolTransferResult(limit, hits)

    def _batch_v2(self, op: str, transfers: list) -> dict:
        results: dict = {}
        page_failed = False
        # Pages first: a state is stored only after every page of its call (the SLOT rule).
        ordered = sorted(transfers or [], key=_is_trailing) if op == "save" else transfers or []
        for t in ordered:
            name = pool_name(t.name)
            keys = list(t.keys or [])
            host_pool = self.registered_pools.get(name)
            if host_pool is None:
                log.error("libtier HiCache: no host pool registered as %r", name)
                ok = [False] * len(keys)
            elif op == "save" and _is_trailing(t) and page_failed:
                ok = [False] * len(keys)
            else:
                ok = self._transfer(op, name, host_pool, keys, t.host_indices)
            if not _is_trailing(t) and not all(ok):
                page_failed = True
            results[name] = ok
        return results

    def batch_get_v2(self, transfers: list, extra_info: Optional[Any] = None) -> dict:
        """Loads each transfer's pages into its registered host pool: pool name -> bool per key."""
        return self._batch_v2("load", transfers)

    def batch_set_v2(self, transfers: list, extra_info: Optional[Any] = None) -> dict:
        """Stores each transfer's pages from its registered host pool: pool name -> bool per key.

        ALL_PAGES pools go first; when one of their pages fails, no TRAILING_PAGES state of the
        call is stored (False for each)."""
        return self._batch_v2("save", transfers)

    # --- operations ----------------------------------------------------------------------------

    def metrics(self) -> dict:
        """libtier's counters for this rank's Store (docs/metrics.md)."""
        return self.store.metrics()

    def close(self) -> None:
        """Waits for background work and closes the Store (SGLang calls it at shutdown)."""
        self.store.close()
