#include "cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tier/json.hpp"
#include "tier/options.hpp"
#include "tier/version.hpp"

namespace tier::cli {
namespace {

std::vector<Command>& commands() {
  static std::vector<Command> list;
  return list;
}
std::string g_program = "tier";

}  // namespace

Args::Args(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0 && a.size() > 2) {
      Flag f;
      auto eq = a.find('=');
      if (eq != std::string::npos) {
        f.name = a.substr(2, eq - 2);
        f.value = a.substr(eq + 1);
      } else {
        f.name = a.substr(2);
        if (i + 1 < argc && std::string_view(argv[i + 1]).rfind("--", 0) != 0) f.value = argv[++i];
      }
      flags_.push_back(std::move(f));
    } else {
      positional_.push_back(std::move(a));
    }
  }
}

std::optional<std::string> Args::get(std::string_view name) {
  for (auto& f : flags_)
    if (f.name == name) {
      f.used = true;
      if (!f.value) std::exit(fail(fmt::format("--{} needs a value", name), 2));
      return f.value;
    }
  return std::nullopt;
}

std::string Args::get_or(std::string_view name, std::string fallback) {
  auto v = get(name);
  return v ? *v : fallback;
}

bool Args::flag(std::string_view name) {
  for (auto& f : flags_)
    if (f.name == name) {
      f.used = true;
      // A value taken greedily after a boolean flag is really a positional argument.
      if (f.value) {
        positional_.push_back(*f.value);
        f.value.reset();
      }
      return true;
    }
  return false;
}

namespace {

// Decimal digits only (no sign, space or suffix), exactly, up to 2^64 - 1; nullopt otherwise
// (strtoull would accept "-1" and " 7", and cap anything larger at 2^64 - 1 without a word).
std::optional<std::uint64_t> parse_decimal(std::string_view s) {
  if (s.empty()) return std::nullopt;
  std::uint64_t n = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (n > (UINT64_MAX - d) / 10) return std::nullopt;
    n = n * 10 + d;
  }
  return n;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A flag's value as it may be printed: JSON-escaped (a byte that is not UTF-8 shows as U+FFFD).
std::string shown(const std::string& v) { return tier::json_text(Json(v)); }

// `n` (the value of --name) in [lo, hi], or exit 2.
std::uint64_t in_range(std::string_view name, std::uint64_t n, std::uint64_t lo, std::uint64_t hi,
                       bool size) {
  if (n >= lo && n <= hi) return n;
  auto show = [&](std::uint64_t x) { return size ? format_size(x) : std::to_string(x); };
  std::exit(
      fail(hi == UINT64_MAX
               ? fmt::format("--{}: expected at least {}, got {}", name, show(lo), show(n))
               : fmt::format("--{}: expected {} to {}, got {}", name, show(lo), show(hi), show(n)),
           2));
}

// Plain digits exactly (a double would round them); with a unit through parse_size, which refuses
// fractions of a byte and anything above 1.8e19.
std::optional<std::uint64_t> size_value(const std::string& v) {
  if (v.empty()) return std::nullopt;
  return all_digits(v) ? parse_decimal(v) : parse_size(Json(v));
}

}  // namespace

std::optional<std::uint64_t> Args::size(std::string_view name, std::uint64_t lo, std::uint64_t hi) {
  auto v = get(name);
  if (!v) return std::nullopt;
  auto n = size_value(*v);
  if (!n)
    std::exit(fail(
        fmt::format("--{}: expected a size like \"1MiB\" below 16EiB, got {}", name, shown(*v)),
        2));
  return in_range(name, *n, lo, hi, true);
}

std::optional<std::uint64_t> Args::uint(std::string_view name, std::uint64_t lo, std::uint64_t hi) {
  auto v = get(name);
  if (!v) return std::nullopt;
  auto n = parse_decimal(*v);
  if (!n && all_digits(*v))
    std::exit(fail(fmt::format("--{}: {} is larger than 2^64 - 1", name, *v), 2));
  if (!n)
    std::exit(fail(fmt::format("--{}: expected an unsigned integer, got {}", name, shown(*v)), 2));
  return in_range(name, *n, lo, hi, false);
}

