#include "tier/copy_plan.hpp"

#include <cstring>

namespace tier {
namespace {

class HostCopyExecutor final : public CopyExecutor {
 public:
  std::string_view name() const noexcept override { return "host"; }
  Status gather(const CopyPlan& plan, std::span<std::byte> image) noexcept override {
    if (plan.engine_kind == MemoryKind::kDevice)
      return Status(Code::kNotSupported, "host executor cannot read device memory");
    if (image.size() < plan.image_bytes) return Status::invalid("image smaller than the plan");
    for (const CopySpan& s : plan.spans) std::memcpy(image.data() + s.image_offset, s.engine, s.bytes);
    return Status::ok();
  }
  Status scatter(const CopyPlan& plan, std::span<const std::byte> image) noexcept override {
    if (plan.engine_kind == MemoryKind::kDevice)
      return Status(Code::kNotSupported, "host executor cannot write device memory");
    if (image.size() < plan.image_bytes) return Status::invalid("image smaller than the plan");
    for (const CopySpan& s : plan.spans) std::memcpy(s.engine, image.data() + s.image_offset, s.bytes);
    return Status::ok();
  }
};

}  // namespace

CopyExecutor& host_copy_executor() noexcept {
  static HostCopyExecutor executor;
  return executor;
}

}  // namespace tier
