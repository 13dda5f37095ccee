#pragma once
// The replay's LRU model, by brute force: tests/unit/replay_lru_test.cpp pins `tierbench replay`
// to it, and tests/unit/mrc_test.cpp pins `tierctl size`'s one-pass curve to it.

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <list>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tier::test {

// A trace as its requests' hash ids.
using TraceIds = std::vector<std::vector<std::uint32_t>>;

// Exact LRU of `entries` blocks over chained block identities, replayed as tierbench does: a
// block is its chain of ids; the leading cached run of a request is its hits (loads refresh them
// in order), then every other block is saved (put-if-absent: a stored block is refreshed, a new
// one inserted, evicting the least recent). Returns the hits.
inline std::uint64_t lru_hits(const TraceIds& trace, std::size_t entries) {
  std::map<std::pair<std::int64_t, std::uint32_t>, std::int64_t> intern;  // (parent, id) -> node
  std::list<std::int64_t> lru;
  std::unordered_map<std::int64_t, std::list<std::int64_t>::iterator> where;
  auto touch = [&](std::int64_t node) {
    auto it = where.find(node);
    if (it != where.end()) {
      lru.splice(lru.begin(), lru, it->second);
      return;
    }
    if (entries == 0) return;
    if (where.size() == entries) {
      where.erase(lru.back());
      lru.pop_back();
    }
    lru.push_front(node);
    where[node] = lru.begin();
  };
  std::uint64_t hits = 0;
  std::vector<std::int64_t> nodes;
  for (const auto& ids : trace) {
    nodes.clear();
    std::int64_t parent = -1;
    for (std::uint32_t id : ids) {
      auto [it, fresh] = intern.try_emplace({parent, id}, static_cast<std::int64_t>(intern.size()));
      parent = it->second;
      nodes.push_back(parent);
    }
    std::size_t h = 0;
    while (h < nodes.size() && where.count(nodes[h])) ++h;
    hits += h;
    for (std::int64_t node : nodes) touch(node);
  }
  return hits;
}

// The real trace under $TIER_TEST_DATA, or "" when it is not there.
inline std::string real_trace_path() {
  const char* data = std::getenv("TIER_TEST_DATA");
  if (data == nullptr) return "";
  std::string trace = std::string(data) + "/mooncake_conversation_trace.jsonl";
  return std::filesystem::exists(trace) ? trace : "";
}

}  // namespace tier::test
