// The offload engine driven by the simulated engine (tests/support/engine_sim.hpp) over a real
// disk tier per rank: PAGE chunks, SLOT sidecars and commit records survive a process restart.
// Exits 77 (Meson: SKIP) where the disk tier is not built or this machine cannot run it.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "support/engine_scenarios.hpp"
#include "support/test_util.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

namespace {

using tier::test::TempDir;

// One disk tier per rank, each in its own directory under `dir`.
Json disk_profile(const std::string& dir, std::uint32_t rank) {
  return Json{
      {"tiers", Json::array({Json{{"name", "disk"},
                                  {"capacity", "16MiB"},
                                  {"backend", Json{{"type", "disk"},
                                                   {"path", dir + "/rank" + std::to_string(rank)},
                                                   {"region_size", "1MiB"}}}}})}};
}

Result<std::unique_ptr<TierStack>> open_disk_stack(const std::string& dir) {
  TIER_ASSIGN_OR_RETURN(auto profile,
                        parse_profile(disk_profile(dir, 0), Registry::global(), "<probe>"));
  return TierStack::open(profile);
}

// Why the disk tier cannot run here ("" when it can): not built, or NotSupported on this
// machine (its file system or kernel). Any other failure is left for the test to report.
std::string disk_tier_unavailable() {
  if (Registry::global().find(PluginKind::kBackend, "disk") == nullptr)
    return "the disk tier is not built";
  TempDir dir;
  if (dir.path.empty()) return "";
  auto probe = open_disk_stack(dir.path);
  if (!probe && probe.status() == Code::kNotSupported) return probe.status().to_string();
  return "";
}

}  // namespace

TEST_CASE("page and slot round trip through a real disk tier, across a process restart") {
  TempDir dir;
  REQUIRE(!dir.path.empty());
  {
    auto probe = open_disk_stack(dir.path);
    REQUIRE_MESSAGE(probe.is_ok(), probe.status().to_string());
  }
  auto o = sim_options();
  o.profile = [path = dir.path](std::uint32_t r) { return disk_profile(path, r); };
  const auto a = tokens(71, 8192 + 8);
  {
    SimEngine first(o);
    first.run(1, a);
    REQUIRE(first.sched->is_committed(boundary_of(first, a, 8192)));
    for (auto& w : first.workers)
      REQUIRE(w->with_stack([](TierStack& s) { return s.flush(std::chrono::seconds(5)); }));
  }
  // A new process: new tiers over the same directories, a new scheduler, zeroed KV memory.
  SimEngine sim(o);
  auto [l, out] = admit_and_check(sim, 2, concat(a, tokens(72, 100)), {.tokens = 8192});
  REQUIRE(out.decision.action == LoadAction::kLoad);
  REQUIRE(sim.step().loaded.size() == 1);
  check_restored(sim, l.h, 8192);
  CHECK(sim.sched->counters().commits_rediscovered.get() == 1);
  for (auto& w : sim.workers) {
    CHECK(w->counters().slot_restores.get() == 1);
    CHECK(w->loaded_bytes_by_tier()[0] > 0);
  }
}

int main(int argc, char** argv) {
  if (const std::string why = disk_tier_unavailable(); !why.empty()) {
    std::fprintf(stderr, "skipped: %s\n", why.c_str());
    return tier::test::kSkip;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
