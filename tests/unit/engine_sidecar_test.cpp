// The offload engine's sidecars on real DSV4 layouts (each rank's Worker over its dsv4::Dsv4Layout, not
// the simulated engine's FaultyLayout wrapper): sidecar and commit keys carry the slot
// fingerprint and the TP size, pools can be resized without orphaning stored objects, the
// engine's block size is checked against the geometry, and the worker's corruption fence and
// invalidation across every tier (the rows of the reference's fail-closed table that a former
// codec-level test proved on its own store).
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/engine_scenarios.hpp"
#include "support/fault_backend.hpp"
#include "tier/object.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;
using tier::test::fault_control;

namespace {

struct FaultReset {
  FaultReset() { fault_control().reset(); }
  ~FaultReset() { fault_control().reset(); }
};

SimOptions opts(std::uint32_t tp = 2) {
  SimOptions o;
  o.config = default_config(tp);
  return o;
}

// Every rank's worker over its real dsv4::Dsv4Layout (which reports its fingerprint and block size),
// and a new scheduler over them. Call before the first request.
void use_real_layouts(SimEngine& sim) {
  for (std::uint32_t r = 0; r < sim.workers.size(); ++r)
    sim.workers[r] =
        require_value(Worker::create(sim.o_.config, r, *sim.stacks[r], *sim.layouts[r]));
  sim.restart_scheduler();
}

// Every rank's layout rebuilt over `geometry` (same page namespace and TP size), every worker
// over its new real layout, and a new scheduler: a restarted engine over the same tiers.
void use_layouts(SimEngine& sim, const dsv4::Geometry& geometry) {
  for (std::uint32_t r = 0; r < sim.workers.size(); ++r) {
    auto layout = require_value(
        dsv4::Dsv4Layout::create(geometry, sim.o_.config.page_namespace, sim.o_.config.tp_size, r));
    sim.workers[r] = require_value(Worker::create(sim.o_.config, r, *sim.stacks[r], *layout));
    sim.faulty[r] = std::make_unique<FaultyLayout>(*layout);
    sim.layouts[r] = std::move(layout);
  }
  sim.restart_scheduler();
}

// Stores a sidecar framed by `layout` for `id` from its state group 0 under `key`.
void plant_sidecar(TierStack& stack, const ObjectKey& key, const KvLayout& layout,
                   const SlotIdentity& id) {
  auto codec = require_value(layout.slot_codec(id));
  auto src = require_value(layout.slot_regions(0));
  SaveItem item{key, src};
  Status put;
  require_ok(stack.save(std::span(&item, 1), *codec, std::span(&put, 1)));
  require_ok(put);
}

// One request on one backend, outside the stack: Ok with the raw object image, or its status.
Result<std::vector<std::byte>> raw_get(Backend& be, const ObjectKey& key) {
  std::vector<std::byte> img(4 << 20);
  IoRequest get{Op::kGet, key, host_region(img), 1};
  REQUIRE(*be.submit(std::span(&get, 1)) == 1);
  Completion c;
  REQUIRE(*be.poll(std::span(&c, 1), 1, std::chrono::microseconds(1000000)) == 1);
  if (!c.status.is_ok()) return c.status;
  img.resize(c.bytes);
  return img;
}
void raw_put(Backend& be, const ObjectKey& key, std::vector<std::byte> img) {
  Completion c;
  IoRequest rm{Op::kRemove, key, {}, 2};
  REQUIRE(*be.submit(std::span(&rm, 1)) == 1);
  REQUIRE(*be.poll(std::span(&c, 1), 1, std::chrono::microseconds(1000000)) == 1);
  IoRequest put{Op::kPut, key, host_region(img), 3};
  REQUIRE(*be.submit(std::span(&put, 1)) == 1);
  REQUIRE(*be.poll(std::span(&c, 1), 1, std::chrono::microseconds(1000000)) == 1);
  require_ok(c.status);
}

}  // namespace

