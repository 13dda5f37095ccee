#pragma once
// The messages between the scheduler side and the worker side of the offload engine.
//
// The scheduler (one per engine, on the engine's scheduler thread) emits one StepPlan per step,
// also when the engine has no batch (idle progress). Every TP rank's Worker receives the same
// plan, moves bytes, and answers with OpReports; the scheduler's Aggregator waits for the same
// exact operation from every rank before it acts (tier/engine/aggregator.hpp).
//
// Operation ids: `generation` comes from a scheduler-lifetime counter shared by loads and saves
// and is never reused, not even after the engine reuses a request id. A report is matched by
// generation only; `request` is carried for logs and for the engine's own bookkeeping.

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

// One rank's terminal result for one operation on one channel. `reason` is a stable string from
// the list in docs/engine.md ("" on success).
struct OpReport {
  Channel channel = Channel::kLoad;
  OperationId id;
  std::uint32_t rank = 0;
  bool ok = false;
  std::string_view reason;
};

}  // namespace tier::engine
