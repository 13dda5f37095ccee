#include "resp.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>

namespace tier::redis {

namespace {

constexpr std::size_t kMaxDepth = 8;  // CLUSTER SLOTS nests 3 deep

Status protocol_error(std::string_view what) {
  return Status::io_error(fmt::format("redis protocol error: {}", what));
}

// Finds "\r\n" in `in`; returns its offset or npos.
std::size_t find_crlf(std::string_view in) {
  for (std::size_t p = in.find('\r'); p != std::string_view::npos; p = in.find('\r', p + 1))
    if (p + 1 < in.size()) {
      if (in[p + 1] == '\n') return p;
    } else {
      return std::string_view::npos;
    }
  return std::string_view::npos;
}

struct ParseState {
  const ReplyLimits& limits;
  std::size_t elements = 0;  // array elements declared so far in this reply
};

Result<std::size_t> parse_at(std::string_view in, Reply& out, std::size_t depth, ParseState& st) {
  if (in.empty()) return std::size_t{0};
  if (depth > kMaxDepth) return protocol_error("reply nested too deep");
  const char type = in[0];
  std::string_view rest = in.substr(1);
  switch (type) {
    case '+':
    case '-': {
      std::size_t e = find_crlf(rest);
      if (e == std::string_view::npos) return std::size_t{0};
      out.type = type == '+' ? Reply::Type::kSimple : Reply::Type::kError;
      out.str.assign(rest.substr(0, e));
      return 1 + e + 2;
    }
    case ':': {
      auto n = parse_integer_line(rest, out.integer);
      if (!n || *n == 0) return n;
      out.type = Reply::Type::kInteger;
      return 1 + *n;
    }
    case '$': {
      std::int64_t len = 0;
      auto n = parse_integer_line(rest, len);
      if (!n || *n == 0) return n;
      if (len < 0) {
        out.type = Reply::Type::kNil;
        return 1 + *n;
      }
      if (static_cast<std::uint64_t>(len) > st.limits.max_bytes)
        return protocol_error(fmt::format("bulk length {} is over this reply's limit of {} bytes",
                                          len, st.limits.max_bytes));
      std::size_t total = 1 + *n + static_cast<std::size_t>(len) + 2;
      if (in.size() < total) return std::size_t{0};
      out.type = Reply::Type::kBulk;
      out.str.assign(in.substr(1 + *n, static_cast<std::size_t>(len)));
      return total;
    }
    case '*': {
      std::int64_t count = 0;
      auto n = parse_integer_line(rest, count);
      if (!n || *n == 0) return n;
      std::size_t used = 1 + *n;
      if (count < 0) {
        out.type = Reply::Type::kNil;
        return used;
      }
      if (static_cast<std::uint64_t>(count) > st.limits.max_elements - st.elements)
        return protocol_error(fmt::format("array of {} elements is over this reply's limit of {}",
                                          count, st.limits.max_elements));
      st.elements += static_cast<std::size_t>(count);
      out.type = Reply::Type::kArray;
      out.elements.clear();
      // Room for what can have arrived (an element takes at least 3 bytes), not for the count.
      out.elements.reserve(std::min(static_cast<std::size_t>(count), (in.size() - used) / 3 + 1));
      for (std::int64_t i = 0; i < count; ++i) {
        auto m = parse_at(in.substr(used), out.elements.emplace_back(), depth + 1, st);
        if (!m || *m == 0) return m;
        used += *m;
      }
      return used;
    }
    default:
      return protocol_error(
          fmt::format("unexpected type byte 0x{:02x}", static_cast<unsigned char>(type)));
  }
}

}  // namespace

Result<std::size_t> parse_integer_line(std::string_view in, std::int64_t& value) {
  std::size_t e = find_crlf(in);
  if (e == std::string_view::npos) {
    if (in.size() > 24) return protocol_error("integer line too long");
    return std::size_t{0};
  }
  auto [p, ec] = std::from_chars(in.data(), in.data() + e, value);
  if (ec != std::errc() || p != in.data() + e) return protocol_error("bad integer");
  return e + 2;
}

Result<std::size_t> parse_reply(std::string_view in, Reply& out, const ReplyLimits& limits) {
  ParseState st{limits};
  auto n = parse_at(in, out, 0, st);
  if (n && *n == 0 && in.size() >= limits.max_bytes + kReplyFraming)
    return protocol_error(fmt::format(
        "reply still incomplete after {} bytes, over this reply's limit of {} bytes (a line "
        "without end?)",
        in.size(), limits.max_bytes));
  return n;
}

void append_array_header(std::string& out, std::size_t n) {
  fmt::format_to(std::back_inserter(out), "*{}\r\n", n);
}

void append_bulk_header(std::string& out, std::size_t len) {
  fmt::format_to(std::back_inserter(out), "${}\r\n", len);
}

void append_bulk(std::string& out, std::string_view bytes) {
  append_bulk_header(out, bytes.size());
  out.append(bytes);
  out.append("\r\n");
}

std::string encode_command(std::initializer_list<std::string_view> args) {
  std::string out;
  append_array_header(out, args.size());
  for (std::string_view a : args) append_bulk(out, a);
  return out;
}

namespace {
constexpr std::array<std::uint16_t, 256> make_crc16_table() {
  std::array<std::uint16_t, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    std::uint16_t c = static_cast<std::uint16_t>(i << 8);
    for (int b = 0; b < 8; ++b)
      c = static_cast<std::uint16_t>((c & 0x8000) ? (c << 1) ^ 0x1021 : (c << 1));
    t[i] = c;
  }
  return t;
}
constexpr auto kCrc16Table = make_crc16_table();
}  // namespace

std::uint16_t crc16(std::string_view bytes) noexcept {
  std::uint16_t crc = 0;
  for (char ch : bytes)
    crc = static_cast<std::uint16_t>(
        (crc << 8) ^ kCrc16Table[((crc >> 8) ^ static_cast<unsigned char>(ch)) & 0xff]);
  return crc;
}

std::uint16_t key_slot(std::string_view key) noexcept {
  std::size_t open = key.find('{');
  if (open != std::string_view::npos) {
    std::size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return static_cast<std::uint16_t>(crc16(key) & (kClusterSlots - 1));
}

}  // namespace tier::redis
