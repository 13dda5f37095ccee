#include "copy_xxh3.hpp"

#define XXH_STATIC_LINKING_ONLY
#include <immintrin.h>
#include <xxhash.h>
#ifdef TIER_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h>  // XXH3_64bits becomes its runtime-dispatched form
#endif

#include <cstring>

#include "xxh3.hpp"

namespace tier::detail {
namespace {

using xxh3::u64;
using xxh3::u8;

const bool kHaveAvx2 = __builtin_cpu_supports("avx2");
// Read once at load time (default_secret copies a constant of libxxhash's header).
const xxh3::Secret kSecret = xxh3::default_secret();

#define TIER_AVX2 __attribute__((target("avx2"), always_inline)) inline

// One 64-byte stripe: loaded, stored to `out` (unless null), and accumulated into the eight
// lanes (a0: 0-3, a1: 4-7) as XXH3's long loop does: acc[i] += lo32(v ^ k) * hi32(v ^ k) and
// acc[i ^ 1] += v, for the stripe's words v and the secret's words k at `key`.
template <bool Stream>
TIER_AVX2 void stripe(__m256i& a0, __m256i& a1, const std::byte* in, std::byte* out,
                      const u8* key) {
  const __m256i d0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
  const __m256i d1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 32));
  if (out != nullptr) {
    if constexpr (Stream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(out), d0);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(out + 32), d1);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), d0);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32), d1);
    }
  }
  const __m256i x0 =
      _mm256_xor_si256(d0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key)));
  const __m256i x1 =
      _mm256_xor_si256(d1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + 32)));
  // (x >> 32) of each lane into its low half, for the 32 x 32 -> 64 product with x's low half.
  const __m256i p0 = _mm256_mul_epu32(x0, _mm256_shuffle_epi32(x0, _MM_SHUFFLE(0, 3, 0, 1)));
  const __m256i p1 = _mm256_mul_epu32(x1, _mm256_shuffle_epi32(x1, _MM_SHUFFLE(0, 3, 0, 1)));
  // The words with their partner lane's (i ^ 1): the two 64-bit halves of each 128 swapped.
  a0 =
      _mm256_add_epi64(p0, _mm256_add_epi64(a0, _mm256_shuffle_epi32(d0, _MM_SHUFFLE(1, 0, 3, 2))));
  a1 =
      _mm256_add_epi64(p1, _mm256_add_epi64(a1, _mm256_shuffle_epi32(d1, _MM_SHUFFLE(1, 0, 3, 2))));
}

// XXH3's scramble after each 1 KiB block: acc = (acc ^ (acc >> 47) ^ key) * kPrime32_1.
TIER_AVX2 __m256i scramble(__m256i a, const u8* key) {
  const __m256i prime = _mm256_set1_epi32(static_cast<int>(xxh3::kPrime32_1));
  const __m256i x = _mm256_xor_si256(_mm256_xor_si256(a, _mm256_srli_epi64(a, 47)),
                                     _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key)));
  const __m256i lo = _mm256_mul_epu32(x, prime);
  const __m256i hi = _mm256_mul_epu32(_mm256_shuffle_epi32(x, _MM_SHUFFLE(0, 3, 0, 1)), prime);
  return _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
}

// XXH3's long path (n > 240) over `src`, storing every stripe to `dst` as it goes; the bytes
// after the last whole stripe are copied at the end (the last stripe, which overlaps them, is
// hashed from `src` again).
template <bool Stream>
__attribute__((target("avx2"))) u64 copy_xxh3_long(std::byte* dst, const std::byte* src,
                                                   std::size_t n) noexcept {
  const u8* s = kSecret.bytes;
  __m256i a0 = _mm256_set_epi64x(
      static_cast<long long>(xxh3::acc_init(3)), static_cast<long long>(xxh3::acc_init(2)),
      static_cast<long long>(xxh3::acc_init(1)), static_cast<long long>(xxh3::acc_init(0)));
  __m256i a1 = _mm256_set_epi64x(
      static_cast<long long>(xxh3::acc_init(7)), static_cast<long long>(xxh3::acc_init(6)),
      static_cast<long long>(xxh3::acc_init(5)), static_cast<long long>(xxh3::acc_init(4)));
  const std::size_t blocks = (n - 1) / xxh3::kBlockBytes;
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t at = b * xxh3::kBlockBytes;
    for (unsigned k = 0; k < xxh3::kStripesPerBlock; ++k)
      stripe<Stream>(a0, a1, src + at + k * xxh3::kStripeBytes, dst + at + k * xxh3::kStripeBytes,
                     s + 8 * k);
    a0 = scramble(a0, s + xxh3::kScrambleAt);
    a1 = scramble(a1, s + xxh3::kScrambleAt + 32);
  }
  const std::size_t at = blocks * xxh3::kBlockBytes;
  const std::size_t stripes = ((n - 1) - at) / xxh3::kStripeBytes;
  for (std::size_t k = 0; k < stripes; ++k)
    stripe<Stream>(a0, a1, src + at + k * xxh3::kStripeBytes, dst + at + k * xxh3::kStripeBytes,
                   s + 8 * k);
  const std::size_t copied = at + stripes * xxh3::kStripeBytes;
  std::memcpy(dst + copied, src + copied, n - copied);
  stripe<false>(a0, a1, src + n - xxh3::kStripeBytes, nullptr, s + xxh3::kLastStripeAt);
  alignas(32) u64 acc[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(acc), a0);
  _mm256_store_si256(reinterpret_cast<__m256i*>(acc + 4), a1);
  return xxh3::merge(acc, n, s);
}

}  // namespace

std::uint64_t copy_xxh3(std::byte* dst, const std::byte* src, std::size_t n, bool stream) noexcept {
  if (!kHaveAvx2 || n <= xxh3::kMidsizeMax) {
    std::memcpy(dst, src, n);
    return XXH3_64bits(dst, n);
  }
  if (stream && reinterpret_cast<std::uintptr_t>(dst) % 32 == 0)
    return copy_xxh3_long<true>(dst, src, n);
  return copy_xxh3_long<false>(dst, src, n);
}

}  // namespace tier::detail
