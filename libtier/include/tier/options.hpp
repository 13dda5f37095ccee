#pragma once
// Strict, typed options: the schema every plugin declares (tier_plugin::options_json) and the
// checker the core runs before create(). Unknown keys are errors with a "did you mean" hint;
// a missing option takes its default; a present but invalid value is always an error.
// Every error names the JSON pointer, what was expected and what was found:
//   /tiers/1/capacity: expected a size like "64GiB", got -3

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tier/json.hpp"
#include "tier/status.hpp"

namespace tier {

enum class OptionType { kBool, kUInt, kInt, kDouble, kString, kPath, kSize, kDuration, kEnum };

struct OptionSpec {
  std::string name;
  OptionType type = OptionType::kString;
  std::optional<Json> default_value;  // none: the option is required
  std::string doc;
  std::optional<double> min, max;     // numeric bounds (size: bytes, duration: microseconds)
  std::vector<std::string> choices;   // kEnum
  // A credential ("secret": true in the schema): its value is never printed, neither by
  // Profile::to_json (tierctl explain) nor in an error message.
  bool secret = false;
};

// The text that stands for a secret option's value, and for the password of a URL's userinfo.
inline constexpr std::string_view kRedacted = "(redacted)";
// `value` with the password of every "scheme://user:password@host" replaced by kRedacted.
std::string redact_url_passwords(std::string_view value);

// Parses a plugin's options_json. Throws std::invalid_argument on a malformed schema (a plugin
// bug, reported when the plugin is registered).
std::vector<OptionSpec> parse_option_specs(std::string_view options_json);

// Collects config errors: "<json pointer>: <message>".
class ConfigErrors {
 public:
  void add(std::string path, std::string message);
  bool empty() const noexcept { return errors_.empty(); }
  const std::vector<std::string>& list() const noexcept { return errors_; }
  std::string joined() const;  // one error per line
  Status to_status() const;    // InvalidArgument with joined(), or OK
  // The value `result` holds; else adds its message at `path` and returns nullopt.
  template <class T>
  std::optional<T> value_or_add(std::string path, Result<T> result) {
    if (result) return std::move(result).value();
    add(std::move(path), std::string(result.status().message()));
    return std::nullopt;
  }

 private:
  std::vector<std::string> errors_;
};

// Checks `given` (an object, or null for "all defaults") against `specs`. Returns the resolved
// options: defaults filled, sizes as byte counts, durations as microseconds, strings with ${VAR}
// expanded. Errors go to `errors` with `path` as the pointer prefix.
Json resolve_options(const Json& given, std::span<const OptionSpec> specs, const std::string& path,
                     ConfigErrors& errors);

// "64GiB", "4 KiB", "1.5GB", "512", or a non-negative integer. Binary (KiB...) and decimal
// (KB...) units; a bare number is bytes.
std::optional<std::uint64_t> parse_size(const Json& value);
// "250ms", "5s", "2m", "100us", or an integer of microseconds.
std::optional<std::uint64_t> parse_duration_us(const Json& value);
// Expands ${VAR} and ${VAR:-default}; a default may itself hold ${...} (up to 8 levels:
// "${TIER_DATA_DIR:-${HOME}/x}"). Errors: InvalidArgument (an unset variable without a default, a
// bad variable name, an unterminated "${", nesting deeper than 8).
Result<std::string> expand_env(std::string_view text);
// Formats bytes as "64GiB" / "1.5MiB" / "300B".
std::string format_size(std::uint64_t bytes);
// The closest candidate to `word` within an edit distance of 2, or "".
std::string did_you_mean(std::string_view word, std::span<const std::string> candidates);
// Short description of a JSON value for error messages: `string "64"`, `-3`, `an object`.
std::string describe_json(const Json& value);
// Schema dump for `tierctl explain` and docs: [{name,type,default,doc,...}].
Json options_schema_json(std::span<const OptionSpec> specs);

}  // namespace tier
