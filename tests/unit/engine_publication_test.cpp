// The offload engine driven by the simulated engine (tests/support/engine_sim.hpp):
// publication. A SLOT boundary commits only when every rank's PAGE prefix and sidecar are
// visible in its tiers: the worker probes for them (every publication_poll_interval_ms until
// publication_timeout_ms), and a store that says yes without storing cannot authorize a commit.
// Each TEST_CASE ports a scenario of the reference's section 6.1 (same intent, recognisable
// name) or covers a libtier decision (docs/engine.md).
#include <doctest/doctest.h>

#include <atomic>
#include <unordered_map>
#include <utility>
#include <vector>

#include "support/engine_scenarios.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

TEST_CASE("nonthrowing page store requires full lookup coverage") {
  // Rank 1's tier is too small for the prefix: every put succeeds, but the oldest chunks are
  // evicted (and dropped) before the SLOT would be published. The visibility check refuses it.
  auto o = sim_options();
  o.profile = [](std::uint32_t r) {
    if (r == 0) return cpu_profile();
    Json p = cpu_profile("96KiB");
    p["tiers"][0]["on_evict"] = "drop";
    return p;
  };
  SimEngine sim(o);
  const auto a = tokens(57, 8192 + 8);
  // The failing channel and reason are pinned: the PAGE part is stored on both ranks (rank 1's
  // puts succeed), the SLOT part fails on rank 1 alone because its PAGE prefix is not visible
  // through the boundary any more.
  auto [l, out] = sim.admit(1, a);
  sim.forward(l, 0, 8192);
  sim.sched->on_computed(l.h, 8192);
  sim.last_plan = sim.sched->build_step();
  REQUIRE(sim.last_plan.saves.size() == 1);
  REQUIRE(sim.last_plan.saves[0].slot);
  std::vector<std::vector<OpReport>> per_rank(2);
  sim.on_ranks([&](std::uint32_t r) {
    sim.workers[r]->submit(sim.last_plan);
    sim.workers[r]->progress();
    per_rank[r] = sim.workers[r]->take_reports();
  });
  for (std::uint32_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    REQUIRE(per_rank[r].size() == 2);
    for (const OpReport& rep : per_rank[r]) {
      if (rep.channel == Channel::kPageSave) CHECK(rep.ok());
      if (rep.channel == Channel::kSlotSave)
        CHECK(rep.outcome == (r == 0 ? WorkerOutcome::kOk : WorkerOutcome::kPageVisibilityTimeout));
    }
  }
  std::vector<OpReport> all = per_rank[0];
  all.insert(all.end(), per_rank[1].begin(), per_rank[1].end());
  auto ev = sim.absorb(sim.sched->process(all));
  REQUIRE(terminal_of(ev, Channel::kPageSave));
  CHECK(terminal_of(ev, Channel::kPageSave)->ok());
  REQUIRE(terminal_of(ev, Channel::kSlotSave));
  CHECK(terminal_of(ev, Channel::kSlotSave)->outcome == WorkerOutcome::kPageVisibilityTimeout);
  sim.prefill(sim.live(l.h));
  sim.finish(l.h);
  CHECK(sim.sched->committed_count() == 0);
  CHECK(sim.sched->counters().slot_save_failures.get() == 1);
  CHECK(sim.workers[1]->counters().slot_publishes.get() == 0);
  CHECK(sim.workers[0]->counters().slot_publishes.get() == 1);  // rank 0 alone cannot commit
  run_and_check(sim, 2, a, {.tokens = 0});
}

TEST_CASE("sidecar submitted but not visible times out without commit") {
  FaultScope faults;
  auto o = rank1_faulty();
  o.config.publication_timeout_ms = 40;
  o.config.publication_poll_interval_ms = 10;
  SimEngine sim(o);
  const auto a = tokens(60, 8192 + 8);
  const Boundary b = boundary_of(sim, a, 8192);
  const ObjectKey sidecar = sim.workers[1]->slot_key(b);
  std::atomic<int> probes{0};
  fault_control().hide = [&](const ObjectKey& k) {
    if (!(k == sidecar)) return false;
    ++probes;
    return true;
  };
  auto ev = save_prefix(sim, 1, a, 8192).ev;
  auto page = terminal_of(ev, Channel::kPageSave);
  auto slot = terminal_of(ev, Channel::kSlotSave);
  REQUIRE(page);
  REQUIRE(slot);
  CHECK(page->ok());
  CHECK_FALSE(slot->ok());
  CHECK(outcome_name(slot->outcome) == "sidecar_visibility_timeout");
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(sim.sched->committed_count() == 0);
  CHECK_FALSE(*sim.workers[0]->has_commit(b));
  CHECK(sim.sched->counters().slot_save_failures.get() == 1);
  CHECK(sim.workers[1]->counters().slot_publishes.get() == 0);
  CHECK(sim.sched->saves_pending() == 0);
  // It polled at the interval until the timeout: more than one probe, no busy spin. Every
  // sidecar probe the tier saw is one the worker counted, after its one PAGE prefix probe.
  CHECK(probes.load() >= 2);
  CHECK(probes.load() <= 6);  // at most timeout / interval + 2
  CHECK(sim.workers[1]->counters().visibility_probes.get() ==
        1 + static_cast<std::uint64_t>(probes.load()));
  // The sidecar was submitted (rank 1 stores it), it just never showed: no resume from it.
  fault_control().hide = nullptr;
  CHECK(located(sim, 1, sidecar) == 0);
  admit_and_check(sim, 2, a, {.page_hit = 8192, .tokens = 0});
}

