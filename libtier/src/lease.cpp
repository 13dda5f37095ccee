#include "tier/lease.hpp"

#include <algorithm>

namespace tier {

LeaseId LeaseTable::add(Clock::time_point deadline, std::vector<Hold> holds) {
  if (holds.empty()) return 0;
  for (const Hold& h : holds) ++counts_[h.key];
  const LeaseId id = next_++;
  leases_.emplace(id, Lease{deadline, std::move(holds)});
  earliest_ = std::min(earliest_, deadline);
  return id;
}

void LeaseTable::drop(std::map<LeaseId, Lease>::iterator it, const OnEnd& on_end) {
  for (const Hold& h : it->second.holds) {
    auto c = counts_.find(h.key);
    if (c != counts_.end() && --c->second == 0) counts_.erase(c);
    if (on_end) on_end(h);
  }
  leases_.erase(it);
}

LeaseEnd LeaseTable::end(LeaseId id, Clock::time_point now, const OnEnd& on_end) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return LeaseEnd::kUnknown;
  const bool expired = it->second.deadline <= now;
  drop(it, on_end);
  return expired ? LeaseEnd::kExpired : LeaseEnd::kReleased;
}

std::uint64_t LeaseTable::expire(Clock::time_point now, const OnEnd& on_end) {
  if (now < earliest_) return 0;
  std::uint64_t n = 0;
  earliest_ = Clock::time_point::max();
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.deadline <= now) {
      drop(it++, on_end);
      ++n;
    } else {
      earliest_ = std::min(earliest_, it->second.deadline);
      ++it;
    }
  }
  return n;
}

}  // namespace tier
