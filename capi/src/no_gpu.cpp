// The C API without the GPU floor: device regions, pinned registration and page-locked images are
// refused.
#include "capi_internal.hpp"

namespace tier::capi {

struct GpuExecutors {};

GpuExecutorsPtr make_gpu_executors() { return GpuExecutorsPtr(new GpuExecutors); }
void GpuExecutorsDeleter::operator()(GpuExecutors* g) const noexcept { delete g; }

Result<CopyExecutor*> gpu_executor(GpuExecutors&, int) noexcept {
  return Status(Code::kNotSupported, "device memory: this libtier was built without a GPU");
}

Status check_device_memory(RegionList, int) noexcept {
  return Status(Code::kNotSupported, "device memory: this libtier was built without a GPU");
}

Status prepare_device(GpuExecutors&, const Region&) noexcept {
  return Status(Code::kNotSupported, "device memory: this libtier was built without a GPU");
}

Result<std::shared_ptr<ImageMemory>> page_locked_images() noexcept {
  return Status(Code::kNotSupported, "page-locked images: this libtier was built without a GPU");
}

Result<std::unique_ptr<PinnedHold>> pin_host(void*, std::size_t) noexcept {
  return Status(Code::kNotSupported, "pinned registration: this libtier was built without a GPU");
}

}  // namespace tier::capi