TEST_CASE("wait for publication with a zero timeout is exactly one probe") {
  FaultScope faults;
  auto o = rank1_faulty();
  o.config.publication_timeout_ms = 0;
  SimEngine sim(o);
  const auto a = tokens(61, 8192 + 8);
  const ObjectKey sidecar = sim.workers[1]->slot_key(boundary_of(sim, a, 8192));
  std::atomic<int> probes{0};
  fault_control().hide = [&](const ObjectKey& k) {
    if (!(k == sidecar)) return false;
    ++probes;
    return true;
  };
  auto ev = save_prefix(sim, 1, a, 8192).ev;
  auto slot = terminal_of(ev, Channel::kSlotSave);
  REQUIRE(slot);
  CHECK(outcome_name(slot->outcome) == "sidecar_visibility_timeout");
  CHECK(probes.load() == 1);
  CHECK(sim.workers[1]->counters().visibility_probes.get() == 2);  // the PAGE prefix, the sidecar
  CHECK(sim.sched->committed_count() == 0);
}

TEST_CASE("page and slot save polls partial page and sidecar visibility") {
  FaultScope faults;
  auto o = rank1_faulty();
  o.config.publication_timeout_ms = 2000;
  o.config.publication_poll_interval_ms = 1;
  SimEngine sim(o);
  const auto a = tokens(62, 8192 + 8);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  const auto keys = chunk_keys(sim.o_.config.page_namespace, a, 1024);
  const ObjectKey last_chunk = w1.page_key(keys[7]), sidecar = w1.slot_key(b);
  // The last PAGE chunk and then the sidecar each show only at their third probe.
  std::unordered_map<ObjectKey, int> seen;
  fault_control().hide = [&](const ObjectKey& k) {
    if (!(k == last_chunk) && !(k == sidecar)) return false;
    return ++seen[k] < 3;
  };
  std::vector<std::pair<Op, ObjectKey>> trace;
  fault_control().observe = [&](Op op, const ObjectKey& k) { trace.emplace_back(op, k); };
  auto ev = save_prefix(sim, 1, a, 8192).ev;
  auto slot = terminal_of(ev, Channel::kSlotSave);
  REQUIRE(slot);
  CHECK(slot->ok());
  CHECK(sim.sched->is_committed(b));
  CHECK(seen[last_chunk] == 3);
  CHECK(seen[sidecar] == 3);
  CHECK(w1.counters().visibility_probes.get() == 6);
  // Order on rank 1: every PAGE put, the PAGE prefix probes until all 8 chunks show, then the
  // sidecar put, then its probes.
  auto index = [&](Op op, const ObjectKey& k, int nth = 1) {
    for (std::size_t i = 0; i < trace.size(); ++i)
      if (trace[i].first == op && trace[i].second == k && --nth == 0) return static_cast<long>(i);
    return -1L;
  };
  const long sidecar_put = index(Op::kPut, sidecar);
  REQUIRE(sidecar_put >= 0);
  for (const auto& k : keys) {
    const long put = index(Op::kPut, w1.page_key(k));
    CHECK(put >= 0);
    CHECK(put < index(Op::kContains, last_chunk));
  }
  CHECK(index(Op::kContains, last_chunk, 3) < sidecar_put);
  CHECK(index(Op::kContains, last_chunk, 4) == -1);
  CHECK(index(Op::kContains, sidecar) > sidecar_put);
  CHECK(index(Op::kPut, sidecar, 2) == -1);
}

TEST_CASE("unhealthy store that skips puts cannot authorize the sidecar") {
  FaultScope faults;
  SimEngine sim(rank1_faulty());
  const auto a = tokens(63, 8192 + 8);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  const ObjectKey sidecar = w1.slot_key(b);
  // Rank 1's store acknowledges its PAGE puts without storing them (no error raised).
  fault_control().drop_put = [&](const ObjectKey& k) {
    return k.ns == sim.o_.config.page_namespace && k.rank == 1;
  };
  int sidecar_puts = 0;
  fault_control().observe = [&](Op op, const ObjectKey& k) {
    sidecar_puts += op == Op::kPut && k == sidecar;
  };
  auto ev = save_prefix(sim, 1, a, 8192).ev;
  auto page = terminal_of(ev, Channel::kPageSave);
  auto slot = terminal_of(ev, Channel::kSlotSave);
  REQUIRE(page);
  REQUIRE(slot);
  CHECK(page->ok());  // the store said yes
  CHECK_FALSE(slot->ok());
  CHECK(outcome_name(slot->outcome) == "page_visibility_timeout");
  CHECK(sidecar_puts == 0);  // never published
  CHECK(located(sim, 1, sidecar) == -1);
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(sim.workers[0]->counters().slot_publishes.get() == 1);  // rank 0 alone cannot commit
}
