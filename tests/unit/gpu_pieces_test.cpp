// gpu::last_piece_at, the split of a staged load and of a pinned tier's large get into long
// pieces and a short last one. Pure host arithmetic: runs without a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>

#include "gpu.hpp"

using tier::gpu::last_piece_at;

namespace {
constexpr std::uint64_t kKiB = 1024, kMiB = kKiB * kKiB;
}  // namespace

TEST_CASE("the last piece: a tenth of the bytes, at least 1 MiB, from a multiple of 64 KiB") {
  // The V4-Pro loads and the sidecar measured on the H200 (docs/gpu.md).
  CHECK(last_piece_at(24350720, 32 * kMiB) == 21889024);  // 16 blocks: 20.9 + 2.3 MiB
  CHECK(last_piece_at(26780000, 26780000) == 24117248);   // a sidecar of about 25.5 MiB
  const std::uint64_t sizes[] = {65 * kKiB, kMiB + 1, 3 * kMiB + 5,      17 * kMiB + 5,
                                 24350720,  97402880, 640 * kMiB + 12345};
  for (std::uint64_t n : sizes) {
    for (std::uint64_t most : {64 * kKiB, kMiB, 8 * kMiB, 32 * kMiB, n}) {  // a tile at least
      CAPTURE(n);
      CAPTURE(most);
      const std::uint64_t at = last_piece_at(n, std::min(most, n));
      const std::uint64_t tail = std::min(std::min(most, n), std::max(kMiB, n / 10 + 64 * kKiB));
      if (at == 0) {  // one piece: only when the bytes fit in a last piece
        CHECK(n <= tail);
        continue;
      }
      CHECK(at % (64 * kKiB) == 0);
      CHECK(at < n);
      CHECK(n - at <= std::min(most, n));  // within the piece size
      CHECK(n - at + 64 * kKiB > std::min({most, n, std::max(kMiB, n / 10)}));  // not shorter
    }
  }
}

TEST_CASE("bytes that fit in the last piece go as one") {
  CHECK(last_piece_at(0, 32 * kMiB) == 0);
  CHECK(last_piece_at(4096, 4096) == 0);
  CHECK(last_piece_at(kMiB, 32 * kMiB) == 0);
  CHECK(last_piece_at(kMiB, kMiB) == 0);
  CHECK(last_piece_at(kMiB + 64 * kKiB, 32 * kMiB) == 64 * kKiB);
}
