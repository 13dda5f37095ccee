#include "resp.hpp"

#include <fmt/format.h>

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

Result<ParsedReply> parse_at(std::string_view in, std::size_t depth) {
  ParsedReply out;
  if (in.empty()) return out;
  if (depth > kMaxDepth) return protocol_error("reply nested too deep");
  const char type = in[0];
  std::string_view rest = in.substr(1);
  switch (type) {
    case '+':
    case '-': {
      std::size_t e = find_crlf(rest);
      if (e == std::string_view::npos) return out;
      out.reply.type = type == '+' ? Reply::Type::kSimple : Reply::Type::kError;
      out.reply.str.assign(rest.substr(0, e));
      out.consumed = 1 + e + 2;
      return out;
    }
    case ':': {
      TIER_ASSIGN_OR_RETURN(IntegerLine line, parse_integer_line(rest));
      if (line.consumed == 0) return out;
      out.reply.type = Reply::Type::kInteger;
      out.reply.integer = line.value;
      out.consumed = 1 + line.consumed;
      return out;
    }
    case '$': {
      TIER_ASSIGN_OR_RETURN(IntegerLine line, parse_integer_line(rest));
      if (line.consumed == 0) return out;
      if (line.value < 0) {
        out.reply.type = Reply::Type::kNil;
        out.consumed = 1 + line.consumed;
        return out;
      }
      const auto len = static_cast<std::size_t>(line.value);
      std::size_t total = 1 + line.consumed + len + 2;
      if (in.size() < total) return out;
      out.reply.type = Reply::Type::kBulk;
      out.reply.str.assign(in.substr(1 + line.consumed, len));
      out.consumed = total;
      return out;
    }
    case '*': {
      TIER_ASSIGN_OR_RETURN(IntegerLine line, parse_integer_line(rest));
      if (line.consumed == 0) return out;
      std::size_t used = 1 + line.consumed;
      if (line.value < 0) {
        out.reply.type = Reply::Type::kNil;
        out.consumed = used;
        return out;
      }
      out.reply.type = Reply::Type::kArray;
      for (std::int64_t i = 0; i < line.value; ++i) {
        TIER_ASSIGN_OR_RETURN(ParsedReply element, parse_at(in.substr(used), depth + 1));
        if (element.consumed == 0) return ParsedReply{};
        used += element.consumed;
        out.reply.elements.push_back(std::move(element.reply));
      }
      out.consumed = used;
      return out;
    }
    default:
      return protocol_error(
          fmt::format("unexpected type byte 0x{:02x}", static_cast<unsigned char>(type)));
  }
}

}  // namespace

Result<IntegerLine> parse_integer_line(std::string_view in) {
  std::size_t e = find_crlf(in);
  if (e == std::string_view::npos) {
    if (in.size() > 24) return protocol_error("integer line too long");
    return IntegerLine{};
  }
  IntegerLine line{.consumed = e + 2};
  auto [p, ec] = std::from_chars(in.data(), in.data() + e, line.value);
  if (ec != std::errc() || p != in.data() + e) return protocol_error("bad integer");
  return line;
}

Result<ParsedReply> parse_reply(std::string_view in) { return parse_at(in, 0); }

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