TEST_CASE(
    "a same-boundary sidecar of another fingerprint or TP size is neither loaded nor "
    "invalidated") {
  SimEngine sim(opts(2));
  use_real_layouts(sim);
  const EngineConfig& cfg = sim.o_.config;
  const auto a = tokens(81, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  REQUIRE(sim.sched->is_committed(b));
  auto& w0 = *sim.workers[0];
  auto& w1 = *sim.workers[1];

  // Another layout in the same page namespace and TP size: a wider sliding window, so another
  // slot layout and another fingerprint.
  dsv4::ModelConfig wider = small_geometry(cfg.block_tokens, 512, 4).config;
  wider.sliding_window = 16;
  const auto other_geo = require_value(dsv4::Geometry::compute(wider));
  auto other0 = require_value(dsv4::Dsv4Layout::create(other_geo, cfg.page_namespace, 2, 0));
  auto other1 = require_value(dsv4::Dsv4Layout::create(other_geo, cfg.page_namespace, 2, 1));
  auto o0 = require_value(Worker::create(cfg, 0, *sim.stacks[0], *other0));
  auto o1 = require_value(Worker::create(cfg, 1, *sim.stacks[1], *other1));
  // The same layout at another TP size (4; ranks 0 and 1 of it).
  EngineConfig cfg4 = cfg;
  cfg4.tp_size = 4;
  const auto geo = small_geometry(cfg.block_tokens, 512, 4);
  auto tp4_0 = require_value(dsv4::Dsv4Layout::create(geo, cfg.page_namespace, 4, 0));
  auto tp4_1 = require_value(dsv4::Dsv4Layout::create(geo, cfg.page_namespace, 4, 1));
  auto t0 = require_value(Worker::create(cfg4, 0, *sim.stacks[0], *tp4_0));
  auto t1 = require_value(Worker::create(cfg4, 1, *sim.stacks[1], *tp4_1));

  CHECK_FALSE(other1->slot_fingerprint(1) == sim.layouts[1]->slot_fingerprint(1));
  CHECK_FALSE(o1->slot_key(b) == w1.slot_key(b));
  CHECK_FALSE(t1->slot_key(b) == w1.slot_key(b));
  CHECK_FALSE(t1->slot_key(b) == o1->slot_key(b));
  CHECK_FALSE(o0->commit_key(b) == w0.commit_key(b));
  CHECK_FALSE(t0->commit_key(b) == w0.commit_key(b));
  // PAGE chunks are keyed by the page namespace alone (their layout is the namespace's job).
  CHECK(o1->page_key(b.key) == w1.page_key(b.key));

  // Rank 1 loses its own sidecar; the other layouts publish theirs at the same boundary, with
  // their commit records.
  REQUIRE(w1.with_stack([&](TierStack& s) { return s.remove(w1.slot_key(b)); }).is_ok());
  plant_sidecar(*sim.stacks[1], o1->slot_key(b), *other1, SlotIdentity{b.tokens, b.key.lo, 2, 1});
  plant_sidecar(*sim.stacks[1], t1->slot_key(b), *tp4_1, SlotIdentity{b.tokens, b.key.lo, 4, 1});
  require_ok(o0->put_commit(b));
  require_ok(t0->put_commit(b));

  auto [l, out] = sim.admit(2, a);
  REQUIRE(out.decision.action == LoadAction::kLoad);
  const auto before = require_value(digest_slot(*sim.layouts[1], l.group));
  auto ev = sim.step();
  REQUIRE(ev.load_failed.size() == 1);
  REQUIRE(terminal_of(ev, Channel::kLoad).has_value());
  // Not found, rather than found and rejected as corrupt: the others' sidecars were not read.
  CHECK(terminal_of(ev, Channel::kLoad)->outcome == WorkerOutcome::kSidecarUnavailable);
  CHECK(require_value(digest_slot(*sim.layouts[1], l.group)) == before);  // the group untouched
  CHECK(w1.counters().slot_invalidations.get() == 0);
  // Neither of the other sidecars nor their commit records was invalidated; ours is de-committed.
  CHECK(located(sim, 1, o1->slot_key(b)) == 0);
  CHECK(located(sim, 1, t1->slot_key(b)) == 0);
  CHECK(*o0->has_commit(b));
  CHECK(*t0->has_commit(b));
  CHECK_FALSE(*w0.has_commit(b));
  // The other layout's sidecar still decodes with its own codec.
  auto codec = require_value(other1->slot_codec(SlotIdentity{b.tokens, b.key.lo, 2, 1}));
  auto dst = require_value(other1->slot_regions(1));
  LoadItem item{o1->slot_key(b), dst};
  LoadResult res;
  require_ok(sim.stacks[1]->load(std::span(&item, 1), *codec, std::span(&res, 1)));
  CHECK_MESSAGE(res.status.is_ok(), res.status.to_string());
  CHECK(require_value(digest_slot(*other1, 1)) == require_value(digest_slot(*other1, 0)));
}

TEST_CASE("resizing the KV pools keeps every stored PAGE chunk and sidecar reachable") {
  SimEngine sim(opts(2));
  use_real_layouts(sim);
  const auto a = tokens(82, 16384 + 8);
  sim.run(1, a);
  // A restarted engine of the same model with larger pools: more blocks and more state groups.
  const auto fingerprint = sim.layouts[1]->slot_fingerprint(1);
  const Boundary b = boundary_of(sim, a, 16384);
  const ObjectKey sidecar = sim.workers[1]->slot_key(b);
  use_layouts(sim, small_geometry(sim.o_.config.block_tokens, 640, 6));
  CHECK(sim.layouts[1]->slot_fingerprint(1) == fingerprint);
  CHECK(sim.workers[1]->slot_key(b) == sidecar);
  auto [l, out] = sim.admit(2, concat(a, tokens(83, 100)));
  CHECK(out.match.tokens == 16384);
  REQUIRE(out.decision.action == LoadAction::kLoad);
  REQUIRE(sim.step().loaded.size() == 1);
  check_restored(sim, l.h, 16384);
}

TEST_CASE("the engine's block_tokens must match the geometry's block_size x dcp_size") {
  auto stack = require_value(
      TierStack::open(require_value(parse_profile(cpu_profile(), Registry::global(), "<t>"))));
  EngineConfig cfg = default_config(1);  // 128 tokens per block id
  const auto geo = small_geometry(256, 64, 2);
  auto layout = require_value(dsv4::Dsv4Layout::create(geo, cfg.page_namespace, 1, 0));
  CHECK(layout->block_tokens() == 256);
  auto w = Worker::create(cfg, 0, *stack, *layout);
  REQUIRE_FALSE(w.is_ok());
  CHECK(w.status().code() == Code::kInvalidArgument);
  CHECK(w.status().message() ==
        "engine block_tokens 128 does not match the KV layout's 256 tokens per block id "
        "(block_size x dcp_size)");
  cfg.block_tokens = 256;
  CHECK(Worker::create(cfg, 0, *stack, *layout).is_ok());
  // With decode context parallelism one block id covers block_size x dcp_size tokens.
  dsv4::ModelConfig dcp = small_geometry(128, 64, 2).config;
  dcp.dcp_size = 2;
  auto dcp_layout = require_value(
      dsv4::Dsv4Layout::create(require_value(dsv4::Geometry::compute(dcp)), cfg.page_namespace, 1, 0));
  CHECK(dcp_layout->block_tokens() == 256);
  CHECK(Worker::create(cfg, 0, *stack, *dcp_layout).is_ok());
  cfg.block_tokens = 128;
  CHECK(Worker::create(cfg, 0, *stack, *dcp_layout).status().code() == Code::kInvalidArgument);
}

// The reference's test_failed_invalidation_fences_put_until_corrupt_copy_is_removed, on the
// worker: while the corrupt copy cannot be removed, a republication retries the removal and
// makes no put; once the tier removes again, the next save lifts the fence and publishes.
TEST_CASE(
    "corruption fence on the worker: a key whose removal fails refuses puts until removal "
    "succeeds") {
  FaultReset faults;
  auto o = opts(2);
  o.profile = [](std::uint32_t r) { return r == 1 ? faulty_profile() : cpu_profile(); };
  SimEngine sim(o);
  use_real_layouts(sim);
  const auto a = tokens(84, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  const ObjectKey key = w1.slot_key(b);
  REQUIRE(sim.sched->is_committed(b));
  // The stored sidecar is replaced by a foreign frame (a valid AOS1 frame of another boundary).
  REQUIRE(w1.with_stack([&](TierStack& s) { return s.remove(key); }).is_ok());
  plant_sidecar(*sim.stacks[1], key, *sim.layouts[1], SlotIdentity{1024, 999, 2, 1});
  std::uint64_t puts = 0, removes = 0;
  fault_control().observe = [&](Op op, const ObjectKey& k) {
    if (!(k == key)) return;
    puts += op == Op::kPut;
    removes += op == Op::kRemove;
  };
  fault_control().fail_remove = true;

  auto [l, out] = sim.admit(2, a);
  auto ev = sim.step();
  REQUIRE(ev.load_failed.size() == 1);
  CHECK(terminal_of(ev, Channel::kLoad)->outcome == WorkerOutcome::kSidecarCorrupt);
  CHECK(w1.fenced(key));
  CHECK(located(sim, 1, key) == 0);  // the corrupt copy is still there
  CHECK(removes == 2);  // the stack drops the copy it read, then the worker invalidates
  CHECK(w1.counters().slot_invalidations.get() == 0);
  // The recompute republishes at the boundary: the removal is retried, no put is made, the SLOT
  // save fails as sidecar_invalidation and the boundary is not committed.
  sim.prefill(sim.live(l.h));
  sim.finish(l.h);
  CHECK(puts == 0);
  CHECK(removes == 3);
  CHECK(w1.counters().fenced_refusals.get() == 1);
  CHECK(w1.fenced(key));
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(sim.sched->counters().slot_save_failures.get() == 1);
  // The tier removes again: the next save lifts the fence and publishes, and the boundary resumes.
  fault_control().fail_remove = false;
  auto recompute = sim.run(3, a);
  CHECK(recompute.match.tokens == 0);
  CHECK_FALSE(w1.fenced(key));
  CHECK(removes == 4);
  CHECK(puts == 1);
  CHECK(w1.counters().slot_invalidations.get() == 1);
  CHECK(sim.sched->is_committed(b));
  auto resumed = sim.run(4, a);
  CHECK(resumed.loaded);
  CHECK(resumed.resumed_from == 8192);
}

// The reference's final test_invalidation_noop_unfences_key_when_concurrently_evicted: the corrupt
// copy disappears (evicted) while the key is fenced; the retried removal finds nothing, which
// lifts the fence.
TEST_CASE("a fenced key that no tier holds any more is unfenced by the next save") {
  FaultReset faults;
  auto o = opts(2);
  o.profile = [](std::uint32_t r) { return r == 1 ? faulty_profile() : cpu_profile(); };
  SimEngine sim(o);
  use_real_layouts(sim);
  const auto a = tokens(85, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  const ObjectKey key = w1.slot_key(b);
  REQUIRE(w1.with_stack([&](TierStack& s) { return s.remove(key); }).is_ok());
  plant_sidecar(*sim.stacks[1], key, *sim.layouts[1], SlotIdentity{1024, 998, 2, 1});
  fault_control().fail_remove = true;
  auto [l, out] = sim.admit(2, a);
  REQUIRE(sim.step().load_failed.size() == 1);
  REQUIRE(w1.fenced(key));
  // Evicted meanwhile (the tier drops it on its own).
  fault_control().fail_remove = false;
  REQUIRE(w1.with_stack([&](TierStack& s) { return s.remove(key); }).is_ok());
  REQUIRE(located(sim, 1, key) == -1);
  CHECK(w1.fenced(key));  // the worker does not know yet
  sim.prefill(sim.live(l.h));
  sim.finish(l.h);
  CHECK_FALSE(w1.fenced(key));
  CHECK(w1.counters().fenced_refusals.get() == 0);
  CHECK(sim.sched->is_committed(b));
  CHECK(sim.run(3, a).loaded);
}

// The reference's test_invalidate_removes_all_tier_copies_for_republication: a sidecar that fails
// its checks is removed from every tier, not only the one it was read from.
TEST_CASE("a corrupt sidecar held by two tiers is removed from both, and republished") {
  auto o = opts(2);
  o.profile = [](std::uint32_t) {
    return Json{
        {"tiers",
         Json::array(
             {Json{{"name", "fast"}, {"capacity", "64MiB"}, {"backend", Json{{"type", "cpu"}}}},
              Json{{"name", "slow"}, {"capacity", "64MiB"}, {"backend", Json{{"type", "cpu"}}}}})}};
  };
  SimEngine sim(o);
  use_real_layouts(sim);
  const auto a = tokens(86, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  const ObjectKey key = w1.slot_key(b);
  // Both tiers hold a foreign frame under the key.
  REQUIRE(w1.with_stack([&](TierStack& s) { return s.remove(key); }).is_ok());
  plant_sidecar(*sim.stacks[1], key, *sim.layouts[1], SlotIdentity{1024, 997, 2, 1});
  require_ok(sim.stacks[1]->flush(std::chrono::seconds(10)));
  auto img = raw_get(sim.stacks[1]->tier(0), key);
  REQUIRE(img.is_ok());
  raw_put(sim.stacks[1]->tier(1), key, *img);
  REQUIRE(raw_get(sim.stacks[1]->tier(1), key).is_ok());

  auto [l, out] = sim.admit(2, a);
  auto ev = sim.step();
  REQUIRE(ev.load_failed.size() == 1);
  CHECK(terminal_of(ev, Channel::kLoad)->outcome == WorkerOutcome::kSidecarCorrupt);
  CHECK(w1.counters().slot_invalidations.get() == 1);
  CHECK_FALSE(w1.fenced(key));
  CHECK(raw_get(sim.stacks[1]->tier(0), key).status().code() == Code::kNotFound);
  CHECK(raw_get(sim.stacks[1]->tier(1), key).status().code() == Code::kNotFound);
  // The recompute republishes (no copy blocks the put-if-absent tiers) and the boundary resumes.
  sim.prefill(sim.live(l.h));
  sim.finish(l.h);
  CHECK(sim.sched->is_committed(b));
  CHECK(sim.run(3, a).loaded);
}

// The reference's test_stateful_load_failure_evicts_committed_boundary_idempotently, the
// idempotence half: two loads of the same committed boundary fail in one step; the second
// eviction changes nothing (no error, nothing left revoked), and a recompute commits the
// boundary again.
TEST_CASE("a boundary evicted by two failed loads is evicted once, idempotently") {
  SimEngine sim(opts(2));
  const auto a = tokens(87, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  REQUIRE(w1.with_stack([&](TierStack& s) { return s.remove(w1.slot_key(b)); }).is_ok());
  auto [l2, o2] = sim.admit(2, a);
  auto [l3, o3] = sim.admit(3, a);
  REQUIRE(o2.decision.action == LoadAction::kLoad);
  REQUIRE(o3.decision.action == LoadAction::kLoad);
  auto ev = sim.step();
  CHECK(ev.load_failed.size() == 2);
  CHECK(sim.sched->counters().load_failures.get() == 2);
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK_FALSE(*sim.workers[0]->has_commit(b));
  CHECK(sim.sched->saved_watermark(l2.h) == 0);
  CHECK(sim.sched->saved_watermark(l3.h) == 0);
  // Evicting it once more (a late failure) is harmless.
  sim.prefill(sim.live(l2.h));
  sim.finish(l2.h);
  CHECK(sim.sched->is_committed(b));  // republished by the recompute
  sim.prefill(sim.live(l3.h));
  sim.finish(l3.h);
  CHECK(sim.sched->is_committed(b));
  auto resumed = sim.run(4, a);
  CHECK(resumed.loaded);
  // A restarted scheduler finds the republished record.
  sim.restart_scheduler();
  CHECK(sim.run(5, a).loaded);
}

// Ported from the former codec-level ResumeStore: a PAGE chunk that fails its checks (the
// store's own checksum, or another layout's payload) fails the load as page_unavailable before
// the sidecar is fetched, and the recompute stores a valid chunk in its place. The flipped byte
// sits in the object's first checksum chunk (variant 0) or in its last one (variant 2: object
// format version 2 verifies 64 KiB chunks on several threads, docs/object-format.md).
TEST_CASE("a corrupt PAGE chunk or one of another layout fails the load before the sidecar") {
  for (int variant = 0; variant < 3; ++variant) {
    CAPTURE(variant);
    FaultReset faults;
    auto o = opts(2);
    o.profile = [](std::uint32_t r) { return r == 1 ? faulty_profile() : cpu_profile(); };
    SimEngine sim(o);
    if (variant == 2) {  // heads wide enough for PAGE chunks of several checksum chunks
      dsv4::ModelConfig wide =
          small_geometry(o.config.block_tokens, o.num_blocks, o.num_slots).config;
      wide.kv_head_dim = 512;
      use_layouts(sim, require_value(dsv4::Geometry::compute(wide)));
    } else {
      use_real_layouts(sim);
    }
    const auto a = tokens(88 + static_cast<std::uint64_t>(variant), 8192 + 8);
    const auto keys = chunk_keys(sim.o_.config.page_namespace, a, sim.o_.config.chunk_tokens);
    auto& w1 = *sim.workers[1];
    const ObjectKey chunk = w1.page_key(keys[2]);
    const Boundary b = boundary_of(sim, a, 8192);
    sim.run(1, a);
    REQUIRE(sim.sched->is_committed(b));
    REQUIRE(w1.with_stack([&](TierStack& s) { return s.remove(chunk); }).is_ok());
    if (variant != 1) {
      // Stored again with one payload byte flipped: the object's checksum fails.
      fault_control().mutate_put = [&](const ObjectKey& k, std::vector<std::byte>& img) {
        if (k != chunk) return;
        if (variant == 0) {
          img[kObjectHeaderBytes + 11] ^= std::byte{0x40};
        } else {
          CHECK(checksum_chunk_count(img.size() - kObjectHeaderBytes) > 1);
          img.back() ^= std::byte{0x40};
        }
      };
      auto regions = require_value(
          sim.layouts[1]->page_regions(std::vector<std::uint32_t>({0, 1, 2, 3, 4, 5, 6, 7})));
      SaveItem item{chunk, regions};
      Status put;
      require_ok(sim.stacks[1]->save(std::span(&item, 1), sim.layouts[1]->page_codec(),
                                     std::span(&put, 1)));
      require_ok(put);
      fault_control().mutate_put = nullptr;
    } else {
      // Junk stored by another codec (another layout id) under the chunk's key.
      auto identity = require_value(Registry::global().create_codec("identity", Json::object()));
      std::vector<std::byte> junk(1000, std::byte{1});
      Region jr = host_region(junk);
      SaveItem item{chunk, RegionList(&jr, 1)};
      Status put;
      require_ok(sim.stacks[1]->save(std::span(&item, 1), *identity, std::span(&put, 1)));
      require_ok(put);
    }
    std::uint64_t sidecar_gets = 0;
    fault_control().observe = [&](Op op, const ObjectKey& k) {
      sidecar_gets += op == Op::kGet && k == w1.slot_key(b);
    };
    auto [l, out] = sim.admit(2, a);
    const auto before = require_value(digest_slot(*sim.layouts[1], l.group));
    auto ev = sim.step();
    REQUIRE(ev.load_failed.size() == 1);
    CHECK(terminal_of(ev, Channel::kLoad)->outcome == WorkerOutcome::kPageUnavailable);
    CHECK(sidecar_gets == 0);
    CHECK(w1.counters().page_invalidations.get() == 1);
    CHECK_FALSE(w1.fenced(chunk));
    CHECK(require_value(digest_slot(*sim.layouts[1], l.group)) == before);
    fault_control().observe = nullptr;
    sim.prefill(sim.live(l.h));
    sim.finish(l.h);
    CHECK(sim.run(3, a).loaded);
  }
}

// Ported from the former ResumeStore: a load that names blocks the pool does not have, the same
// block twice or an unaligned floor is refused before any tier is asked.
TEST_CASE("malformed load operations are refused before any tier is asked") {
  FaultReset faults;
  auto o = opts(1);
  o.profile = [](std::uint32_t) { return faulty_profile(); };
  SimEngine sim(o);
  use_real_layouts(sim);
  const auto a = tokens(90, 2048);
  const auto keys = chunk_keys(sim.o_.config.page_namespace, a, sim.o_.config.chunk_tokens);
  auto op = [&](std::uint64_t generation) {
    LoadOp l;
    l.id = OperationId{generation, generation};
    l.page_start = 0;
    l.page_end = 2048;
    l.chunk_keys = keys;
    for (std::uint32_t i = 0; i < 16; ++i) l.block_ids.push_back(i);
    return l;
  };
  StepPlan plan;
  plan.loads.push_back(op(1));
  plan.loads.back().block_ids[9] = 3;  // block 3 in both chunks
  plan.loads.push_back(op(2));
  plan.loads.back().block_ids[15] = 100000;  // out of the pool
  plan.loads.push_back(op(3));
  plan.loads.back().page_start = 100;  // not chunk aligned
  plan.loads.push_back(op(4));
  plan.loads.back().block_ids.pop_back();  // fewer blocks than the chunks need
  auto& w = *sim.workers[0];
  w.submit(plan);
  w.progress();
  auto reports = w.take_reports();
  REQUIRE(reports.size() == 4);
  for (const OpReport& r : reports) {
    CHECK_FALSE(r.ok());
    CHECK(r.outcome == WorkerOutcome::kPageUnavailable);
  }
  std::uint64_t total = 0;
  for (const auto& n : fault_control().ops) total += n.load();
  CHECK(total == 0);
}

// Ported from the former ResumeStore: a corrupt copy in a fast tier is dropped by the stack and
// the valid copy below serves the load; the sidecar is not invalidated.
TEST_CASE("a corrupt sidecar copy in a fast tier falls back to the valid copy below") {
  FaultReset faults;
  auto o = opts(2);
  o.profile = [](std::uint32_t) {
    Json fast = {{"name", "fast"}, {"capacity", "64MiB"}, {"backend", {{"type", "faulty"}}}};
    Json slow = {{"name", "slow"}, {"capacity", "64MiB"}, {"backend", {{"type", "cpu"}}}};
    tier::test::register_faulty_backend();
    return Json{{"tiers", Json::array({fast, slow})}};
  };
  SimEngine sim(o);
  use_real_layouts(sim);
  const auto a = tokens(91, 8192 + 8);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  const ObjectKey key = w1.slot_key(b);
  // The fast tier stores the sidecar with one payload byte flipped and its object header
  // resealed, so only the AOS1 CRC can notice.
  fault_control().mutate_put = [&](const ObjectKey& k, std::vector<std::byte>& img) {
    if (!(k == key)) return;
    img[img.size() - 9] ^= std::byte{0x40};
    auto h = parse_object_header(img);
    REQUIRE(h.is_ok());
    seal_object(img, h->format_id, h->stage_id, key);
  };
  sim.run(1, a);
  for (auto& s : sim.stacks) require_ok(s->flush(std::chrono::seconds(10)));
  fault_control().mutate_put = nullptr;
  REQUIRE(sim.sched->is_committed(b));
  auto [l, out] = sim.admit(2, a);
  REQUIRE(sim.step().loaded.size() == 1);
  check_restored(sim, l.h, 8192);
  CHECK(w1.counters().slot_invalidations.get() == 0);
  // Refused by the stack's decode, or by the tier that checks the frame before it scatters
  // (Codec::direct: a failed get of the fast tier).
  CHECK(sim.stacks[1]->counters().decode_failures.get() +
            sim.stacks[1]->tier(0).metrics().of(Op::kGet).errors.get() >=
        1);
}

// The reference's ABSENT_RATIO (-1) layers keep their window in a state field of the slot
// (section 2.1); libtier's layout of that field is in docs/codecs.md.
TEST_CASE("field-window layers (ratio -1) travel in the SLOT arena and resume bit exact") {
  dsv4::ModelConfig m = small_geometry(128, 512, 4).config;  // ratios {4, 128, 0}
  const auto base = require_value(dsv4::Geometry::compute(m));
  m.compress_ratios = {4, 128, -1, 0};
  const auto g = require_value(dsv4::Geometry::compute(m));
  CHECK(g.n_field == 1);
  CHECK(g.page_bytes_per_block == base.page_bytes_per_block);  // no PAGE rows, no indexer
  CHECK(g.page_regions.size() == base.page_regions.size());
  CHECK(g.envelope_rows == base.envelope_rows);
  CHECK(g.entry_rows == base.entry_rows);  // no ring
  const dsv4::FieldPlacement* field = nullptr;
  for (const auto& f : g.fields)
    if (f.name == "field_window") field = &f;
  REQUIRE(field != nullptr);
  CHECK(field->bytes == std::uint64_t{g.ring_slots} * m.kv_head_dim * 2);  // bf16
  CHECK(field->offset % 256 == 0);
  // The field lies inside the arena of its plane (it may fit in the other fields' slack).
  CHECK(g.arena_rows >= base.arena_rows);
  CHECK(field->offset + field->bytes <= g.arena_rows * g.planes[field->plane].row_bytes);
  CHECK(g.slot_rows % 2 == 0);
  const Key128 ns = default_config().page_namespace;
  CHECK_FALSE(dsv4::slot_fingerprint(g, ns, 2, 0) == dsv4::slot_fingerprint(base, ns, 2, 0));
  // A layout with two field-window layers holds both rings in one field.
  m.compress_ratios = {4, -1, 128, -1, 0};
  const auto two = require_value(dsv4::Geometry::compute(m));
  CHECK(two.n_field == 2);
  for (const auto& f : two.fields)
    if (f.name == "field_window") CHECK(f.bytes == 2 * field->bytes);

  // Through the engine: saved at 8192 and resumed bit exact, field window included.
  SimEngine sim(opts(2));
  use_layouts(sim, g);
  const auto a = tokens(92, 8192 + 8);
  sim.run(1, a);
  auto [l, out] = sim.admit(2, concat(a, tokens(93, 50)));
  REQUIRE(out.decision.action == LoadAction::kLoad);
  REQUIRE(sim.step().loaded.size() == 1);
  check_restored(sim, l.h, 8192);
}
