#pragma once
// PinnedPool: a bounded pool of equal-sized page-locked host buffers (mapped for the GPUs),
// allocated once, handed out as RAII leases. It is the pinned staging memory of the gpu tier
// (pageable puts and gets bounce through it so their DMA stays asynchronous), of SLOT snapshots,
// and the allocator a CPU tier's pinned mode uses.
//
// Threads: try_acquire() and the return of a lease are safe from any thread. The pool must
// outlive its leases.

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "gpu.hpp"
#include "tier/region.hpp"
#include "tier/status.hpp"

namespace tier::gpu {

class PinnedPool {
 public:
  // Errors: InvalidArgument (zero sizes), NoSpace / DeviceError from the pinned allocator.
  static Result<std::unique_ptr<PinnedPool>> create(std::size_t buffer_bytes, std::size_t count);
  ~PinnedPool();

  // A leased buffer; returns itself to the pool on destruction.
  class Lease {
   public:
    Lease(Lease&& o) noexcept : pool_(o.pool_), index_(o.index_) { o.pool_ = nullptr; }
    Lease& operator=(Lease&& o) noexcept;
    ~Lease();
    std::span<std::byte> bytes() const noexcept;
    Region region() const noexcept;  // kind kPinnedHost

   private:
    friend class PinnedPool;
    Lease(PinnedPool* pool, std::size_t index) : pool_(pool), index_(index) {}
    PinnedPool* pool_;
    std::size_t index_;
  };

  // A free buffer, or nullopt when every buffer is leased (never blocks).
  std::optional<Lease> try_acquire() noexcept;
  std::size_t buffer_bytes() const noexcept { return buffer_bytes_; }
  std::size_t count() const noexcept { return buffers_.size(); }
  std::size_t available() const noexcept;

 private:
  PinnedPool(std::size_t buffer_bytes, std::vector<PinnedBuffer> buffers);
  void give_back(std::size_t index) noexcept;

  std::size_t buffer_bytes_;
  std::vector<PinnedBuffer> buffers_;
  mutable std::mutex mu_;
  std::vector<std::size_t> free_;
};

}  // namespace tier::gpu
