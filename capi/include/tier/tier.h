/* libtier's C API: the store (a profile's tiers as one cache), keys, memory registration, and the
 * offload engine's per-step calls with the DSV4 layout, for any language with a C FFI.
 *
 * Implemented by libtier_c (pkg-config libtier_c; capi/), which exports only tier_*
 * symbols. Pure C99: no C++ type crosses this boundary.
 *
 * Conventions
 *  - Every call that can fail returns an int status: TIER_OK (0) or one of the codes below, the
 *    numbers of tier::Code. tier_code_name() names a code; tier_last_error() returns the message
 *    of the last failing call made on the calling thread (a per-thread buffer, valid until that
 *    thread's next failing call).
 *  - Handles are opaque. A *_open / *_create call gives the handle to the caller, who ends it
 *    with the matching *_close / *_destroy / *_free; destroying NULL is a no-op.
 *  - Strings the library returns through char** are allocated by it and freed with tier_free().
 *  - Memory named by a tier_region is the caller's: it must stay valid (and, for a save,
 *    unchanged) until the call returns, or for an asynchronous submit until its completion has
 *    been returned by tier_store_poll/tier_store_wait.
 *  - Every size is checked before it is used: a region whose end wraps the address space, a list
 *    whose sizes sum past 2^64 or an object above 2^48 bytes is INVALID_ARGUMENT, and JSON text
 *    nested deeper than 64 levels is INVALID_ARGUMENT. A timeout above a year is a year.
 *  - No library thread ever calls into the caller, but for the log sink (tier_log_set_sink),
 *    which receives libtier's messages on whichever thread logs them.
 *
 * Lifetimes (the store, layout, worker and scheduler handles; reference counted)
 *  - A worker holds a reference to its store and to its layout, a scheduler one to its worker.
 *    The handles may therefore be closed in any order: closing a store, layout or worker that a
 *    dependent still uses ends the caller's use of it (calls through it return BAD_STATE "the
 *    store is closed"), while its memory, tiers and KV bytes stay for the dependent and are freed
 *    with the last dependent (a worker's queued saves still read the layout; a scheduler's lookups
 *    still reach the tiers).
 *  - A close may run on any thread while other threads are inside calls on the same handle: the
 *    calls that began before it finish, the calls that begin after it return BAD_STATE, and the
 *    close returns once no call is inside. Nothing is freed under a call. A store's close first
 *    refuses new submits and runs the queued asynchronous batches to their end (their waiters get
 *    their completions), and only then refuses every call: once tier_store_wait or
 *    tier_store_poll returns BAD_STATE, no batch of the store uses its regions any more.
 *  - After its close returned, a handle that no dependent holds is freed, like free(): passing it
 *    again (a second close included) is the caller's use-after-free, so one thread closes each
 *    handle once. A second close of a handle a dependent still holds returns at once and does
 *    nothing. (The Python package guards its handles so that any number of closes is safe.)
 *  - Registrations (tier_memory) end with their store's close; tier_memory_release after it only
 *    frees the registration. Completions, plans, events, reports and curves are plain values the
 *    caller frees (not reference counted: free each once, after its last use).
 *
 * Threads
 *  Each call below (or the comment over its group) names one of these contracts:
 *  - [any thread]: callable from any thread, concurrently with any other call, also on the same
 *    handle.
 *  - [serialized]: callable from any thread; calls on the same handle take its lock and run one
 *    after the other (never in parallel).
 *  - [closing]: the close/destroy of a store, layout, worker or scheduler: callable from any
 *    thread while other threads are inside calls on the same handle (Lifetimes); one thread
 *    closes each handle, once.
 *  - [exclusive]: no other call on the same value may run while it runs, nor start after it (the
 *    free of a plain value: completion, plan, events, report, curve). Creating a handle touches
 *    no other caller's state.
 *  The store's calls run their transfers in parallel: a store holds no lock around a transfer
 *  (its TierStack keeps only its bookkeeping under short locks, and the cpu tier copies on the
 *  calling threads at once), so N threads saving or loading through one store move bytes at
 *  about N threads' copy speed. An asynchronous submit queues the batch for the store's own
 *  transfer thread, which runs it the same way beside the callers' own calls. Host regions on
 *  the cpu tier are moved once, between the tier and the caller's memory (metrics:
 *  staging_copy_bytes stays 0). A worker may be driven from its rank thread while the scheduler
 *  thread uses it as its view, and store calls on its store from other threads run beside both
 *  (docs/engine.md, Threads).
 *  Key functions, tier_code_name, tier_last_error, tier_version, tier_log_* and tier_curve_*
 *  are [any thread] (a tier_curve is read-only once made); the tier_dsv4_layout_* region getters
 *  are [any thread].
 */
#ifndef TIER_TIER_H_
#define TIER_TIER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a declaration here changes incompatibly. tier_abi_version() is the loaded
 * library's: a caller compiled against another version should refuse to run. */
