// tierbench replay --engine dsv4 --preset NAME: every trace request goes through the offload
// engine as an inference engine would drive it: add_request, lookup, after_alloc, the load (if
// any), a chunked prefill cut at SLOT boundaries with a step per chunk (build_step -> every
// rank's Worker -> process), and finish. PAGE chunks are real DSV4 PAGE images and every
// committed boundary has a real AOS1 SLOT sidecar, from a DSV4 geometry scaled down to
// --block-bytes when the preset's blocks are larger. Restores are checked bit for bit.
// --kv-memory device puts every rank's KV memory on a GPU, so PAGE chunks and SLOT sidecars are
// saved from and restored into device memory through the GPU copy executor.
#include "replay_engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "bench_util.hpp"
#include "tier/dsv4/geometry.hpp"
#include "tier/dsv4/kv_layout.hpp"
#include "kv_content.hpp"
#include "tier/engine/export.hpp"
#include "tier/engine/scheduler.hpp"
#include "tier/engine/worker.hpp"
#include "tier/options.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "workload.hpp"

namespace tier::bench {
namespace {

using engine::LoadAction;
using engine::RequestId;
using engine::SeqHandle;

// The tokens of a trace request: each hash id stands for kTraceBlockTokens tokens derived from
// the id, so equal leading ids give equal prefixes (and equal chain keys).
std::vector<std::uint32_t> synth_tokens(const Request& r) {
  std::vector<std::uint32_t> t;
  t.reserve(r.blocks.size() * kTraceBlockTokens);
  for (std::uint32_t id : r.blocks)
    for (std::uint32_t j = 0; j < kTraceBlockTokens; ++j)
      t.push_back(static_cast<std::uint32_t>((id * 2654435761u) ^ (j * 40503u + 0x9E37u)));
  if (r.input_tokens > 0 && r.input_tokens < t.size()) t.resize(r.input_tokens);
  return t;
}

// The command line of `replay --engine`.
struct EngineArgs {
  std::optional<std::string> profile_path, trace;
  std::string preset, interval, kv_memory;
  std::uint64_t block_bytes, limit, sessions, tp, chunk_tokens, min_load, prefill_chunk, device;
  std::uint64_t lease_timeout_ms;
  bool json;
};

EngineArgs read_args(cli::Args& args) {
  EngineArgs a;
  a.profile_path = args.get("profile");
  a.trace = args.get("trace");
  a.preset = args.get_or("preset", "v4-pro-fp8");
  a.block_bytes = args.size("block-bytes", 1, 1ull << 40).value_or(16 * 1024);
  a.limit = args.uint("limit").value_or(0);
  a.sessions = args.uint("sessions", 1, 1 << 24).value_or(400);
  a.tp = args.uint("tp", 1, 1024).value_or(1);
  a.interval = args.get_or("interval", "8192");
  a.chunk_tokens = args.uint("chunk-tokens", 1, 1 << 24).value_or(512);
  a.min_load = args.uint("min-load-tokens", 0, 1ull << 32).value_or(512);
  a.prefill_chunk = args.uint("prefill-chunk", 1, 1ull << 32).value_or(8192);
  a.kv_memory = args.get_or("kv-memory", "host");
  a.device = args.uint("device", 0, 1023).value_or(0);
  a.lease_timeout_ms =
      args.uint("lease-timeout-ms", 0, 3'600'000).value_or(engine::EngineConfig{}.lease_timeout_ms);
  a.json = args.flag("json");
  args.finish();
  return a;
}

constexpr const char* kUsage =
    "usage: tierbench replay --engine dsv4 --profile P [--preset NAME] "
    "[--trace FILE] [--block-bytes B] [--tp N] [--interval N|0|-1] "
    "[--chunk-tokens N] [--min-load-tokens N] [--prefill-chunk N] [--limit N] "
    "[--kv-memory host|device] [--device N] [--lease-timeout-ms N (0: no leases)] [--json]";

struct PromptTokens {
  std::uint64_t max = 0;    // the longest prompt
  std::uint64_t total = 0;  // every prompt
};

PromptTokens count_prompt_tokens(const std::vector<Request>& requests) {
  PromptTokens p;
  for (const auto& r : requests) {
    const std::uint64_t n = std::min<std::uint64_t>(
        r.input_tokens ? r.input_tokens : r.blocks.size() * kTraceBlockTokens,
        r.blocks.size() * kTraceBlockTokens);
    p.max = std::max(p.max, n);
    p.total += n;
  }
  return p;
}

// The engine's configuration from the command line (without its page namespace, which names
// the geometry). `interval` is --interval parsed.
engine::EngineConfig engine_config(const EngineArgs& a, std::int64_t interval) {
  engine::EngineConfig cfg;
  cfg.block_tokens = 256;  // the V4 block
  cfg.chunk_tokens = static_cast<std::uint32_t>(a.chunk_tokens);
  cfg.checkpoint_interval_tokens = interval;
  cfg.min_load_tokens = a.min_load;
  cfg.tp_size = static_cast<std::uint32_t>(a.tp);
  cfg.max_pending_saves = 4;
  cfg.lease_timeout_ms = a.lease_timeout_ms;
  return cfg;
}

// A DSV4 geometry and what was done to fit it into --block-bytes.
struct ScaledGeometry : dsv4::Geometry {
  std::string note;  // "full size", or what was scaled down
};

// The preset's geometry, scaled so a block's PAGE bytes fit `block_bytes` (0: no scaling):
// fewer layers first (the preset's leading ratios, at least one CSA and one HCA layer), then
// narrower heads.
Result<ScaledGeometry> scaled_geometry(const std::string& preset, std::uint64_t block_bytes,
                                       std::uint64_t num_blocks, std::uint64_t num_slots) {
  TIER_ASSIGN_OR_RETURN(dsv4::ModelConfig m, dsv4::preset(preset));
  m.num_blocks = num_blocks;
  m.num_slots = num_slots;
  TIER_ASSIGN_OR_RETURN(dsv4::Geometry g, dsv4::Geometry::compute(m));
  const std::uint64_t full = g.page_bytes_per_block;
  if (block_bytes == 0 || g.page_bytes_per_block <= block_bytes)
    return ScaledGeometry{std::move(g), "full size"};
  auto has = [](const std::vector<int>& r, int v) {
    return std::find(r.begin(), r.end(), v) != r.end();
  };
  const std::vector<int> all = m.compress_ratios;
  for (std::size_t k = all.size(); k > 1; --k) {
    std::vector<int> r(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k - 1));
    if (!has(r, 4) || !has(r, 128)) break;
    dsv4::ModelConfig t = m;
    t.compress_ratios = r;
    auto tg = dsv4::Geometry::compute(t);
    if (!tg) break;
    m = t;
    g = std::move(tg).value();
    if (g.page_bytes_per_block <= block_bytes) break;
  }
  while (g.page_bytes_per_block > block_bytes && m.kv_head_dim > 32) {
    dsv4::ModelConfig t = m;
    t.kv_head_dim /= 2;
    t.rope_head_dim = std::max<std::uint32_t>(8, t.rope_head_dim / 2);
    t.index_head_dim = std::max<std::uint32_t>(16, t.index_head_dim / 2);
    auto tg = dsv4::Geometry::compute(t);
    if (!tg) break;
    m = t;
    g = std::move(tg).value();
  }
  return ScaledGeometry{
      std::move(g),
      fmt::format("scaled from {} per block: {} layers, kv_head_dim {}, rope {}, index {}",
                  format_size(full), m.compress_ratios.size(), m.kv_head_dim, m.rope_head_dim,
                  m.index_head_dim)};
}

// Every rank's tier stack, KV layout and worker (TP workers, run in turn on this thread), and
// the scheduler over them.
struct Ranks {
  std::vector<std::unique_ptr<TierStack>> stacks;
  std::vector<std::unique_ptr<dsv4::Dsv4Layout>> layouts;
  std::vector<std::unique_ptr<engine::Worker>> workers;
  std::unique_ptr<engine::Scheduler> sched;

