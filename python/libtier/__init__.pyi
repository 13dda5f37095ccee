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

Threads: every transfer releases the GIL. Each class and method below says which of these holds:

- *any thread*: may be called from several threads at once, also on the same object;
- *serialized*: may be called from any thread, but calls on one object run one after the other.

Every ``close()`` (Store, Registration.release, Dsv4Layout, Worker, Scheduler) is *any thread*
and idempotent: calls already inside finish first, later calls raise BadState, and objects made
over it keep what they use (a Worker keeps its Store's tiers and its layout's memory).

The Store's transfers run in parallel (no lock around a transfer: N threads on one Store move
bytes at about N threads' copy speed on the cpu tier). Host arrays on the cpu tier are moved
once, straight between the tier and the array (metrics()["stack"]["staging_copy_bytes"] stays
0). Scheduler and Worker follow the engine's contract: a Scheduler's calls are serialized; a
Worker's calls may come from its rank thread while the scheduler thread uses it as the view.
Module-level functions (keys, versions) and Completion, Region, StepPlan, OpReport, StepEvents
objects (read only) are *any thread*.
The log calls and miss_ratio_curve are *any thread* too.

The extension's docstrings are made from this file at build time (gen_docs.py), so help() shows
the same text; python/tests/test_docs.py checks that they agree.

Lifetimes: close() (and ``with``, and garbage collection) may run on any thread, in any order,
also while other threads are inside calls on the same object: those calls finish first, calls
that begin later raise BadState, and nothing is freed under a call. A Worker keeps its Store and
Dsv4Layout, a Scheduler its Worker: closing one of those first ends its own use (its methods
raise BadState), while the Worker or Scheduler goes on working with it; its memory and tiers are
freed with the last object that uses them. Regions handed out by Dsv4Layout.page_regions and
slot_regions stay valid as long.

Errors: every error the library reports is a libtier.Error, also for hostile arguments (sizes
that wrap or exceed 2^48 bytes, forged array interfaces, negative numbers, identities nested
deeper than 64 levels: InvalidArgument). Text from the library that is not UTF-8 (a path or name
from the environment) arrives with U+FFFD in place of the bad bytes.
"""

import enum
import os
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from . import profiles as profiles

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

__version__: str
"""The package's version, which is libtier's (version())."""

def abi_version() -> int:
    """The C ABI version of the loaded libtier_c (tier_abi_version())."""

def version() -> str:
    """libtier's version string, e.g. "0.1.0" (tier_version(); CHANGELOG.md)."""

# The log (docs/logging.md): libtier's messages go to the logger "libtier" of Python's logging.

def set_log_level(level: str) -> None:
    """Sets libtier's log level for the process: "error", "warn", "info", "debug" or "off".

    It always applies, and profiles no longer change it (docs/logging.md)."""

def log_level() -> str:
    """libtier's log level now: "error", "warn", "info", "debug" or "off"."""

def flush_logs(timeout: float = 5.0) -> bool:
    """Waits until every message libtier logged before this call was handed to ``logging``.
    Returns False when `timeout` seconds passed first."""

class MemoryKind(enum.IntEnum):
    """Where a Region's memory is."""

    HOST = 0  # pageable host memory
    PINNED = 1  # page-locked host memory
    DEVICE = 2  # GPU memory of Region.device
    SHM = 3  # host memory inside a shared-memory segment

class Region:
    """A non-owning view {ptr, nbytes, kind, device}. The caller keeps the memory alive."""

    def __init__(
        self, ptr: int, nbytes: int, kind: MemoryKind = MemoryKind.HOST, device: int = -1
    ) -> None:
        """A view of `nbytes` at address `ptr`. Raises InvalidArgument for an unknown kind."""
    @property
    def ptr(self) -> int:
        """The address of the first byte."""
    @property
    def nbytes(self) -> int:
        """The size in bytes."""
    @property
    def kind(self) -> MemoryKind:
        """Where the memory is."""
    @property
    def device(self) -> int:
        """The GPU ordinal of DEVICE memory, else -1."""

def region_of(buffer: BufferLike) -> Region:
    """How the library sees `buffer` (pointer, size, kind, device), without copying it."""

