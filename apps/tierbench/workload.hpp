#pragma once
// Replay workloads: a real trace in the Mooncake conversation format (tier/sizing/trace.hpp), or a
// built-in generator of multi-turn conversations.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tier/status.hpp"
#include "tier/sizing/trace.hpp"

namespace tier::bench {

// The trace format and its reader are shared with tierctl (libtier_sizing, sizing/).
using sizing::kTraceBlockTokens;
using sizing::load_trace;
using sizing::Request;

// A deterministic multi-turn conversation workload: `sessions` conversations that share a system
// prompt, each turn resending its history plus new tokens, interleaved in time.
std::vector<Request> generate_conversations(std::uint64_t seed, std::size_t sessions,
                                            std::size_t turns_per_session);

// The trace when `trace` names one, else the built-in generator with `sessions` conversations of
// 8 turns. `limit` > 0 keeps the first `limit` requests.
Result<std::vector<Request>> load_workload(const std::optional<std::string>& trace,
                                           std::size_t limit, std::size_t sessions);

}  // namespace tier::bench