  std::vector<engine::Worker*> worker_ptrs() const {
    std::vector<engine::Worker*> ws;
    for (const auto& w : workers) ws.push_back(w.get());
    return ws;
  }
};

// `cfg` must outlive the ranks.
Result<Ranks> open_ranks(const std::string& profile_path, const engine::EngineConfig& cfg,
                         const dsv4::Geometry& geometry,
                         const dsv4::Dsv4LayoutOptions& layout_opts) {
  ConfigErrors errors;
  TIER_ASSIGN_OR_RETURN(auto profile, load_profile(profile_path, Registry::global(), &errors));
  Ranks ranks;
  for (std::uint32_t r = 0; r < cfg.tp_size; ++r) {
    TIER_ASSIGN_OR_RETURN(auto stack, TierStack::open(profile));
    ranks.stacks.push_back(std::move(stack));
    TIER_ASSIGN_OR_RETURN(auto layout, dsv4::Dsv4Layout::create(geometry, cfg.page_namespace,
                                                                  cfg.tp_size, r, layout_opts));
    ranks.layouts.push_back(std::move(layout));
    TIER_ASSIGN_OR_RETURN(
        auto worker, engine::Worker::create(cfg, r, *ranks.stacks.back(), *ranks.layouts.back()));
    ranks.workers.push_back(std::move(worker));
  }
  TIER_ASSIGN_OR_RETURN(ranks.sched, engine::Scheduler::create(cfg, *ranks.workers[0]));
  return ranks;
}

struct Figures {  // what the replay itself observed, to compare with the engine's counters
  std::uint64_t load_requests = 0, loaded_tokens = 0, load_failures = 0;
  std::uint64_t save_requests = 0, saved_tokens = 0;
};

// What a whole replay observed.
struct ReplayResult {
  Figures fig;
  std::uint64_t wrong_data = 0, checked_blocks = 0;
  double seconds = 0;
};

// Drives every request through the engine as an inference engine would: add_request, lookup,
// after_alloc, the load (if any) and its check, a chunked prefill cut at SLOT boundaries with a
// step per chunk, and finish. The KV a forward pass writes is a function of the prefix
// (kv_content.hpp), so restores are checked bit for bit.
class EngineReplay {
 public:
  EngineReplay(const engine::EngineConfig& cfg, Ranks& ranks, std::uint64_t num_blocks,
               std::uint64_t prefill_chunk)
      : cfg_(cfg), ranks_(ranks), sched_(*ranks.sched), prefill_chunk_(prefill_chunk) {
    for (std::uint32_t b = 0; b < num_blocks; ++b) free_blocks_.push_back(b);
  }

