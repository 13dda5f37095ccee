// engine_interleavings: a seeded randomized simulation of the offload engine (simulation testing,
// as FoundationDB and TigerBeetle test), over the simulated engine of tests/support/engine_sim.hpp
// (TP ranks with real cpu tiers wrapped by the fault-injecting backend, real DSV4 layouts and
// codecs, one Worker per rank, one Scheduler).
//
//   engine_interleavings [--seeds N] [--first-seed S] [--verbose]
//
// Each seed picks a TP size (1, 2, 4), a SLOT cadence (-1, 0, 512, 1024), whether the ranks'
// progress() runs on threads of their own or one after another in random order, a tier capacity
// (eviction or none), tier faults (put failure, visibility delay, dropped put, corrupt object,
// snapshot failure, eviction, lease expiry) and then runs a random engine: requests over shared
// prompt prefixes (some exactly on SLOT boundaries) admitted, loaded, prefilled in chunks, decoded,
// finished or aborted at any time; scheduler steps whose saves a rank runs late (or not at all for
// a while), reports delivered late and out of order, lookups while saves are queued, and scheduler
// restarts while the workers keep their queued operations. A reference model checks after every
// step:
//  - every restore equals, byte for byte on every rank, the KV and the state at exactly the
//    boundary it resumed from, and every committed sidecar holds the state at exactly its
//    boundary on every rank that still stores it;
//  - nothing is committed that every rank did not report saved (the quorum), no terminal comes
//    twice, and operation ids are never reused, not across scheduler restarts either;
//  - every request is eventually freeable; then every lease is released and the counters agree
//    with the model's tally.
// The last line is `N seeds, V violations`; the exit status is 1 when a seed broke an invariant,
// and its seed and the trace of the engine calls that led there are printed first (run it again
// with --first-seed SEED --seeds 1 --verbose to watch it). The outcomes of a trace do not depend
// on thread timing, except where a seed lets leases expire (1 ms leases): expiry follows the clock.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/engine_sim.hpp"

namespace tier::engine::test {
namespace {

// A failed check of the reference model, or a failed REQUIRE inside the simulated engine.
struct Violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : s_(mix(seed)) {}
  std::uint64_t next() { return s_ = mix(s_); }
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next() % n; }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[below(v.size())]; }

 private:
  std::uint64_t s_;
};

// The tier faults of one seed, consulted by the "faulty" backend of every rank. A decision
// depends only on the seed, the op, the object key (whose rank says which rank's tier asks) and
// how many times that op was asked about that key before, so ranks running on threads of their
// own see the same faults in every run.
struct Faults {
  std::uint64_t seed = 0;
  double put_fail = 0, drop_put = 0, hide = 0, corrupt = 0;
  bool suspended = false;  // the model's own reads (main thread, no rank running)
  std::mutex mu;
  std::map<std::tuple<int, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint32_t>,
           std::uint64_t>
      seen;

  bool decide(int what, const ObjectKey& k, double p) {
    if (p <= 0) return false;
    std::lock_guard<std::mutex> lock(mu);
    if (suspended) return false;
    const std::uint64_t n = seen[{what, k.ns.lo, k.ns.hi, k.id.lo, k.id.hi, k.rank}]++;
    const std::uint64_t h =
        mix(seed ^ mix(k.id.lo ^ mix(k.id.hi ^ mix(k.ns.lo + k.rank + 131 * what + (n << 20)))));
    return static_cast<double>(h >> 11) * 0x1.0p-53 < p;
  }
  void install() {
    auto& fc = tier::test::fault_control();
    fc.reset();
    fc.fail_put = [this](const ObjectKey& k) { return decide(0, k, put_fail); };
    fc.drop_put = [this](const ObjectKey& k) { return decide(1, k, drop_put); };
    fc.hide = [this](const ObjectKey& k) { return decide(2, k, hide); };
    fc.mutate_put = [this](const ObjectKey& k, std::vector<std::byte>& img) {
      if (img.size() > 200 && decide(3, k, corrupt)) img[img.size() - 5] ^= std::byte{0x20};
    };
  }
  void quiet() {
    std::lock_guard<std::mutex> lock(mu);
    put_fail = drop_put = hide = corrupt = 0;
  }
};

struct SeedSetup {
  std::uint32_t tp = 1;
  std::int64_t interval = 512;
  bool threads = false;
  bool small_tiers = false;  // capacity small enough to evict
  bool short_leases = false;
  double lag = 0;            // a rank skips a step's progress()
  double hold = 0;           // a report is held back for a later step
  double evict = 0, restart = 0, snapshot_fail = 0, ignore_cut = 0;
  std::string describe() const {
    std::ostringstream o;
    o << "tp " << tp << ", interval " << interval << ", progress "
      << (threads ? "on rank threads" : "in random order") << (small_tiers ? ", small tiers" : "")
      << (short_leases ? ", 1 ms leases" : "") << ", lag " << lag << ", hold " << hold
      << ", evict " << evict << ", restart " << restart << ", snapshot_fail " << snapshot_fail
      << ", ignore_cut " << ignore_cut;
    return o.str();
  }
};

