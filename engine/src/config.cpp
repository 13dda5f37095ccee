#include "tier/engine/config.hpp"

#include <fmt/format.h>

#include <numeric>

namespace tier::engine {

std::span<const OptionSpec> EngineConfig::options() {
  static const std::vector<OptionSpec> specs = {
      {"block_tokens",
       OptionType::kUInt,
       Json(256),
       "hash block in tokens (block size x DCP)",
       1.0,
       1048576.0,
       {}},
      {"chunk_tokens",
       OptionType::kUInt,
       Json(256),
       "PAGE chunk in tokens (resume alignment); a multiple of block_tokens",
       1.0,
       16777216.0,
       {}},
      {"checkpoint_interval_tokens",
       OptionType::kInt,
       Json(8192),
       "SLOT cadence: >0 a rung every N tokens, 0 off, -1 prompt-end anchor only",
       -1.0,
       1e15,
       {}},
      {"min_load_tokens",
       OptionType::kUInt,
       Json(8192),
       "hits that add fewer tokens than this are recomputed",
       0.0,
       std::nullopt,
       {}},
      {"stateful",
       OptionType::kBool,
       Json(true),
       "hybrid model: a resume needs the PAGE prefix and a committed SLOT",
       std::nullopt,
       std::nullopt,
       {}},
      {"tp_size",
       OptionType::kUInt,
       Json(1),
       "TP ranks that report every operation",
       1.0,
       64.0,
       {}},
      {"max_pending_saves",
       OptionType::kUInt,
       Json(2),
       "per worker: queued plus running saves; more are rejected, never waited for",
       1.0,
       1048576.0,
       {}},
      {"commit_index_capacity",
       OptionType::kUInt,
       Json(65536),
       "in-memory LRU of committed SLOT boundaries (commit records persist in the tiers)",
       1.0,
       std::nullopt,
       {}},
      {"tombstone_limit",
       OptionType::kUInt,
       Json(4096),
       "terminal operation ids remembered per channel against late duplicates",
       0.0,
       std::nullopt,
       {}},
      {"publication_timeout_ms",
       OptionType::kUInt,
       Json(0),
       "how long a SLOT save waits for the PAGE prefix, then the sidecar, to become visible "
       "(0: one probe each)",
       0.0,
       3600000.0,
       {}},
      {"publication_poll_interval_ms",
       OptionType::kUInt,
       Json(10),
       "pause between two visibility probes of a SLOT save",
       1.0,
       60000.0,
       {}},
      {"lease_timeout_ms",
       OptionType::kUInt,
       Json(10000),
       "how long a lookup's hit (its PAGE chunks and SLOT sidecar) is held against eviction "
       "until its load completes or is abandoned (0: no leases)",
       0.0,
       3600000.0,
       {}},
  };
  return specs;
}

Result<EngineConfig> EngineConfig::from_json(const Json& j) {
  ConfigErrors errors;
  Json r = resolve_options(j, options(), "", errors);
  if (!errors.empty()) return errors.to_status();
  EngineConfig c;
  c.block_tokens = r.at("block_tokens").get<std::uint32_t>();
  c.chunk_tokens = r.at("chunk_tokens").get<std::uint32_t>();
  c.checkpoint_interval_tokens = r.at("checkpoint_interval_tokens").get<std::int64_t>();
  c.min_load_tokens = r.at("min_load_tokens").get<std::uint64_t>();
  c.stateful = r.at("stateful").get<bool>();
  c.tp_size = r.at("tp_size").get<std::uint32_t>();
  c.max_pending_saves = r.at("max_pending_saves").get<std::uint32_t>();
  c.commit_index_capacity = r.at("commit_index_capacity").get<std::uint64_t>();
  c.tombstone_limit = r.at("tombstone_limit").get<std::uint64_t>();
  c.publication_timeout_ms = r.at("publication_timeout_ms").get<std::uint64_t>();
  c.publication_poll_interval_ms = r.at("publication_poll_interval_ms").get<std::uint64_t>();
  c.lease_timeout_ms = r.at("lease_timeout_ms").get<std::uint64_t>();
  TIER_RETURN_IF_ERROR(c.validate());
  return c;
}

Json EngineConfig::to_json() const {
  return {{"block_tokens", block_tokens},
          {"chunk_tokens", chunk_tokens},
          {"checkpoint_interval_tokens", checkpoint_interval_tokens},
          {"min_load_tokens", min_load_tokens},
          {"stateful", stateful},
          {"tp_size", tp_size},
          {"max_pending_saves", max_pending_saves},
          {"commit_index_capacity", commit_index_capacity},
          {"tombstone_limit", tombstone_limit},
          {"publication_timeout_ms", publication_timeout_ms},
          {"publication_poll_interval_ms", publication_poll_interval_ms},
          {"lease_timeout_ms", lease_timeout_ms}};
}

Status EngineConfig::validate() const {
  ConfigErrors e;
  if (block_tokens == 0) e.add("/block_tokens", "expected a positive integer, got 0");
  if (chunk_tokens == 0 || (block_tokens != 0 && chunk_tokens % block_tokens != 0))
    e.add("/chunk_tokens", fmt::format("expected a positive multiple of block_tokens ({}), got {}",
                                       block_tokens, chunk_tokens));
  if (checkpoint_interval_tokens < -1)
    e.add("/checkpoint_interval_tokens",
          fmt::format("expected -1, 0 or a positive integer, got {}", checkpoint_interval_tokens));
  if (tp_size == 0 || tp_size > 64)
    e.add("/tp_size", fmt::format("expected an integer in [1, 64], got {}", tp_size));
  if (max_pending_saves == 0) e.add("/max_pending_saves", "expected a positive integer, got 0");
  if (commit_index_capacity == 0)
    e.add("/commit_index_capacity", "expected a positive integer, got 0");
  if (publication_timeout_ms > 3600000)
    e.add("/publication_timeout_ms",
          fmt::format("expected an integer in [0, 3600000], got {}", publication_timeout_ms));
  if (publication_poll_interval_ms == 0 || publication_poll_interval_ms > 60000)
    e.add("/publication_poll_interval_ms",
          fmt::format("expected an integer in [1, 60000], got {}", publication_poll_interval_ms));
  if (lease_timeout_ms > 3600000)
    e.add("/lease_timeout_ms",
          fmt::format("expected an integer in [0, 3600000], got {}", lease_timeout_ms));
  return e.to_status();
}

std::int64_t EngineConfig::sidecar_interval() const noexcept {
  if (checkpoint_interval_tokens < 0) return -1;
  const auto snapped =
      static_cast<std::uint64_t>(checkpoint_interval_tokens) / block_tokens * block_tokens;
  if (snapped == 0) return 0;
  return static_cast<std::int64_t>(std::lcm(snapped, static_cast<std::uint64_t>(chunk_tokens)));
}

std::vector<std::uint64_t> EngineConfig::slot_boundaries(std::uint64_t prompt) const {
  std::vector<std::uint64_t> out;
  const std::int64_t interval = sidecar_interval();
  if (interval == 0 || prompt == 0) return out;
  if (interval < 0) {
    // The prompt-end anchor: the last chunk boundary strictly before the prompt's end, so a
    // resubmitted prompt (whose last token is always recomputed) can resume from it.
    const std::uint64_t anchor = (prompt - 1) / chunk_tokens * chunk_tokens;
    if (anchor > 0) out.push_back(anchor);
    return out;
  }
  const std::uint64_t terminal = prompt / chunk_tokens * chunk_tokens;
  for (auto b = static_cast<std::uint64_t>(interval); b <= terminal;
       b += static_cast<std::uint64_t>(interval))
    out.push_back(b);
  return out;
}

bool EngineConfig::is_slot_boundary(std::uint64_t tokens, std::uint64_t prompt) const noexcept {
  const std::int64_t interval = sidecar_interval();
  if (interval == 0 || tokens == 0 || prompt == 0) return false;
  if (interval < 0) return tokens == (prompt - 1) / chunk_tokens * chunk_tokens;
  return tokens % static_cast<std::uint64_t>(interval) == 0 &&
         tokens <= prompt / chunk_tokens * chunk_tokens;
}

}  // namespace tier::engine
