"""libtier: a tiered KV cache for LLM inference engines, from Python.

``import libtier`` gives the C API (``tier/tier.h``, library ``libtier_c``) as Python objects:

- :class:`Store`: a profile's tiers as one cache. ``Store.open(profile)`` (a path, JSON text or a
  dict), ``save``/``load``/``lookup_prefix``/``exists``/``remove`` on batches of keys, the
  asynchronous ``save_async``/``load_async`` with ``poll``/``wait``, ``register`` for memory,
  ``metrics()``/``metrics_prometheus()``; a context manager.
- keys (docs/keys.md): :func:`namespace_id`, :func:`chunk_keys`, :func:`external_key`.
- the offload engine (docs/engine.md): :class:`Scheduler`, :class:`Worker` and the DSV4 layout
  :class:`Dsv4Layout`, driven once per engine step; :meth:`StepPlan.encode`,
  :meth:`StepPlan.decode`, :func:`encode_reports` and :func:`decode_reports` carry plans and
  reports between a scheduler process and rank processes as bytes.
- errors: :class:`Error` and one subclass per status code (:class:`NotFound`, ...), carrying
  ``.code``, ``.code_name`` and the library's ``.message``.

Buffers are used in place (zero-copy): numpy arrays, torch tensors (CPU, pinned or CUDA), any
object exposing ``__array_interface__`` or ``__cuda_array_interface__``, or :class:`Region`.
Every transfer releases the GIL. See ``__init__.pyi`` for the full typed surface and each call's
thread-safety.
"""

import ctypes as _ctypes
import glob as _glob
import os as _os


def _preload_bundled_libraries():
    """Loads the libraries a wheel bundles, before the extension needs them.

    meson-python (0.12) puts libtier's shared libraries in ``.libtier.mesonpy.libs`` beside the
    package under their file names (``libtier.so.0.1.0``) without the soname links
    (``libtier.so.0``) that the extension and the plugins ask for; a library loaded by path is
    found by its soname afterwards. Dependency order. A build tree or a ``meson install`` has no
    such directory and finds the libraries through RUNPATH."""
    libs = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))),
                         ".libtier.mesonpy.libs")
    if not _os.path.isdir(libs):
        return
    for name in ("libtier", "libtier_gpu", "libtier_dsv4", "libtier_engine",
                 "libtier_dsv4_layout", "libtier_c"):
        for path in sorted(_glob.glob(_os.path.join(libs, name + ".so.*"))):
            _ctypes.CDLL(path)


_preload_bundled_libraries()

from ._errors import (  # noqa: E402
    AlreadyExists,
    BadState,
    Cancelled,
    ChecksumMismatch,
    Code,
    DeviceError,
    Error,
    InvalidArgument,
    IoError,
    NoSpace,
    NotFound,
    NotSupported,
    Rejected,
    Retry,
    TimedOut,
)
from ._libtier import (  # noqa: E402
    ABI_VERSION,
    Boundary,
    Completion,
    Dsv4Layout,
    LoadDecision,
    LoadOp,
    MatchResult,
    MemoryKind,
    OpReport,
    Region,
    Registration,
    SaveOp,
    Scheduler,
    StepEvents,
    StepPlan,
    Store,
    Worker,
    abi_version,
    chunk_keys,
    decode_reports,
    encode_reports,
    external_key,
    namespace_id,
    region_of,
    version,
)

__all__ = [
    "ABI_VERSION", "AlreadyExists", "BadState", "Boundary", "Cancelled", "ChecksumMismatch",
    "Code", "Completion", "DeviceError", "Dsv4Layout", "Error", "InvalidArgument", "IoError",
    "LoadDecision", "LoadOp", "MatchResult", "MemoryKind", "NoSpace", "NotFound", "NotSupported",
    "OpReport", "Region", "Registration", "Rejected", "Retry", "SaveOp", "Scheduler",
    "StepEvents", "StepPlan", "Store", "TimedOut", "Worker", "abi_version", "chunk_keys",
    "decode_reports", "encode_reports", "external_key", "namespace_id", "region_of", "version",
]
