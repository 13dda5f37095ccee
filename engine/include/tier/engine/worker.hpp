#pragma once
// Worker: the worker-side half of the offload engine, one per TP rank. It moves PAGE chunks and
// SLOT sidecars between the rank's KV memory and its TierStack, and reports every operation.
//
//   worker.submit(plan, after)   the step's plan (same on every rank); never blocks; `after`:
//                                the caller's GPU work the plan's transfers follow (DeviceOrder)
//   worker.progress()            runs queued loads, then queued saves, on the caller's thread;
//                                the engine calls it every step and when idle
//   reports = take_reports()     to the scheduler (Scheduler::process)
//
// Loads (all or nothing on this rank): every PAGE chunk of [page_start, page_end) must load (a missing
// chunk or an unaligned floor is `page_unavailable`, and the SLOT is then never fetched); then
// the SLOT of the boundary is decoded by a codec bound to the boundary's identity, which checks
// it before writing any byte of the state group. A missing sidecar is `sidecar_unavailable`; a
// corrupt or foreign one is `sidecar_corrupt` and its key is invalidated in every tier.
//
// Saves: accepted only while fewer than `max_pending_saves` are queued or running (else rejected
// at once with `max_pending_saves`, never waited for). A SLOT save snapshots the state group at
// submit(), before the next forward can change it (KvLayout::snapshot_slot: with a DeviceOrder
// naming the caller's stream, a copy enqueued on that stream, framed later by progress()). At
// run time: PAGE chunks are stored (any
// failure: `page_store`, and the SLOT is not published); the PAGE prefix must be visible through
// the boundary; a key fenced by a failed invalidation must be removed first
// (`sidecar_invalidation`); then the sidecar is stored and must be visible. Visibility is polled
// every `publication_poll_interval_ms` until `publication_timeout_ms` has passed (0: one probe):
// `page_visibility_timeout` / `sidecar_visibility_timeout` when it never shows, and
// `page_visibility` / `sidecar_visibility` at once when the probe itself fails. A save that
// polls holds the thread running progress() for up to that timeout, never a lock that submit()
// or a lookup takes. A SLOT save that fails is never committed.
//
// A PAGE chunk that fails its checks (or was stored by another layout) fails the load as
// `page_unavailable` and is invalidated the same way, so the recomputed chunk can replace it.
//
// Corruption fence: when an invalidation cannot remove a corrupt sidecar or chunk from every
// tier, its key stays fenced and every later put of it first retries the removal; it is refused
// while that fails (`sidecar_invalidation`, or `page_store` for a chunk), because tiers are
// put-if-absent and the corrupt copy would otherwise stay.
//
// Lookup leases: as the scheduler's TierView, lease() holds PAGE chunks and a sidecar in this
// rank's TierStack (TierStack::lease); the LoadOp that carries the lease's id releases it when
// this worker's load of it ends, ok or failed (release_lease() for one that is never loaded).
// Ids this worker did not hand out are ignored, so every rank may see the same plan. Every other
// rank (with lease_timeout_ms > 0) leases the op's chunks and sidecar in its own TierStack when
// submit() queues the load, and releases that lease when its load ends: with TP > 1 each rank's
// copies are held too, from the plan's arrival on.
//
// Device transfers (KV in GPU memory, docs/engine.md): the layout moves bytes on the streams of
// its GPU's copy context, ordered after the DeviceOrder given to submit() on the device; an
// operation is reported once an event behind its transfers has completed (progress() waits for
// that event on its own thread), so the caller's next forward overlaps the previous step's saves
// when progress() runs on another thread. A load is one unit: per-layer waits are not offered.
//
// Threads: every method may be called from any thread.
//  - submit() waits for no operation and no transfer: it appends to the queues under a short
//    lock. A SLOT snapshot is started before it returns. With a device layout and a DeviceOrder
//    that names the caller's stream, it is one kernel enqueued on that stream (ahead of the next
//    forward) and a copy to pinned host memory behind it: submit() waits for neither. With an
//    empty order, or an event alone, nothing orders the caller's next write of the state group
//    after the snapshot, so submit() waits for the snapshot's copy (and, with an event, for that
//    event first). A layout without snapshot_slot() is encoded under the worker's layout lock,
//    which may wait for an encode or decode of progress() in flight, never for a tier.
//  - progress() runs the operations without that lock; two progress() calls run one after the
//    other.
//  - The TierView calls (lookup_prefix, has_commit, put_commit, remove_commit) go to the
//    TierStack directly, which runs concurrent calls in parallel (tier/tier_stack.hpp, Threads):
//    a lookup never waits for a running save's put, copy or visibility wait.
//  - The KvLayout is called by submit() and progress() one call at a time (the worker serialises
//    them), so a layout that is "one caller at a time" needs nothing more.

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "tier/codec.hpp"
#include "tier/engine/config.hpp"
#include "tier/engine/plan.hpp"
#include "tier/engine/scheduler.hpp"
#include "tier/region.hpp"
#include "tier/tier_stack.hpp"

