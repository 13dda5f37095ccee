// End to end: `tierbench replay --engine dsv4` over the head of the real trace. The replay's own
// tally of loads and saves must equal the engine's counters, restores must be bit exact, and
// the conversation trace must produce SLOT resumes (with a ladder, and with the anchor only).
// Exits 77 (Meson: SKIP) where the trace is not on this machine.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "support/test_util.hpp"
#include "tier/json.hpp"

using tier::Json;

namespace {

// The trace under TIER_TEST_DATA ("" without the variable).
std::string trace_path() {
  const char* data = std::getenv("TIER_TEST_DATA");
  return data ? std::string(data) + "/mooncake_conversation_trace.jsonl" : std::string();
}

Json replay(const std::string& extra) {
  const char* bench = std::getenv("TIERBENCH");
  const char* root = std::getenv("TIER_SOURCE_ROOT");
  REQUIRE(bench != nullptr);
  REQUIRE(root != nullptr);
  const std::string cmd = std::string(bench) + " replay --engine dsv4 --preset v4-pro-fp8 " +
                          "--profile " + root + "/profiles/cpu.json --trace " + trace_path() +
                          " --limit 400 --block-bytes 8KiB --json " + extra;
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  CHECK(pclose(p) == 0);
  return Json::parse(out);
}

void check_agrees(const Json& j) {
  CHECK(j["counters_agree"] == true);
  CHECK(j["wrong_data"] == 0);
  for (const char* k :
       {"load_requests", "loaded_tokens", "load_failures", "save_requests", "saved_tokens"})
    CHECK(j["metrics"]["engine"][k] == j["replay"][k]);
  CHECK(j["metrics"]["engine"]["loads_pending"] == 0);
  CHECK(j["metrics"]["engine"]["saves_pending"] == 0);
}

}  // namespace

TEST_CASE("engine replay counters agree with the replay figures") {
  Json j = replay("");
  check_agrees(j);
  CHECK(j["metrics"]["engine"]["load_requests"].get<std::uint64_t>() > 0);
  CHECK(j["hit_rate"].get<double>() > 0.0);
  CHECK(j["hit_rate"].get<double>() <= j["page_hit_rate"].get<double>());
}

TEST_CASE("engine replay with two ranks and the anchor-only cadence") {
  Json j = replay("--tp 2 --interval -1");
  check_agrees(j);
  CHECK(j["metrics"]["engine"]["slot_commits"].get<std::uint64_t>() > 0);
  CHECK(j["metrics"]["workers"].size() == 2);
}

int main(int argc, char** argv) {
  const std::string trace = trace_path();
  if (trace.empty() || !std::filesystem::exists(trace)) {
    std::fprintf(stderr, "no trace at \"%s\" (TIER_TEST_DATA): skipping\n", trace.c_str());
    return tier::test::kSkip;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
