#include "heap_mode.hpp"

#include <fmt/format.h>

#include <cstdlib>

#include "tier/object.hpp"
#include "tier/options.hpp"

namespace tier::cpu {

Result<std::unique_ptr<CpuMode>> HeapMode::create(const BackendContext& ctx) {
  return std::unique_ptr<CpuMode>(std::make_unique<HeapMode>(ctx.capacity_bytes));
}

HeapMode::HeapMode(std::uint64_t capacity) : HeapLru(capacity) {}

std::string HeapMode::describe(std::string_view tier_name) const {
  const Usage u = usage();
  return fmt::format("cpu heap tier \"{}\": {} of {} used, {} objects", tier_name,
                     format_size(u.used_bytes), format_size(u.capacity_bytes), u.objects);
}

HeapLru::Buffer HeapMode::allocate(std::size_t bytes) {
  auto it = spare_.find(bytes);
  if (it != spare_.end()) {
    Buffer b = std::move(it->second);
    spare_.erase(it);
    spare_bytes_ -= bytes;
    return b;
  }
  // Spare buffers of other sizes count against the capacity (used() includes the bytes just
  // reserved for this image): give them back first.
  while (!spare_.empty() && used() + spare_bytes_ > capacity()) {
    spare_bytes_ -= spare_.begin()->first;
    spare_.erase(spare_.begin());
  }
  // The image starts kImageLineOffset bytes into a 64-byte line, so that its payload starts on
  // one: the checksum of a get reads whole cache lines with every 64-byte load (XXH3's AVX-512
  // kernel runs at about 1.6x the speed of lines split in two), and a copy out of it is
  // line-aligned at its source.
  constexpr std::size_t kLine = 64;
  Buffer b;
  b.heap.reset(static_cast<std::byte*>(
      std::aligned_alloc(kLine, (kImageLineOffset + bytes + kLine - 1) / kLine * kLine)));
  if (!b.heap) return b;
  b.data = b.heap.get() + kImageLineOffset;
  b.size = bytes;
  return b;
}

void HeapMode::release(Buffer b) {
  if (!b.data) return;
  spare_bytes_ += b.size;
  std::size_t size = b.size;
  spare_.emplace(size, std::move(b));
}

}  // namespace tier::cpu
