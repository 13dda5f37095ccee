#pragma once
// Helpers of the disk tier's tests: the backend over a fresh store directory (TempDir,
// test_util.hpp), aligned images, synchronous put/get.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "disk_backend.hpp"
#include "support/test_util.hpp"
#include "tier/object.hpp"

namespace tier::test {

inline disk::DiskOptions small_store(const std::string& path, std::uint64_t capacity = 16ull << 20,
                                     std::uint64_t region = 1ull << 20) {
  disk::DiskOptions o;
  o.path = path;
  o.capacity = capacity;
  o.region_size = region;
  o.queue_depth = 16;
  return o;
}

inline std::unique_ptr<disk::DiskBackend> open_disk(const disk::DiskOptions& o) {
  auto b = disk::DiskBackend::open("disk", o);
  if (!b) return nullptr;
  return std::move(b).value();
}

// An image padded to whole blocks in a block-aligned buffer.
struct AlignedImage {
  std::shared_ptr<std::byte[]> data;
  std::size_t image_bytes = 0;
  std::size_t padded = 0;
  Region region() const { return Region{data.get(), padded, MemoryKind::kHost, -1}; }
};

inline AlignedImage aligned_copy(const std::vector<std::byte>& img, std::size_t block = 4096) {
  AlignedImage a;
  a.image_bytes = img.size();
  a.padded = (img.size() + block - 1) / block * block;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(block, a.padded));
  std::memset(p, 0, a.padded);
  std::memcpy(p, img.data(), img.size());
  a.data = std::shared_ptr<std::byte[]>(p, [](std::byte* q) { std::free(q); });
  return a;
}

inline AlignedImage aligned_empty(std::size_t bytes, std::size_t block = 4096) {
  return aligned_copy(std::vector<std::byte>(bytes), block);
}

inline Completion put_image(Backend& b, const ObjectKey& k, const std::vector<std::byte>& img) {
  AlignedImage a = aligned_copy(img);
  return run(b, Op::kPut, k, a.region());
}

// Gets `k` and compares it with `expect`: true when it read back bit-exact.
inline Completion get_image(Backend& b, const ObjectKey& k, std::size_t capacity,
                            std::vector<std::byte>* got = nullptr) {
  AlignedImage a = aligned_empty(capacity);
  Completion c = run(b, Op::kGet, k, a.region());
  if (got != nullptr && c.status.is_ok()) got->assign(a.data.get(), a.data.get() + c.bytes);
  return c;
}

// Flips one byte of a file (through the page cache; the tier reads with O_DIRECT).
inline void flip_byte(const std::string& file, std::uint64_t offset) {
  FILE* f = std::fopen(file.c_str(), "r+b");
  if (f == nullptr) return;
  std::fseek(f, static_cast<long>(offset), SEEK_SET);
  int c = std::fgetc(f);
  std::fseek(f, static_cast<long>(offset), SEEK_SET);
  std::fputc(c ^ 0x5A, f);
  std::fclose(f);
}

// Whether this machine can run the disk tier here (io_uring and O_DIRECT); else the test skips.
inline bool disk_tier_available(std::string* why) {
  TempDir d;
  auto b = disk::DiskBackend::open("probe", small_store(d.store(), 2ull << 20, 1ull << 20));
  if (b) return true;
  *why = b.status().to_string();
  return b.status().code() != Code::kNotSupported;
}

// main() of the disk test binaries (they define DOCTEST_CONFIG_IMPLEMENT before including
// doctest): exit 77 where the disk tier cannot run, else run the doctest cases.
inline int run_disk_tests(int argc, char** argv) {
  std::string why;
  if (!disk_tier_available(&why)) {
    std::fprintf(stderr, "skipped: %s\n", why.c_str());
    return kSkip;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

}  // namespace tier::test
