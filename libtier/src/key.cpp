#include "tier/key.hpp"

#include <xxhash.h>

#include <array>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

namespace tier {
namespace {

void put_le64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_key(std::string& out, const Key128& k) {
  put_le64(out, k.lo);
  put_le64(out, k.hi);
}
Key128 from_xxh(XXH128_hash_t h) { return Key128{h.low64, h.high64}; }

// Throws std::invalid_argument for a non-finite number and for nesting deeper than kMaxJsonDepth
// (a document built in C++ is not bounded by parse_json).
void canonical_into(const Json& v, std::string& out, int depth = 0) {
  if (depth > kMaxJsonDepth)
    throw std::invalid_argument(
        fmt::format("canonical JSON: nested deeper than {} levels", kMaxJsonDepth));
  switch (v.type()) {
    case Json::value_t::object: {
      // nlohmann::json's default object is a std::map: keys iterate in byte order already.
      out.push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out.push_back(',');
        first = false;
        out += Json(it.key()).dump(-1, ' ', true);
        out.push_back(':');
        canonical_into(it.value(), out, depth + 1);
      }
      out.push_back('}');
      break;
    }
    case Json::value_t::array: {
      out.push_back('[');
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (i) out.push_back(',');
        canonical_into(v[i], out, depth + 1);
      }
      out.push_back(']');
      break;
    }
    case Json::value_t::number_float: {
      double d = v.get<double>();
      if (!std::isfinite(d)) throw std::invalid_argument("canonical JSON: non-finite number");
      // An integral float is written as an integer so 2.0 and 2 name the same namespace.
      if (d == std::floor(d) && std::fabs(d) < 9.007199254740992e15) {
        out += fmt::format("{}", static_cast<long long>(d));
      } else {
        out += fmt::format("{}", d);  // shortest round-trip form
      }
      break;
    }
    default:
      out += v.dump(-1, ' ', true);
  }
}

}  // namespace

std::string Key128::hex() const { return fmt::format("{:016x}{:016x}", hi, lo); }

// Each character's digit value, 0xff for a non-digit. A table, not a chain of comparisons: a
// key's 32 digits mix 0-9 and a-f at random, which a branch per character mispredicts about half
// the time (from_hex was 8% of a Python save of small objects, which parses every str key).
constexpr std::array<std::uint8_t, 256> kHexDigit = [] {
  std::array<std::uint8_t, 256> t{};
  t.fill(0xff);
  for (int c = 0; c < 10; ++c) t['0' + c] = static_cast<std::uint8_t>(c);
  for (int c = 0; c < 6; ++c) {
    t['a' + c] = static_cast<std::uint8_t>(10 + c);
    t['A' + c] = static_cast<std::uint8_t>(10 + c);
  }
  return t;
}();

Result<Key128> Key128::from_hex(std::string_view hex) {
  if (hex.size() != 32) return Status::invalid("a key is 32 hex digits");
  // Two words in registers, each its own chain: one array indexed by i / 16 went through the
  // stack on every digit (about 160 cycles a key; a Python save or load of 64-byte objects takes
  // 15-25 ns less per key this way).
  std::uint64_t hi = 0, lo = 0;
  std::uint8_t bad = 0;  // the OR of every digit value: bit 7 set when any is 0xff
  for (std::size_t i = 0; i < 16; ++i) {
    const std::uint8_t h = kHexDigit[static_cast<unsigned char>(hex[i])];
    const std::uint8_t l = kHexDigit[static_cast<unsigned char>(hex[16 + i])];
    bad |= h | l;
    hi = (hi << 4) | (h & 0xfu);
    lo = (lo << 4) | (l & 0xfu);
  }
  if (bad & 0x80u) {
    for (char c : hex)
      if (kHexDigit[static_cast<unsigned char>(c)] == 0xff)
        return Status::invalid(fmt::format("not a hex digit: '{}'", c));
  }
  return Key128{lo, hi};
}

std::string ObjectKey::to_string() const {
  return fmt::format("{}-{}-r{}", ns.hex(), id.hex(), rank);
}

std::string canonical_json(const Json& value) {
  std::string out;
  canonical_into(value, out);
  return out;
}

Result<Key128> namespace_id(const Json& identity) {
  std::string buf("libtier-namespace-v1", 20);
  buf.push_back('\0');
  try {
    canonical_into(identity, buf);
  } catch (const std::exception& e) {  // invalid_argument, or type_error for bad UTF-8
    return Status::invalid(e.what());
  }
  return from_xxh(XXH3_128bits(buf.data(), buf.size()));
}

Key128 chunk_key(const Key128& ns, const Key128& parent, std::span<const std::uint32_t> tokens) {
  std::string buf("libtier-chunk-v1", 16);
  buf.push_back('\0');
  buf.reserve(buf.size() + 40 + 4 * tokens.size());
  put_key(buf, ns);
  put_key(buf, parent);
  put_le64(buf, tokens.size());
  for (std::uint32_t t : tokens) {
    for (int i = 0; i < 4; ++i) buf.push_back(static_cast<char>((t >> (8 * i)) & 0xff));
  }
  return from_xxh(XXH3_128bits(buf.data(), buf.size()));
}

Key128 extra_key_root(const Key128& ns, std::string_view extra_key) {
  if (extra_key.empty()) return Key128{};
  std::string buf("libtier-extra-v1", 16);
  buf.push_back('\0');
  buf.reserve(buf.size() + 24 + extra_key.size());
  put_key(buf, ns);
  put_le64(buf, extra_key.size());
  buf.append(extra_key);
  return from_xxh(XXH3_128bits(buf.data(), buf.size()));
}

std::vector<Key128> chunk_keys(const Key128& ns, std::span<const std::uint32_t> tokens,
                               std::size_t chunk_tokens, bool include_partial,
                               std::string_view extra_key) {
  std::vector<Key128> keys;
  if (chunk_tokens == 0) return keys;
  Key128 parent = extra_key_root(ns, extra_key);
  for (std::size_t off = 0; off < tokens.size(); off += chunk_tokens) {
    std::size_t n = std::min(chunk_tokens, tokens.size() - off);
    if (n < chunk_tokens && !include_partial) break;
    parent = chunk_key(ns, parent, tokens.subspan(off, n));
    keys.push_back(parent);
  }
  return keys;
}

}  // namespace tier
