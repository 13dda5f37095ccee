// tierctl plugins / tierctl options TYPE [--kind K] [--json | --markdown]
// What a profile can name: every registered and loadable backend, codec and stage, and the option
// schema each declares (tier_plugin::options_json). The option tables in the backend and codec
// READMEs are this command's --markdown output (tests/cli/option_tables_test.sh compares them).
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "cli.hpp"
#include "tier/options.hpp"
#include "tier/registry.hpp"

namespace {

constexpr tier::PluginKind kKinds[] = {tier::PluginKind::kBackend, tier::PluginKind::kCodec,
                                       tier::PluginKind::kStage};

// "4096us" / "250ms" / "5s" for a duration bound or default given in microseconds.
std::string format_duration_us(double us) {
  if (us >= 1e6 && std::fmod(us, 1e6) == 0) return fmt::format("{}s", us / 1e6);
  if (us >= 1e3 && std::fmod(us, 1e3) == 0) return fmt::format("{}ms", us / 1e3);
  return fmt::format("{}us", us);
}

std::string format_bound(const tier::OptionSpec& s, double v) {
  if (s.type == tier::OptionType::kSize) return tier::format_size(static_cast<std::uint64_t>(v));
  if (s.type == tier::OptionType::kDuration) return format_duration_us(v);
  return fmt::format("{}", v);
}

// The default as written in a profile ("16MiB", 64, true, "heap"); empty when required.
std::string format_default(const tier::OptionSpec& s) {
  if (!s.default_value) return "";
  const tier::Json& d = *s.default_value;
  if (d.is_string()) return d.get<std::string>().empty() ? "\"\"" : d.get<std::string>();
  if (s.type == tier::OptionType::kSize && d.is_number_unsigned())
    return tier::format_size(d.get<std::uint64_t>());
  if (s.type == tier::OptionType::kDuration && d.is_number())
    return format_duration_us(d.get<double>());
  return tier::json_text(d);
}

// "[512B, 4KiB]", ">= 1", "heap | shm", or empty.
std::string format_range(const tier::OptionSpec& s) {
  if (!s.choices.empty()) {
    std::string out;
    for (const auto& c : s.choices) out += (out.empty() ? "" : " | ") + c;
    return out;
  }
  if (s.min && s.max)
    return fmt::format("[{}, {}]", format_bound(s, *s.min), format_bound(s, *s.max));
  if (s.min) return ">= " + format_bound(s, *s.min);
  if (s.max) return "<= " + format_bound(s, *s.max);
  return "";
}

std::string type_of(const tier::OptionSpec& s) {
  return tier::options_schema_json(std::span(&s, 1))[0]["type"].get<std::string>();
}

// A markdown table cell: '|' escaped, backticks around code-like values.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}
std::string code(const std::string& text) { return text.empty() ? "" : "`" + cell(text) + "`"; }

const tier::PluginInfo* find_any(std::string_view name, std::optional<std::string> kind) {
  auto& registry = tier::Registry::global();
  for (tier::PluginKind k : kKinds) {
    if (kind && *kind != tier::plugin_kind_name(k)) continue;
    if (const auto* info = registry.find(k, name)) return info;
  }
  return nullptr;
}

int run_plugins(tier::cli::Args& args) {
  bool json = args.flag("json");
  args.finish();
  if (!args.positional().empty()) return tier::cli::fail("usage: tierctl plugins [--json]", 2);
  auto& registry = tier::Registry::global();
  tier::Json out = tier::Json::array();
  for (tier::PluginKind k : kKinds) {
    for (const auto& name : registry.names(k)) {
      const auto* info = registry.find(k, name);
      tier::Json o = {{"kind", std::string(tier::plugin_kind_name(k))}, {"name", name}};
      if (info != nullptr) {
        o["source"] = info->source;
        o["description"] = info->description;
        o["options"] = info->options.size();
      } else {
        o["error"] = registry.load_error(k, name);
      }
      out.push_back(o);
    }
  }
  if (json) {
    fmt::print("{}\n", tier::json_text(out, 2));
    return 0;
  }
  for (const auto& o : out) {
    if (o.contains("error")) {
      fmt::print("{:8} {:12} cannot load: {}\n", o["kind"].get<std::string>(),
                 o["name"].get<std::string>(), o["error"].get<std::string>());
      continue;
    }
    fmt::print("{:8} {:12} {} ({} option{})\n         {:12} from {}\n",
               o["kind"].get<std::string>(), o["name"].get<std::string>(),
               o["description"].get<std::string>(), o["options"].get<std::size_t>(),
               o["options"].get<std::size_t>() == 1 ? "" : "s", "", o["source"].get<std::string>());
  }
  return 0;
}

int run_options(tier::cli::Args& args) {
  bool json = args.flag("json");
  bool markdown = args.flag("markdown");
  auto kind = args.get("kind");
  args.finish();
  if (args.positional().size() != 1 || (json && markdown))
    return tier::cli::fail(
        "usage: tierctl options TYPE [--kind backend|codec|stage] [--json | --markdown]", 2);
  const std::string& name = args.positional()[0];
  const auto* info = find_any(name, kind);
  if (info == nullptr) {
    std::string why;
    for (tier::PluginKind k : kKinds) {
      std::string e = tier::Registry::global().load_error(k, name);
      if (!e.empty()) why += "; " + e;
    }
    return tier::cli::fail(
        fmt::format("no plugin named \"{}\" (see tierctl plugins){}", name, why));
  }
  if (json) {
    tier::Json o = {{"kind", std::string(tier::plugin_kind_name(info->kind))},
                    {"name", info->name},
                    {"source", info->source},
                    {"description", info->description},
                    {"options", tier::options_schema_json(info->options)}};
    fmt::print("{}\n", tier::json_text(o, 2));
    return 0;
  }
  if (markdown) {
    fmt::print("| option | type | default | range | meaning |\n|---|---|---|---|---|\n");
    for (const auto& s : info->options) {
      std::string def = s.default_value ? code(format_default(s)) : "(required)";
      fmt::print("| `{}` | {} | {} | {} | {} |\n", s.name, type_of(s), def, code(format_range(s)),
                 cell(s.doc));
    }
    return 0;
  }
  fmt::print("{} {}: {}\n  from {}\n", tier::plugin_kind_name(info->kind), info->name,
             info->description, info->source);
  if (info->options.empty()) fmt::print("  no options\n");
  for (const auto& s : info->options) {
    std::string def = s.default_value ? "default " + format_default(s) : "required";
    std::string range = format_range(s);
    fmt::print("  {} ({}, {}{})\n      {}\n", s.name, type_of(s), def,
               range.empty() ? "" : ", " + range, s.doc);
  }
  return 0;
}

}  // namespace

TIER_CLI_COMMAND(plugins, "plugins [--json]",
                 "list every registered and loadable backend, codec and stage, with where it "
                 "comes from",
                 run_plugins);
TIER_CLI_COMMAND(options, "options TYPE [--kind backend|codec|stage] [--json | --markdown]",
                 "print every option of a plugin: type, default, range or choices, doc "
                 "(--markdown: the README table)",
                 run_options);
