// The offload engine driven by the simulated engine (tests/support/engine_sim.hpp): corrupt and
// foreign sidecars. A load that finds one fails whole and invalidates it once; a storage error
// is not corruption; a corrupt copy that cannot be removed stays fenced, so no later save can
// fake a commit over it, until a republication removes it. Each TEST_CASE ports a scenario of
// the reference's section 6.1 (same intent, recognisable name) or covers a libtier decision
// (docs/engine.md).
#include <doctest/doctest.h>

#include "support/engine_scenarios.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

TEST_CASE("missing or corrupt sidecar fails whole load and invalidates once") {
  foreign_sidecar_fails_whole_load(sim_options());
}

TEST_CASE("corrupt sidecar bytes fail the load like a foreign one") {
  corrupt_sidecar_bytes_fail_the_load(sim_options());
  // Resealed: the cpu tier's direct scattered get runs the AOS1 check before writing a byte.
  corrupt_sidecar_bytes_fail_the_load(sim_options(), true);
}

TEST_CASE("failed corruption invalidation cannot fake later commit") {
  failed_invalidation_cannot_fake_commit(sim_options());
}

TEST_CASE("failed corruption invalidation cannot fake later commit [retry succeeds]") {
  FaultScope faults;
  SimEngine sim(rank1_faulty());
  const auto a = tokens(68, 8192 + 8);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  sim.run(1, a);
  REQUIRE(sim.sched->is_committed(b));
  plant_foreign_sidecar(sim, 1, b);
  fault_control().fail_remove = true;  // the corrupt copy cannot be removed for now
  run_and_check(sim, 2, a, {.load_failed = true});
  CHECK(w1.fenced(w1.slot_key(b)));
  CHECK(w1.counters().fenced_refusals.get() >= 1);
  CHECK_FALSE(sim.sched->is_committed(b));
  // The tier recovers: the next republication retries the removal, then publishes and commits.
  fault_control().fail_remove = false;
  run_and_check(sim, 3, a, {.tokens = 0});
  CHECK_FALSE(w1.fenced(w1.slot_key(b)));
  CHECK(w1.counters().slot_invalidations.get() == 1);
  CHECK(sim.sched->is_committed(b));
  auto resumed = run_and_check(sim, 4, a, {.loaded = true});
  CHECK(resumed.resumed_from == 8192);
}

TEST_CASE("borrow distinguishes malformed objects from storage io") {
  FaultScope faults;
  SimEngine sim(rank1_faulty());
  const auto a = tokens(69, 8192 + 8);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  const ObjectKey sidecar = w1.slot_key(b);
  sim.run(1, a);
  // A storage I/O failure on the sidecar get: the load fails, nothing is invalidated.
  fault_control().fail_get = [&](const ObjectKey& k) { return k == sidecar; };
  sim.admit(2, a);
  auto ev = sim.step();
  fault_control().fail_get = nullptr;
  REQUIRE(ev.load_failed.size() == 1);
  CHECK(terminal_of(ev, Channel::kLoad)->outcome == WorkerOutcome::kSidecarUnavailable);
  CHECK(w1.counters().slot_invalidations.get() == 0);
  CHECK_FALSE(w1.fenced(sidecar));
  CHECK(located(sim, 1, sidecar) == 0);  // still stored
  // Recompute commits the boundary again; now the object itself is malformed: invalidated.
  run_and_check(sim, 3, a, {.load_failed = false});
  REQUIRE(sim.sched->is_committed(b));
  plant_foreign_sidecar(sim, 1, b);
  sim.admit(4, a);
  ev = sim.step();
  REQUIRE(ev.load_failed.size() == 1);
  CHECK(terminal_of(ev, Channel::kLoad)->outcome == WorkerOutcome::kSidecarCorrupt);
  CHECK(w1.counters().slot_invalidations.get() == 1);
  CHECK(located(sim, 1, sidecar) == -1);
}
