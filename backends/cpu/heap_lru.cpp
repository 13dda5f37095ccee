#include "heap_lru.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <iterator>

#include "tier/object.hpp"

namespace tier::cpu {

HeapLru::HeapLru(std::uint64_t capacity) : capacity_(capacity) {}

HeapLru::SlotPtr HeapLru::detach(std::unordered_map<ObjectKey, SlotPtr>::iterator it) {
  SlotPtr s = std::move(it->second);
  map_.erase(it);
  lru_.erase(s->lru);
  used_ -= s->image.size;
  return s;
}

void HeapLru::retire(SlotPtr s) {
  if (s->readers > 0) {
    s->parked = true;
    gone_.push_back(std::move(s));
    return;
  }
  release(std::move(s->image));
}

void HeapLru::unread(Slot* s) {
  if (--s->readers > 0 || !s->parked) return;
  auto it = std::find_if(gone_.begin(), gone_.end(), [&](const SlotPtr& g) { return g.get() == s; });
  release(std::move(s->image));
  gone_.erase(it);
}

void HeapLru::abandon(Slot* s) {
  used_ -= s->image.size;
  --filling_;
  release(std::move(s->image));
  map_.erase(s->key);  // destroys *s
}

bool HeapLru::make_room(std::size_t bytes, std::vector<SlotPtr>& victims) {
  if (used_ + bytes <= capacity_) return true;
  if (leases_.active() > 0) {
    const std::uint64_t expired = leases_.expire(LeaseTable::Clock::now());
    if (lease_expiries_ != nullptr) lease_expiries_->add(expired);
  }
  auto it = lru_.end();
  while (used_ + bytes > capacity_ && it != lru_.begin()) {
    --it;
    if (leases_.held(*it)) continue;  // leased: skipped until its lease ends
    auto victim = map_.find(*it);
    it = std::next(it);  // detach() erases the victim's list node
    victims.push_back(detach(victim));
  }
  return used_ + bytes <= capacity_;
}

std::unique_lock<std::mutex> HeapLru::evict(std::vector<SlotPtr>& victims,
                                            const EvictFn& on_evict) {
  // Eviction reports (a stack copies the images it demotes) run without the lock; then the
  // victims' storage goes back.
  for (const SlotPtr& v : victims) on_evict(v->key, {v->image.data, v->image.size}, v->image.size);
  std::unique_lock lock(mu_);
  for (SlotPtr& v : victims) retire(std::move(v));
  return lock;
}

void HeapLru::make_room_for(std::span<const ObjectKey> keys,
                            std::span<const std::uint64_t> image_bytes, const EvictFn& on_evict) {
  std::vector<SlotPtr> victims;
  {
    std::lock_guard lock(mu_);
    std::uint64_t needed = 0;
    for (std::size_t i = 0; i < keys.size() && i < image_bytes.size(); ++i)
      if (!map_.contains(keys[i]) && image_bytes[i] <= capacity_) needed += image_bytes[i];
    make_room(std::min(needed, capacity_), victims);  // what is leased stays: the puts say so
  }
  if (!victims.empty()) evict(victims, on_evict);
}

void HeapLru::refresh(std::span<const ObjectKey> keys) {
  std::lock_guard lock(mu_);
  for (const ObjectKey& k : keys) {
    auto it = map_.find(k);
    if (it != map_.end() && it->second->filled) lru_.splice(lru_.begin(), lru_, it->second->lru);
  }
}

template <class Fill>
CpuMode::Outcome HeapLru::insert(const ObjectKey& key, std::size_t bytes, Fill&& fill,
                                 const EvictFn& on_evict) {
  std::vector<SlotPtr> victims;
  Slot* slot = nullptr;
  Outcome refused;
  auto take_storage = [&] {  // under the lock, with the slot reserved
    Buffer b = allocate(bytes);
    if (b.data) {
      slot->image = std::move(b);
      return;
    }
    abandon(slot);
    slot = nullptr;
    refused = {Status(Code::kNoSpace, "out of host memory"), 0};
  };
  {
    std::unique_lock lock(mu_);
    for (;;) {  // a put of the same key still writing: wait for it, then look again
      auto it = map_.find(key);
      if (it == map_.end()) break;
      if (it->second->filled) {
        lru_.splice(lru_.begin(), lru_, it->second->lru);
        return {Status(Code::kAlreadyExists, ""), it->second->image.size};
      }
      filled_cv_.wait(lock);
    }
    if (bytes > capacity_)
      return {Status(Code::kNoSpace, fmt::format("object of {} bytes exceeds the tier capacity {}",
                                                 bytes, capacity_)),
              0};
    if (!on_evict && used_ + bytes > capacity_)
      return {Status(Code::kNoSpace, "no room without evicting"), 0, true};
    if (make_room(bytes, victims)) {
      // Reserved: its bytes count from now on and the key is taken, invisible until filled.
      auto s = std::make_unique<Slot>();
      s->key = key;
      s->image.size = bytes;
      slot = s.get();
      map_.emplace(key, std::move(s));
      used_ += bytes;
      ++filling_;
      if (victims.empty()) take_storage();
    } else {
      refused = {Status(Code::kNoSpace, "the objects left to evict are leased"), 0};
    }
  }
  if (!victims.empty()) {
    // The victims' storage goes back before this image takes its own (the pinned arena needs it).
    std::unique_lock lock = evict(victims, on_evict);
    if (slot != nullptr) take_storage();
  }
  if (slot == nullptr) {
    filled_cv_.notify_all();
    return refused;
  }
  Status s = fill(Piece{slot->image.data, bytes});
  {
    std::lock_guard lock(mu_);
    if (s) {
      lru_.push_front(key);
      slot->lru = lru_.begin();
      slot->filled = true;
      --filling_;
    } else {
      abandon(slot);
    }
  }
  filled_cv_.notify_all();
  if (!s) return {std::move(s), 0};
  return {Status::ok(), bytes};
}

CpuMode::Outcome HeapLru::put(const ObjectKey& key, std::span<const std::byte> image, Stores stores,
                              const EvictFn& on_evict) {
  return insert(
      key, image.size(),
      [&](Piece p) {
        copy_bytes(p.data(), image.data(), p.size(), stores);
        return Status::ok();
      },
      on_evict);
}

CpuMode::Outcome HeapLru::put_with(const ObjectKey& key, std::uint64_t image_bytes,
                                   const PiecesFn& fill, const EvictFn& on_evict) {
  return insert(
      key, image_bytes, [&](Piece p) { return fill(std::span(&p, 1)); }, on_evict);
}

template <class Drain>
CpuMode::Outcome HeapLru::read(const ObjectKey& key, std::uint64_t capacity, Drain&& drain) {
  Slot* s = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end() || !it->second->filled) return {Status::not_found(), 0};
    s = it->second.get();
    if (capacity < s->image.size)
      return {Status::invalid(fmt::format("buffer of {} bytes is too small for {}", capacity,
                                          s->image.size)),
              s->image.size};
    lru_.splice(lru_.begin(), lru_, s->lru);
    ++s->readers;
  }
  const std::size_t bytes = s->image.size;
  Status st = drain(Piece{s->image.data, bytes});  // the copy, without the lock
  std::lock_guard lock(mu_);
  unread(s);
  return {std::move(st), bytes};
}

