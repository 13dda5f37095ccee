#pragma once
// HeapMode: the CPU tier's "heap" mode: each object in its own heap buffer, indexed with exact
// LRU by HeapLru. Freed buffers are kept for reuse by size (their bytes count against the
// capacity, and are given back when a new size needs the room), so a warm cache does not
// page-fault on every put. Threads: any number at once (HeapLru's index lock also guards the
// spare buffers); concurrent(): true, so the tier's puts and gets copy in parallel.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "heap_lru.hpp"

namespace tier::cpu {

class HeapMode final : public HeapLru {
 public:
  static Result<std::unique_ptr<CpuMode>> create(const BackendContext& ctx);
  explicit HeapMode(std::uint64_t capacity);

  std::string describe(std::string_view tier_name) const override;
  DeviceTransfer* device() noexcept override { return nullptr; }
  bool concurrent() const noexcept override { return true; }

 private:
  Buffer allocate(std::size_t bytes) override;
  void release(Buffer b) override;

  // Under HeapLru's index lock (allocate() and release() are called with it held).
  std::uint64_t spare_bytes_ = 0;
  std::unordered_multimap<std::size_t, Buffer> spare_;  // freed buffers by size, for reuse
};

}  // namespace tier::cpu
