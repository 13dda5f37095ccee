"""Adapters that plug libtier into inference engines' own storage interfaces.

- :mod:`libtier.integrations.sglang`: an SGLang HiCache storage backend (``HiCacheStorage``).

Each adapter imports its engine only when the engine is installed (docs/integration.md).
"""
