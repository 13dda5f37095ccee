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

struct ParsedReply {
  std::size_t consumed = 0;  // bytes of `in`; 0 when `in` holds only part of a reply
  Reply reply;
};
// Parses one complete reply at the front of `in`. Errors: IoError when the bytes are not RESP2.
Result<ParsedReply> parse_reply(std::string_view in);

struct IntegerLine {
  std::size_t consumed = 0;  // bytes of `in`; 0 when the line is incomplete
  std::int64_t value = 0;
};
// Parses a "<digits>\r\n" line after a type byte (`in` starts right after it). Errors: IoError.
Result<IntegerLine> parse_integer_line(std::string_view in);

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