// One request as the engine holds it.
struct Req {
  SeqHandle h = 0;
  RequestId id = 0;
  std::shared_ptr<const std::vector<std::uint32_t>> prompt;
  std::vector<std::uint32_t> blocks;
  std::int32_t group = -1;
  std::uint64_t computed = 0;
  enum class State { kParked, kPrefill, kDecode, kFinished } state = State::kPrefill;
  LoadDecision decision;
  std::optional<std::uint64_t> load_gen;  // the load emitted for it, until its terminal
  int decoded = 0;
};

// What the model remembers of an emitted operation.
struct OpInfo {
  bool load = false;
  SeqHandle h = 0;
  std::shared_ptr<const std::vector<std::uint32_t>> prompt;
  std::uint64_t page_start = 0, page_end = 0;
  std::optional<Boundary> slot;
  bool abandoned = false;
  std::uint32_t epoch = 0;  // which scheduler emitted it (restarts)
};

class Simulation {
 public:
  Simulation(std::uint64_t seed, bool verbose) : seed_(seed), rng_(seed), verbose_(verbose) {}

  void run() {
    choose_setup();
    trace("setup: " + setup_.describe());
    faults_.install();
    SimOptions o = sim_options(setup_.tp);
    o.config.block_tokens = 128;
    o.config.chunk_tokens = 256;
    o.config.checkpoint_interval_tokens = setup_.interval;
    o.config.min_load_tokens = 256;
    o.config.max_pending_saves = 1 + static_cast<std::uint32_t>(rng_.below(4));
    o.config.lease_timeout_ms = setup_.short_leases ? 1 : 10000;
    o.num_blocks = 160;
    o.num_slots = 9;  // 8 state groups and the scratch group
    const std::string capacity = setup_.small_tiers ? "384KiB" : "64MiB";
    o.profile = [capacity](std::uint32_t) { return faulty_profile(capacity); };
    sim_ = std::make_unique<SimEngine>(o);
    config_ = o.config;
    for (std::uint32_t b = 0; b < o.num_blocks; ++b) free_blocks_.push_back(b);
    for (std::int32_t g = 0; g + 1 < static_cast<std::int32_t>(o.num_slots); ++g)
      free_groups_.push_back(g);
    submitted_.assign(setup_.tp, {0, 0});

    const int ticks = 60 + static_cast<int>(rng_.below(90));
    for (int t = 0; t < ticks; ++t) tick();
    quiesce();
  }

  const std::vector<std::string>& trace_lines() const { return trace_; }

 private:
  // ---- setup ----
  void choose_setup() {
    static const std::vector<std::uint32_t> tps{1, 2, 2, 4};
    static const std::vector<std::int64_t> intervals{-1, 0, 512, 512, 1024};
    setup_.tp = rng_.pick(tps);
    setup_.interval = rng_.pick(intervals);
    setup_.threads = setup_.tp > 1 && rng_.chance(0.5);
    setup_.small_tiers = rng_.chance(0.25);
    setup_.short_leases = rng_.chance(0.1);
    setup_.lag = rng_.chance(0.7) ? 0.1 + 0.4 * (rng_.below(100) / 100.0) : 0;
    setup_.hold = rng_.chance(0.5) ? 0.3 * (rng_.below(100) / 100.0) : 0;
    setup_.evict = rng_.chance(0.3) ? 0.05 : 0;
    setup_.restart = rng_.chance(0.15) ? 0.01 : 0;
    setup_.snapshot_fail = rng_.chance(0.2) ? 0.05 : 0;
    setup_.ignore_cut = rng_.chance(0.2) ? 0.2 : 0;
    faults_.seed = seed_;
    if (rng_.chance(0.25)) faults_.put_fail = 0.03;
    if (rng_.chance(0.2)) faults_.drop_put = 0.03;
    if (rng_.chance(0.25)) faults_.hide = 0.03;
    if (rng_.chance(0.2)) faults_.corrupt = 0.03;
  }

  // ---- the trace ----
  void trace(const std::string& line) {
    trace_.push_back(line);
    if (verbose_) std::printf("  %s\n", line.c_str());
  }
  [[noreturn]] void fail(const std::string& what) { throw Violation(what); }

