// The offload engine's device path against reference scenarios that need KV in GPU memory:
// buffers of the wrong device or memory kind are refused before a byte moves, a load moves its
// PAGE chunks and then its SLOT in that order on the layout's stream and has finished both when
// progress() returns, and a failed device transfer (a stream sync that fails) fails its operation
// without taking a valid sidecar for a corrupt one. Exits 77 (Meson: SKIP) without a GPU.
#include <doctest/doctest.h>

#include <array>
#include <mutex>
#include <string>
#include <vector>

#include "support/engine_scenarios.hpp"
#include "gpu.hpp"
#include "support/fault_backend.hpp"
#include "support/test_util.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;
using tier::test::fault_control;

namespace {

SimOptions device_opts(std::uint32_t tp = 2) {
  SimOptions o;
  o.config = default_config(tp);
  o.layout.memory = dsv4::KvMemoryKind::kDevice;
  o.layout.device = 0;
  return o;
}

// A device layout whose SLOT transfers can fail as a failed stream sync does (DeviceError after
// the copy was enqueued); everything else, fingerprint and block size included, is the inner's.
class SyncFaultLayout final : public KvLayout {
 public:
  explicit SyncFaultLayout(KvLayout& inner) : inner_(inner) {}
  bool fail_snapshot = false, fail_restore = false;

  const Codec& page_codec() const noexcept override { return inner_.page_codec(); }
  Result<std::vector<Region>> page_regions(std::span<const std::uint32_t> ids) const override {
    return inner_.page_regions(ids);
  }
  Result<std::vector<Region>> slot_regions(std::int32_t group) const override {
    return inner_.slot_regions(group);
  }
  Result<std::unique_ptr<Codec>> slot_codec(const SlotIdentity& id) const override {
    TIER_ASSIGN_OR_RETURN(auto codec, inner_.slot_codec(id));
    return std::unique_ptr<Codec>(new Failing(std::move(codec), *this));
  }
  std::uint32_t block_tokens() const noexcept override { return inner_.block_tokens(); }
  std::array<std::byte, 16> slot_fingerprint(std::uint32_t rank) const override {
    return inner_.slot_fingerprint(rank);
  }

 private:
  class Failing final : public Codec {
   public:
    Failing(std::unique_ptr<Codec> inner, const SyncFaultLayout& owner)
        : inner_(std::move(inner)), owner_(owner) {}
    std::string_view name() const noexcept override { return inner_->name(); }
    std::uint32_t format_id() const noexcept override { return inner_->format_id(); }
    Result<std::size_t> encoded_size(RegionList src) const noexcept override {
      return inner_->encoded_size(src);
    }
    Result<std::size_t> encode(RegionList src, std::span<std::byte> dst) const noexcept override {
      auto n = inner_->encode(src, dst);
      if (owner_.fail_snapshot) return Status(Code::kDeviceError, "injected stream sync failure");
      return n;
    }
    Status decode(std::span<const std::byte> payload, RegionList dst) const noexcept override {
      Status st = inner_->decode(payload, dst);
      if (owner_.fail_restore) return Status(Code::kDeviceError, "injected stream sync failure");
      return st;
    }

   private:
    std::unique_ptr<Codec> inner_;
    const SyncFaultLayout& owner_;
  };
  KvLayout& inner_;
};

// Every rank's worker over a SyncFaultLayout around its device layout.
// The wrappers must outlive the workers that now see them.
[[nodiscard]] std::vector<std::unique_ptr<SyncFaultLayout>> wrap_layouts(SimEngine& sim) {
  std::vector<std::unique_ptr<SyncFaultLayout>> out;
  for (std::uint32_t r = 0; r < sim.workers.size(); ++r) {
    out.push_back(std::make_unique<SyncFaultLayout>(*sim.layouts[r]));
    sim.workers[r] = require_value(Worker::create(sim.o_.config, r, *sim.stacks[r], *out.back()));
  }
  sim.restart_scheduler();
  return out;
}

}  // namespace

