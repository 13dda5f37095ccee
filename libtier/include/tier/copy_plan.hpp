#pragma once
// Copy plans: a codec's validated description of a move between engine memory and a contiguous
// image, executed by a CopyExecutor (host memcpy here; GPU kernels in hip/).
//
// A codec builds and validates the plan (sizes, bounds, no overlap, ids in range) before any
// pointer is touched; an executor trusts the plan and only moves bytes. Gather reads each
// span's engine bytes into image[image_offset, +bytes); scatter writes them back.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "tier/region.hpp"
#include "tier/status.hpp"

namespace tier {

struct CopySpan {
  std::byte* engine = nullptr;     // engine memory (host or device, per the plan's kind)
  std::uint64_t image_offset = 0;  // offset in the contiguous image
  std::uint64_t bytes = 0;
};

struct CopyPlan {
  std::span<const CopySpan> spans;
  MemoryKind engine_kind = MemoryKind::kHost;
  std::int32_t device = -1;
  std::uint64_t image_bytes = 0;  // the image is exactly this long
};

// Executes plans. Implementations are thread-compatible (one caller at a time per instance).
class CopyExecutor {
 public:
  virtual ~CopyExecutor() = default;
  virtual std::string_view name() const noexcept = 0;
  // Engine -> image. `image` is host memory (pageable or pinned) of at least plan.image_bytes.
  virtual Status gather(const CopyPlan& plan, std::span<std::byte> image) noexcept = 0;
  // Image -> engine.
  virtual Status scatter(const CopyPlan& plan, std::span<const std::byte> image) noexcept = 0;
  // Makes the writes that another user of this executor's memory enqueues from now on (a tier
  // moving a codec's payload into its engine memory through Codec::direct) follow every transfer
  // this executor enqueued and every order it was given. Device-side where the memory is a GPU's
  // (an event wait on the stream the tier's copies run on), never a host wait; host memory has
  // nothing to order. Errors: DeviceError.
  virtual Status share_order() noexcept { return Status::ok(); }
};

// memcpy executor for host-kind plans. Errors: NotSupported for device plans.
CopyExecutor& host_copy_executor() noexcept;

}  // namespace tier
