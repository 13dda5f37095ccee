#pragma once
// RESP2 (the Redis serialization protocol) pieces used by the remote tier: command encoding,
// a parser for complete replies, and Redis Cluster's key-to-slot function.
//
// User values never pass through Reply: the connection streams GET payloads straight into the
// caller's buffer and sends SET values from the caller's buffer (redis_connection.hpp). Reply is
// for the small replies of control commands (AUTH, SELECT, CLUSTER SLOTS) and status lines.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "tier/status.hpp"

namespace tier::redis {

struct Reply {
  enum class Type : std::uint8_t { kSimple, kError, kInteger, kBulk, kNil, kArray };
  Type type = Type::kNil;
  std::string str;              // kSimple, kError, kBulk
  std::int64_t integer = 0;     // kInteger
  std::vector<Reply> elements;  // kArray
};

// Bounds of one reply, chosen per request (redis_connection.hpp): the parser refuses a reply
// that declares or reaches more, whatever the server sends, before allocating for it.
struct ReplyLimits {
  std::size_t max_bytes = 0;     // a bulk string's length, and the bytes of the whole reply
                                 // (plus at most kReplyFraming of type bytes and length lines)
  std::size_t max_elements = 0;  // array elements in the whole reply, nested ones included
};
inline constexpr std::size_t kReplyFraming = 32;

// Parses one complete reply at the front of `in` into `out`, within `limits`. Memory: the
// elements of arrays are allocated as their bytes arrive, never from a declared count alone.
// Returns: the bytes consumed, 0 when `in` holds only part of a reply (always less than
// max_bytes + kReplyFraming bytes), or IoError ("redis protocol error: ...") when the bytes are
// not RESP2 or break a limit: a bulk length or array count above it, or an incomplete reply
// (a line without end, a bulk or array still arriving) that has reached max_bytes + kReplyFraming.
Result<std::size_t> parse_reply(std::string_view in, Reply& out, const ReplyLimits& limits);

// Parses a "<digits>\r\n" line after a type byte; returns the bytes consumed (0: incomplete) and
// the number, or IoError. `in` starts right after the type byte.
Result<std::size_t> parse_integer_line(std::string_view in, std::int64_t& value);

// A command as a RESP array of bulk strings.
std::string encode_command(std::initializer_list<std::string_view> args);
// Appends the RESP array header "*n\r\n" and returns `out`.
void append_array_header(std::string& out, std::size_t n);
// Appends one bulk string "$len\r\n<bytes>\r\n".
void append_bulk(std::string& out, std::string_view bytes);
// Appends only a bulk string's length line "$len\r\n" (the bytes and "\r\n" follow separately).
void append_bulk_header(std::string& out, std::size_t len);

// CRC16-CCITT (XModem: polynomial 0x1021, initial value 0), as Redis Cluster uses.
std::uint16_t crc16(std::string_view bytes) noexcept;
// The cluster hash slot of a key (0..16383): CRC16 of the whole key, or of the text between the
// first '{' and the next '}' when that text is not empty (a hash tag).
std::uint16_t key_slot(std::string_view key) noexcept;
inline constexpr std::size_t kClusterSlots = 16384;

}  // namespace tier::redis
