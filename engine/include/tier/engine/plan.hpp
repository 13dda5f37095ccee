#pragma once
// The messages between the scheduler side and the worker side of the offload engine.
//
// The scheduler (one per engine, on the engine's scheduler thread) emits one StepPlan per step,
// also when the engine has no batch (idle progress). Every TP rank's Worker receives the same
// plan, moves bytes, and answers with OpReports; the scheduler's Aggregator waits for the same
// exact operation from every rank before it acts (tier/engine/aggregator.hpp).
//
// Operation ids: `generation` comes from a scheduler-lifetime counter shared by loads and saves
// and is never reused, not even after the engine reuses a request id, nor by a restarted scheduler
// whose workers still hold the old one's operations: its high 24 bits are the scheduler's epoch
// (Scheduler::epoch(), drawn at random per scheduler, never 0), the low 40 bits the counter. A
// report is matched by generation only; `request` is carried for logs and for the engine's own
// bookkeeping.

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "tier/key.hpp"

namespace tier::engine {

using RequestId = std::uint64_t;  // the engine's request id; it may be reused after a request ends

struct OperationId {
  RequestId request = 0;
  std::uint64_t generation = 0;  // never 0 for a real operation; never reused
  friend bool operator==(const OperationId&, const OperationId&) = default;
};

// Generation = epoch << kEpochShift | counter.
inline constexpr unsigned kEpochShift = 40;
inline constexpr std::uint32_t epoch_of(std::uint64_t generation) noexcept {
  return static_cast<std::uint32_t>(generation >> kEpochShift);
}

// A SLOT boundary: `tokens` is a multiple of the chunk size; `key` is the chained PAGE chunk key
// of the prefix [0, tokens), so it names the exact token content of the prefix (its low 64 bits
// are the AOS1 `boundary_block_hash`).
struct Boundary {
  std::uint64_t tokens = 0;
  Key128 key;
  friend bool operator==(const Boundary&, const Boundary&) = default;
};

// Loads PAGE chunks [page_start, page_end) into the request's blocks, then (stateful) the
// SLOT of `slot` into `slot_group`. All or nothing per rank.
struct LoadOp {
  OperationId id;
  std::uint64_t page_start = 0;  // tokens the engine already holds (its own prefix cache)
  std::uint64_t page_end = 0;    // tokens the request holds once the load succeeds
  std::vector<Key128> chunk_keys;        // keys of the chunks covering [page_start, page_end), in order
  std::vector<std::uint32_t> block_ids;  // destination blocks of those chunks, in order
  std::optional<Boundary> slot;          // stateful only
  std::int32_t slot_group = -1;          // destination state group (stateful only)
  // The lookup lease that holds this load's chunks and sidecar in the tiers of the worker that
  // took it (rank 0, the scheduler's TierView); that worker releases it when the load ends. 0:
  // none. Other ranks ignore it.
  std::uint64_t lease = 0;
};

// Saves PAGE chunks [page_start, page_end) from the request's blocks and, when `slot` is set,
// publishes the SLOT of `slot_group` for that boundary once PAGE is visible through it.
// The PAGE part and the SLOT part report under the same OperationId on separate channels.
struct SaveOp {
  OperationId id;
  std::uint64_t page_start = 0;
  std::uint64_t page_end = 0;
  std::vector<Key128> chunk_keys;        // keys of the chunks covering [page_start, page_end)
  std::vector<std::uint32_t> block_ids;  // source blocks of those chunks, in order
  std::optional<Boundary> slot;
  std::vector<Key128> prefix_keys;  // keys of [0, slot->tokens): the visibility check
  std::int32_t slot_group = -1;
};

struct StepPlan {
  std::uint64_t step = 0;
  std::vector<LoadOp> loads;
  std::vector<SaveOp> saves;
  bool has_work() const noexcept { return !loads.empty() || !saves.empty(); }
};

// The completion channels. A save reports on kPageSave and, if it carried a SLOT, on kSlotSave.
enum class Channel : std::uint8_t { kLoad = 0, kPageSave = 1, kSlotSave = 2 };
inline constexpr std::size_t kChannelCount = 3;
std::string_view channel_name(Channel c) noexcept;

// How one rank's operation on one channel ended. The numbers are stable (they cross the C API,
// the Python package and any wire an engine sends reports over); outcome_name() gives the stable
// string that counters, logs and JSON print ("" for kOk, "unknown" for a number not listed here).
enum class WorkerOutcome : std::uint8_t {
  kOk = 0,
  // Loads.
  kPageUnavailable = 1,          // a PAGE chunk missing, invalid or unaligned: no SLOT fetched
  kMissingDestinationGroup = 2,  // the load names no valid state group
  kSidecarCodec = 3,             // the layout gave no SLOT codec for the boundary's identity
  kSidecarUnavailable = 4,       // no sidecar under the key (or the tier failed to read it)
  kSidecarCorrupt = 5,           // the sidecar failed its checks; its key was invalidated
  // Saves.
  kMaxPendingSaves = 6,           // refused at submit(): too many saves queued
  kSnapshot = 7,                  // the SLOT snapshot could not be taken, or its copy failed
  kPageStore = 8,                 // a PAGE chunk was not stored: the SLOT is not published
  kPageVisibility = 9,            // the PAGE visibility probe failed
  kPageVisibilityTimeout = 10,    // the PAGE prefix never showed through the boundary
  kSidecarInvalidation = 11,      // the key is fenced and its corrupt copy could not be removed
  kSidecarSubmission = 12,        // the sidecar put failed
  kSidecarVisibility = 13,        // the sidecar visibility probe failed
  kSidecarVisibilityTimeout = 14,  // the stored sidecar never showed
  // Both.
  kDeviceOrder = 15,  // submit(): the layout could not order the step after the caller's GPU work
  // Reported for a rank by whoever watches it (a scheduler process whose rank process died).
  kRankLost = 16,  // the rank died before it reported the operation
};
inline constexpr std::uint8_t kWorkerOutcomeCount = 17;
// Static strings (NUL-terminated, never freed).
std::string_view outcome_name(WorkerOutcome o) noexcept;
// The outcome a stable string names (what outcome_name() returns), or nullopt.
std::optional<WorkerOutcome> outcome_from_name(std::string_view name) noexcept;

// One rank's terminal result for one operation on one channel: plain data (no pointer, no
// string), so it can be copied to another process as it is.
struct OpReport {
  Channel channel = Channel::kLoad;
  OperationId id;
  std::uint32_t rank = 0;
  WorkerOutcome outcome = WorkerOutcome::kOk;
  bool ok() const noexcept { return outcome == WorkerOutcome::kOk; }
};

}  // namespace tier::engine