  // Documents whose prefixes the prompts share; a prompt is the first `n` tokens of one.
  std::shared_ptr<const std::vector<std::uint32_t>> prompt_of(std::uint64_t doc, std::uint64_t n) {
    auto& d = docs_[doc];
    if (!d) d = std::make_shared<std::vector<std::uint32_t>>(tokens(1000 + doc, 4096));
    return std::make_shared<const std::vector<std::uint32_t>>(d->begin(),
                                                              d->begin() + static_cast<long>(n));
  }
  std::uint64_t prompt_length() {
    const std::uint64_t chunk = config_.chunk_tokens;
    std::vector<std::uint64_t> boundaries;
    if (setup_.interval > 0) {
      const std::uint64_t step = static_cast<std::uint64_t>(config_.sidecar_interval());
      for (std::uint64_t b = step; b <= 3072; b += step) boundaries.push_back(b);
    } else {
      for (std::uint64_t b = chunk; b <= 3072; b += chunk) boundaries.push_back(b);
    }
    switch (rng_.below(4)) {
      case 0:
      case 1:
        return rng_.pick(boundaries);  // exactly on a boundary (a prompt end SLOT)
      case 2:
        return rng_.pick(boundaries) + 1 + rng_.below(chunk * 2);
      default:
        return 100 + rng_.below(3000);
    }
  }

  // ---- KV content, as SimEngine::forward writes it ----
  void write_blocks(const Req& r, std::uint64_t start, std::uint64_t end) {
    const auto keys = chunk_keys(config_.page_namespace, *r.prompt, config_.block_tokens, true);
    const std::uint64_t bt = config_.block_tokens;
    for (std::uint64_t b = start / bt; b < (end + bt - 1) / bt; ++b)
      for (auto& lay : sim_->layouts) require_ok(fill_block(*lay, r.blocks[b], keys[b].lo));
  }
  std::uint64_t state_at(const Req& r, std::uint64_t tokens) const {
    if (tokens <= r.prompt->size()) return sim_->state_seed(*r.prompt, tokens);
    // A decode step: a state no prefix of the prompt has.
    return mix(sim_->state_seed(*r.prompt, r.prompt->size()) ^ mix(tokens));
  }
  void write_state(const Req& r, std::uint64_t tokens) {
    if (r.group < 0) return;
    for (auto& lay : sim_->layouts) require_ok(fill_slot(*lay, r.group, state_at(r, tokens)));
  }
  std::uint64_t expected_digest(std::uint32_t rank, const Req& r, std::uint64_t tokens) {
    const auto scratch = static_cast<std::int32_t>(sim_->o_.num_slots - 1);
    require_ok(fill_slot(*sim_->layouts[rank], scratch, state_at(r, tokens)));
    return require_value(digest_slot(*sim_->layouts[rank], scratch));
  }

  // ---- engine actions ----
  void tick() {
    const std::uint64_t a = rng_.below(100);
    if (a < 14) {
      admit();
    } else if (a < 40) {
      prefill();
    } else if (a < 52) {
      decode();
    } else if (a < 58) {
      finish_one();
    } else if (a < 61) {
      evict();
    } else if (a < 62 && rng_.chance(setup_.restart * 60)) {
      restart();
    } else if (a < 63 && setup_.short_leases) {
      trace("sleep 2 ms (leases expire)");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    } else {
      step();
    }
  }

  Req* pick_req(Req::State s) {
    std::vector<Req*> c;
    for (auto& [h, r] : live_)
      if (r.state == s) c.push_back(&r);
    return c.empty() ? nullptr : c[rng_.below(c.size())];
  }

  void admit() {
    if (live_.size() >= 6) return;
    const std::uint64_t doc = rng_.below(3);
    const std::uint64_t n = prompt_length();
    const std::uint64_t nblocks = (n + 1 + config_.block_tokens - 1) / config_.block_tokens;
    if (free_blocks_.size() < nblocks) return;
    Req r;
    r.id = 1 + rng_.below(5);  // request ids are reused
    r.prompt = prompt_of(doc, n);
    r.h = sim_->sched->add_request(r.id, *r.prompt);
    auto m = sim_->sched->lookup(r.h);
    if (!m) fail("lookup failed: " + m.status().to_string());
    r.blocks.assign(free_blocks_.begin(), free_blocks_.begin() + static_cast<long>(nblocks));
    free_blocks_.erase(free_blocks_.begin(), free_blocks_.begin() + static_cast<long>(nblocks));
    if (!free_groups_.empty() && rng_.chance(0.9)) {
      r.group = free_groups_.front();
      free_groups_.erase(free_groups_.begin());
      for (auto& lay : sim_->layouts) require_ok(zero_slot(*lay, r.group));
    }
    for (std::uint32_t b : r.blocks)
      for (auto& lay : sim_->layouts) require_ok(zero_block(*lay, b));
    r.decision = sim_->sched->after_alloc(r.h, 0, r.blocks, r.group);
    r.state = r.decision.action == LoadAction::kLoad ? Req::State::kParked : Req::State::kPrefill;
    trace("admit h" + std::to_string(r.h) + " id " + std::to_string(r.id) + " doc " +
          std::to_string(doc) + " prompt " + std::to_string(n) + " group " +
          std::to_string(r.group) + ": lookup " + std::to_string(m->tokens) + ", " +
          std::string(load_action_name(r.decision.action)) + " (" +
          std::string(r.decision.reason) + ")");
    live_.emplace(r.h, std::move(r));
  }