# Keys (docs/keys.md).
def namespace_id(identity: Union[Mapping[str, Any], str]) -> str:
    """Namespace id of a model identity (a dict, or its JSON text): 32 hex digits."""

def encode_reports(reports: Iterable[OpReport]) -> bytes:
    """Reports as one wire message (docs/engine.md "Wire format"), for the scheduler process.
    Raises InvalidArgument for a reason that is not "" or a worker outcome name. Any thread."""

def decode_reports(data: Union[bytes, bytearray, memoryview]) -> list[OpReport]:
    """Reports from a message a rank process encoded, for Scheduler.process. Raises as
    StepPlan.decode. Any thread."""

def chunk_keys(
    namespace: Union[KeyLike, Mapping[str, Any]],
    tokens: TokensLike,
    chunk: int,
    include_partial: bool = False,
    extra_key: Union[str, bytes, None] = None,
) -> list[str]:
    """Chained chunk keys of `tokens` (u32 values) in `chunk`-token chunks (tier::chunk_keys).

    `namespace` is a namespace id or a model identity dict (hashed with namespace_id). `tokens`
    are ints (or objects with ``__index__``) or a 1-D numpy array of an integer dtype; anything
    else raises TypeError (a float is never truncated to a token), and a value outside
    [0, 2^32) raises InvalidArgument. `extra_key`: what besides the tokens makes the KV differ
    (a LoRA adapter, multimodal content hashes, a cache salt; a str counts as its UTF-8 bytes),
    mixed into the first chunk so every key differs; None or empty: the keys without one
    (docs/keys.md)."""

def external_key(name: Union[str, bytes]) -> str:
    """A key for an engine's own object name (e.g. SGLang's page hash strings), docs/keys.md."""

class Completion:
    """The outcome of one asynchronous batch (Store.save_async / Store.load_async)."""

    @property
    def ticket(self) -> int:
        """The ticket save_async or load_async returned."""
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
    """Memory registered with a Store (Store.register); released by release() or `with`.
    *any thread*; released once, not while a batch that uses its memory is in flight."""

    @property
    def region(self) -> Region:
        """The memory registered."""
    def release(self) -> None:
        """Ends the registration (before the Store closes). Idempotent."""
    def __enter__(self) -> "Registration": ...
    def __exit__(self, *exc: object) -> None: ...

class ObjectStat:
    """Where a stored object is and how large it is (Store.stat)."""

    @property
    def tier(self) -> int:
        """The index of the fastest readable tier holding it."""
    @property
    def tier_name(self) -> str:
        """That tier's name."""
    @property
    def nbytes(self) -> int:
        """Its payload: the bytes a load's buffers must hold in all."""
    @property
    def stored_bytes(self) -> int:
        """Its image in that tier: the 96-byte header and any stage's encoding included."""

