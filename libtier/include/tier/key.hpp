#pragma once
// Keys and namespaces. The derivation is normative: docs/keys.md specifies it byte for byte, and
// tests/unit/key_test.cpp pins golden vectors. Keys are identical across processes, machines and
// restarts (XXH3-128 with seed 0; no per-process randomness).

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tier/json.hpp"
#include "tier/status.hpp"

namespace tier {

// A 128-bit digest. `lo` and `hi` are XXH128_hash_t's low64 and high64; the canonical byte form
// (used inside further hashes and in stored headers) is lo then hi, each little-endian.
struct Key128 {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  friend bool operator==(const Key128&, const Key128&) = default;
  bool is_zero() const noexcept { return lo == 0 && hi == 0; }
  std::string hex() const;  // 32 lower-case hex digits, hi first (big-endian reading order)
  static Result<Key128> from_hex(std::string_view hex);
};

// The identity of one stored object: which namespace, which content key, which TP rank.
// The rank is a key dimension so that each rank stores its own shard; it is not in the namespace.
struct ObjectKey {
  Key128 ns;
  Key128 id;
  std::uint32_t rank = 0;
  friend bool operator==(const ObjectKey&, const ObjectKey&) = default;
  // "<ns hex>-<id hex>-r<rank>": the name used by backends that need a textual key.
  std::string to_string() const;
};

// Canonical JSON: objects with keys sorted by UTF-8 bytes, no white space, integers in decimal,
// other numbers in the shortest form that round-trips (finite only), strings escaped as
// nlohmann::json's dump() does with ASCII output. Throws std::invalid_argument on NaN/Inf and on
// nesting deeper than kMaxJsonDepth (tier/json.hpp), nlohmann::json's type_error on a string that
// is not UTF-8.
std::string canonical_json(const Json& value);

// Namespace id = XXH3-128(seed 0) over "libtier-namespace-v1\0" followed by canonical_json(identity).
// `identity` holds every field that changes the meaning of stored bytes (model, layout version,
// dtypes, block and chunk size, TP size, DCP, geometry, speculative config, ...), but not the rank.
Result<Key128> namespace_id(const Json& identity);

// Chunk key = XXH3-128(seed 0) over
//   "libtier-chunk-v1\0" | ns (16 B) | parent (16 B) | u64 LE token count | tokens as u32 LE.
// The first chunk of a sequence has parent == Key128{} (all zero).
Key128 chunk_key(const Key128& ns, const Key128& parent, std::span<const std::uint32_t> tokens);

// The parent of the first chunk of a sequence keyed with an extra key (a LoRA adapter, the
// multimodal content hashes, a cache salt: what besides the tokens and the model makes cached KV
// differ; docs/keys.md) = XXH3-128 (seed 0) over
//   "libtier-extra-v1\0" | ns (16 B) | u64 LE byte count | the extra key's bytes.
// An empty extra key is no extra key: the first parent stays all zero.
Key128 extra_key_root(const Key128& ns, std::string_view extra_key);

// Chained keys of consecutive `chunk_tokens`-sized chunks of `tokens`. A trailing partial chunk
// gets a key only when `include_partial` is set. A non-empty `extra_key` (any bytes) is mixed into
// the first chunk (its parent is extra_key_root), so every key of the chain differs from the
// same tokens' keys without it or with another; without one the keys are those of
// libtier-chunk-v1 exactly.
std::vector<Key128> chunk_keys(const Key128& ns, std::span<const std::uint32_t> tokens,
                               std::size_t chunk_tokens, bool include_partial = false,
                               std::string_view extra_key = {});

}  // namespace tier

template <>
struct std::hash<tier::Key128> {
  std::size_t operator()(const tier::Key128& k) const noexcept {
    return static_cast<std::size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull));
  }
};
template <>
struct std::hash<tier::ObjectKey> {
  std::size_t operator()(const tier::ObjectKey& k) const noexcept {
    return static_cast<std::size_t>(k.id.lo ^ (k.ns.lo * 0x9E3779B97F4A7C15ull) ^
                                    (static_cast<std::uint64_t>(k.rank) << 47) ^ k.id.hi);
  }
};
