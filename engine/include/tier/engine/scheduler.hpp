#pragma once
// Scheduler: the scheduler-side half of the offload engine (the engine's scheduler thread).
//
// It decides what to load and save and never touches KV memory. Per request:
//
//   h = add_request(id, prompt)              new request
//   m = lookup(h)                            before the HBM prefix match: cached prefix in tiers
//   d = after_alloc(h, local, blocks, group)   after block allocation: load or recompute (reasons)
//   n = cut_prefill_chunk(h, start, n)       chunked prefill lands exactly on SLOT boundaries
//   on_computed(h, tokens)                   after each forward that computed tokens
//   finish(h)                                request done; true = free its blocks now
// Per step (also when the engine has no batch: idle progress):
//   plan = build_step()                      loads and saves for every worker
//   ev = process(reports)                    aggregated terminals: loaded, load_failed, freeable
//
// Request handles are never reused, so a request id that the engine reuses never inherits an
// earlier request's state; operation generations are never reused (tier/engine/plan.hpp), not
// by a scheduler restarted while its workers still run the old one's operations either: each
// scheduler has an epoch of its own in its generations, and ignores reports of other epochs.
//
// Fail-closed resume (stateful): a prefix is offered only at a committed SLOT boundary; a load
// succeeds only if PAGE coverage and the SLOT restore succeed on every rank for the exact load
// generation. Any failure means recompute, the boundary is de-committed (index and persisted
// commit record), and the save watermark drops back to the HBM floor. A PAGE-only stateful
// prefix is never offered.
//
// Commits survive restarts: each committed boundary is also written to the tiers as a small
// commit record (TierView::put_commit). The in-memory index is an LRU cache over those records; a
// lookup that misses it probes the tiers for the record and re-adds a boundary it finds. A
// de-committed boundary whose record could not be removed stays revoked in memory.
//
// Lookup leases (config lease_timeout_ms > 0; docs/engine.md "Lookup leases"): a lookup that
// reports a hit leases its PAGE chunks [0, hit) and, stateful, the boundary's SLOT sidecar through
// the TierView, so evictions between the lookup and the load cannot take them. A committed
// boundary whose sidecar is gone is de-committed at lookup and the next lower one is tried. The
// lease moves into the LoadOp (the worker that took it releases it when the load ends); a hit that
// is not loaded (after_alloc rejects it, a new lookup, finish) releases it at once.
//
// Threads: one owner thread. TierView calls are synchronous.

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tier/engine/aggregator.hpp"
#include "tier/engine/config.hpp"
#include "tier/engine/counters.hpp"
#include "tier/engine/plan.hpp"
#include "tier/status.hpp"

namespace tier::engine {

// What a lookup lease holds (TierView::lease).
struct ViewLease {
  std::size_t chunks = 0;  // leading chunks of the leased keys that are held
  bool slot = false;       // the boundary's sidecar is held
  std::uint64_t id = 0;    // what release_lease() takes; 0: nothing to release
};

// What the scheduler reads and writes in the tiers: rank 0's view (lookup is rank-0
// authoritative, as in the reference). Implemented by Worker.
class TierView {
 public:
  virtual ~TierView() = default;
  // Number of leading chunks of `chunk_keys` present in a readable tier.
  virtual Result<std::size_t> lookup_prefix(std::span<const Key128> chunk_keys) = 0;
  // Whether a valid commit record for `b` is stored. Errors only for tier failures.
  virtual Result<bool> has_commit(const Boundary& b) = 0;
  virtual Status put_commit(const Boundary& b) = 0;
  // Ok only when no tier holds the record afterwards.
  virtual Status remove_commit(const Boundary& b) = 0;
  // Leases the chunks `chunk_keys` and, when `slot` is set, the sidecar of that boundary against
  // eviction for `ttl` (docs/leases.md). Returns what is held; NotSupported when the view cannot
  // lease (the default: the scheduler then goes on without leases).
  virtual Result<ViewLease> lease(std::span<const Key128> chunk_keys,
                                  const std::optional<Boundary>& slot,
                                  std::chrono::milliseconds ttl);
  // Ends a lease this view handed out; other ids are ignored.
  virtual void release_lease(std::uint64_t id);
};

using SeqHandle = std::uint64_t;

struct MatchResult {
  std::uint64_t tokens = 0;      // tokens the tiers can provide (0: none)
  bool park = false;             // true: the load is asynchronous; wait for process()
  std::uint64_t page_hit = 0;    // PAGE prefix present in the tiers (before the SLOT shrink)
  std::optional<Boundary> slot;  // the committed boundary the load resumes from (stateful)
};

enum class LoadAction : std::uint8_t {
  kNone,       // nothing to load (HBM already has it, or no hit)
  kLoad,       // a LoadOp follows in the next build_step(); keep the request parked
  kRecompute,  // the hit is not used; prefill from the HBM floor
  kHandoff,    // dense only: prefill to `handoff_tokens`, then call after_alloc again
};
std::string_view load_action_name(LoadAction a) noexcept;

struct LoadDecision {
  LoadAction action = LoadAction::kNone;
  // hbm_satisfies_after_alloc, stateful_nonzero_hbm_floor, missing_destination_group,
  // missing_destination_blocks, unaligned_hbm_prefill, too_small, aligned_large_hit, no_hit
  std::string_view reason;
  std::uint64_t load_start = 0, load_end = 0;  // kLoad: [local tokens, hit tokens)
  std::uint64_t handoff_tokens = 0;            // kHandoff
};

struct StepEvents {
  std::vector<SeqHandle> loaded;       // load succeeded: the request holds its hit tokens now
  std::vector<SeqHandle> load_failed;  // recompute from the HBM floor
  std::vector<SeqHandle> freeable;     // finished earlier; its blocks may be freed now
  std::vector<Terminal> terminals;     // every aggregated terminal, in order (for logs)
};

class Scheduler {
 public:
  // `epoch`: the high bits of every generation this scheduler emits (tier/engine/plan.hpp); 0
  // draws one at random (std::random_device), which is what an engine wants: a restarted
  // scheduler then never emits a generation its live workers still hold. Errors:
  // InvalidArgument (config, an epoch that does not fit in 24 bits).
  static Result<std::unique_ptr<Scheduler>> create(const EngineConfig& config, TierView& view,
                                                   std::uint32_t epoch = 0);
  std::uint32_t epoch() const noexcept { return epoch_; }

