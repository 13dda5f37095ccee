#include "workload.hpp"

#include <algorithm>
#include <random>

namespace tier::bench {

std::vector<Request> generate_conversations(std::uint64_t seed, std::size_t sessions,
                                            std::size_t turns_per_session) {
  std::mt19937_64 rng(seed);
  constexpr std::uint32_t kSystemBlocks = 4;  // shared by every conversation
  std::uint32_t next_id = kSystemBlocks;
  struct Session {
    std::vector<std::uint32_t> history;
    std::size_t turns_left;
    std::uint64_t next_at;
  };
  std::vector<Session> live;
  std::vector<Request> out;
  std::uniform_int_distribution<std::uint32_t> new_blocks(1, 6);
  std::uniform_int_distribution<std::uint64_t> think_ms(2'000, 60'000);
  std::uint64_t clock = 0;
  std::size_t started = 0;
  while (started < sessions || !live.empty()) {
    // Start a new conversation every ~500 ms while any remain.
    if (started < sessions && (live.empty() || rng() % 2 == 0)) {
      Session s;
      for (std::uint32_t b = 0; b < kSystemBlocks; ++b) s.history.push_back(b);
      s.turns_left = turns_per_session;
      s.next_at = clock;
      live.push_back(std::move(s));
      ++started;
    }
    auto it = std::min_element(live.begin(), live.end(), [](const Session& a, const Session& b) {
      return a.next_at < b.next_at;
    });
    clock = std::max(clock, it->next_at) + 500;
    std::uint32_t add = new_blocks(rng);
    for (std::uint32_t k = 0; k < add; ++k) it->history.push_back(next_id++);
    Request r;
    r.timestamp_ms = it->next_at;
    r.blocks = it->history;
    r.input_tokens = static_cast<std::uint32_t>(r.blocks.size()) * kTraceBlockTokens;
    r.output_tokens = 300;
    out.push_back(std::move(r));
    // The answer joins the history of the next turn.
    it->history.push_back(next_id++);
    it->next_at += think_ms(rng);
    if (--it->turns_left == 0) live.erase(it);
  }
  std::stable_sort(out.begin(), out.end(), [](const Request& a, const Request& b) {
    return a.timestamp_ms < b.timestamp_ms;
  });
  return out;
}

Result<std::vector<Request>> load_workload(const std::optional<std::string>& trace,
                                           std::size_t limit, std::size_t sessions) {
  if (trace) return load_trace(*trace, limit);
  std::vector<Request> requests = generate_conversations(42, sessions, 8);
  if (limit && requests.size() > limit) requests.resize(limit);
  return requests;
}

}  // namespace tier::bench
