#pragma once
// libtier speaks JSON through nlohmann::json (Debian 12: 3.11.2, whose ABI-tagged inline namespace
// makes a plugin built against another version fail to link instead of misbehaving).
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tier/status.hpp"

namespace tier {
using Json = nlohmann::json;

// The deepest nesting accepted in JSON text handed to libtier (profiles, model identities, engine
// and layout options): every walk of a parsed document (canonical JSON, dump, validation) is then
// bounded, so hostile nesting is an error instead of a stack overflow.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text` (`what` names it in errors). Returns InvalidArgument for invalid JSON and for
// nesting deeper than kMaxJsonDepth.
inline Result<Json> parse_json(std::string_view text, std::string_view what) {
  bool too_deep = false;
  Json::parser_callback_t check = [&](int depth, Json::parse_event_t, Json&) {
    if (depth > kMaxJsonDepth) too_deep = true;
    return !too_deep;
  };
  Json j = Json::parse(text, check, false);
  if (too_deep)
    return Status::invalid(std::string(what) + " is nested deeper than " +
                           std::to_string(kMaxJsonDepth) + " levels");
  if (j.is_discarded()) return Status::invalid(std::string(what) + " is not valid JSON");
  return j;
}

// JSON text of `j` for output (metrics, tool reports, messages): a string that is not valid UTF-8
// (a path or a name that came from the environment) has each bad byte written as U+FFFD instead
// of making dump() throw. `indent` as Json::dump's (-1: one line).
inline std::string json_text(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}
}  // namespace tier
