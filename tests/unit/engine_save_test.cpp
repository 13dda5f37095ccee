// The offload engine driven by the simulated engine (tests/support/engine_sim.hpp): saves. When
// PAGE and SLOT saves are emitted (the checkpoint cadence, the prompt-end anchor, prefill chunks
// cut at boundaries), when the SLOT snapshot is taken, how saves queue and serialize on a rank,
// and when a request's blocks may be freed. Each TEST_CASE ports a scenario of the reference's
// section 6.1 (same intent, recognisable name) or covers a libtier decision (docs/engine.md).
#include <doctest/doctest.h>

#include <utility>
#include <vector>

#include "support/engine_scenarios.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

namespace {

std::size_t slot_saves_in(const StepPlan& p) {
  std::size_t n = 0;
  for (const auto& s : p.saves) n += s.slot ? 1 : 0;
  return n;
}

}  // namespace

// ---- When saves are emitted ----

TEST_CASE("sidecar save emits at regular checkpoint boundary") {
  SimEngine sim(sim_options());
  auto [l, out] = sim.admit(1, tokens(21, 20000));
  std::vector<std::uint64_t> slots;
  while (l.computed < 20000) {
    auto n = sim.sched->cut_prefill_chunk(l.h, l.computed,
                                          std::min<std::uint64_t>(3000, 20000 - l.computed));
    sim.forward(l, l.computed, l.computed + n);
    sim.sched->on_computed(l.h, l.computed);
    sim.step();
    for (const auto& s : sim.last_plan.saves)
      if (s.slot) slots.push_back(s.slot->tokens);
  }
  CHECK(slots == std::vector<std::uint64_t>{8192, 16384});
  CHECK(sim.sched->counters().slot_commits.get() == 2);
}

TEST_CASE("sidecar save emits at terminal aligned boundary") {
  SimEngine sim(sim_options());
  const auto a = tokens(22, 16384);
  sim.run(1, a);
  CHECK(sim.sched->is_committed(boundary_of(sim, a, 16384)));
}

TEST_CASE("zero sidecar interval disables slot saves but keeps page saves") {
  auto o = sim_options();
  o.config.checkpoint_interval_tokens = 0;
  SimEngine sim(o);
  sim.run(1, tokens(23, 16384 + 8));
  CHECK(sim.sched->counters().slot_commits.get() == 0);
  CHECK(sim.sched->counters().saved_tokens.get() == 16384);
}

TEST_CASE("minus one interval saves only the prompt-end anchor") {
  auto o = sim_options();
  o.config.checkpoint_interval_tokens = -1;
  SimEngine sim(o);
  const auto a = tokens(24, 10000);
  sim.run(1, a);
  CHECK(sim.sched->counters().slot_commits.get() == 1);
  CHECK(sim.sched->is_committed(boundary_of(sim, a, 9216)));
  // A follow-up turn (the prompt extended) resumes from the anchor.
  run_and_check(sim, 2, concat(a, tokens(25, 3000)), {.tokens = 9216, .loaded = true});
}

TEST_CASE("prefill chunk is cut at nearest pending sidecar boundary") {
  SimEngine sim(sim_options());
  auto [l, out] = sim.admit(1, tokens(26, 20000));
  CHECK(sim.sched->cut_prefill_chunk(l.h, 4096, 8192) == 4096);
  CHECK(sim.sched->cut_prefill_chunk(l.h, 8192, 8192) == 8192);  // 16384 ends it exactly
  CHECK(sim.sched->cut_prefill_chunk(l.h, 0, 4096) == 4096);
  CHECK(sim.sched->cut_prefill_chunk(l.h, 16384, 4000) == 4000);  // no boundary left
}

TEST_CASE("partial prefill resumes and captures next boundary after inflight commit") {
  SimEngine sim(sim_options());
  auto [l, out] = sim.admit(1, tokens(27, 17000));
  sim.forward(l, 0, 8192);
  sim.sched->on_computed(l.h, 8192);
  sim.step(false);  // the 8k SLOT save is snapshotted and queued, not run
  CHECK(slot_saves_in(sim.last_plan) == 1);
  // The workers finish it while the prefill continues.
  sim.on_ranks([&](std::uint32_t r) { sim.workers[r]->progress(); });
  sim.collect();
  auto n = sim.sched->cut_prefill_chunk(l.h, 8192, 16384);
  CHECK(n == 8192);
  sim.forward(l, 8192, 16384);
  sim.sched->on_computed(l.h, 16384);
  sim.step();
  CHECK(slot_saves_in(sim.last_plan) == 1);
  CHECK(sim.sched->counters().slot_commits.get() == 2);
}