#define TIER_C_ABI_VERSION 2

/* Status codes: the numbers of tier::Code (tier/status.hpp). */
enum {
  TIER_OK = 0,
  TIER_NOT_FOUND = 1,         /* the key is not stored (a miss) */
  TIER_REJECTED = 2,          /* refused by policy: fenced key, full queue, admission */
  TIER_RETRY = 3,             /* transient; the same call may succeed later */
  TIER_INVALID_ARGUMENT = 4,  /* the caller's input is wrong */
  TIER_NOT_SUPPORTED = 5,     /* a tier, codec or this build lacks the capability */
  TIER_IO_ERROR = 6,          /* the medium failed */
  TIER_DEVICE_ERROR = 7,      /* the GPU runtime failed */
  TIER_CHECKSUM_MISMATCH = 8, /* stored bytes failed verification (never handed out) */
  TIER_CANCELLED = 9,
  TIER_TIMED_OUT = 10,
  TIER_BAD_STATE = 11,        /* the handle is in a state that does not allow the call */
  TIER_ALREADY_EXISTS = 12,
  TIER_NO_SPACE = 13
};

/* Every call of this section and of "Keys": [any thread]. */
/* "ok", "not_found", ... (tier::code_name); "unknown" for a number that is not a code. */
const char* tier_code_name(int code);
/* The message of the last failing call on this thread ("" when none failed yet). */
const char* tier_last_error(void);
uint32_t tier_abi_version(void);
/* libtier's version, "0.1.0" (the Meson project's; CHANGELOG.md). */
const char* tier_version(void);
/* Frees a string returned by the library. */
void tier_free(void* p);

/* ---- Log (docs/logging.md) --------------------------------------------------------------- */

/* Levels, most severe first. A message is emitted when its level is at or below the threshold:
 * TIER_LOG_WARN by default, TIER_LOG_LEVEL in the environment (error, warn, info, debug, off), a
 * profile's "log": {"level": ...} (unless the environment or this call chose one), or
 * tier_log_set_level (always applies). */
enum {
  TIER_LOG_OFF = 0,
  TIER_LOG_ERROR = 1,
  TIER_LOG_WARN = 2,
  TIER_LOG_INFO = 3,
  TIER_LOG_DEBUG = 4
};
/* Errors: INVALID_ARGUMENT (not a TIER_LOG_* value). */
int tier_log_set_level(int level);
int tier_log_level(void);
/* Receives each message emitted: its level (TIER_LOG_ERROR..TIER_LOG_DEBUG) and one line of text,
 * valid only during the call. It runs on the thread that logs, which may be a library thread (a
 * Redis tier's I/O thread, a store's transfer thread, the metrics endpoint's thread), one message
 * at a time. It must return quickly and must not call into libtier. */
typedef void (*tier_log_fn)(void* user, int level, const char* message);
/* Routes messages to `fn` (NULL: back to stderr, the default). When this returns, the previous
 * sink is not running and is never called again. Never call it from inside a sink. */
void tier_log_set_sink(tier_log_fn fn, void* user);

/* ---- Keys (docs/keys.md) ---------------------------------------------------------------- */

/* A 128-bit key in canonical byte form: the low 64 bits then the high 64 bits, each
 * little-endian (tier::Key128 lo, hi). */
typedef struct tier_key {
  uint8_t bytes[16];
} tier_key;

/* 32 lower-case hex digits, high half first (tier::Key128::hex), NUL-terminated in out[33]. */
void tier_key_to_hex(const tier_key* key, char out[33]);
/* Errors: INVALID_ARGUMENT (not 32 hex digits). */
int tier_key_from_hex(const char* hex, tier_key* out);
/* Namespace id of a model identity given as JSON text. Errors: INVALID_ARGUMENT. */
int tier_namespace_id(const char* identity_json, tier_key* out);
/* Chained keys of consecutive `chunk_tokens`-token chunks of `tokens` (tier::chunk_keys); a
 * trailing partial chunk gets a key only with include_partial != 0. Writes at most `capacity`
 * keys and sets *count to the number of keys of the whole sequence (call with capacity 0 to size
 * the array). Errors: INVALID_ARGUMENT (chunk_tokens 0, capacity too small: nothing written). */
int tier_chunk_keys(const tier_key* ns, const uint32_t* tokens, size_t token_count,
                    size_t chunk_tokens, int include_partial, tier_key* out, size_t capacity,
                    size_t* count);
/* tier_chunk_keys with an extra key (`extra_key_bytes` bytes; 0: none, the keys of
 * tier_chunk_keys): what besides the tokens makes the KV differ, a LoRA adapter, multimodal
 * content hashes, a cache salt (docs/keys.md). It is mixed into the first chunk, so every key of
 * the chain differs (tier::chunk_keys). Errors: as tier_chunk_keys; INVALID_ARGUMENT (extra_key
 * NULL with a size). */