// The reference rejects non-uint8, non-contiguous and wrong-device buffers. Here a RegionList
// names engine memory by pointer, memory kind and device: one that claims another device or
// another kind, or points at another layout's memory, is refused before any byte moves.
TEST_CASE("device KV: wrong-device and wrong-kind buffers are refused before a byte moves") {
  const auto geo = small_geometry(128, 64, 4);
  const Key128 ns = default_config().page_namespace;
  dsv4::Dsv4LayoutOptions dev_opts;
  dev_opts.memory = dsv4::KvMemoryKind::kDevice;
  auto dev = require_value(dsv4::Dsv4Layout::create(geo, ns, 1, 0, dev_opts));
  auto other = require_value(dsv4::Dsv4Layout::create(geo, ns, 1, 0, dev_opts));
  const std::vector<std::uint32_t> blocks = {1, 2};
  for (std::uint32_t b : blocks) require_ok(fill_block(*dev, b, 40 + b));
  require_ok(fill_slot(*dev, 1, 7));
  const auto good = require_value(dev->page_regions(blocks));
  std::vector<std::byte> image(*dev->page_codec().encoded_size(good));
  REQUIRE(dev->page_codec().encode(good, image).is_ok());
  const std::vector<std::uint32_t> targets = {5, 6};
  const std::uint64_t zero = require_value(digest_block(*dev, 5));

  auto refused = [&](std::vector<Region> regions, const char* what) {
    CAPTURE(what);
    std::vector<std::byte> out(image.size());
    CHECK(dev->page_codec().encode(regions, out).status().code() == Code::kInvalidArgument);
    CHECK(dev->page_codec().decode(image, regions).code() == Code::kInvalidArgument);
    CHECK(require_value(digest_block(*dev, 5)) == zero);
    CHECK(require_value(digest_block(*dev, 6)) == zero);
  };
  auto wrong_device = require_value(dev->page_regions(targets));
  wrong_device[1].device = 1;
  refused(wrong_device, "another device");
  auto wrong_kind = require_value(dev->page_regions(targets));
  for (Region& r : wrong_kind) r.kind = MemoryKind::kHost;
  refused(wrong_kind, "host kind on device memory");
  refused(require_value(other->page_regions(targets)), "another layout's device memory");

  // SLOT: the same for a state group.
  const SlotIdentity id{1024, 0x77, 1, 0};
  auto slot = require_value(dev->slot_codec(id));
  auto src = require_value(dev->slot_regions(1));
  std::vector<std::byte> frame(*slot->encoded_size(src));
  REQUIRE(slot->encode(src, frame).is_ok());
  const std::uint64_t group0 = require_value(digest_slot(*dev, 0));
  auto slot_wrong = require_value(dev->slot_regions(0));
  slot_wrong[0].device = 1;
  CHECK(slot->decode(frame, slot_wrong).code() == Code::kInvalidArgument);
  CHECK(slot->decode(frame, require_value(other->slot_regions(0))).code() ==
        Code::kInvalidArgument);
  CHECK(require_value(digest_slot(*dev, 0)) == group0);
  // The right buffers still work.
  require_ok(slot->decode(frame, require_value(dev->slot_regions(0))));
  CHECK(require_value(digest_slot(*dev, 0)) == require_value(digest_slot(*dev, 1)));
}

