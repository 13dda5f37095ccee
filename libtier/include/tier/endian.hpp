#pragma once
// Little-endian field access for byte formats (stored headers, AOS1, stage frames, disk records):
// fields are written byte by byte, so unaligned offsets and big-endian hosts are both fine.

#include <cstddef>
#include <cstdint>

namespace tier {

template <class T>
void put_le(std::byte* p, T v) noexcept {
  for (std::size_t i = 0; i < sizeof(T); ++i)
    p[i] = static_cast<std::byte>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff);
}

template <class T>
T get_le(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<std::uint64_t>(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
  return static_cast<T>(v);
}

}  // namespace tier
