#pragma once
// Scenarios of the offload engine shared by the host and the GPU runs of the simulated engine:
// engine_sim_test.cpp runs them with the KV in host memory, engine_gpu_test.cpp with the KV in
// GPU memory (SimOptions::layout). Each takes the options to run with (TP size, memory); the
// reference's scenario each ports is named above it, as its engine_sim_test TEST_CASE is.
// The scenarios that put a foreign sidecar use rank 1, so they need tp_size >= 2.

#include <doctest/doctest.h>

#include <chrono>
#include <vector>

#include "engine_sim.hpp"

namespace tier::engine::test {

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
  SimEngine::Outcome out;
  auto l = sim.admit(2, b, out);
  CHECK(out.match.page_hit == 16384);
  CHECK(out.match.tokens == 8192);
  CHECK(out.match.park);
  REQUIRE(sim.sched->pending_slot_load(l.h));
  CHECK(*sim.sched->pending_slot_load(l.h) == boundary_of(sim, b, 8192));
  CHECK(out.decision.action == LoadAction::kLoad);
  CHECK(out.decision.reason == "aligned_large_hit");
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
  SimEngine::Outcome out;
  auto l = sim.admit(2, a, out);
  const auto before = require_value(digest_slot(*sim.layouts[1], l.group));
  auto ev = sim.step();
  REQUIRE(ev.load_failed.size() == 1);
  REQUIRE(ev.terminals.size() == 1);  // exactly one terminal for the load
  CHECK(ev.terminals[0].reason == "sidecar_corrupt");
  CHECK(require_value(digest_slot(*sim.layouts[1], l.group)) ==
        before);  // the group was never written
  CHECK(w1.counters().slot_invalidations.get() == 1);
  CHECK(*w1.with_stack([&](TierStack& s) { return s.locate(w1.slot_key(b)); }) == -1);
  CHECK_FALSE(w1.fenced(w1.slot_key(b)));
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(sim.sched->counters().loaded_tokens.get() == 0);
}

// "corrupt sidecar bytes fail the load like a foreign one"
inline void corrupt_sidecar_bytes_fail_the_load(SimOptions o) {
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
    IoRequest rm{Op::kRemove, w1.slot_key(b), {}, 2};
    REQUIRE(*be.submit(std::span(&rm, 1)) == 1);
    REQUIRE(*be.poll(std::span(&c, 1), 1, std::chrono::microseconds(100000)) == 1);
    IoRequest put{Op::kPut, w1.slot_key(b), host_region(img), 3};
    REQUIRE(*be.submit(std::span(&put, 1)) == 1);
    REQUIRE(*be.poll(std::span(&c, 1), 1, std::chrono::microseconds(100000)) == 1);
    return 0;
  });
  auto out = sim.run(2, a);
  CHECK(out.load_failed);
  CHECK_FALSE(out.loaded);
  CHECK(sim.sched->counters().load_failures.get() == 1);
  // The recomputed request republished a good sidecar.
  CHECK(sim.run(3, a).loaded);
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
  auto out = sim.run(2, a);  // the load detects it; the removal fails; the key stays fenced
  CHECK(out.load_failed);
  CHECK(w1.fenced(w1.slot_key(b)));
  // The recompute tried to republish: refused, never committed.
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(w1.counters().fenced_refusals.get() >= 1);
  auto again = sim.run(3, a);
  CHECK(again.match.tokens == 0);
}

// "commits survive a scheduler restart"
inline void commits_survive_restart(SimOptions o) {
  SimEngine sim(o);
  const auto a = tokens(50, 16384 + 100);
  sim.run(1, a);
  sim.restart_scheduler();
  CHECK(sim.sched->committed_count() == 0);
  SimEngine::Outcome out;
  auto l = sim.admit(2, concat(a, tokens(51, 100)), out);
  CHECK(out.match.tokens == 16384);
  REQUIRE(sim.step().loaded.size() == 1);
  check_restored(sim, l.h, 16384);
  CHECK(sim.sched->counters().commits_rediscovered.get() == 1);
}

// "tp8 resume restores page and slot bit exact on every rank"
inline void resume_bit_exact_on_every_rank(SimOptions o) {
  SimEngine sim(o);
  const auto a = tokens(52, 8192 + 100);
  sim.run(1, a);
  SimEngine::Outcome out;
  auto l = sim.admit(2, concat(a, tokens(53, 500)), out);
  REQUIRE(out.decision.action == LoadAction::kLoad);
  auto ev = sim.step();
  REQUIRE(ev.loaded.size() == 1);
  check_restored(sim, l.h, 8192);
  for (auto& w : sim.workers) CHECK(w->counters().slot_restores.get() == 1);
}

}  // namespace tier::engine::test
