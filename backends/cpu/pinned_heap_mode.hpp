#pragma once
// PinnedHeapMode: the CPU tier's heap mode with "pinned": true (GPU builds only). Its objects
// live in one pinned, device-mapped arena of exactly the tier's capacity (gpu::PinnedBuffer,
// cudaHostAlloc / hipHostMalloc), allocated once at creation, indexed with exact LRU by HeapLru.
// Images are placed byte-exact by an ExtentAllocator (best fit); when an image's bytes are free
// but scattered, the live objects are packed to the front of the arena (compaction) instead of
// evicting more, so capacity stays exact in image bytes. Device-memory puts and gets go through
// its PinnedTransfer. Threads: one at a time (concurrent() is false: compaction moves stored
// images, and device copies read them after a get returns).

#include <cstddef>
#include <cstdint>
#include <memory>

#include "extent_allocator.hpp"
#include "gpu.hpp"
#include "heap_lru.hpp"
#include "pinned_transfer.hpp"

namespace tier::cpu {

class PinnedHeapMode final : public HeapLru {
 public:
  // Returns: NotSupported (no GPU), DeviceError (the arena could not be allocated).
  static Result<std::unique_ptr<CpuMode>> create(const BackendContext& ctx);

  std::string describe(std::string_view tier_name) const override;
  DeviceTransfer* device() noexcept override { return transfer_.get(); }

 private:
  PinnedHeapMode(std::uint64_t capacity, gpu::PinnedBuffer arena,
                 std::unique_ptr<PinnedTransfer> transfer);
  Buffer allocate(std::size_t bytes) override;
  void release(Buffer b) override;
  // Packs every stored object to the front of the arena, in address order.
  void compact();

  gpu::PinnedBuffer arena_;  // capacity() bytes
  std::unique_ptr<PinnedTransfer> transfer_;
  ExtentAllocator extents_;  // placement in arena_
  std::uint64_t compactions_ = 0;
};

}  // namespace tier::cpu
