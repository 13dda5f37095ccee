#include "workload.hpp"

#include <algorithm>
#include <fstream>
#include <random>

#include <fmt/format.h>

#include "tier/json.hpp"

namespace tier::bench {

Result<std::vector<Request>> load_trace(const std::string& path, std::size_t limit) {
  std::ifstream in(path);
  if (!in) return Status::not_found(fmt::format("{}: cannot open trace", path));
  std::vector<Request> out;
  std::string line;
  std::size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json j = Json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return Status::invalid(fmt::format("{}:{}: not a JSON object", path, lineno));
    Request r;
    try {
      r.timestamp_ms = j.at("timestamp").get<std::uint64_t>();
      r.input_tokens = j.at("input_length").get<std::uint32_t>();
      r.output_tokens = j.value("output_length", 0u);
      r.blocks = j.at("hash_ids").get<std::vector<std::uint32_t>>();
    } catch (const Json::exception& e) {
      return Status::invalid(fmt::format("{}:{}: {}", path, lineno, e.what()));
    }
    out.push_back(std::move(r));
    if (limit != 0 && out.size() == limit) break;
  }
  return out;
}

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
