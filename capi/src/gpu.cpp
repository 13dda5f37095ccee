// The C API's device paths through the GPU floor (hip/gpu.hpp): one copy executor per device,
// on that GPU's CopyContext (the streams, events and staging the process's other users of the
// GPU share: a DSV4 layout's device memory, a pinned cpu tier), and page-locking of registered
// host memory.
#include <algorithm>
#include <array>
#include <map>
#include <mutex>

#include "capi_internal.hpp"
#include "gpu.hpp"

namespace tier::capi {

namespace {
// A device executor shared by every thread of the C API: one transfer at a time.
class SharedExecutor final : public CopyExecutor {
 public:
  explicit SharedExecutor(std::unique_ptr<gpu::DeviceCopyExecutor> e) : e_(std::move(e)) {}
  std::string_view name() const noexcept override { return e_->name(); }
  Status gather(const CopyPlan& plan, std::span<std::byte> image) noexcept override {
    std::lock_guard lock(mu_);
    return e_->gather(plan, image);
  }
  Status scatter(const CopyPlan& plan, std::span<const std::byte> image) noexcept override {
    std::lock_guard lock(mu_);
    return e_->scatter(plan, image);
  }
  Status share_order() noexcept override {
    std::lock_guard lock(mu_);
    return e_->share_order();
  }

 private:
  std::mutex mu_;
  std::unique_ptr<gpu::DeviceCopyExecutor> e_;
};
}  // namespace

struct GpuExecutors {
  std::mutex mu;  // by_device
  std::map<int, std::unique_ptr<SharedExecutor>> by_device;
};

GpuExecutorsPtr make_gpu_executors() { return GpuExecutorsPtr(new GpuExecutors); }
void GpuExecutorsDeleter::operator()(GpuExecutors* g) const noexcept { delete g; }

Result<CopyExecutor*> gpu_executor(GpuExecutors& g, int device) noexcept {
  try {
    std::lock_guard lock(g.mu);
    auto it = g.by_device.find(device);
    if (it != g.by_device.end()) return static_cast<CopyExecutor*>(it->second.get());
    if (device >= gpu::device_count())
      return Status::invalid("device " + std::to_string(device) + ": no such GPU");
    gpu::ExecutorOptions opts;
    opts.device = device;
    TIER_ASSIGN_OR_RETURN(auto exec, gpu::DeviceCopyExecutor::create(opts));
    auto shared = std::make_unique<SharedExecutor>(std::move(exec));
    CopyExecutor* p = shared.get();
    g.by_device.emplace(device, std::move(shared));
    return p;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "out of memory");
  }
}

Status prepare_device(GpuExecutors& g, const Region& memory) noexcept {
  TIER_RETURN_IF_ERROR(check_device_memory(RegionList(&memory, 1), memory.device));
  // The executor holds the GPU's context from now on: what prepare() makes stays made.
  TIER_RETURN_IF_ERROR(gpu_executor(g, memory.device).status());
  TIER_ASSIGN_OR_RETURN(auto ctx, gpu::CopyContext::of(memory.device));
  return ctx->prepare();
}

Result<std::shared_ptr<ImageMemory>> page_locked_images() noexcept {
  return gpu::page_locked_images();
}

Status check_device_memory(RegionList regions, int device) noexcept {
  // The allocations met so far in this list (a tensor's rows and heads share one): a region
  // inside one of them needs no lookup. The caller keeps its memory while the call lasts.
  std::array<gpu::DeviceAllocation, 4> seen;
  std::size_t next = 0;
  const auto address = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const std::uintptr_t first = address(regions[i].data);
    const std::uintptr_t bytes = std::max<std::size_t>(regions[i].size, 1);
    std::uintptr_t at = first;
    // Every byte, in address arithmetic (a size is the caller's: never a pointer past an
    // object): a region may span allocations, never leave device memory.
    while (at - first < bytes) {
      const auto seen_end = seen.begin() + std::min(next, seen.size());
      auto known = std::find_if(seen.begin(), seen_end, [&](const gpu::DeviceAllocation& a) {
        return address(a.base) <= at && at - address(a.base) < a.size;
      });
      if (known == seen_end) {
        const auto found = gpu::device_allocation_of(reinterpret_cast<const void*>(at));
        if (!found || found->device != device) {
          try {
            return Status::invalid(
                "region " + std::to_string(i) + " claims memory of GPU " + std::to_string(device) +
                (at != first ? " for " + std::to_string(regions[i].size) + " bytes, but its byte " +
                                   std::to_string(at - first)
                             : std::string()) +
                (!found ? ", but the GPU runtime does not know it as device memory"
                        : ", but it is memory of GPU " + std::to_string(found->device)));
          } catch (const std::bad_alloc&) {
            return Status(Code::kNoSpace, "out of memory");
          }
        }
        if (found->size == 0) break;  // the driver cannot say where it ends: its first byte
        known = seen.begin() + next++ % seen.size();
        *known = *found;
      }
      at = address(known->base) + known->size;
    }
  }
  return Status::ok();
}

namespace {
class Pinned final : public PinnedHold {
 public:
  explicit Pinned(gpu::PinnedRegistration r) : reg_(std::move(r)) {}

 private:
  gpu::PinnedRegistration reg_;
};
}  // namespace

Result<std::unique_ptr<PinnedHold>> pin_host(void* ptr, std::size_t bytes) noexcept {
  if (gpu::device_count() == 0)
    return Status(Code::kNotSupported, "pinned registration: no GPU on this machine");
  auto r = gpu::PinnedRegistration::register_host({static_cast<std::byte*>(ptr), bytes});
  if (!r) return r.status();
  try {
    return std::unique_ptr<PinnedHold>(std::make_unique<Pinned>(std::move(r).value()));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "out of memory");
  }
}

}  // namespace tier::capi
