#pragma once
// XXH3-64 (seed 0) for the host and the GPU alike: the hash of object format version 2's chunk
// checksums (docs/object-format.md), so a pinned tier can verify a payload on the device where
// its bytes land, and a host tier can hash a payload in the pass that copies it (copy_xxh3.hpp).
// This is XXH3's published algorithm (xxhash 0.8) over a caller-supplied default secret: the 192
// bytes come from libxxhash's own header at run time (xxh3_secret.cpp), nothing here spells them
// out. A private header of the core that the GPU sources (hip/) include too: it includes no GPU
// runtime header and declares nothing that needs one.
//
// The scalar forms here (hash64 for any length) are the reference: tests/unit/xxh3_test checks
// them against libxxhash for every length class on the host. verify_kernels.hip computes the
// long path (> 240 bytes) with a thread block per input from the same primitives and falls back
// to short_hash64 for short inputs; the GPU tests check it against the host.
//
// Reads are byte-wise unless the caller knows its addresses are 8-byte aligned (load64_aligned);
// little-endian hosts and GPUs only (x86-64, NVIDIA, AMD).

#if defined(__CUDACC__) || defined(__HIPCC__)
#define TIER_HD __host__ __device__
#else
#define TIER_HD
#endif

namespace tier::xxh3 {

using u8 = unsigned char;
using u32 = unsigned int;
using u64 = unsigned long long;

inline constexpr u64 kPrime32_1 = 0x9E3779B1u;
inline constexpr u64 kPrime32_2 = 0x85EBCA77u;
inline constexpr u64 kPrime32_3 = 0xC2B2AE3Du;
inline constexpr u64 kPrime64_1 = 0x9E3779B185EBCA87ull;
inline constexpr u64 kPrime64_2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr u64 kPrime64_3 = 0x165667B19E3779F9ull;
inline constexpr u64 kPrime64_4 = 0x85EBCA77C2B2AE63ull;
inline constexpr u64 kPrime64_5 = 0x27D4EB2F165667C5ull;

inline constexpr unsigned kSecretBytes = 192;
inline constexpr unsigned kStripeBytes = 64;
inline constexpr unsigned kStripesPerBlock = (kSecretBytes - kStripeBytes) / 8;  // 16
inline constexpr unsigned kBlockBytes = kStripesPerBlock * kStripeBytes;         // 1024
inline constexpr unsigned kScrambleAt = kSecretBytes - kStripeBytes;             // 128
inline constexpr unsigned kLastStripeAt = kSecretBytes - kStripeBytes - 7;       // 121
inline constexpr unsigned kMergeAt = 11;
inline constexpr unsigned kMidsizeMax = 240;

// The secret, passed by value to kernels (it then lives in the kernel's parameter space).
struct Secret {
  alignas(8) u8 bytes[kSecretBytes];
};

TIER_HD inline u64 read64(const u8* p) {
  u64 v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
TIER_HD inline u32 read32(const u8* p) {
  return static_cast<u32>(p[0]) | static_cast<u32>(p[1]) << 8 | static_cast<u32>(p[2]) << 16 |
         static_cast<u32>(p[3]) << 24;
}
// The default secret, read from libxxhash's header (host code; xxh3_secret.cpp).
Secret default_secret() noexcept;

// An 8-byte little-endian load from an address the caller knows is 8-byte aligned.
TIER_HD inline u64 load64_aligned(const u8* p) { return *reinterpret_cast<const u64*>(p); }
// read64 with one aligned load when the address allows it.
TIER_HD inline u64 load64(const u8* p) {
  return (reinterpret_cast<unsigned long long>(p) & 7u) == 0 ? load64_aligned(p) : read64(p);
}

// The high 64 bits of the 128-bit product a * b. nvcc's device code has __umul64hi (one
// mul.hi.u64); everywhere else (host compilers, and clang for AMD GPUs, whose HIP 5.2 headers
// declare __umul64hi only after <hip/hip_runtime.h>) the compiler's 128-bit integer does it.
TIER_HD inline u64 mul_hi64(u64 a, u64 b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  __extension__ using u128 = unsigned __int128;
  return static_cast<u64>((static_cast<u128>(a) * b) >> 64);
#endif
}
TIER_HD inline u64 mul128_fold64(u64 a, u64 b) { return (a * b) ^ mul_hi64(a, b); }
TIER_HD inline u64 rotl64(u64 x, int r) { return (x << r) | (x >> (64 - r)); }
TIER_HD inline u64 swap64(u64 x) {
  u64 r = 0;
  for (int i = 0; i < 8; ++i) r = (r << 8) | ((x >> (8 * i)) & 0xff);
  return r;
}
TIER_HD inline u64 avalanche(u64 h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ull;
  return h ^ (h >> 32);
}
TIER_HD inline u64 xxh64_avalanche(u64 h) {
  h ^= h >> 33;
  h *= kPrime64_2;
  h ^= h >> 29;
  h *= kPrime64_3;
  return h ^ (h >> 32);
}
TIER_HD inline u64 rrmxmx(u64 h, u64 len) {
  h ^= rotl64(h, 49) ^ rotl64(h, 24);
  h *= 0x9FB21C651E98DF25ull;
  h ^= (h >> 35) + len;
  h *= 0x9FB21C651E98DF25ull;
  return h ^ (h >> 28);
}
// A word: byte-wise, or one load where the caller knows the address is 8-byte aligned.
template <bool kAligned>
TIER_HD inline u64 word64(const u8* p) {
  if constexpr (kAligned)
    return load64_aligned(p);
  else
    return read64(p);
}
// kIn, kKey: whether the input's and the secret's words are 8-byte aligned (word64).
template <bool kIn = false, bool kKey = kIn>
TIER_HD inline u64 mix16(const u8* in, const u8* secret) {
  return mul128_fold64(word64<kIn>(in) ^ word64<kKey>(secret),
                       word64<kIn>(in + 8) ^ word64<kKey>(secret + 8));
}

// The long path's primitives, one accumulator lane `i` (0..7) at a time:
//   stripe_product(v, key)   what a stripe's word v adds to acc[i] (its partner acc[i ^ 1] gets v)
//   scramble(acc, key)       acc[i] after a block, with key = the secret's word at 128 + 8i
TIER_HD inline u64 stripe_product(u64 v, u64 key) {
  const u64 k = v ^ key;
  return (k & 0xffffffffull) * (k >> 32);
}
TIER_HD inline u64 scramble(u64 acc, u64 key) { return ((acc ^ (acc >> 47)) ^ key) * kPrime32_1; }
// Accumulator i's start (0..7). Selected, not read from an array: on a GPU an array indexed at
// run time lives in local memory (by ncu on the H200, the verification kernel stored 64 bytes
// of it per thread, 2 MiB per 4 MiB batch, to read one word back).
TIER_HD inline u64 acc_init(unsigned i) {
  switch (i) {
    case 0: return kPrime32_3;
    case 1: return kPrime64_1;
    case 2: return kPrime64_2;
    case 3: return kPrime64_3;
    case 4: return kPrime64_4;
    case 5: return kPrime32_2;
    case 6: return kPrime64_5;
    default: return kPrime32_1;
  }
}
// The final value of a long input from its eight accumulators, with `keys` the secret's eight
// words from kMergeAt (unaligned: a GPU reads them once per thread block, merge_key).
TIER_HD inline u64 merge_keys(const u64 acc[8], u64 len, const u64 keys[8]) {
  u64 r = len * kPrime64_1;
  for (int j = 0; j < 4; ++j)
    r += mul128_fold64(acc[2 * j] ^ keys[2 * j], acc[2 * j + 1] ^ keys[2 * j + 1]);
  return avalanche(r);
}
TIER_HD inline u64 merge_key(const u8* secret, unsigned i) {
  return read64(secret + kMergeAt + 8 * i);
}
TIER_HD inline u64 merge(const u64 acc[8], u64 len, const u8* secret) {
  u64 keys[8];
  for (unsigned i = 0; i < 8; ++i) keys[i] = merge_key(secret, i);
  return merge_keys(acc, len, keys);
}

// Inputs of at most 240 bytes (kMidsizeMax). kAligned: `in` and `secret` are 8-byte aligned and
// `len` a multiple of 8 (a chunk list), so the words at aligned offsets are single loads (the
// GPU's verdict hashes the list that way: on the H200, byte loads and their shuffles made that
// one thread's code, run once and fetched cold, the longest part of a verification).
template <bool kAligned = false>
TIER_HD inline u64 short_hash64(const u8* in, u64 len, const u8* secret) {
  if (len == 0)
    return xxh64_avalanche(word64<kAligned>(secret + 56) ^ word64<kAligned>(secret + 64));
  if (len <= 3) {
    const u32 combined = static_cast<u32>(in[0]) << 16 | static_cast<u32>(in[len >> 1]) << 24 |
                         static_cast<u32>(in[len - 1]) | static_cast<u32>(len) << 8;
    const u64 bitflip = read32(secret) ^ read32(secret + 4);
    return xxh64_avalanche(static_cast<u64>(combined) ^ bitflip);
  }
  if (len <= 8) {
    const u64 bitflip = word64<kAligned>(secret + 8) ^ word64<kAligned>(secret + 16);
    const u64 v = read32(in + len - 4) + (static_cast<u64>(read32(in)) << 32);
    return rrmxmx(v ^ bitflip, len);
  }
  if (len <= 16) {
    const u64 lo =
        word64<kAligned>(in) ^ (word64<kAligned>(secret + 24) ^ word64<kAligned>(secret + 32));
    const u64 hi = word64<kAligned>(in + len - 8) ^
                   (word64<kAligned>(secret + 40) ^ word64<kAligned>(secret + 48));
    return avalanche(len + swap64(lo) + hi + mul128_fold64(lo, hi));
  }
  u64 acc = len * kPrime64_1;
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += mix16<kAligned>(in + 48, secret + 96);
          acc += mix16<kAligned>(in + len - 64, secret + 112);
        }
        acc += mix16<kAligned>(in + 32, secret + 64);
        acc += mix16<kAligned>(in + len - 48, secret + 80);
      }
      acc += mix16<kAligned>(in + 16, secret + 32);
      acc += mix16<kAligned>(in + len - 32, secret + 48);
    }
    acc += mix16<kAligned>(in, secret);
    acc += mix16<kAligned>(in + len - 16, secret + 16);
    return avalanche(acc);
  }
  const unsigned rounds = static_cast<unsigned>(len / 16);
  for (unsigned i = 0; i < 8; ++i) acc += mix16<kAligned>(in + 16 * i, secret + 16 * i);
  acc = avalanche(acc);
  for (unsigned i = 8; i < rounds; ++i)
    acc += mix16<kAligned, false>(in + 16 * i, secret + 16 * (i - 8) + 3);
  acc += mix16<kAligned, false>(in + len - 16, secret + 136 - 17);
  return avalanche(acc);
}