class Store:
    """A profile's tiers used as one cache (a TierStack behind the C API's tier_store).

    Objects are stored under (namespace, key, rank): the namespace and rank are the Store's,
    set at open(). Puts are put-if-absent: saving a key that is stored already is OK.
    Threads: every method is *any thread*; transfers release the GIL and run in parallel (the
    Store holds no lock around them). Saves of one key from several threads at once store one of
    them whole (put-if-absent); a load beside a save of its key finds it whole or not at all."""

    @staticmethod
    def open(
        profile: ProfileLike,
        *,
        namespace: Union[KeyLike, Mapping[str, Any], None] = None,
        rank: int = 0,
    ) -> "Store":
        """Opens the tiers of `profile`: a path to a JSON profile, JSON text, or a dict.

        `namespace`: a namespace id or a model identity dict. Pass one: the default, the all-zero
        namespace, is shared by every program that opens the tiers without one, whatever its
        model, and a persistent tier opened so logs a warning (docs/integration.md,
        "Namespaces"). A profile's "metrics" section starts its HTTP endpoint
        (metrics_endpoint). Raises InvalidArgument (bad profile, with every problem and its JSON
        path), NotFound (no such file), IoError (a tier, or the metrics endpoint's address)..."""
    def close(self) -> None:
        """Ends this Store: waits for the calls other threads are inside, runs the queued
        asynchronous batches to their end, then (unless a Worker still uses the tiers) waits for
        background work (write-through, demotion) and closes the tiers. Later calls raise
        BadState. Idempotent; *any thread*, also while other threads are inside calls."""
    def __enter__(self) -> "Store": ...
    def __exit__(self, *exc: object) -> None: ...
    @property
    def closed(self) -> bool:
        """Whether close() was called."""
    @property
    def namespace(self) -> str:
        """The namespace id the Store's objects are stored under (32 hex digits)."""
    @property
    def rank(self) -> int:
        """The TP rank the Store's objects are stored under."""
    @property
    def tier_names(self) -> list[str]:
        """The tiers' names, fastest first (optional tiers left out are not listed)."""
    @property
    def metrics_endpoint(self) -> Optional[str]:
        """"host:port" of the HTTP endpoint serving GET /metrics that the profile's "metrics"
        section started (the port chosen when it asked for 0), or None."""

    def lookup_prefix(self, keys: Sequence[KeyLike]) -> int:
        """Length of the leading run of `keys` stored in some readable tier."""
    def exists(self, keys: Sequence[KeyLike]) -> list[bool]:
        """Whether each key is stored in some readable tier."""
    def stat(self, keys: Sequence[KeyLike]) -> list[Optional[ObjectStat]]:
        """Where each key is stored and how large it is; None for a key no readable tier holds.
        ``stat(keys)[i].nbytes`` is the size a load's buffers for key i must have."""
    def save(self, keys: Sequence[KeyLike], buffers: Sequence[Regions]) -> list[Code]:
        """Stores each key's regions (blocking; the GIL is released). One code per key: OK
        (stored, or stored already) or the first writable tier's error (NO_SPACE: the object is
        larger than that tier can ever hold). Raises only for errors of the whole call
        (InvalidArgument: length mismatch, an unusable buffer; BadState)."""
    def load(self, keys: Sequence[KeyLike], buffers: Sequence[Regions]) -> list[Code]:
        """Loads each key into its regions (blocking; the GIL is released). One code per key:
        OK, NOT_FOUND (a miss) or the decode error. The regions' sizes must add up to the stored
        object's (stat() gives it); else INVALID_ARGUMENT for that key, nothing written, and a
        warning on the "libtier" logger names both sizes."""
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
        """Completions finished so far, without blocking. No library thread ever calls back.
        With several threads polling and waiting, each Completion goes to one of them."""
    def wait(self, ticket: Optional[int] = None, timeout: Optional[float] = None) -> Completion:
        """Blocks (GIL released) until `ticket` (or any ticket when None) completes and returns
        its Completion. Raises TimedOut after `timeout` seconds, NotFound for an unknown ticket
        (or one another thread took while this one waited)."""
    def remove(self, keys: Sequence[KeyLike]) -> list[Code]:
        """Removes each key from every tier (each tier's removes in batches, one wait for them
        all): OK where no tier holds the key afterwards, absent ones included; else the error of
        the first tier that failed."""
    def clear(self) -> int:
        """Removes every object of this Store's namespace from every tier, every rank's objects
        included (tier_store_clear), and returns how many were removed. Raises NotSupported when
        a tier cannot list its keys (the redis tier; the other tiers are cleared all the same)."""
    def progress(self) -> None:
        """Advances background work without blocking."""
    def flush(self, timeout: Optional[float] = None) -> None:
        """Waits until background work is done. Raises TimedOut."""
    def register(
        self, buffer: BufferLike, kind: Optional[MemoryKind] = None, device: Optional[int] = None
    ) -> Registration:
        """Registers memory with the Store. PINNED page-locks host memory through the GPU runtime
        (NotSupported in a build without it); regions inside a registered pinned range are
        treated as pinned. HOST records the range. DEVICE checks that the GPU runtime knows the
        whole buffer as memory of that GPU (InvalidArgument otherwise) and prepares the GPU's copy
        resources now (staging ring, kernels), so that the first load into it does not pay for
        them: register KV tensors when they are allocated. It also puts the store's own image
        buffers in page-locked memory (one 128 MiB arena per process), so that a disk tier reads
        each object into memory the GPU takes by DMA."""
    def metrics(self) -> dict[str, Any]:
        """Counters, usage and latencies as a dict (the tiers' and the stack's,
        docs/metrics.md)."""
    def metrics_prometheus(self) -> str:
        """Counters, usage gauges and latency histograms as Prometheus text format 0.0.4
        (libtier.prometheus.register adds them to a prometheus_client registry)."""

