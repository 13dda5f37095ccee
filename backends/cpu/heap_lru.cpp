#include "heap_lru.hpp"

#include <fmt/format.h>

#include <cstring>

#include "tier/object.hpp"

namespace tier::cpu {

HeapLru::HeapLru(std::uint64_t capacity) : capacity_(capacity) {}

bool HeapLru::make_room(std::size_t bytes, const EvictFn& on_evict) {
  if (used_ + bytes <= capacity_) return true;
  if (leases_.active() > 0) {
    const std::uint64_t expired = leases_.expire(LeaseTable::Clock::now());
    if (lease_expiries_ != nullptr) lease_expiries_->add(expired);
  }
  auto it = lru_.end();
  while (used_ + bytes > capacity_ && it != lru_.begin()) {
    --it;
    if (leases_.held(*it)) continue;  // leased: skipped until its lease ends
    ObjectKey victim = *it;
    it = lru_.erase(it);
    auto v = map_.find(victim);
    Buffer image = std::move(v->second.image);
    used_ -= image.size;
    map_.erase(v);
    on_evict(victim, {image.data, image.size}, image.size);
    release(std::move(image));
  }
  return used_ + bytes <= capacity_;
}

template <class Fill>
CpuMode::Outcome HeapLru::insert(const ObjectKey& key, std::size_t bytes, Fill&& fill,
                                 const EvictFn& on_evict) {
  auto it = map_.find(key);
  if (it != map_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return {Status(Code::kAlreadyExists, ""), it->second.image.size};
  }
  if (bytes > capacity_)
    return {Status(Code::kNoSpace, fmt::format("object of {} bytes exceeds the tier capacity {}",
                                               bytes, capacity_)),
            0};
  if (!make_room(bytes, on_evict))
    return {Status(Code::kNoSpace, "the objects left to evict are leased"), 0};
  Buffer b = allocate(bytes);
  if (!b.data) return {Status(Code::kNoSpace, "out of host memory"), 0};
  if (Status s = fill(Piece{b.data, bytes}); !s) {
    release(std::move(b));
    return {std::move(s), 0};
  }
  lru_.push_front(key);
  used_ += bytes;
  map_.emplace(key, Entry{std::move(b), lru_.begin()});
  return {Status::ok(), bytes};
}

CpuMode::Outcome HeapLru::put(const ObjectKey& key, std::span<const std::byte> image,
                              const EvictFn& on_evict) {
  return insert(
      key, image.size(),
      [&](Piece p) {
        std::memcpy(p.data(), image.data(), p.size());
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
  auto it = map_.find(key);
  if (it == map_.end()) return {Status::not_found(), 0};
  const Buffer& b = it->second.image;
  if (capacity < b.size)
    return {
        Status::invalid(fmt::format("buffer of {} bytes is too small for {}", capacity, b.size)),
        b.size};
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return {drain(Piece{b.data, b.size}), b.size};
}

CpuMode::Outcome HeapLru::get(const ObjectKey& key, std::span<std::byte> out) {
  return read(key, out.size(), [&](Piece p) { return copy_verified(out, p, key); });
}

CpuMode::Outcome HeapLru::get_with(const ObjectKey& key, std::uint64_t capacity,
                                   const PiecesFn& drain) {
  return read(key, capacity, [&](Piece p) { return drain(std::span(&p, 1)); });
}

Result<std::uint64_t> HeapLru::contains(const ObjectKey& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return Status::not_found();
  return std::uint64_t{it->second.image.size};
}

Status HeapLru::remove(const ObjectKey& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return Status::not_found();
  used_ -= it->second.image.size;
  lru_.erase(it->second.lru);
  release(std::move(it->second.image));
  map_.erase(it);
  return Status::ok();
}

Result<LeaseId> HeapLru::lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                               std::span<std::uint8_t> held, Counter& expiries) {
  lease_expiries_ = &expiries;
  const auto now = LeaseTable::Clock::now();
  expiries.add(leases_.expire(now));
  std::vector<LeaseTable::Hold> holds;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (map_.count(keys[i]) == 0) continue;
    held[i] = 1;
    holds.push_back({keys[i], 0});
  }
  return leases_.add(now + ttl, std::move(holds));
}

LeaseEnd HeapLru::release_lease(LeaseId id, Counter& expiries) {
  lease_expiries_ = &expiries;
  return leases_.end(id, LeaseTable::Clock::now());
}

Usage HeapLru::usage() const noexcept { return Usage{capacity_, used_, map_.size()}; }

std::vector<HeapLru::Buffer*> HeapLru::buffers() {
  std::vector<Buffer*> out;
  out.reserve(map_.size());
  for (auto& [key, e] : map_) out.push_back(&e.image);
  return out;
}

Result<std::vector<ObjectKey>> HeapLru::list_keys(const Key128& ns) {
  std::vector<ObjectKey> out;
  for (const auto& [k, e] : map_)
    if (k.ns == ns) out.push_back(k);
  return out;
}

}  // namespace tier::cpu
