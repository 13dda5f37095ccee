#include "shm/blocks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "tier/object.hpp"

namespace tier::cpu::shm {

bool Blocks::walk(std::uint32_t first, std::uint32_t n, std::uint32_t& last,
                  const char* what) const {
  if (!t_.block_ok(first)) {
    t_.fault(fmt::format("{}: first block = {}, expected < {}", what, first, t_.blocks));
    return false;
  }
  last = first;
  for (std::uint32_t k = 1; k < n; ++k) {
    const std::uint32_t nx = t_.next[last];
    if (!t_.block_ok(nx)) {
      t_.fault(
          fmt::format("{} from block {}: block {} next = {} after {} of {} blocks, expected "
                      "< {}",
                      what, first, last, nx, k, n, t_.blocks));
      return false;
    }
    last = nx;
  }
  return true;
}

std::uint32_t Blocks::take(std::uint32_t n) noexcept {
  std::uint32_t first = t_.h->free_block_head, last = first;
  if (!walk(first, n, last, "free block list")) return kNone;
  t_.h->free_block_head = t_.next[last];
  t_.next[last] = kNone;
  t_.h->free_blocks.fetch_sub(n, std::memory_order_relaxed);
  return first;
}

void Blocks::give(std::uint32_t first, std::uint32_t n) noexcept {
  std::uint32_t last = first;
  if (!walk(first, n, last, "freed chain")) return;  // left for the repair to collect
  t_.next[last] = t_.h->free_block_head;
  t_.h->free_block_head = first;
  t_.h->free_blocks.fetch_add(n, std::memory_order_relaxed);
}

template <class F>
bool Blocks::for_each_run(std::uint32_t first, std::uint64_t begin, std::uint64_t end,
                          F&& f) const {
  const std::uint64_t bb = t_.block_bytes;
  auto bad = [&](std::uint32_t b, std::uint32_t nx) {
    t_.fault(fmt::format("block chain from block {}: block {} next = {}, expected < {}", first, b,
                         nx, t_.blocks));
    return false;
  };
  if (!t_.block_ok(first)) return bad(first, first);
  std::uint32_t b = first;
  for (std::uint64_t skip = begin / bb; skip > 0; --skip) {
    if (!t_.block_ok(t_.next[b])) return bad(b, t_.next[b]);
    b = t_.next[b];
  }
  // Every step moves `off` on by at least one block, so the walk ends after the image's blocks.
  std::uint64_t off = begin;
  while (off < end) {
    std::uint64_t in_block = off % bb;
    std::uint32_t run_first = b;
    std::uint64_t run = bb - in_block;
    while (off + run < end && b + 1 < t_.blocks && t_.next[b] == b + 1) {
      b = b + 1;
      run += bb;
    }
    std::uint64_t len = std::min(run, end - off);
    f(off, t_.arena + std::uint64_t{run_first} * bb + in_block, len);
    off += len;
    if (off < end) {
      if (!t_.block_ok(t_.next[b])) return bad(b, t_.next[b]);
      b = t_.next[b];
    }
  }
  return true;
}

Status Blocks::write_image(std::uint32_t first, std::span<const std::byte> image) const {
  auto copy = [&](std::uint64_t begin, std::uint64_t end) {
    return for_each_run(first, begin, end, [&](std::uint64_t off, std::byte* p, std::uint64_t n) {
      std::memcpy(p, image.data() + off, n);
    });
  };
  if (!crash_hook_installed()) return copy(0, image.size()) ? Status::ok() : corrupt();
  if (!copy(0, image.size() / 2)) return corrupt();
  crash_point(ShmCrashPoint::kPutCopying);
  return copy(image.size() / 2, image.size()) ? Status::ok() : corrupt();
}

Status Blocks::read_image(const ObjectKey& key, std::uint32_t first, std::uint32_t nblocks,
                          std::span<std::byte> out) const {
  std::uint32_t last = first;
  while (last + 1 - first < nblocks && last + 1 < t_.blocks && t_.next[last] == last + 1) ++last;
  if (!crash_hook_installed() && last + 1 - first == nblocks)
    return copy_verified(out, {t_.arena + std::uint64_t{first} * t_.block_bytes, out.size()}, key);
  auto copy = [&](std::uint64_t begin, std::uint64_t end) {
    return for_each_run(first, begin, end, [&](std::uint64_t off, std::byte* p, std::uint64_t n) {
      std::memcpy(out.data() + off, p, n);
    });
  };
  bool ok = copy(0, out.size() / 2);
  if (ok) {
    crash_point(ShmCrashPoint::kGetCopying);
    ok = copy(out.size() / 2, out.size());
  }
  Status v = ok ? verify_object(out, key) : corrupt();
  if (!v) scrub_object(out);
  return v;
}

Result<std::vector<std::span<std::byte>>> Blocks::pieces(std::uint32_t first,
                                                         std::uint64_t bytes) const {
  std::vector<std::span<std::byte>> out;
  if (!for_each_run(first, 0, bytes,
                    [&](std::uint64_t, std::byte* p, std::uint64_t n) { out.emplace_back(p, n); }))
    return corrupt();
  return out;
}

Status Blocks::corrupt() const {
  return Status(Code::kChecksumMismatch,
                fmt::format("shm segment is corrupt: {}", t_.faults->first));
}

}  // namespace tier::cpu::shm
