// The offload engine driven by the simulated engine (tests/support/engine_sim.hpp): what lookup
// finds (PAGE hits, committed SLOT boundaries, commits rediscovered from the tiers) and what
// after_alloc decides for it (load, recompute, handoff, and why). Each TEST_CASE, and each row of
// the admission table, ports a scenario of the reference's section 6.1 (same intent,
// recognisable name) or covers a libtier decision (docs/engine.md).
#include <doctest/doctest.h>

#include <functional>
#include <vector>

#include "support/engine_scenarios.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

namespace {

// One admission: request 1 runs `warm` to its end, then request 2 (a prefix of `warm` plus new
// tokens) is admitted, or run to its end, and its outcome checked.
struct AdmissionCase {
  const char* name;                        // the scenario
  std::function<void(SimOptions&)> setup;  // options changed from sim_options(); may be empty
  std::vector<std::uint32_t> warm;         // request 1's prompt
  std::size_t keep;                        // request 2: the first `keep` tokens of `warm`...
  std::vector<std::uint32_t> extra;        // ...followed by these
  AdmitOptions admit;
  bool run = false;  // run request 2 to its end (SimEngine::run) instead of only admitting it
  Expect expect;
  // Checks after request 1 ran (before request 2) and after request 2; may be empty.
  std::function<void(SimEngine&, const std::vector<std::uint32_t>& warm)> after_warm;
  std::function<void(SimEngine&, const SimEngine::Outcome&)> after;
};

void run_case(const AdmissionCase& c) {
  INFO(c.name);
  auto o = sim_options();
  if (c.setup) c.setup(o);
  SimEngine sim(o);
  sim.run(1, c.warm);
  if (c.after_warm) c.after_warm(sim, c.warm);
  std::vector<std::uint32_t> prompt(c.warm.begin(), c.warm.begin() + static_cast<long>(c.keep));
  prompt.insert(prompt.end(), c.extra.begin(), c.extra.end());
  const SimEngine::Outcome out = c.run ? run_and_check(sim, 2, prompt, c.expect)
                                       : admit_and_check(sim, 2, prompt, c.expect, c.admit).out;
  if (c.after) c.after(sim, out);
}

void no_sidecars(SimOptions& o) { o.config.checkpoint_interval_tokens = 0; }
void stateless(SimOptions& o) { o.config.stateful = false; }

const std::vector<AdmissionCase>& admission_cases() {
  static const auto a16k = tokens(3, 16384 + 8), full16k = tokens(8, 16384);
  static const auto floor8k = tokens(9, 8192 + 8), nogroup8k = tokens(10, 8192 + 8);
  static const auto handoff8k = tokens(55, 8192 + 8);
  static const std::vector<AdmissionCase> cases = {
      {.name = "stateful page hit without sidecar is rejected and lookup cleared",
       .setup = no_sidecars,
       .warm = a16k,
       .keep = 16384,
       .extra = tokens(4, 4096),
       .expect = {.page_hit = 16384, .tokens = 0, .park = false, .action = LoadAction::kNone},
       .after_warm =
           [](SimEngine& sim, const std::vector<std::uint32_t>&) {
             CHECK(sim.sched->committed_count() == 0);
           },
       .after =
           [](SimEngine& sim, const SimEngine::Outcome& out) {
             CHECK_FALSE(sim.sched->pending_slot_load(out.h));
             CHECK(sim.sched->counters().lookups_without_commit.get() == 1);
             CHECK(sim.step().terminals.empty() == sim.last_plan.loads.empty());
             CHECK(sim.last_plan.loads.empty());
           }},
      {.name = "stateful full prompt hit uses prior aligned sidecar",
       .warm = full16k,
       .keep = 16384,
       .run = true,
       // hit - 1 = 16383: the newest boundary below is 8192
       .expect = {.page_hit = 16384, .tokens = 8192, .loaded = true},
       .after_warm =
           [](SimEngine& sim, const std::vector<std::uint32_t>& a) {
             CHECK(sim.sched->is_committed(boundary_of(sim, a, 8192)));
             CHECK(sim.sched->is_committed(boundary_of(sim, a, 16384)));
           }},
      {.name = "stateful load rejects nonzero post alloc hbm floor",
       .warm = floor8k,
       .keep = floor8k.size(),
       .admit = {.local = 1024},
       .expect = {.tokens = 8192,
                  .action = LoadAction::kRecompute,
                  .reason = "stateful_nonzero_hbm_floor"},
       .after =
           [](SimEngine& sim, const SimEngine::Outcome&) {
             sim.step();
             CHECK(sim.last_plan.loads.empty());
           }},
      {.name = "stateful load without destination group fails closed",
       .warm = nogroup8k,
       .keep = nogroup8k.size(),
       .admit = {.with_group = false},
       .expect = {.action = LoadAction::kRecompute, .reason = "missing_destination_group"}},
      {.name = "unaligned handoff skips if boundary remainder is too small [below the boundary]",
       .setup =
           [](SimOptions& o) {
             stateless(o);
             o.config.min_load_tokens = 7500;
           },
       .warm = handoff8k,
       .keep = handoff8k.size(),
       .admit = {.local = 300},
       .expect = {.action = LoadAction::kRecompute, .reason = "unaligned_hbm_prefill"}},
      {.name = "unaligned handoff skips if boundary remainder is too small [too small]",
       .setup =
           [](SimOptions& o) {
             stateless(o);
             o.config.min_load_tokens = 9000;
           },
       .warm = handoff8k,
       .keep = handoff8k.size(),
       .expect = {.reason = "too_small"}},
      {.name = "unaligned handoff skips if boundary remainder is too small [hbm enough]",
       .setup =
           [](SimOptions& o) {
             stateless(o);
             o.config.min_load_tokens = 9000;
           },
       .warm = handoff8k,
       .keep = handoff8k.size(),
       .admit = {.local = 8192},
       .expect = {.reason = "hbm_satisfies_after_alloc"}},
  };
  return cases;
}

}  // namespace

