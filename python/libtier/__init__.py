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
- the log (docs/logging.md): libtier's messages reach the ``logging`` logger ``"libtier"``;
  :func:`set_log_level`, :func:`flush_logs`.
- sizing (docs/sizing.md): :func:`miss_ratio_curve`, the LRU hit ratio of a trace at every
  capacity, as ``tierctl size``.
- ``libtier.profiles``: the profiles that ship with the package (``profiles.path("cpu")``);
  ``libtier.prometheus``: the metrics in a ``prometheus_client`` registry (imported on demand).

Buffers are used in place (zero-copy): numpy arrays, torch tensors (CPU, pinned or CUDA), any
object exposing ``__array_interface__`` or ``__cuda_array_interface__``, or :class:`Region`.
Every transfer releases the GIL. See ``__init__.pyi`` for the full typed surface and each call's
thread-safety.
"""

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
    MissRatioCurve,
    ObjectStat,
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
    miss_ratio_curve,
    namespace_id,
    region_of,
    version,
)
from . import profiles  # noqa: E402
from ._log import flush_logs, log_level, set_log_level  # noqa: E402

__version__ = version()

__all__ = [
    "ABI_VERSION", "AlreadyExists", "BadState", "Boundary", "Cancelled", "ChecksumMismatch",
    "Code", "Completion", "DeviceError", "Dsv4Layout", "Error", "InvalidArgument", "IoError",
    "LoadDecision", "LoadOp", "MatchResult", "MemoryKind", "MissRatioCurve", "NoSpace",
    "NotFound", "NotSupported", "ObjectStat", "OpReport", "Region", "Registration", "Rejected",
    "Retry", "SaveOp", "Scheduler", "StepEvents", "StepPlan", "Store", "TimedOut", "Worker",
    "__version__", "abi_version", "chunk_keys", "decode_reports", "encode_reports",
    "external_key", "flush_logs", "log_level", "miss_ratio_curve", "namespace_id", "profiles",
    "region_of", "set_log_level", "version",
]
