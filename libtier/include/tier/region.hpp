#pragma once
// Region: a non-owning view of engine memory, the vocabulary type of every boundary.
//
// A Region owns nothing: whoever hands one to libtier keeps the memory alive (and, for a
// submitted request, unchanged) until the request's Completion has been reaped. Regions are
// trivially copyable and cross the plugin edge by value. Owners (HostBuffer, pinned and shared
// memory segments) live elsewhere and hand out Regions.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace tier {

enum class MemoryKind : std::uint8_t {
  kHost = 0,        // pageable host memory
  kPinnedHost = 1,  // page-locked host memory, usable by GPU DMA
  kDevice = 2,      // GPU memory; `Region::device` names the GPU
  kShm = 3,         // host memory inside a shared-memory segment
};

// Bit mask of MemoryKinds, as declared in Capabilities.
using MemoryKindMask = std::uint32_t;
constexpr MemoryKindMask kind_bit(MemoryKind k) noexcept { return 1u << static_cast<unsigned>(k); }
constexpr MemoryKindMask kHostKinds = kind_bit(MemoryKind::kHost) |
                                      kind_bit(MemoryKind::kPinnedHost) |
                                      kind_bit(MemoryKind::kShm);
std::string_view memory_kind_name(MemoryKind k) noexcept;

struct Region {
  std::byte* data = nullptr;
  std::size_t size = 0;
  MemoryKind kind = MemoryKind::kHost;
  std::int32_t device = -1;  // GPU ordinal for kDevice, else -1

  // Host-addressable bytes. Only valid for the host kinds.
  std::span<std::byte> bytes() const noexcept { return {data, size}; }
  bool host_accessible() const noexcept { return (kHostKinds & kind_bit(kind)) != 0; }
  // A sub-view [offset, offset + n). Out-of-range requests return an empty Region with
  // data == nullptr, which every consumer rejects; they never alias memory outside *this.
  Region slice(std::size_t offset, std::size_t n) const noexcept {
    if (offset > size || n > size - offset) return Region{nullptr, 0, kind, device};
    return Region{data + offset, n, kind, device};
  }
};

inline Region host_region(std::span<std::byte> s) noexcept {
  return Region{s.data(), s.size(), MemoryKind::kHost, -1};
}

// A scatter/gather list: many Regions read or written in order as one logical byte string.
using RegionList = std::span<const Region>;

inline std::size_t total_bytes(RegionList regions) noexcept {
  std::size_t n = 0;
  for (const Region& r : regions) n += r.size;
  return n;
}

}  // namespace tier