  void prefill() {
    Req* r = pick_req(Req::State::kPrefill);
    if (!r) return;
    const std::uint64_t left = r->prompt->size() - r->computed;
    static const std::vector<std::uint64_t> sizes{256, 512, 768, 1024, 4096};
    std::uint64_t n = std::min(left, rng_.pick(sizes));
    const std::uint64_t cut = sim_->sched->cut_prefill_chunk(r->h, r->computed, n);
    if (!rng_.chance(setup_.ignore_cut)) n = cut;
    write_blocks(*r, r->computed, r->computed + n);
    r->computed += n;
    write_state(*r, r->computed);
    sim_->sched->on_computed(r->h, r->computed);
    if (r->computed == r->prompt->size()) r->state = Req::State::kDecode;
    trace("prefill h" + std::to_string(r->h) + " to " + std::to_string(r->computed));
  }

  void decode() {
    Req* r = pick_req(Req::State::kDecode);
    if (!r || r->decoded >= 3) return;
    ++r->computed;
    ++r->decoded;
    write_state(*r, r->computed);
    sim_->sched->on_computed(r->h, r->computed);
    trace("decode h" + std::to_string(r->h) + " to " + std::to_string(r->computed));
  }

  void finish_one() {
    std::vector<Req*> c;
    for (auto& [h, r] : live_)
      if (r.state != Req::State::kFinished) c.push_back(&r);
    if (c.empty()) return;
    finish(*c[rng_.below(c.size())]);
  }
  void finish(Req& r) {
    if (r.load_gen) {
      auto it = ops_.find(*r.load_gen);
      if (it != ops_.end()) it->second.abandoned = true;
    }
    r.state = Req::State::kFinished;
    const bool now = sim_->sched->finish(r.h);
    trace("finish h" + std::to_string(r.h) + (now ? ": free now" : ": deferred"));
    if (now) release(r.h);
  }
  void release(SeqHandle h) {
    auto it = live_.find(h);
    if (it == live_.end()) fail("freeable h" + std::to_string(h) + " is not live");
    if (it->second.state != Req::State::kFinished)
      fail("h" + std::to_string(h) + " freed before it finished");
    free_blocks_.insert(free_blocks_.end(), it->second.blocks.begin(), it->second.blocks.end());
    if (it->second.group >= 0) free_groups_.push_back(it->second.group);
    live_.erase(it);
  }

  // Removes one object a rank stores (an eviction by someone else).
  void evict() {
    if (!rng_.chance(setup_.evict * 20) || known_keys_.empty()) return;
    const std::uint32_t r = static_cast<std::uint32_t>(rng_.below(setup_.tp));
    const auto& [kind, b] = known_keys_[rng_.below(known_keys_.size())];
    Worker& w = *sim_->workers[r];
    const ObjectKey key = kind == 0 ? w.page_key(b.key) : kind == 1 ? w.slot_key(b) : w.commit_key(b);
    w.with_stack([&](TierStack& s) { return s.remove(key); }).ignore();
    trace("evict rank " + std::to_string(r) + " " + (kind == 0 ? "chunk" : kind == 1 ? "sidecar" : "commit") +
          " at " + std::to_string(b.tokens));
  }

  // A new scheduler over the same, live workers: the engine's requests are gone; their blocks
  // come back once no worker holds an operation of theirs any more.
  void restart() {
    trace("restart the scheduler (" + std::to_string(live_.size()) + " requests dropped)");
    for (auto& [h, r] : live_) {
      quarantine_.insert(quarantine_.end(), r.blocks.begin(), r.blocks.end());
      if (r.group >= 0) quarantined_groups_.push_back(r.group);
    }
    live_.clear();
    for (auto& [g, op] : ops_) op.abandoned = true;
    sim_->restart_scheduler();
    ++epoch_;
    model_ = Tally{};
  }

