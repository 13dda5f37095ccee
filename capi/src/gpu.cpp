// The C API's device paths through the GPU floor (hip/gpu.hpp): one copy executor per device,
// on that GPU's CopyContext (the streams, events and staging the process's other users of the
// GPU share: a DSV4 layout's device memory, a pinned cpu tier), and page-locking of registered
// host memory.
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

Status check_device_memory(const void* p, int device, std::size_t index) noexcept {
  const int owner = gpu::device_of(p);
  if (owner == device) return Status::ok();
  try {
    return Status::invalid(
        "region " + std::to_string(index) + " claims memory of GPU " + std::to_string(device) +
        (owner < 0 ? ", but the GPU runtime does not know it as device memory"
                   : ", but it is memory of GPU " + std::to_string(owner)));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "out of memory");
  }
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
