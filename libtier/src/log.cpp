#include "tier/log.hpp"

#include <fmt/format.h>
#include <spdlog/logger.h>
#include <spdlog/sinks/base_sink.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

namespace tier {
namespace {

// Where the threshold came from: a later source of a lower rank does not override it.
enum Pin : int { kUnpinned = 0, kPinnedByEnv = 1, kPinnedByApi = 2 };

std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
std::atomic<int> g_pin{kUnpinned};

// The one sink of libtier's logger: the program's callback, or stderr through spdlog's pattern.
// base_sink serializes sink_it_ and set() on its mutex.
class Sink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  void set(LogSink sink, void* user) {
    std::lock_guard<std::mutex> lock(mutex_);
    sink_ = sink;
    user_ = user;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (sink_ != nullptr) {
      sink_(user_, level_of(msg.level), std::string_view(msg.payload.data(), msg.payload.size()));
      return;
    }
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
  void flush_() override { std::fflush(stderr); }

 private:
  static LogLevel level_of(spdlog::level::level_enum l) {
    switch (l) {
      case spdlog::level::err:
      case spdlog::level::critical:
        return LogLevel::kError;
      case spdlog::level::warn:
        return LogLevel::kWarn;
      case spdlog::level::info:
        return LogLevel::kInfo;
      default:
        return LogLevel::kDebug;
    }
  }
  LogSink sink_ = nullptr;
  void* user_ = nullptr;
};

spdlog::level::level_enum spdlog_level(LogLevel l) {
  switch (l) {
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kOff:
      break;
  }
  return spdlog::level::off;
}

// libtier's logger, kept out of spdlog's global registry so that a program's own spdlog loggers
// and ours never meet. Leaked on purpose: library threads may log during static destruction.
struct Logger {
  std::shared_ptr<Sink> sink = std::make_shared<Sink>();
  spdlog::logger logger{"libtier", sink};
  Logger() {
    logger.set_pattern("[%Y-%m-%d %H:%M:%S.%e] [libtier] [%l] %v");
    logger.set_level(spdlog::level::trace);  // the threshold is g_level, checked before
  }
};

Logger& logger() {
  static Logger* l = new Logger();
  return *l;
}

// Reads TIER_LOG_LEVEL once.
void init() noexcept {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("TIER_LOG_LEVEL");
    if (env == nullptr || *env == '\0') return;
    auto level = parse_log_level(env);
    if (!level) {  // straight to the logger: log() would come back here
      logger().logger.log(spdlog::level::warn, "TIER_LOG_LEVEL: {}; the level stays warn",
                          level.status().message());
      return;
    }
    if (g_pin.load() == kUnpinned) {
      g_level.store(static_cast<int>(*level));
      g_pin.store(kPinnedByEnv);
    }
  });
}

}  // namespace

std::string_view log_level_name(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::kOff:
      return "off";
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "unknown";
}

Result<LogLevel> parse_log_level(std::string_view name) {
  for (LogLevel l :
       {LogLevel::kOff, LogLevel::kError, LogLevel::kWarn, LogLevel::kInfo, LogLevel::kDebug})
    if (name == log_level_name(l)) return l;
  return Status::invalid(
      fmt::format("\"{}\" is not a log level (error, warn, info, debug or off)", name));
}

LogLevel log_level() noexcept {
  init();
  return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed));
}

void set_log_level(LogLevel level) noexcept {
  init();
  g_pin.store(kPinnedByApi);
  g_level.store(static_cast<int>(level));
}

bool set_default_log_level(LogLevel level) noexcept {
  init();
  if (g_pin.load() != kUnpinned) return false;
  g_level.store(static_cast<int>(level));
  return true;
}

void set_log_sink(LogSink sink, void* user) noexcept { logger().sink->set(sink, user); }

void log(LogLevel level, std::string_view message) noexcept {
  if (!log_enabled(level)) return;
  try {
    logger().logger.log(spdlog_level(level), "{}", message);
  } catch (...) {
  }
}

}  // namespace tier
