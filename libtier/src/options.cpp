#include "tier/options.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace tier {
namespace {

// A non-negative JSON integer (nlohmann keeps literals like 512 as unsigned, but a Json built
// from a C++ int is signed).
std::optional<std::uint64_t> as_unsigned(const Json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0)
    return static_cast<std::uint64_t>(v.get<std::int64_t>());
  return std::nullopt;
}

struct TypeName {
  OptionType type;
  std::string_view name;
};
constexpr TypeName kTypeNames[] = {
    {OptionType::kBool, "bool"},     {OptionType::kUInt, "uint"},
    {OptionType::kInt, "int"},       {OptionType::kDouble, "double"},
    {OptionType::kString, "string"}, {OptionType::kPath, "path"},
    {OptionType::kSize, "size"},     {OptionType::kDuration, "duration"},
    {OptionType::kEnum, "enum"},
};

std::string_view type_name(OptionType t) {
  for (const auto& tn : kTypeNames)
    if (tn.type == t) return tn.name;
  return "?";
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

struct NumberWithUnit {
  double number = 0;
  std::string unit;
};

// Splits "12.5GiB" into 12.5 and "GiB". Returns nullopt when no number leads.
std::optional<NumberWithUnit> split_number(std::string_view s) {
  std::string t = trim(s);
  std::size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  char* end = nullptr;
  std::string num = t.substr(0, i);
  NumberWithUnit out{.number = std::strtod(num.c_str(), &end)};
  if (end != num.c_str() + num.size()) return std::nullopt;
  out.unit = trim(std::string_view(t).substr(i));
  return out;
}

struct Unit {
  std::string_view name;
  double factor;
};

// A non-negative JSON integer as is, or a string "<number><unit>" scaled by its unit's factor
// to a whole number no larger than `max`.
std::optional<std::uint64_t> parse_scaled(const Json& v, std::span<const Unit> units, double max) {
  if (v.is_number_integer()) return as_unsigned(v);
  if (!v.is_string()) return std::nullopt;
  auto split = split_number(v.get<std::string>());
  if (!split) return std::nullopt;
  for (const Unit& u : units) {
    if (split->unit != u.name) continue;
    double scaled = split->number * u.factor;
    if (scaled > max || scaled != std::floor(scaled)) return std::nullopt;
    return static_cast<std::uint64_t>(scaled);
  }
  return std::nullopt;
}

std::string range_text(const OptionSpec& s) {
  if (s.min && s.max) return fmt::format(" in [{}, {}]", *s.min, *s.max);
  if (s.min) return fmt::format(" >= {}", *s.min);
  if (s.max) return fmt::format(" <= {}", *s.max);
  return "";
}

std::string expected_text(const OptionSpec& s) {
  switch (s.type) {
    case OptionType::kBool: return "expected true or false";
    case OptionType::kUInt: return "expected an unsigned integer" + range_text(s);
    case OptionType::kInt: return "expected an integer" + range_text(s);
    case OptionType::kDouble: return "expected a number" + range_text(s);
    case OptionType::kString: return "expected a string";
    case OptionType::kPath: return "expected a path string";
    case OptionType::kSize: return "expected a size like \"64GiB\"" + range_text(s);
    case OptionType::kDuration: return "expected a duration like \"250ms\"" + range_text(s);
    case OptionType::kEnum: {
      std::string c;
      for (const auto& ch : s.choices) c += (c.empty() ? "\"" : ", \"") + ch + "\"";
      return "expected one of " + c;
    }
  }
  return "expected a value";
}

bool in_range(const OptionSpec& s, double v) {
  return (!s.min || v >= *s.min) && (!s.max || v <= *s.max);
}

// `n` as JSON when there is one and it lies within the spec's bounds.
std::optional<Json> bounded(const OptionSpec& s, std::optional<std::uint64_t> n) {
  if (n && in_range(s, static_cast<double>(*n))) return Json(*n);
  return std::nullopt;
}

// Converts one value; returns nullopt when it does not fit the spec.
std::optional<Json> convert(const OptionSpec& s, const Json& v) {
  switch (s.type) {
    case OptionType::kBool:
      if (v.is_boolean()) return v;
      return std::nullopt;
    case OptionType::kUInt: return bounded(s, as_unsigned(v));
    case OptionType::kInt:
      if (v.is_number_integer() && in_range(s, static_cast<double>(v.get<std::int64_t>())))
        return v;
      return std::nullopt;
    case OptionType::kDouble:
      if (v.is_number() && std::isfinite(v.get<double>()) && in_range(s, v.get<double>()))
        return v;
      return std::nullopt;
    case OptionType::kString:
    case OptionType::kPath:
      if (v.is_string() && (s.type == OptionType::kString || !v.get<std::string>().empty()))
        return v;
      return std::nullopt;
    case OptionType::kSize: return bounded(s, parse_size(v));
    case OptionType::kDuration: return bounded(s, parse_duration_us(v));
    case OptionType::kEnum:
      if (v.is_string() &&
          std::find(s.choices.begin(), s.choices.end(), v.get<std::string>()) != s.choices.end())
        return v;
      return std::nullopt;
  }
  return std::nullopt;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

void ConfigErrors::add(std::string path, std::string message) {
  errors_.push_back(fmt::format("{}: {}", path.empty() ? "/" : path, message));
}

std::string ConfigErrors::joined() const {
  std::string out;
  for (const auto& e : errors_) {
    if (!out.empty()) out.push_back('\n');
    out += e;
  }
  return out;
}

Status ConfigErrors::to_status() const {
  return empty() ? Status::ok() : Status::invalid(joined());
}

std::string describe_json(const Json& v) {
  switch (v.type()) {
    case Json::value_t::string:
      return "string " + json_text(v);
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::null: return "null";
    default:
      return json_text(v);
  }
}

std::optional<std::uint64_t> parse_size(const Json& v) {
  static constexpr Unit kSizeUnits[] = {
      {"", 1},           {"B", 1},
      {"KiB", 1024.0},   {"MiB", 1048576.0},
      {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"KB", 1e3},       {"MB", 1e6},
      {"GB", 1e9},       {"TB", 1e12},
      {"K", 1024.0},     {"M", 1048576.0},
      {"G", 1073741824.0},
  };
  return parse_scaled(v, kSizeUnits, 1.8e19);
}

std::optional<std::uint64_t> parse_duration_us(const Json& v) {
  static constexpr Unit kDurationUnits[] = {
      {"us", 1}, {"ms", 1e3}, {"s", 1e6}, {"m", 60e6}, {"min", 60e6},
  };
  return parse_scaled(v, kDurationUnits, 1e18);
}

namespace {

// The index of the "}" that closes the "${" at `open`, skipping nested "${...}" (in defaults).
std::size_t closing_brace(std::string_view text, std::size_t open) {
  int depth = 0;
  for (std::size_t i = open; i < text.size(); ++i) {
    if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '{') {
      ++depth;
      ++i;
    } else if (text[i] == '}' && --depth == 0) {
      return i;
    }
  }
  return std::string_view::npos;
}

constexpr int kMaxEnvNesting = 8;  // ${A:-${B:-...}} levels

Result<std::string> expand_env_at(std::string_view text, int nesting) {
  if (nesting > kMaxEnvNesting)
    return Status::invalid(fmt::format("defaults nested deeper than {} levels in \"{}\"",
                                       kMaxEnvNesting, text));
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$' || i + 1 >= text.size() || text[i + 1] != '{') {
      out.push_back(text[i]);
      continue;
    }
    std::size_t close = closing_brace(text, i);
    if (close == std::string_view::npos)
      return Status::invalid(fmt::format("unterminated \"${{\" in \"{}\"", text));
    std::string_view body = text.substr(i + 2, close - i - 2);
    std::string_view name = body, fallback;
    bool has_default = false;
    if (auto p = body.find(":-"); p != std::string_view::npos) {
      name = body.substr(0, p);
      fallback = body.substr(p + 2);
      has_default = true;
    }
    bool valid = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    });
    if (!valid)
      return Status::invalid(fmt::format("bad variable name \"{}\" in \"{}\"", name, text));
    const char* value = std::getenv(std::string(name).c_str());
    if (value != nullptr && *value != '\0') {
      out += value;
    } else if (has_default) {
      TIER_ASSIGN_OR_RETURN(std::string expanded, expand_env_at(fallback, nesting + 1));
      out += expanded;
    } else {
      return Status::invalid(fmt::format(
          "environment variable {} is not set and \"{}\" gives no default", name, text));
    }
    i = close;
  }
  return out;
}

}  // namespace

