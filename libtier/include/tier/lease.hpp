#pragma once
// LeaseTable: the bookkeeping of lookup leases (Backend::lease, docs/leases.md) for a backend
// whose index lives in this process (the heap and pinned CPU modes, the disk tier): which keys
// each lease holds and until when, and how many leases hold each key. Expiry is lazy: expire()
// ends every lease whose deadline has passed; a backend calls it before it picks an eviction
// victim, so a lease never outlives its deadline by more than the time until the next eviction,
// and nothing is evicted while it is held.
//
// Each hold carries a `tag` of the backend's choosing (the disk tier: the region that holds the
// object), handed back when the hold ends. Threads: the backend's owner thread only.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tier/backend.hpp"
#include "tier/key.hpp"

namespace tier {

class LeaseTable {
 public:
  using Clock = std::chrono::steady_clock;
  struct Hold {
    ObjectKey key;
    std::uint32_t tag = 0;
  };
  // Called for each hold of a lease that ends.
  using OnEnd = std::function<void(const Hold&)>;

  // A lease of `holds` until `deadline`. Returns its id, 0 when `holds` is empty (no lease).
  LeaseId add(Clock::time_point deadline, std::vector<Hold> holds);
  // Ends lease `id`: kExpired when its deadline is <= `now`, kReleased before, kUnknown when it
  // ended already.
  LeaseEnd end(LeaseId id, Clock::time_point now, const OnEnd& on_end = {});
  // Ends every lease whose deadline is <= `now`. Returns how many (the backend counts them in
  // metrics().lease_expiries). Cheap when none is due.
  std::uint64_t expire(Clock::time_point now, const OnEnd& on_end = {});

  // Whether a lease that has not ended holds `key` (call expire() first for an exact answer).
  bool held(const ObjectKey& key) const noexcept { return !counts_.empty() && counts_.count(key); }
  // Leases that have not ended.
  std::size_t active() const noexcept { return leases_.size(); }

 private:
  struct Lease {
    Clock::time_point deadline;
    std::vector<Hold> holds;
  };
  void drop(std::map<LeaseId, Lease>::iterator it, const OnEnd& on_end);

  std::map<LeaseId, Lease> leases_;
  std::unordered_map<ObjectKey, std::uint32_t> counts_;    // key -> leases that hold it
  Clock::time_point earliest_ = Clock::time_point::max();  // no lease is due before it
  LeaseId next_ = 1;
};

}  // namespace tier