int tier_chunk_keys_extra(const tier_key* ns, const uint32_t* tokens, size_t token_count,
                          size_t chunk_tokens, int include_partial, const void* extra_key,
                          size_t extra_key_bytes, tier_key* out, size_t capacity, size_t* count);
/* Key of an engine's own object name (bytes): XXH3-128 (seed 0) over
 * "libtier-external-v1\0" | name. */
void tier_external_key(const void* name, size_t bytes, tier_key* out);

/* ---- Memory ------------------------------------------------------------------------------ */

enum {
  TIER_MEMORY_HOST = 0,   /* pageable host memory */
  TIER_MEMORY_PINNED = 1, /* page-locked host memory */
  TIER_MEMORY_DEVICE = 2, /* GPU memory of `device` */
  TIER_MEMORY_SHM = 3     /* host memory in a shared-memory segment */
};

typedef struct tier_region {
  void* ptr;
  size_t bytes;
  int32_t kind;   /* TIER_MEMORY_* */
  int32_t device; /* GPU ordinal for TIER_MEMORY_DEVICE, else -1 */
} tier_region;

/* ---- Store ------------------------------------------------------------------------------- */

typedef struct tier_store tier_store;

/* Opens the tiers of a profile file (or of JSON text) for objects of namespace `ns` (NULL: all
 * zero) and TP rank `rank`. A store with the all-zero namespace over a persistent tier logs a
 * warning once per process: its objects are found by any program that opens it so, whatever its
 * model (docs/integration.md, "Namespaces"). A profile's "metrics" section starts its HTTP
 * endpoint (tier_store_metrics_endpoint). Errors: INVALID_ARGUMENT (every problem with its JSON
 * path), NOT_FOUND (no such file), IO_ERROR (the metrics endpoint cannot listen), the tiers'
 * errors. Unless marked otherwise, the tier_store_* and tier_completion_* calls are [any
 * thread]. */
int tier_store_open(const char* profile_path, const tier_key* ns, uint32_t rank, tier_store** out);
int tier_store_open_json(const char* profile_json, const tier_key* ns, uint32_t rank,
                         tier_store** out);
/* Ends the caller's use of the store (Lifetimes): runs the queued asynchronous batches, waits for
 * the calls in flight on other threads, then, unless a worker still holds the store, waits for
 * background work (bounded by the profile's timeout) and closes the tiers. Completions not yet
 * taken are discarded. Later calls through the handle, while a worker keeps it, return
 * BAD_STATE. [closing] */
void tier_store_close(tier_store* store);

/* 0 for a NULL or closed store. */
size_t tier_store_tier_count(tier_store* store);
/* The name of tier `index` (valid until the store's memory is freed: Lifetimes), or NULL. */
const char* tier_store_tier_name(tier_store* store, size_t index);

/* Counters, usage gauges and latency histograms (docs/metrics.md) as JSON text and as Prometheus
 * text format 0.0.4; free with tier_free. */
int tier_store_metrics_json(tier_store* store, char** out);
int tier_store_metrics_prometheus(tier_store* store, char** out);
/* "host:port" of the metrics endpoint the profile started (the port chosen when it asked for
 * 0), "" without one or for a NULL or closed store; valid until the store's memory is freed
 * (Lifetimes). */
const char* tier_store_metrics_endpoint(tier_store* store);

/* Registers memory with a store until tier_memory_release. TIER_MEMORY_PINNED page-locks the
 * host range through the GPU runtime (NOT_SUPPORTED in a build without it, or with no GPU);
 * host regions inside a registered pinned range are then moved as pinned. HOST records the
 * range. DEVICE checks that the GPU runtime knows every byte as memory of GPU `device`
 * (INVALID_ARGUMENT otherwise, and for device < 0; NOT_SUPPORTED in a build without the GPU
 * floor) and prepares that GPU's copy resources now (its staging ring, the copy and verification
 * kernels loaded), so that the first load or save with that memory does not pay for them: register
 * the KV memory when it is allocated. It also gives the store page-locked image memory (one 128 MiB
 * arena per process, TierStack::set_image_memory): a tier that cannot write device memory itself
 * (the disk) then reads each object into memory the GPU takes by DMA. A registration ends with
 * its store's close at the latest; tier_memory_release frees it (also after that close). [any
 * thread] (a shared lock of the store's registrations, held while a call converts its regions,
 * never during a transfer); a registration is released once, and not while a batch that uses its
 * memory is in flight. */
typedef struct tier_memory tier_memory;
int tier_memory_register(tier_store* store, void* ptr, size_t bytes, int32_t kind, int32_t device,
                         tier_memory** out);
int tier_memory_release(tier_memory* memory);