namespace tier::engine {

// The identity a SLOT sidecar is framed with and checked against (the AOS1 header fields).
struct SlotIdentity {
  std::uint64_t boundary_tokens = 0;
  std::uint64_t boundary_hash = 0;  // Boundary::key.lo
  std::uint32_t tp_size = 1;
  std::uint32_t tp_rank = 0;
};

// The caller's GPU work that a step's device transfers must follow: handles of the caller's own
// GPU runtime (cudaStream_t / hipStream_t, cudaEvent_t / hipEvent_t, cast to void*). The engine
// never dereferences them and includes no GPU header; a layout with KV in device memory hands
// them to libtier_gpu. An empty order (both null) orders nothing: the caller has already
// synchronized its work, or the KV lives in host memory.
struct DeviceOrder {
  void* stream = nullptr;  // the compute stream that wrote this step's KV
  void* event = nullptr;   // an event recorded on it after the step's forward (used when set)
  bool empty() const noexcept { return stream == nullptr && event == nullptr; }
};

// A SLOT snapshot started by KvLayout::snapshot_slot: the state group's bytes as of submit(),
// framed as the layout's slot codec frames them.
class SlotSnapshot {
 public:
  virtual ~SlotSnapshot() = default;
  // The layout id of the codec whose frame it is (stored in the object header).
  virtual std::uint32_t format_id() const noexcept = 0;
  // Waits until the copy has landed in host memory, frames it and returns the frame, valid until
  // destruction (progress() calls it once, on its own thread). Errors: DeviceError, and the
  // codec's encode() errors.
  virtual Result<std::span<const std::byte>> frame() = 0;
};

// A row of the layout's own memory that one load writes a SLOT into before its state group
// takes it (KvLayout::stage_slot): the worker fetches the sidecar in the same TierStack call as
// the PAGE chunks (its transfer back to back with theirs, not after them) and commits the row
// only once every chunk loaded, so the state group still changes only on a whole restore.
// Destroying it releases the row. Threads: used by one thread (the worker's progress()).
class SlotStaging {
 public:
  virtual ~SlotStaging() = default;
  // The regions the load writes: shaped as slot_regions() (same count and sizes, in order).
  virtual RegionList regions() const noexcept = 0;
  // The codec that checks the sidecar's frame for these regions as slot_codec(id) checks it for
  // the state group (same identity, same refusals).
  virtual const Codec& codec() const noexcept = 0;
  // Copies the row into the state group; returns once it landed there. Errors: DeviceError.
  virtual Status commit() = 0;
};

// The model's KV memory on one rank and the codecs that move it. The DSV4 implementation binds
// the DSV4 geometry and codecs; tests and tierbench use the same interface.
class KvLayout {
 public:
  virtual ~KvLayout() = default;
  // Codec of one PAGE chunk; its payload is the chunk's image.
  virtual const Codec& page_codec() const noexcept = 0;
  // The regions of the PAGE chunk made of `block_ids` (in order), as page_codec() takes them.
  // Errors: InvalidArgument (an id out of the pool, a duplicate).
  virtual Result<std::vector<Region>> page_regions(
      std::span<const std::uint32_t> block_ids) const = 0;
  // The regions of state group `group` (one request's live SLOT). Errors: InvalidArgument.
  virtual Result<std::vector<Region>> slot_regions(std::int32_t group) const = 0;
  // A codec bound to one sidecar's identity: encode frames the SLOT image, decode checks the
  // frame against `id` (and the layout) before any byte is written. Errors: InvalidArgument.
  virtual Result<std::unique_ptr<Codec>> slot_codec(const SlotIdentity& id) const = 0;
  // A staging row for the SLOT of `group` framed for `id` (SlotStaging). Optional: a layout
  // whose loads gain nothing from fetching the sidecar with the chunks (host memory, where each
  // load is a copy by the caller's thread) keeps the default, NotSupported, and the worker
  // fetches the sidecar after them. Errors: NotSupported, Rejected (the rows are in use: the
  // worker then fetches after the chunks), InvalidArgument (group, identity), NoSpace,
  // DeviceError.
  virtual Result<std::unique_ptr<SlotStaging>> stage_slot(const SlotIdentity& id,
                                                          std::int32_t group) {
    (void)id, (void)group;
    return Status(Code::kNotSupported, "this KV layout stages no SLOT rows");
  }
  // Tokens one block id covers (for DSV4: the geometry's block_size x dcp_size). Worker::create
  // refuses an EngineConfig whose block_tokens differs. 0: the layout does not say.
  virtual std::uint32_t block_tokens() const noexcept { return 0; }
  // The identity of the SLOT frame layout as rank `tp_rank` frames it (for DSV4: the slot
  // fingerprint). The worker keys every sidecar by it (its own rank's) and every commit record
  // by rank 0's, next to the TP size, so two layouts that share a page namespace never load,
  // invalidate or de-commit each other's sidecars. All zero: the frames carry no layout identity.
  virtual std::array<std::byte, 16> slot_fingerprint(std::uint32_t tp_rank) const {
    (void)tp_rank;
    return {};
  }
  // Makes every transfer the layout's codecs enqueue from now on (on the layout's own transfer
  // stream: snapshots, saves and loads) start after the caller's work in `after`. A device-side
  // dependency: returns at once, never waits on the host, never synchronizes the device.
  // Errors: NotSupported (a non-empty order and no device memory), InvalidArgument, DeviceError.
  virtual Status order_after(const DeviceOrder& after) {
    if (after.empty()) return Status::ok();
    return Status(Code::kNotSupported, "this KV layout has no device memory to order");
  }
  // Starts a snapshot of state group `group` framed for `id`, as of now (order_after(after) was
  // called just before): the bytes the caller's work up to `after` wrote, never a later write.
  // With `after.stream` set, a device layout enqueues the copy on that stream (the caller's next
  // kernels there follow it) and waits for nothing; otherwise it has the bytes before returning.
  // Threads: the worker calls it without its layout lock, so it may run while another thread is
  // inside this layout's codecs (progress()), and must not wait for them. Errors: NotSupported,
  // the default: the worker encodes the snapshot with slot_codec() under its layout lock instead;
  // InvalidArgument, DeviceError, NoSpace (the save then fails as `snapshot`).
  virtual Result<std::unique_ptr<SlotSnapshot>> snapshot_slot(const SlotIdentity& id,
                                                              std::int32_t group,
                                                              const DeviceOrder& after) {
    (void)id, (void)group, (void)after;
    return Status(Code::kNotSupported, "this KV layout takes no asynchronous snapshots");
  }
};

struct WorkerCounters {
  Counter loads_ok, loads_failed, page_chunks_loaded, slot_restores;
  Counter saves_ok, saves_failed, page_chunks_saved, slot_publishes;
  Counter saves_rejected;      // max_pending_saves
  Counter slot_invalidations;  // corrupt sidecars removed from every tier
  Counter page_invalidations;  // corrupt (or foreign-layout) PAGE chunks removed from every tier
  Counter fenced_refusals;     // puts refused because a fenced key could not be removed
  Counter visibility_probes;   // PAGE-prefix and sidecar visibility probes of SLOT saves
};

class Worker final : public TierView {
 public:
  // `stack` and `layout` must outlive the worker. Errors: InvalidArgument (config, rank).
  static Result<std::unique_ptr<Worker>> create(const EngineConfig& config, std::uint32_t rank,
                                                TierStack& stack, KvLayout& layout);