  // Registers a request with its prompt tokens. `extra_key`: what besides the tokens makes its
  // KV differ (LoRA adapter, multimodal content hashes, cache salt; docs/keys.md), mixed into
  // every chunk key (tier::chunk_keys); empty: none.
  SeqHandle add_request(RequestId id, std::span<const std::uint32_t> prompt,
                        std::string_view extra_key = {});

  // The request's cached prefix: PAGE chunks present in the tiers, minus the last token on a
  // full-prompt hit, then (stateful) shrunk to the newest committed SLOT boundary. A stateful
  // PAGE hit with no committed boundary is no hit. Errors: NotFound (unknown handle), tier
  // errors from the view.
  Result<MatchResult> lookup(SeqHandle h);

  // After the engine allocated blocks: `local_tokens` is the engine's own prefix-cache hit now (tokens already in its KV memory), `blocks`
  // the request's block table (at least up to the hit), `slot_group` its state group (-1: none).
  LoadDecision after_alloc(SeqHandle h, std::uint64_t local_tokens,
                           std::span<const std::uint32_t> blocks, std::int32_t slot_group);
  // Replaces the block table (it grew during prefill).
  void set_blocks(SeqHandle h, std::span<const std::uint32_t> blocks);

  // Caps a prefill chunk [start, start + len) so it ends on the next SLOT boundary that still
  // needs saving; returns the new length (>= 1).
  std::uint64_t cut_prefill_chunk(SeqHandle h, std::uint64_t start, std::uint64_t len) const;
  // The request has `computed_tokens` tokens of KV in HBM (prompt plus output).
  void on_computed(SeqHandle h, std::uint64_t computed_tokens);

  // The operations of this step. Call every step, and when idle.
  StepPlan build_step();
  // Feeds reports from the workers (any order, any rank).
  StepEvents process(std::span<const OpReport> reports);

  // True while a save still reads the request's blocks, a save is still to be emitted, or a
  // load still writes them.
  bool should_defer_free(SeqHandle h) const;
  // The request is done. Returns true when its blocks may be freed now; otherwise they are
  // freed once process() lists the handle in `freeable`. An armed load is dropped.
  bool finish(SeqHandle h);

  const EngineConfig& config() const noexcept { return config_; }
  EngineCounters& counters() noexcept { return counters_; }
  const EngineCounters& counters() const noexcept { return counters_; }
  std::uint64_t loads_pending() const noexcept;
  std::uint64_t saves_pending() const noexcept { return saves_.size(); }
  std::size_t tracked_requests() const noexcept { return seqs_.size(); }
  // In-memory commit index (not the persisted records).
  bool is_committed(const Boundary& b) const;
  std::size_t committed_count() const noexcept { return index_.size(); }
  // Save watermark and pending SLOT load of a request (for tests and logs).
  std::uint64_t saved_watermark(SeqHandle h) const;
  std::optional<Boundary> pending_slot_load(SeqHandle h) const;
  const Aggregator& aggregator() const noexcept { return agg_; }
  // Failed load terminals (those counted in load_failures) by the reason the first failing rank
  // gave (docs/engine.md); the counts add up to load_failures.
  const std::map<std::string, std::uint64_t, std::less<>>& load_failure_reasons() const noexcept {
    return load_failure_reasons_;
  }
  // The lookup lease a request holds (not yet moved into a LoadOp), or 0. For tests and logs.
  std::uint64_t lease_of(SeqHandle h) const;