// The interleaving of issue 22: the prompt ends on a SLOT boundary while the request's previous
// SLOT save is still queued, and a decode step runs before that save completes. The prompt-end
// SLOT must not be snapshotted after the decode (it would hold a later state under the boundary):
// it is skipped and counted, and a later request extending the prompt resumes from the earlier
// boundary with the state at exactly that boundary on every rank.
void prompt_end_slot_missed_while_previous_save_in_flight(std::uint32_t tp,
                                                         std::int64_t interval) {
  CAPTURE(tp);
  CAPTURE(interval);
  auto o = sim_options(tp);
  o.config.checkpoint_interval_tokens = interval;
  SimEngine sim(o);
  const auto a = tokens(90 + tp, 16384);
  auto [l, out] = sim.admit(1, a);
  const auto first = o.config.slot_boundaries(a.size());
  const std::uint64_t early = interval < 0 ? first.front() : 8192;  // -1: the anchor, 15360
  std::uint64_t at = sim.sched->cut_prefill_chunk(l.h, 0, early);
  sim.forward(l, 0, at);
  sim.sched->on_computed(l.h, at);
  sim.step(/*progress=*/false);  // the SLOT save at `at` (if any) is snapshotted and queued
  CHECK(slot_saves_in(sim.last_plan) == (interval == 0 ? 0u : 1u));
  // Prefill reaches the prompt's end (16384) while that save is still queued on every rank.
  sim.forward(l, at, 16384);
  sim.sched->on_computed(l.h, 16384);
  sim.step(/*progress=*/false);
  CHECK(slot_saves_in(sim.last_plan) == 0);  // one SLOT save in flight per request
  // One decode step changes the state group; then everything runs.
  for (auto& lay : sim.layouts) require_ok(fill_slot(*lay, l.group, 0xdec0de));
  sim.sched->on_computed(l.h, 16385);
  for (int i = 0; i < 4; ++i) {
    sim.step();
    CHECK(slot_saves_in(sim.last_plan) == 0);  // never the prompt-end SLOT, now or later
  }
  CHECK_FALSE(sim.sched->is_committed(boundary_of(sim, a, 16384)));
  CHECK(sim.sched->counters().slot_boundaries_missed.get() == (interval == 8192 ? 1u : 0u));
  REQUIRE(sim.finish(l.h));
  // The next turn extends the prompt: it resumes at `early` with exactly that state, or (interval
  // 0: no SLOT at all) not at all.
  const auto b = concat(a, tokens(95, 700));
  auto [l2, o2] = sim.admit(2, b);
  if (interval == 0) {
    CHECK(o2.match.tokens == 0);
    return;
  }
  CHECK(o2.match.tokens == early);
  REQUIRE(o2.decision.action == LoadAction::kLoad);
  REQUIRE(sim.step().loaded.size() == 1);
  check_restored(sim, l2.h, early);
}

TEST_CASE("a prompt-end SLOT whose previous save is in flight is skipped, never taken late") {
  for (std::uint32_t tp : {1u, 2u, 4u})
    for (std::int64_t interval : {8192, -1, 0})
      prompt_end_slot_missed_while_previous_save_in_flight(tp, interval);
}

// ---- The SLOT snapshot ----

TEST_CASE("slot snapshot is taken at submit before the next forward changes the group") {
  SimEngine sim(sim_options());
  const auto a = tokens(65, 8192 + 8);
  auto [l, out] = sim.admit(1, a);
  sim.forward(l, 0, 8192);
  sim.sched->on_computed(l.h, 8192);
  sim.step(/*progress=*/false);  // dispatched: snapshotted, not run
  REQUIRE(slot_saves_in(sim.last_plan) == 1);
  // The next forward rewrites the live state group before the workers run the save.
  for (auto& lay : sim.layouts) require_ok(fill_slot(*lay, l.group, 0xdead));
  sim.on_ranks([&](std::uint32_t r) { sim.workers[r]->progress(); });
  sim.collect();
  REQUIRE(sim.sched->is_committed(boundary_of(sim, a, 8192)));
  sim.prefill(sim.live(l.h));
  sim.finish(l.h);
  auto [l2, o2] = sim.admit(2, a);
  REQUIRE(sim.step().loaded.size() == 1);
  check_restored(sim, l2.h, 8192);  // the state at 8192, not the later one
}

