#include "shm/blocks.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "tier/object.hpp"

namespace tier::cpu::shm {

namespace {

// Maps [p, p + n) of a shared mapping into this process (`p` page-aligned); see map_chunk().
bool map_pages(std::byte* p, std::uint64_t n, bool populate_only) noexcept {
  // MADV_POPULATE_READ (Linux 5.14): the kernel maps the range in one call, up to 16 pages per
  // fault where the pages are in memory (fault-around); tmpfs maps them writable. Earlier
  // kernels: one read per page (which also faults around).
  if (::madvise(p, n, 22 /* MADV_POPULATE_READ */) == 0) return true;
  if (populate_only) return false;
  static const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  auto* v = reinterpret_cast<volatile const std::byte*>(p);
  for (std::uint64_t off = 0; off < n; off += page) (void)v[off];
  return true;
}

}  // namespace

bool map_chunk(const Tables& t, std::uint64_t c, bool populate_only) noexcept {
  if (t.mapped[c].load(std::memory_order_relaxed) != 0) return true;
  const std::uint64_t off = c * kMapChunk;
  if (!map_pages(t.arena + off, std::min(kMapChunk, t.blocks * t.block_bytes - off), populate_only))
    return false;
  t.mapped[c].store(1, std::memory_order_relaxed);
  return true;
}

void Blocks::map(const std::byte* p, std::uint64_t n) const noexcept {
  if (t_.mapped == nullptr || n == 0) return;
  const auto begin = static_cast<std::uint64_t>(p - t_.arena);
  for (std::uint64_t c = begin / kMapChunk; c <= (begin + n - 1) / kMapChunk; ++c) map_chunk(t_, c);
}

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
    map(t_.arena + std::uint64_t{run_first} * bb + in_block, len);
    f(off, t_.arena + std::uint64_t{run_first} * bb + in_block, len);
    off += len;
    if (off < end) {
      if (!t_.block_ok(t_.next[b])) return bad(b, t_.next[b]);
      b = t_.next[b];
    }
  }
  return true;
}

Status Blocks::write_image(std::uint32_t first, std::span<const std::byte> image,
                           Stores stores) const {
  auto copy = [&](std::uint64_t begin, std::uint64_t end) {
    return for_each_run(first, begin, end, [&](std::uint64_t off, std::byte* p, std::uint64_t n) {
      copy_bytes(p, image.data() + off, n, stores);
    });
  };
  if (!crash_hook_installed()) return copy(0, image.size()) ? Status::ok() : corrupt();
  if (!copy(0, image.size() / 2)) return corrupt();
  crash_point(ShmCrashPoint::kPutCopying);
  return copy(image.size() / 2, image.size()) ? Status::ok() : corrupt();
}

Status Blocks::read_image(const ObjectKey& key, std::uint32_t first, std::uint32_t nblocks,
                          std::span<std::byte> out, Stores stores) const {
  std::uint32_t last = first;
  while (last + 1 - first < nblocks && last + 1 < t_.blocks && t_.next[last] == last + 1) ++last;
  if (!crash_hook_installed() && last + 1 - first == nblocks) {
    const std::byte* stored = t_.arena + std::uint64_t{first} * t_.block_bytes;
    map(stored, out.size());
    return copy_verified(out, {stored, out.size()}, key, stores);
  }
  auto copy = [&](std::uint64_t begin, std::uint64_t end) {
    return for_each_run(first, begin, end, [&](std::uint64_t off, std::byte* p, std::uint64_t n) {
      copy_bytes(out.data() + off, p, n, stores);
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
