"""Typed signatures of the libtier package (the public surface of libtier._libtier and libtier._errors).

Conventions used below:

- ``KeyLike``: a 128-bit key as 32 lower-case hex digits (``Key128::hex()``, hi then lo, what
  :func:`chunk_keys` returns) or as its 16 canonical bytes (lo then hi, each little-endian).
- ``BufferLike``: memory the library reads or writes in place, zero-copy: a numpy array (or any
  object with ``__array_interface__``), a torch tensor (``.data_ptr()``, ``.is_cuda``,
  ``.is_pinned()``), any object with ``__cuda_array_interface__`` (device memory on the current
  CUDA device unless it carries ``.device.index``), a :class:`Region`, or a ``(ptr, nbytes)``
  tuple of host memory. Arrays must be C-contiguous; the bytes of the whole array are used.
  Nothing is ever copied through Python ``bytes``.
- ``Regions``: one ``BufferLike`` or a sequence of them (a scatter/gather list: the stored object
  is their bytes concatenated in order).

Threads: every transfer releases the GIL. The Store's calls may be made from several threads at
once (they serialize on a lock per Store). Scheduler and Worker follow the engine's contract:
one thread per Scheduler; a Worker's calls may come from its rank thread while the scheduler
thread uses it as the view (they share its Store's lock).
"""

import enum
import os
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from ._errors import (
    AlreadyExists as AlreadyExists,
    BadState as BadState,
    Cancelled as Cancelled,
    ChecksumMismatch as ChecksumMismatch,
    Code as Code,
    DeviceError as DeviceError,
    Error as Error,
    InvalidArgument as InvalidArgument,
    IoError as IoError,
    NoSpace as NoSpace,
    NotFound as NotFound,
    NotSupported as NotSupported,
    Rejected as Rejected,
    Retry as Retry,
    TimedOut as TimedOut,
)

KeyLike = Union[str, bytes]
BufferLike = Any
Regions = Union[BufferLike, Sequence[BufferLike]]
TokensLike = Union[Sequence[int], Any]  # a sequence of ints or a 1-D integer numpy array
ProfileLike = Union[str, "os.PathLike[str]", Mapping[str, Any]]

ABI_VERSION: int
"""TIER_C_ABI_VERSION the extension was compiled against."""

def abi_version() -> int:
    """The C ABI version of the loaded libtier_c (tier_abi_version())."""

def version() -> str:
    """libtier's version string."""

class MemoryKind(enum.IntEnum):
    HOST = 0  # pageable host memory
    PINNED = 1  # page-locked host memory
    DEVICE = 2  # GPU memory of Region.device
    SHM = 3  # host memory inside a shared-memory segment

class Region:
    """A non-owning view {ptr, nbytes, kind, device}. The caller keeps the memory alive."""

    def __init__(
        self, ptr: int, nbytes: int, kind: MemoryKind = MemoryKind.HOST, device: int = -1
    ) -> None: ...
    @property
    def ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def kind(self) -> MemoryKind: ...
    @property
    def device(self) -> int: ...

def region_of(buffer: BufferLike) -> Region:
    """How the library sees `buffer` (pointer, size, kind, device), without copying it."""

# Keys (docs/keys.md).
def namespace_id(identity: Union[Mapping[str, Any], str]) -> str:
    """Namespace id of a model identity (a dict, or its JSON text): 32 hex digits."""

def chunk_keys(
    namespace: Union[KeyLike, Mapping[str, Any]],
    tokens: TokensLike,
    chunk: int,
    include_partial: bool = False,
) -> list[str]:
    """Chained chunk keys of `tokens` (u32 values) in `chunk`-token chunks (tier::chunk_keys).

    `namespace` is a namespace id or a model identity dict (hashed with namespace_id)."""

def external_key(name: Union[str, bytes]) -> str:
    """A key for an engine's own object name (e.g. SGLang's page hash strings), docs/keys.md."""

class Completion:
    """The outcome of one asynchronous batch (Store.save_async / Store.load_async)."""

    @property
    def ticket(self) -> int: ...
    @property
    def op(self) -> str:
        """"save" or "load"."""
    @property
    def codes(self) -> list[Code]:
        """One code per key: OK, or why that key was not saved / loaded (NOT_FOUND for a miss)."""
    @property
    def tiers(self) -> list[int]:
        """Loads: the tier index that served each key (-1 when it missed). Saves: empty."""
    @property
    def ok(self) -> bool:
        """Every key succeeded."""

class Registration:
    """Memory registered with a Store (Store.register); released by release() or `with`."""

    @property
    def region(self) -> Region: ...
    def release(self) -> None: ...
    def __enter__(self) -> "Registration": ...
    def __exit__(self, *exc: object) -> None: ...

