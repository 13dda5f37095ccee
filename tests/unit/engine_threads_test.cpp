// A worker driven from two threads (issue 13, item 4): submit() and the TierView lookups never
// wait for a running save. A runner thread submits its own saves and runs progress() in a loop;
// the test thread submits and looks up meanwhile. The proof needs no clock: the faulty tier
// holds a save's PAGE put (no completion) or hides its sidecar from the visibility probe until
// the test thread lets it go, and the test thread's submit() and lookup_prefix() return before
// that; a call that waited for the save would never return (the test would hang, then fail on
// its Meson timeout). Meson suite `threads`: also run under ThreadSanitizer.
#include <doctest/doctest.h>

#include <atomic>
#include <latch>
#include <thread>
#include <vector>

#include "support/engine_scenarios.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;
using tier::test::fault_control;

namespace {

constexpr std::uint32_t kBlocksPerChunk = 8;  // chunk 1024 / block 128

// One rank on the faulty tier (a cpu tier with hooks) over a small host DSV4 layout.
struct Rank {
  EngineConfig config;
  std::unique_ptr<TierStack> stack;
  std::unique_ptr<dsv4::Dsv4Layout> layout;
  std::unique_ptr<Worker> worker;

  explicit Rank(EngineConfig c) : config(c) {
    auto profile = parse_profile(faulty_profile(), Registry::global(), "<threads>");
    REQUIRE_MESSAGE(profile.is_ok(), profile.status().to_string());
    stack = require_value(TierStack::open(*profile));
    layout = require_value(dsv4::Dsv4Layout::create(small_geometry(config.block_tokens, 64, 4),
                                              config.page_namespace, 1, 0));
    worker = require_value(Worker::create(config, 0, *stack, *layout));
  }
};

EngineConfig threads_config() {
  EngineConfig c = default_config(1);
  c.max_pending_saves = 8;
  return c;
}

Key128 key_of(std::uint64_t i) {
  return Key128{0x7468726561647300ULL + i, i * 0x9e3779b97f4a7c15ULL};
}

// A save of one chunk (key `i`) from blocks [8 * (i % 8), +8); with `slot`, also the SLOT of
// group 0 at the boundary 1024 whose prefix is that chunk.
SaveOp save_of(std::uint64_t i, bool slot) {
  SaveOp op;
  op.id = OperationId{i, i};
  op.page_start = 0;
  op.page_end = 1024;
  op.chunk_keys = {key_of(i)};
  for (std::uint32_t b = 0; b < kBlocksPerChunk; ++b)
    op.block_ids.push_back(static_cast<std::uint32_t>((i % 8) * kBlocksPerChunk + b));
  if (slot) {
    op.slot = Boundary{1024, key_of(i)};
    op.prefix_keys = {key_of(i)};
    op.slot_group = 0;
  }
  return op;
}

StepPlan plan_of(std::vector<SaveOp> saves) {
  StepPlan p;
  p.saves = std::move(saves);
  return p;
}

// The runner: its own saves (generations from 1000 up) and progress() until `stop`, then until
// every save finished. Collects every report.
class Runner {
 public:
  explicit Runner(Worker& w) : w_(w), thread_([this] { run(); }) {}
  ~Runner() { join(); }
  void join() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  const std::vector<OpReport>& reports() const { return reports_; }  // after join()

 private:
  void run() {
    std::uint64_t next = 1000;
    while (!stop_ || w_.queued_saves() > 0) {
      if (!stop_ && w_.queued_saves() < 2 && next < 1064)
        w_.submit(plan_of({save_of(next++, false)}));
      w_.progress();
      auto r = w_.take_reports();
      reports_.insert(reports_.end(), r.begin(), r.end());
    }
    auto r = w_.take_reports();
    reports_.insert(reports_.end(), r.begin(), r.end());
  }
  Worker& w_;
  std::atomic<bool> stop_{false};
  std::vector<OpReport> reports_;
  std::thread thread_;
};

const OpReport* find_report(const std::vector<OpReport>& rs, std::uint64_t gen, Channel c) {
  for (const OpReport& r : rs)
    if (r.id.generation == gen && r.channel == c) return &r;
  return nullptr;
}

}  // namespace

