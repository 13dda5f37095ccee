// The C API's log calls (tier/tier.h, "Log"): libtier's log (tier/log.hpp) with C levels and a C
// sink.
#include "tier/log.hpp"

#include <string>

#include "capi_internal.hpp"

namespace {

struct CSink {
  tier_log_fn fn = nullptr;
  void* user = nullptr;
};
CSink g_sink;  // written only with no sink installed (tier_log_set_sink's order below)

// The core's sink: hands the C sink a NUL-terminated copy of the message.
void forward(void* user, tier::LogLevel level, std::string_view message) {
  const auto* s = static_cast<const CSink*>(user);
  thread_local std::string text;
  text.assign(message);
  s->fn(s->user, static_cast<int>(level), text.c_str());
}

}  // namespace

extern "C" {

int tier_log_set_level(int level) {
  if (level < TIER_LOG_OFF || level > TIER_LOG_DEBUG)
    return tier::capi::report(tier::Status::invalid("log level " + std::to_string(level) +
                                                    " is not one of TIER_LOG_OFF..TIER_LOG_DEBUG"));
  tier::set_log_level(static_cast<tier::LogLevel>(level));
  return TIER_OK;
}

int tier_log_level(void) { return static_cast<int>(tier::log_level()); }

void tier_log_set_sink(tier_log_fn fn, void* user) {
  // The core's sink first goes back to stderr (after which nobody reads g_sink), then g_sink
  // changes, then the new one is installed.
  tier::set_log_sink(nullptr, nullptr);
  if (fn == nullptr) return;
  g_sink = CSink{fn, user};
  tier::set_log_sink(forward, &g_sink);
}

}  // extern "C"