/* One object of a batch: its key (in the store's namespace and rank) and its bytes as a
 * scatter/gather list (the object is the regions' bytes concatenated in order). A list is all
 * host memory (HOST, PINNED, SHM) or all DEVICE memory of one GPU; every byte of a DEVICE region
 * must be memory the GPU runtime knows on that GPU, else the item fails with INVALID_ARGUMENT
 * before a byte moves (each allocation the list's regions lie in is looked up once). */
typedef struct tier_item {
  tier_key key;
  const tier_region* regions;
  size_t region_count;
} tier_item;

/* Leading run of `keys` stored in a readable tier. */
int tier_store_lookup_prefix(tier_store* store, const tier_key* keys, size_t count,
                             size_t* prefix);
/* out[i] = 1 when keys[i] is stored in a readable tier, else 0. */
int tier_store_exists(tier_store* store, const tier_key* keys, size_t count, uint8_t* out);
/* Where each key is stored and how large it is. */
typedef struct tier_object_stat {
  int32_t tier;           /* the fastest readable tier holding it; -1: not stored */
  uint64_t payload_bytes; /* what a load's regions must hold in all */
  uint64_t stored_bytes;  /* its image in that tier: the 96-byte header and any stage included */
} tier_object_stat;
/* out[i] for keys[i]. Reads a key's image only where its tier applies a stage (to learn the
 * payload size). Errors: INVALID_ARGUMENT (NULL arrays). */
int tier_store_stat(tier_store* store, const tier_key* keys, size_t count, tier_object_stat* out);
/* Saves and loads of the same or other keys from several threads run in parallel; saves of
 * one key at once store one of them whole (put-if-absent), and a load that runs beside a save
 * of its key finds the object whole or not at all. */
/* Blocking batch save: codes[i] is TIER_OK (stored, or stored already: put-if-absent) or the
 * first writable tier's error for item i (NO_SPACE: larger than that tier can ever hold). The call's own status is an error only when the batch
 * could not be attempted (INVALID_ARGUMENT: a malformed region list; BAD_STATE). */
int tier_store_save(tier_store* store, const tier_item* items, size_t count, int32_t* codes);
/* Blocking batch load: codes[i] is TIER_OK, TIER_NOT_FOUND (a miss) or the decode error of item i
 * (INVALID_ARGUMENT when the regions' size differs from the stored object's: nothing written; the
 * sizes are logged as a warning, and tier_store_stat gives the stored size).
 * tiers (may be NULL) receives the index of the tier that served each item, or -1. */
int tier_store_load(tier_store* store, const tier_item* items, size_t count, int32_t* codes,
                    int32_t* tiers);
/* Removes each key from every tier, in batches per tier (one wait for them all); codes[i] as
 * tier::TierStack::remove. */
int tier_store_remove(tier_store* store, const tier_key* keys, size_t count, int32_t* codes);
/* Removes every object of namespace `ns` (NULL: the store's own) from every tier, every rank's
 * objects included (tier::TierStack::clear): what an engine does when new weights make its cached
 * KV stale. *removed (may be NULL) receives how many objects were removed. Errors: NOT_SUPPORTED
 * (a tier cannot list its keys: the redis tier; the other tiers are cleared all the same), the
 * tiers' removal errors. */
int tier_store_clear(tier_store* store, const tier_key* ns, uint64_t* removed);
/* Advances background work (write-through, demotion, promotion) without blocking. */
int tier_store_progress(tier_store* store);
/* Waits until background work is done; timeout_ms < 0 waits up to the profile's op timeout.
 * Errors: TIMED_OUT. */
int tier_store_flush(tier_store* store, int64_t timeout_ms);

/* Asynchronous batches: the items and region lists are copied at submit, which returns at once
 * with a ticket (> 0); the store's transfer thread runs the batch; tier_store_poll and
 * tier_store_wait hand out its completion. The regions' memory belongs to the batch until then. */
enum { TIER_OP_SAVE = 0, TIER_OP_LOAD = 1 };
typedef struct tier_completion tier_completion;
int tier_store_submit_save(tier_store* store, const tier_item* items, size_t count,
                           uint64_t* ticket);
int tier_store_submit_load(tier_store* store, const tier_item* items, size_t count,
                           uint64_t* ticket);
/* A finished completion (*out = NULL when none is ready), without blocking. */
int tier_store_poll(tier_store* store, tier_completion** out);
/* Blocks until `ticket` (0: any) completes, up to timeout_ms (< 0: no limit). Several threads may
 * poll and wait at once: each completion is handed out once, to one of them.
 * Errors: TIMED_OUT, NOT_FOUND (a ticket never issued or already taken, also by another thread
 * while this one waited). */