  // Runs request `id`. Errors: the lookup's. A failed write into the KV memory is kv_error().
  Status run_request(RequestId id, const Request& r) {
    const auto prompt = synth_tokens(r);
    const SeqHandle h = sched_.add_request(id, prompt);
    auto m = sched_.lookup(h);
    if (!m) return m.status();
    const Owned o = allocate(h, (prompt.size() + cfg_.block_tokens - 1) / cfg_.block_tokens);
    const auto block_keys = chunk_keys(cfg_.page_namespace, prompt, cfg_.block_tokens, true);
    auto d = sched_.after_alloc(h, 0, o.blocks, o.group);
    std::uint64_t computed = 0;
    if (d.action == LoadAction::kLoad) computed = load(h, d, o, block_keys);
    prefill(h, o, prompt.size(), computed, block_keys);
    finish(h);
    return Status::ok();
  }

  // Steps until no save or load is pending.
  void drain() {
    while (sched_.saves_pending() > 0 || sched_.loads_pending() > 0) step();
  }

  // The first failed write into the KV memory (a forward pass), which ends the replay.
  const Status& kv_error() const { return kv_error_; }
  ReplayResult result() const { return {fig_, wrong_data_, checked_blocks_, 0}; }

 private:
  struct Owned {
    std::vector<std::uint32_t> blocks;
    std::int32_t group;
  };

  // Takes `nb` free blocks and a free state group for `h`.
  const Owned& allocate(SeqHandle h, std::uint64_t nb) {
    Owned o{std::vector<std::uint32_t>(free_blocks_.begin(),
                                       free_blocks_.begin() + static_cast<std::ptrdiff_t>(nb)),
            free_groups_.front()};
    free_blocks_.erase(free_blocks_.begin(),
                       free_blocks_.begin() + static_cast<std::ptrdiff_t>(nb));
    free_groups_.erase(free_groups_.begin());
    return owned_[h] = std::move(o);
  }

