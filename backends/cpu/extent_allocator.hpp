#pragma once
// ExtentAllocator: byte-exact placement of variable-sized objects in one fixed arena of
// `capacity` bytes (offsets only; it owns no memory). It is the allocator of the CPU tier's
// pinned heap mode, whose arena is one page-locked allocation made at creation.
//
// Every allocation takes exactly the bytes asked for (no rounding, no per-object overhead), so a
// tier whose live objects total `used` bytes can always place another `n` bytes when
// used + n <= capacity: when the free bytes are there but no single free extent is large enough,
// allocate() reports it (nullopt) and the owner compacts (moves every live object to the front,
// in address order) and calls reset() with the packed size. Free extents are coalesced; the
// placement is best fit (smallest free extent that holds the request, lowest offset on ties), so
// equal-sized objects never fragment the arena at all.
//
// Threads: thread-compatible (the tier's owner thread only).

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace tier::cpu {

class ExtentAllocator {
 public:
  explicit ExtentAllocator(std::uint64_t capacity);

  // The offset of `n` free bytes (n > 0), or nullopt when no free extent holds them.
  std::optional<std::uint64_t> allocate(std::uint64_t n);
  // Returns [offset, offset + n), which allocate() handed out, to the free space.
  void release(std::uint64_t offset, std::uint64_t n);
  // After the owner packed every live object into [0, used): one free extent [used, capacity).
  void reset(std::uint64_t used);

  std::uint64_t capacity() const noexcept { return capacity_; }
  std::uint64_t free_bytes() const noexcept { return free_bytes_; }
  std::uint64_t largest_free() const noexcept;
  std::size_t free_extents() const noexcept { return by_offset_.size(); }

 private:
  void insert(std::uint64_t offset, std::uint64_t n);
  void erase(std::map<std::uint64_t, std::uint64_t>::iterator it);

  std::uint64_t capacity_;
  std::uint64_t free_bytes_ = 0;
  std::map<std::uint64_t, std::uint64_t> by_offset_;           // free extents: offset -> bytes
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_;  // (bytes, offset)
};

}  // namespace tier::cpu