int tier_store_wait(tier_store* store, uint64_t ticket, int64_t timeout_ms, tier_completion** out);
uint64_t tier_completion_ticket(const tier_completion* c);
int32_t tier_completion_op(const tier_completion* c); /* TIER_OP_* */
/* The batch status (what the blocking call would have returned). */
int32_t tier_completion_status(const tier_completion* c);
size_t tier_completion_count(const tier_completion* c);
/* Per-item codes and (loads) serving tiers, `count` each; valid until tier_completion_free
 * ([exclusive] on the completion; its getters are [any thread]). */
const int32_t* tier_completion_codes(const tier_completion* c);
const int32_t* tier_completion_tiers(const tier_completion* c);
void tier_completion_free(tier_completion* c);

/* ---- Offload engine (docs/engine.md) with the DSV4 layout --------------------------------- */

/* The KV memory of one TP rank in the DSV4 layout (layouts/dsv4), allocated and zeroed by
 * the library. `geometry` is a preset name ("v4-pro-fp8", ...) or a model description as JSON
 * text ({"preset": ..., "num_blocks": ..., "num_slots": ...}); `options_json` (NULL: host) is
 * {"memory": "host" | "device", "device": 0}. Errors: INVALID_ARGUMENT, NOT_SUPPORTED (device
 * memory without a GPU), NO_SPACE, DEVICE_ERROR. The getters below are [any thread];
 * tier_dsv4_layout_destroy is [closing]. */
typedef struct tier_dsv4_layout tier_dsv4_layout;
int tier_dsv4_layout_create(const char* geometry, const tier_key* page_ns, uint32_t tp_size,
                            uint32_t tp_rank, const char* options_json, tier_dsv4_layout** out);
/* Ends the caller's use of the layout (Lifetimes): its memory stays while a worker made over it
 * lives, so the regions handed out stay valid as long. */
void tier_dsv4_layout_destroy(tier_dsv4_layout* layout);
/* The getters return 0 for a NULL or closed layout. */
uint32_t tier_dsv4_layout_block_tokens(const tier_dsv4_layout* layout);
uint64_t tier_dsv4_layout_page_bytes_per_block(const tier_dsv4_layout* layout);
uint64_t tier_dsv4_layout_slot_bytes(const tier_dsv4_layout* layout);
/* The regions of the PAGE chunk made of `block_ids` / of state group `group`: at most
 * `capacity` are written, *count is the total (capacity 0 sizes). Errors: INVALID_ARGUMENT. */
int tier_dsv4_layout_page_regions(const tier_dsv4_layout* layout, const uint32_t* block_ids,
                                  size_t block_count, tier_region* out, size_t capacity,
                                  size_t* count);
int tier_dsv4_layout_slot_regions(const tier_dsv4_layout* layout, int32_t group, tier_region* out,
                                  size_t capacity, size_t* count);

typedef struct tier_boundary {
  uint64_t tokens;
  tier_key key;
} tier_boundary;

enum { TIER_CHANNEL_LOAD = 0, TIER_CHANNEL_PAGE_SAVE = 1, TIER_CHANNEL_SLOT_SAVE = 2 };

/* How one rank's operation ended (tier::engine::WorkerOutcome; stable numbers, docs/engine.md). */
enum {
  TIER_OUTCOME_OK = 0,
  TIER_OUTCOME_PAGE_UNAVAILABLE = 1,
  TIER_OUTCOME_MISSING_DESTINATION_GROUP = 2,
  TIER_OUTCOME_SIDECAR_CODEC = 3,
  TIER_OUTCOME_SIDECAR_UNAVAILABLE = 4,
  TIER_OUTCOME_SIDECAR_CORRUPT = 5,
  TIER_OUTCOME_MAX_PENDING_SAVES = 6,
  TIER_OUTCOME_SNAPSHOT = 7,
  TIER_OUTCOME_PAGE_STORE = 8,
  TIER_OUTCOME_PAGE_VISIBILITY = 9,
  TIER_OUTCOME_PAGE_VISIBILITY_TIMEOUT = 10,
  TIER_OUTCOME_SIDECAR_INVALIDATION = 11,
  TIER_OUTCOME_SIDECAR_SUBMISSION = 12,
  TIER_OUTCOME_SIDECAR_VISIBILITY = 13,
  TIER_OUTCOME_SIDECAR_VISIBILITY_TIMEOUT = 14,
  TIER_OUTCOME_DEVICE_ORDER = 15,
  TIER_OUTCOME_RANK_LOST = 16 /* set by whoever watches a rank process that died */
};
/* The stable name of an outcome ("" for TIER_OUTCOME_OK, "unknown" for another number): a static
 * string, for logs and metrics. */
const char* tier_outcome_name(int32_t outcome);

/* One rank's terminal result for one operation on one channel: plain numbers, so a report may be
 * copied to another process as it is. `outcome` is TIER_OUTCOME_*; `ok` is outcome == 0;
 * `reason` is tier_outcome_name(outcome) (static) in reports from tier_worker_take_reports and is
 * ignored by tier_scheduler_process, which reads `outcome`. */
