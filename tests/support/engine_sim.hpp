#pragma once
// A simulated inference engine for the offload engine's tests: one Scheduler, TP ranks each with
// its own real TierStack (CPU tiers, or the mock plugin / the "faulty" cpu wrapper for fault
// injection), a dsv4::Dsv4Layout over a small real DSV4 geometry (which the rank's Worker sees through
// a FaultyLayout that can fail SLOT snapshots), and a Worker per rank. Every step runs each rank's
// submit+progress on its own thread, as TP workers do. A "forward" writes deterministic KV derived
// from the prefix content (kv_content.hpp), so a restore can be checked bit for bit against a
// recomputation. SimOptions::layout puts every rank's KV in host or GPU memory; SimOptions::wire
// sends every plan and report through the wire format (tier/engine/wire.hpp), as between
// processes.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "support/fault_backend.hpp"
#include "support/test_util.hpp"
#include "tier/dsv4/kv_layout.hpp"
#include "tierbench/kv_content.hpp"
#include "tier/engine/scheduler.hpp"
#include "tier/engine/wire.hpp"
#include "tier/engine/worker.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

namespace tier::engine::test {

// Tokens of a synthetic prompt: `n` tokens from stream `seed`.
inline std::vector<std::uint32_t> tokens(std::uint64_t seed, std::size_t n) {
  std::vector<std::uint32_t> t(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& v : t) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<std::uint32_t>(x % 100000);
  }
  return t;
}
inline std::vector<std::uint32_t> concat(std::vector<std::uint32_t> a,
                                         const std::vector<std::uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A small DSV4 geometry (2 compressed layers, narrow heads) with `block` tokens per block.
inline dsv4::Geometry small_geometry(std::uint32_t block, std::uint64_t blocks,
                                     std::uint64_t slots) {
  dsv4::ModelConfig m;
  m.compress_ratios = {4, 128, 0};
  m.kv_head_dim = 64;
  m.rope_head_dim = 16;
  m.index_head_dim = 32;
  m.block_size = block;
  m.sliding_window = 8;
  m.num_blocks = blocks;
  m.num_slots = slots;
  return dsv4::Geometry::compute(m).value();
}

inline void require_ok(const Status& s) { REQUIRE_MESSAGE(s.is_ok(), s.to_string()); }
template <class T>
T require_value(Result<T> r) {
  REQUIRE_MESSAGE(r.is_ok(), r.status().to_string());
  return std::move(r).value();
}

// `pinned`: the tier's storage in page-locked memory (needs a GPU), which restores into device
// KV by direct scattered gets.
inline Json cpu_profile(const std::string& capacity = "256MiB", bool pinned = false) {
  Json backend{{"type", "cpu"}};
  if (pinned) backend["pinned"] = true;
  return Json{{"tiers", Json::array({Json{
                            {"name", "cpu"}, {"capacity", capacity}, {"backend", backend}}})}};
}
// A mock tier (tests/plugins) that fails every request of `op`.
inline Json failing_profile(const std::string& op) {
  return Json{
      {"plugins", Json::array({"mock"})},
      {"tiers", Json::array({Json{
                    {"name", "mock"},
                    {"capacity", "256MiB"},
                    {"backend", Json{{"type", "mock"}, {"fail_every", 1u}, {"fail_op", op}}}}})}};
}

// A real cpu tier wrapped by the "faulty" test backend (tests/support/fault_backend.hpp); its
// faults are set through tier::test::fault_control(), shared by every rank that uses it.
inline Json faulty_profile(const std::string& capacity = "256MiB") {
  tier::test::register_faulty_backend();
  return Json{{"tiers", Json::array({Json{{"name", "faulty"},
                                          {"capacity", capacity},
                                          {"backend", Json{{"type", "faulty"}}}}})}};
}

// Fault injection over a real layout: while `fail_snapshot` is set, the SLOT codecs it hands out
// fail to encode (a SLOT snapshot that cannot be taken); everything else is the inner layout's.
// With `rows` (a second layout of the same geometry and identity, SimOptions::host_rows), it
// stages SLOT loads in that layout's group 0 and commits them by a copy into the group: the
// worker's staged path (KvLayout::stage_slot) on host memory, whose own layout stages none.
class FaultyLayout final : public KvLayout {
 public:
  explicit FaultyLayout(KvLayout& inner, std::unique_ptr<KvLayout> rows = nullptr)
      : inner_(inner), rows_(std::move(rows)) {}
  bool fail_snapshot = false;
  std::atomic<std::uint64_t> row_commits{0};  // staged SLOTs copied into their group

  Result<std::unique_ptr<SlotStaging>> stage_slot(const SlotIdentity& id,
                                                  std::int32_t group) override {
    if (!rows_) return inner_.stage_slot(id, group);
    if (row_held_) return Status(Code::kRejected, "the row is in use");
    TIER_ASSIGN_OR_RETURN(auto dst, inner_.slot_regions(group));
    TIER_ASSIGN_OR_RETURN(auto codec, rows_->slot_codec(id));
    TIER_ASSIGN_OR_RETURN(auto row, rows_->slot_regions(0));
    return std::unique_ptr<SlotStaging>(
        new HostRow(*this, std::move(codec), std::move(row), std::move(dst)));
  }

  const Codec& page_codec() const noexcept override { return inner_.page_codec(); }
  Result<std::vector<Region>> page_regions(
      std::span<const std::uint32_t> block_ids) const override {
    return inner_.page_regions(block_ids);
  }
  Result<std::vector<Region>> slot_regions(std::int32_t group) const override {
    return inner_.slot_regions(group);
  }
  Result<std::unique_ptr<Codec>> slot_codec(const SlotIdentity& id) const override {
    auto codec = inner_.slot_codec(id);
    if (!codec || !fail_snapshot) return codec;
    return std::unique_ptr<Codec>(new FailingEncode(std::move(codec).value()));
  }
  std::uint32_t block_tokens() const noexcept override { return inner_.block_tokens(); }
  std::array<std::byte, 16> slot_fingerprint(std::uint32_t tp_rank) const override {
    return inner_.slot_fingerprint(tp_rank);
  }

 private:
  class FailingEncode final : public tier::test::ForwardingCodec {
   public:
    explicit FailingEncode(std::unique_ptr<Codec> inner)
        : ForwardingCodec(*inner), owned_(std::move(inner)) {}
    Result<std::size_t> encode(RegionList, std::span<std::byte>) const noexcept override {
      return Status(Code::kDeviceError, "injected snapshot failure");
    }

   private:
    std::unique_ptr<Codec> owned_;  // what inner_ refers to
  };
  class HostRow final : public SlotStaging {
   public:
    HostRow(FaultyLayout& owner, std::unique_ptr<Codec> codec, std::vector<Region> row,
            std::vector<Region> group)
        : owner_(owner), codec_(std::move(codec)), row_(std::move(row)), group_(std::move(group)) {
      owner_.row_held_ = true;
    }
    ~HostRow() override { owner_.row_held_ = false; }
    RegionList regions() const noexcept override { return row_; }
    const Codec& codec() const noexcept override { return *codec_; }
    Status commit() override {
      for (std::size_t i = 0; i < row_.size(); ++i)
        std::memcpy(group_[i].data, row_[i].data, row_[i].size);
      owner_.row_commits.fetch_add(1);
      return Status::ok();
    }

   private:
    FaultyLayout& owner_;
    std::unique_ptr<Codec> codec_;
    std::vector<Region> row_, group_;
  };
  KvLayout& inner_;
  std::unique_ptr<KvLayout> rows_;
  std::atomic<bool> row_held_{false};
};

struct SimOptions {
  EngineConfig config;
  std::uint64_t num_blocks = 512;
  std::uint64_t num_slots = 4;
  std::uint64_t prefill_chunk = 4096;
  dsv4::Dsv4LayoutOptions layout;  // where each rank's KV memory lives (host or GPU)
  // Host memory: SLOT loads go through a staging row (FaultyLayout's `rows`), as on a GPU.
  bool host_rows = false;
  // Every plan reaches each rank as its own decoded copy of one encoded message, and each rank's
  // reports reach the scheduler encoded and decoded, as between processes.
  bool wire = false;
  // Per rank: the profile of that rank's stack (default: a CPU tier).
  std::function<Json(std::uint32_t rank)> profile = [](std::uint32_t) { return cpu_profile(); };
};

inline EngineConfig default_config(std::uint32_t tp = 2) {
  EngineConfig c;
  c.block_tokens = 128;
  c.chunk_tokens = 1024;
  c.checkpoint_interval_tokens = 8192;
  c.min_load_tokens = 1024;
  c.tp_size = tp;
  c.max_pending_saves = 4;
  c.page_namespace = namespace_id(Json{{"model", "sim-dsv4"}, {"block", 128}}).value();
  return c;
}

// A simulated engine of `tp` ranks with default_config(), host KV memory and CPU tiers.
inline SimOptions sim_options(std::uint32_t tp = 2) {
  SimOptions o;
  o.config = default_config(tp);
  return o;
}

// How SimEngine::admit() allocates for a request.
struct AdmitOptions {
  std::uint64_t local = 0;  // tokens the engine already holds at after_alloc (its prefix cache)
  bool with_group = true;  // whether the request gets a state group
};

class SimEngine {
 public:
  explicit SimEngine(SimOptions o) : o_(std::move(o)) {
    const auto geo = small_geometry(o_.config.block_tokens, o_.num_blocks, o_.num_slots);
    for (std::uint32_t r = 0; r < o_.config.tp_size; ++r) {
      auto profile = parse_profile(o_.profile(r), Registry::global(), "<sim>");
      REQUIRE_MESSAGE(profile.is_ok(), profile.status().to_string());
      auto stack = TierStack::open(*profile);
      REQUIRE_MESSAGE(stack.is_ok(), stack.status().to_string());
      stacks.push_back(std::move(stack).value());
      layouts.push_back(require_value(
          dsv4::Dsv4Layout::create(geo, o_.config.page_namespace, o_.config.tp_size, r, o_.layout)));
      std::unique_ptr<KvLayout> rows;
      if (o_.host_rows)
        rows = require_value(
            dsv4::Dsv4Layout::create(geo, o_.config.page_namespace, o_.config.tp_size, r));
      faulty.push_back(std::make_unique<FaultyLayout>(*layouts.back(), std::move(rows)));
      workers.push_back(Worker::create(o_.config, r, *stacks.back(), *faulty.back()).value());
    }
    restart_scheduler();
    for (std::uint32_t b = 0; b < o_.num_blocks; ++b) free_blocks_.push_back(b);
    // The last group is scratch space for expected digests.
    for (std::int32_t g = 0; g + 1 < static_cast<std::int32_t>(o_.num_slots); ++g)
      free_groups_.push_back(g);
  }

  // A new scheduler over the same workers and tiers: what a process restart keeps.
  void restart_scheduler() { sched = Scheduler::create(o_.config, *workers[0]).value(); }

  // Runs `fn(rank)` on one thread per rank and joins.
  void on_ranks(const std::function<void(std::uint32_t)>& fn) {
    std::vector<std::thread> ts;
    for (std::uint32_t r = 0; r < workers.size(); ++r) ts.emplace_back(fn, r);
    for (auto& t : ts) t.join();
  }

  // One engine step: plan, dispatch to every rank, progress, aggregate.
  StepEvents step(bool progress = true) {
    last_plan = sched->build_step();
    std::vector<StepPlan> plans(workers.size(), last_plan);
    if (o_.wire) {
      const auto bytes = require_value(wire::encode_plan(last_plan));
      for (StepPlan& p : plans) p = require_value(wire::decode_plan(bytes));
    }
    on_ranks([&](std::uint32_t r) {
      workers[r]->submit(plans[r]);
      if (progress) workers[r]->progress();
    });
    return collect();
  }
  StepEvents collect() {
    std::vector<OpReport> all;
    for (auto& w : workers) {
      auto rs = w->take_reports();
      if (o_.wire)
        rs = require_value(wire::decode_reports(require_value(wire::encode_reports(rs))));
      all.insert(all.end(), rs.begin(), rs.end());
    }
    return absorb(sched->process(all));
  }
  StepEvents absorb(StepEvents ev) {
    for (SeqHandle h : ev.freeable) release(h);
    for (SeqHandle h : ev.loaded) loaded_.push_back(h);
    for (SeqHandle h : ev.load_failed) failed_.push_back(h);
    return ev;
  }

  struct Live {
    SeqHandle h = 0;
    std::vector<std::uint32_t> prompt;
    std::vector<std::uint32_t> blocks;
    std::int32_t group = -1;
    std::uint64_t computed = 0;
  };
  struct Outcome {
    MatchResult match;
    LoadDecision decision;
    bool loaded = false, load_failed = false;
    SeqHandle h = 0;
    std::uint64_t resumed_from = 0;  // tokens restored by the load
  };
  struct Admission {
    Live live;    // a copy; live(h) is the engine's
    Outcome out;  // what lookup and after_alloc decided
  };

  // Admits a request: add, lookup, allocate, after_alloc. The load (if any) runs in step().
  Admission admit(RequestId id, const std::vector<std::uint32_t>& prompt, AdmitOptions opt = {}) {
    Outcome out;
    Live l;
    l.prompt = prompt;
    l.h = sched->add_request(id, prompt);
    out.h = l.h;
    auto m = sched->lookup(l.h);
    REQUIRE(m.is_ok());
    out.match = *m;
    const std::size_t nblocks =
        (prompt.size() + o_.config.block_tokens - 1) / o_.config.block_tokens;
    REQUIRE(free_blocks_.size() >= nblocks);
    l.blocks.assign(free_blocks_.begin(), free_blocks_.begin() + static_cast<long>(nblocks));
    free_blocks_.erase(free_blocks_.begin(), free_blocks_.begin() + static_cast<long>(nblocks));
    if (opt.with_group) {
      REQUIRE(!free_groups_.empty());
      l.group = free_groups_.front();
      free_groups_.erase(free_groups_.begin());
    }
    if (l.group >= 0)
      for (auto& lay : layouts) require_ok(zero_slot(*lay, l.group));
    if (opt.local > 0) forward(l, 0, opt.local);
    out.decision = sched->after_alloc(l.h, opt.local, l.blocks, l.group);
    l.computed = opt.local;
    owned_[l.h] = l;
    return {l, out};
  }

  // The KV a forward pass writes for tokens [start, end) on every rank: each completed block
  // from its chunk key; the state group from the prefix at `end`.
  void forward(Live& l, std::uint64_t start, std::uint64_t end) {
    REQUIRE(end <= l.prompt.size());
    const auto keys = chunk_keys(o_.config.page_namespace, l.prompt, o_.config.block_tokens, true);
    const std::uint64_t bt = o_.config.block_tokens;
    for (std::uint64_t b = start / bt; b < (end + bt - 1) / bt; ++b)
      for (auto& lay : layouts) require_ok(fill_block(*lay, l.blocks[b], keys[b].lo));
    if (l.group >= 0)
      for (auto& lay : layouts) require_ok(fill_slot(*lay, l.group, state_seed(l.prompt, end)));
    l.computed = end;
    owned_[l.h] = l;
  }
  std::uint64_t state_seed(const std::vector<std::uint32_t>& prompt, std::uint64_t end) const {
    auto k = chunk_keys(o_.config.page_namespace, std::span(prompt).first(end), end, false);
    return k.empty() ? 0 : k[0].lo;
  }
  // The digest the state group must have after a restore at `tokens` of `prompt` (rank r).
  std::uint64_t expected_slot_digest(std::uint32_t r, const std::vector<std::uint32_t>& prompt,
                                     std::uint64_t tokens) {
    const auto scratch = static_cast<std::int32_t>(o_.num_slots - 1);
    require_ok(fill_slot(*layouts[r], scratch, state_seed(prompt, tokens)));
    return require_value(digest_slot(*layouts[r], scratch));
  }

  // Runs a whole request: admit, wait for its load, prefill the rest with cuts, finish, and step
  // until its blocks are freed.
  Outcome run(RequestId id, const std::vector<std::uint32_t>& prompt, std::uint64_t local = 0) {
    auto [l, out] = admit(id, prompt, {.local = local});
    if (out.decision.action == LoadAction::kLoad) {
      for (int i = 0; i < 8 && !done(l.h); ++i) step();
      out.loaded = std::count(loaded_.begin(), loaded_.end(), l.h) > 0;
      out.load_failed = std::count(failed_.begin(), failed_.end(), l.h) > 0;
      if (out.loaded) {
        l.computed = out.decision.load_end;
        out.resumed_from = l.computed;
      }
    }
    prefill(l);
    finish(l.h);
    return out;
  }
  void prefill(Live& l) {
    while (l.computed < l.prompt.size()) {
      std::uint64_t n = std::min<std::uint64_t>(o_.prefill_chunk, l.prompt.size() - l.computed);
      n = sched->cut_prefill_chunk(l.h, l.computed, n);
      forward(l, l.computed, l.computed + n);
      sched->on_computed(l.h, l.computed);
      step();
    }
  }
  bool finish(SeqHandle h, int max_steps = 16) {
    if (sched->finish(h)) {
      release(h);
      return true;
    }
    for (int i = 0; i < max_steps && owned_.count(h); ++i) step();
    return owned_.count(h) == 0;
  }
  bool done(SeqHandle h) const {
    return std::count(loaded_.begin(), loaded_.end(), h) +
               std::count(failed_.begin(), failed_.end(), h) >
           0;
  }
  bool freed(SeqHandle h) const { return owned_.count(h) == 0; }
  Live& live(SeqHandle h) { return owned_.at(h); }

  void release(SeqHandle h) {
    auto it = owned_.find(h);
    if (it == owned_.end()) return;
    free_blocks_.insert(free_blocks_.end(), it->second.blocks.begin(), it->second.blocks.end());
    if (it->second.group >= 0) free_groups_.push_back(it->second.group);
    owned_.erase(it);
  }

  SimOptions o_;
  std::vector<std::unique_ptr<TierStack>> stacks;
  std::vector<std::unique_ptr<dsv4::Dsv4Layout>> layouts;
  std::vector<std::unique_ptr<FaultyLayout>> faulty;  // what each rank's worker sees
  std::vector<std::unique_ptr<Worker>> workers;
  std::unique_ptr<Scheduler> sched;
  StepPlan last_plan;

 private:
  std::vector<std::uint32_t> free_blocks_;
  std::vector<std::int32_t> free_groups_;
  std::map<SeqHandle, Live> owned_;
  std::vector<SeqHandle> loaded_, failed_;
};

}  // namespace tier::engine::test
