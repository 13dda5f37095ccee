#pragma once
// Replay workloads: a real trace in the Mooncake conversation format, or a built-in generator of
// multi-turn conversations. A request is its ordered prefix blocks (one block = 512 tokens in the
// trace); equal leading block ids mean a reusable prefix.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tier/status.hpp"

namespace tier::bench {

inline constexpr std::uint32_t kTraceBlockTokens = 512;

struct Request {
  std::uint64_t timestamp_ms = 0;
  std::uint32_t input_tokens = 0;
  std::uint32_t output_tokens = 0;
  std::vector<std::uint32_t> blocks;  // hash ids, one per kTraceBlockTokens tokens
};

// Reads a JSON-lines trace ({"timestamp","input_length","output_length","hash_ids"} per line).
// `limit` = 0 reads everything. Errors name the line and the field.
Result<std::vector<Request>> load_trace(const std::string& path, std::size_t limit = 0);

// A deterministic multi-turn conversation workload: `sessions` conversations that share a system
// prompt, each turn resending its history plus new tokens, interleaved in time.
std::vector<Request> generate_conversations(std::uint64_t seed, std::size_t sessions,
                                            std::size_t turns_per_session);

// The trace when `trace` names one, else the built-in generator with `sessions` conversations of
// 8 turns. `limit` > 0 keeps the first `limit` requests.
Result<std::vector<Request>> load_workload(const std::optional<std::string>& trace,
                                           std::size_t limit, std::size_t sessions);

}  // namespace tier::bench
