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
#include <cstring>
#include <map>

#include "bench_util.hpp"
#include "dsv4/geometry.hpp"
#include "tier/engine/dsv4_layout.hpp"
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

// The preset's geometry, scaled so a block's PAGE bytes fit `block_bytes` (0: no scaling):
// fewer layers first (the preset's leading ratios, at least one CSA and one HCA layer), then
// narrower heads.
Result<dsv4::Geometry> scaled_geometry(const std::string& preset, std::uint64_t block_bytes,
                                       std::uint64_t num_blocks, std::uint64_t num_slots,
                                       std::string* note) {
  TIER_ASSIGN_OR_RETURN(dsv4::ModelConfig m, dsv4::preset(preset));
  m.num_blocks = num_blocks;
  m.num_slots = num_slots;
  TIER_ASSIGN_OR_RETURN(dsv4::Geometry g, dsv4::Geometry::compute(m));
  const std::uint64_t full = g.page_bytes_per_block;
  if (block_bytes == 0 || g.page_bytes_per_block <= block_bytes) {
    *note = "full size";
    return g;
  }
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
  *note = fmt::format("scaled from {} per block: {} layers, kv_head_dim {}, rope {}, index {}",
                      format_size(full), m.compress_ratios.size(), m.kv_head_dim, m.rope_head_dim,
                      m.index_head_dim);
  return g;
}

struct Figures {  // what the replay itself observed, to compare with the engine's counters
  std::uint64_t load_requests = 0, loaded_tokens = 0, load_failures = 0;
  std::uint64_t save_requests = 0, saved_tokens = 0;
};

}  // namespace

