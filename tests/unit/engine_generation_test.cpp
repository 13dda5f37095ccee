// The offload engine driven by the simulated engine (tests/support/engine_sim.hpp): generations.
// A reused request id gets new load and save generations; a late or crossed report of another
// generation never clears, commits or frees what belongs to the current one. Each TEST_CASE
// ports a scenario of the reference's section 6.1 (same intent, recognisable name) or covers a
// libtier decision (docs/engine.md).
#include <doctest/doctest.h>

#include <set>
#include <vector>

#include "support/engine_scenarios.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

TEST_CASE("load metadata uses scheduler lifetime generation on reused req id") {
  SimEngine sim(sim_options());
  const auto a = tokens(13, 8192 + 8);
  sim.run(5, a);
  std::vector<std::uint64_t> gens;
  for (int i = 0; i < 2; ++i) {
    auto [l, out] = sim.admit(5, a);
    sim.step();
    REQUIRE(sim.last_plan.loads.size() == 1);
    CHECK(sim.last_plan.loads[0].id.request == 5);
    gens.push_back(sim.last_plan.loads[0].id.generation);
    sim.prefill(sim.live(l.h));
    sim.finish(l.h);
  }
  CHECK(gens[1] > gens[0]);
}

TEST_CASE("late load terminal cannot mutate reused request lifecycle") {
  SimEngine sim(sim_options());
  const auto a = tokens(14, 8192 + 8);
  sim.run(1, a);
  auto [l1, o1] = sim.admit(7, a);
  sim.step(/*progress=*/false);            // load g1 dispatched, not run
  CHECK_FALSE(sim.sched->finish(l1.h));    // abort: the load still writes its blocks
  CHECK(sim.sched->loads_pending() == 0);  // abandoned ops are not pending
  auto [l2, o2] = sim.admit(7, a);         // request id 7 reused
  REQUIRE(o2.decision.action == LoadAction::kLoad);
  // The late terminal of g1 frees l1's blocks and touches nothing of l2.
  sim.on_ranks([&](std::uint32_t r) { sim.workers[r]->progress(); });
  auto ev = sim.collect();
  CHECK(ev.loaded.empty());
  CHECK(sim.freed(l1.h));
  CHECK(sim.sched->counters().load_requests.get() == 0);
  ev = sim.step();
  REQUIRE(ev.loaded.size() == 1);
  CHECK(ev.loaded[0] == l2.h);
  CHECK(sim.sched->counters().load_requests.get() == 1);
}

TEST_CASE("save nonce is never reused after request id cleanup") {
  SimEngine sim(sim_options());
  std::set<std::uint64_t> seen;
  std::uint64_t last = 0;
  for (std::uint64_t seed : {15, 16, 17}) {
    auto [l, out] = sim.admit(9, tokens(seed, 4096));
    while (l.computed < 4096) {
      sim.forward(l, l.computed, l.computed + 1024);
      sim.sched->on_computed(l.h, l.computed);
      sim.step();
      for (const auto& s : sim.last_plan.saves) {
        CHECK(seen.insert(s.id.generation).second);
        CHECK(s.id.generation > last);
        last = s.id.generation;
      }
    }
    sim.finish(l.h);
  }
  CHECK(seen.size() == 12);
}

TEST_CASE("tp cross generation reports do not clear or commit until matched") {
  auto o = sim_options(2);
  o.config.checkpoint_interval_tokens = 1024;
  SimEngine sim(o);
  auto [l, out] = sim.admit(1, tokens(18, 2048 + 8));
  sim.forward(l, 0, 1024);
  sim.sched->on_computed(l.h, 1024);
  auto p1 = sim.sched->build_step();
  REQUIRE(p1.saves.size() == 1);
  REQUIRE(p1.saves[0].slot);
  const auto g = p1.saves[0].id;
  // rank 0 reports the PAGE op, rank 1 the boundary op: nothing clears or commits.
  std::vector<OpReport> crossed = {{Channel::kPageSave, g, 0, WorkerOutcome::kOk},
                                   {Channel::kSlotSave, g, 1, WorkerOutcome::kOk}};
  auto ev = sim.sched->process(crossed);
  CHECK(ev.terminals.empty());
  CHECK(sim.sched->saves_pending() == 1);
  CHECK_FALSE(sim.sched->is_committed(*p1.saves[0].slot));
  std::vector<OpReport> matched = {{Channel::kPageSave, g, 1, WorkerOutcome::kOk},
                                   {Channel::kSlotSave, g, 0, WorkerOutcome::kOk}};
  ev = sim.sched->process(matched);
  CHECK(ev.terminals.size() == 2);
  CHECK(sim.sched->is_committed(*p1.saves[0].slot));
  CHECK(sim.sched->saves_pending() == 0);
  CHECK(sim.sched->loads_pending() == 0);
}

TEST_CASE("earlier save completion clears only its page generation") {
  auto o = sim_options(2);
  o.config.checkpoint_interval_tokens = 2048;
  SimEngine sim(o);
  auto [l, out] = sim.admit(1, tokens(19, 4096 + 8));
  sim.forward(l, 0, 1024);
  sim.sched->on_computed(l.h, 1024);
  auto p1 = sim.sched->build_step();  // PAGE [0, 1024)
  sim.forward(l, 1024, 2048);
  sim.sched->on_computed(l.h, 2048);
  auto p2 = sim.sched->build_step();  // PAGE [1024, 2048) + SLOT 2048, while p1 is in flight
  REQUIRE(p1.saves.size() == 1);
  REQUIRE(p2.saves.size() == 1);
  REQUIRE(p2.saves[0].slot);
  CHECK(sim.sched->saves_pending() == 2);
  const auto g1 = p1.saves[0].id;
  std::vector<OpReport> done1 = {{Channel::kPageSave, g1, 0, WorkerOutcome::kOk},
                                 {Channel::kPageSave, g1, 1, WorkerOutcome::kOk}};
  sim.sched->process(done1);
  CHECK(sim.sched->saves_pending() == 1);
  CHECK(sim.sched->should_defer_free(l.h));
  CHECK_FALSE(sim.sched->is_committed(*p2.saves[0].slot));
}

TEST_CASE("abort during second load ignores first consumed generation") {
  SimEngine sim(sim_options());
  const auto a = tokens(20, 8192 + 8);
  sim.run(1, a);
  auto [l1, o1] = sim.admit(3, a);
  auto ev1 = sim.step();
  REQUIRE(ev1.loaded.size() == 1);
  // Keep the first load's reports to replay them late.
  const auto g1 = sim.last_plan.loads[0].id;
  sim.prefill(sim.live(l1.h));
  sim.finish(l1.h);
  auto [l2, o2] = sim.admit(3, a);
  sim.step(false);
  CHECK_FALSE(sim.sched->finish(l2.h));  // abort during the second load
  std::vector<OpReport> late = {{Channel::kLoad, g1, 0, WorkerOutcome::kOk},
                                {Channel::kLoad, g1, 1, WorkerOutcome::kOk}};
  auto ev = sim.sched->process(late);
  CHECK(ev.terminals.empty());
  CHECK(ev.loaded.empty());
  sim.on_ranks([&](std::uint32_t r) { sim.workers[r]->progress(); });
  sim.collect();
  CHECK(sim.freed(l2.h));
  CHECK(sim.sched->counters().load_requests.get() == 1);
}
