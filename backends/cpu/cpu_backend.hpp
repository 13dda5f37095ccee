#pragma once
// The CPU tier: objects in host memory, bounded by capacity, with LRU eviction. Two modes:
//
//  - "heap": objects in this process's heap, exact LRU. Capacity counts image bytes (header +
//    payload) exactly, so a tier of capacity C holds floor(C / image size) equal-sized objects.
//    Freed buffers are kept for reuse (bounded by the capacity) so a warm cache does not
//    page-fault on every put.
//  - "shm": objects in a named shared-memory segment (shm_store.hpp, docs/shm.md) that every
//    process opening the same segment shares and that outlives the process. Capacity is counted
//    in whole blocks; evicted objects are reported by key only (they are dropped, not demoted).
//
// "pinned": true (either mode; needs a GPU build and a GPU, else create() is NotSupported) keeps
// the storage in page-locked host memory from the GPU runtime (pinned_mode.hpp): the heap mode
// places its objects in one pinned arena of exactly the capacity (ExtentAllocator: exact bytes,
// best fit, compaction when free bytes are scattered, so capacity stays exact in image bytes and
// LRU is unchanged); the shm mode registers its mapping of the segment. The tier then also
// accepts device-memory buffers (kind kDevice) for put and get, moved by GPU DMA straight between
// the engine's GPU memory and the stored image; a get into device memory is verified (header,
// key, length, payload checksum) on the host while it copies, and fails with ChecksumMismatch
// and a zeroed destination header when the stored bytes are corrupt.
//
// Every request completes synchronously inside submit() (device copies included: submit waits
// for their DMA); poll() hands the completions out.

#include <cstddef>
#include <list>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "extent_allocator.hpp"
#include "tier/backend.hpp"

namespace tier::cpu {

#if TIER_CPU_SHM
class ShmStore;
#endif
#if TIER_CPU_PINNED
class PinnedMode;
#endif

class CpuBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CpuBackend>> create(const BackendContext& ctx);
  CpuBackend(std::string tier_name, std::uint64_t capacity);
#if TIER_CPU_SHM
  // The shm mode over an open store.
  CpuBackend(std::string tier_name, std::unique_ptr<ShmStore> shm);
#endif
  ~CpuBackend() override;

  Capabilities capabilities() const noexcept override;
  Usage usage() const noexcept override;
  std::string describe() const override;

 protected:
  Result<std::size_t> do_submit(std::span<const IoRequest> reqs) noexcept override;
  Result<std::size_t> do_poll(std::span<Completion> out, std::size_t min,
                              std::chrono::microseconds wait) noexcept override;

 private:
  struct Buffer {
    std::byte* data = nullptr;
    std::size_t size = 0;
    std::unique_ptr<std::byte[]> heap;  // owns `data`, unless it lies in the pinned arena
  };
  struct Entry {
    Buffer image;
    std::list<ObjectKey>::iterator lru;  // position in lru_ (front = most recent)
  };
  // The shm mode (cpu_shm_mode.cpp); NotSupported when built without Boost.Interprocess.
  static Result<std::unique_ptr<CpuBackend>> create_shm(const BackendContext& ctx);
#if TIER_CPU_SHM
  Result<std::size_t> shm_submit(std::span<const IoRequest> reqs) noexcept;
  Capabilities shm_capabilities() const noexcept;
  Usage shm_usage() const noexcept;
  std::string shm_describe() const;
#endif
#if TIER_CPU_PINNED
  // Switches to the pinned mode (before any request): the heap mode then allocates in the arena.
  void enable_pinned(std::unique_ptr<PinnedMode> pinned);
  // Packs every stored object to the front of the arena, in address order.
  void compact();
#endif
  MemoryKindMask memory_kinds() const noexcept;
  Completion put(const IoRequest& r);
  Completion get(const IoRequest& r);
  Buffer allocate(std::size_t bytes);
  void release(Buffer b);

  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::uint64_t spare_bytes_ = 0;
  std::unordered_map<ObjectKey, Entry> map_;
  std::list<ObjectKey> lru_;
  std::unordered_multimap<std::size_t, Buffer> spare_;  // freed buffers by size, for reuse
  std::vector<Completion> ready_;
#if TIER_CPU_SHM
  std::unique_ptr<ShmStore> shm_;  // set in shm mode; the heap members above are then unused
#endif
#if TIER_CPU_PINNED
  // Set in the pinned mode; declared after shm_ so the segment's registration ends before its
  // mapping does.
  std::unique_ptr<PinnedMode> pinned_;
  std::optional<ExtentAllocator> extents_;  // pinned heap mode: placement in the arena
  std::uint64_t compactions_ = 0;
#endif
};

}  // namespace tier::cpu