typedef struct tier_op_report {
  int32_t channel; /* TIER_CHANNEL_* */
  uint32_t rank;
  uint64_t request;
  uint64_t generation;
  int32_t ok;
  int32_t outcome;
  const char* reason;
} tier_op_report;

/* A worker: one TP rank's mover between its layout and its store. `config_json` is the
 * EngineConfig JSON (NULL or "{}": defaults); `page_ns` the PAGE namespace. The worker holds a
 * reference to the store and to the layout (Lifetimes): they may be closed before it. Errors:
 * INVALID_ARGUMENT, BAD_STATE (the store or layout is closed). Every tier_worker_* call is
 * [any thread] (the worker's own short locks; two tier_worker_progress calls run one after the
 * other); tier_worker_destroy is [closing]. */
typedef struct tier_worker tier_worker;
int tier_worker_create(const char* config_json, const tier_key* page_ns, uint32_t rank,
                       tier_store* store, tier_dsv4_layout* layout, tier_worker** out);
/* Ends the caller's use of the worker (Lifetimes); a scheduler made over it keeps it. The queued
 * operations of a worker that is freed are dropped. */
void tier_worker_destroy(tier_worker* worker);

/* A step's plan from tier_scheduler_build_step; the same plan goes to every rank's worker.
 * Its getters are [any thread] (read only), tier_plan_free [exclusive]. */
typedef struct tier_plan tier_plan;
typedef struct tier_load_op {
  uint64_t request, generation;
  uint64_t page_start, page_end;
  const tier_key* chunk_keys; /* chunk_count keys of [page_start, page_end) */
  size_t chunk_count;
  const uint32_t* block_ids; /* block_count destination blocks */
  size_t block_count;
  int32_t has_slot;
  tier_boundary slot;
  int32_t slot_group;
} tier_load_op;
typedef struct tier_save_op {
  uint64_t request, generation;
  uint64_t page_start, page_end;
  const tier_key* chunk_keys;
  size_t chunk_count;
  const uint32_t* block_ids;
  size_t block_count;
  int32_t has_slot;
  tier_boundary slot;
  const tier_key* prefix_keys; /* keys of [0, slot.tokens) */
  size_t prefix_count;
  int32_t slot_group;
} tier_save_op;
uint64_t tier_plan_step(const tier_plan* plan);
size_t tier_plan_load_count(const tier_plan* plan);
size_t tier_plan_save_count(const tier_plan* plan);
/* The i-th operation; its pointers stay valid until tier_plan_free. Errors: INVALID_ARGUMENT. */
int tier_plan_load(const tier_plan* plan, size_t index, tier_load_op* out);
int tier_plan_save(const tier_plan* plan, size_t index, tier_save_op* out);
/* The lookup lease the i-th load carries (0: none, or no such load): the scheduler's view took it
 * and releases it with tier_worker_release_lease when the load is terminal, where the rank that
 * loads is another process (docs/engine.md "Ranks as processes"). */
uint64_t tier_plan_load_lease(const tier_plan* plan, size_t index);
void tier_plan_free(tier_plan* plan);

/* Plans and reports between processes (docs/engine.md "Ranks as processes"; the bytes are the
 * wire format of docs/engine.md "Wire format": versioned, checksummed, checked on decode). Any
 * thread, concurrently; a decoded plan or report list is read-only. A decoder never returns a
 * partial result: a truncated, corrupt or malformed message is INVALID_ARGUMENT (the message
 * names the byte offset), a checksum failure CHECKSUM_MISMATCH, another format version or an
 * unknown required part NOT_SUPPORTED, a message over 64 MiB NO_SPACE. */

/* The plan as one message: *out (free with tier_free) holds *size bytes. */
int tier_plan_encode(const tier_plan* plan, uint8_t** out, size_t* size);
/* A plan from a message another process encoded: submit it with tier_worker_submit, read it with
 * the tier_plan_* getters, free it with tier_plan_free. */
int tier_plan_decode(const void* bytes, size_t size, tier_plan** out);
/* Reports as one message: *out (free with tier_free) holds *size bytes. Errors: INVALID_ARGUMENT
 * (a channel or an outcome out of range, `ok` disagreeing with the outcome). */
int tier_reports_encode(const tier_op_report* reports, size_t count, uint8_t** out, size_t* size);
/* Reports from a message, for tier_scheduler_process. */
typedef struct tier_reports tier_reports;
int tier_reports_decode(const void* bytes, size_t size, tier_reports** out);
/* The decoded reports (*count of them); valid, reason strings included, until tier_reports_free. */
const tier_op_report* tier_reports_get(const tier_reports* reports, size_t* count);
void tier_reports_free(tier_reports* reports);