std::vector<std::uint64_t> Args::list(std::string_view name, const std::string& fallback,
                                      std::uint64_t lo, std::uint64_t hi, bool sizes) {
  constexpr std::size_t kMaxItems = 64;
  const std::string text = get_or(name, fallback);
  std::vector<std::uint64_t> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    auto n = sizes ? size_value(item) : parse_decimal(item);
    if (!n || out.size() == kMaxItems)
      std::exit(
          fail(fmt::format("--{}: expected a comma-separated list of at most {} {}, got {}", name,
                           kMaxItems, sizes ? "sizes" : "unsigned integers", shown(text)),
               2));
    out.push_back(in_range(name, *n, lo, hi, sizes));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

void Args::finish() {
  for (const auto& f : flags_)
    if (!f.used) std::exit(fail(fmt::format("unknown option --{}", f.name), 2));
}

bool add_command(const Command& c) {
  commands().push_back(c);
  return true;
}

int fail(std::string_view message, int code) {
  fmt::print(stderr, "{}: {}\n", g_program, message);
  return code;
}

int dispatch(std::string_view program, int argc, char** argv) {
  g_program = std::string(program);
  auto& cmds = commands();
  std::sort(cmds.begin(), cmds.end(),
            [](const Command& a, const Command& b) { return std::string_view(a.name) < b.name; });
  auto usage = [&](std::FILE* out) {
    fmt::print(out, "usage: {} COMMAND [options]   ({} --version prints the version)\n\ncommands:\n",
               program, program);
    for (const auto& c : cmds) fmt::print(out, "  {} {}\n      {}\n", program, c.usage, c.help);
  };
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  std::string_view name = argv[1];
  if (name == "help" || name == "--help" || name == "-h") {
    usage(stdout);
    return 0;
  }
  if (name == "--version") {
    fmt::print("{} {}\n", program, tier::version());
    return 0;
  }
  for (const auto& c : cmds) {
    if (name == c.name) {
      Args args(argc, argv, 2);
      if (args.flag("help")) {
        fmt::print("usage: {} {}\n{}\n", program, c.usage, c.help);
        return 0;
      }
      // The command edge: an allocation that fails is an error with a message, not an abort.
      try {
        return c.run(args);
      } catch (const std::bad_alloc&) {
        return fail(
            fmt::format("{}: out of memory (a size or count too large for this machine?)", c.name));
      }
    }
  }
  // A mistyped command gets the nearest one, not the whole usage.
  std::vector<std::string> names;
  for (const auto& c : cmds) names.emplace_back(c.name);
  const std::string hint = did_you_mean(name, names);
  if (!hint.empty())
    fmt::print(stderr, "{}: unknown command \"{}\"; did you mean \"{}\"? ({} help lists them)\n",
               program, name, hint, program);
  else
    fmt::print(stderr, "{}: unknown command \"{}\"; the commands are: {} ({} help says more)\n",
               program, name, fmt::join(names, ", "), program);
  return 2;
}

Progress::Progress(std::string label, std::uint64_t total)
    : label_(std::move(label)), total_(total), tty_(isatty(STDERR_FILENO) != 0) {}

Progress::~Progress() {
  if (tty_ && last_percent_ != 101) fmt::print(stderr, "\n");
}

void Progress::update(std::uint64_t done) {
  if (!tty_ || total_ == 0) return;
  std::uint64_t pct = std::min<std::uint64_t>(100, done * 100 / total_);
  if (pct == last_percent_) return;
  last_percent_ = pct;
  constexpr int kWidth = 40;
  int filled = static_cast<int>(pct * kWidth / 100);
  fmt::print(stderr, "\r{} [{}{}] {:3}% ({}/{})", label_, std::string(filled, '#'),
             std::string(kWidth - filled, '.'), pct, done, total_);
  std::fflush(stderr);
}

}  // namespace tier::cli
