#pragma once
// libtier's log: what the library says about itself (a tier left out, a store opened without a
// namespace on a persistent tier, a load into buffers of the wrong size, the metrics endpoint),
// by level, to stderr or to a sink the program sets (docs/logging.md).
//
// Levels, most severe first: error, warn, info, debug. A message is emitted when its level is at
// or above the threshold, which is, from the weakest source to the strongest:
//   - warn (quiet but for warnings);
//   - a profile's "log": {"level": ...}, applied when a TierStack opens it
//     (set_default_log_level): the last profile opened wins;
//   - TIER_LOG_LEVEL in the environment (error, warn, info, debug or off), read once, at the
//     first message or level call; a profile no longer changes the level then;
//   - set_log_level(): always applies, and profiles no longer change the level after it.
//
// Threads: every function may be called from any thread at any time. log() formats nothing: the
// caller passes the finished text (check log_enabled() first when building it costs). The sink is
// called on the thread that logs, which may be a library thread (a Redis tier's I/O thread, the C
// API's transfer thread, the metrics endpoint's thread), one message at a time: calls to the sink
// are serialized. A sink must return quickly and must not call into libtier (set_log_sink from
// inside a sink deadlocks); a binding that needs a lock of its own (Python's GIL) should queue the
// message and deliver it from a thread of its own (python/libtier/_log.py does).

#include <string_view>

#include "tier/status.hpp"

namespace tier {

enum class LogLevel : int { kOff = 0, kError = 1, kWarn = 2, kInfo = 3, kDebug = 4 };

// "off", "error", "warn", "info", "debug".
std::string_view log_level_name(LogLevel level) noexcept;
// The level of a name above. Errors: InvalidArgument naming the accepted names.
Result<LogLevel> parse_log_level(std::string_view name);

// The threshold now.
LogLevel log_level() noexcept;
inline bool log_enabled(LogLevel level) noexcept {
  return level != LogLevel::kOff && static_cast<int>(level) <= static_cast<int>(log_level());
}
// Sets the threshold; profiles no longer change it afterwards.
void set_log_level(LogLevel level) noexcept;
// A profile's level: applied unless TIER_LOG_LEVEL or set_log_level chose one. Returns whether
// it applied.
bool set_default_log_level(LogLevel level) noexcept;

// Receives each message emitted: its level (never kOff) and its text (one line, no newline),
// valid only during the call.
using LogSink = void (*)(void* user, LogLevel level, std::string_view message);
// Routes messages to `sink` (null: back to stderr). When it returns, the previous sink is not
// being called and is never called again.
void set_log_sink(LogSink sink, void* user) noexcept;

// Emits `message` at `level` when log_enabled(level). Never throws; a sink's exception is dropped.
void log(LogLevel level, std::string_view message) noexcept;

}  // namespace tier
