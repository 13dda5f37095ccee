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
// Every request completes synchronously inside submit(); poll() hands the completions out.

#include <cstddef>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "tier/backend.hpp"

namespace tier::cpu {

#if TIER_CPU_SHM
class ShmStore;
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
    std::unique_ptr<std::byte[]> data;
    std::size_t size = 0;
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
};

}  // namespace tier::cpu
