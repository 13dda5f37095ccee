#pragma once
// Aggregator: the TP quorum over exact operations.
//
// Every rank reports each operation once per channel. The aggregator emits one terminal per
// (channel, generation) when all `world_size` ranks have reported it:
//  - success only if every rank succeeded; any failure wins (a later success, even a duplicate
//    from the same rank, cannot turn it back);
//  - a duplicate report from a rank does not count towards the quorum;
//  - reports for different generations never combine, even for the same request id;
//  - terminal ids are tombstoned in a bounded FIFO (`tombstone_limit` per channel), so a late
//    duplicate cannot recreate pending state for an id that already completed;
//  - with an epoch (not 0), reports of another epoch's generations (a previous scheduler's
//    operations, still run by live workers) are dropped without a trace.
//
// Threads: one owner (the scheduler thread).

#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "tier/engine/plan.hpp"

namespace tier::engine {

struct Terminal {
  Channel channel = Channel::kLoad;
  OperationId id;
  WorkerOutcome outcome = WorkerOutcome::kOk;  // the first failing rank's (kOk on success)
  bool ok() const noexcept { return outcome == WorkerOutcome::kOk; }
};

class Aggregator {
 public:
  explicit Aggregator(std::uint32_t world_size, std::size_t tombstone_limit = 4096,
                      std::uint32_t epoch = 0);

  // Adds one report. Returns the terminal once every rank has reported this exact operation on
  // this channel; nullopt while waiting, and for reports that are ignored (rank out of range,
  // generation 0, another epoch's generation, an already terminal or tombstoned id).
  std::optional<Terminal> add(const OpReport& report);

  std::size_t pending() const noexcept;     // operations with some but not all reports
  std::size_t tombstones() const noexcept;  // tombstoned ids over all channels
  std::uint32_t world_size() const noexcept { return world_size_; }
  // Forgets pending groups and tombstones (a scheduler restart).
  void reset();

 private:
  struct Group {
    std::uint64_t reported = 0;  // bit per rank (world_size <= 64)
    std::uint32_t count = 0;
    WorkerOutcome outcome = WorkerOutcome::kOk;
    RequestId request = 0;
  };
  struct PerChannel {
    std::unordered_map<std::uint64_t, Group> groups;
    std::unordered_set<std::uint64_t> dead;
    std::deque<std::uint64_t> dead_order;
  };
  void tombstone(PerChannel& ch, std::uint64_t generation);

  std::uint32_t world_size_;
  std::size_t tombstone_limit_;
  std::uint32_t epoch_;
  PerChannel channels_[kChannelCount];
};

}  // namespace tier::engine