  void release(SeqHandle h) {
    auto it = owned_.find(h);
    if (it == owned_.end()) return;
    free_blocks_.insert(free_blocks_.end(), it->second.blocks.begin(), it->second.blocks.end());
    free_groups_.push_back(it->second.group);
    owned_.erase(it);
  }

  // One engine step: plan, every rank, aggregate.
  void step() {
    engine::StepPlan plan = sched_.build_step();
    for (const auto& s : plan.saves) fig_.saved_tokens += s.page_end - s.page_start;
    fig_.save_requests += plan.saves.size();
    std::vector<engine::OpReport> reports;
    for (auto& w : ranks_.workers) {
      w->submit(plan);
      w->progress();
      auto rs = w->take_reports();
      reports.insert(reports.end(), rs.begin(), rs.end());
    }
    auto ev = sched_.process(reports);
    for (SeqHandle h : ev.freeable) release(h);
    for (SeqHandle h : ev.loaded) {
      loaded_.push_back(h);
      ++fig_.load_requests;
      fig_.loaded_tokens += load_ranges_[h].second - load_ranges_[h].first;
    }
    for (SeqHandle h : ev.load_failed) {
      failed_.push_back(h);
      ++fig_.load_failures;
    }
  }

  // Steps until the load of `h` ends; returns the tokens it restored (checked), or 0.
  std::uint64_t load(SeqHandle h, const engine::LoadDecision& d, const Owned& o,
                     const std::vector<Key128>& block_keys) {
    load_ranges_[h] = {d.load_start, d.load_end};
    loaded_.clear();
    failed_.clear();
    for (int k = 0; k < 4 && loaded_.empty() && failed_.empty(); ++k) step();
    if (loaded_.empty()) return 0;
    check_restored(o, d.load_end, block_keys);
    return d.load_end;
  }

  // Bit-exact: the restored state group and the first and last restored blocks, on every rank.
  void check_restored(const Owned& o, std::uint64_t computed,
                      const std::vector<Key128>& block_keys) {
    const std::uint64_t bt = cfg_.block_tokens;
    for (auto& lay : ranks_.layouts) {
      const auto got = engine::test::digest_slot(*lay, o.group);
      write_kv(engine::test::fill_slot(*lay, 2, block_keys[computed / bt - 1].lo));
      wrong_data_ += same(got, engine::test::digest_slot(*lay, 2)) ? 0 : 1;
      for (std::uint64_t b : {std::uint64_t{0}, computed / bt - 1}) {
        const auto g = engine::test::digest_block(*lay, o.blocks[b]);
        write_kv(engine::test::fill_block(*lay, o.blocks[b], block_keys[b].lo));
        wrong_data_ += same(g, engine::test::digest_block(*lay, o.blocks[b])) ? 0 : 1;
        ++checked_blocks_;
      }
    }
  }

  // Prefills tokens [computed, prompt_tokens), cut at SLOT boundaries, a step per chunk; the KV
  // written is a function of the prefix.
  void prefill(SeqHandle h, const Owned& o, std::uint64_t prompt_tokens, std::uint64_t computed,
               const std::vector<Key128>& block_keys) {
    const std::uint64_t bt = cfg_.block_tokens;
    while (computed < prompt_tokens) {
      std::uint64_t n = std::min<std::uint64_t>(prefill_chunk_, prompt_tokens - computed);
      n = sched_.cut_prefill_chunk(h, computed, n);
      const std::uint64_t end = computed + n;
      for (auto& lay : ranks_.layouts) {
        for (std::uint64_t b = computed / bt; b < (end + bt - 1) / bt; ++b)
          write_kv(engine::test::fill_block(*lay, o.blocks[b], block_keys[b].lo));
        if (end % bt == 0)
          write_kv(engine::test::fill_slot(*lay, o.group, block_keys[end / bt - 1].lo));
      }
      computed = end;
      sched_.on_computed(h, computed);
      step();
    }
  }

