// Lookup leases in the offload engine (docs/engine.md "Lookup leases"): a lookup's hit, its PAGE
// chunks and SLOT sidecar, is held in rank 0's tiers against eviction until the load ends, so
// eviction pressure between the lookup and the load cannot fail the load; a hit that is not
// loaded releases its lease at once; a committed boundary whose sidecar is gone is never offered.
#include <doctest/doctest.h>

#include <vector>

#include "support/engine_scenarios.hpp"
#include "support/test_util.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

namespace {

// One rank over a 32 MiB CPU tier, with leases on (`lease_ms` > 0) or off.
SimOptions lease_options(std::uint64_t lease_ms) {
  SimOptions o = sim_options(1);
  o.config.lease_timeout_ms = lease_ms;
  o.profile = [](std::uint32_t) { return cpu_profile("32MiB"); };
  return o;
}

// Fills rank 0's tier with 48 MiB of other objects: everything unleased is evicted.
void evict_everything_unleased(SimEngine& sim) {
  sim.workers[0]->with_stack([](TierStack& s) {
    for (std::uint64_t i = 0; i < 48; ++i) {
      const ObjectKey k = tier::test::key_of(i, 4242);
      auto img = tier::test::make_image(k, (1u << 20) - kObjectHeaderBytes);
      const Completion c = tier::test::run(s.tier(0), Op::kPut, k, host_region(img));
      CHECK_MESSAGE((c.status.is_ok() || c.status.code() == Code::kNoSpace), c.status.to_string());
    }
    return 0;
  });
}

const TierMetrics& tier0(SimEngine& sim) {
  return *sim.workers[0]->with_stack([](TierStack& s) { return &s.tier(0).metrics(); });
}

}  // namespace

TEST_CASE("a lookup's hit is loaded despite eviction pressure between lookup and load") {
  SimEngine sim(lease_options(60'000));
  const auto a = tokens(71, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  REQUIRE(sim.sched->is_committed(b));
  auto [l, out] = sim.admit(2, a);
  REQUIRE(out.decision.action == LoadAction::kLoad);
  CHECK(sim.sched->lease_of(l.h) != 0);
  CHECK(sim.workers[0]->active_leases() == 1);
  const auto evictions = tier0(sim).evictions.get();
  evict_everything_unleased(sim);
  CHECK(tier0(sim).evictions.get() > evictions);  // the pressure was real
  auto ev = sim.step();
  REQUIRE(ev.loaded.size() == 1);
  CHECK(ev.load_failed.empty());
  check_restored(sim, l.h, 8192);
  // The lease covered the 8 PAGE chunks and the sidecar, and the load's end released it.
  CHECK(tier0(sim).leases.get() == 1);
  CHECK(tier0(sim).leased_keys.get() == 9);
  CHECK(tier0(sim).lease_releases.get() == 1);
  CHECK(tier0(sim).lease_expiries.get() == 0);
  CHECK(sim.workers[0]->active_leases() == 0);
  CHECK(sim.sched->counters().leased_lookups.get() == 1);
  CHECK(sim.sched->counters().load_failures.get() == 0);
}

TEST_CASE("without leases the same eviction pressure fails the load, and its reason is counted") {
  SimEngine sim(lease_options(0));
  const auto a = tokens(72, 8192 + 8);
  sim.run(1, a);
  auto [l, out] = sim.admit(2, a);
  REQUIRE(out.decision.action == LoadAction::kLoad);
  CHECK(sim.sched->lease_of(l.h) == 0);
  evict_everything_unleased(sim);
  auto ev = sim.step();
  REQUIRE(ev.load_failed.size() == 1);
  CHECK(sim.sched->counters().load_failures.get() == 1);
  const auto& reasons = sim.sched->load_failure_reasons();
  REQUIRE(reasons.size() == 1);
  CHECK(reasons.begin()->first == "page_unavailable");
  CHECK(reasons.begin()->second == 1);
  CHECK(tier0(sim).leases.get() == 0);
}

TEST_CASE("a hit that is not loaded releases its lease at once") {
  SimEngine sim(lease_options(60'000));
  const auto a = tokens(73, 8192 + 8);
  sim.run(1, a);
  // after_alloc recomputes (a stateful request with an HBM floor): released there.
  auto [l1, out1] = sim.admit(2, a, {.local = 1024});
  CHECK(out1.match.tokens == 8192);
  CHECK(out1.decision.action == LoadAction::kRecompute);
  CHECK(sim.sched->lease_of(l1.h) == 0);
  CHECK(tier0(sim).lease_releases.get() == 1);
  // finish() before the load was emitted: released there.
  auto [l2, out2] = sim.admit(3, a);
  REQUIRE(out2.decision.action == LoadAction::kLoad);
  CHECK(sim.sched->lease_of(l2.h) != 0);
  sim.finish(l2.h);
  CHECK(tier0(sim).lease_releases.get() == 2);
  // A second lookup of a request replaces its lease.
  const SeqHandle h = sim.sched->add_request(4, a);
  REQUIRE(sim.sched->lookup(h).is_ok());
  REQUIRE(sim.sched->lookup(h).is_ok());
  CHECK(tier0(sim).leases.get() == 4);
  CHECK(tier0(sim).lease_releases.get() == 3);
  sim.sched->finish(h);
  CHECK(tier0(sim).lease_releases.get() == 4);
  CHECK(sim.workers[0]->active_leases() == 0);
  CHECK(tier0(sim).lease_expiries.get() == 0);
}

TEST_CASE("a lease that is never released ends at lease_timeout_ms") {
  SimEngine sim(lease_options(1));
  const auto a = tokens(74, 8192 + 8);
  sim.run(1, a);
  const auto t0 = std::chrono::steady_clock::now();
  const SeqHandle h = sim.sched->add_request(2, a);
  REQUIRE(sim.sched->lookup(h).is_ok());
  REQUIRE(sim.sched->lease_of(h) != 0);
  // The deadline itself is what is tested: wait until it has certainly passed.
  while (std::chrono::steady_clock::now() < t0 + std::chrono::milliseconds(5)) {
  }
  evict_everything_unleased(sim);  // the expired lease holds nothing
  CHECK(tier0(sim).lease_expiries.get() == 1);
  sim.sched->finish(h);  // its release finds it ended: counted once
  CHECK(tier0(sim).lease_expiries.get() == 1);
  CHECK(tier0(sim).lease_releases.get() == 0);
  auto [l, out] = sim.admit(3, a);
  CHECK(out.match.tokens == 0);  // evicted
}

TEST_CASE("a committed boundary whose sidecar is gone is de-committed at lookup, not offered") {
  SimEngine sim(lease_options(60'000));
  const auto a = tokens(75, 16384 + 8);
  sim.run(1, a);
  const Boundary low = boundary_of(sim, a, 8192), high = boundary_of(sim, a, 16384);
  REQUIRE(sim.sched->is_committed(low));
  REQUIRE(sim.sched->is_committed(high));
  auto& w = *sim.workers[0];
  REQUIRE(w.with_stack([&](TierStack& s) { return s.remove(w.slot_key(high)); }).is_ok());
  auto out = sim.run(2, a);
  CHECK(out.match.tokens == 8192);  // the boundary below, whose sidecar is there
  CHECK(out.loaded);
  CHECK(sim.sched->counters().sidecars_missing.get() == 1);
  CHECK(sim.sched->counters().load_failures.get() == 0);
  // The recompute above 8192 saved the sidecar again and re-committed the boundary.
  CHECK(sim.sched->is_committed(high));
  run_and_check(sim, 3, a, {.tokens = 16384, .loaded = true});
}