CpuMode::Outcome HeapLru::get(const ObjectKey& key, std::span<std::byte> out, Stores stores) {
  return read(key, out.size(), [&](Piece p) { return copy_verified(out, p, key, stores); });
}

CpuMode::Outcome HeapLru::get_with(const ObjectKey& key, std::uint64_t capacity,
                                   const PiecesFn& drain) {
  return read(key, capacity, [&](Piece p) { return drain(std::span(&p, 1)); });
}

Result<std::uint64_t> HeapLru::contains(const ObjectKey& key) {
  std::lock_guard lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end() || !it->second->filled) return Status::not_found();
  return std::uint64_t{it->second->image.size};
}

Status HeapLru::remove(const ObjectKey& key) {
  std::lock_guard lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end() || !it->second->filled) return Status::not_found();
  retire(detach(it));
  return Status::ok();
}

Result<LeaseId> HeapLru::lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                               std::span<std::uint8_t> held, Counter& expiries) {
  std::lock_guard lock(mu_);
  lease_expiries_ = &expiries;
  const auto now = LeaseTable::Clock::now();
  expiries.add(leases_.expire(now));
  std::vector<LeaseTable::Hold> holds;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto it = map_.find(keys[i]);
    if (it == map_.end() || !it->second->filled) continue;
    held[i] = 1;
    holds.push_back({keys[i], 0});
  }
  return leases_.add(now + ttl, std::move(holds));
}

LeaseEnd HeapLru::release_lease(LeaseId id, Counter& expiries) {
  std::lock_guard lock(mu_);
  lease_expiries_ = &expiries;
  return leases_.end(id, LeaseTable::Clock::now());
}

Usage HeapLru::usage() const noexcept {
  std::lock_guard lock(mu_);
  return Usage{capacity_, used_, map_.size() - filling_};
}

std::vector<HeapLru::Buffer*> HeapLru::buffers() {
  std::vector<Buffer*> out;
  out.reserve(map_.size());
  for (auto& [key, s] : map_)
    if (s->image.data != nullptr) out.push_back(&s->image);
  return out;
}

Result<std::vector<ObjectKey>> HeapLru::list_keys(const Key128& ns) {
  std::vector<ObjectKey> out;
  for (const auto& [k, e] : map_)
    if (k.ns == ns) out.push_back(k);
  return out;
}

}  // namespace tier::cpu
