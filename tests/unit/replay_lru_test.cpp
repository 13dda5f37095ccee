// End to end: `tierbench replay` of the real trace through one CPU tier of capacity C must report
// exactly the hits of an independent exact-LRU simulation with floor(C / image bytes) entries.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <unordered_map>

#include "tier/json.hpp"
#include "tier/object.hpp"

using tier::Json;

namespace {

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  CHECK(pclose(p) == 0);
  return out;
}

// Exact LRU over chained block identities, replayed as tierbench does: the leading cached run
// of a request is its hits (loads refresh them in order), then every other block is saved
// (put-if-absent: a stored block is refreshed, a new one inserted, evicting the oldest).
std::uint64_t simulate(const std::string& trace, std::size_t entries, std::uint64_t& blocks) {
  std::map<std::pair<std::int64_t, std::uint32_t>, std::int64_t> intern;  // (parent, id) -> node
  std::list<std::int64_t> lru;
  std::unordered_map<std::int64_t, std::list<std::int64_t>::iterator> where;
  auto touch = [&](std::int64_t node) {
    auto it = where.find(node);
    if (it != where.end()) {
      lru.splice(lru.begin(), lru, it->second);
      return;
    }
    if (where.size() == entries) {
      where.erase(lru.back());
      lru.pop_back();
    }
    lru.push_front(node);
    where[node] = lru.begin();
  };
  std::ifstream in(trace);
  std::string line;
  std::uint64_t hits = 0;
  blocks = 0;
  while (std::getline(in, line)) {
    Json j = Json::parse(line);
    std::vector<std::int64_t> nodes;
    std::int64_t parent = -1;
    for (std::uint32_t id : j["hash_ids"].get<std::vector<std::uint32_t>>()) {
      auto [it, fresh] = intern.try_emplace({parent, id}, static_cast<std::int64_t>(intern.size()));
      parent = it->second;
      nodes.push_back(parent);
    }
    blocks += nodes.size();
    std::size_t h = 0;
    while (h < nodes.size() && where.count(nodes[h])) ++h;
    hits += h;
    for (std::int64_t node : nodes) touch(node);
  }
  return hits;
}

}  // namespace

TEST_CASE("replay hit rate equals an exact LRU simulation of the trace") {
  const char* bench = std::getenv("TIERBENCH");
  const char* data = std::getenv("TIER_TEST_DATA");
  const char* root = std::getenv("TIER_SOURCE_ROOT");
  REQUIRE(bench != nullptr);
  REQUIRE(root != nullptr);
  std::string trace = std::string(data ? data : "") + "/mooncake_conversation_trace.jsonl";
  if (data == nullptr || !std::filesystem::exists(trace)) {
    MESSAGE("trace not found at " << trace << "; nothing to replay");
    return;
  }
  constexpr std::uint64_t kBlock = 4096;
  const std::uint64_t image = tier::kObjectHeaderBytes + kBlock;
  for (std::size_t entries : {5'000ul, 40'000ul}) {
    const std::uint64_t capacity = entries * image + image - 1;  // floor(C / image) == entries
    std::string out = run("TIER_CPU_CAPACITY=" + std::to_string(capacity) + " " + bench +
                          " replay --json --block-bytes " + std::to_string(kBlock) +
                          " --profile " + root + "/profiles/cpu.json --trace " + trace);
    Json r = Json::parse(out);
    std::uint64_t blocks = 0;
    std::uint64_t expected = simulate(trace, entries, blocks);
    CHECK(r["blocks"] == blocks);
    CHECK(r["hit_blocks"] == expected);
    CHECK(r["tiers"]["cpu"]["capacity_objects"] == entries);
    CHECK(r["wrong_data"] == 0);
    MESSAGE("entries " << entries << ": hit rate " << r["hit_rate"].get<double>());
  }
}
