// End to end: `tierbench replay` of the real trace through one CPU tier of capacity C must report
// exactly the hits of an independent exact-LRU simulation with floor(C / image bytes) entries.
// Exits 77 (Meson: SKIP) when the trace is not there.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <unordered_map>

#include "support/test_util.hpp"
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
struct Simulated {
  std::uint64_t blocks = 0;  // blocks requested
  std::uint64_t hits = 0;    // of them, the leading cached runs
};

Simulated simulate(const std::string& trace, std::size_t entries) {
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
  Simulated out;
  while (std::getline(in, line)) {
    Json j = Json::parse(line);
    std::vector<std::int64_t> nodes;
    std::int64_t parent = -1;
    for (std::uint32_t id : j["hash_ids"].get<std::vector<std::uint32_t>>()) {
      auto [it, fresh] = intern.try_emplace({parent, id}, static_cast<std::int64_t>(intern.size()));
      parent = it->second;
      nodes.push_back(parent);
    }
    out.blocks += nodes.size();
    std::size_t h = 0;
    while (h < nodes.size() && where.count(nodes[h])) ++h;
    out.hits += h;
    for (std::int64_t node : nodes) touch(node);
  }
  return out;
}

// The trace the test replays, or "" when $TIER_TEST_DATA does not hold it.
std::string trace_path() {
  const char* data = std::getenv("TIER_TEST_DATA");
  if (data == nullptr) return "";
  std::string trace = std::string(data) + "/mooncake_conversation_trace.jsonl";
  return std::filesystem::exists(trace) ? trace : "";
}

}  // namespace

TEST_CASE("replay hit rate equals an exact LRU simulation of the trace") {
  const char* bench = std::getenv("TIERBENCH");
  const char* root = std::getenv("TIER_SOURCE_ROOT");
  REQUIRE(bench != nullptr);
  REQUIRE(root != nullptr);
  const std::string trace = trace_path();
  REQUIRE(!trace.empty());  // main() skips without it
  constexpr std::uint64_t kBlock = 4096;
  const std::uint64_t image = tier::kObjectHeaderBytes + kBlock;
  for (std::size_t entries : {5'000ul, 40'000ul}) {
    const std::uint64_t capacity = entries * image + image - 1;  // floor(C / image) == entries
    std::string out = run("TIER_CPU_CAPACITY=" + std::to_string(capacity) + " " + bench +
                          " replay --json --block-bytes " + std::to_string(kBlock) +
                          " --profile " + root + "/profiles/cpu.json --trace " + trace);
    Json r = Json::parse(out);
    const Simulated expected = simulate(trace, entries);
    CHECK(r["blocks"] == expected.blocks);
    CHECK(r["hit_blocks"] == expected.hits);
    CHECK(r["tiers"]["cpu"]["capacity_objects"] == entries);
    CHECK(r["wrong_data"] == 0);
    MESSAGE("entries " << entries << ": hit rate " << r["hit_rate"].get<double>());
  }
}

int main(int argc, char** argv) {
  if (trace_path().empty()) {
    std::fprintf(stderr, "skipped: no mooncake_conversation_trace.jsonl under $TIER_TEST_DATA\n");
    return tier::test::kSkip;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
