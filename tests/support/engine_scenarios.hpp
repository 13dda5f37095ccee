#pragma once
// Checks and scenarios of the offload engine shared by the simulated-engine tests
// (tests/unit/engine_*_test.cpp). The scenarios run with the KV in host memory there and in GPU
// memory in engine_gpu_test.cpp (SimOptions::layout). Each takes the options to run with (TP
// size, memory); the reference's scenario each ports is named above it, as its host TEST_CASE
// is. The scenarios that put a foreign sidecar use rank 1, so they need tp_size >= 2.

#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "support/engine_sim.hpp"
#include "tier/object.hpp"

namespace tier::engine::test {

// ---- Helpers ----

inline Boundary boundary_of(const SimEngine& sim, const std::vector<std::uint32_t>& prompt,
                            std::uint64_t tokens) {
  auto keys = chunk_keys(sim.o_.config.page_namespace, prompt, sim.o_.config.chunk_tokens);
  return Boundary{tokens, keys[tokens / sim.o_.config.chunk_tokens - 1]};
}

// Every rank's blocks [0, tokens) and state group hold what a recomputation would write. The
// request's blocks and group were zero before its load, so a load that wrote nothing (or wrote
// wrong bytes) fails here.
inline void check_restored(SimEngine& sim, SeqHandle h, std::uint64_t tokens) {
  auto& l = sim.live(h);
  const auto keys =
      chunk_keys(sim.o_.config.page_namespace, l.prompt, sim.o_.config.block_tokens, true);
  for (std::uint32_t r = 0; r < sim.layouts.size(); ++r) {
    auto& lay = *sim.layouts[r];
    for (std::uint64_t b = 0; b < tokens / sim.o_.config.block_tokens; ++b) {
      const auto got = require_value(digest_block(lay, l.blocks[b]));
      require_ok(fill_block(lay, l.blocks[b], keys[b].lo));
      REQUIRE(got == require_value(digest_block(lay, l.blocks[b])));
    }
    CHECK(require_value(digest_slot(lay, l.group)) ==
          sim.expected_slot_digest(r, l.prompt, tokens));
  }
}

// What an admission (lookup, then after_alloc) or a whole run is expected to decide; unset
// fields are not checked. One row of the admit-and-check tables.
struct Expect {
  std::optional<std::uint64_t> page_hit;  // MatchResult::page_hit
  std::optional<std::uint64_t> tokens;    // MatchResult::tokens: the resumable prefix
  std::optional<bool> park;               // MatchResult::park
  std::optional<LoadAction> action;       // LoadDecision::action
  std::optional<std::string> reason;      // LoadDecision::reason
  std::optional<std::uint64_t> handoff_tokens;
  std::optional<bool> loaded;       // run() only: the load completed
  std::optional<bool> load_failed;  // run() only: the load failed
};

inline void check_outcome(const SimEngine::Outcome& out, const Expect& e) {
  if (e.page_hit) CHECK(out.match.page_hit == *e.page_hit);
  if (e.tokens) CHECK(out.match.tokens == *e.tokens);
  if (e.park) CHECK(out.match.park == *e.park);
  if (e.action) CHECK(out.decision.action == *e.action);
  if (e.reason) CHECK(out.decision.reason == *e.reason);
  if (e.handoff_tokens) CHECK(out.decision.handoff_tokens == *e.handoff_tokens);
  if (e.loaded) CHECK(out.loaded == *e.loaded);
  if (e.load_failed) CHECK(out.load_failed == *e.load_failed);
}

// Admits `prompt` as request `id` and checks what lookup and after_alloc decided.
inline SimEngine::Admission admit_and_check(SimEngine& sim, RequestId id,
                                            const std::vector<std::uint32_t>& prompt,
                                            const Expect& e, AdmitOptions opt = {}) {
  auto admission = sim.admit(id, prompt, opt);
  check_outcome(admission.out, e);
  return admission;
}

// Runs `prompt` as request `id` to its end (SimEngine::run) and checks its outcome.
inline SimEngine::Outcome run_and_check(SimEngine& sim, RequestId id,
                                        const std::vector<std::uint32_t>& prompt, const Expect& e) {
  auto out = sim.run(id, prompt);
  check_outcome(out, e);
  return out;
}

// ---- Fault injection over the "faulty" cpu tier (tests/support/fault_backend.hpp) ----

using tier::test::fault_control;

// Clears the shared fault control before and after a test.
struct FaultScope {
  FaultScope() { fault_control().reset(); }
  ~FaultScope() { fault_control().reset(); }
};

// Rank 1 on the faulty tier, the other ranks on plain cpu tiers.
inline SimOptions rank1_faulty(std::uint32_t tp = 2) {
  auto o = sim_options(tp);
  o.profile = [](std::uint32_t r) { return r == 1 ? faulty_profile() : cpu_profile(); };
  return o;
}

inline std::optional<Terminal> terminal_of(const StepEvents& ev, Channel c) {
  for (const auto& t : ev.terminals)
    if (t.channel == c) return t;
  return std::nullopt;
}

struct SavedPrefix {
  SeqHandle h = 0;  // the admitted request
  StepEvents ev;    // what the step that saved its prefix reported
};
// Admits `prompt`, computes its first `tokens` and runs one step: the save of that prefix.
inline SavedPrefix save_prefix(SimEngine& sim, RequestId id,
                               const std::vector<std::uint32_t>& prompt, std::uint64_t tokens) {
  auto [l, out] = sim.admit(id, prompt);
  sim.forward(l, 0, tokens);
  sim.sched->on_computed(l.h, tokens);
  return {l.h, sim.step()};
}

// Replaces rank `r`'s sidecar of `b` with a valid AOS1 frame of another boundary.
inline void plant_foreign_sidecar(SimEngine& sim, std::uint32_t r, const Boundary& b) {
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

// The tier of rank `r` that holds `k`, or -1.
inline int located(SimEngine& sim, std::uint32_t r, const ObjectKey& k) {
  return *sim.workers[r]->with_stack([&](TierStack& s) { return s.locate(k); });
}

// ---- Scenarios ----

// "stateful page hit shrinks from 16k to committed 8k sidecar"
inline void page_hit_shrinks_to_committed_sidecar(SimOptions o) {
  SimEngine sim(o);
  const auto a = tokens(1, 16384 + 8);
  sim.run(1, a);
  CHECK(sim.sched->is_committed(boundary_of(sim, a, 8192)));
  CHECK(sim.sched->is_committed(boundary_of(sim, a, 16384)));
  // Lose the 16k commit, restart: only 8k is rediscovered from the tiers.
  REQUIRE(sim.workers[0]->remove_commit(boundary_of(sim, a, 16384)).is_ok());
  sim.restart_scheduler();
  const auto b = concat(std::vector<std::uint32_t>(a.begin(), a.begin() + 16384), tokens(2, 8192));
  REQUIRE(b.size() == 24576);
  auto [l, out] = admit_and_check(sim, 2, b,
                                  {.page_hit = 16384,
                                   .tokens = 8192,
                                   .park = true,
                                   .action = LoadAction::kLoad,
                                   .reason = "aligned_large_hit"});
  REQUIRE(sim.sched->pending_slot_load(l.h));
  CHECK(*sim.sched->pending_slot_load(l.h) == boundary_of(sim, b, 8192));
  auto ev = sim.step();
  REQUIRE(ev.loaded.size() == 1);
  check_restored(sim, l.h, 8192);
  CHECK(sim.sched->counters().load_requests.get() == 1);
  CHECK(sim.sched->counters().loaded_tokens.get() == 8192);
  CHECK(sim.sched->counters().commits_rediscovered.get() >= 1);
}

// "missing or corrupt sidecar fails whole load and invalidates once"
inline void foreign_sidecar_fails_whole_load(SimOptions o) {
  SimEngine sim(o);
  const auto a = tokens(31, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  // Rank 1's sidecar is replaced by a foreign one: a valid AOS1 frame of another boundary.
  auto& w1 = *sim.workers[1];
  auto foreign = sim.layouts[1]->slot_codec(SlotIdentity{1024, 12345, o.config.tp_size, 1}).value();
  auto src = sim.layouts[1]->slot_regions(0).value();
  REQUIRE(w1.with_stack([&](TierStack& s) { return s.remove(w1.slot_key(b)); }).is_ok());
  Status put;
  SaveItem item{w1.slot_key(b), src};
  REQUIRE(w1.with_stack([&](TierStack& s) {
              return s.save(std::span(&item, 1), *foreign, std::span(&put, 1));
            }).is_ok());
  REQUIRE(put.is_ok());
  auto [l, out] = sim.admit(2, a);
  const auto before = require_value(digest_slot(*sim.layouts[1], l.group));
  auto ev = sim.step();
  REQUIRE(ev.load_failed.size() == 1);
  REQUIRE(ev.terminals.size() == 1);  // exactly one terminal for the load
  CHECK(ev.terminals[0].outcome == WorkerOutcome::kSidecarCorrupt);
  CHECK(require_value(digest_slot(*sim.layouts[1], l.group)) == before);  // never written
  CHECK(w1.counters().slot_invalidations.get() == 1);
  CHECK(*w1.with_stack([&](TierStack& s) { return s.locate(w1.slot_key(b)); }) == -1);
  CHECK_FALSE(w1.fenced(w1.slot_key(b)));
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(sim.sched->counters().loaded_tokens.get() == 0);
}

// "corrupt sidecar bytes fail the load like a foreign one"
// `reseal`: the object's header is resealed over the flipped byte, so only the AOS1 CRC (checked
// by the codec, or by a tier before a direct scattered get) can notice.
inline void corrupt_sidecar_bytes_fail_the_load(SimOptions o, bool reseal = false) {
  SimEngine sim(o);
  const auto a = tokens(32, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  // Flip one payload byte of the stored object in rank 1's CPU tier.
  w1.with_stack([&](TierStack& s) {
    Backend& be = s.tier(0);
    std::vector<std::byte> img(1 << 20);
    IoRequest get{Op::kGet, w1.slot_key(b), host_region(img), 1};
    REQUIRE(*be.submit(std::span(&get, 1)) == 1);
    Completion c;
    REQUIRE(*be.poll(std::span(&c, 1), 1, std::chrono::microseconds(100000)) == 1);
    REQUIRE(c.status.is_ok());
    img.resize(c.bytes);
    img[img.size() - 7] ^= std::byte{0x40};
    if (reseal) {
      auto h = parse_object_header(img);
      REQUIRE(h.is_ok());
      seal_object(img, h->format_id, h->stage_id, w1.slot_key(b));
    }
    IoRequest rm{Op::kRemove, w1.slot_key(b), {}, 2};
    REQUIRE(*be.submit(std::span(&rm, 1)) == 1);
    REQUIRE(*be.poll(std::span(&c, 1), 1, std::chrono::microseconds(100000)) == 1);
    IoRequest put{Op::kPut, w1.slot_key(b), host_region(img), 3};
    REQUIRE(*be.submit(std::span(&put, 1)) == 1);
    REQUIRE(*be.poll(std::span(&c, 1), 1, std::chrono::microseconds(100000)) == 1);
    return 0;
  });
  run_and_check(sim, 2, a, {.loaded = false, .load_failed = true});
  CHECK(sim.sched->counters().load_failures.get() == 1);
  // The recomputed request republished a good sidecar.
  run_and_check(sim, 3, a, {.loaded = true});
}

// "failed corruption invalidation cannot fake later commit"
inline void failed_invalidation_cannot_fake_commit(SimOptions o) {
  o.profile = [](std::uint32_t r) { return r == 1 ? failing_profile("remove") : cpu_profile(); };
  SimEngine sim(o);
  const auto a = tokens(33, 8192 + 8);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  // A foreign sidecar already sits under rank 1's key; tiers are put-if-absent.
  auto foreign = sim.layouts[1]->slot_codec(SlotIdentity{1024, 777, o.config.tp_size, 1}).value();
  auto src = sim.layouts[1]->slot_regions(0).value();
  Status put;
  SaveItem item{w1.slot_key(b), src};
  REQUIRE(w1.with_stack([&](TierStack& s) {
              return s.save(std::span(&item, 1), *foreign, std::span(&put, 1));
            }).is_ok());
  sim.run(1, a);  // its SLOT "put" found the key present: committed, though rank 1 is foreign
  REQUIRE(sim.sched->is_committed(b));
  // The load detects it; the removal fails; the key stays fenced.
  run_and_check(sim, 2, a, {.load_failed = true});
  CHECK(w1.fenced(w1.slot_key(b)));
  // The recompute tried to republish: refused, never committed.
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(w1.counters().fenced_refusals.get() >= 1);
  run_and_check(sim, 3, a, {.tokens = 0});
}

// "commits survive a scheduler restart"
inline void commits_survive_restart(SimOptions o) {
  SimEngine sim(o);
  const auto a = tokens(50, 16384 + 100);
  sim.run(1, a);
  sim.restart_scheduler();
  CHECK(sim.sched->committed_count() == 0);
  auto [l, out] = admit_and_check(sim, 2, concat(a, tokens(51, 100)), {.tokens = 16384});
  REQUIRE(sim.step().loaded.size() == 1);
  check_restored(sim, l.h, 16384);
  CHECK(sim.sched->counters().commits_rediscovered.get() == 1);
}

// "tp8 resume restores page and slot bit exact on every rank"
inline void resume_bit_exact_on_every_rank(SimOptions o) {
  SimEngine sim(o);
  const auto a = tokens(52, 8192 + 100);
  sim.run(1, a);
  auto [l, out] = sim.admit(2, concat(a, tokens(53, 500)));
  REQUIRE(out.decision.action == LoadAction::kLoad);
  auto ev = sim.step();
  REQUIRE(ev.loaded.size() == 1);
  check_restored(sim, l.h, 8192);
  for (auto& w : sim.workers) CHECK(w->counters().slot_restores.get() == 1);
}

}  // namespace tier::engine::test