/* Queues the plan's operations on this rank. The caller's GPU work is taken as synchronized:
 * with a device layout and a SLOT save in the plan, the call waits for the snapshot's copy (the
 * caller may change the state group as soon as it returns); of the tiers it waits only for the
 * lease of each load's objects (a short request, no transfer: docs/engine.md "Lookup leases"). */
int tier_worker_submit(tier_worker* worker, const tier_plan* plan);
/* tier_worker_submit with the caller's GPU work the plan's transfers must follow, as runtime
 * handles (cudaStream_t / hipStream_t, cudaEvent_t / hipEvent_t cast to void*): `event`, when
 * not NULL, recorded after the step's forward; `stream`, the compute stream that wrote the KV.
 * Every transfer of the plan follows them on the device, and with `stream` a SLOT snapshot is one
 * kernel enqueued there (ahead of the caller's next kernels): the call waits for no transfer.
 * Both NULL: tier_worker_submit. A layout in host memory refuses a non-NULL order: every
 * operation of the plan is then reported failed ("device_order"). */
int tier_worker_submit_after(tier_worker* worker, const tier_plan* plan, void* stream,
                             void* event);
/* Runs queued loads, then up to max_saves queued saves (SIZE_MAX: all); *finished (may be NULL)
 * receives the operations finished. */
int tier_worker_progress(tier_worker* worker, size_t max_saves, size_t* finished);
/* Takes up to `capacity` pending reports (the rest stay for the next call); *count is the number
 * written. */
int tier_worker_take_reports(tier_worker* worker, tier_op_report* out, size_t capacity,
                             size_t* count);
size_t tier_worker_queued_saves(tier_worker* worker);
size_t tier_worker_queued_loads(tier_worker* worker);
/* Ends a lookup lease this worker handed out as the scheduler's view (tier_plan_load_lease);
 * other ids are ignored. */
int tier_worker_release_lease(tier_worker* worker, uint64_t lease);
/* This worker's counters and its tiers' metrics as JSON ({"workers": [...], "tiers": {...}}, the
 * worker parts of tier_engine_metrics_json), for a rank process without a scheduler; free with
 * tier_free. */
int tier_worker_metrics_json(tier_worker* worker, char** out);

/* The scheduler, with rank 0's worker as its view of the tiers; it holds a reference to the view
 * (Lifetimes). Every tier_scheduler_* call and tier_engine_metrics_* is [serialized] on the
 * scheduler (the engine's scheduler has one caller at a time; its lock enforces it);
 * tier_scheduler_destroy is [closing]. The events' getters are [any thread], tier_events_free
 * [exclusive]. */
typedef struct tier_scheduler tier_scheduler;
int tier_scheduler_create(const char* config_json, const tier_key* page_ns, tier_worker* view,
                          tier_scheduler** out);
/* Ends the scheduler (Lifetimes); the last reference to its view, store and layout frees them. */
void tier_scheduler_destroy(tier_scheduler* scheduler);

typedef struct tier_match {
  uint64_t tokens;   /* tokens the tiers can provide (0: none) */
  int32_t park;      /* 1: the load is asynchronous; wait for tier_scheduler_process */
  uint64_t page_hit; /* PAGE prefix present (before the SLOT shrink) */
  int32_t has_slot;
  tier_boundary slot; /* the committed boundary a load resumes from */
} tier_match;

enum {
  TIER_LOAD_NONE = 0,      /* nothing to load */
  TIER_LOAD_LOAD = 1,      /* a load follows in the next plan: keep the request parked */
  TIER_LOAD_RECOMPUTE = 2, /* the hit is not used */
  TIER_LOAD_HANDOFF = 3    /* dense: prefill to handoff_tokens, then after_alloc again */
};
typedef struct tier_load_decision {
  int32_t action;     /* TIER_LOAD_* */
  const char* reason; /* static string, docs/engine.md */
  uint64_t load_start, load_end, handoff_tokens;
} tier_load_decision;

/* Registers a request and its prompt; *handle is never reused. */
int tier_scheduler_add_request(tier_scheduler* s, uint64_t request_id, const uint32_t* prompt,
                               size_t prompt_tokens, uint64_t* handle);
/* The same with an extra key (`extra_key_bytes` bytes, 0: none) mixed into the request's chunk
 * keys, as tier_chunk_keys_extra does: requests with equal tokens and different extra keys share
 * no KV. */
int tier_scheduler_add_request_extra(tier_scheduler* s, uint64_t request_id,
                                     const uint32_t* prompt, size_t prompt_tokens,
                                     const void* extra_key, size_t extra_key_bytes,
                                     uint64_t* handle);
/* The scheduler's epoch: the high 24 bits of every operation generation it emits, drawn at random
 * per scheduler so that a restarted scheduler never reuses a generation (docs/engine.md); 0 for a
 * NULL or closed scheduler. */