  // Ends `h`; its blocks are freed now or by idle steps once its saves are done.
  void finish(SeqHandle h) {
    if (!sched_.finish(h)) {
      for (int k = 0; k < 16 && owned_.count(h); ++k) step();  // idle steps
    } else {
      release(h);
    }
  }

  void write_kv(Status st) {
    if (!st.is_ok() && kv_error_.is_ok()) kv_error_ = std::move(st);
  }
  // A restored unit is right when its digest equals the digest after rewriting the expected
  // content; an unreadable unit counts as wrong.
  static bool same(const Result<std::uint64_t>& got, const Result<std::uint64_t>& want) {
    return got.is_ok() && want.is_ok() && *got == *want;
  }

  const engine::EngineConfig& cfg_;
  Ranks& ranks_;
  engine::Scheduler& sched_;
  const std::uint64_t prefill_chunk_;
  Figures fig_;
  std::uint64_t wrong_data_ = 0, checked_blocks_ = 0;
  Status kv_error_;
  std::vector<std::uint32_t> free_blocks_;
  std::vector<std::int32_t> free_groups_ = {0, 1};  // group 2 is the check's scratch
  std::map<SeqHandle, Owned> owned_;
  std::map<SeqHandle, std::pair<std::uint64_t, std::uint64_t>> load_ranges_;
  std::vector<SeqHandle> loaded_, failed_;
};

// What the report shows besides the engine's and the replay's figures.
struct ReportContext {
  const std::string& engine_name;
  const std::string& preset;
  const ScaledGeometry& geometry;
  const engine::EngineConfig& cfg;
  const dsv4::Dsv4LayoutOptions& layout_opts;
  std::size_t requests;
  std::uint64_t prompt_tokens;
};

Json tier_figures(const Ranks& ranks) {
  Json tiers = Json::object();
  for (std::uint32_t r = 0; r < ranks.stacks.size(); ++r) {
    TierStack& stack = *ranks.stacks[r];
    auto loaded_by = ranks.workers[r]->loaded_bytes_by_tier();
    for (std::size_t t = 0; t < stack.tier_count(); ++t) {
      const TierMetrics& tm = stack.tier(t).metrics();
      Usage u = stack.tier(t).usage();
      tiers[fmt::format("rank{}/{}", r, stack.spec(t).name)] = {
          {"bytes_read", tm.of(Op::kGet).bytes.get()},
          {"bytes_written", tm.of(Op::kPut).bytes.get()},
          {"engine_loaded_bytes", loaded_by[t]},
          {"objects", u.objects},
          {"used_bytes", u.used_bytes},
          {"evictions", tm.evictions.get()},
          {"leases", tm.leases.get()},
          {"lease_releases", tm.lease_releases.get()},
          {"lease_expiries", tm.lease_expiries.get()}};
    }
  }
  return tiers;
}

// The replay's figures and whether they equal the engine's counters.
bool counters_agree(const engine::Scheduler& sched, const Figures& fig) {
  const auto& c = sched.counters();
  return c.load_requests.get() == fig.load_requests && c.loaded_tokens.get() == fig.loaded_tokens &&
         c.load_failures.get() == fig.load_failures && c.save_requests.get() == fig.save_requests &&
         c.saved_tokens.get() == fig.saved_tokens;
}

Json report_json(const ReportContext& ctx, const Ranks& ranks, const ReplayResult& res) {
  const Figures& fig = res.fig;
  const std::uint64_t prompt_tokens = ctx.prompt_tokens;
  const auto& c = ranks.sched->counters();
  return {
      {"engine", ctx.engine_name},
      {"preset", ctx.preset},
      {"geometry", ctx.geometry.note},
      {"kv_memory", ctx.layout_opts.to_json()},
      {"page_bytes_per_block", ctx.geometry.page_bytes_per_block},
      {"slot_bytes", ctx.geometry.slot_bytes},
      {"requests", ctx.requests},
      {"prompt_tokens", prompt_tokens},
      {"seconds", res.seconds},
      {"hit_rate", prompt_tokens ? static_cast<double>(fig.loaded_tokens) / prompt_tokens : 0.0},
      {"page_hit_rate",
       prompt_tokens ? static_cast<double>(c.page_hit_tokens.get()) / prompt_tokens : 0.0},
      {"replay",
       {{"load_requests", fig.load_requests},
        {"loaded_tokens", fig.loaded_tokens},
        {"load_failures", fig.load_failures},
        {"save_requests", fig.save_requests},
        {"saved_tokens", fig.saved_tokens}}},
      {"counters_agree", counters_agree(*ranks.sched, fig)},
      {"wrong_data", res.wrong_data},
      {"checked_blocks", res.checked_blocks},
      {"config", ctx.cfg.to_json()},
      {"tiers", tier_figures(ranks)},
      {"metrics", engine::metrics_json(*ranks.sched, ranks.worker_ptrs())}};
}

void print_report(const ReportContext& ctx, const Json& out) {
  const Json& e = out["metrics"]["engine"];
  fmt::print("replay --engine dsv4 ({}; {}): {} requests, {} prompt tokens, TP {}, {:.1f} s\n",
             ctx.preset, ctx.geometry.note, ctx.requests, ctx.prompt_tokens, ctx.cfg.tp_size,
             out["seconds"].get<double>());
  fmt::print(
      "PAGE {} per 256-token block, SLOT {} per boundary; chunk {} tokens, interval {}; KV in "
      "{}\n",
      format_size(ctx.geometry.page_bytes_per_block), format_size(ctx.geometry.slot_bytes),
      ctx.cfg.chunk_tokens, ctx.cfg.checkpoint_interval_tokens,
      ctx.layout_opts.memory == dsv4::KvMemoryKind::kDevice
          ? fmt::format("GPU {} memory", ctx.layout_opts.device)
          : std::string("host memory"));
  fmt::print("hit rate {:.2f}% (loaded tokens / prompt tokens); PAGE prefix found {:.2f}%\n",
             100 * out["hit_rate"].get<double>(), 100 * out["page_hit_rate"].get<double>());
  fmt::print("{:<16} {:>14} {:>14}\n", "counter", "engine", "replay");
  for (const char* k :
       {"load_requests", "loaded_tokens", "load_failures", "save_requests", "saved_tokens"})
    fmt::print("{:<16} {:>14} {:>14}\n", k, e[k].get<std::uint64_t>(),
               out["replay"][k].get<std::uint64_t>());
  fmt::print("{:<16} {:>14}\n{:<16} {:>14}\n", "loads_pending",
             e["loads_pending"].get<std::uint64_t>(), "saves_pending",
             e["saves_pending"].get<std::uint64_t>());
  std::string reasons;
  for (auto& [reason, n] : e["load_failure_reasons"].items())
    reasons += fmt::format("{}{} {}", reasons.empty() ? "" : ", ", reason, n.get<std::uint64_t>());
  fmt::print("load failures by reason: {}\n", reasons.empty() ? "none" : reasons);
  fmt::print(
      "lookup leases: {} hits leased, {} shortfalls, {} committed boundaries without their sidecar "
      "(passed over at lookup); lease timeout {} ms\n",
      e["leased_lookups"].get<std::uint64_t>(), e["lease_shortfalls"].get<std::uint64_t>(),
      e["sidecars_missing"].get<std::uint64_t>(), ctx.cfg.lease_timeout_ms);
  fmt::print("slot commits {}, SLOT save failures {}, decommits {}, commits rediscovered {}\n",
             e["slot_commits"].get<std::uint64_t>(), e["slot_save_failures"].get<std::uint64_t>(),
             e["decommits"].get<std::uint64_t>(), e["commits_rediscovered"].get<std::uint64_t>());
  fmt::print("{:<12} {:>12} {:>12} {:>14} {:>10} {:>10} {:>8} {:>8} {:>8}\n", "tier", "read",
             "written", "engine loaded", "objects", "evictions", "leases", "released", "expired");
  for (auto& [name, t] : out["tiers"].items())
    fmt::print("{:<12} {:>12} {:>12} {:>14} {:>10} {:>10} {:>8} {:>8} {:>8}\n", name,
               format_size(t["bytes_read"].get<std::uint64_t>()),
               format_size(t["bytes_written"].get<std::uint64_t>()),
               format_size(t["engine_loaded_bytes"].get<std::uint64_t>()),
               t["objects"].get<std::uint64_t>(), t["evictions"].get<std::uint64_t>(),
               t["leases"].get<std::uint64_t>(), t["lease_releases"].get<std::uint64_t>(),
               t["lease_expiries"].get<std::uint64_t>());
  fmt::print(
      "counters agree with the replay: {}; restores checked {} blocks + slots, wrong "
      "data {}\n",
      out["counters_agree"].get<bool>() ? "yes" : "NO", out["checked_blocks"].get<std::uint64_t>(),
      out["wrong_data"].get<std::uint64_t>());
}

}  // namespace