TEST_CASE("threads: submit and lookups return while a save's put is held by the tier") {
  FaultScope faults;
  Rank rank(threads_config());
  Worker& w = *rank.worker;
  // Chunk 1 is stored before the runner starts: lookups must keep finding it.
  w.submit(plan_of({save_of(1, false)}));
  w.progress();
  REQUIRE(w.take_reports().size() == 1);

  const ObjectKey held = w.page_key(key_of(2));
  std::atomic<bool> holding{true};
  std::latch put_reached(1);
  std::atomic<bool> reached{false};
  fault_control().hold_put = [&](const ObjectKey& k) {
    if (!(k == held)) return false;
    if (!reached.exchange(true)) put_reached.count_down();
    return holding.load();
  };

  Runner runner(w);
  w.submit(plan_of({save_of(2, true)}));  // the save whose PAGE put the tier holds
  put_reached.wait();                     // the runner is inside that save now

  // Submits (with a SLOT snapshot) and lookups, all while the put stays held.
  for (std::uint64_t i = 3; i < 6; ++i) w.submit(plan_of({save_of(i, i == 3)}));
  for (int round = 0; round < 50; ++round) {
    const std::vector<Key128> present = {key_of(1)};
    auto n = w.lookup_prefix(present);
    REQUIRE(n.is_ok());
    CHECK(*n == 1);
    const std::vector<Key128> pending = {key_of(2)};
    auto m = w.lookup_prefix(pending);
    REQUIRE(m.is_ok());
    CHECK(*m == 0);  // stored only once the tier answers
  }
  auto committed = w.has_commit(Boundary{1024, key_of(1)});
  REQUIRE(committed.is_ok());
  CHECK_FALSE(*committed);
  // Generation 2 is still running (its SLOT, the only SLOT ahead of generation 3's, is not
  // published): nothing above waited for it.
  CHECK(w.counters().slot_publishes.get() == 0);
  CHECK(w.queued_saves() >= 4);

  holding = false;  // the tier answers; the runner finishes every save
  runner.join();
  const auto& rs = runner.reports();
  for (std::uint64_t gen = 2; gen < 6; ++gen) {
    const OpReport* page = find_report(rs, gen, Channel::kPageSave);
    REQUIRE(page != nullptr);
    CHECK_MESSAGE(page->ok(), "generation ", gen, ": ", outcome_name(page->outcome));
  }
  const OpReport* slot = find_report(rs, 2, Channel::kSlotSave);
  REQUIRE(slot != nullptr);
  CHECK(slot->ok());
  for (const OpReport& r : rs) CHECK_MESSAGE(r.ok(), r.id.generation, ": ", outcome_name(r.outcome));
  std::vector<Key128> all;
  for (std::uint64_t i = 1; i < 6; ++i) all.push_back(key_of(i));
  CHECK(*w.lookup_prefix(all) == all.size());
}

TEST_CASE("threads: submit and lookups return while a save waits for its sidecar to show") {
  FaultScope faults;
  EngineConfig c = threads_config();
  c.publication_timeout_ms = 600'000;  // longer than the test's Meson timeout: never reached
  c.publication_poll_interval_ms = 1;
  Rank rank(c);
  Worker& w = *rank.worker;
  const Boundary b{1024, key_of(7)};
  const ObjectKey sidecar = w.slot_key(b);
  std::atomic<bool> hiding{true};
  std::latch probed(1);
  std::atomic<bool> seen{false};
  fault_control().hide = [&](const ObjectKey& k) {
    if (!(k == sidecar)) return false;
    if (!seen.exchange(true)) probed.count_down();
    return hiding.load();
  };

  Runner runner(w);
  w.submit(plan_of({save_of(7, true)}));
  probed.wait();  // the runner is polling the sidecar's visibility now

  w.submit(plan_of({save_of(8, true)}));
  const std::vector<Key128> prefix = {key_of(7)};
  auto n = w.lookup_prefix(prefix);
  REQUIRE(n.is_ok());
  CHECK(*n == 1);  // the PAGE part is stored and visible
  auto committed = w.has_commit(b);
  REQUIRE(committed.is_ok());
  CHECK_FALSE(*committed);
  CHECK(w.put_commit(Boundary{1024, key_of(9)}).is_ok());
  CHECK(*w.has_commit(Boundary{1024, key_of(9)}));
  CHECK(w.counters().slot_publishes.get() == 0);  // generation 7 is still waiting

  hiding = false;
  runner.join();
  const auto& rs = runner.reports();
  for (std::uint64_t gen : {7, 8}) {
    const OpReport* slot = find_report(rs, gen, Channel::kSlotSave);
    REQUIRE(slot != nullptr);
    CHECK_MESSAGE(slot->ok(), "generation ", gen, ": ", outcome_name(slot->outcome));
  }
  CHECK(w.counters().slot_publishes.get() == 2);
}

// A DeviceOrder the layout cannot honour (host KV memory has no device work to follow): every
// operation of the plan fails at once as `device_order`, none runs; an empty order is no order.
TEST_CASE("device order: a host layout refuses a non-empty order and fails the whole plan") {
  FaultScope faults;
  Rank rank(threads_config());
  Worker& w = *rank.worker;
  int fake = 0;  // never dereferenced: the host layout refuses before any runtime call
  StepPlan plan = plan_of({save_of(1, true)});
  LoadOp load;
  load.id = OperationId{2, 2};
  plan.loads.push_back(load);
  w.submit(plan, DeviceOrder{&fake, nullptr});
  CHECK(w.queued_saves() == 0);
  CHECK(w.queued_loads() == 0);
  auto rs = w.take_reports();
  REQUIRE(rs.size() == 3);  // the load, the PAGE and the SLOT part of the save
  for (const OpReport& r : rs) {
    CHECK_FALSE(r.ok());
    CHECK(r.outcome == WorkerOutcome::kDeviceOrder);
  }
  CHECK(fault_control().count(Op::kPut) == 0);
  w.submit(plan_of({save_of(3, false)}), DeviceOrder{});
  w.progress();
  rs = w.take_reports();
  REQUIRE(rs.size() == 1);
  CHECK(rs[0].ok());
}