int run_replay_engine(cli::Args& args, const std::string& engine_name) {
  auto profile_path = args.get("profile");
  auto trace = args.get("trace");
  const std::string preset = args.get_or("preset", "v4-pro-fp8");
  const std::uint64_t block_bytes = args.size("block-bytes").value_or(16 * 1024);
  const std::uint64_t limit = args.uint("limit").value_or(0);
  const std::uint64_t sessions = args.uint("sessions").value_or(400);
  const std::uint64_t tp = args.uint("tp").value_or(1);
  const std::string interval = args.get_or("interval", "8192");
  const std::uint64_t chunk_tokens = args.uint("chunk-tokens").value_or(512);
  const std::uint64_t min_load = args.uint("min-load-tokens").value_or(512);
  const std::uint64_t prefill_chunk = args.uint("prefill-chunk").value_or(8192);
  const std::string kv_memory = args.get_or("kv-memory", "host");
  const std::uint64_t device = args.uint("device").value_or(0);
  const bool json = args.flag("json");
  args.finish();
  if (engine_name != "dsv4") return cli::fail("--engine: only \"dsv4\" exists", 2);
  if (!profile_path)
    return cli::fail(
        "usage: tierbench replay --engine dsv4 --profile P [--preset NAME] "
        "[--trace FILE] [--block-bytes B] [--tp N] [--interval N|0|-1] "
        "[--chunk-tokens N] [--min-load-tokens N] [--prefill-chunk N] [--limit N] "
        "[--kv-memory host|device] [--device N] [--json]",
        2);
  if (tp == 0 || tp > 64) return cli::fail("--tp must be in [1, 64]", 2);
  auto layout_opts =
      engine::Dsv4LayoutOptions::from_json(Json{{"memory", kv_memory}, {"device", device}});
  if (!layout_opts)
    return cli::fail(fmt::format("--kv-memory {} --device {}: {}", kv_memory, device,
                                 layout_opts.status().message()),
                     2);

  auto workload = load_workload(trace, limit, sessions);
  if (!workload) return cli::fail(workload.status().to_string());
  std::vector<Request> requests = std::move(workload).value();
  std::uint64_t max_tokens = 0, prompt_tokens = 0;
  for (const auto& r : requests) {
    const std::uint64_t n = std::min<std::uint64_t>(
        r.input_tokens ? r.input_tokens : r.blocks.size() * kTraceBlockTokens,
        r.blocks.size() * kTraceBlockTokens);
    max_tokens = std::max(max_tokens, n);
    prompt_tokens += n;
  }

  engine::EngineConfig cfg;
  cfg.block_tokens = 256;  // the V4 block
  cfg.chunk_tokens = static_cast<std::uint32_t>(chunk_tokens);
  try {
    cfg.checkpoint_interval_tokens = std::stoll(interval);
  } catch (...) {
    return cli::fail("--interval: expected an integer (N > 0, 0 or -1)", 2);
  }
  cfg.min_load_tokens = min_load;
  cfg.tp_size = static_cast<std::uint32_t>(tp);
  cfg.max_pending_saves = 4;
  auto ok = cfg.validate();
  if (!ok.is_ok()) return cli::fail(ok.to_string(), 2);

  // Two requests' worth of blocks (one finishing while the next starts) and a scratch group.
  const std::uint64_t blocks_per_req = (max_tokens + cfg.block_tokens - 1) / cfg.block_tokens;
  const std::uint64_t num_blocks = 2 * blocks_per_req + 1;
  std::string note;
  auto geometry = scaled_geometry(preset, block_bytes, num_blocks, 3, &note);
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

  ConfigErrors errors;
  auto profile = load_profile(*profile_path, Registry::global(), &errors);
  if (!profile) return cli::fail(profile.status().to_string());
  std::vector<std::unique_ptr<TierStack>> stacks;
  std::vector<std::unique_ptr<engine::Dsv4Layout>> layouts;
  std::vector<std::unique_ptr<engine::Worker>> workers;
  std::vector<engine::Worker*> wptrs;
  for (std::uint32_t r = 0; r < tp; ++r) {
    auto s = TierStack::open(*profile);
    if (!s) return cli::fail(s.status().to_string());
    stacks.push_back(std::move(s).value());
    auto l =
        engine::Dsv4Layout::create(*geometry, cfg.page_namespace, cfg.tp_size, r, *layout_opts);
    if (!l) return cli::fail(l.status().to_string());
    layouts.push_back(std::move(l).value());
    auto w = engine::Worker::create(cfg, r, *stacks.back(), *layouts.back());
    if (!w) return cli::fail(w.status().to_string());
    workers.push_back(std::move(w).value());
    wptrs.push_back(workers.back().get());
  }
  auto sched_r = engine::Scheduler::create(cfg, *workers[0]);
  if (!sched_r) return cli::fail(sched_r.status().to_string());
  engine::Scheduler& sched = **sched_r;

  Figures fig;
  std::uint64_t wrong_data = 0, checked_blocks = 0;
  // Writes into the KV memory (a forward pass): a failure (device memory) ends the replay.
  Status kv_error;
  auto write_kv = [&](Status st) {
    if (!st.is_ok() && kv_error.is_ok()) kv_error = std::move(st);
  };
  // A restored unit is right when its digest equals the digest after rewriting the expected
  // content; an unreadable unit counts as wrong.
  auto same = [&](const Result<std::uint64_t>& got, const Result<std::uint64_t>& want) {
    return got.is_ok() && want.is_ok() && *got == *want;
  };
  std::vector<std::uint32_t> free_blocks;
  for (std::uint32_t b = 0; b < num_blocks; ++b) free_blocks.push_back(b);
  std::vector<std::int32_t> free_groups = {0, 1};
  struct Owned {
    std::vector<std::uint32_t> blocks;
    std::int32_t group;
  };
  std::map<SeqHandle, Owned> owned;
  std::map<SeqHandle, std::pair<std::uint64_t, std::uint64_t>> load_ranges;
  auto release = [&](SeqHandle h) {
    auto it = owned.find(h);
    if (it == owned.end()) return;
    free_blocks.insert(free_blocks.end(), it->second.blocks.begin(), it->second.blocks.end());
    free_groups.push_back(it->second.group);
    owned.erase(it);
  };
  std::vector<SeqHandle> loaded, failed;
  // One engine step: plan, every rank (TP workers, run in turn on this thread), aggregate.
  auto step = [&]() {
    engine::StepPlan plan = sched.build_step();
    for (const auto& s : plan.saves) fig.saved_tokens += s.page_end - s.page_start;
    fig.save_requests += plan.saves.size();
    std::vector<engine::OpReport> reports;
    for (auto& w : workers) {
      w->submit(plan);
      w->progress();
      auto rs = w->take_reports();
      reports.insert(reports.end(), rs.begin(), rs.end());
    }
    auto ev = sched.process(reports);
    for (SeqHandle h : ev.freeable) release(h);
    for (SeqHandle h : ev.loaded) {
      loaded.push_back(h);
      ++fig.load_requests;
      fig.loaded_tokens += load_ranges[h].second - load_ranges[h].first;
    }
    for (SeqHandle h : ev.load_failed) {
      failed.push_back(h);
      ++fig.load_failures;
    }
  };

  std::unique_ptr<cli::Progress> bar;
  if (!json) bar = std::make_unique<cli::Progress>("replay (engine)", requests.size());
  const auto t0 = Clock::now();
  std::size_t done = 0;
  const std::uint64_t bt = cfg.block_tokens;
  std::vector<Key128> block_keys;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto prompt = synth_tokens(requests[i]);
    const SeqHandle h = sched.add_request(i, prompt);
    auto m = sched.lookup(h);
    if (!m) return cli::fail(m.status().to_string());
    const std::uint64_t nb = (prompt.size() + bt - 1) / bt;
    Owned o{std::vector<std::uint32_t>(free_blocks.begin(),
                                       free_blocks.begin() + static_cast<std::ptrdiff_t>(nb)),
            free_groups.front()};
    free_blocks.erase(free_blocks.begin(), free_blocks.begin() + static_cast<std::ptrdiff_t>(nb));
    free_groups.erase(free_groups.begin());
    owned[h] = o;
    block_keys = chunk_keys(cfg.page_namespace, prompt, bt, true);
    auto d = sched.after_alloc(h, 0, o.blocks, o.group);
    std::uint64_t computed = 0;
    if (d.action == LoadAction::kLoad) {
      load_ranges[h] = {d.load_start, d.load_end};
      loaded.clear();
      failed.clear();
      for (int k = 0; k < 4 && loaded.empty() && failed.empty(); ++k) step();
      if (!loaded.empty()) {
        computed = d.load_end;
        // Bit-exact: the restored state group and the first and last restored blocks.
        for (auto& lay : layouts) {
          const auto got = lay->digest_slot(o.group);
          write_kv(lay->fill_slot(2, block_keys[computed / bt - 1].lo));
          wrong_data += same(got, lay->digest_slot(2)) ? 0 : 1;
          for (std::uint64_t b : {std::uint64_t{0}, computed / bt - 1}) {
            const auto g = lay->digest_block(o.blocks[b]);
            write_kv(lay->fill_block(o.blocks[b], block_keys[b].lo));
            wrong_data += same(g, lay->digest_block(o.blocks[b])) ? 0 : 1;
            ++checked_blocks;
          }
        }
      }
    }
    // Prefill the rest, cut at SLOT boundaries; the KV written is a function of the prefix.
    while (computed < prompt.size()) {
      std::uint64_t n = std::min<std::uint64_t>(prefill_chunk, prompt.size() - computed);
      n = sched.cut_prefill_chunk(h, computed, n);
      const std::uint64_t end = computed + n;
      for (auto& lay : layouts) {
        for (std::uint64_t b = computed / bt; b < (end + bt - 1) / bt; ++b)
          write_kv(lay->fill_block(o.blocks[b], block_keys[b].lo));
        if (end % bt == 0) write_kv(lay->fill_slot(o.group, block_keys[end / bt - 1].lo));
      }
      computed = end;
      sched.on_computed(h, computed);
      step();
    }
    if (!sched.finish(h)) {
      for (int k = 0; k < 16 && owned.count(h); ++k) step();  // idle steps
    } else {
      release(h);
    }
    if (!kv_error.is_ok()) return cli::fail("KV memory: " + kv_error.to_string());
    if (bar) bar->update(++done);
  }
  while (sched.saves_pending() > 0 || sched.loads_pending() > 0) step();
  for (auto& s : stacks) s->flush(std::chrono::seconds(60)).ignore();
  const double seconds = seconds_since(t0);
  bar.reset();

  const auto& c = sched.counters();
  const bool agree =
      c.load_requests.get() == fig.load_requests && c.loaded_tokens.get() == fig.loaded_tokens &&
      c.load_failures.get() == fig.load_failures && c.save_requests.get() == fig.save_requests &&
      c.saved_tokens.get() == fig.saved_tokens;
  Json metrics = engine::metrics_json(sched, wptrs);
  Json tiers = Json::object();
  for (std::uint32_t r = 0; r < tp; ++r) {
    auto loaded_by = workers[r]->loaded_bytes_by_tier();
    for (std::size_t t = 0; t < stacks[r]->tier_count(); ++t) {
      const TierMetrics& tm = stacks[r]->tier(t).metrics();
      Usage u = stacks[r]->tier(t).usage();
      tiers[fmt::format("rank{}/{}", r, stacks[r]->spec(t).name)] = {
          {"bytes_read", tm.of(Op::kGet).bytes.get()},
          {"bytes_written", tm.of(Op::kPut).bytes.get()},
          {"engine_loaded_bytes", loaded_by[t]},
          {"objects", u.objects},
          {"used_bytes", u.used_bytes},
          {"evictions", tm.evictions.get()}};
    }
  }
  Json out = {
      {"engine", engine_name},
      {"preset", preset},
      {"geometry", note},
      {"kv_memory", layout_opts->to_json()},
      {"page_bytes_per_block", geometry->page_bytes_per_block},
      {"slot_bytes", geometry->slot_bytes},
      {"requests", requests.size()},
      {"prompt_tokens", prompt_tokens},
      {"seconds", seconds},
      {"hit_rate", prompt_tokens ? static_cast<double>(fig.loaded_tokens) / prompt_tokens : 0.0},
      {"page_hit_rate",
       prompt_tokens ? static_cast<double>(c.page_hit_tokens.get()) / prompt_tokens : 0.0},
      {"replay",
       {{"load_requests", fig.load_requests},
        {"loaded_tokens", fig.loaded_tokens},
        {"load_failures", fig.load_failures},
        {"save_requests", fig.save_requests},
        {"saved_tokens", fig.saved_tokens}}},
      {"counters_agree", agree},
      {"wrong_data", wrong_data},
      {"checked_blocks", checked_blocks},
      {"config", cfg.to_json()},
      {"tiers", tiers},
      {"metrics", metrics}};
  if (json) {
    fmt::print("{}\n", out.dump());
  } else {
    const Json& e = metrics["engine"];
    fmt::print("replay --engine dsv4 ({}; {}): {} requests, {} prompt tokens, TP {}, {:.1f} s\n",
               preset, note, requests.size(), prompt_tokens, tp, seconds);
    fmt::print(
        "PAGE {} per 256-token block, SLOT {} per boundary; chunk {} tokens, interval {}; KV in "
        "{}\n",
        format_size(geometry->page_bytes_per_block), format_size(geometry->slot_bytes),
        cfg.chunk_tokens, cfg.checkpoint_interval_tokens,
        layout_opts->memory == engine::KvMemoryKind::kDevice
            ? fmt::format("GPU {} memory", layout_opts->device)
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
    fmt::print("slot commits {}, SLOT save failures {}, decommits {}, commits rediscovered {}\n",
               e["slot_commits"].get<std::uint64_t>(), e["slot_save_failures"].get<std::uint64_t>(),
               e["decommits"].get<std::uint64_t>(), e["commits_rediscovered"].get<std::uint64_t>());
    fmt::print("{:<12} {:>12} {:>12} {:>14} {:>10} {:>10}\n", "tier", "read", "written",
               "engine loaded", "objects", "evictions");
    for (auto& [name, t] : tiers.items())
      fmt::print("{:<12} {:>12} {:>12} {:>14} {:>10} {:>10}\n", name,
                 format_size(t["bytes_read"].get<std::uint64_t>()),
                 format_size(t["bytes_written"].get<std::uint64_t>()),
                 format_size(t["engine_loaded_bytes"].get<std::uint64_t>()),
                 t["objects"].get<std::uint64_t>(), t["evictions"].get<std::uint64_t>());
    fmt::print(
        "counters agree with the replay: {}; restores checked {} blocks + slots, wrong "
        "data {}\n",
        agree ? "yes" : "NO", checked_blocks, wrong_data);
  }
  return agree && wrong_data == 0 ? 0 : 1;
}

}  // namespace tier::bench
