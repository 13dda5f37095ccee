// libtier/src/xxh3.hpp built for the host: the reference the GPU's chunk verification is checked
// against (verify_kernels.hip; the GPU tests compare the device with it). Every length class of
// XXH3-64 (0, 1-3, 4-8, 9-16, 17-128, 129-240, long with and without a partial block) at every
// alignment against libxxhash, version 2's payload checksum rebuilt from it, and the host tiers'
// copy that hashes as it goes (copy_xxh3).
#include "xxh3.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <immintrin.h>
#include <vector>

#include "copy_xxh3.hpp"
#include "object_chunks.hpp"
#include "support/test_util.hpp"
#include "tier/object.hpp"

using namespace tier::gpu;
namespace xxh3 = tier::xxh3;
using tier::test::random_bytes;

// The GPU's copy of the object format's chunk (its compilers must not see tier/object.hpp).
static_assert(kChunkBytes == tier::kChecksumChunkBytes);

TEST_CASE("the GPU's chunk count is the object format's") {
  for (unsigned long long n : {0ull, 1ull, 65535ull, 65536ull, 65537ull, 40ull * 65536 + 1})
    CHECK(chunk_count(n) == tier::checksum_chunk_count(n));
}

TEST_CASE("the default secret is libxxhash's") {
  const xxh3::Secret s = xxh3::default_secret();
  CHECK(std::memcmp(s.bytes, XXH3_kSecret, xxh3::kSecretBytes) == 0);
}

TEST_CASE("hash64 equals XXH3_64bits for every length up to 2,100 at every alignment") {
  const xxh3::Secret s = xxh3::default_secret();
  const auto data = random_bytes(2200, 1);
  for (std::size_t len = 0; len <= 2100; ++len)
    for (std::size_t at = 0; at < 8; ++at) {
      const unsigned char* p = data.data() + at;
      INFO("length ", len, " offset ", at);
      REQUIRE(xxh3::hash64(p, len, s.bytes) == XXH3_64bits(p, len));
    }
}

// The word-load form the GPU hashes a chunk list with (short_hash64<true>): aligned inputs whose
// length is a multiple of 8, as a list of 0 to 30 chunk checksums is.
TEST_CASE("short_hash64 with word loads equals XXH3_64bits for aligned lists up to 240 bytes") {
  const xxh3::Secret s = xxh3::default_secret();
  const auto bytes = random_bytes(240, 4);
  std::vector<unsigned long long> words(30);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(words.data());
  for (std::size_t len = 0; len <= xxh3::kMidsizeMax; len += 8) {
    INFO("length ", len);
    REQUIRE(xxh3::short_hash64<true>(p, len, s.bytes) == XXH3_64bits(p, len));
  }
}

TEST_CASE("hash64 equals XXH3_64bits for chunk-sized and large inputs") {
  const xxh3::Secret s = xxh3::default_secret();
  const auto data = random_bytes((1u << 20) + 64, 2);
  for (std::size_t len : {4095u, 4096u, 4097u, 65535u, 65536u, 65537u, 100000u, 1u << 20}) {
    INFO("length ", len);
    CHECK(xxh3::hash64(data.data(), len, s.bytes) == XXH3_64bits(data.data(), len));
    CHECK(xxh3::hash64(data.data() + 3, len, s.bytes) == XXH3_64bits(data.data() + 3, len));
  }
}

TEST_CASE("version 2's payload checksum is hash64 of the chunks' hash64 list") {
  const xxh3::Secret s = xxh3::default_secret();
  for (std::size_t n : {0u, 1u, 240u, 65536u, 3u * 65536u + 100u, 40u * 65536u}) {
    const auto payload = random_bytes(n, 3);
    std::vector<unsigned long long> list;
    for (std::size_t lo = 0; lo < n; lo += tier::kChecksumChunkBytes)
      list.push_back(xxh3::hash64(payload.data() + lo,
                                  std::min<std::size_t>(tier::kChecksumChunkBytes, n - lo), s.bytes));
    const auto want = tier::payload_checksum(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(payload.data()), n), 2);
    INFO("payload ", n);
    CHECK(xxh3::hash64(reinterpret_cast<const unsigned char*>(list.data()), 8 * list.size(),
                       s.bytes) == want);
  }
}

// copy_xxh3, the host tiers' copy that hashes as it goes: libxxhash's XXH3 of the source, every
// byte copied and none beside, for every length class around the long path's blocks and stripes,
// at odd alignments of both sides, with cached and streamed stores.
TEST_CASE("copy_xxh3 copies exactly the bytes and returns their XXH3-64") {
  const auto src = random_bytes(300'000, 5);
  std::vector<std::size_t> lengths = {0,    1,    3,     8,     16,    17,      128,    129,  240,
                                      241,  255,  256,   257,   1023,  1024,    1025,   1087, 1088,
                                      1089, 4096, 65535, 65536, 65537, 262'144, 299'000};
  for (std::size_t n = 240; n < 2200; n += 37) lengths.push_back(n);
  for (std::size_t n : lengths) {
    for (std::size_t from : {0u, 1u, 7u, 32u}) {
      for (std::size_t to : {0u, 5u, 32u, 64u}) {
        for (bool stream : {false, true}) {
          CAPTURE(n);
          CAPTURE(from);
          CAPTURE(to);
          CAPTURE(stream);
          std::vector<std::byte> out(n + 128 + 64, std::byte{0xEE});
          // 64-byte aligned start, so `to` decides the destination's alignment
          std::byte* base = out.data() + (-reinterpret_cast<std::uintptr_t>(out.data()) % 64);
          const auto* in = reinterpret_cast<const std::byte*>(src.data()) + from;
          const std::uint64_t sum = tier::detail::copy_xxh3(base + to, in, n, stream);
          _mm_sfence();
          REQUIRE(sum == XXH3_64bits(in, n));
          REQUIRE(std::memcmp(base + to, in, n) == 0);
          CHECK(
              std::all_of(out.data(), base + to, [](std::byte b) { return b == std::byte{0xEE}; }));
          CHECK(std::all_of(base + to + n, out.data() + out.size(),
                            [](std::byte b) { return b == std::byte{0xEE}; }));
        }
      }
    }
  }
}