# The offload engine (docs/engine.md): DSV4 PAGE+SLOT semantics, one call per engine step.

class Boundary:
    """A committed SLOT boundary: `tokens` and the key of its SLOT object."""

    tokens: int
    key: str

class MatchResult:
    """Scheduler.lookup's answer: `tokens` the tiers can provide (0: none), `park` (the load is
    asynchronous: wait for process()), `page_hit` (the PAGE prefix before the SLOT shrink) and
    the `slot` a load resumes from."""

    tokens: int
    park: bool
    page_hit: int
    slot: Optional[Boundary]

class LoadDecision:
    """Scheduler.after_alloc's answer (docs/engine.md)."""

    action: str  # "none" | "load" | "recompute" | "handoff"
    reason: str
    load_start: int
    load_end: int
    handoff_tokens: int

class LoadOp:
    """A load of a step's plan: PAGE chunks [page_start, page_end) into `block_ids`, and the
    SLOT `slot` into state group `slot_group` when present."""

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
    lease: int  # the scheduler's view's lookup lease (0: none); Worker.release_lease ends it

class SaveOp:
    """A save of a step's plan: PAGE chunks [page_start, page_end) from `block_ids`, and a SLOT
    at `slot` from state group `slot_group` when present."""

    request: int
    generation: int
    page_start: int
    page_end: int
    chunk_keys: list[str]
    block_ids: list[int]
    slot: Optional[Boundary]
    slot_group: int
    prefix_keys: list[str]  # keys of [0, slot.tokens): the PAGE visibility check of the SLOT

class StepPlan:
    """One step's plan: submit the same plan to every rank's Worker."""

    @property
    def step(self) -> int:
        """The step number."""
    @property
    def has_work(self) -> bool:
        """Whether the plan holds any load or save."""
    @property
    def loads(self) -> list[LoadOp]:
        """The loads, in order."""
    @property
    def saves(self) -> list[SaveOp]:
        """The saves, in order."""
    def encode(self) -> bytes:
        """The plan as one wire message (docs/engine.md "Wire format"), for rank processes.
        Any thread (GIL released)."""
    @staticmethod
    def decode(data: Union[bytes, bytearray, memoryview]) -> "StepPlan":
        """A plan from a message another process encoded; submit it to this process's Worker.
        Raises InvalidArgument (truncated, malformed), ChecksumMismatch (corrupt),
        NotSupported (another format version), NoSpace (over 64 MiB); never a partial plan.
        Any thread (GIL released)."""

class OpReport:
    """One rank's terminal result for one operation on one channel."""

    channel: str  # "load" | "page_save" | "slot_save"
    request: int
    generation: int
    rank: int
    ok: bool
    reason: str  # the outcome's stable name ("" when ok), docs/engine.md
    outcome: int  # the outcome's stable number (TIER_OUTCOME_*; 0 when ok)
    def __init__(
        self, channel: str, request: int, generation: int, rank: int, ok: bool, reason: str = ""
    ) -> None:
        """A report received from another process: a failed one names its outcome by `reason`
        (InvalidArgument for an unknown name, or ok and reason disagreeing)."""

class StepEvents:
    """Scheduler.process's answer: request handles whose loads succeeded, whose loads failed
    (recompute them), and whose blocks may now be freed."""

    loaded: list[int]
    load_failed: list[int]
    freeable: list[int]

