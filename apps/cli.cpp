#include "cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "tier/json.hpp"
#include "tier/options.hpp"

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

std::optional<std::uint64_t> Args::size(std::string_view name) {
  auto v = get(name);
  if (!v) return std::nullopt;
  auto n = parse_size(Json(*v));
  if (!n) std::exit(fail(fmt::format("--{}: expected a size like \"1MiB\", got \"{}\"", name, *v), 2));
  return n;
}

std::optional<std::uint64_t> Args::uint(std::string_view name) {
  auto v = get(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || (*v)[0] == '-')
    std::exit(fail(fmt::format("--{}: expected an unsigned integer, got \"{}\"", name, *v), 2));
  return n;
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
    fmt::print(out, "usage: {} COMMAND [options]\n\ncommands:\n", program);
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
  for (const auto& c : cmds) {
    if (name == c.name) {
      Args args(argc, argv, 2);
      if (args.flag("help")) {
        fmt::print("usage: {} {}\n{}\n", program, c.usage, c.help);
        return 0;
      }
      return c.run(args);
    }
  }
  fmt::print(stderr, "{}: unknown command \"{}\"\n\n", program, name);
  usage(stderr);
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
