#include "tier/key.hpp"

#include <xxhash.h>

#include <bit>
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

namespace {

constexpr std::uint64_t bytes_of(std::uint8_t b) { return 0x0101010101010101ull * b; }

// The value of 8 hex digits, the first in the lowest byte of `x` (a little-endian load), eight
// bytes at a time in one 64-bit word: no table, no branch. `bad` gets a nonzero bit for every
// byte that is not a digit (0-9, a-f, A-F). A table lookup per digit took about a fifth of the
// key parse a Python save of small objects pays per str key (perf, 2026-12-03).
std::uint32_t hex8(std::uint64_t x, std::uint64_t& bad) noexcept {
  constexpr std::uint64_t kHigh = bytes_of(0x80);
  const std::uint64_t t = x & ~kHigh;  // each byte <= 0x7f: the sums below never carry out of it
  const std::uint64_t l = t | bytes_of(0x20);  // letters in lower case
  // A byte's bit 7 of (b + 0x80 - lo) is set when b >= lo, of (b + 0x7f - hi) when b > hi.
  const std::uint64_t digit = (t + bytes_of(0x80 - '0')) & ~(t + bytes_of(0x7f - '9')) & kHigh;
  const std::uint64_t letter = (l + bytes_of(0x80 - 'a')) & ~(l + bytes_of(0x7f - 'f')) & kHigh;
  bad |= (x & kHigh) | ((digit | letter) ^ kHigh);
  // Each byte's value: its low nibble, plus 9 for a letter ('a' and 'A' end in 1).
  std::uint64_t v = (t & bytes_of(0x0f)) + (letter >> 7) * 9;
  v = ((v << 4) | (v >> 8)) & 0x00ff00ff00ff00ffull;  // digit pairs: 2k's nibble high, 2k+1's low
  v = (v | (v >> 8)) & 0x0000ffff0000ffffull;
  v = (v | (v >> 16)) & 0xffffffffull;  // the pairs in reading order from the lowest byte
  return __builtin_bswap32(static_cast<std::uint32_t>(v));
}

}  // namespace

Result<Key128> Key128::from_hex(std::string_view hex) {
  if (hex.size() != 32) return Status::invalid("a key is 32 hex digits");
  std::uint64_t w[4];
  std::memcpy(w, hex.data(), sizeof w);
  if constexpr (std::endian::native == std::endian::big)
    for (std::uint64_t& x : w) x = __builtin_bswap64(x);  // the first digit in the lowest byte
  std::uint64_t bad = 0;
  const std::uint64_t hi = (std::uint64_t{hex8(w[0], bad)} << 32) | hex8(w[1], bad);
  const std::uint64_t lo = (std::uint64_t{hex8(w[2], bad)} << 32) | hex8(w[3], bad);
  if (bad != 0) {  // name the first character that is not a digit
    for (char c : hex) {
      const unsigned char u = static_cast<unsigned char>(c), l = u | 0x20;
      if (!(u >= '0' && u <= '9') && !(l >= 'a' && l <= 'f'))
        return Status::invalid(fmt::format("not a hex digit: '{}'", c));
    }
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