// The reference launches the PAGE plan and then the SLOT plan on the caller's stream. Here a
// rank's layout moves every transfer on its executor's one stream, synchronously: a load through
// a layout that stages no SLOT rows (the wrapper here forwards none) fetches and scatters every
// PAGE chunk before it fetches the sidecar, and both have landed in GPU memory when progress()
// returns. The device layout's own staging row is the next case.
TEST_CASE("device KV: a load moves PAGE then SLOT, in order, and both have landed on return") {
  tier::test::register_faulty_backend();
  fault_control().reset();
  auto o = device_opts(2);
  o.profile = [](std::uint32_t) { return faulty_profile(); };
  SimEngine sim(o);
  auto wrapped = wrap_layouts(sim);  // kept alive: the workers see them
  const auto a = tokens(95, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  const ObjectKey sidecar = sim.workers[1]->slot_key(b);
  std::vector<bool> gets;  // true: the sidecar of rank 1, in submission order
  std::mutex mu;
  fault_control().observe = [&](Op op, const ObjectKey& k) {
    if (op != Op::kGet || k.rank != 1) return;
    std::lock_guard<std::mutex> lock(mu);
    gets.push_back(k == sidecar);
  };
  auto l = sim.admit(2, a).live;
  REQUIRE(sim.step().loaded.size() == 1);
  fault_control().observe = nullptr;
  REQUIRE(gets.size() == 9);  // 8 PAGE chunks, then the sidecar
  for (std::size_t i = 0; i + 1 < gets.size(); ++i) CHECK_FALSE(gets[i]);
  CHECK(gets.back());
  check_restored(sim, l.h, 8192);  // no stream wait beyond progress()
  fault_control().reset();
}

// The device layout stages the sidecar in a row of GPU memory (Dsv4Layout::stage_slot): the
// worker fetches it first, in the same call as the PAGE chunks, and the row reaches the state
// group only when every chunk loaded. While the row is held elsewhere the load takes the
// sequential path (sidecar last) and still restores.
TEST_CASE("device KV: a staged sidecar travels with the chunks and lands only on a whole load") {
  tier::test::register_faulty_backend();
  fault_control().reset();
  auto o = device_opts(2);
  o.profile = [](std::uint32_t r) { return r == 1 ? faulty_profile() : cpu_profile(); };
  SimEngine sim(o);
  const auto a = tokens(98, 8192 + 8);
  sim.run(1, a);
  const Boundary b = boundary_of(sim, a, 8192);
  auto& w1 = *sim.workers[1];
  const ObjectKey sidecar = w1.slot_key(b);
  const auto keys = chunk_keys(sim.o_.config.page_namespace, a, 1024);
  std::vector<ObjectKey> gets;
  std::mutex mu;
  fault_control().observe = [&](Op op, const ObjectKey& k) {
    if (op != Op::kGet || k.rank != 1) return;
    std::lock_guard<std::mutex> lock(mu);
    gets.push_back(k);
  };
  auto load = [&](RequestId id, bool whole) {
    gets.clear();
    auto l = sim.admit(id, a).live;
    // A state the sidecar does not hold, so that a group that took the row's shows.
    if (!whole) require_ok(fill_slot(*sim.layouts[1], l.group, 0xbad));
    const auto before = require_value(digest_slot(*sim.layouts[1], l.group));
    auto ev = sim.step();
    const auto t = terminal_of(ev, Channel::kLoad);
    REQUIRE(t);
    CHECK(t->ok() == whole);
    if (whole) check_restored(sim, l.h, 8192);
    else CHECK(require_value(digest_slot(*sim.layouts[1], l.group)) == before);
    sim.finish(l.h);
  };
  load(2, true);
  REQUIRE(gets.size() == 9);
  CHECK(gets.front() == sidecar);  // staged: first
  // Another holder of the row: the sequential path, the sidecar after the chunks.
  {
    const SlotIdentity id{b.tokens, b.key.lo, 2, 1};
    auto held = require_value(sim.layouts[1]->stage_slot(id, 0));
    CHECK(sim.layouts[1]->stage_slot(id, 1).status().code() == Code::kRejected);
    load(3, true);
    REQUIRE(gets.size() == 9);
    CHECK(gets.back() == sidecar);
  }
  // A chunk goes missing: the sidecar is fetched into the row and never reaches the group.
  REQUIRE(w1.with_stack([&](TierStack& s) { return s.remove(w1.page_key(keys[4])); }).is_ok());
  load(4, false);
  CHECK(gets.size() == 9);
  CHECK(w1.counters().slot_restores.get() == 2);
  CHECK(w1.counters().slot_invalidations.get() == 0);
  fault_control().reset();
}

// The reference quarantines a staging row whose D2H or restore sync failed. The engine's device
// path has no staging row: a SLOT save's frame and a load's image are host buffers of that one
// operation, and the executor reuses its device staging only after an event proves completion.
// A failed sync therefore fails the operation only: the save as `snapshot` (its PAGE part still
// stored), the load without invalidating the valid sidecar, which the next load restores.
TEST_CASE("device KV: a failed snapshot or restore sync fails only its operation") {
  SimEngine sim(device_opts(2));
  auto wrapped = wrap_layouts(sim);
  const auto a = tokens(96, 8192 + 8);
  const Boundary b = boundary_of(sim, a, 8192);
  wrapped[1]->fail_snapshot = true;
  sim.run(1, a);
  wrapped[1]->fail_snapshot = false;
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(sim.sched->counters().slot_save_failures.get() == 1);
  CHECK(sim.workers[1]->counters().page_chunks_saved.get() == 8);
  sim.run(2, a);  // recomputed: now saved and committed
  REQUIRE(sim.sched->is_committed(b));
  wrapped[1]->fail_restore = true;
  sim.admit(3, a);
  auto ev = sim.step();
  wrapped[1]->fail_restore = false;
  REQUIRE(ev.load_failed.size() == 1);
  CHECK(ev.terminals[0].outcome == WorkerOutcome::kSidecarUnavailable);
  CHECK(sim.workers[1]->counters().slot_invalidations.get() == 0);
  const ObjectKey key = sim.workers[1]->slot_key(b);
  CHECK(*sim.workers[1]->with_stack([&](TierStack& s) { return s.locate(key); }) == 0);
  CHECK_FALSE(sim.workers[1]->fenced(key));
  CHECK(sim.run(4, a).match.tokens == 0);  // de-committed by the failure, republished here
  auto resumed = sim.run(5, a);
  CHECK(resumed.loaded);
}

// Rows "sidecar d2h sync failure" and "restore sync failure" of docs/engine.md, with a real
// failed event sync: libtier_gpu's own Event::synchronize() reports a DeviceError on rank 1's
// thread (gpu::testing::fail_event_syncs_on_this_thread), no wrapper codec. Rank 1's save fails:
// its PAGE store, whose device-to-host copy ends on an event sync too, as `page_store`, or its
// snapshot as `snapshot`; the recompute stores rank 1's missing chunks again and commits; later
// the restore fails on rank 1 without invalidating the valid sidecar; the other rank and the next
// operations are untouched.
TEST_CASE("device KV: a real failed event sync in the copy executor fails only its operation") {
  SimEngine sim(device_opts(2));
  const auto a = tokens(97, 8192 + 8);
  const Boundary b = boundary_of(sim, a, 8192);
  auto step_failing_rank1 = [&]() {
    sim.last_plan = sim.sched->build_step();
    sim.on_ranks([&](std::uint32_t r) {
      gpu::testing::fail_event_syncs_on_this_thread(r == 1);
      sim.workers[r]->submit(sim.last_plan);
      sim.workers[r]->progress();
      gpu::testing::fail_event_syncs_on_this_thread(false);
    });
    return sim.collect();
  };
  auto [l, out] = sim.admit(1, a);
  sim.forward(l, 0, 8192);
  sim.sched->on_computed(l.h, 8192);
  auto ev = step_failing_rank1();
  auto slot = terminal_of(ev, Channel::kSlotSave);
  REQUIRE(slot);
  CHECK((slot->outcome == WorkerOutcome::kSnapshot || slot->outcome == WorkerOutcome::kPageStore));
  CHECK_FALSE(sim.sched->is_committed(b));
  CHECK(sim.workers[0]->counters().slot_publishes.get() == 1);  // rank 0's own save went on
  sim.prefill(sim.live(l.h));
  sim.finish(l.h);
  sim.run(2, a);  // recomputed: saved and committed
  REQUIRE(sim.sched->is_committed(b));
  auto l3 = sim.admit(3, a).live;
  ev = step_failing_rank1();  // the load: rank 1's transfers fail their event sync
  REQUIRE(ev.load_failed.size() == 1);
  CHECK_FALSE(terminal_of(ev, Channel::kLoad)->ok());
  CHECK(sim.workers[1]->counters().slot_invalidations.get() == 0);
  CHECK(sim.workers[1]->counters().page_invalidations.get() == 0);
  const ObjectKey key = sim.workers[1]->slot_key(b);
  CHECK(*sim.workers[1]->with_stack([&](TierStack& s) { return s.locate(key); }) == 0);
  CHECK_FALSE(sim.workers[1]->fenced(key));
  sim.prefill(sim.live(l3.h));
  sim.finish(l3.h);
  auto resumed = sim.run(4, a);  // republished after the failure: resumes, bit exact
  CHECK(resumed.loaded);
}