  // ---- a scheduler step ----
  void step(bool all_progress = false) {
    StepPlan plan = sim_->sched->build_step();
    for (const LoadOp& op : plan.loads) record(op);
    for (const SaveOp& op : plan.saves) record(op);
    if (plan.has_work())
      trace("step " + std::to_string(plan.step) + ": " + std::to_string(plan.loads.size()) +
            " loads, " + std::to_string(plan.saves.size()) + " saves");
    // Every rank gets the plan before the next forward; in random order.
    std::vector<std::uint32_t> order(setup_.tp);
    for (std::uint32_t r = 0; r < setup_.tp; ++r) order[r] = r;
    shuffle(order);
    for (std::uint32_t r : order) {
      const bool snap_fail = rng_.chance(setup_.snapshot_fail);
      sim_->faulty[r]->fail_snapshot = snap_fail;
      sim_->workers[r]->submit(plan);
      sim_->faulty[r]->fail_snapshot = false;
      submitted_[r].first += plan.loads.size();
      submitted_[r].second += plan.saves.size();
      if (snap_fail && !plan.saves.empty()) trace("  rank " + std::to_string(r) + ": snapshot failure");
    }
    // progress(): each rank runs now (all its queued work, or one save), or lags this step.
    std::vector<std::pair<std::uint32_t, std::size_t>> runs;
    for (std::uint32_t r : order) {
      if (!all_progress && rng_.chance(setup_.lag)) continue;
      const std::size_t max_saves = all_progress || rng_.chance(0.6) ? SIZE_MAX : rng_.below(2);
      runs.emplace_back(r, max_saves);
    }
    if (setup_.threads) {
      std::vector<std::thread> ts;
      for (auto [r, m] : runs) ts.emplace_back([this, r = r, m = m] { sim_->workers[r]->progress(m); });
      for (auto& t : ts) t.join();
    } else {
      for (auto [r, m] : runs) sim_->workers[r]->progress(m);
    }
    // Reports: taken from every rank, delivered late and out of order.
    for (std::uint32_t r : order)
      for (OpReport& rep : sim_->workers[r]->take_reports()) held_.push_back(rep);
    shuffle(held_);
    std::vector<OpReport> now, later;
    for (const OpReport& rep : held_) (all_progress || !rng_.chance(setup_.hold) ? now : later).push_back(rep);
    held_ = std::move(later);
    for (const OpReport& rep : now) delivered_[{static_cast<int>(rep.channel), rep.id.generation}].push_back(rep);
    StepEvents ev = sim_->sched->process(now);
    on_events(ev);
    release_quarantine();
  }

