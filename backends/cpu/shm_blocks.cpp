#include "shm_blocks.hpp"

#include <algorithm>
#include <cstring>

#include "tier/object.hpp"

namespace tier::cpu::shm {

std::uint32_t Blocks::take(std::uint32_t n) noexcept {
  std::uint32_t first = t_.h->free_block_head, last = first;
  for (std::uint32_t k = 1; k < n; ++k) last = t_.next[last];
  t_.h->free_block_head = t_.next[last];
  t_.next[last] = kNone;
  t_.h->free_blocks.fetch_sub(n, std::memory_order_relaxed);
  return first;
}

void Blocks::give(std::uint32_t first, std::uint32_t n) noexcept {
  std::uint32_t last = first;
  for (std::uint32_t k = 1; k < n; ++k) last = t_.next[last];
  t_.next[last] = t_.h->free_block_head;
  t_.h->free_block_head = first;
  t_.h->free_blocks.fetch_add(n, std::memory_order_relaxed);
}

template <class F>
void Blocks::for_each_run(std::uint32_t first, std::uint64_t begin, std::uint64_t end,
                          F&& f) const {
  const std::uint64_t bb = t_.h->block_bytes;
  std::uint32_t b = first;
  for (std::uint64_t skip = begin / bb; skip > 0; --skip) b = t_.next[b];
  std::uint64_t off = begin;
  while (off < end) {
    std::uint64_t in_block = off % bb;
    std::uint32_t run_first = b;
    std::uint64_t run = bb - in_block;
    while (off + run < end && t_.next[b] == b + 1) {
      b = t_.next[b];
      run += bb;
    }
    std::uint64_t len = std::min(run, end - off);
    f(off, t_.arena + std::uint64_t{run_first} * bb + in_block, len);
    off += len;
    b = t_.next[b];
  }
}

void Blocks::write_image(std::uint32_t first, std::span<const std::byte> image) const {
  auto copy = [&](std::uint64_t begin, std::uint64_t end) {
    for_each_run(first, begin, end, [&](std::uint64_t off, std::byte* p, std::uint64_t n) {
      std::memcpy(p, image.data() + off, n);
    });
  };
  if (!crash_hook_installed()) return copy(0, image.size());
  copy(0, image.size() / 2);
  crash_point(ShmCrashPoint::kPutCopying);
  copy(image.size() / 2, image.size());
}

Status Blocks::read_image(const ObjectKey& key, std::uint32_t first, std::uint32_t nblocks,
                          std::span<std::byte> out) const {
  std::uint32_t last = first;
  while (last + 1 - first < nblocks && t_.next[last] == last + 1) ++last;
  if (!crash_hook_installed() && last + 1 - first == nblocks)
    return copy_verified(out, {t_.arena + std::uint64_t{first} * t_.h->block_bytes, out.size()},
                         key);
  auto copy = [&](std::uint64_t begin, std::uint64_t end) {
    for_each_run(first, begin, end, [&](std::uint64_t off, std::byte* p, std::uint64_t n) {
      std::memcpy(out.data() + off, p, n);
    });
  };
  copy(0, out.size() / 2);
  crash_point(ShmCrashPoint::kGetCopying);
  copy(out.size() / 2, out.size());
  Status v = verify_object(out, key);
  if (!v) scrub_object(out);
  return v;
}

std::vector<std::span<std::byte>> Blocks::pieces(std::uint32_t first, std::uint64_t bytes) const {
  std::vector<std::span<std::byte>> out;
  for_each_run(first, 0, bytes,
               [&](std::uint64_t, std::byte* p, std::uint64_t n) { out.emplace_back(p, n); });
  return out;
}

}  // namespace tier::cpu::shm
