#pragma once
// Deterministic KV content in a dsv4::Dsv4Layout, for the code that plays an inference engine: the
// simulated engine of the tests (engine_sim.hpp) and `tierbench replay --engine`. fill_*() write
// what a forward pass would (content derived from a seed, different in every unit of a block or
// state group), zero_*() clear, and digest_*() let a restore be checked bit for bit against a
// recomputation. All of them go through dsv4::Dsv4Layout::visit_host(), so they work on host and
// device KV memory alike (device memory: synchronized copies, a tool rather than a data path)
// and follow its threading rule: never alongside the worker's use of the same layout.
//
// Errors: InvalidArgument (no such block or state group), DeviceError (device memory).
// Not installed: tests and tierbench include it from tests/support.

#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "tier/dsv4/kv_layout.hpp"

namespace tier::engine::test {

namespace kv_detail {

// xorshift64 bytes from `seed`: the content of one unit.
inline void fill_bytes(std::span<std::byte> out, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  std::size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, 8);
  }
  for (; i < out.size(); ++i) out[i] = static_cast<std::byte>(x >> (8 * (i % 8)));
}

inline Result<std::vector<Region>> block_regions(const dsv4::Dsv4Layout& l, std::uint32_t block) {
  return l.page_regions(std::span(&block, 1));
}

// Unit i of `regions` gets the bytes of seed `seed + i`.
inline Status fill_regions(dsv4::Dsv4Layout& l, const std::vector<Region>& regions, std::uint64_t seed) {
  return l.visit_host(regions, dsv4::Dsv4Layout::HostAccess::kWrite, [&](RegionList views) {
    std::uint64_t i = 0;
    for (const Region& x : views) fill_bytes(x.bytes(), seed + i++);
  });
}

inline Status zero_regions(dsv4::Dsv4Layout& l, const std::vector<Region>& regions) {
  return l.visit_host(regions, dsv4::Dsv4Layout::HostAccess::kWrite, [](RegionList views) {
    for (const Region& x : views) std::memset(x.data, 0, x.size);
  });
}

// XXH3-64 chained over the units in region order.
inline Result<std::uint64_t> digest_regions(dsv4::Dsv4Layout& l, const std::vector<Region>& regions) {
  std::uint64_t h = 0;
  TIER_RETURN_IF_ERROR(l.visit_host(regions, dsv4::Dsv4Layout::HostAccess::kRead, [&](RegionList views) {
    for (const Region& x : views) h = XXH3_64bits_withSeed(x.data, x.size, h);
  }));
  return h;
}

}  // namespace kv_detail

// Writes content derived from `seed` into every unit of block `block` / state group `group`.
inline Status fill_block(dsv4::Dsv4Layout& l, std::uint32_t block, std::uint64_t seed) {
  TIER_ASSIGN_OR_RETURN(auto r, kv_detail::block_regions(l, block));
  return kv_detail::fill_regions(l, r, seed * 1315423911ull);
}
inline Status fill_slot(dsv4::Dsv4Layout& l, std::int32_t group, std::uint64_t seed) {
  TIER_ASSIGN_OR_RETURN(auto r, l.slot_regions(group));
  return kv_detail::fill_regions(l, r, seed * 2654435761ull);
}

inline Status zero_block(dsv4::Dsv4Layout& l, std::uint32_t block) {
  TIER_ASSIGN_OR_RETURN(auto r, kv_detail::block_regions(l, block));
  return kv_detail::zero_regions(l, r);
}
inline Status zero_slot(dsv4::Dsv4Layout& l, std::int32_t group) {
  TIER_ASSIGN_OR_RETURN(auto r, l.slot_regions(group));
  return kv_detail::zero_regions(l, r);
}

// XXH3-64 over every unit of the block / group in region order: the same value for host and
// device memory holding the same bytes.
inline Result<std::uint64_t> digest_block(dsv4::Dsv4Layout& l, std::uint32_t block) {
  TIER_ASSIGN_OR_RETURN(auto r, kv_detail::block_regions(l, block));
  return kv_detail::digest_regions(l, r);
}
inline Result<std::uint64_t> digest_slot(dsv4::Dsv4Layout& l, std::int32_t group) {
  TIER_ASSIGN_OR_RETURN(auto r, l.slot_regions(group));
  return kv_detail::digest_regions(l, r);
}

}  // namespace tier::engine::test