class Dsv4Layout:
    """The DSV4 KV layout of one rank (layouts/dsv4): owns the rank's KV memory.
    Its getters and close() are *any thread*."""

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
    def block_tokens(self) -> int:
        """Tokens per KV block."""
    @property
    def page_bytes_per_block(self) -> int:
        """PAGE bytes one block holds."""
    @property
    def slot_bytes(self) -> int:
        """Bytes of one state group (a SLOT)."""
    def page_regions(self, block_ids: Sequence[int]) -> list[Region]:
        """The KV memory of a PAGE chunk made of `block_ids` (what the engine's forward writes)."""
    def slot_regions(self, group: int) -> list[Region]:
        """The KV memory of state group `group` (one request's SLOT)."""
    def close(self) -> None:
        """Ends this object's use of the layout (later calls raise BadState); its memory stays
        while a Worker made over it lives."""

class Worker:
    """One TP rank's worker: moves PAGE chunks and SLOT sidecars between its layout and Store.
    Its calls are *any thread* (its rank thread drives it while the scheduler thread uses it
    as the view; two progress() calls run one after the other); close() is *any thread*."""

    @staticmethod
    def create(
        config: Mapping[str, Any],
        rank: int,
        store: Store,
        layout: Dsv4Layout,
        page_namespace: KeyLike,
    ) -> "Worker":
        """`config`: the EngineConfig JSON (docs/engine.md). The worker keeps the Store and the
        layout: either may be closed first (module docstring, Lifetimes)."""
    @property
    def rank(self) -> int:
        """The worker's TP rank."""
    def submit(self, plan: StepPlan, stream: int = 0, event: int = 0) -> None:
        """Queues the step's operations (GIL released). `stream` and `event`: the caller's GPU
        work the plan's transfers follow, as runtime handles (torch: `torch.cuda.current_stream()
        .cuda_stream`, an event's `cuda_event`); with `stream` a SLOT snapshot is one kernel on
        it and the call waits for no transfer. Without them the caller's work is taken as
        synchronized and a device layout's SLOT snapshot is copied before the call returns
        (tier_worker_submit_after). Of the tiers it waits only for the lease of each load's
        objects (no transfer)."""
    def progress(self, max_saves: Optional[int] = None) -> int:
        """Runs queued loads, then up to `max_saves` queued saves (GIL released); returns the
        number of operations finished."""
    def take_reports(self) -> list[OpReport]:
        """The reports of operations finished since the last call (give them to
        Scheduler.process)."""
    def release_lease(self, lease: int) -> None:
        """Ends a lookup lease this worker took as the scheduler's view (LoadOp.lease), when the
        load ran in another process; other ids are ignored."""
    def metrics(self) -> dict[str, Any]:
        """This worker's counters and its tiers' metrics ({"workers": [...], "tiers": {...}}),
        for a rank process without a Scheduler."""
    @property
    def queued_saves(self) -> int:
        """Saves submitted and not yet run."""
    @property
    def queued_loads(self) -> int:
        """Loads submitted and not yet run."""
    def close(self) -> None:
        """Ends this object's use of the worker; a Scheduler made over it keeps it working."""