uint32_t tier_scheduler_epoch(tier_scheduler* s);
/* Errors: NOT_FOUND (unknown handle), tier errors. */
int tier_scheduler_lookup(tier_scheduler* s, uint64_t handle, tier_match* out);
int tier_scheduler_after_alloc(tier_scheduler* s, uint64_t handle, uint64_t local_tokens,
                               const uint32_t* blocks, size_t block_count, int32_t group,
                               tier_load_decision* out);
int tier_scheduler_set_blocks(tier_scheduler* s, uint64_t handle, const uint32_t* blocks,
                              size_t block_count);
int tier_scheduler_cut_prefill_chunk(tier_scheduler* s, uint64_t handle, uint64_t start,
                                     uint64_t length, uint64_t* out);
int tier_scheduler_on_computed(tier_scheduler* s, uint64_t handle, uint64_t computed_tokens);
/* This step's plan (call every step, also when idle); free with tier_plan_free. */
int tier_scheduler_build_step(tier_scheduler* s, tier_plan** out);

/* Aggregated events of tier_scheduler_process; free with tier_events_free. */
typedef struct tier_events tier_events;
int tier_scheduler_process(tier_scheduler* s, const tier_op_report* reports, size_t count,
                           tier_events** out);
/* Request handles: loads that succeeded, loads that failed (recompute), finished requests
 * whose blocks may now be freed. Valid until tier_events_free. */
const uint64_t* tier_events_loaded(const tier_events* ev, size_t* count);
const uint64_t* tier_events_load_failed(const tier_events* ev, size_t* count);
const uint64_t* tier_events_freeable(const tier_events* ev, size_t* count);
void tier_events_free(tier_events* ev);

/* *out = 1 while a save or load still uses the request's blocks. */
int tier_scheduler_should_defer_free(tier_scheduler* s, uint64_t handle, int32_t* out);
/* The request is done: *free_now = 1 when its blocks may be freed now, else they are listed
 * as freeable by a later tier_scheduler_process. */
int tier_scheduler_finish(tier_scheduler* s, uint64_t handle, int32_t* free_now);
uint64_t tier_scheduler_loads_pending(tier_scheduler* s);
uint64_t tier_scheduler_saves_pending(tier_scheduler* s);
/* The engine's, the workers' and their tiers' counters (tier/engine/export.hpp). */
int tier_engine_metrics_json(tier_scheduler* s, tier_worker* const* workers, size_t worker_count,
                             char** out);
int tier_engine_metrics_prometheus(tier_scheduler* s, tier_worker* const* workers,
                                   size_t worker_count, char** out);

/* ---- Sizing (docs/sizing.md) ------------------------------------------------------------- */

/* The LRU hit-ratio curve of a Mooncake-format trace (JSON lines of {"timestamp",
 * "input_length", "output_length", "hash_ids"}), counted as tierbench replay counts hits, in one
 * pass in bounded memory: what `tierctl size` prints. Capacities are in blocks (one hash id); a
 * tier holds capacity / (block payload + 96) of them. Read-only once made: any thread. */
typedef struct tier_curve tier_curve;
/* sample_rate in (0, 1]: 1 is exact (Mattson's stack distances), below 1 SHARDS sampling with an
 * error (tier_curve_error); max_tracked (0: 2^25) bounds the distinct blocks tracked. Errors:
 * NOT_FOUND (no trace), INVALID_ARGUMENT (a malformed line, with its number and field; a rate
 * out of range), IO_ERROR, NO_SPACE (more than max_tracked blocks). */
int tier_curve_from_trace(const char* trace_path, double sample_rate, uint64_t max_tracked,
                          tier_curve** out);
void tier_curve_free(tier_curve* curve);
uint64_t tier_curve_requests(const tier_curve* curve);
uint64_t tier_curve_blocks(const tier_curve* curve);         /* requested, repeats included */
uint64_t tier_curve_tracked_blocks(const tier_curve* curve); /* distinct blocks tracked */
double tier_curve_sample_rate(const tier_curve* curve);      /* as used: a multiple of 2^-24 */
/* The hit ratio at `blocks` blocks, and (sampled) the error stated for it; 0 when exact. */
double tier_curve_hit_ratio(const tier_curve* curve, uint64_t blocks);
double tier_curve_error(const tier_curve* curve, uint64_t blocks);
/* The smallest capacity with the largest hit ratio. */
uint64_t tier_curve_saturation(const tier_curve* curve);
/* The knee: 0 when no block is requested twice (nothing written), else 1 with its capacity and
 * hit ratio. */
int tier_curve_knee(const tier_curve* curve, uint64_t* blocks, double* hit_ratio);
/* Every capacity where the ratio rises, increasing, with the ratio from there on: at most
 * `capacity` written, *count is the total (capacity 0 sizes). */
int tier_curve_steps(const tier_curve* curve, uint64_t* blocks, double* hit_ratios,
                     size_t capacity, size_t* count);

#ifdef __cplusplus
}
#endif

#endif /* TIER_TIER_H_ */
