#pragma once
// The gpu tier: object images in device memory of one GPU, bounded by capacity, exact LRU.
//
// Requests run on the tier's own stream in submission order: a put copies the caller's image
// into a device buffer, a get copies it back out; each is followed by an event, and poll()
// hands out a completion once its event proves the copy finished (events complete in stream
// order). Buffers may be device memory (kept on the device, a device-to-device copy), pinned
// host memory (DMA straight from/to it) or pageable host memory (bounced through the tier's
// PinnedPool when a lease is free, so the DMA stays asynchronous; copied by the runtime
// otherwise). Contains and remove complete at once.
//
// Eviction copies the victim back to host memory (synchronously) so a stack can demote it.
// Runtime errors become completions with DeviceError; nothing throws or exits. create() reports
// NotSupported on a machine without a GPU.

#include <chrono>
#include <cstddef>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "gpu.hpp"
#include "pinned_pool.hpp"
#include "tier/backend.hpp"

namespace tier::gpu {

class GpuBackend final : public Backend {
 public:
  static Result<std::unique_ptr<GpuBackend>> create(const BackendContext& ctx);
  ~GpuBackend() override;
  std::string describe() const override;  // the device, bytes used of the capacity, objects

  Capabilities capabilities() const noexcept override;
  Usage usage() const noexcept override;

 protected:
  Result<std::size_t> do_submit(std::span<const IoRequest> reqs) noexcept override;
  Result<std::size_t> do_poll(std::span<Completion> out, std::size_t min,
                              std::chrono::microseconds wait) noexcept override;
  Result<std::vector<ObjectKey>> do_list_keys(const Key128& ns) override;

 private:
  struct Entry {
    DeviceBuffer image;
    std::size_t bytes = 0;
    std::list<ObjectKey>::iterator lru;
  };
  // A request whose copy is in flight (event) or already decided (no event).
  struct Pending {
    Completion done;
    std::optional<Event> event;
    std::optional<PinnedPool::Lease> bounce;  // pageable get: copy out of it at completion
    Region get_dst;
  };

  GpuBackend(std::string tier_name, std::uint64_t capacity, int device, Stream stream,
             std::unique_ptr<PinnedPool> pool);
  Pending put(const IoRequest& r) noexcept;
  Pending get(const IoRequest& r) noexcept;
  Status enqueue_event(Pending& p) noexcept;
  Result<DeviceBuffer> allocate(std::size_t bytes) noexcept;
  void evict_one() noexcept;
  std::size_t reap(std::span<Completion> out) noexcept;

  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  int device_;
  Stream stream_;
  std::unique_ptr<PinnedPool> pool_;
  std::unordered_map<ObjectKey, Entry> map_;
  std::list<ObjectKey> lru_;
  std::deque<Pending> pending_;
  std::vector<Event> spare_events_;
};

}  // namespace tier::gpu