 private:
  struct ActiveLoad {
    std::uint64_t generation = 0, start = 0, end = 0;
    std::optional<Boundary> slot;
  };
  struct SlotInflight {
    std::uint64_t generation = 0;
    Boundary boundary;
  };
  struct Seq {
    RequestId id = 0;
    std::vector<std::uint32_t> prompt;
    std::vector<Key128> keys;  // chained keys of the prompt's full chunks
    std::vector<std::uint32_t> blocks;
    std::int32_t group = -1;
    std::uint64_t computed = 0;  // the state group holds the state after exactly these tokens
    std::uint64_t slot_settled = 0;  // SLOT boundaries <= this are saved, skipped or not ours
    std::uint64_t saved = 0;  // PAGE watermark: chunks below it are saved or being saved
    std::uint64_t hit_tokens = 0;  // lookup result
    std::optional<Boundary> pending_slot;
    std::uint64_t lease = 0;  // the lookup's lease until a LoadOp takes it (TierView::lease)
    bool load_armed = false;
    std::uint64_t load_start = 0;
    std::optional<ActiveLoad> load;
    std::unordered_set<std::uint64_t> saves;  // save generations in flight
    std::optional<SlotInflight> slot_save;
    std::set<std::uint64_t> failed_slots;  // boundaries whose SLOT save failed
    bool finished = false;
  };
  struct SaveInflight {
    SeqHandle seq = 0;
    int channels = 0;  // terminals still expected
    bool ok = true;
  };
  struct LoadInflight {
    SeqHandle seq = 0;
    bool abandoned = false;
  };

  Scheduler(const EngineConfig& config, TierView& view, std::uint32_t epoch);
  Seq* find(SeqHandle h);
  const Seq* find(SeqHandle h) const;
  Boundary boundary_at(const Seq& s, std::uint64_t tokens) const;
  // Whether `b` is committed: the index, else a commit record in the tiers (then re-indexed).
  Result<bool> committed(const Boundary& b);
  void commit(const Boundary& b);
  void decommit(const Boundary& b);
  void index_add(const Key128& k);
  // The SLOT boundary to snapshot in this step: `computed` itself when it is a boundary still to
  // save. Never a boundary the state group has moved past.
  std::optional<std::uint64_t> slot_candidate(const Seq& s) const;
  // Marks every boundary below `tokens` settled; with `count`, those still to save are counted in
  // slot_boundaries_missed (the state moved past them before their snapshot).
  void settle_slots_below(Seq& s, std::uint64_t tokens, bool count);
  bool idle(const Seq& s) const;
  void clear_lookup(Seq& s);
  void release_lease(Seq& s);
  // Leases the hit [0, tokens) and (stateful) the sidecar of `slot`. nullopt when the view
  // cannot lease.
  Result<std::optional<ViewLease>> lease_hit(const Seq& s, std::uint64_t tokens,
                                             const std::optional<Boundary>& slot);
  void on_load_terminal(const Terminal& t, StepEvents& ev);
  void on_save_terminal(const Terminal& t, StepEvents& ev);
  void maybe_release(SeqHandle h, StepEvents& ev);
  std::vector<std::uint32_t> blocks_of(const Seq& s, std::uint64_t start, std::uint64_t end) const;

  EngineConfig config_;
  TierView& view_;
  std::uint32_t epoch_;
  Aggregator agg_;
  EngineCounters counters_;
  std::uint64_t next_handle_ = 1;
  std::uint64_t next_generation_ = 1;
  std::uint64_t step_ = 0;
  std::unordered_map<SeqHandle, Seq> seqs_;
  std::vector<SeqHandle> order_;  // handles in arrival order (deterministic plans)
  std::unordered_map<std::uint64_t, LoadInflight> loads_;
  std::unordered_map<std::uint64_t, SaveInflight> saves_;
  // Commit index: LRU over boundary keys, most recent at the front.
  std::list<Key128> lru_;
  std::unordered_map<Key128, std::list<Key128>::iterator> index_;
  std::unordered_set<Key128> revoked_;  // de-committed; their records may still exist
  std::map<std::string, std::uint64_t, std::less<>> load_failure_reasons_;
};

}  // namespace tier::engine
