#pragma once
// Overflow-checked size arithmetic for sizes a caller hands the data path (a region list, a
// request's tail and skip, an image header's payload size): a sum that would wrap is an error,
// never a small number that a buffer is then sized by (a region of 2^64 - 8 bytes once made
// `96 + size` an 88-byte image). The stack, the C API's codec, the identity codec and
// Backend::submit's request checks use it.
//
//   std::uint64_t end;
//   if (add_overflows(offset, length, &end)) return Status::invalid("...");
//   TIER_ASSIGN_OR_RETURN(std::size_t bytes, checked_total(regions));
//
// Everything here is inline and usable from plugins.

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tier/region.hpp"
#include "tier/status.hpp"

namespace tier {

// *out = a + b; true when the sum does not fit T (then *out holds the wrapped value).
template <class T>
[[nodiscard]] constexpr bool add_overflows(T a, T b, T* out) noexcept {
  static_assert(std::is_unsigned_v<T>, "sizes are unsigned");
  return __builtin_add_overflow(a, b, out);
}

// InvalidArgument when a region's end wraps the address space (its bytes cannot exist).
inline Status check_region(const Region& r) {
  std::uintptr_t end = 0;
  if (add_overflows(reinterpret_cast<std::uintptr_t>(r.data), std::uintptr_t{r.size}, &end))
    return Status::invalid("a region of " + std::to_string(r.size) + " bytes at " +
                           std::to_string(reinterpret_cast<std::uintptr_t>(r.data)) +
                           " ends past the end of the address space");
  return Status::ok();
}

// The bytes of a scatter/gather list: InvalidArgument when a region's end wraps the address
// space or the sum does not fit. total_bytes() (tier/region.hpp) is for lists checked already.
inline Result<std::size_t> checked_total(RegionList regions) {
  std::size_t n = 0;
  for (const Region& r : regions) {
    TIER_RETURN_IF_ERROR(check_region(r));
    if (add_overflows(n, r.size, &n))
      return Status::invalid("a region list of more than 2^64 - 1 bytes");
  }
  return n;
}

}  // namespace tier
