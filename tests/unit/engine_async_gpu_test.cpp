// The offload engine's device transfers ordered after the caller's compute stream (issue 13,
// item 2): the caller writes KV on its own stream behind a long kernel, hands its stream (or an
// event recorded on it) with the plan, and never synchronizes; the save still captures exactly
// the bytes the caller's stream wrote, and a load restores them. Without the order the save
// would read the memory while the caller's kernel still runs (it would capture the old bytes).
// submit() returns while the caller's kernel runs, and the SLOT snapshot it enqueued on the
// caller's stream keeps the bytes of that step even when the caller's next step rewrites the
// state group before progress() runs (issue 24). Exits 77 (Meson: SKIP) without a GPU.
#include <doctest/doctest.h>

#include <vector>

#include "gpu.hpp"
#include "support/engine_scenarios.hpp"
#include "support/test_util.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

namespace {

constexpr std::uint64_t kSpinNs = 200'000'000;  // the caller's "forward" before it writes the KV

struct DeviceRank {
  EngineConfig config = default_config(1);
  std::unique_ptr<TierStack> stack;
  std::unique_ptr<dsv4::Dsv4Layout> layout;
  std::unique_ptr<Worker> worker;
  gpu::Stream caller = require_value(gpu::Stream::create(0));

  explicit DeviceRank(Json tiers = cpu_profile()) {
    auto profile = parse_profile(tiers, Registry::global(), "<async>");
    REQUIRE_MESSAGE(profile.is_ok(), profile.status().to_string());
    stack = require_value(TierStack::open(*profile));
    dsv4::Dsv4LayoutOptions o;
    o.memory = dsv4::KvMemoryKind::kDevice;
    layout = require_value(dsv4::Dsv4Layout::create(small_geometry(config.block_tokens, 64, 4),
                                              config.page_namespace, 1, 0, o));
    worker = require_value(Worker::create(config, 0, *stack, *layout));
  }

  // The caller's step: a long kernel, then every byte of blocks [first, first + 8) and of state
  // group `group` written, all on the caller's stream. Returns at once.
  void forward(std::uint32_t first, std::int32_t group, std::uint8_t value) {
    require_ok(gpu::spin_async(caller.handle(), 0, kSpinNs));
    std::vector<std::uint32_t> ids;
    for (std::uint32_t b = first; b < first + 8; ++b) ids.push_back(b);
    for (const Region& r : require_value(layout->page_regions(ids)))
      require_ok(gpu::fill_async(r, value, caller.handle()));
    for (const Region& r : require_value(layout->slot_regions(group)))
      require_ok(gpu::fill_async(r, static_cast<std::uint8_t>(value ^ 0xff), caller.handle()));
  }

  // The caller's next step writing only state group `group`, behind a long kernel.
  void write_group(std::int32_t group, std::uint8_t value) {
    require_ok(gpu::spin_async(caller.handle(), 0, kSpinNs));
    for (const Region& r : require_value(layout->slot_regions(group)))
      require_ok(gpu::fill_async(r, value, caller.handle()));
  }

  std::vector<OpReport> run(const StepPlan& plan, const DeviceOrder& order) {
    worker->submit(plan, order);
    worker->progress();
    return worker->take_reports();
  }

  // Every byte of the regions equals `value` (read through the synchronous host view).
  bool holds(const std::vector<Region>& regions, std::uint8_t value) {
    bool all = true;
    require_ok(layout->visit_host(regions, dsv4::Dsv4Layout::HostAccess::kRead, [&](RegionList views) {
      for (const Region& v : views)
        for (std::size_t i = 0; i < v.size; ++i)
          all = all && v.data[i] == static_cast<std::byte>(value);
    }));
    return all;
  }
};

Key128 chunk_key(std::uint64_t i) { return Key128{0xa5a5000000000000ULL + i, i}; }

StepPlan save_plan(std::uint64_t gen, std::uint32_t first, std::int32_t group) {
  SaveOp op;
  op.id = OperationId{gen, gen};
  op.page_end = 1024;
  op.chunk_keys = {chunk_key(gen)};
  for (std::uint32_t b = first; b < first + 8; ++b) op.block_ids.push_back(b);
  op.slot = Boundary{1024, chunk_key(gen)};
  op.prefix_keys = {chunk_key(gen)};
  op.slot_group = group;
  StepPlan p;
  p.saves.push_back(op);
  return p;
}

StepPlan load_plan(std::uint64_t save_gen, std::uint64_t gen, std::uint32_t first,
                   std::int32_t group) {
  LoadOp op;
  op.id = OperationId{gen, gen};
  op.page_start = 0;
  op.page_end = 1024;
  op.chunk_keys = {chunk_key(save_gen)};
  for (std::uint32_t b = first; b < first + 8; ++b) op.block_ids.push_back(b);
  op.slot = Boundary{1024, chunk_key(save_gen)};
  op.slot_group = group;
  StepPlan p;
  p.loads.push_back(op);
  return p;
}

std::vector<std::uint32_t> ids_from(std::uint32_t first) {
  std::vector<std::uint32_t> ids;
  for (std::uint32_t b = first; b < first + 8; ++b) ids.push_back(b);
  return ids;
}

void check_all_ok(const std::vector<OpReport>& rs, std::size_t n) {
  CHECK(rs.size() == n);
  for (const OpReport& r : rs) CHECK_MESSAGE(r.ok(), outcome_name(r.outcome));
}

void save_then_restore(DeviceRank& d, bool with_event) {
  gpu::Event ev = require_value(gpu::Event::create(0));
  d.forward(0, 0, 0x5a);
  DeviceOrder order{d.caller.handle(), nullptr};
  if (with_event) {
    require_ok(ev.record(d.caller));
    order.event = ev.handle();
  }
  check_all_ok(d.run(save_plan(1, 0, 0), order), 2);  // the caller never synchronized
  // The caller's next step overwrites blocks 0..7 and group 0 again; the stored copy keeps 0x5a.
  d.forward(0, 0, 0x11);
  check_all_ok(d.run(load_plan(1, 2, 16, 1), DeviceOrder{d.caller.handle(), nullptr}), 1);
  require_ok(d.caller.synchronize());
  CHECK(d.holds(require_value(d.layout->page_regions(ids_from(16))), 0x5a));
  CHECK(d.holds(require_value(d.layout->slot_regions(1)), 0x5a ^ 0xff));
  CHECK(d.holds(require_value(d.layout->page_regions(ids_from(0))), 0x11));
}

}  // namespace

