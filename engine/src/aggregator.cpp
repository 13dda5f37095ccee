#include "tier/engine/aggregator.hpp"

namespace tier::engine {

std::string_view channel_name(Channel c) noexcept {
  switch (c) {
    case Channel::kLoad:
      return "load";
    case Channel::kPageSave:
      return "page_save";
    case Channel::kSlotSave:
      return "slot_save";
  }
  return "unknown";
}

Aggregator::Aggregator(std::uint32_t world_size, std::size_t tombstone_limit, std::uint32_t epoch)
    : world_size_(world_size == 0 ? 1 : (world_size > 64 ? 64 : world_size)),
      tombstone_limit_(tombstone_limit),
      epoch_(epoch) {}

std::optional<Terminal> Aggregator::add(const OpReport& r) {
  auto idx = static_cast<std::size_t>(r.channel);
  if (idx >= kChannelCount || r.rank >= world_size_ || r.id.generation == 0) return std::nullopt;
  if (epoch_ != 0 && epoch_of(r.id.generation) != epoch_) return std::nullopt;
  PerChannel& ch = channels_[idx];
  if (ch.dead.count(r.id.generation) != 0) return std::nullopt;
  Group& g = ch.groups[r.id.generation];
  g.request = r.id.request;
  if (!r.ok() && g.outcome == WorkerOutcome::kOk) g.outcome = r.outcome;
  const std::uint64_t bit = 1ull << r.rank;
  if ((g.reported & bit) == 0) {
    g.reported |= bit;
    ++g.count;
  }
  if (g.count < world_size_) return std::nullopt;
  Terminal t{r.channel, OperationId{g.request, r.id.generation}, g.outcome};
  ch.groups.erase(r.id.generation);
  tombstone(ch, r.id.generation);
  return t;
}

void Aggregator::tombstone(PerChannel& ch, std::uint64_t generation) {
  if (tombstone_limit_ == 0) return;
  ch.dead.insert(generation);
  ch.dead_order.push_back(generation);
  while (ch.dead_order.size() > tombstone_limit_) {
    ch.dead.erase(ch.dead_order.front());
    ch.dead_order.pop_front();
  }
}

std::size_t Aggregator::pending() const noexcept {
  std::size_t n = 0;
  for (const auto& ch : channels_) n += ch.groups.size();
  return n;
}

std::size_t Aggregator::tombstones() const noexcept {
  std::size_t n = 0;
  for (const auto& ch : channels_) n += ch.dead.size();
  return n;
}

void Aggregator::reset() {
  for (auto& ch : channels_) ch = PerChannel{};
}

}  // namespace tier::engine
