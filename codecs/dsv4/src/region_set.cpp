#include "tier/dsv4/region_set.hpp"

#include <algorithm>
#include <limits>
#include <vector>

#include <fmt/format.h>

namespace tier::dsv4 {

Status check_region_set(std::span<const BoundRegion> regions, std::uint64_t count, bool reverse,
                        std::string_view what) {
  if (regions.empty()) return Status::invalid(fmt::format("{}: no regions", what));
  if (count == 0) return Status::invalid(fmt::format("{}: unit count must be positive", what));
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const BoundRegion& r = regions[i];
    auto bad = [&](std::string_view rule) {
      return Status::invalid(fmt::format("{}: region {} ({}): {}", what, i, r.role, rule));
    };
    if (r.role.empty()) return bad("empty semantic role");
    if (r.base == nullptr) return bad("base address is null");
    if (r.unit_bytes == 0) return bad("unit_bytes must be positive");
    if (count > std::numeric_limits<std::uint64_t>::max() / r.unit_bytes ||
        r.total_bytes < count * r.unit_bytes)
      return bad(fmt::format("total_bytes {} < {} units x {} bytes", r.total_bytes, count,
                             r.unit_bytes));
    if (reinterpret_cast<std::uintptr_t>(r.base) >
        std::numeric_limits<std::uintptr_t>::max() - r.total_bytes)
      return bad("region wraps the address space");
    if (r.reverse_indexed != reverse)
      return bad(reverse ? "SLOT regions must be reverse indexed"
                         : "PAGE regions must not be reverse indexed");
    if (r.kind != regions[0].kind || r.device != regions[0].device)
      return bad("all regions of a set must share one memory kind and device");
    for (std::size_t j = 0; j < i; ++j) {
      if (regions[j].role == r.role) return bad("duplicate semantic role");
      auto a0 = reinterpret_cast<std::uintptr_t>(r.base), a1 = a0 + r.total_bytes;
      auto b0 = reinterpret_cast<std::uintptr_t>(regions[j].base), b1 = b0 + regions[j].total_bytes;
      if (a0 < b1 && b0 < a1) return bad(fmt::format("overlaps region {} ({})", j, regions[j].role));
    }
  }
  return Status::ok();
}

Result<std::uint64_t> unit_index(const BoundRegion& region, std::uint64_t count, const Region& r) {
  auto bad = [&](std::string_view why) {
    return Status::invalid(fmt::format("region {}: span {} (+{}) {}", region.role,
                                       static_cast<const void*>(r.data), r.size, why));
  };
  if (r.kind != region.kind || r.device != region.device) return bad("has another memory kind");
  if (r.size != region.unit_bytes) return bad(fmt::format("is not one unit of {} bytes", region.unit_bytes));
  const auto base = reinterpret_cast<std::uintptr_t>(region.base);
  const auto addr = reinterpret_cast<std::uintptr_t>(r.data);
  if (r.data == nullptr || addr < base || addr - base >= region.total_bytes)
    return bad("lies outside the region");
  const std::uint64_t off = addr - base;
  std::uint64_t index;
  if (!region.reverse_indexed) {
    if (off % region.unit_bytes != 0) return bad("is not on a unit boundary");
    index = off / region.unit_bytes;
  } else {
    const std::uint64_t from_top = region.total_bytes - off;
    if (from_top % region.unit_bytes != 0) return bad("is not on a unit boundary");
    index = from_top / region.unit_bytes - 1;
  }
  if (index >= count) return bad(fmt::format("names unit {}, beyond the {} registered", index, count));
  return index;
}

}  // namespace tier::dsv4
