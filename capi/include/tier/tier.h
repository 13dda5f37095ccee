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
 *  - No library thread ever calls into the caller: there are no callbacks.
 *
 * Threads
 *  - Key functions, tier_code_name, tier_last_error, tier_version: any thread, concurrently.
 *  - tier_store_*: any thread, concurrently. Each store serializes its calls on one lock (the
 *    TierStack behind it has one owner at a time); an asynchronous submit queues the batch for
 *    the store's own transfer thread, which takes the same lock. A store must not be closed while
 *    another thread uses it.
 *  - tier_worker_* and tier_scheduler_*: the engine's contract (docs/engine.md). A scheduler is
 *    used by one thread at a time; a worker may be driven from its rank thread while the
 *    scheduler thread uses it as its view. Both take the lock of the worker's store around every
 *    call, so store calls on that store from other threads remain safe.
 *  - tier_dsv4_layout_*: the region getters may be called from any thread; the layout must
 *    outlive the workers made over it.
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
#define TIER_C_ABI_VERSION 1

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

/* "ok", "not_found", ... (tier::code_name); "unknown" for a number that is not a code. */
const char* tier_code_name(int code);
/* The message of the last failing call on this thread ("" when none failed yet). */
const char* tier_last_error(void);
uint32_t tier_abi_version(void);
const char* tier_version(void);
/* Frees a string returned by the library. */
void tier_free(void* p);

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
 * zero) and TP rank `rank`. Errors: INVALID_ARGUMENT (every problem with its JSON path), NOT_FOUND
 * (no such file), the tiers' errors. */
int tier_store_open(const char* profile_path, const tier_key* ns, uint32_t rank, tier_store** out);
int tier_store_open_json(const char* profile_json, const tier_key* ns, uint32_t rank,
                         tier_store** out);
/* Waits for queued asynchronous batches and background work (bounded by the profile's timeout),
 * then closes the tiers. Completions not yet taken are discarded. */
void tier_store_close(tier_store* store);

size_t tier_store_tier_count(tier_store* store);
/* The name of tier `index` (valid while the store is open), or NULL. */
const char* tier_store_tier_name(tier_store* store, size_t index);

/* Counters (docs/metrics.md) as JSON text and as Prometheus text format 0.0.4; free with
 * tier_free. */
int tier_store_metrics_json(tier_store* store, char** out);
int tier_store_metrics_prometheus(tier_store* store, char** out);

/* Registers memory with a store until tier_memory_release. TIER_MEMORY_PINNED page-locks the
 * host range through the GPU runtime (NOT_SUPPORTED in a build without it, or with no GPU);
 * host regions inside a registered pinned range are then moved as pinned. HOST and DEVICE record
 * the range (DEVICE: INVALID_ARGUMENT for device < 0). The registration must be released before
 * its store is closed. */
typedef struct tier_memory tier_memory;
int tier_memory_register(tier_store* store, void* ptr, size_t bytes, int32_t kind, int32_t device,
                         tier_memory** out);
int tier_memory_release(tier_memory* memory);

/* One object of a batch: its key (in the store's namespace and rank) and its bytes as a
 * scatter/gather list (the object is the regions' bytes concatenated in order). A list is all
 * host memory (HOST, PINNED, SHM) or all DEVICE memory of one GPU. */
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
/* Blocking batch save: codes[i] is TIER_OK (stored, or stored already: put-if-absent) or the
 * first writable tier's error for item i. The call's own status is an error only when the batch
 * could not be attempted (INVALID_ARGUMENT: a malformed region list; BAD_STATE). */
int tier_store_save(tier_store* store, const tier_item* items, size_t count, int32_t* codes);
/* Blocking batch load: codes[i] is TIER_OK, TIER_NOT_FOUND (a miss) or the decode error of item i
 * (INVALID_ARGUMENT when the regions' size differs from the stored object's: nothing written).
 * tiers (may be NULL) receives the index of the tier that served each item, or -1. */
int tier_store_load(tier_store* store, const tier_item* items, size_t count, int32_t* codes,
                    int32_t* tiers);
/* Removes each key from every tier; codes[i] as tier::TierStack::remove. */
int tier_store_remove(tier_store* store, const tier_key* keys, size_t count, int32_t* codes);
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
/* Blocks until `ticket` (0: any) completes, up to timeout_ms (< 0: no limit).
 * Errors: TIMED_OUT, NOT_FOUND (a ticket never issued or already taken). */
int tier_store_wait(tier_store* store, uint64_t ticket, int64_t timeout_ms, tier_completion** out);
uint64_t tier_completion_ticket(const tier_completion* c);
int32_t tier_completion_op(const tier_completion* c); /* TIER_OP_* */
/* The batch status (what the blocking call would have returned). */
int32_t tier_completion_status(const tier_completion* c);
size_t tier_completion_count(const tier_completion* c);
/* Per-item codes and (loads) serving tiers, `count` each; valid until tier_completion_free. */
const int32_t* tier_completion_codes(const tier_completion* c);
const int32_t* tier_completion_tiers(const tier_completion* c);
void tier_completion_free(tier_completion* c);

/* ---- Offload engine (docs/engine.md) with the DSV4 layout --------------------------------- */

/* The KV memory of one TP rank in the DSV4 layout (layouts/dsv4), allocated and zeroed by
 * the library. `geometry` is a preset name ("v4-pro-fp8", ...) or a model description as JSON
 * text ({"preset": ..., "num_blocks": ..., "num_slots": ...}); `options_json` (NULL: host) is
 * {"memory": "host" | "device", "device": 0}. Errors: INVALID_ARGUMENT, NOT_SUPPORTED (device
 * memory without a GPU), NO_SPACE, DEVICE_ERROR. */
typedef struct tier_dsv4_layout tier_dsv4_layout;
int tier_dsv4_layout_create(const char* geometry, const tier_key* page_ns, uint32_t tp_size,
                            uint32_t tp_rank, const char* options_json, tier_dsv4_layout** out);
void tier_dsv4_layout_destroy(tier_dsv4_layout* layout);
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

/* One rank's terminal result for one operation on one channel. `reason` is a stable string
 * ("" on success) with static lifetime when the report comes from tier_worker_take_reports. */
typedef struct tier_op_report {
  int32_t channel; /* TIER_CHANNEL_* */
  uint32_t rank;
  uint64_t request;
  uint64_t generation;
  int32_t ok;
  const char* reason;
} tier_op_report;

/* A worker: one TP rank's mover between its layout and its store. `config_json` is the
 * EngineConfig JSON (NULL or "{}": defaults); `page_ns` the PAGE namespace. The store and layout
 * must outlive the worker. */
typedef struct tier_worker tier_worker;
int tier_worker_create(const char* config_json, const tier_key* page_ns, uint32_t rank,
                       tier_store* store, tier_dsv4_layout* layout, tier_worker** out);
void tier_worker_destroy(tier_worker* worker);

/* A step's plan from tier_scheduler_build_step; the same plan goes to every rank's worker. */
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
void tier_plan_free(tier_plan* plan);

/* Queues the plan's operations on this rank. The caller's GPU work is taken as synchronized:
 * with a device layout and a SLOT save in the plan, the call waits for the snapshot's copy (the
 * caller may change the state group as soon as it returns); it never waits for a tier. */
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

/* The scheduler, with rank 0's worker as its view of the tiers. */
typedef struct tier_scheduler tier_scheduler;
int tier_scheduler_create(const char* config_json, const tier_key* page_ns, tier_worker* view,
                          tier_scheduler** out);
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

#ifdef __cplusplus
}
#endif

#endif /* TIER_TIER_H_ */