// Adds stripe `s` (at `in`, with the secret at `secret + 8s`) to the eight accumulators.
TIER_HD inline void accumulate_stripe(u64 acc[8], const u8* in, const u8* key) {
  for (unsigned i = 0; i < 8; ++i) {
    const u64 v = read64(in + 8 * i);
    acc[i ^ 1] += v;
    acc[i] += stripe_product(v, read64(key + 8 * i));
  }
}

// XXH3-64 with seed 0 of any input, one thread: the reference the kernels are checked against.
TIER_HD inline u64 hash64(const u8* in, u64 len, const u8* secret) {
  if (len <= kMidsizeMax) return short_hash64(in, len, secret);
  u64 acc[8];
  for (unsigned i = 0; i < 8; ++i) acc[i] = acc_init(i);
  const u64 blocks = (len - 1) / kBlockBytes;
  for (u64 b = 0; b < blocks; ++b) {
    for (unsigned s = 0; s < kStripesPerBlock; ++s)
      accumulate_stripe(acc, in + b * kBlockBytes + s * kStripeBytes, secret + 8 * s);
    for (unsigned i = 0; i < 8; ++i) acc[i] = scramble(acc[i], read64(secret + kScrambleAt + 8 * i));
  }
  const u64 stripes = ((len - 1) - blocks * kBlockBytes) / kStripeBytes;
  for (u64 s = 0; s < stripes; ++s)
    accumulate_stripe(acc, in + blocks * kBlockBytes + s * kStripeBytes, secret + 8 * s);
  accumulate_stripe(acc, in + len - kStripeBytes, secret + kLastStripeAt);
  return merge(acc, len, secret);
}

}  // namespace tier::xxh3