Result<std::string> expand_env(std::string_view text) { return expand_env_at(text, 0); }

std::string format_size(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return fmt::format("{}B", bytes);
  if (v == std::floor(v)) return fmt::format("{}{}", static_cast<std::uint64_t>(v), kUnits[u]);
  return fmt::format("{:.2f}{}", v, kUnits[u]);
}

std::string did_you_mean(std::string_view word, std::span<const std::string> candidates) {
  std::string best;
  std::size_t best_d = 3;
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string redact_url_passwords(std::string_view value) {
  std::string out(value);
  for (std::size_t scheme = out.find("://"); scheme != std::string::npos;
       scheme = out.find("://", scheme + 3)) {
    const std::size_t start = scheme + 3;
    const std::size_t end = out.find_first_of("/?#", start);
    const std::size_t at = out.rfind('@', end == std::string::npos ? out.size() : end);
    if (at == std::string::npos || at < start) continue;
    const std::size_t colon = out.find(':', start);
    if (colon == std::string::npos || colon > at) continue;
    out.replace(colon + 1, at - colon - 1, kRedacted);
  }
  return out;
}

std::vector<OptionSpec> parse_option_specs(std::string_view options_json) {
  Json doc = Json::parse(options_json.empty() ? std::string_view("[]") : options_json);
  if (!doc.is_array()) throw std::invalid_argument("options schema: expected a JSON array");
  std::vector<OptionSpec> specs;
  for (const Json& o : doc) {
    OptionSpec s;
    s.name = o.at("name").get<std::string>();
    auto t = o.at("type").get<std::string>();
    auto it = std::find_if(std::begin(kTypeNames), std::end(kTypeNames),
                           [&](const TypeName& tn) { return tn.name == t; });
    if (it == std::end(kTypeNames))
      throw std::invalid_argument(fmt::format("options schema: option {}: unknown type \"{}\"",
                                              s.name, t));
    s.type = it->type;
    s.doc = o.value("doc", "");
    if (s.doc.empty())
      throw std::invalid_argument(fmt::format("options schema: option {} has no doc", s.name));
    if (o.contains("min")) s.min = o["min"].get<double>();
    if (o.contains("max")) s.max = o["max"].get<double>();
    if (o.contains("choices")) s.choices = o["choices"].get<std::vector<std::string>>();
    s.secret = o.value("secret", false);
    if (o.contains("default")) {
      // Defaults are stored converted, as a given value would be; they never hold ${VAR}.
      auto conv = convert(s, o["default"]);
      if (!conv)
        throw std::invalid_argument(
            fmt::format("options schema: option {}: default {} does not fit its type", s.name,
                        json_text(o["default"])));
      s.default_value = *conv;
    }
    specs.push_back(std::move(s));
  }
  return specs;
}

Json resolve_options(const Json& given, std::span<const OptionSpec> specs, const std::string& path,
                     ConfigErrors& errors) {
  Json out = Json::object();
  if (!given.is_null() && !given.is_object()) {
    errors.add(path, "expected an object, got " + describe_json(given));
    return out;
  }
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.name);
  if (given.is_object()) {
    for (auto it = given.begin(); it != given.end(); ++it) {
      if (std::find(names.begin(), names.end(), it.key()) != names.end()) continue;
      std::string hint = did_you_mean(it.key(), names);
      errors.add(path + "/" + it.key(),
                 hint.empty() ? fmt::format("unknown option \"{}\"", it.key())
                              : fmt::format("unknown option \"{}\"; did you mean \"{}\"?",
                                            it.key(), hint));
    }
  }
  for (const auto& s : specs) {
    std::string p = path + "/" + s.name;
    if (!given.is_object() || !given.contains(s.name)) {
      if (s.default_value) {
        out[s.name] = *s.default_value;
      } else {
        errors.add(p, fmt::format("required option is missing ({})", expected_text(s)));
      }
      continue;
    }
    Json v = given[s.name];
    if (v.is_string() && v.get<std::string>().find("${") != std::string::npos) {
      auto expanded = errors.value_or_add(p, expand_env(v.get<std::string>()));
      if (!expanded) continue;
      v = *expanded;
      // A variable may carry a number or a boolean for a non-string option.
      bool textual = s.type == OptionType::kString || s.type == OptionType::kPath ||
                     s.type == OptionType::kEnum || s.type == OptionType::kSize ||
                     s.type == OptionType::kDuration;
      if (!textual) {
        if (auto parsed = parse_json(*expanded, "the variable")) v = std::move(parsed).value();
      }
    }
    auto conv = convert(s, v);
    if (!conv) {
      errors.add(p, fmt::format("{}, got {}", expected_text(s),
                                s.secret ? std::string(kRedacted) : describe_json(given[s.name])));
      continue;
    }
    out[s.name] = *conv;
  }
  return out;
}

Json options_schema_json(std::span<const OptionSpec> specs) {
  Json arr = Json::array();
  for (const auto& s : specs) {
    Json o = {{"name", s.name}, {"type", std::string(type_name(s.type))}, {"doc", s.doc}};
    if (s.default_value) o["default"] = *s.default_value;
    if (s.min) o["min"] = *s.min;
    if (s.max) o["max"] = *s.max;
    if (!s.choices.empty()) o["choices"] = s.choices;
    arr.push_back(o);
  }
  return arr;
}

}  // namespace tier