class Scheduler:
    """The scheduler half of the offload engine: its calls are *serialized* (one at a time,
    from any thread; its lock enforces it); close() is *any thread*."""

    @staticmethod
    def create(config: Mapping[str, Any], view: Worker, page_namespace: KeyLike) -> "Scheduler":
        """`view`: rank 0's Worker (lookups and commit records go through it)."""
    def add_request(
        self, request_id: int, prompt: TokensLike, extra_key: Union[str, bytes, None] = None
    ) -> int:
        """Registers a request and its prompt (token ids, validated as chunk_keys's tokens);
        returns its handle (never reused). `extra_key` as for chunk_keys(): requests with equal
        tokens and different extra keys share no KV."""
    @property
    def epoch(self) -> int:
        """The high 24 bits of every generation this scheduler emits (random per scheduler)."""
    def lookup(self, handle: int) -> MatchResult:
        """What the tiers hold of the request's prompt, before the engine's own prefix match."""
    def after_alloc(
        self, handle: int, local_tokens: int, blocks: Sequence[int], group: int = -1
    ) -> LoadDecision:
        """`local_tokens`: the engine's own prefix-cache hit after allocation (tokens already in
        its KV memory). The keyword's old name `hbm_tokens=` still works, with a
        DeprecationWarning, until 0.2."""
    def set_blocks(self, handle: int, blocks: Sequence[int]) -> None:
        """The request's KV blocks after the engine allocated more."""
    def cut_prefill_chunk(self, handle: int, start: int, length: int) -> int:
        """The prefill chunk length to compute from `start` (at most `length`), cut at a SLOT
        boundary when a save is due there."""
    def on_computed(self, handle: int, computed_tokens: int) -> None:
        """The request now holds `computed_tokens` computed tokens."""
    def build_step(self) -> StepPlan:
        """This step's plan (call every step, also when idle)."""
    def process(self, reports: Iterable[OpReport]) -> StepEvents:
        """Aggregates every rank's reports (Worker.take_reports) into the step's events."""
    def should_defer_free(self, handle: int) -> bool:
        """True while a save or load still uses the request's blocks."""
    def finish(self, handle: int) -> bool:
        """True: the request's blocks may be freed now; else once process() lists it freeable."""
    @property
    def loads_pending(self) -> int:
        """Loads emitted and not yet terminal."""
    @property
    def saves_pending(self) -> int:
        """Saves emitted and not yet terminal."""
    def metrics(self, workers: Sequence[Worker] = ...) -> dict[str, Any]:
        """The engine's, the workers' and their tiers' counters as a dict."""
    def metrics_prometheus(self, workers: Sequence[Worker] = ...) -> str:
        """The same as Prometheus text format 0.0.4, with each worker's stack's usage gauges and
        latency histograms (tiers labelled "rank<r>/<name>")."""
    def close(self) -> None:
        """Ends the scheduler; any thread, while other threads are inside its calls too."""

# Sizing (docs/sizing.md): the LRU hit ratio of a trace at every capacity, as `tierctl size`.

class MissRatioCurve:
    """The LRU hit-ratio curve of a Mooncake-format trace, counted as `tierbench replay` counts
    hits (the leading run of each request's blocks present), from miss_ratio_curve()."""

    @property
    def requests(self) -> int:
        """Requests in the trace."""
    @property
    def blocks(self) -> int:
        """Blocks requested, repeats included."""
    @property
    def tracked_blocks(self) -> int:
        """Distinct blocks tracked (all of them when exact; the sample's otherwise)."""
    @property
    def exact(self) -> bool:
        """Whether every block was tracked (sample 1)."""
    @property
    def sample_rate(self) -> float:
        """The sample rate used (a multiple of 2^-24)."""
    @property
    def block_bytes(self) -> int:
        """The payload of one block, as given."""
    @property
    def image_bytes(self) -> int:
        """What one block takes in a tier: its payload and the 96-byte object header."""
    @property
    def saturation(self) -> int:
        """The smallest capacity, in blocks, with the largest hit ratio."""
    @property
    def max_hit_ratio(self) -> float:
        """The hit ratio at saturation (every repeat a hit)."""
    @property
    def knee(self) -> Optional[tuple[int, float]]:
        """(blocks, hit ratio) where the curve is furthest above the line from the origin to
        saturation; None when no block is requested twice."""
    def hit_ratio(self, blocks: int) -> float:
        """The hit ratio of an LRU tier of `blocks` blocks."""
    def miss_ratio(self, blocks: int) -> float:
        """1 - hit_ratio(blocks)."""
    def error(self, blocks: int) -> float:
        """The error stated for hit_ratio(blocks) when sampled (0 when exact)."""
    def capacity_bytes(self, blocks: int) -> int:
        """The tier capacity that holds `blocks` blocks: blocks * image_bytes."""
    def steps(self) -> list[tuple[int, float]]:
        """The whole curve: (blocks, hit ratio) at every capacity where the ratio rises."""

def miss_ratio_curve(
    trace: Union[str, "os.PathLike[str]"],
    *,
    block_bytes: int = 65536,
    sample: float = 1.0,
    max_tracked: int = 33554432,
) -> MissRatioCurve:
    """The LRU hit-ratio curve of a Mooncake-format trace in one pass (tierctl size; Mattson's
    stack distances, exact at sample 1; SHARDS sampling below 1, with the error it states).
    Runs with the GIL released. Raises NotFound (no trace), InvalidArgument (a malformed
    trace, a sample outside (0, 1], block_bytes 0), NoSpace (more than `max_tracked` distinct
    blocks tracked)."""
