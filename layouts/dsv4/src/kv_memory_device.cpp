// Device KV memory: the backings are GPU allocations; the codecs move bytes through the GPU copy
// executor, and host access (fill, zero, digest) copies through a pinned scratch.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "gpu.hpp"
#include "kv_memory.hpp"

namespace tier::dsv4::detail {
namespace {

constexpr std::size_t kZeroChunk = 4u << 20;

class DeviceMemory final : public KvMemory {
 public:
  static Result<std::unique_ptr<DeviceMemory>> create(const dsv4::Geometry& g, int device) {
    TIER_ASSIGN_OR_RETURN(gpu::Stream stream, gpu::Stream::create(device));
    std::unique_ptr<DeviceMemory> m(new DeviceMemory(device, std::move(stream)));
    std::uint64_t largest = 0;
    for (const auto& b : g.backings) {
      TIER_ASSIGN_OR_RETURN(gpu::DeviceBuffer buf, gpu::DeviceBuffer::allocate(device, b.bytes));
      m->regions_.push_back(buf.region());
      m->owned_.push_back(std::move(buf));
      largest = std::max<std::uint64_t>(largest, b.bytes);
    }
    TIER_RETURN_IF_ERROR(m->zero_all(std::min<std::uint64_t>(largest, kZeroChunk)));
    gpu::ExecutorOptions eo;
    eo.device = device;
    TIER_ASSIGN_OR_RETURN(m->executor_, gpu::DeviceCopyExecutor::create(eo));
    return m;
  }

  const std::vector<Region>& backings() const noexcept override { return regions_; }
  CopyExecutor* executor() noexcept override { return executor_.get(); }
  Status order_after(void* stream, void* event) override {
    return executor_->order_after(stream, event);
  }

  Status visit(RegionList regions, Access access,
               const std::function<void(RegionList)>& fn) override {
    for (const Region& r : regions)
      if (r.kind != MemoryKind::kDevice || r.device != device_)
        return Status::invalid(fmt::format("device KV memory: a {} region of device {}, not GPU {}",
                                           memory_kind_name(r.kind), r.device, device_));
    const std::size_t total = total_bytes(regions);
    if (scratch_.size() < total) {
      scratch_ = gpu::PinnedBuffer();
      TIER_ASSIGN_OR_RETURN(scratch_, gpu::PinnedBuffer::allocate(total));
    }
    std::vector<Region> views;
    views.reserve(regions.size());
    std::size_t off = 0;
    for (const Region& r : regions) {
      views.push_back(scratch_.region().slice(off, r.size));
      off += r.size;
    }
    gpu::DeviceGuard guard(device_);
    TIER_RETURN_IF_ERROR(guard.status());
    if (access == Access::kRead) {
      for (std::size_t i = 0; i < regions.size(); ++i)
        TIER_RETURN_IF_ERROR(gpu::copy_async(views[i], regions[i], stream_));
      TIER_RETURN_IF_ERROR(stream_.synchronize());
    }
    fn(views);
    if (access == Access::kWrite) {
      for (std::size_t i = 0; i < regions.size(); ++i)
        TIER_RETURN_IF_ERROR(gpu::copy_async(regions[i], views[i], stream_));
      TIER_RETURN_IF_ERROR(stream_.synchronize());
    }
    return Status::ok();
  }

 private:
  DeviceMemory(int device, gpu::Stream stream) : device_(device), stream_(std::move(stream)) {}

  // Fresh device memory holds whatever was there: copy zeros over every backing.
  Status zero_all(std::size_t chunk) {
    if (chunk == 0) return Status::ok();
    TIER_ASSIGN_OR_RETURN(gpu::PinnedBuffer zeros, gpu::PinnedBuffer::allocate(chunk));
    std::memset(zeros.data(), 0, zeros.size());
    gpu::DeviceGuard guard(device_);
    TIER_RETURN_IF_ERROR(guard.status());
    for (const Region& r : regions_)
      for (std::size_t off = 0; off < r.size; off += chunk) {
        const std::size_t n = std::min(chunk, r.size - off);
        TIER_RETURN_IF_ERROR(gpu::copy_async(r.slice(off, n), zeros.region().slice(0, n), stream_));
      }
    return stream_.synchronize();
  }

  int device_;
  gpu::Stream stream_;
  std::vector<gpu::DeviceBuffer> owned_;
  std::vector<Region> regions_;
  gpu::PinnedBuffer scratch_;
  std::unique_ptr<gpu::DeviceCopyExecutor> executor_;
};

}  // namespace

Result<std::unique_ptr<KvMemory>> make_device_memory(const dsv4::Geometry& geometry, int device) {
  if (device < 0) return Status::invalid("dsv4 layout: device must be >= 0");
  const int n = gpu::device_count();
  if (n == 0)
    return Status(Code::kNotSupported,
                  fmt::format("dsv4 layout: device KV memory needs a GPU; the {} runtime finds "
                              "none on this machine",
                              gpu::api_name()));
  if (device >= n)
    return Status(Code::kNotSupported,
                  fmt::format("dsv4 layout: no GPU {} on this machine ({} {} device{})", device, n,
                              gpu::api_name(), n == 1 ? "" : "s"));
  TIER_ASSIGN_OR_RETURN(auto m, DeviceMemory::create(geometry, device));
  return std::unique_ptr<KvMemory>(std::move(m));
}

}  // namespace tier::dsv4::detail