class Store:
    """A profile's tiers used as one cache (a TierStack behind the C API's tier_store).

    Objects are stored under (namespace, key, rank): the namespace and rank are the Store's,
    set at open(). Puts are put-if-absent: saving a key that is stored already is OK.
    Thread safety: every method may be called from several threads; calls serialize on the
    Store's lock, and transfers release the GIL while they run."""

    @staticmethod
    def open(
        profile: ProfileLike,
        *,
        namespace: Union[KeyLike, Mapping[str, Any], None] = None,
        rank: int = 0,
    ) -> "Store":
        """Opens the tiers of `profile`: a path to a JSON profile, JSON text, or a dict.

        `namespace`: a namespace id or a model identity dict (default: the all-zero namespace).
        Raises InvalidArgument (bad profile, with every problem and its JSON path), IoError..."""
    def close(self) -> None:
        """Waits for background work (write-through, demotion) and closes the tiers.
        Later calls raise BadState. Idempotent."""
    def __enter__(self) -> "Store": ...
    def __exit__(self, *exc: object) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def namespace(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def tier_names(self) -> list[str]: ...

    def lookup_prefix(self, keys: Sequence[KeyLike]) -> int:
        """Length of the leading run of `keys` stored in some readable tier."""
    def exists(self, keys: Sequence[KeyLike]) -> list[bool]:
        """Whether each key is stored in some readable tier."""
    def save(self, keys: Sequence[KeyLike], buffers: Sequence[Regions]) -> list[Code]:
        """Stores each key's regions (blocking; the GIL is released). One code per key: OK
        (stored, or stored already) or the first writable tier's error. Raises only for errors
        of the whole call (InvalidArgument: length mismatch, an unusable buffer; BadState)."""
    def load(self, keys: Sequence[KeyLike], buffers: Sequence[Regions]) -> list[Code]:
        """Loads each key into its regions (blocking; the GIL is released). One code per key:
        OK, NOT_FOUND (a miss) or the decode error; the regions' sizes must equal the stored
        object's (else INVALID_ARGUMENT for that key, nothing written)."""
    def load_with_tiers(
        self, keys: Sequence[KeyLike], buffers: Sequence[Regions]
    ) -> tuple[list[Code], list[int]]:
        """As load(), plus the index of the tier that served each key (-1 on a miss)."""
    def save_async(self, keys: Sequence[KeyLike], buffers: Sequence[Regions]) -> int:
        """Queues a save and returns its ticket at once. The buffers are kept referenced (and
        must stay unchanged) until its Completion is returned by poll() or wait()."""
    def load_async(self, keys: Sequence[KeyLike], buffers: Sequence[Regions]) -> int:
        """Queues a load and returns its ticket at once (buffers as for save_async)."""
    def poll(self) -> list[Completion]:
        """Completions finished so far, without blocking. No library thread ever calls back."""
    def wait(self, ticket: Optional[int] = None, timeout: Optional[float] = None) -> Completion:
        """Blocks (GIL released) until `ticket` (or any ticket when None) completes and returns
        its Completion. Raises TimedOut after `timeout` seconds, NotFound for an unknown ticket."""
    def remove(self, keys: Sequence[KeyLike]) -> list[Code]:
        """Removes each key from every tier."""
    def progress(self) -> None:
        """Advances background work without blocking."""
    def flush(self, timeout: Optional[float] = None) -> None:
        """Waits until background work is done. Raises TimedOut."""
    def register(
        self, buffer: BufferLike, kind: Optional[MemoryKind] = None, device: Optional[int] = None
    ) -> Registration:
        """Registers memory with the Store. PINNED page-locks host memory through the GPU runtime
        (NotSupported in a build without it); regions inside a registered pinned range are
        treated as pinned. HOST and DEVICE registrations record the range."""
    def metrics(self) -> dict[str, Any]:
        """Counters as a dict (the tiers' and the stack's, docs/metrics.md)."""
    def metrics_prometheus(self) -> str:
        """Counters as Prometheus text format 0.0.4."""

# The offload engine (docs/engine.md): DSV4 PAGE+SLOT semantics, one call per engine step.

class Boundary:
    tokens: int
    key: str

class MatchResult:
    tokens: int
    park: bool
    page_hit: int
    slot: Optional[Boundary]

class LoadDecision:
    action: str  # "none" | "load" | "recompute" | "handoff"
    reason: str
    load_start: int
    load_end: int
    handoff_tokens: int

class LoadOp:
    request: int
    generation: int
    page_start: int  # tokens the engine already holds (its own prefix cache)
    page_end: int  # tokens the request holds once the load succeeds
    hbm_tokens: int  # deprecated name of page_start (DeprecationWarning; removed after 0.2)
    lmc_tokens: int  # deprecated name of page_end (DeprecationWarning; removed after 0.2)
    chunk_keys: list[str]
    block_ids: list[int]
    slot: Optional[Boundary]
    slot_group: int

class SaveOp:
    request: int
    generation: int
    page_start: int
    page_end: int
    chunk_keys: list[str]
    block_ids: list[int]
    slot: Optional[Boundary]
    slot_group: int

class StepPlan:
    """One step's plan: submit the same plan to every rank's Worker."""

    @property
    def step(self) -> int: ...
    @property
    def has_work(self) -> bool: ...
    @property
    def loads(self) -> list[LoadOp]: ...
    @property
    def saves(self) -> list[SaveOp]: ...

class OpReport:
    """One rank's terminal result for one operation on one channel."""

    channel: str  # "load" | "page_save" | "slot_save"
    request: int
    generation: int
    rank: int
    ok: bool
    reason: str

class StepEvents:
    loaded: list[int]
    load_failed: list[int]
    freeable: list[int]

class Dsv4Layout:
    """The DSV4 KV layout of one rank (layouts/dsv4): owns the rank's KV memory."""

    @staticmethod
    def create(
        geometry: Union[str, Mapping[str, Any]],
        page_namespace: KeyLike,
        tp_size: int = 1,
        tp_rank: int = 0,
        memory: str = "host",
        device: int = 0,
    ) -> "Dsv4Layout":
        """`geometry`: a preset name ("v4-pro-fp8", ...) or a model description dict
        ({"preset": ..., "num_blocks": ..., "num_slots": ..., ...}, docs/dsv4.md)."""
    @property
    def block_tokens(self) -> int: ...
    @property
    def page_bytes_per_block(self) -> int: ...
    @property
    def slot_bytes(self) -> int: ...
    def page_regions(self, block_ids: Sequence[int]) -> list[Region]:
        """The KV memory of a PAGE chunk made of `block_ids` (what the engine's forward writes)."""
    def slot_regions(self, group: int) -> list[Region]:
        """The KV memory of state group `group` (one request's SLOT)."""
    def close(self) -> None: ...

class Worker:
    """One TP rank's worker: moves PAGE chunks and SLOT sidecars between its layout and Store.
    Its calls may be made from its rank thread while the scheduler thread uses it as the view."""

    @staticmethod
    def create(
        config: Mapping[str, Any],
        rank: int,
        store: Store,
        layout: Dsv4Layout,
        page_namespace: KeyLike,
    ) -> "Worker":
        """`config`: the EngineConfig JSON (docs/engine.md); the Store and layout must stay
        open while the worker exists (it keeps them referenced)."""
    @property
    def rank(self) -> int: ...
    def submit(self, plan: StepPlan, stream: int = 0, event: int = 0) -> None:
        """Queues the step's operations (GIL released). `stream` and `event`: the caller's GPU
        work the plan's transfers follow, as runtime handles (torch: `torch.cuda.current_stream()
        .cuda_stream`, an event's `cuda_event`); with `stream` a SLOT snapshot is one kernel on
        it and the call waits for no transfer. Without them the caller's work is taken as
        synchronized and a device layout's SLOT snapshot is copied before the call returns
        (tier_worker_submit_after). Never waits for a tier."""
    def progress(self, max_saves: Optional[int] = None) -> int:
        """Runs queued loads, then up to `max_saves` queued saves (GIL released); returns the
        number of operations finished."""
    def take_reports(self) -> list[OpReport]: ...
    @property
    def queued_saves(self) -> int: ...
    @property
    def queued_loads(self) -> int: ...
    def close(self) -> None: ...

class Scheduler:
    """The scheduler half of the offload engine; one thread at a time."""

    @staticmethod
    def create(config: Mapping[str, Any], view: Worker, page_namespace: KeyLike) -> "Scheduler":
        """`view`: rank 0's Worker (lookups and commit records go through it)."""
    def add_request(self, request_id: int, prompt: TokensLike) -> int:
        """Registers a request; returns its handle (never reused)."""
    def lookup(self, handle: int) -> MatchResult: ...
    def after_alloc(
        self, handle: int, local_tokens: int, blocks: Sequence[int], group: int = -1
    ) -> LoadDecision:
        """`local_tokens`: the engine's own prefix-cache hit after allocation (tokens already in
        its KV memory). The keyword's old name `hbm_tokens=` still works, with a
        DeprecationWarning, until 0.2."""
    def set_blocks(self, handle: int, blocks: Sequence[int]) -> None: ...
    def cut_prefill_chunk(self, handle: int, start: int, length: int) -> int: ...
    def on_computed(self, handle: int, computed_tokens: int) -> None: ...
    def build_step(self) -> StepPlan: ...
    def process(self, reports: Iterable[OpReport]) -> StepEvents: ...
    def should_defer_free(self, handle: int) -> bool: ...
    def finish(self, handle: int) -> bool:
        """True: the request's blocks may be freed now; else once process() lists it freeable."""
    @property
    def loads_pending(self) -> int: ...
    @property
    def saves_pending(self) -> int: ...
    def metrics(self, workers: Sequence[Worker] = ...) -> dict[str, Any]: ...
    def metrics_prometheus(self, workers: Sequence[Worker] = ...) -> str: ...
    def close(self) -> None: ...
