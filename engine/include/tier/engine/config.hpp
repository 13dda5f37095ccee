#pragma once
// EngineConfig: the offload engine's settings, shared by the scheduler and every worker.
//
// JSON form (strict: unknown keys and wrong types are errors, reported with their JSON pointer):
//   {"block_tokens": 256, "chunk_tokens": 256, "checkpoint_interval_tokens": 8192,
//    "min_load_tokens": 8192, "stateful": true, "tp_size": 1, "max_pending_saves": 2,
//    "commit_index_capacity": 65536, "tombstone_limit": 4096, "publication_timeout_ms": 0,
//    "publication_poll_interval_ms": 10, "lease_timeout_ms": 10000}
// The PAGE namespace is not part of the JSON: the caller derives it from the model identity
// (tier::namespace_id) and sets `page_namespace`.

#include <cstdint>
#include <span>
#include <vector>

#include "tier/json.hpp"
#include "tier/key.hpp"
#include "tier/options.hpp"
#include "tier/status.hpp"

namespace tier::engine {

struct EngineConfig {
  std::uint32_t block_tokens = 256;  // hash block: scheduler block size x DCP
  std::uint32_t chunk_tokens = 256;  // PAGE chunk = resume alignment; a multiple of block_tokens
  // SLOT cadence: > 0 a rung every N tokens (snapped down to block_tokens, then lcm with the
  // chunk); 0 no SLOT saves; -1 no ladder, only the prompt-end anchor (docs/engine.md).
  std::int64_t checkpoint_interval_tokens = 8192;
  std::uint64_t min_load_tokens = 8192;  // smaller hits are recomputed ("too_small")
  bool stateful = true;                  // hybrid model: a resume needs PAGE and SLOT
  std::uint32_t tp_size = 1;             // ranks that must all report an operation (<= 64)
  std::uint32_t max_pending_saves = 2;   // per worker: queued + running saves; more are rejected
  std::uint64_t commit_index_capacity = 65536;  // in-memory LRU of committed boundaries
  std::uint64_t tombstone_limit = 4096;         // terminal ids remembered per channel
  // Publication polling (a SLOT save, on the worker): how long the PAGE prefix and then the
  // stored sidecar may take to become visible in a readable tier, probed every
  // `publication_poll_interval_ms`. 0 = exactly one probe each (TierStack::save returns only
  // after the first writable tier completed the put, so its objects are visible at once).
  std::uint64_t publication_timeout_ms = 0;
  std::uint64_t publication_poll_interval_ms = 10;
  // Lookup leases (docs/engine.md "Lookup leases"): a lookup's hit, its PAGE chunks and SLOT
  // sidecar, is held against eviction in rank 0's tiers until the load completes or fails on rank
  // 0, the hit is not used, or this many milliseconds pass. 0: no leases (a hit may be evicted
  // before its load, which then fails).
  std::uint64_t lease_timeout_ms = 10000;
  Key128 page_namespace;                        // set by the caller

  static std::span<const OptionSpec> options();
  // Errors: InvalidArgument listing every problem with its JSON pointer.
  static Result<EngineConfig> from_json(const Json& j);
  Json to_json() const;
  // Errors: InvalidArgument (chunk not a multiple of block, tp_size 0 or > 64, ...).
  Status validate() const;

  // The resolved SLOT rung spacing in tokens: lcm(snapped interval, chunk), 0 when off or when
  // the interval snaps to 0, and -1 for anchor-only.
  std::int64_t sidecar_interval() const noexcept;
  // The SLOT boundaries of a prompt of `prompt_tokens` tokens, ascending.
  std::vector<std::uint64_t> slot_boundaries(std::uint64_t prompt_tokens) const;
  bool is_slot_boundary(std::uint64_t tokens, std::uint64_t prompt_tokens) const noexcept;
};

}  // namespace tier::engine