  // Queues the plan's operations and snapshots its SLOT saves. `after`: the caller's GPU work
  // that wrote this step's KV; the layout's transfers of this plan (the snapshots taken here, the
  // saves and loads progress() runs later) start after it on the device, so the caller never
  // synchronizes its compute stream and may enqueue the next forward at once (on `after.stream`,
  // where the snapshots were enqueued: Threads above says when submit() waits). When the layout
  // cannot order them, every operation of the plan fails (`device_order`).
  void submit(const StepPlan& plan, const DeviceOrder& after = {});
  // Runs every queued load, then up to `max_saves` queued saves. Returns operations finished.
  std::size_t progress(std::size_t max_saves = SIZE_MAX);
  std::vector<OpReport> take_reports();
  // Saves accepted and not finished (queued or running): what max_pending_saves bounds.
  std::size_t queued_saves() const;
  // Loads queued and not started.
  std::size_t queued_loads() const;

  // TierView (the scheduler uses rank 0's worker).
  Result<std::size_t> lookup_prefix(std::span<const Key128> chunk_keys) override;
  Result<bool> has_commit(const Boundary& b) override;
  Status put_commit(const Boundary& b) override;
  Status remove_commit(const Boundary& b) override;
  Result<ViewLease> lease(std::span<const Key128> chunk_keys, const std::optional<Boundary>& slot,
                          std::chrono::milliseconds ttl) override;
  void release_lease(std::uint64_t id) override;
  // Leases handed out and not yet released (for tests).
  std::size_t active_leases() const;

