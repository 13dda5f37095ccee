#pragma once
// Copying and hashing in one pass: the XXH3-64 of a host tier's payload chunk computed from the
// registers that store it, so sealing a put reads its payload once (seal_into, tier/object.hpp).

#include <cstddef>
#include <cstdint>

namespace tier::detail {

// Copies `n` bytes from `src` to `dst` (not overlapping) and returns XXH3_64bits of them, in one
// pass over the bytes with AVX2 (each 64-byte stripe loaded once, stored and hashed from the
// same registers); without AVX2, and for inputs of at most 240 bytes (XXH3's short forms),
// memcpy then XXH3_64bits of `dst`. `stream`: non-temporal stores where `dst` is 32-byte aligned
// (for destinations nobody reads soon); the caller then fences (_mm_sfence) before it reports
// the bytes. Thread-safe; no alignment required.
std::uint64_t copy_xxh3(std::byte* dst, const std::byte* src, std::size_t n, bool stream) noexcept;

}  // namespace tier::detail
