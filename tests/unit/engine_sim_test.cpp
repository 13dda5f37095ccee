// The offload engine driven by a simulated engine (engine_sim.hpp): TP ranks as threads, a real
// TierStack per rank, real DSV4 PAGE/SLOT codecs. Each TEST_CASE ports a scenario of the
// reference's section 6.1 (same intent, recognisable name) or covers a libtier decision
// (docs/engine.md).
#include <doctest/doctest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "engine_scenarios.hpp"
#include "tier/engine/export.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

namespace {

SimOptions opts(std::uint32_t tp = 2) {
  SimOptions o;
  o.config = default_config(tp);
  return o;
}

std::size_t slot_saves_in(const StepPlan& p) {
  std::size_t n = 0;
  for (const auto& s : p.saves) n += s.slot ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("stateful page hit shrinks from 16k to committed 8k sidecar") {
  page_hit_shrinks_to_committed_sidecar(opts());
}

TEST_CASE("stateful page hit without sidecar is rejected and lookup cleared") {
  auto o = opts();
  o.config.checkpoint_interval_tokens = 0;
  SimEngine sim(o);
  const auto a = tokens(3, 16384 + 8);
  sim.run(1, a);
  CHECK(sim.sched->committed_count() == 0);
  SimEngine::Outcome out;
  auto l = sim.admit(
      2, concat(std::vector<std::uint32_t>(a.begin(), a.begin() + 16384), tokens(4, 4096)), out);
  CHECK(out.match.page_hit == 16384);
  CHECK(out.match.tokens == 0);
  CHECK_FALSE(out.match.park);
  CHECK_FALSE(sim.sched->pending_slot_load(l.h));
  CHECK(out.decision.action == LoadAction::kNone);
  CHECK(sim.sched->counters().lookups_without_commit.get() == 1);
  CHECK(sim.step().terminals.empty() == sim.last_plan.loads.empty());
  CHECK(sim.last_plan.loads.empty());
}

TEST_CASE("stateful lookup fails closed after commit index eviction and record loss") {
  auto o = opts();
  o.config.commit_index_capacity = 1;
  SimEngine sim(o);
  const auto a = tokens(5, 8192 + 8), c = tokens(6, 8192 + 8);
  sim.run(1, a);
  sim.run(2, c);
  CHECK_FALSE(sim.sched->is_committed(boundary_of(sim, a, 8192)));  // LRU cap 1
  // The record in the tiers still proves the commit: rediscovered.
  SimEngine::Outcome out;
  sim.admit(3, a, out);
  CHECK(out.match.tokens == 8192);
  CHECK(sim.sched->is_committed(boundary_of(sim, a, 8192)));
  // c was evicted from the index by that; with its record gone too, it fails closed.
  REQUIRE(sim.workers[0]->remove_commit(boundary_of(sim, c, 8192)).is_ok());
  SimEngine::Outcome out2;
  sim.admit(4, c, out2);
  CHECK(out2.match.page_hit == 8192);
  CHECK(out2.match.tokens == 0);
}

TEST_CASE("request cleanup retains recent global commit") {
  SimEngine sim(opts());
  const auto a = tokens(7, 8192 + 8);
  auto first = sim.run(1, a);
  CHECK(sim.freed(first.h));
  CHECK(sim.sched->tracked_requests() == 0);
  auto again = sim.run(1, a);  // the same request id, reused
  CHECK(again.match.tokens == 8192);
  CHECK(again.loaded);
}

TEST_CASE("stateful full prompt hit uses prior aligned sidecar") {
  SimEngine sim(opts());
  const auto a = tokens(8, 16384);
  sim.run(1, a);
  CHECK(sim.sched->is_committed(boundary_of(sim, a, 8192)));
  CHECK(sim.sched->is_committed(boundary_of(sim, a, 16384)));
  auto out = sim.run(2, a);
  CHECK(out.match.page_hit == 16384);
  CHECK(out.match.tokens == 8192);  // hit - 1 = 16383: the newest boundary below is 8192
  CHECK(out.loaded);
}

TEST_CASE("stateful load rejects nonzero post alloc hbm floor") {
  SimEngine sim(opts());
  const auto a = tokens(9, 8192 + 8);
  sim.run(1, a);
  SimEngine::Outcome out;
  sim.admit(2, a, out, /*hbm=*/1024);
  CHECK(out.match.tokens == 8192);
  CHECK(out.decision.action == LoadAction::kRecompute);
  CHECK(out.decision.reason == "stateful_nonzero_hbm_floor");
  sim.step();
  CHECK(sim.last_plan.loads.empty());
}

TEST_CASE("stateful load without destination group fails closed") {
  SimEngine sim(opts());
  const auto a = tokens(10, 8192 + 8);
  sim.run(1, a);
  SimEngine::Outcome out;
  sim.admit(2, a, out, 0, /*with_group=*/false);
  CHECK(out.decision.action == LoadAction::kRecompute);
  CHECK(out.decision.reason == "missing_destination_group");
}

TEST_CASE("stateful load failure evicts committed boundary idempotently") {
  SimEngine sim(opts());
  const auto a = tokens(11, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  REQUIRE(sim.sched->is_committed(b));
  // The sidecar vanished from rank 1 only.
  REQUIRE(sim.workers[1]
              ->with_stack([&](TierStack& s) { return s.remove(sim.workers[1]->slot_key(b)); })
              .is_ok());
  SimEngine::Outcome out;
  auto l = sim.admit(2, a, out);
  REQUIRE(out.decision.action == LoadAction::kLoad);
  auto ev = sim.step();
  REQUIRE(ev.load_failed.size() == 1);
  REQUIRE(ev.terminals.size() == 1);
  CHECK(ev.terminals[0].reason == "sidecar_unavailable");
  CHECK(sim.workers[1]->counters().slot_invalidations.get() == 0);  // only corrupt ones are
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(sim.sched->saved_watermark(l.h) == 0);  // back to the HBM floor
  CHECK(sim.sched->counters().load_failures.get() == 1);
  CHECK(sim.sched->counters().loaded_tokens.get() == 0);
  // The persisted record is gone too: a restart does not revive the boundary.
  CHECK_FALSE(*sim.workers[0]->has_commit(b));
  sim.restart_scheduler();
  SimEngine::Outcome o2;
  sim.admit(3, a, o2);
  CHECK(o2.match.tokens == 0);
  SimEngine::Outcome o3;
  sim.admit(4, a, o3);
  CHECK(o3.match.tokens == 0);
}

TEST_CASE("recompute after a failed load republishes the boundary") {
  SimEngine sim(opts());
  const auto a = tokens(12, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  REQUIRE(sim.workers[1]
              ->with_stack([&](TierStack& s) { return s.remove(sim.workers[1]->slot_key(b)); })
              .is_ok());
  auto out = sim.run(2, a);
  CHECK(out.load_failed);
  CHECK(sim.sched->is_committed(b));  // the recomputed request saved and committed it again
  auto again = sim.run(3, a);
  CHECK(again.loaded);
}

TEST_CASE("load metadata uses scheduler lifetime generation on reused req id") {
  SimEngine sim(opts());
  const auto a = tokens(13, 8192 + 8);
  sim.run(5, a);
  std::vector<std::uint64_t> gens;
  for (int i = 0; i < 2; ++i) {
    SimEngine::Outcome out;
    auto l = sim.admit(5, a, out);
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
  SimEngine sim(opts());
  const auto a = tokens(14, 8192 + 8);
  sim.run(1, a);
  SimEngine::Outcome o1;
  auto l1 = sim.admit(7, a, o1);
  sim.step(/*progress=*/false);            // load g1 dispatched, not run
  CHECK_FALSE(sim.sched->finish(l1.h));    // abort: the load still writes its blocks
  CHECK(sim.sched->loads_pending() == 0);  // abandoned ops are not pending
  SimEngine::Outcome o2;
  auto l2 = sim.admit(7, a, o2);  // request id 7 reused
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
  SimEngine sim(opts());
  std::set<std::uint64_t> seen;
  std::uint64_t last = 0;
  for (std::uint64_t seed : {15, 16, 17}) {
    SimEngine::Outcome out;
    auto l = sim.admit(9, tokens(seed, 4096), out);
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
  auto o = opts(2);
  o.config.checkpoint_interval_tokens = 1024;
  SimEngine sim(o);
  SimEngine::Outcome out;
  auto l = sim.admit(1, tokens(18, 2048 + 8), out);
  sim.forward(l, 0, 1024);
  sim.sched->on_computed(l.h, 1024);
  auto p1 = sim.sched->build_step();
  REQUIRE(p1.saves.size() == 1);
  REQUIRE(p1.saves[0].slot);
  const auto g = p1.saves[0].id;
  // rank 0 reports the PAGE op, rank 1 the boundary op: nothing clears or commits.
  std::vector<OpReport> crossed = {{Channel::kPageSave, g, 0, true, ""},
                                   {Channel::kSlotSave, g, 1, true, ""}};
  auto ev = sim.sched->process(crossed);
  CHECK(ev.terminals.empty());
  CHECK(sim.sched->saves_pending() == 1);
  CHECK_FALSE(sim.sched->is_committed(*p1.saves[0].slot));
  std::vector<OpReport> matched = {{Channel::kPageSave, g, 1, true, ""},
                                   {Channel::kSlotSave, g, 0, true, ""}};
  ev = sim.sched->process(matched);
  CHECK(ev.terminals.size() == 2);
  CHECK(sim.sched->is_committed(*p1.saves[0].slot));
  CHECK(sim.sched->saves_pending() == 0);
  CHECK(sim.sched->loads_pending() == 0);
}

TEST_CASE("earlier save completion clears only its page generation") {
  auto o = opts(2);
  o.config.checkpoint_interval_tokens = 2048;
  SimEngine sim(o);
  SimEngine::Outcome out;
  auto l = sim.admit(1, tokens(19, 4096 + 8), out);
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
  std::vector<OpReport> done1 = {{Channel::kPageSave, g1, 0, true, ""},
                                 {Channel::kPageSave, g1, 1, true, ""}};
  sim.sched->process(done1);
  CHECK(sim.sched->saves_pending() == 1);
  CHECK(sim.sched->should_defer_free(l.h));
  CHECK_FALSE(sim.sched->is_committed(*p2.saves[0].slot));
}

TEST_CASE("abort during second load ignores first consumed generation") {
  SimEngine sim(opts());
  const auto a = tokens(20, 8192 + 8);
  sim.run(1, a);
  SimEngine::Outcome o1;
  auto l1 = sim.admit(3, a, o1);
  auto ev1 = sim.step();
  REQUIRE(ev1.loaded.size() == 1);
  // Keep the first load's reports to replay them late.
  const auto g1 = sim.last_plan.loads[0].id;
  sim.prefill(sim.live(l1.h));
  sim.finish(l1.h);
  SimEngine::Outcome o2;
  auto l2 = sim.admit(3, a, o2);
  sim.step(false);
  CHECK_FALSE(sim.sched->finish(l2.h));  // abort during the second load
  std::vector<OpReport> late = {{Channel::kLoad, g1, 0, true, ""},
                                {Channel::kLoad, g1, 1, true, ""}};
  auto ev = sim.sched->process(late);
  CHECK(ev.terminals.empty());
  CHECK(ev.loaded.empty());
  sim.on_ranks([&](std::uint32_t r) { sim.workers[r]->progress(); });
  sim.collect();
  CHECK(sim.freed(l2.h));
  CHECK(sim.sched->counters().load_requests.get() == 1);
}

TEST_CASE("sidecar save emits at regular checkpoint boundary") {
  SimEngine sim(opts());
  SimEngine::Outcome out;
  auto l = sim.admit(1, tokens(21, 20000), out);
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
  SimEngine sim(opts());
  const auto a = tokens(22, 16384);
  sim.run(1, a);
  CHECK(sim.sched->is_committed(boundary_of(sim, a, 16384)));
}

TEST_CASE("zero sidecar interval disables slot saves but keeps page saves") {
  auto o = opts();
  o.config.checkpoint_interval_tokens = 0;
  SimEngine sim(o);
  sim.run(1, tokens(23, 16384 + 8));
  CHECK(sim.sched->counters().slot_commits.get() == 0);
  CHECK(sim.sched->counters().saved_tokens.get() == 16384);
}

TEST_CASE("minus one interval saves only the prompt-end anchor") {
  auto o = opts();
  o.config.checkpoint_interval_tokens = -1;
  SimEngine sim(o);
  const auto a = tokens(24, 10000);
  sim.run(1, a);
  CHECK(sim.sched->counters().slot_commits.get() == 1);
  CHECK(sim.sched->is_committed(boundary_of(sim, a, 9216)));
  // A follow-up turn (the prompt extended) resumes from the anchor.
  auto out = sim.run(2, concat(a, tokens(25, 3000)));
  CHECK(out.match.tokens == 9216);
  CHECK(out.loaded);
}

TEST_CASE("prefill chunk is cut at nearest pending sidecar boundary") {
  SimEngine sim(opts());
  SimEngine::Outcome out;
  auto l = sim.admit(1, tokens(26, 20000), out);
  CHECK(sim.sched->cut_prefill_chunk(l.h, 4096, 8192) == 4096);
  CHECK(sim.sched->cut_prefill_chunk(l.h, 8192, 8192) == 8192);  // 16384 ends it exactly
  CHECK(sim.sched->cut_prefill_chunk(l.h, 0, 4096) == 4096);
  CHECK(sim.sched->cut_prefill_chunk(l.h, 16384, 4000) == 4000);  // no boundary left
}

TEST_CASE("partial prefill resumes and captures next boundary after inflight commit") {
  SimEngine sim(opts());
  SimEngine::Outcome out;
  auto l = sim.admit(1, tokens(27, 17000), out);
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

TEST_CASE("idle progress finishes a deferred final save and frees the blocks") {
  SimEngine sim(opts());
  SimEngine::Outcome out;
  auto l = sim.admit(1, tokens(28, 8192 + 8), out);
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
  SimEngine sim(opts());
  SimEngine::Outcome out;
  auto l = sim.admit(1, tokens(29, 4096), out);
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
  SimEngine sim(opts());
  SimEngine::Outcome out;
  auto l = sim.admit(1, tokens(30, 2048), out);
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

TEST_CASE("missing or corrupt sidecar fails whole load and invalidates once") {
  foreign_sidecar_fails_whole_load(opts());
}

TEST_CASE("corrupt sidecar bytes fail the load like a foreign one") {
  corrupt_sidecar_bytes_fail_the_load(opts());
}

TEST_CASE("failed corruption invalidation cannot fake later commit") {
  failed_invalidation_cannot_fake_commit(opts());
}

TEST_CASE("page retrieve failure prevents sidecar fetch") {
  SimEngine sim(opts());
  const auto a = tokens(34, 8192 + 8);
  sim.run(1, a);
  auto& w1 = *sim.workers[1];
  const auto keys = chunk_keys(sim.o_.config.page_namespace, a, 1024);
  REQUIRE(w1.with_stack([&](TierStack& s) { return s.remove(w1.page_key(keys[3])); }).is_ok());
  const auto gets =
      w1.with_stack([](TierStack& s) { return s.tier(0).metrics().of(Op::kGet).requests.get(); });
  SimEngine::Outcome out;
  sim.admit(2, a, out);
  auto ev = sim.step();
  REQUIRE(ev.load_failed.size() == 1);
  CHECK(ev.terminals[0].reason == "page_unavailable");
  const auto after =
      w1.with_stack([](TierStack& s) { return s.tier(0).metrics().of(Op::kGet).requests.get(); });
  CHECK(after - gets == 8);  // the 8 PAGE chunks; the sidecar was never fetched
  CHECK(w1.counters().slot_restores.get() == 0);
}

TEST_CASE("page store failure prevents sidecar publish and releases blocks") {
  auto o = opts();
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
  auto o = opts();
  o.config.max_pending_saves = 2;
  SimEngine sim(o);
  std::vector<SeqHandle> hs;
  for (std::uint64_t i = 0; i < 3; ++i) {
    SimEngine::Outcome out;
    auto l = sim.admit(i, tokens(40 + i, 2048), out);
    sim.forward(l, 0, 2048);
    sim.sched->on_computed(l.h, 2048);
    hs.push_back(l.h);
  }
  // Three saves in one plan; nothing runs. The third is rejected at once (never waited for),
  // so its terminal is already there after the dispatch.
  auto ev = sim.step(false);
  REQUIRE(sim.last_plan.saves.size() == 3);
  CHECK(sim.workers[0]->queued_saves() == 2);
  REQUIRE(ev.terminals.size() == 1);
  CHECK(ev.terminals[0].reason == "max_pending_saves");
  CHECK_FALSE(ev.terminals[0].ok);
  CHECK(sim.workers[1]->counters().saves_rejected.get() == 1);
  sim.on_ranks([&](std::uint32_t r) { sim.workers[r]->progress(); });
  sim.collect();
  CHECK(sim.sched->saves_pending() == 0);
}

TEST_CASE("commits survive a scheduler restart") { commits_survive_restart(opts()); }

TEST_CASE("tp8 resume restores page and slot bit exact on every rank") {
  resume_bit_exact_on_every_rank(opts(8));
}

TEST_CASE("unaligned hbm handoff prefills boundary then emits load") {
  auto o = opts();
  o.config.stateful = false;
  SimEngine sim(o);
  const auto a = tokens(54, 8192 + 8);
  sim.run(1, a);
  SimEngine::Outcome out;
  auto l = sim.admit(2, a, out, /*hbm=*/300);
  CHECK(out.match.tokens == 8192);
  REQUIRE(out.decision.action == LoadAction::kHandoff);
  CHECK(out.decision.reason == "unaligned_hbm_prefill");
  CHECK(out.decision.handoff_tokens == 1024);
  sim.forward(sim.live(l.h), 300, 1024);
  sim.sched->on_computed(l.h, 1024);
  auto d = sim.sched->after_alloc(l.h, 1024, sim.live(l.h).blocks, -1);
  CHECK(d.action == LoadAction::kLoad);
  CHECK(d.load_start == 1024);
  CHECK(d.load_end == 8192);
  auto ev = sim.step();
  REQUIRE(ev.loaded.size() == 1);
  CHECK(sim.sched->counters().loaded_tokens.get() == 8192 - 1024);
}

TEST_CASE("unaligned handoff skips if boundary remainder is too small") {
  auto o = opts();
  o.config.stateful = false;
  o.config.min_load_tokens = 7500;
  SimEngine sim(o);
  const auto a = tokens(55, 8192 + 8);
  sim.run(1, a);
  SimEngine::Outcome out;
  sim.admit(2, a, out, 300);
  CHECK(out.decision.action == LoadAction::kRecompute);
  CHECK(out.decision.reason == "unaligned_hbm_prefill");
  SimEngine::Outcome small;
  o.config.min_load_tokens = 9000;
  SimEngine sim2(o);
  sim2.run(1, a);
  sim2.admit(2, a, small);
  CHECK(small.decision.reason == "too_small");
  SimEngine::Outcome enough;
  sim2.admit(3, a, enough, 8192);
  CHECK(enough.decision.reason == "hbm_satisfies_after_alloc");
}

TEST_CASE("counters export the reference names as json and prometheus") {
  SimEngine sim(opts());
  const auto a = tokens(56, 8192 + 8);
  sim.run(1, a);
  sim.run(2, a);
  std::vector<Worker*> ws;
  for (auto& w : sim.workers) ws.push_back(w.get());
  Json j = metrics_json(*sim.sched, ws);
  for (const char* k : {"load_requests", "loaded_tokens", "load_failures", "save_requests",
                        "saved_tokens", "loads_pending", "saves_pending"})
    CHECK(j["engine"].contains(k));
  CHECK(j["engine"]["load_requests"] == 1);
  CHECK(j["engine"]["loaded_tokens"] == 8192);
  CHECK(j["engine"]["saved_tokens"] == 8192);
  CHECK(j["workers"].size() == 2);
  CHECK(j["workers"][1]["loaded_bytes_by_tier"]["cpu"].get<std::uint64_t>() > 0);
  CHECK(j["tiers"].contains("rank1/cpu"));
  const std::string p = metrics_prometheus(*sim.sched, ws);
  CHECK(p.find("libtier_engine_load_requests_total 1\n") != std::string::npos);
  CHECK(p.find("libtier_engine_loaded_tokens_total 8192\n") != std::string::npos);
  CHECK(p.find("libtier_engine_saves_pending 0\n") != std::string::npos);
  CHECK(p.find("# TYPE libtier_engine_loads_pending gauge") != std::string::npos);
  CHECK(p.find("tier=\"rank1/cpu\"") != std::string::npos);
}

TEST_CASE("nonthrowing page store requires full lookup coverage") {
  // Rank 1's tier is too small for the prefix: every put succeeds, but the oldest chunks are
  // evicted (and dropped) before the SLOT would be published. The visibility check refuses it.
  auto o = opts();
  o.profile = [](std::uint32_t r) {
    if (r == 0) return cpu_profile();
    Json p = cpu_profile("96KiB");
    p["tiers"][0]["on_evict"] = "drop";
    return p;
  };
  SimEngine sim(o);
  const auto a = tokens(57, 8192 + 8);
  sim.run(1, a);
  CHECK(sim.sched->committed_count() == 0);
  CHECK(sim.sched->counters().slot_save_failures.get() == 1);
  CHECK(sim.workers[1]->counters().slot_publishes.get() == 0);
  CHECK(sim.workers[0]->counters().slot_publishes.get() == 1);  // rank 0 alone cannot commit
  CHECK(sim.run(2, a).match.tokens == 0);
}

// ---- Worker scenarios over the "faulty" cpu tier (tests/support/fault_backend.hpp) ----

namespace {

using tier::test::fault_control;

// Clears the shared fault control before and after a test.
struct FaultScope {
  FaultScope() { fault_control().reset(); }
  ~FaultScope() { fault_control().reset(); }
};

// Rank 1 on the faulty tier, the other ranks on plain cpu tiers.
SimOptions rank1_faulty(std::uint32_t tp = 2) {
  auto o = opts(tp);
  o.profile = [](std::uint32_t r) { return r == 1 ? faulty_profile() : cpu_profile(); };
  return o;
}

std::optional<Terminal> terminal_of(const StepEvents& ev, Channel c) {
  for (const auto& t : ev.terminals)
    if (t.channel == c) return t;
  return std::nullopt;
}

// Admits `prompt`, computes its first `tokens` and runs one step: the save of that prefix.
StepEvents save_prefix(SimEngine& sim, RequestId id, const std::vector<std::uint32_t>& prompt,
                       std::uint64_t tokens, SeqHandle* h = nullptr) {
  SimEngine::Outcome out;
  auto l = sim.admit(id, prompt, out);
  sim.forward(l, 0, tokens);
  sim.sched->on_computed(l.h, tokens);
  if (h != nullptr) *h = l.h;
  return sim.step();
}

// Replaces rank `r`'s sidecar of `b` with a valid AOS1 frame of another boundary.
void plant_foreign_sidecar(SimEngine& sim, std::uint32_t r, const Boundary& b) {
  auto& w = *sim.workers[r];
  auto foreign = sim.layouts[r]->slot_codec(SlotIdentity{1024, 4242, 2, r}).value();
  auto src = sim.layouts[r]->slot_regions(0).value();
  w.with_stack([&](TierStack& s) { return s.remove(w.slot_key(b)); }).ignore();
  Status put;
  SaveItem item{w.slot_key(b), src};
  REQUIRE(w.with_stack([&](TierStack& s) {
             return s.save(std::span(&item, 1), *foreign, std::span(&put, 1));
           }).is_ok());
  REQUIRE(put.is_ok());
}

int located(SimEngine& sim, std::uint32_t r, const ObjectKey& k) {
  return *sim.workers[r]->with_stack([&](TierStack& s) { return s.locate(k); });
}

}  // namespace

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
  const auto t0 = std::chrono::steady_clock::now();
  auto ev = save_prefix(sim, 1, a, 8192);
  const auto waited = std::chrono::steady_clock::now() - t0;
  auto page = terminal_of(ev, Channel::kPageSave);
  auto slot = terminal_of(ev, Channel::kSlotSave);
  REQUIRE(page);
  REQUIRE(slot);
  CHECK(page->ok);
  CHECK_FALSE(slot->ok);
  CHECK(slot->reason == "sidecar_visibility_timeout");
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(sim.sched->committed_count() == 0);
  CHECK_FALSE(*sim.workers[0]->has_commit(b));
  CHECK(sim.sched->counters().slot_save_failures.get() == 1);
  CHECK(sim.workers[1]->counters().slot_publishes.get() == 0);
  CHECK(sim.sched->saves_pending() == 0);
  // It polled for the whole timeout at the interval: no busy spin, more than one probe.
  CHECK(waited >= std::chrono::milliseconds(40));
  CHECK(probes.load() >= 2);
  CHECK(probes.load() <= 6);  // at most timeout / interval + 2
  // The sidecar was submitted (rank 1 stores it), it just never showed: no resume from it.
  fault_control().hide = nullptr;
  CHECK(located(sim, 1, sidecar) == 0);
  SimEngine::Outcome o2;
  sim.admit(2, a, o2);
  CHECK(o2.match.page_hit == 8192);
  CHECK(o2.match.tokens == 0);
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
  auto ev = save_prefix(sim, 1, a, 8192);
  auto slot = terminal_of(ev, Channel::kSlotSave);
  REQUIRE(slot);
  CHECK(slot->reason == "sidecar_visibility_timeout");
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
  auto ev = save_prefix(sim, 1, a, 8192);
  auto slot = terminal_of(ev, Channel::kSlotSave);
  REQUIRE(slot);
  CHECK(slot->ok);
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
  auto ev = save_prefix(sim, 1, a, 8192);
  auto page = terminal_of(ev, Channel::kPageSave);
  auto slot = terminal_of(ev, Channel::kSlotSave);
  REQUIRE(page);
  REQUIRE(slot);
  CHECK(page->ok);  // the store said yes
  CHECK_FALSE(slot->ok);
  CHECK(slot->reason == "page_visibility_timeout");
  CHECK(sidecar_puts == 0);  // never published
  CHECK(located(sim, 1, sidecar) == -1);
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(sim.workers[0]->counters().slot_publishes.get() == 1);  // rank 0 alone cannot commit
}

TEST_CASE("snapshot failure fails the sidecar but still saves page and releases") {
  SimEngine sim(opts());
  const auto a = tokens(64, 8192 + 8);
  const Boundary b = boundary_of(sim, a, 8192);
  sim.faulty[1]->fail_snapshot = true;  // rank 1 cannot snapshot its state group
  SeqHandle h = 0;
  auto ev = save_prefix(sim, 1, a, 8192, &h);
  sim.faulty[1]->fail_snapshot = false;
  auto page = terminal_of(ev, Channel::kPageSave);
  auto slot = terminal_of(ev, Channel::kSlotSave);
  REQUIRE(page);
  REQUIRE(slot);
  CHECK(page->ok);
  CHECK_FALSE(slot->ok);
  CHECK(slot->reason == "snapshot");
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
  SimEngine::Outcome o2;
  sim.admit(2, a, o2);
  CHECK(o2.match.page_hit == 8192);
  CHECK(o2.match.tokens == 0);
}

TEST_CASE("slot snapshot is taken at submit before the next forward changes the group") {
  SimEngine sim(opts());
  const auto a = tokens(65, 8192 + 8);
  SimEngine::Outcome out;
  auto l = sim.admit(1, a, out);
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
  SimEngine::Outcome o2;
  auto l2 = sim.admit(2, a, o2);
  REQUIRE(sim.step().loaded.size() == 1);
  check_restored(sim, l2.h, 8192);  // the state at 8192, not the later one
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
  SimEngine::Outcome out;
  auto l = sim.admit(2, a, out);
  REQUIRE(out.decision.action == LoadAction::kLoad);
  sim.step(/*progress=*/false);
  CHECK(w1.take_reports().empty());  // nothing is reported before the load ran
  sim.on_ranks([&](std::uint32_t r) { sim.workers[r]->progress(); });
  const auto& w1c = w1.counters();
  auto ev = sim.collect();
  REQUIRE(ev.loaded.size() == 1);
  // Rank 1 fetched the 8 PAGE chunks in order, then the sidecar once, and nothing else.
  const auto keys = chunk_keys(sim.o_.config.page_namespace, a, 1024);
  REQUIRE(trace.size() == 9);
  for (std::size_t i = 0; i < 8; ++i) {
    CHECK(trace[i].first == Op::kGet);
    CHECK(trace[i].second == w1.page_key(keys[i]));
  }
  CHECK(trace[8].first == Op::kGet);
  CHECK(trace[8].second == w1.slot_key(b));
  CHECK(w1c.slot_restores.get() == 1);
  check_restored(sim, l.h, 8192);
}

TEST_CASE("same request saves serialize and release on all ops done") {
  FaultScope faults;
  auto o = rank1_faulty();
  o.config.checkpoint_interval_tokens = 2048;
  SimEngine sim(o);
  const auto a = tokens(67, 2048 + 8);
  SimEngine::Outcome out;
  auto l = sim.admit(1, a, out);
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
  auto failed = sim.run(2, a);
  CHECK(failed.load_failed);
  CHECK(w1.fenced(w1.slot_key(b)));
  CHECK(w1.counters().fenced_refusals.get() >= 1);
  CHECK_FALSE(sim.sched->is_committed(b));
  // The tier recovers: the next republication retries the removal, then publishes and commits.
  fault_control().fail_remove = false;
  auto recompute = sim.run(3, a);
  CHECK(recompute.match.tokens == 0);
  CHECK_FALSE(w1.fenced(w1.slot_key(b)));
  CHECK(w1.counters().slot_invalidations.get() == 1);
  CHECK(sim.sched->is_committed(b));
  auto resumed = sim.run(4, a);
  CHECK(resumed.loaded);
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
  SimEngine::Outcome out;
  sim.admit(2, a, out);
  auto ev = sim.step();
  fault_control().fail_get = nullptr;
  REQUIRE(ev.load_failed.size() == 1);
  CHECK(terminal_of(ev, Channel::kLoad)->reason == "sidecar_unavailable");
  CHECK(w1.counters().slot_invalidations.get() == 0);
  CHECK_FALSE(w1.fenced(sidecar));
  CHECK(located(sim, 1, sidecar) == 0);  // still stored
  // Recompute commits the boundary again; now the object itself is malformed: invalidated.
  CHECK(sim.run(3, a).load_failed == false);
  REQUIRE(sim.sched->is_committed(b));
  plant_foreign_sidecar(sim, 1, b);
  SimEngine::Outcome o4;
  sim.admit(4, a, o4);
  ev = sim.step();
  REQUIRE(ev.load_failed.size() == 1);
  CHECK(terminal_of(ev, Channel::kLoad)->reason == "sidecar_corrupt");
  CHECK(w1.counters().slot_invalidations.get() == 1);
  CHECK(located(sim, 1, sidecar) == -1);
}

TEST_CASE("cache keys are deterministic and worker rank separated") {
  SimEngine s1(opts(2)), s2(opts(2));
  const auto a = tokens(70, 2048);
  const auto keys = chunk_keys(s1.o_.config.page_namespace, a, 1024);
  const Boundary b{2048, keys[1]};
  // The same identity gives the same keys in another process (here: another engine).
  for (std::uint32_t r = 0; r < 2; ++r) {
    CHECK(s1.workers[r]->page_key(keys[0]) == s2.workers[r]->page_key(keys[0]));
    CHECK(s1.workers[r]->slot_key(b) == s2.workers[r]->slot_key(b));
    CHECK(s1.workers[r]->commit_key(b) == s2.workers[r]->commit_key(b));
  }
  // PAGE and sidecar keys are rank-local; the commit record is one per boundary.
  CHECK_FALSE(s1.workers[0]->page_key(keys[0]) == s1.workers[1]->page_key(keys[0]));
  CHECK_FALSE(s1.workers[0]->slot_key(b) == s1.workers[1]->slot_key(b));
  CHECK(s1.workers[0]->commit_key(b) == s1.workers[1]->commit_key(b));
  // PAGE, sidecar and commit ids never coincide, and another boundary is another key.
  const auto& w = *s1.workers[0];
  CHECK_FALSE(w.page_key(keys[1]).id == w.slot_key(b).id);
  CHECK_FALSE(w.slot_key(b).id == w.commit_key(b).id);
  CHECK_FALSE(w.slot_key(b) == w.slot_key(Boundary{1024, keys[0]}));
  // Another PAGE namespace (model identity) moves every key.
  auto o = opts(2);
  o.config.page_namespace = namespace_id(Json{{"model", "other"}}).value();
  SimEngine s3(o);
  CHECK_FALSE(s3.workers[0]->page_key(keys[0]) == w.page_key(keys[0]));
  CHECK_FALSE(s3.workers[0]->slot_key(b) == w.slot_key(b));
  CHECK_FALSE(s3.workers[0]->commit_key(b) == w.commit_key(b));
}

TEST_CASE("page and slot round trip through a real disk tier, across a process restart") {
  if (Registry::global().find(PluginKind::kBackend, "disk") == nullptr) {
    MESSAGE("skipped: the disk tier is not built");
    return;
  }
  std::string dir = (std::filesystem::temp_directory_path() / "libtier-engine-XXXXXX").string();
  REQUIRE(::mkdtemp(dir.data()) != nullptr);
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } cleanup{dir};
  auto o = opts();
  o.profile = [dir](std::uint32_t r) {
    return Json{
        {"tiers", Json::array({Json{{"name", "disk"},
                                    {"capacity", "16MiB"},
                                    {"backend", Json{{"type", "disk"},
                                                     {"path", dir + "/rank" + std::to_string(r)},
                                                     {"region_size", "1MiB"}}}}})}};
  };
  {
    auto probe = TierStack::open(parse_profile(o.profile(0), Registry::global(), "<t>").value());
    if (!probe && probe.status() == Code::kNotSupported) {
      MESSAGE("skipped: ", probe.status().to_string());
      return;
    }
    REQUIRE_MESSAGE(probe.is_ok(), probe.status().to_string());
  }
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
  SimEngine::Outcome out;
  auto l = sim.admit(2, concat(a, tokens(72, 100)), out);
  CHECK(out.match.tokens == 8192);
  REQUIRE(out.decision.action == LoadAction::kLoad);
  REQUIRE(sim.step().loaded.size() == 1);
  check_restored(sim, l.h, 8192);
  CHECK(sim.sched->counters().commits_rediscovered.get() == 1);
  for (auto& w : sim.workers) {
    CHECK(w->counters().slot_restores.get() == 1);
    CHECK(w->loaded_bytes_by_tier()[0] > 0);
  }
}

TEST_CASE("layout options are strict") {
  auto d = Dsv4LayoutOptions::from_json(Json::object());
  REQUIRE(d.is_ok());
  CHECK(d->memory == KvMemoryKind::kHost);
  CHECK(d->device == 0);
  auto dev = Dsv4LayoutOptions::from_json(Json{{"memory", "device"}, {"device", 1}});
  REQUIRE(dev.is_ok());
  CHECK(dev->memory == KvMemoryKind::kDevice);
  CHECK(dev->device == 1);
  CHECK(dev->to_json() == Json{{"memory", "device"}, {"device", 1}});
  auto bad = Dsv4LayoutOptions::from_json(Json{{"memory", "gpu"}}, "/layout");
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status() == Code::kInvalidArgument);
  CHECK(bad.status().to_string().find("/layout/memory") != std::string::npos);
  auto typo = Dsv4LayoutOptions::from_json(Json{{"memroy", "device"}});
  REQUIRE_FALSE(typo.is_ok());
  CHECK(typo.status().to_string().find("memroy") != std::string::npos);
  CHECK_FALSE(Dsv4LayoutOptions::from_json(Json{{"device", -1}}).is_ok());
  CHECK_FALSE(Dsv4LayoutOptions::from_json(Json{{"device", "0"}}).is_ok());
  for (const OptionSpec& spec : Dsv4LayoutOptions::options()) CHECK_FALSE(spec.doc.empty());
}

TEST_CASE("device KV memory without a GPU is NotSupported") {
  const auto geo = small_geometry(128, 16, 2);
  const Key128 ns = default_config().page_namespace;
  Dsv4LayoutOptions o;
  o.memory = KvMemoryKind::kDevice;
  auto l = Dsv4Layout::create(geo, ns, 1, 0, o);
  if (l.is_ok()) {
    // This machine has a GPU (engine_gpu_test covers it): the memory is device memory.
    const std::uint32_t block = 0;
    CHECK((*l)->page_regions(std::span(&block, 1)).value()[0].kind == MemoryKind::kDevice);
  } else {
    CHECK(l.status() == Code::kNotSupported);
    CHECK(l.status().to_string().find("device KV memory needs") != std::string::npos);
  }
  o.device = -1;
  auto neg = Dsv4Layout::create(geo, ns, 1, 0, o);
  REQUIRE_FALSE(neg.is_ok());
  CHECK(neg.status() == Code::kInvalidArgument);
}

TEST_CASE("host layout: fill, zero and digest report bad ids and see the bytes") {
  const auto geo = small_geometry(128, 16, 2);
  auto l = Dsv4Layout::create(geo, default_config().page_namespace, 1, 0).value();
  const std::uint64_t zero = digest_block(*l, 3).value();
  REQUIRE(fill_block(*l, 3, 42).is_ok());
  const std::uint64_t filled = digest_block(*l, 3).value();
  CHECK(filled != zero);
  CHECK(digest_block(*l, 4).value() == zero);  // only block 3 was written
  REQUIRE(zero_block(*l, 3).is_ok());
  CHECK(digest_block(*l, 3).value() == zero);
  CHECK(fill_block(*l, 16, 1) == Code::kInvalidArgument);
  CHECK(digest_block(*l, 16).status() == Code::kInvalidArgument);
  CHECK(fill_slot(*l, -1, 1) == Code::kInvalidArgument);
  CHECK(digest_slot(*l, 2).status() == Code::kInvalidArgument);
}