  // Object keys on this rank.
  ObjectKey page_key(const Key128& chunk) const noexcept;
  ObjectKey slot_key(const Boundary& b) const noexcept;
  ObjectKey commit_key(const Boundary& b) const noexcept;
  bool fenced(const ObjectKey& key) const;

  std::uint32_t rank() const noexcept { return rank_; }
  const WorkerCounters& counters() const noexcept { return counters_; }
  // Bytes of PAGE and SLOT payload loaded, by the tier that served them (index = tier).
  std::vector<std::uint64_t> loaded_bytes_by_tier() const;
  // Runs `fn(stack)` between two progress() runs (metrics, flush, tests): waits for a running
  // progress() to return.
  template <class F>
  auto with_stack(F&& fn) {
    std::lock_guard<std::mutex> lock(run_mu_);
    return fn(stack_);
  }

 private:
  // The destination regions of a load's PAGE chunks, one vector per chunk (page_destinations).
  using PageDestinations = std::vector<std::vector<Region>>;
  struct QueuedLoad {
    LoadOp op;
    std::uint64_t lease = 0;  // this rank's own lease of the op's objects (submit()), or 0
    // Computed at submit() when it checked the op before leasing (the layout's regions of a
    // block never change), else by run_load().
    std::optional<PageDestinations> destinations;
  };
  struct QueuedSave {
    SaveOp op;
    std::unique_ptr<SlotSnapshot> snapshot;  // the layout's snapshot, taken at submit()
    std::vector<std::byte> staging;  // or the SLOT codec's payload, encoded at submit()
    std::uint32_t format_id = 0;     // that codec's layout id
    WorkerOutcome early_failure = WorkerOutcome::kOk;  // kSnapshot when the snapshot failed
  };
  Worker(const EngineConfig& config, std::uint32_t rank, TierStack& stack, KvLayout& layout,
         PluginPtr<Codec> identity);
  void report(Channel c, const OperationId& id, WorkerOutcome outcome);
  // The destination regions of a load's PAGE chunks, or nullopt when the operation is malformed
  // (unaligned, blocks not matching its chunks, a block named twice or outside the layout's
  // pool). Takes layout_mu_.
  std::optional<PageDestinations> page_destinations(const LoadOp& op);
  WorkerOutcome run_load(QueuedLoad& q);
  // The outcome of a sidecar fetched into `bytes` of state (counters, invalidation of a corrupt
  // one), once every PAGE chunk loaded.
  WorkerOutcome slot_outcome(const ObjectKey& key, const LoadResult& res, std::uint64_t bytes);
  void run_save(QueuedSave& q);
  WorkerOutcome save_slot(QueuedSave& q);
  // Polls `probe` until it sees the object (kOk), the probe fails (`failed`) or the publication
  // timeout passes (`timed_out`).
  WorkerOutcome await_visible(const std::function<Result<bool>()>& probe, WorkerOutcome failed,
                              WorkerOutcome timed_out);
  // Removes `key` from every tier (counting it in `removed`); fences it while that fails. True
  // when removed.
  bool invalidate(const ObjectKey& key, Counter& removed);

  // Snapshots the SLOT of `q.op` (submit(), no lock of the queues held).
  void snapshot(QueuedSave& q, const DeviceOrder& after);
  bool is_fenced(const ObjectKey& key) const;

  EngineConfig config_;
  std::uint32_t rank_;
  TierStack& stack_;
  KvLayout& layout_;
  PluginPtr<Codec> identity_;
  Key128 slot_ns_, commit_ns_;
  // Lock order: run_mu_, layout_mu_ (taken inside the TierStack's encodes and decodes, which run
  // with none of the stack's locks held), mu_; never the reverse. The stack's own locks are taken
  // inside its calls and held around no call out of it.
  std::mutex run_mu_;            // held by progress() (and with_stack) while it runs
  mutable std::mutex layout_mu_;  // one layout or layout-codec call at a time
  mutable std::mutex mu_;         // the fields below; held only for a few instructions
  std::deque<QueuedLoad> loads_;
  std::deque<QueuedSave> saves_;
  std::size_t saves_pending_ = 0;  // accepted and not finished: queued, being snapshotted, running
  std::vector<OpReport> reports_;
  std::unordered_set<ObjectKey> fenced_;
  std::unordered_set<std::uint64_t> leases_;  // TierStack lease ids handed out by lease()
  std::vector<std::uint64_t> loaded_by_tier_;
  WorkerCounters counters_;
};

}  // namespace tier::engine
