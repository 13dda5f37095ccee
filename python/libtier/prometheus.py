"""libtier's metrics in a ``prometheus_client`` registry (docs/metrics.md).

An engine that serves its own ``/metrics`` (vLLM, SGLang) adds libtier's families to it::

    import libtier, libtier.prometheus
    store = libtier.Store.open(profile, namespace=identity, rank=rank)
    libtier.prometheus.register(store)             # prometheus_client.REGISTRY
    libtier.prometheus.register(store, registry=r, labels={"rank": "0"})

Each scrape reads ``store.metrics_prometheus()`` (counters only: it does not wait for a transfer)
and parses it with ``prometheus_client``'s own text parser. Several stores may share a registry:
one collector per registry serves them all, each store's samples carrying the constant
``labels`` it was registered with (they must differ between stores, else the samples would
collide; register raises ValueError). A store is held weakly, and a closed or collected store
drops out. Debian's ``python3-prometheus-client`` provides the module.
"""

from __future__ import annotations

import threading
import weakref
from typing import Iterator, Mapping, Optional

from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

__all__ = ["LibtierCollector", "register"]


class LibtierCollector:
    """A prometheus_client collector of the metrics of one or more libtier Stores."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: list[tuple[weakref.ref, dict[str, str]]] = []

    def add(self, store, labels: Optional[Mapping[str, str]] = None) -> None:
        """Adds `store`, its samples labelled with `labels`. Raises ValueError when another
        store has the same labels."""
        extra = {str(k): str(v) for k, v in (labels or {}).items()}
        with self._lock:
            self._stores = [(r, l) for r, l in self._stores if _alive(r)]
            if any(l == extra for _, l in self._stores):
                raise ValueError(
                    f"a store with labels {extra} is registered already: give each store "
                    "distinct labels, e.g. {'rank': '0'}"
                )
            self._stores.append((weakref.ref(store), extra))

    def remove(self, store) -> None:
        """Removes `store` (its samples no longer appear)."""
        with self._lock:
            self._stores = [(r, l) for r, l in self._stores if r() is not store and _alive(r)]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            stores = [(r(), l) for r, l in self._stores]
        merged: dict[str, Metric] = {}
        for store, extra in stores:
            if store is None or store.closed:
                continue
            for family in text_string_to_metric_families(store.metrics_prometheus()):
                into = merged.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for sample in family.samples:
                    into.add_sample(
                        sample.name, {**sample.labels, **extra}, sample.value, sample.timestamp
                    )
        yield from merged.values()

    def describe(self) -> list:
        # Nothing described: the registry then checks no names at register time (the families
        # are known only from a store's first scrape).
        return []


def _alive(ref: weakref.ref) -> bool:
    store = ref()
    return store is not None and not store.closed


_collectors: "weakref.WeakKeyDictionary[CollectorRegistry, LibtierCollector]" = (
    weakref.WeakKeyDictionary()
)
_collectors_lock = threading.Lock()


def register(
    store, registry: Optional[CollectorRegistry] = None, labels: Optional[Mapping[str, str]] = None
) -> LibtierCollector:
    """Adds `store`'s metrics to `registry` (default: prometheus_client.REGISTRY), its samples
    labelled with `labels`; returns the registry's libtier collector. Raises ValueError when a
    store with the same labels is registered there already."""
    registry = REGISTRY if registry is None else registry
    with _collectors_lock:
        collector = _collectors.get(registry)
        if collector is None:
            collector = LibtierCollector()
            registry.register(collector)
            _collectors[registry] = collector
    collector.add(store, labels)
    return collector