int run_replay_engine(cli::Args& args, const std::string& engine_name) {
  const EngineArgs a = read_args(args);
  if (engine_name != "dsv4") return cli::fail("--engine: only \"dsv4\" exists", 2);
  if (!a.profile_path) return cli::fail(kUsage, 2);
  if (a.tp == 0 || a.tp > 64) return cli::fail("--tp must be in [1, 64]", 2);
  auto layout_opts =
      dsv4::Dsv4LayoutOptions::from_json(Json{{"memory", a.kv_memory}, {"device", a.device}});
  if (!layout_opts)
    return cli::fail(fmt::format("--kv-memory {} --device {}: {}", a.kv_memory, a.device,
                                 layout_opts.status().message()),
                     2);

  auto workload = load_workload(a.trace, a.limit, a.sessions);
  if (!workload) return cli::fail(workload.status().to_string());
  const std::vector<Request> requests = std::move(workload).value();
  const PromptTokens prompts = count_prompt_tokens(requests);

  std::int64_t interval = 0;
  try {
    interval = std::stoll(a.interval);
  } catch (...) {
    return cli::fail("--interval: expected an integer (N > 0, 0 or -1)", 2);
  }
  engine::EngineConfig cfg = engine_config(a, interval);
  auto ok = cfg.validate();
  if (!ok.is_ok()) return cli::fail(ok.to_string(), 2);

  // Two requests' worth of blocks (one finishing while the next starts) and a scratch group.
  const std::uint64_t blocks_per_req = (prompts.max + cfg.block_tokens - 1) / cfg.block_tokens;
  const std::uint64_t num_blocks = 2 * blocks_per_req + 1;
  auto geometry = scaled_geometry(a.preset, a.block_bytes, num_blocks, 3);
  if (!geometry) return cli::fail(geometry.status().to_string());
  // The namespace names the model's identity only, never the pool sizes, so a resized pool still
  // finds every stored object (reference flaw 2).
  Json model = geometry->config.to_json();
  model.erase("num_blocks");
  model.erase("num_slots");
  cfg.page_namespace = *namespace_id(Json{{"workload", "tierbench-replay-engine"},
                                          {"model", model},
                                          {"block_tokens", cfg.block_tokens},
                                          {"chunk_tokens", cfg.chunk_tokens},
                                          {"tp_size", cfg.tp_size}});

  auto ranks = open_ranks(*a.profile_path, cfg, *geometry, *layout_opts);
  if (!ranks) return cli::fail(ranks.status().to_string());
  EngineReplay replay(cfg, *ranks, num_blocks, a.prefill_chunk);
  std::unique_ptr<cli::Progress> bar;
  if (!a.json) bar = std::make_unique<cli::Progress>("replay (engine)", requests.size());
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (Status st = replay.run_request(i, requests[i]); !st.is_ok())
      return cli::fail(st.to_string());
    if (!replay.kv_error().is_ok()) return cli::fail("KV memory: " + replay.kv_error().to_string());
    if (bar) bar->update(i + 1);
  }
  replay.drain();
  for (auto& s : ranks->stacks) s->flush(std::chrono::seconds(60)).ignore();
  ReplayResult res = replay.result();
  res.seconds = seconds_since(t0);
  bar.reset();

  const ReportContext ctx{engine_name,  a.preset,        *geometry,    cfg,
                          *layout_opts, requests.size(), prompts.total};
  const Json out = report_json(ctx, *ranks, res);
  if (a.json) {
    fmt::print("{}\n", tier::json_text(out));
  } else {
    print_report(ctx, out);
  }
  return out["counters_agree"].get<bool>() && res.wrong_data == 0 ? 0 : 1;
}

}  // namespace tier::bench