  template <class T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng_.below(i)]);
  }

  void note_generation(std::uint64_t g) {
    if (!generations_.insert(g).second)
      fail("operation generation " + std::to_string(g) + " emitted twice (after " +
           std::to_string(epoch_) + " scheduler restarts)");
  }
  Req* req_of_id(SeqHandle h) {
    auto it = live_.find(h);
    return it == live_.end() ? nullptr : &it->second;
  }
  void record(const LoadOp& op) {
    note_generation(op.id.generation);
    OpInfo info;
    info.load = true;
    info.page_start = op.page_start;
    info.page_end = op.page_end;
    info.slot = op.slot;
    info.epoch = epoch_;
    for (auto& [h, r] : live_)
      if (r.id == op.id.request && r.state == Req::State::kParked && !r.load_gen) {
        info.h = h;
        info.prompt = r.prompt;
        r.load_gen = op.id.generation;
        break;
      }
    if (info.h == 0) fail("a load for id " + std::to_string(op.id.request) + " that no parked request waits for");
    ++model_.loads_emitted;
    ops_[op.id.generation] = info;
  }
  void record(const SaveOp& op) {
    note_generation(op.id.generation);
    OpInfo info;
    info.page_start = op.page_start;
    info.page_end = op.page_end;
    info.slot = op.slot;
    info.epoch = epoch_;
    // Every live request with that id and that prompt prefix could own it; the slot boundary's
    // key names the prefix exactly.
    for (auto& [h, r] : live_) {
      if (r.id != op.id.request) continue;
      if (op.slot) {
        const auto keys = chunk_keys(config_.page_namespace, *r.prompt, config_.chunk_tokens);
        const std::uint64_t i = op.slot->tokens / config_.chunk_tokens;
        if (i == 0 || i > keys.size() || !(keys[i - 1] == op.slot->key)) continue;
      }
      info.h = h;
      info.prompt = r.prompt;
      break;
    }
    if (op.slot && info.h == 0) fail("a SLOT save of id " + std::to_string(op.id.request) + " that no live request owns");
    if (op.slot) {
      known_keys_.emplace_back(1, *op.slot);
      known_keys_.emplace_back(2, *op.slot);
    }
    for (std::size_t i = 0; i < op.chunk_keys.size(); ++i)
      known_keys_.emplace_back(0, Boundary{op.page_start + (i + 1) * config_.chunk_tokens, op.chunk_keys[i]});
    if (known_keys_.size() > 400) known_keys_.erase(known_keys_.begin(), known_keys_.begin() + 100);
    ++model_.saves_emitted;
    model_.saved_tokens += op.page_end - op.page_start;
    ops_[op.id.generation] = info;
  }

  void on_events(const StepEvents& ev) {
    std::set<std::pair<int, std::uint64_t>> seen;
    for (const Terminal& t : ev.terminals) {
      if (!seen.insert({static_cast<int>(t.channel), t.id.generation}).second ||
          !terminals_.insert({static_cast<int>(t.channel), t.id.generation}).second)
        fail("two terminals for " + std::string(channel_name(t.channel)) + " generation " +
             std::to_string(t.id.generation));
      auto it = ops_.find(t.id.generation);
      if (it == ops_.end() || it->second.epoch != epoch_)
        fail("a terminal for generation " + std::to_string(t.id.generation) +
             " that this scheduler never emitted");
      check_quorum(t);
      OpInfo& op = it->second;
      if (t.channel == Channel::kLoad) {
        if (!op.abandoned) {
          ++(t.ok() ? model_.loads_ok : model_.loads_failed);
          if (t.ok()) model_.loaded_tokens += op.page_end - op.page_start;
        }
        if (Req* r = req_of_id(op.h)) r->load_gen.reset();
      } else if (t.channel == Channel::kSlotSave) {
        if (t.ok()) {
          ++model_.slot_commits;
          check_sidecars(op);
        } else {
          ++model_.slot_failures;
        }
      }
      if (t.channel != Channel::kLoad) {
        auto& left = save_channels_[t.id.generation];
        if (left == 0) left = op.slot ? 2 : 1;
        if (--left == 0) ++model_.saves_done;
      }
    }
    for (SeqHandle h : ev.loaded) {
      Req* r = req_of_id(h);
      if (!r || r->state != Req::State::kParked) fail("loaded h" + std::to_string(h) + " is not parked");
      check_restored_now(*r, r->decision.load_end);
      r->computed = r->decision.load_end;
      r->state = r->computed >= r->prompt->size() ? Req::State::kDecode : Req::State::kPrefill;
      trace("  loaded h" + std::to_string(h) + " at " + std::to_string(r->computed));
    }
    for (SeqHandle h : ev.load_failed) {
      Req* r = req_of_id(h);
      if (!r || r->state != Req::State::kParked) fail("load_failed h" + std::to_string(h) + " is not parked");
      r->state = Req::State::kPrefill;  // recompute from the floor (0)
      trace("  load failed h" + std::to_string(h));
    }
    for (SeqHandle h : ev.freeable) {
      trace("  freeable h" + std::to_string(h));
      release(h);
    }
  }

  // Every rank reported this exact operation on this channel, and a success only if each did.
  void check_quorum(const Terminal& t) {
    const auto& reps = delivered_[{static_cast<int>(t.channel), t.id.generation}];
    std::set<std::uint32_t> ranks, ok_ranks;
    for (const OpReport& r : reps) {
      ranks.insert(r.rank);
      if (r.ok()) ok_ranks.insert(r.rank);
    }
    if (ranks.size() != setup_.tp)
      fail("a " + std::string(channel_name(t.channel)) + " terminal for generation " +
           std::to_string(t.id.generation) + " before every rank reported");
    if (t.ok() && ok_ranks.size() != setup_.tp)
      fail("a successful " + std::string(channel_name(t.channel)) + " terminal for generation " +
           std::to_string(t.id.generation) + " that not every rank saved");
  }

  // A committed sidecar holds the state at exactly its boundary, on every rank that stores it
  // (a rank's copy may be evicted, or corrupt: then a load fails, which is checked there).
  void check_sidecars(const OpInfo& op) {
    if (!op.slot || !op.prompt) return;
    Req shadow;
    shadow.prompt = op.prompt;
    suspend(true);
    for (std::uint32_t r = 0; r < setup_.tp; ++r) {
      Worker& w = *sim_->workers[r];
      auto& lay = *sim_->layouts[r];
      const auto scratch = static_cast<std::int32_t>(sim_->o_.num_slots - 1);
      auto codec = require_value(lay.slot_codec(SlotIdentity{op.slot->tokens, op.slot->key.lo, setup_.tp, r}));
      auto dst = require_value(lay.slot_regions(scratch));
      LoadItem item{w.slot_key(*op.slot), dst};
      LoadResult res;
      require_ok(w.with_stack([&](TierStack& s) { return s.load(std::span(&item, 1), *codec, std::span(&res, 1)); }));
      if (!res.status.is_ok()) continue;
      const std::uint64_t got = require_value(digest_slot(lay, scratch));
      if (got != expected_digest(r, shadow, op.slot->tokens))
        fail("rank " + std::to_string(r) + "'s committed sidecar of boundary " +
             std::to_string(op.slot->tokens) + " does not hold the state at that boundary");
    }
    suspend(false);
  }
  void suspend(bool on) {
    std::lock_guard<std::mutex> lock(faults_.mu);
    faults_.suspended = on;
  }

  void check_restored_now(Req& r, std::uint64_t tokens) {
    const auto keys = chunk_keys(config_.page_namespace, *r.prompt, config_.block_tokens, true);
    for (std::uint32_t rank = 0; rank < setup_.tp; ++rank) {
      auto& lay = *sim_->layouts[rank];
      for (std::uint64_t b = 0; b < tokens / config_.block_tokens; ++b) {
        const auto got = require_value(digest_block(lay, r.blocks[b]));
        require_ok(fill_block(lay, r.blocks[b], keys[b].lo));
        if (got != require_value(digest_block(lay, r.blocks[b])))
          fail("rank " + std::to_string(rank) + ": block " + std::to_string(b) + " of h" +
               std::to_string(r.h) + " restored wrong");
      }
      if (config_.stateful && r.group >= 0 &&
          require_value(digest_slot(lay, r.group)) != expected_digest(rank, r, tokens))
        fail("rank " + std::to_string(rank) + ": h" + std::to_string(r.h) +
             " resumed at " + std::to_string(tokens) + " with another state than the state at " +
             std::to_string(tokens));
    }
  }

  void release_quarantine() {
    if (quarantine_.empty() && quarantined_groups_.empty()) return;
    for (auto& w : sim_->workers)
      if (w->queued_saves() != 0 || w->queued_loads() != 0) return;
    free_blocks_.insert(free_blocks_.end(), quarantine_.begin(), quarantine_.end());
    free_groups_.insert(free_groups_.end(), quarantined_groups_.begin(), quarantined_groups_.end());
    quarantine_.clear();
    quarantined_groups_.clear();
  }

  // ---- the end of a seed ----
  void quiesce() {
    faults_.quiet();
    setup_.snapshot_fail = 0;
    trace("quiesce: finish every request, run every rank and deliver every report");
    std::vector<SeqHandle> open;
    for (auto& [h, r] : live_)
      if (r.state != Req::State::kFinished) open.push_back(h);
    for (SeqHandle h : open) finish(live_.at(h));
    for (int i = 0; i < 64 && (!live_.empty() || !held_.empty() || busy()); ++i) step(true);
    if (!live_.empty())
      fail(std::to_string(live_.size()) + " requests were never freeable (first: h" +
           std::to_string(live_.begin()->first) + ")");
    for (std::uint32_t r = 0; r < setup_.tp; ++r) {
      if (sim_->workers[r]->active_leases() != 0)
        fail("rank " + std::to_string(r) + " still holds " +
             std::to_string(sim_->workers[r]->active_leases()) + " lookup leases");
      const std::size_t stack_leases =
          sim_->workers[r]->with_stack([](TierStack& s) { return s.active_leases(); });
      if (stack_leases != 0 && !setup_.short_leases)
        fail("rank " + std::to_string(r) + "'s tiers still hold " + std::to_string(stack_leases) +
             " leases");
    }
    check_counters();
  }
  bool busy() const {
    if (sim_->sched->loads_pending() || sim_->sched->saves_pending()) return true;
    for (auto& w : sim_->workers)
      if (w->queued_saves() || w->queued_loads()) return true;
    return false;
  }
  void check_counters() {
    const EngineCounters& c = sim_->sched->counters();
    auto eq = [&](const char* name, std::uint64_t got, std::uint64_t want) {
      if (got != want)
        fail(std::string("counter ") + name + " is " + std::to_string(got) + ", the model counted " +
             std::to_string(want));
    };
    eq("load_requests", c.load_requests.get(), model_.loads_ok);
    eq("load_failures", c.load_failures.get(), model_.loads_failed);
    eq("loaded_tokens", c.loaded_tokens.get(), model_.loaded_tokens);
    eq("save_requests", c.save_requests.get(), model_.saves_done);
    eq("saves emitted = save_requests", model_.saves_emitted, model_.saves_done);
    eq("saved_tokens", c.saved_tokens.get(), model_.saved_tokens);
    eq("slot_commits", c.slot_commits.get(), model_.slot_commits);
    eq("slot_save_failures", c.slot_save_failures.get(), model_.slot_failures);
    eq("loads_pending", sim_->sched->loads_pending(), 0);
    eq("saves_pending", sim_->sched->saves_pending(), 0);
    eq("aggregator pending", sim_->sched->aggregator().pending(), 0);
    for (std::uint32_t r = 0; r < setup_.tp; ++r) {
      const WorkerCounters& w = sim_->workers[r]->counters();
      eq("worker loads_ok + loads_failed", w.loads_ok.get() + w.loads_failed.get(), submitted_[r].first);
      eq("worker saves_ok + saves_failed", w.saves_ok.get() + w.saves_failed.get(), submitted_[r].second);
    }
  }

  struct Tally {
    std::uint64_t loads_emitted = 0, loads_ok = 0, loads_failed = 0, loaded_tokens = 0;
    std::uint64_t saves_emitted = 0, saves_done = 0, saved_tokens = 0;
    std::uint64_t slot_commits = 0, slot_failures = 0;
  };

  std::uint64_t seed_;
  Rng rng_;
  bool verbose_;
  SeedSetup setup_;
  Faults faults_;
  EngineConfig config_;
  std::unique_ptr<SimEngine> sim_;
  std::map<std::uint64_t, std::shared_ptr<std::vector<std::uint32_t>>> docs_;
  std::vector<std::uint32_t> free_blocks_, quarantine_;
  std::vector<std::int32_t> free_groups_, quarantined_groups_;
  std::map<SeqHandle, Req> live_;
  std::map<std::uint64_t, OpInfo> ops_;
  std::map<std::uint64_t, int> save_channels_;
  std::set<std::uint64_t> generations_;
  std::set<std::pair<int, std::uint64_t>> terminals_;
  std::map<std::pair<int, std::uint64_t>, std::vector<OpReport>> delivered_;
  std::vector<OpReport> held_;
  std::vector<std::pair<int, Boundary>> known_keys_;  // 0 chunk, 1 sidecar, 2 commit record
  std::vector<std::pair<std::uint64_t, std::uint64_t>> submitted_;  // per rank: loads, saves
  std::uint32_t epoch_ = 0;
  Tally model_;
  std::vector<std::string> trace_;
};