TEST_CASE("snapshot failure fails the sidecar but still saves page and releases") {
  SimEngine sim(sim_options());
  const auto a = tokens(64, 8192 + 8);
  const Boundary b = boundary_of(sim, a, 8192);
  sim.faulty[1]->fail_snapshot = true;  // rank 1 cannot snapshot its state group
  auto [h, ev] = save_prefix(sim, 1, a, 8192);
  sim.faulty[1]->fail_snapshot = false;
  auto page = terminal_of(ev, Channel::kPageSave);
  auto slot = terminal_of(ev, Channel::kSlotSave);
  REQUIRE(page);
  REQUIRE(slot);
  CHECK(page->ok());
  CHECK_FALSE(slot->ok());
  CHECK(outcome_name(slot->outcome) == "snapshot");
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(sim.sched->counters().slot_save_failures.get() == 1);
  CHECK(sim.sched->counters().save_failures.get() == 0);
  CHECK(sim.sched->counters().save_requests.get() == 1);
  CHECK(sim.sched->saves_pending() == 0);
  // PAGE is saved on every rank; rank 1 has no sidecar and holds no staging for the save.
  const auto keys = chunk_keys(sim.o_.config.page_namespace, a, 1024);
  for (auto& w : sim.workers) {
    CHECK(*w->lookup_prefix(keys) == 8);
    CHECK(w->counters().page_chunks_saved.get() == 8);
    CHECK(w->queued_saves() == 0);
  }
  CHECK(located(sim, 1, sim.workers[1]->slot_key(b)) == -1);
  CHECK(sim.workers[1]->counters().saves_failed.get() == 1);
  // The request is released once done, and the failed boundary is not retried for it.
  sim.prefill(sim.live(h));
  CHECK(sim.finish(h));
  CHECK(sim.freed(h));
  CHECK(sim.sched->counters().slot_save_failures.get() == 1);
  admit_and_check(sim, 2, a, {.page_hit = 8192, .tokens = 0});
}

// ---- Queues, failures and freeing the blocks ----

TEST_CASE("idle progress finishes a deferred final save and frees the blocks") {
  SimEngine sim(sim_options());
  auto [l, out] = sim.admit(1, tokens(28, 8192 + 8));
  sim.forward(l, 0, 8192);
  sim.sched->on_computed(l.h, 8192);
  // The request ends before any step emitted its saves: they are still owed.
  CHECK(sim.sched->should_defer_free(l.h));
  CHECK_FALSE(sim.sched->finish(l.h));
  // The engine has no batch: it runs an idle step, which emits and completes the saves.
  auto ev = sim.step();
  CHECK(sim.last_plan.has_work());
  CHECK(ev.freeable.size() == 1);
  CHECK(sim.freed(l.h));
  CHECK(sim.sched->counters().slot_commits.get() == 1);
}

TEST_CASE("idle progress runs queued saves that no forward would run") {
  SimEngine sim(sim_options());
  auto [l, out] = sim.admit(1, tokens(29, 4096));
  sim.forward(l, 0, 4096);
  sim.sched->on_computed(l.h, 4096);
  sim.step(false);  // dispatched, not run
  CHECK_FALSE(sim.sched->finish(l.h));
  CHECK(sim.workers[0]->queued_saves() == 1);
  // Idle: an empty plan, but progress() on every rank runs the queued saves.
  auto ev = sim.step();
  CHECK_FALSE(sim.last_plan.has_work());
  CHECK(ev.freeable.size() == 1);
  CHECK(sim.sched->saves_pending() == 0);
}

TEST_CASE("deferred free while a save still reads the request's blocks") {
  SimEngine sim(sim_options());
  auto [l, out] = sim.admit(1, tokens(30, 2048));
  sim.forward(l, 0, 2048);
  sim.sched->on_computed(l.h, 2048);
  sim.step(false);
  CHECK(sim.sched->should_defer_free(l.h));
  CHECK_FALSE(sim.sched->finish(l.h));
  CHECK_FALSE(sim.freed(l.h));
  sim.on_ranks([&](std::uint32_t r) { sim.workers[r]->progress(); });
  auto ev = sim.collect();
  CHECK(ev.freeable == std::vector<SeqHandle>{l.h});
  CHECK(sim.freed(l.h));
}

TEST_CASE("page store failure prevents sidecar publish and releases blocks") {
  auto o = sim_options();
  o.profile = [](std::uint32_t r) { return r == 1 ? failing_profile("put") : cpu_profile(); };
  SimEngine sim(o);
  const auto a = tokens(35, 8192 + 8);
  auto out = sim.run(1, a);
  CHECK(sim.freed(out.h));
  CHECK(sim.sched->committed_count() == 0);
  CHECK(sim.workers[1]->counters().slot_publishes.get() == 0);
  CHECK(sim.sched->counters().save_failures.get() >= 1);
  CHECK(sim.sched->counters().slot_save_failures.get() == 1);
}

