#include "pinned_heap_mode.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "tier/options.hpp"

namespace tier::cpu {

Result<std::unique_ptr<CpuMode>> PinnedHeapMode::create(const BackendContext& ctx) {
  TIER_ASSIGN_OR_RETURN(auto transfer, PinnedTransfer::create());
  TIER_ASSIGN_OR_RETURN(gpu::PinnedBuffer arena, gpu::PinnedBuffer::allocate(ctx.capacity_bytes));
  return std::unique_ptr<CpuMode>(
      new PinnedHeapMode(ctx.capacity_bytes, std::move(arena), std::move(transfer)));
}

PinnedHeapMode::PinnedHeapMode(std::uint64_t capacity, gpu::PinnedBuffer arena,
                               std::unique_ptr<PinnedTransfer> transfer)
    : HeapLru(capacity),
      arena_(std::move(arena)),
      transfer_(std::move(transfer)),
      extents_(capacity) {}

std::string PinnedHeapMode::describe(std::string_view tier_name) const {
  return fmt::format(
      "cpu heap tier \"{}\" in pinned memory: {} of {} used, {} objects, {} free extents, {} "
      "compactions",
      tier_name, format_size(usage().used_bytes), format_size(capacity()), usage().objects,
      extents_.free_extents(), compactions_);
}

void PinnedHeapMode::compact() {
  std::vector<Buffer*> live = buffers();
  std::sort(live.begin(), live.end(),
            [](const Buffer* a, const Buffer* b) { return a->data < b->data; });
  std::byte* const arena = arena_.bytes().data();
  std::byte* cursor = arena;
  for (Buffer* b : live) {
    if (b->data != cursor) std::memmove(cursor, b->data, b->size);
    b->data = cursor;
    cursor += b->size;
  }
  extents_.reset(static_cast<std::uint64_t>(cursor - arena));
  ++compactions_;
}

HeapLru::Buffer PinnedHeapMode::allocate(std::size_t bytes) {
  // Room was made (used(), these bytes included, <= capacity()), so the arena has the free bytes;
  // when they are scattered, packing the live objects makes them one extent.
  auto offset = extents_.allocate(bytes);
  if (!offset && extents_.free_bytes() >= bytes) {
    compact();
    offset = extents_.allocate(bytes);
  }
  if (!offset) return Buffer{};
  return Buffer{arena_.bytes().data() + *offset, bytes, nullptr};
}

void PinnedHeapMode::release(Buffer b) {
  if (!b.data) return;
  extents_.release(static_cast<std::uint64_t>(b.data - arena_.bytes().data()), b.size);
}

}  // namespace tier::cpu
