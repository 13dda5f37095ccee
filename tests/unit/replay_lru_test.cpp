// End to end: `tierbench replay` of the real trace through one CPU tier of capacity C must report
// exactly the hits of an independent exact-LRU simulation with floor(C / image bytes) entries.
// Exits 77 (Meson: SKIP) when the trace is not there.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "support/lru_model.hpp"
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

struct Simulated {
  std::uint64_t blocks = 0;  // blocks requested
  std::uint64_t hits = 0;    // of them, the leading cached runs
};

// The trace through the replay's LRU model (support/lru_model.hpp) of `entries` blocks.
Simulated simulate(const std::string& trace, std::size_t entries) {
  std::ifstream in(trace);
  std::string line;
  tier::test::TraceIds ids;
  Simulated out;
  while (std::getline(in, line)) {
    ids.push_back(Json::parse(line)["hash_ids"].get<std::vector<std::uint32_t>>());
    out.blocks += ids.back().size();
  }
  out.hits = tier::test::lru_hits(ids, entries);
  return out;
}

}  // namespace

TEST_CASE("replay hit rate equals an exact LRU simulation of the trace") {
  const char* bench = std::getenv("TIERBENCH");
  const char* root = std::getenv("TIER_SOURCE_ROOT");
  REQUIRE(bench != nullptr);
  REQUIRE(root != nullptr);
  const std::string trace = tier::test::real_trace_path();
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
  if (tier::test::real_trace_path().empty()) {
    std::fprintf(stderr, "skipped: no mooncake_conversation_trace.jsonl under $TIER_TEST_DATA\n");
    return tier::test::kSkip;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