TEST_CASE("max pending saves bounds running plus queued before snapshot") {
  auto o = sim_options();
  o.config.max_pending_saves = 2;
  SimEngine sim(o);
  for (std::uint64_t i = 0; i < 3; ++i) {
    auto [l, out] = sim.admit(i, tokens(40 + i, 2048));
    sim.forward(l, 0, 2048);
    sim.sched->on_computed(l.h, 2048);
  }
  // Three saves in one plan; nothing runs. The third is rejected at once (never waited for),
  // so its terminal is already there after the dispatch.
  auto ev = sim.step(false);
  REQUIRE(sim.last_plan.saves.size() == 3);
  CHECK(sim.workers[0]->queued_saves() == 2);
  REQUIRE(ev.terminals.size() == 1);
  CHECK(ev.terminals[0].outcome == WorkerOutcome::kMaxPendingSaves);
  CHECK_FALSE(ev.terminals[0].ok());
  CHECK(sim.workers[1]->counters().saves_rejected.get() == 1);
  sim.on_ranks([&](std::uint32_t r) { sim.workers[r]->progress(); });
  sim.collect();
  CHECK(sim.sched->saves_pending() == 0);
}

TEST_CASE("same request saves serialize and release on all ops done") {
  FaultScope faults;
  auto o = rank1_faulty();
  o.config.checkpoint_interval_tokens = 2048;
  SimEngine sim(o);
  const auto a = tokens(67, 2048 + 8);
  auto [l, out] = sim.admit(1, a);
  sim.forward(l, 0, 1024);
  sim.sched->on_computed(l.h, 1024);
  sim.step(false);  // save g1: PAGE [0, 1024)
  const auto g1 = sim.last_plan.saves.at(0).id;
  sim.forward(l, 1024, 2048);
  sim.sched->on_computed(l.h, 2048);
  sim.step(false);  // save g2: PAGE [1024, 2048) + SLOT 2048, while g1 is queued
  REQUIRE(sim.last_plan.saves.size() == 1);
  REQUIRE(sim.last_plan.saves[0].slot);
  const auto g2 = sim.last_plan.saves[0].id;
  CHECK(g2.generation > g1.generation);
  CHECK_FALSE(sim.sched->finish(l.h));  // the request ends with both saves in flight
  std::vector<std::pair<Op, ObjectKey>> puts;
  fault_control().observe = [&](Op op, const ObjectKey& k) {
    if (op == Op::kPut) puts.emplace_back(op, k);
  };
  // One save per rank at a time: g1 first; the blocks stay held for g2.
  sim.on_ranks([&](std::uint32_t r) { sim.workers[r]->progress(1); });
  auto ev = sim.collect();
  CHECK(ev.freeable.empty());
  CHECK_FALSE(sim.freed(l.h));
  CHECK(sim.sched->saves_pending() == 1);
  CHECK(sim.sched->should_defer_free(l.h));
  sim.on_ranks([&](std::uint32_t r) { sim.workers[r]->progress(1); });
  ev = sim.collect();
  CHECK(ev.freeable == std::vector<SeqHandle>{l.h});
  CHECK(sim.freed(l.h));
  CHECK(sim.sched->is_committed(boundary_of(sim, a, 2048)));
  // Rank 1 stored g1's chunk, then g2's chunk, then g2's sidecar.
  const auto keys = chunk_keys(sim.o_.config.page_namespace, a, 1024);
  auto& w1 = *sim.workers[1];
  REQUIRE(puts.size() >= 3);
  CHECK(puts[0].second == w1.page_key(keys[0]));
  CHECK(puts[1].second == w1.page_key(keys[1]));
  CHECK(puts[2].second == w1.slot_key(boundary_of(sim, a, 2048)));
  // Released exactly once.
  CHECK(sim.step().freeable.empty());
}

// A PAGE chunk one rank failed to store while rank 0 stored it: the lookup probe sees rank 0's
// chunks only, so a later request of the prefix must save the chunks above its committed boundary
// again (all of them without one); else rank 1's SLOT of that boundary never sees its PAGE prefix
// (`page_visibility_timeout`) and the prefix is never committed until eviction.
TEST_CASE("a PAGE chunk one rank failed to store is saved again by the next request") {
  FaultScope faults;
  SimEngine sim(rank1_faulty());
  const auto a = tokens(71, 8192 + 8);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  const auto keys = chunk_keys(sim.o_.config.page_namespace, a, sim.o_.config.chunk_tokens);
  const ObjectKey lost = w1.page_key(keys[3]);
  fault_control().fail_put = [&](const ObjectKey& k) { return k == lost; };
  sim.run(1, a);
  CHECK_FALSE(sim.sched->is_committed(b));  // rank 1's PAGE save failed: no SLOT published
  fault_control().fail_put = nullptr;
  const auto saved_before = w1.counters().page_chunks_saved.get();
  run_and_check(sim, 2, a, {.tokens = 0});  // no commit: recomputed, PAGE saved again
  CHECK(w1.counters().page_chunks_saved.get() > saved_before);
  CHECK(sim.sched->is_committed(b));
  auto resumed = run_and_check(sim, 3, a, {.loaded = true});
  CHECK(resumed.resumed_from == 8192);
}
