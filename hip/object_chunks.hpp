#pragma once
// Object format version 2's checksum chunks (tier/object.hpp: kChecksumChunkBytes,
// checksum_chunk_count), for the translation units a GPU compiler builds. Those must not include
// tier/object.hpp: it brings nlohmann/json (through tier/key.hpp), a host-only header that
// clang 15's device compile (Debian 12's hipcc) crashes on. tests/unit/xxh3_test.cpp checks at
// compile time that these agree with tier/object.hpp, in every build.

namespace tier::gpu {

inline constexpr unsigned long long kChunkBytes = 64 * 1024;

// Chunks of a payload of `bytes` (0 for an empty one).
constexpr unsigned long long chunk_count(unsigned long long bytes) {
  return (bytes + kChunkBytes - 1) / kChunkBytes;
}

}  // namespace tier::gpu
