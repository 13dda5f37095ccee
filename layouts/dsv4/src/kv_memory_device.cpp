// Device KV memory: the backings are GPU allocations; the codecs move bytes through a copy
// executor on the GPU's shared CopyContext, and host access (fill, zero, digest) copies through
// a pinned scratch on the context's lanes.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "gpu.hpp"
#include "kv_memory.hpp"

namespace tier::dsv4::detail {
namespace {

constexpr std::size_t kZeroChunk = 4u << 20;

// A snapshot on its way to pinned host memory: `done` is behind its last copy.
class PendingCopy final : public PendingImage {
 public:
  PendingCopy(std::shared_ptr<gpu::CopyContext> ctx, gpu::PinnedStaging memory, gpu::Event done,
              std::size_t bytes)
      : ctx_(std::move(ctx)), memory_(std::move(memory)), done_(std::move(done)), bytes_(bytes) {}
  ~PendingCopy() override { ctx_->give_event(std::move(done_), waited_); }
  Result<std::span<std::byte>> wait() override {
    TIER_RETURN_IF_ERROR(done_.synchronize());
    waited_ = true;
    return memory_.bytes().first(bytes_);
  }

 private:
  std::shared_ptr<gpu::CopyContext> ctx_;
  gpu::PinnedStaging memory_;  // back to the pool on destruction, reused once `done_` completed
  gpu::Event done_;
  std::size_t bytes_;
  bool waited_ = false;  // done_ completed: back to the pool as such
};

// A snapshot already in host memory.
class Copied final : public PendingImage {
 public:
  explicit Copied(std::vector<std::byte> bytes) : bytes_(std::move(bytes)) {}
  Result<std::span<std::byte>> wait() override { return std::span(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

class DeviceMemory final : public KvMemory {
 public:
  static Result<std::unique_ptr<DeviceMemory>> create(const dsv4::Geometry& g, int device) {
    TIER_ASSIGN_OR_RETURN(auto ctx, gpu::CopyContext::of(device));
    std::unique_ptr<DeviceMemory> m(new DeviceMemory(device, std::move(ctx)));
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

  Result<Region> staging_row(std::size_t bytes) override {
    if (row_.size() == 0) {
      TIER_ASSIGN_OR_RETURN(row_, gpu::DeviceBuffer::allocate(device_, bytes));
    }
    if (bytes > row_.size())
      return Status::invalid(fmt::format("dsv4 layout: a staging row of {} bytes asked for {}",
                                         row_.size(), bytes));
    return row_.region().slice(0, bytes);
  }
  Status commit_row(const CopyPlan& plan, Region row) override {
    return executor_->scatter_from(plan, row);
  }

  Result<std::unique_ptr<PendingImage>> snapshot(const CopyPlan& plan, std::size_t header_bytes,
                                                 void* stream) override {
    const std::size_t total = header_bytes + plan.image_bytes;
    auto pinned = ctx_->take_pinned(total);
    if (!pinned) {
      if (pinned.status() != Code::kRejected) return pinned.status();
      // The pinned pool holds its limit: a pageable copy, waited for (after the orders given).
      try {
        std::vector<std::byte> bytes(total);
        TIER_RETURN_IF_ERROR(executor_->gather(plan, std::span(bytes).subspan(header_bytes)));
        return std::unique_ptr<PendingImage>(new Copied(std::move(bytes)));
      } catch (const std::bad_alloc&) {
        return Status(Code::kNoSpace, "dsv4 layout: cannot allocate the snapshot");
      }
    }
    gpu::DeviceGuard guard(device_);
    TIER_RETURN_IF_ERROR(guard.status());
    TIER_ASSIGN_OR_RETURN(gpu::Event done, ctx_->take_event());
    const Region image = pinned->region().slice(header_bytes, plan.image_bytes);
    Status st;
    if (stream == nullptr) {
      // Into pinned memory on the lane that follows the orders given; waited for here, since the
      // caller may change the memory as soon as this returns.
      const gpu::Stream& lane = ctx_->stream(gpu::Lane::kFromDevice);
      st = executor_->gather_async(plan, image, lane);
      if (st) st = done.record(lane);
      if (st) st = done.synchronize();
      if (!st) lane.synchronize().ignore();
    } else {
      // One kernel on the caller's stream into the staging ring (HBM to HBM: the caller's next
      // kernels wait microseconds), then the DMA to pinned memory on the download lane.
      const gpu::Stream caller = gpu::Stream::view(stream, device_);
      const gpu::Stream& down = ctx_->stream(gpu::Lane::kDownload);
      auto range = ctx_->ring_acquire(plan.image_bytes, caller);
      if (!range) {
        ctx_->give_event(std::move(done));
        if (range.status() != Code::kRejected) return range.status();
        // The ring cannot take it: straight into pinned memory on the caller's stream.
        TIER_RETURN_IF_ERROR(executor_->gather_async(plan, image, caller));
        TIER_ASSIGN_OR_RETURN(done, ctx_->take_event());
        st = done.record(caller);
        if (st) st = pinned->in_use_until(caller);
      } else {
        st = executor_->gather_async(plan, range->region, caller);
        if (st) st = done.record(caller);
        if (st) st = gpu::stream_wait_event(down, done.handle());
        if (st) st = gpu::copy_async(image, range->region.slice(0, plan.image_bytes), down);
        if (st) st = done.record(down);
        Status ret = ctx_->ring_retire(*range, down);
        if (st) st = ret;
        if (st) st = pinned->in_use_until(down);
      }
      if (!st) {
        caller.synchronize().ignore();  // enqueued copies still use the memory
        down.synchronize().ignore();
      }
    }
    if (!st) {
      ctx_->give_event(std::move(done));
      return st;
    }
    try {
      return std::unique_ptr<PendingImage>(
          new PendingCopy(ctx_, std::move(*pinned), std::move(done), total));
    } catch (const std::bad_alloc&) {
      done.synchronize().ignore();
      return Status(Code::kNoSpace, "dsv4 layout: cannot allocate the snapshot");
    }
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
      const gpu::Stream& lane = ctx_->stream(gpu::Lane::kFromDevice);
      for (std::size_t i = 0; i < regions.size(); ++i)
        TIER_RETURN_IF_ERROR(gpu::copy_async(views[i], regions[i], lane));
      TIER_RETURN_IF_ERROR(wait_for(lane));
    }
    fn(views);
    if (access == Access::kWrite) {
      const gpu::Stream& lane = ctx_->stream(gpu::Lane::kToDevice);
      for (std::size_t i = 0; i < regions.size(); ++i)
        TIER_RETURN_IF_ERROR(gpu::copy_async(regions[i], views[i], lane));
      TIER_RETURN_IF_ERROR(wait_for(lane));
    }
    return Status::ok();
  }

 private:
  DeviceMemory(int device, std::shared_ptr<gpu::CopyContext> ctx)
      : device_(device), ctx_(std::move(ctx)) {}

  // Waits for what was enqueued on `lane` so far (an event behind it, not the lane itself).
  Status wait_for(const gpu::Stream& lane) {
    TIER_ASSIGN_OR_RETURN(gpu::Event e, ctx_->take_event());
    Status st = e.record(lane);
    st = st ? e.synchronize() : lane.synchronize();
    ctx_->give_event(std::move(e), st.is_ok());
    return st;
  }

  // Fresh device memory holds whatever was there: copy zeros over every backing.
  Status zero_all(std::size_t chunk) {
    if (chunk == 0) return Status::ok();
    TIER_ASSIGN_OR_RETURN(gpu::PinnedBuffer zeros, gpu::PinnedBuffer::allocate(chunk));
    std::memset(zeros.data(), 0, zeros.size());
    gpu::DeviceGuard guard(device_);
    TIER_RETURN_IF_ERROR(guard.status());
    const gpu::Stream& lane = ctx_->stream(gpu::Lane::kToDevice);
    for (const Region& r : regions_)
      for (std::size_t off = 0; off < r.size; off += chunk) {
        const std::size_t n = std::min(chunk, r.size - off);
        TIER_RETURN_IF_ERROR(gpu::copy_async(r.slice(off, n), zeros.region().slice(0, n), lane));
      }
    return wait_for(lane);
  }

  int device_;
  std::shared_ptr<gpu::CopyContext> ctx_;
  std::vector<gpu::DeviceBuffer> owned_;
  std::vector<Region> regions_;
  gpu::PinnedBuffer scratch_;
  gpu::DeviceBuffer row_;  // staging_row(), once asked for
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
