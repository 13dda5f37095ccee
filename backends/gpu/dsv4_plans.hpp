#pragma once
// DSV4 PAGE and SLOT moves as copy plans over device memory (reference: dsv4-page-slot.md §1.5,
// §1.7, §2.2), for the GPU executor (hip/gpu.hpp).
//
// PAGE image: block-major, region-minor, blocks in caller order, no padding:
//   b0.r0 | b0.r1 | ... | b1.r0 | ...     unit_addr(b) = base + b * unit   (forward indexed)
// SLOT image: one slot group's unit of every region, in region order:
//   r0 | r1 | ...                         unit_addr(g) = base + total - (g + 1) * unit (reverse)
// Plans are validated before any pointer is used: regions non-empty with base != null, unit > 0
// and total >= count * unit; PAGE regions forward and SLOT regions reverse indexed; block ids in
// [0, num_blocks) without duplicates; a slot group in [0, num_slots).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tier/copy_plan.hpp"
#include "tier/status.hpp"

namespace tier::gpu {

struct EngineRegion {
  std::byte* base = nullptr;
  std::uint64_t unit_bytes = 0;   // per block (PAGE) or per slot group (SLOT)
  std::uint64_t total_bytes = 0;  // full extent, >= count * unit_bytes
  bool reverse_indexed = false;
};

// A plan with its own span storage (CopyPlan only views it).
struct OwnedPlan {
  std::vector<CopySpan> spans;
  std::uint64_t image_bytes = 0;
  std::int32_t device = 0;
  CopyPlan plan() const noexcept {
    return CopyPlan{spans, MemoryKind::kDevice, device, image_bytes};
  }
};

// Errors: InvalidArgument with the offending region, block or group.
Result<OwnedPlan> page_plan(std::span<const EngineRegion> regions, std::uint64_t num_blocks,
                            std::span<const std::uint32_t> block_ids, std::int32_t device);
Result<OwnedPlan> slot_plan(std::span<const EngineRegion> regions, std::uint64_t num_slots,
                            std::uint64_t group, std::int32_t device);

// Per-block and per-slot unit sizes of the DeepSeek-V4 presets (§1.5, §2.1; V4-Pro at block 256).
struct Dsv4Units {
  std::string_view name;
  std::vector<std::uint64_t> page_units;  // one per PAGE region, in region order
  std::vector<std::uint64_t> slot_units;  // one per SLOT region (plane)
};
// "v4-pro-fp8" (PAGE 1,521,920 B/block; SLOT 26,782,720 B) and "v4-pro-bf16" (2,283,008 B;
// 29,237,248 B).
std::span<const Dsv4Units> dsv4_presets();
const Dsv4Units* find_dsv4_preset(std::string_view name);

}  // namespace tier::gpu
