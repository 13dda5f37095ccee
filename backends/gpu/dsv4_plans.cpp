#include "dsv4_plans.hpp"

#include <unordered_set>

#include <fmt/format.h>

namespace tier::gpu {
namespace {

Status check_regions(std::span<const EngineRegion> regions, std::uint64_t count, bool reverse,
                     std::string_view what) {
  if (regions.empty()) return Status::invalid(fmt::format("{}: no regions", what));
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const EngineRegion& r = regions[i];
    if (r.base == nullptr || r.unit_bytes == 0)
      return Status::invalid(fmt::format("{} region {}: null base or zero unit", what, i));
    if (count > r.total_bytes / r.unit_bytes)
      return Status::invalid(fmt::format("{} region {}: {} units of {} bytes exceed its {} bytes",
                                         what, i, count, r.unit_bytes, r.total_bytes));
    if (r.reverse_indexed != reverse)
      return Status::invalid(fmt::format("{} region {}: must be {} indexed", what, i,
                                         reverse ? "reverse" : "forward"));
  }
  return Status::ok();
}

}  // namespace

Result<OwnedPlan> page_plan(std::span<const EngineRegion> regions, std::uint64_t num_blocks,
                            std::span<const std::uint32_t> block_ids, std::int32_t device) {
  if (num_blocks == 0) return Status::invalid("page plan: num_blocks is 0");
  TIER_RETURN_IF_ERROR(check_regions(regions, num_blocks, false, "page plan"));
  std::unordered_set<std::uint32_t> seen;
  OwnedPlan out;
  out.device = device;
  out.spans.reserve(block_ids.size() * regions.size());
  for (std::uint32_t b : block_ids) {
    if (b >= num_blocks)
      return Status::invalid(fmt::format("page plan: block {} not in [0, {})", b, num_blocks));
    if (!seen.insert(b).second)
      return Status::invalid(fmt::format("page plan: block {} listed twice", b));
    for (const EngineRegion& r : regions) {
      out.spans.push_back(CopySpan{r.base + b * r.unit_bytes, out.image_bytes, r.unit_bytes});
      out.image_bytes += r.unit_bytes;
    }
  }
  return out;
}

Result<OwnedPlan> slot_plan(std::span<const EngineRegion> regions, std::uint64_t num_slots,
                            std::uint64_t group, std::int32_t device) {
  if (group >= num_slots)
    return Status::invalid(fmt::format("slot plan: group {} not in [0, {})", group, num_slots));
  TIER_RETURN_IF_ERROR(check_regions(regions, num_slots, true, "slot plan"));
  OwnedPlan out;
  out.device = device;
  for (const EngineRegion& r : regions) {
    std::byte* unit = r.base + r.total_bytes - (group + 1) * r.unit_bytes;
    out.spans.push_back(CopySpan{unit, out.image_bytes, r.unit_bytes});
    out.image_bytes += r.unit_bytes;
  }
  return out;
}

namespace {

std::vector<std::uint64_t> page_units(std::uint64_t nope, std::uint64_t rope) {
  std::vector<std::uint64_t> u{nope};
  if (rope != 0) u.push_back(rope);
  for (int i = 0; i < 30; ++i) u.push_back(64 * 132);  // one CSA indexer block per CSA layer
  return u;
}

const std::vector<Dsv4Units>& presets() {
  // envelope_rows = 1982; slot_rows = 41,848 (fp8, mtp_k = 1): NoPE 512 B + RoPE 128 B rows.
  static const std::vector<Dsv4Units> p{
      {"v4-pro-fp8", page_units(1982 * 512, 1982 * 128), {41848ull * 512, 41848ull * 128}},
      {"v4-pro-bf16", page_units(1982 * 1024, 0), {29237248}},
  };
  return p;
}

}  // namespace

std::span<const Dsv4Units> dsv4_presets() { return presets(); }

const Dsv4Units* find_dsv4_preset(std::string_view name) {
  for (const Dsv4Units& u : presets())
    if (u.name == name) return &u;
  return nullptr;
}

}  // namespace tier::gpu
