#pragma once
// BLAKE2b (RFC 7693), unkeyed, digest of 1 to 64 bytes, no salt or personalization: only what the
// reference's sidecar storage hash needs (dsv4/slot_codec.hpp, atom_storage_hash).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tier::dsv4 {

// Errors: none; `digest_bytes` outside [1, 64] yields an empty vector.
std::vector<std::uint8_t> blake2b(std::span<const std::byte> data, std::size_t digest_bytes);

}  // namespace tier::dsv4
