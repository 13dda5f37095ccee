// hip/crc32.hpp built for the host: the piecewise CRC-32 the GPU computes for a codec's check
// (verify_kernels.hip), against zlib for lengths 0 to 5,000 and for pieces of several sizes with
// a short last one, combined the way the kernel combines them.
#include "crc32.hpp"

#include <doctest/doctest.h>
#include <zlib.h>

#include <vector>

#include "support/test_util.hpp"

using namespace tier::gpu;
using tier::test::random_bytes;

namespace {

std::vector<crc32::u32> table() {
  std::vector<crc32::u32> t(256);
  for (crc32::u32 i = 0; i < 256; ++i) t[i] = crc32::table_entry(i);
  return t;
}

// The kernel's way: raw registers of `piece`-byte pieces, each multiplied by the shift of the
// bytes after it, xor-ed together, then finished.
crc32::u32 pieces_crc(const std::vector<unsigned char>& d, std::size_t piece) {
  const auto t = table();
  crc32::u32 acc = 0;
  for (std::size_t lo = 0; lo < d.size(); lo += piece) {
    const std::size_t n = std::min(piece, d.size() - lo);
    const crc32::u32 raw = crc32::raw_update(0, d.data() + lo, n, t.data());
    acc ^= crc32::multiply(raw, crc32::shift_factor(d.size() - lo - n));
  }
  return crc32::finish(acc, d.size());
}

// The kernel's padded way (verify_kernels.hip crc_pieces): the bytes right-aligned in blocks of
// `per_block` pieces (leading zeros), a tree per block, each block shifted past the later ones.
crc32::u32 tree_crc(const std::vector<unsigned char>& d, std::size_t piece, std::size_t per_block) {
  const auto t = table();
  const std::size_t span = piece * per_block;
  const std::size_t blocks = (d.size() + span - 1) / span, pad = blocks * span - d.size();
  crc32::u32 acc = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    std::vector<crc32::u32> part(per_block, 0);
    for (std::size_t i = 0; i < per_block; ++i) {
      const std::size_t vlo = b * span + i * piece;
      if (vlo + piece <= pad) continue;
      const std::size_t lo = vlo > pad ? vlo - pad : 0, hi = vlo + piece - pad;
      part[i] = crc32::raw_update(0, d.data() + lo, hi - lo, t.data());
    }
    crc32::u32 f = crc32::shift_factor(piece);
    for (std::size_t stride = 1; stride < per_block; stride <<= 1, f = crc32::multiply(f, f))
      for (std::size_t i = 0; i + stride < per_block; i += 2 * stride)
        part[i] = crc32::multiply(part[i], f) ^ part[i + stride];
    acc ^= crc32::multiply(part[0], crc32::shift_factor((blocks - 1 - b) * span));
  }
  return crc32::finish(acc, d.size());
}

}  // namespace

TEST_CASE("one piece equals zlib's crc32 for every length up to 5,000") {
  const auto d = random_bytes(5000, 1);
  const auto t = table();
  for (std::size_t n = 0; n <= 5000; ++n) {
    INFO("length ", n);
    const crc32::u32 raw = crc32::raw_update(0, d.data(), n, t.data());
    REQUIRE(crc32::finish(raw, n) == crc32_z(0, d.data(), n));
  }
}

TEST_CASE("pieces combined equal zlib's crc32, short last piece included") {
  for (std::size_t n : {1u, 1023u, 1024u, 1025u, 70000u, 1u << 20, (3u << 20) + 77u}) {
    const auto d = random_bytes(n, static_cast<unsigned>(n));
    for (std::size_t piece : {8u, 1000u, 1024u, 4096u}) {
      INFO("length ", n, " piece ", piece);
      CHECK(pieces_crc(d, piece) == crc32_z(0, d.data(), n));
    }
  }
  for (std::size_t n : {0u, 1u, 255u, 256u, 257u, 4095u, 70000u, (3u << 20) + 77u}) {
    const auto d = random_bytes(n, static_cast<unsigned>(n) + 5);
    INFO("padded tree, length ", n);
    CHECK(tree_crc(d, 256, 16) == crc32_z(0, d.data(), n));
    CHECK(tree_crc(d, 256, 512) == crc32_z(0, d.data(), n));
  }
  // A flipped bit anywhere changes it.
  auto d = random_bytes(100000, 9);
  const auto good = pieces_crc(d, 1024);
  d[54321] ^= 0x20;
  CHECK(pieces_crc(d, 1024) != good);
}
