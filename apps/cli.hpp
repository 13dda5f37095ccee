#pragma once
// Subcommand plumbing shared by tierctl and tierbench. Each subcommand lives in its own file and
// registers itself with TIER_CLI_COMMAND; main() dispatches on the first argument.
//
//   static int run_geometry(tier::cli::Args& args) { ... return 0; }
//   TIER_CLI_COMMAND(geometry, "geometry --preset NAME [--json]", "print DSV4 geometry", run_geometry)

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tier::cli {

// Flags of the form --name value, --name=value and --flag; positional arguments in order.
class Args {
 public:
  Args(int argc, char** argv, int first);
  // The value of --name, or nullopt. Marks the flag as used.
  std::optional<std::string> get(std::string_view name);
  std::string get_or(std::string_view name, std::string fallback);
  bool flag(std::string_view name);  // --name present (no value)
  // Parses a size ("1MiB") / unsigned integer flag in [lo, hi]; exits 2 with a message on
  // anything else (every count a command takes has a range, so no value can make it divide by
  // zero, loop for ever or ask for more memory than exists).
  std::optional<std::uint64_t> size(std::string_view name, std::uint64_t lo = 0,
                                    std::uint64_t hi = UINT64_MAX);
  std::optional<std::uint64_t> uint(std::string_view name, std::uint64_t lo = 0,
                                    std::uint64_t hi = UINT64_MAX);
  // A comma-separated list of unsigned integers (or, with `sizes`, of sizes like "1MiB"), each in
  // [lo, hi], at most 64 of them; `fallback` when the flag is absent. Exits 2 on a bad item.
  std::vector<std::uint64_t> list(std::string_view name, const std::string& fallback,
                                  std::uint64_t lo, std::uint64_t hi, bool sizes = false);
  const std::vector<std::string>& positional() const { return positional_; }
  // Exits 2 with a message if a flag was given that no get()/flag() asked for.
  void finish();

 private:
  struct Flag {
    std::string name;
    std::optional<std::string> value;
    bool used = false;
  };
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
};

struct Command {
  const char* name;
  const char* usage;
  const char* help;
  int (*run)(Args& args);
};

// Registration (called by TIER_CLI_COMMAND from static initializers).
bool add_command(const Command& c);
// Dispatches argv[1]: usage for "help" or "--help", the version for "--version", and
// for an unknown command the nearest one ("did you mean") or the list of commands.
int dispatch(std::string_view program, int argc, char** argv);

// Prints "program: message" to stderr and returns `code` (for `return fail(...)`).
int fail(std::string_view message, int code = 1);

// A progress bar on stderr when it is a terminal; silent otherwise.
class Progress {
 public:
  Progress(std::string label, std::uint64_t total);
  ~Progress();
  void update(std::uint64_t done);

 private:
  std::string label_;
  std::uint64_t total_;
  bool tty_;
  std::uint64_t last_percent_ = 101;
};

}  // namespace tier::cli

#define TIER_CLI_COMMAND(id, usage, help, fn) \
  static const bool tier_cli_registered_##id = ::tier::cli::add_command({#id, usage, help, fn})
