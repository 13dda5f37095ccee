// The offload engine driven by the simulated engine (tests/support/engine_sim.hpp): loads, bit
// exact restores on every rank, their order on a rank, and what a failed load leaves behind
// (the boundary decommitted, its record gone, the recompute republishing it). Each TEST_CASE
// ports a scenario of the reference's section 6.1 (same intent, recognisable name) or covers a
// libtier decision (docs/engine.md).
#include <doctest/doctest.h>

#include <cstring>
#include <utility>
#include <vector>

#include "support/engine_scenarios.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

TEST_CASE("tp8 resume restores page and slot bit exact on every rank") {
  resume_bit_exact_on_every_rank(sim_options(8));
}

TEST_CASE("stateful load failure evicts committed boundary idempotently") {
  SimEngine sim(sim_options());
  const auto a = tokens(11, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  REQUIRE(sim.sched->is_committed(b));
  // The sidecar vanished from rank 1 only.
  REQUIRE(sim.workers[1]
              ->with_stack([&](TierStack& s) { return s.remove(sim.workers[1]->slot_key(b)); })
              .is_ok());
  auto [l, out] = sim.admit(2, a);
  REQUIRE(out.decision.action == LoadAction::kLoad);
  auto ev = sim.step();
  REQUIRE(ev.load_failed.size() == 1);
  REQUIRE(ev.terminals.size() == 1);
  CHECK(ev.terminals[0].outcome == WorkerOutcome::kSidecarUnavailable);
  CHECK(sim.workers[1]->counters().slot_invalidations.get() == 0);  // only corrupt ones are
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(sim.sched->saved_watermark(l.h) == 0);  // back to the HBM floor
  CHECK(sim.sched->counters().load_failures.get() == 1);
  CHECK(sim.sched->counters().loaded_tokens.get() == 0);
  // The persisted record is gone too: a restart does not revive the boundary.
  CHECK_FALSE(*sim.workers[0]->has_commit(b));
  sim.restart_scheduler();
  admit_and_check(sim, 3, a, {.tokens = 0});
  admit_and_check(sim, 4, a, {.tokens = 0});
}

TEST_CASE("recompute after a failed load republishes the boundary") {
  SimEngine sim(sim_options());
  const auto a = tokens(12, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  REQUIRE(sim.workers[1]
              ->with_stack([&](TierStack& s) { return s.remove(sim.workers[1]->slot_key(b)); })
              .is_ok());
  run_and_check(sim, 2, a, {.load_failed = true});
  CHECK(sim.sched->is_committed(b));  // the recomputed request saved and committed it again
  run_and_check(sim, 3, a, {.loaded = true});
}

TEST_CASE("page retrieve failure prevents sidecar fetch") {
  SimEngine sim(sim_options());
  const auto a = tokens(34, 8192 + 8);
  sim.run(1, a);
  auto& w1 = *sim.workers[1];
  const auto keys = chunk_keys(sim.o_.config.page_namespace, a, 1024);
  REQUIRE(w1.with_stack([&](TierStack& s) { return s.remove(w1.page_key(keys[3])); }).is_ok());
  const auto gets =
      w1.with_stack([](TierStack& s) { return s.tier(0).metrics().of(Op::kGet).requests.get(); });
  sim.admit(2, a);
  auto ev = sim.step();
  REQUIRE(ev.load_failed.size() == 1);
  CHECK(ev.terminals[0].outcome == WorkerOutcome::kPageUnavailable);
  const auto after =
      w1.with_stack([](TierStack& s) { return s.tier(0).metrics().of(Op::kGet).requests.get(); });
  CHECK(after - gets == 8);  // the 8 PAGE chunks; the sidecar was never fetched
  CHECK(w1.counters().slot_restores.get() == 0);
}

TEST_CASE("page and slot load orders page retrieve before sidecar get, restore, then done") {
  FaultScope faults;
  SimEngine sim(rank1_faulty());
  const auto a = tokens(66, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  std::vector<std::pair<Op, ObjectKey>> trace;
  fault_control().observe = [&](Op op, const ObjectKey& k) { trace.emplace_back(op, k); };
  auto [l, out] = sim.admit(2, a);
  REQUIRE(out.decision.action == LoadAction::kLoad);
  sim.step(/*progress=*/false);
  CHECK(w1.take_reports().empty());  // nothing is reported before the load ran
  sim.on_ranks([&](std::uint32_t r) { sim.workers[r]->progress(); });
  const auto& w1c = w1.counters();
  auto ev = sim.collect();
  REQUIRE(ev.loaded.size() == 1);
  // Rank 1 leased the 8 PAGE chunks and the sidecar when the plan arrived (submit), then
  // fetched the chunks in order, then the sidecar once, and nothing else.
  const auto keys = chunk_keys(sim.o_.config.page_namespace, a, 1024);
  REQUIRE(trace.size() == 18);
  for (std::size_t i = 0; i < 9; ++i) {
    CHECK(trace[i].first != Op::kGet);
    CHECK(trace[i].second == (i < 8 ? w1.page_key(keys[i]) : w1.slot_key(b)));
  }
  for (std::size_t i = 0; i < 8; ++i) {
    CHECK(trace[9 + i].first == Op::kGet);
    CHECK(trace[9 + i].second == w1.page_key(keys[i]));
  }
  CHECK(trace[17].first == Op::kGet);
  CHECK(trace[17].second == w1.slot_key(b));
  CHECK(w1c.slot_restores.get() == 1);
  check_restored(sim, l.h, 8192);
}

// A layout with staging rows (a GPU's, KvLayout::stage_slot) has the sidecar fetched in the same
// call as the PAGE chunks, first, so that its transfer runs with theirs; the state group still
// changes only when every chunk loaded: a missing chunk leaves it as it was, the fetched sidecar
// uncommitted (the reference never fetches it then; docs/engine.md says why this one does).
TEST_CASE("a staged sidecar is fetched with the chunks and committed only when every chunk loaded") {
  FaultScope faults;
  auto o = rank1_faulty();
  o.host_rows = true;
  SimEngine sim(o);
  const auto a = tokens(67, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  std::vector<ObjectKey> gets;
  fault_control().observe = [&](Op op, const ObjectKey& k) {
    if (op == Op::kGet) gets.push_back(k);
  };
  auto l = sim.admit(2, a).live;
  REQUIRE(sim.step().loaded.size() == 1);
  const auto keys = chunk_keys(sim.o_.config.page_namespace, a, 1024);
  REQUIRE(gets.size() == 9);
  CHECK(gets[0] == w1.slot_key(b));
  for (std::size_t i = 0; i < 8; ++i) CHECK(gets[1 + i] == w1.page_key(keys[i]));
  check_restored(sim, l.h, 8192);
  CHECK(sim.faulty[1]->row_commits.load() == 1);
  CHECK(w1.counters().slot_restores.get() == 1);
  sim.finish(l.h);

  // A chunk goes missing: the sidecar is fetched into the row and dropped there.
  REQUIRE(w1.with_stack([&](TierStack& s) { return s.remove(w1.page_key(keys[5])); }).is_ok());
  gets.clear();
  auto l2 = sim.admit(3, a).live;
  // Bytes the sidecar cannot hold, so that a group that took the row's shows.
  for (const Region& r : require_value(sim.layouts[1]->slot_regions(l2.group)))
    std::memset(r.data, 0xa5, r.size);
  const auto before = require_value(digest_slot(*sim.layouts[1], l2.group));
  auto ev = sim.step();
  fault_control().observe = nullptr;
  REQUIRE(ev.load_failed.size() == 1);
  CHECK(terminal_of(ev, Channel::kLoad)->outcome == WorkerOutcome::kPageUnavailable);
  CHECK(gets.size() == 9);
  CHECK(require_value(digest_slot(*sim.layouts[1], l2.group)) == before);
  CHECK(sim.faulty[1]->row_commits.load() == 1);
  CHECK(w1.counters().slot_restores.get() == 1);
  CHECK(w1.counters().slot_invalidations.get() == 0);
  CHECK(located(sim, 1, w1.slot_key(b)) == 0);  // a valid sidecar stays stored
}

// The fail-closed scenarios of the sequential path, through staging rows.
TEST_CASE("staged sidecars: resumes bit exact; foreign and corrupt ones never reach the group") {
  auto o = sim_options(2);
  o.host_rows = true;
  resume_bit_exact_on_every_rank(o);
  foreign_sidecar_fails_whole_load(o);
  corrupt_sidecar_bytes_fail_the_load(o);
  corrupt_sidecar_bytes_fail_the_load(o, /*reseal=*/true);
  page_hit_shrinks_to_committed_sidecar(o);
}