TEST_CASE("admission decisions, one row per scenario") {
  for (const AdmissionCase& c : admission_cases()) run_case(c);
}

TEST_CASE("stateful page hit shrinks from 16k to committed 8k sidecar") {
  page_hit_shrinks_to_committed_sidecar(sim_options());
}

TEST_CASE("stateful lookup fails closed after commit index eviction and record loss") {
  auto o = sim_options();
  o.config.commit_index_capacity = 1;
  SimEngine sim(o);
  const auto a = tokens(5, 8192 + 8), c = tokens(6, 8192 + 8);
  sim.run(1, a);
  sim.run(2, c);
  CHECK_FALSE(sim.sched->is_committed(boundary_of(sim, a, 8192)));  // LRU cap 1
  // The record in the tiers still proves the commit: rediscovered.
  admit_and_check(sim, 3, a, {.tokens = 8192});
  CHECK(sim.sched->is_committed(boundary_of(sim, a, 8192)));
  // c was evicted from the index by that; with its record gone too, it fails closed.
  REQUIRE(sim.workers[0]->remove_commit(boundary_of(sim, c, 8192)).is_ok());
  admit_and_check(sim, 4, c, {.page_hit = 8192, .tokens = 0});
}

TEST_CASE("request cleanup retains recent global commit") {
  SimEngine sim(sim_options());
  const auto a = tokens(7, 8192 + 8);
  auto first = sim.run(1, a);
  CHECK(sim.freed(first.h));
  CHECK(sim.sched->tracked_requests() == 0);
  run_and_check(sim, 1, a, {.tokens = 8192, .loaded = true});  // the same request id, reused
}

TEST_CASE("commits survive a scheduler restart") { commits_survive_restart(sim_options()); }

TEST_CASE("unaligned hbm handoff prefills boundary then emits load") {
  auto o = sim_options();
  o.config.stateful = false;
  SimEngine sim(o);
  const auto a = tokens(54, 8192 + 8);
  sim.run(1, a);
  auto [l, out] = admit_and_check(sim, 2, a,
                                  {.tokens = 8192,
                                   .action = LoadAction::kHandoff,
                                   .reason = "unaligned_hbm_prefill",
                                   .handoff_tokens = 1024},
                                  {.local = 300});
  REQUIRE(out.decision.action == LoadAction::kHandoff);
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
