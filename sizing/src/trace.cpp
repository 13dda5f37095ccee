#include "tier/sizing/trace.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "tier/json.hpp"

namespace tier::sizing {
namespace {

// `v` as an unsigned integer no larger than `max`; nlohmann's get<> would wrap -1 and truncate
// 0.5 without a word.
Result<std::uint64_t> unsigned_value(const Json& v, std::string_view field, std::uint64_t max) {
  if (v.is_number_unsigned() && v.get<std::uint64_t>() <= max) return v.get<std::uint64_t>();
  return Status::invalid(fmt::format("{}: expected an unsigned integer up to {}, got {}", field,
                                     max, tier::json_text(v)));
}

Status parse_request(const Json& j, Request& r) {
  if (!j.is_object()) return Status::invalid("not a JSON object");
  constexpr std::uint64_t kU32 = std::numeric_limits<std::uint32_t>::max();
  auto field = [&](const char* name, bool required, std::uint64_t max) -> Result<std::uint64_t> {
    auto it = j.find(name);
    if (it == j.end()) {
      if (required) return Status::invalid(fmt::format("missing \"{}\"", name));
      return std::uint64_t{0};
    }
    return unsigned_value(*it, name, max);
  };
  TIER_ASSIGN_OR_RETURN(r.timestamp_ms, field("timestamp", true, UINT64_MAX));
  TIER_ASSIGN_OR_RETURN(auto input, field("input_length", true, kU32));
  TIER_ASSIGN_OR_RETURN(auto output, field("output_length", false, kU32));
  r.input_tokens = static_cast<std::uint32_t>(input);
  r.output_tokens = static_cast<std::uint32_t>(output);
  auto ids = j.find("hash_ids");
  if (ids == j.end()) return Status::invalid("missing \"hash_ids\"");
  if (!ids->is_array())
    return Status::invalid(fmt::format("hash_ids: expected an array, got {}", ids->type_name()));
  r.blocks.clear();
  r.blocks.reserve(ids->size());
  for (std::size_t i = 0; i < ids->size(); ++i) {
    TIER_ASSIGN_OR_RETURN(auto id, unsigned_value((*ids)[i], fmt::format("hash_ids/{}", i), kU32));
    r.blocks.push_back(static_cast<std::uint32_t>(id));
  }
  return Status::ok();
}

}  // namespace

Result<TraceReader> TraceReader::open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr)
    return Status::not_found(fmt::format("{}: cannot open trace: {}", path, std::strerror(errno)));
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    std::fclose(f);
    return Status::not_found(fmt::format("{}: cannot open trace: it is a directory", path));
  }
  return TraceReader(path, f);
}

Status TraceReader::read_line() {
  text_.clear();
  char buf[64 * 1024];
  for (;;) {
    if (std::fgets(buf, sizeof buf, file_.get()) == nullptr) {
      if (std::ferror(file_.get()))
        return Status::io_error(
            fmt::format("{}:{}: read failed: {}", path_, line_ + 1, std::strerror(errno)));
      eof_ = text_.empty();
      break;
    }
    const std::size_t n = std::strlen(buf);
    text_.append(buf, n);
    if (text_.size() > kMaxTraceLineBytes + 1)
      return Status::invalid(
          fmt::format("{}:{}: line longer than {} bytes", path_, line_ + 1, kMaxTraceLineBytes));
    if (n > 0 && buf[n - 1] == '\n') break;
  }
  if (!eof_) ++line_;
  while (!text_.empty() && (text_.back() == '\n' || text_.back() == '\r')) text_.pop_back();
  return Status::ok();
}

Result<bool> TraceReader::next(Request& out) {
  for (;;) {
    TIER_RETURN_IF_ERROR(read_line());
    if (eof_) return false;
    if (text_.find_first_not_of(" \t") != std::string::npos) break;
  }
  auto j = parse_json(text_, "the line");
  if (!j) return Status::invalid(fmt::format("{}:{}: {}", path_, line_, j.status().message()));
  if (Status st = parse_request(*j, out); !st.is_ok())
    return Status::invalid(fmt::format("{}:{}: {}", path_, line_, st.message()));
  return true;
}

Result<std::vector<Request>> load_trace(const std::string& path, std::size_t limit) {
  TIER_ASSIGN_OR_RETURN(TraceReader reader, TraceReader::open(path));
  std::vector<Request> out;
  Request r;
  for (;;) {
    TIER_ASSIGN_OR_RETURN(bool more, reader.next(r));
    if (!more) break;
    out.push_back(std::move(r));
    if (limit != 0 && out.size() == limit) break;
  }
  return out;
}

}  // namespace tier::sizing
