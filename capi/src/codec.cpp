// RegionCodec: a C API region list <-> the concatenation of its bytes (capi_internal.hpp).
#include <string>

#include "capi_internal.hpp"
#include "tier/checked.hpp"

namespace tier::capi {

struct RegionCodec::Plan {
  std::vector<CopySpan> spans;
  CopyPlan plan;
  CopyExecutor* executor = nullptr;
};

RegionCodec::RegionCodec() : gpu_(make_gpu_executors()) {}
RegionCodec::~RegionCodec() = default;

Status RegionCodec::prepare_device(const Region& memory) const noexcept {
  return capi::prepare_device(*gpu_, memory);
}

Result<std::int32_t> RegionCodec::check(RegionList regions) noexcept {
  try {
    const bool device = !regions.empty() && regions[0].kind == MemoryKind::kDevice;
    const std::int32_t ordinal = device ? regions[0].device : -1;
    TIER_RETURN_IF_ERROR(checked_total(regions).status());
    for (std::size_t i = 0; i < regions.size(); ++i) {
      const Region& r = regions[i];
      if ((r.kind == MemoryKind::kDevice) != device || (device && r.device != ordinal))
        return Status::invalid("region " + std::to_string(i) +
                               ": a list mixes host memory and devices");
      if (!r.data && r.size) return Status::invalid("region " + std::to_string(i) + " is NULL");
    }
    if (device) TIER_RETURN_IF_ERROR(check_device_memory(regions, ordinal));
    return ordinal;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "out of memory");
  }
}

Status RegionCodec::plan(RegionList regions, Plan& out) const noexcept {
  TIER_ASSIGN_OR_RETURN(const std::int32_t ordinal, check(regions));
  try {
    std::uint64_t offset = 0;
    out.spans.clear();
    out.spans.reserve(regions.size());
    for (const Region& r : regions) {
      out.spans.push_back(CopySpan{r.data, offset, r.size});
      offset += r.size;
    }
    const bool device = ordinal >= 0;
    out.plan = CopyPlan{out.spans, device ? MemoryKind::kDevice : MemoryKind::kHost, ordinal,
                        offset};
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "out of memory");
  }
  if (ordinal < 0) {
    out.executor = &host_copy_executor();
    return Status::ok();
  }
  TIER_ASSIGN_OR_RETURN(out.executor, gpu_executor(*gpu_, ordinal));
  return Status::ok();
}

Result<std::size_t> RegionCodec::encoded_size(RegionList src) const noexcept {
  return checked_total(src);
}

Result<std::size_t> RegionCodec::encode(RegionList src, std::span<std::byte> dst) const noexcept {
  Plan p;
  TIER_RETURN_IF_ERROR(plan(src, p));
  if (dst.size() < p.plan.image_bytes)
    return Status::invalid("payload buffer of " + std::to_string(dst.size()) + " bytes for " +
                           std::to_string(p.plan.image_bytes));
  TIER_RETURN_IF_ERROR(p.executor->gather(p.plan, dst));
  return static_cast<std::size_t>(p.plan.image_bytes);
}

Status RegionCodec::decode(std::span<const std::byte> payload, RegionList dst) const noexcept {
  Plan p;
  TIER_RETURN_IF_ERROR(plan(dst, p));
  if (payload.size() != p.plan.image_bytes)
    return Status::invalid("stored payload is " + std::to_string(payload.size()) +
                           " bytes, these regions take " + std::to_string(p.plan.image_bytes) +
                           ": nothing written");
  return p.executor->scatter(p.plan, payload);
}

// The payload is the regions' bytes with no framing, so a tier may move them itself. For device
// regions the GPU's executor first shares its order (CopyExecutor::share_order), so the tier's
// writes follow every transfer it enqueued.
Result<DirectPayload> RegionCodec::direct(RegionList regions) const noexcept {
  TIER_ASSIGN_OR_RETURN(const std::int32_t ordinal, check(regions));
  if (ordinal >= 0) {
    TIER_ASSIGN_OR_RETURN(CopyExecutor * executor, gpu_executor(*gpu_, ordinal));
    TIER_RETURN_IF_ERROR(executor->share_order());
  }
  return DirectPayload{};
}

}  // namespace tier::capi
