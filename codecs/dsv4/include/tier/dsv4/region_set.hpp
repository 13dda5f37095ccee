#pragma once
// Validation shared by the PAGE and SLOT codecs: a registered region set, and the mapping of a
// caller's Region back to the unit (block id or slot group) it names. Both run before any
// pointer is dereferenced.

#include <cstdint>
#include <span>
#include <string_view>

#include "tier/dsv4/geometry.hpp"
#include "tier/region.hpp"
#include "tier/status.hpp"

namespace tier::dsv4 {

// Checks a registered set: non-empty; every base non-null, unit > 0, total >= count * unit
// (no overflow); direction == `reverse` for every region (PAGE forward, SLOT reverse); roles
// non-empty and unique; one memory kind and device for the set; no two regions overlap.
// Errors: InvalidArgument naming the region and the rule.
Status check_region_set(std::span<const BoundRegion> regions, std::uint64_t count, bool reverse,
                        std::string_view what);

// The unit index (< count) whose span is exactly `r` in `region`: same kind and device, inside
// the region's live units, on a unit boundary, exactly unit_bytes long.
// Errors: InvalidArgument.
Result<std::uint64_t> unit_index(const BoundRegion& region, std::uint64_t count, const Region& r);

}  // namespace tier::dsv4
