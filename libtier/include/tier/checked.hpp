#pragma once
// Overflow-checked size arithmetic: the one place where sizes that come from outside the library
// (a caller's regions, a record on disk, a field of a shared segment, a peer's reply, a profile)
// are added or multiplied. A sum that would wrap is an error, never a small number that a
// buffer is then sized by (a region of 2^64 - 8 bytes once made `96 + size` a 88-byte image).
//
//   std::uint64_t end;
//   if (add_overflows(offset, length, &end)) return Status::invalid("...");
//   TIER_ASSIGN_OR_RETURN(std::size_t bytes, checked_total(regions));
//
// Everything here is inline, noexcept where it returns no Status, and usable from plugins.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
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
// *out = a * b; true when the product does not fit T.
template <class T>
[[nodiscard]] constexpr bool mul_overflows(T a, T b, T* out) noexcept {
  static_assert(std::is_unsigned_v<T>, "sizes are unsigned");
  return __builtin_mul_overflow(a, b, out);
}

// a + b, or InvalidArgument "<what>: <a> + <b> does not fit in 64 bits".
inline Result<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b, std::string_view what) {
  std::uint64_t sum = 0;
  if (add_overflows(a, b, &sum))
    return Status::invalid(std::string(what) + ": " + std::to_string(a) + " + " +
                           std::to_string(b) + " does not fit in 64 bits");
  return sum;
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