TEST_CASE("async device: a save ordered by the caller's event captures what its stream wrote") {
  DeviceRank d;
  save_then_restore(d, true);
}

TEST_CASE("async device: a save ordered by the caller's stream alone does the same") {
  DeviceRank d;
  save_then_restore(d, false);
}

TEST_CASE("async device: a load ordered after the caller's stream restores the saved bytes") {
  // The caller hands its stream with the load's plan and enqueues its next kernel (a fill of
  // other blocks and another group) at once; both land, neither overwrites the other.
  DeviceRank d;
  d.forward(0, 0, 0x3c);
  require_ok(d.caller.synchronize());
  check_all_ok(d.run(save_plan(1, 0, 0), {}), 2);
  check_all_ok(d.run(load_plan(1, 2, 24, 2), DeviceOrder{d.caller.handle(), nullptr}), 1);
  d.forward(8, 3, 0x77);
  require_ok(d.caller.synchronize());
  CHECK(d.holds(require_value(d.layout->page_regions(ids_from(24))), 0x3c));
  CHECK(d.holds(require_value(d.layout->slot_regions(2)), 0x3c ^ 0xff));
  CHECK(d.holds(require_value(d.layout->page_regions(ids_from(8))), 0x77));
}

TEST_CASE(
    "async device: submit() waits for nothing on the device; the SLOT snapshot goes ahead "
    "of the caller's next kernels") {
  // The caller's forward (a 200 ms kernel, then the writes) is still running when submit()
  // returns: the snapshot is a kernel on the caller's stream, not a host wait. The caller then
  // enqueues its next step, which rewrites the state group, before progress() runs: the stored
  // sidecar still holds the first step's bytes, because the snapshot is ahead of it on the stream.
  for (bool pinned : {false, true}) {
    CAPTURE(pinned);
    DeviceRank d(cpu_profile("64MiB", pinned));
    gpu::Event ev = require_value(gpu::Event::create(0));
    d.forward(0, 0, 0x5a);
    require_ok(ev.record(d.caller));
    d.worker->submit(save_plan(1, 0, 0), DeviceOrder{d.caller.handle(), ev.handle()});
    CHECK_FALSE(require_value(ev.done()));  // submit() returned during the caller's forward
    d.write_group(0, 0x33);
    d.worker->progress();
    check_all_ok(d.worker->take_reports(), 2);
    check_all_ok(d.run(load_plan(1, 2, 16, 1), DeviceOrder{d.caller.handle(), nullptr}), 1);
    require_ok(d.caller.synchronize());
    CHECK(d.holds(require_value(d.layout->slot_regions(1)), 0x5a ^ 0xff));
    CHECK(d.holds(require_value(d.layout->page_regions(ids_from(16))), 0x5a));
    CHECK(d.holds(require_value(d.layout->slot_regions(0)), 0x33));
  }
}

TEST_CASE("async device: a direct load from a pinned tier waits for the caller's stream") {
  // The pinned tier's copy kernel writes the device KV on the tier's own stream, not the
  // layout's: the load still follows the caller's order. The caller's late writes to blocks
  // 16..23 (behind a 200 ms kernel) come before the load, which must win.
  DeviceRank d(cpu_profile("64MiB", true));
  d.forward(0, 0, 0x5a);
  require_ok(d.caller.synchronize());
  check_all_ok(d.run(save_plan(1, 0, 0), {}), 2);
  d.forward(16, 1, 0x99);  // the blocks' previous user, still running
  check_all_ok(d.run(load_plan(1, 2, 16, 1), DeviceOrder{d.caller.handle(), nullptr}), 1);
  require_ok(d.caller.synchronize());
  CHECK(d.holds(require_value(d.layout->page_regions(ids_from(16))), 0x5a));
  CHECK(d.holds(require_value(d.layout->slot_regions(1)), 0x5a ^ 0xff));
}
