#pragma once
// CRC-32 as zlib computes it (reflected polynomial 0xEDB88320, initial value and final xor
// 0xFFFFFFFF), cut into pieces that many GPU threads compute at once and combine: the CRC of a
// payload range that a codec's check asks for (PayloadCheck::check_head, e.g. an AOS1 frame's
// payload CRC), computed where a pinned tier's DMA lands it. The CRC register is linear over
// GF(2): with raw(D) the register after D from 0 (no final xor),
//   raw(A || B) = raw(A) * x^(8 |B|)  ^  raw(B)        (mod the polynomial), and
//   crc32(D)    = raw(D) ^ (0xFFFFFFFF * x^(8 |D|)) ^ 0xFFFFFFFF.
// Polynomials are in zlib's reflected form (bit 31 is x^0). tests/unit/crc32_pieces_test checks
// these against zlib on the host; verify_kernels.hip runs them on the GPU.

#include "xxh3.hpp"  // TIER_HD

namespace tier::gpu::crc32 {

using u32 = unsigned int;
using u64 = unsigned long long;

inline constexpr u32 kPoly = 0xEDB88320u;

// Entry i of the byte-at-a-time table.
TIER_HD inline u32 table_entry(u32 i) {
  u32 c = i;
  for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? (c >> 1) ^ kPoly : c >> 1;
  return c;
}

// The register after `n` bytes at `p`, from `c`, with `table` (256 table_entry values).
TIER_HD inline u32 raw_update(u32 c, const unsigned char* p, u64 n, const u32* table) {
  for (u64 i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xffu] ^ (c >> 8);
  return c;
}

// a * b modulo the polynomial.
TIER_HD inline u32 multiply(u32 a, u32 b) {
  u32 product = 0;
  for (u32 m = 1u << 31; m != 0; m >>= 1) {
    if ((a & m) != 0) product ^= b;
    b = (b & 1u) != 0 ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(8 * bytes) modulo the polynomial: what a register is multiplied by when `bytes` more bytes
// follow.
TIER_HD inline u32 shift_factor(u64 bytes) {
  u32 result = 1u << 31;     // x^0
  u32 square = 1u << 23;     // x^8
  for (; bytes != 0; bytes >>= 1) {
    if ((bytes & 1u) != 0) result = multiply(result, square);
    square = multiply(square, square);
  }
  return result;
}

// zlib's crc32() of `len` bytes whose raw register (from 0) is `raw`.
TIER_HD inline u32 finish(u32 raw, u64 len) {
  return raw ^ multiply(0xFFFFFFFFu, shift_factor(len)) ^ 0xFFFFFFFFu;
}

}  // namespace tier::gpu::crc32
