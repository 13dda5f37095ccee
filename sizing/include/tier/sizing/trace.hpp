#pragma once
// Mooncake-format request traces, read by tierbench (replay), tierctl (size) and the C API's
// tier_curve_from_trace (libtier_sizing, docs/sizing.md). A request is
// its ordered prefix blocks (one block = 512 tokens in the trace); equal leading block ids mean a
// reusable prefix.

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tier/status.hpp"

namespace tier::sizing {

inline constexpr std::uint32_t kTraceBlockTokens = 512;
// The longest trace line read (a request of ~1.5 million blocks); longer is an error.
inline constexpr std::size_t kMaxTraceLineBytes = 16u << 20;

struct Request {
  std::uint64_t timestamp_ms = 0;
  std::uint32_t input_tokens = 0;
  std::uint32_t output_tokens = 0;
  std::vector<std::uint32_t> blocks;  // hash ids, one per kTraceBlockTokens tokens
};

// Reads a JSON-lines trace ({"timestamp","input_length","output_length","hash_ids"} per line,
// blank lines skipped) one request at a time, in bounded memory: one line of at most
// kMaxTraceLineBytes. Every number must be an unsigned integer that fits its field. Errors name
// the file, the line and the field. Not thread-safe (one reader per thread).
class TraceReader {
 public:
  // Errors: NotFound (cannot open `path`, or it is a directory).
  static Result<TraceReader> open(const std::string& path);

  // Reads the next request into `out`; false at the end of the trace.
  // Errors: InvalidArgument (a malformed line), IoError (a read failed).
  Result<bool> next(Request& out);
  // The line number of the request last read (1-based).
  std::size_t line() const { return line_; }
  const std::string& path() const { return path_; }

 private:
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  TraceReader(std::string path, std::FILE* f) : path_(std::move(path)), file_(f) {}
  Status read_line();  // the next line into text_ (without its newline); eof_ at the end

  std::string path_;
  std::unique_ptr<std::FILE, Closer> file_;
  std::string text_;
  std::size_t line_ = 0;
  bool eof_ = false;
};

// The whole trace in memory. `limit` = 0 reads everything.
Result<std::vector<Request>> load_trace(const std::string& path, std::size_t limit = 0);

}  // namespace tier::sizing