// SimEngine's REQUIREs run outside a doctest test case here: a failure is an exception.
void on_assert(const doctest::AssertData& ad) {
  std::ostringstream o;
  o << ad.m_file << ":" << ad.m_line << ": " << ad.m_expr;
  if (ad.m_decomp.size()) o << " (" << ad.m_decomp.c_str() << ")";
  throw Violation("simulated engine check failed: " + o.str());
}

}  // namespace
}  // namespace tier::engine::test

int main(int argc, char** argv) {
  using namespace tier::engine::test;
  std::uint64_t seeds = 200, first = 1;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::uint64_t {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a number");
      return std::stoull(argv[++i]);
    };
    try {
      if (a == "--seeds") {
        seeds = value();
      } else if (a == "--first-seed") {
        first = value();
      } else if (a == "--verbose") {
        verbose = true;
      } else {
        std::fprintf(stderr, "usage: engine_interleavings [--seeds N] [--first-seed S] [--verbose]\n");
        return 2;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "engine_interleavings: %s\n", e.what());
      return 2;
    }
  }
  doctest::Context ctx;
  ctx.setAsDefaultForAssertsOutOfTestCases();
  ctx.setAssertHandler(on_assert);
  tier::Registry::global();
  std::uint64_t violations = 0;
  std::optional<std::uint64_t> first_bad;
  for (std::uint64_t s = first; s < first + seeds; ++s) {
    if (verbose) std::printf("seed %llu\n", static_cast<unsigned long long>(s));
    Simulation sim(s, verbose);
    try {
      sim.run();
    } catch (const std::exception& e) {
      ++violations;
      tier::test::fault_control().reset();
      if (!first_bad) {
        first_bad = s;
        std::printf("VIOLATION at seed %llu: %s\ntrace (replay: --first-seed %llu --seeds 1 --verbose):\n",
                    static_cast<unsigned long long>(s), e.what(), static_cast<unsigned long long>(s));
        const auto& t = sim.trace_lines();
        const std::size_t from = t.size() > 60 ? t.size() - 60 : 0;
        if (from > 0) std::printf("  ... (%zu earlier lines)\n", from);
        for (std::size_t i = from; i < t.size(); ++i) std::printf("  %s\n", t[i].c_str());
      } else {
        std::printf("VIOLATION at seed %llu: %s\n", static_cast<unsigned long long>(s), e.what());
      }
    }
    tier::test::fault_control().reset();
  }
  std::printf("%llu seeds, %llu violations\n", static_cast<unsigned long long>(seeds),
              static_cast<unsigned long long>(violations));
  return violations == 0 ? 0 : 1;
}
