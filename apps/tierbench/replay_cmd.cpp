// tierbench replay: a multi-turn conversation workload through a profile's tier stack.
// For each request: look up the leading run of its blocks that is cached (its hits), load and
// check them, then save the missing blocks (put-if-absent refreshes the ones already stored).
#include <algorithm>
#include <cstring>
#include <unistd.h>

#include <fmt/format.h>

#include "bench_util.hpp"
#include "replay_engine.hpp"
#include "cli.hpp"
#include "tier/codec.hpp"
#include "tier/key.hpp"
#include "tier/options.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"
#include "workload.hpp"

namespace tier::bench {
namespace {

// Block contents are a function of the key, so every load is checked for wrong data.
void fill_block(std::byte* p, std::size_t n, const Key128& k) {
  std::uint64_t x = k.lo ^ (k.hi << 1) ^ 0x9E3779B97F4A7C15ull;
  std::size_t words = n / 8;
  auto* w = reinterpret_cast<std::uint64_t*>(p);
  for (std::size_t i = 0; i < words; ++i) w[i] = x + i * 0xD1B54A32D192ED03ull;
  for (std::size_t i = words * 8; i < n; ++i) p[i] = static_cast<std::byte>(x >> (i % 8));
}
bool check_block(const std::byte* p, std::size_t n, const Key128& k, std::vector<std::byte>& tmp) {
  tmp.resize(n);
  fill_block(tmp.data(), n, k);
  return std::memcmp(p, tmp.data(), n) == 0;
}

int run_replay(cli::Args& args) {
  if (auto engine = args.get("engine")) return run_replay_engine(args, *engine);
  auto profile_path = args.get("profile");
  auto trace = args.get("trace");
  std::uint64_t block_bytes = args.size("block-bytes").value_or(64 * 1024);
  std::uint64_t limit = args.uint("limit").value_or(0);
  std::uint64_t sessions = args.uint("sessions").value_or(400);
  bool json = args.flag("json");
  args.finish();
  if (!profile_path)
    return cli::fail("usage: tierbench replay --profile P [--trace FILE] [--block-bytes B] "
                     "[--limit N] [--sessions N] [--json]", 2);
  if (block_bytes == 0) return cli::fail("--block-bytes must be > 0", 2);

  auto workload = load_workload(trace, limit, sessions);
  if (!workload) return cli::fail(workload.status().to_string());
  std::vector<Request> requests = std::move(workload).value();

  ConfigErrors errors;
  auto profile = load_profile(*profile_path, Registry::global(), &errors);
  if (!profile) return cli::fail(profile.status().to_string());
  auto opened = TierStack::open(*profile);
  if (!opened) return cli::fail(opened.status().to_string());
  TierStack& stack = **opened;
  for (const auto& skipped : stack.skipped_tiers())
    fmt::print(stderr, "note: optional tier left out: {}\n", skipped);
  auto codec = Registry::global().create_codec("identity", Json::object());
  if (!codec) return cli::fail(codec.status().to_string());

  Json identity = {{"workload", "tierbench-replay"},
                   {"block_tokens", kTraceBlockTokens},
                   {"block_bytes", block_bytes}};
  const Key128 ns = *namespace_id(identity);
  const std::size_t ntiers = stack.tier_count();

  std::uint64_t blocks = 0, hit_blocks = 0, wrong_data = 0, failed_saves = 0, failed_loads = 0;
  std::vector<std::uint64_t> tier_hits(ntiers, 0);
  std::vector<double> load_lat, save_lat;
  std::vector<std::byte> buffer, check;
  std::vector<ObjectKey> keys;
  std::vector<Region> regions;
  std::vector<LoadItem> loads;
  std::vector<LoadResult> load_out;
  std::vector<SaveItem> saves;
  std::vector<Status> save_out;
  std::unique_ptr<cli::Progress> bar;
  if (!json) bar = std::make_unique<cli::Progress>("replay", requests.size());
  const auto t0 = Clock::now();
  std::size_t done = 0;
  for (const Request& req : requests) {
    const std::size_t n = req.blocks.size();
    blocks += n;
    keys.clear();
    Key128 parent;
    for (std::uint32_t id : req.blocks) {
      parent = chunk_key(ns, parent, std::span(&id, 1));
      keys.push_back(ObjectKey{ns, parent, 0});
    }
    buffer.resize(n * block_bytes);
    regions.clear();
    for (std::size_t i = 0; i < n; ++i)
      regions.push_back(host_region({buffer.data() + i * block_bytes, block_bytes}));

    auto t1 = Clock::now();
    std::size_t hits = stack.lookup_prefix(keys).value_or(0);
    loads.clear();
    for (std::size_t i = 0; i < hits; ++i) loads.push_back({keys[i], RegionList(&regions[i], 1)});
    load_out.assign(hits, LoadResult{});
    if (hits) stack.load(loads, **codec, load_out).ignore();
    std::size_t served = 0;
    while (served < hits && load_out[served].status.is_ok()) {
      ++tier_hits[static_cast<std::size_t>(load_out[served].tier)];
      if (!check_block(buffer.data() + served * block_bytes, block_bytes, keys[served].id, check))
        ++wrong_data;
      ++served;
    }
    failed_loads += hits - served;
    hit_blocks += served;
    load_lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t1).count());

    auto t2 = Clock::now();
    saves.clear();
    for (std::size_t i = served; i < n; ++i) {
      fill_block(buffer.data() + i * block_bytes, block_bytes, keys[i].id);
      saves.push_back({keys[i], RegionList(&regions[i], 1)});
    }
    save_out.assign(saves.size(), Status());
    if (!saves.empty()) stack.save(saves, **codec, save_out).ignore();
    for (const Status& s : save_out) failed_saves += s.is_ok() ? 0 : 1;
    save_lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t2).count());
    stack.progress();
    if (bar) bar->update(++done);
  }
  stack.flush(std::chrono::seconds(60)).ignore();
  const double seconds = seconds_since(t0);
  bar.reset();

  const double image = static_cast<double>(TierStack::image_bytes(block_bytes));
  Json tiers = Json::object();
  std::uint64_t moved = 0;
  for (std::size_t t = 0; t < ntiers; ++t) {
    const TierMetrics& m = stack.tier(t).metrics();
    std::uint64_t read = m.of(Op::kGet).bytes.get(), written = m.of(Op::kPut).bytes.get();
    moved += read + written;
    Usage u = stack.tier(t).usage();
    tiers[stack.spec(t).name] = {
        {"hit_blocks", tier_hits[t]},
        {"hit_rate", blocks ? static_cast<double>(tier_hits[t]) / blocks : 0.0},
        {"bytes_read", read},
        {"bytes_written", written},
        {"capacity_bytes", u.capacity_bytes},
        {"capacity_objects", static_cast<std::uint64_t>(u.capacity_bytes / image)},
        {"used_bytes", u.used_bytes},
        {"objects", u.objects},
        {"evictions", m.evictions.get()},
        {"checksum_failures", m.checksum_failures.get()},
        {"dropped_saves", m.dropped_saves.get()},
    };
  }
  Json out = {{"requests", requests.size()},
              {"blocks", blocks},
              {"hit_blocks", hit_blocks},
              {"hit_rate", blocks ? static_cast<double>(hit_blocks) / blocks : 0.0},
              {"block_bytes", block_bytes},
              {"image_bytes", static_cast<std::uint64_t>(image)},
              {"seconds", seconds},
              {"gb_per_s", seconds > 0 ? moved / seconds / 1e9 : 0.0},
              {"load_p99_us", percentile_us(load_lat, 99)},
              {"save_p99_us", percentile_us(save_lat, 99)},
              {"failed_loads", failed_loads},
              {"failed_saves", failed_saves},
              {"wrong_data", wrong_data},
              {"tiers", tiers},
              {"stack", stack.counters().to_json()}};
  if (json) {
    fmt::print("{}\n", out.dump());
  } else {
    fmt::print("replay: {} requests, {} blocks of {} ({} per image), {:.1f} s{}\n",
               requests.size(), blocks, format_size(block_bytes), format_size(static_cast<std::uint64_t>(image)),
               seconds, trace ? " (trace " + *trace + ")" : " (built-in conversations)");
    fmt::print("{:<10} {:>12} {:>9} {:>12} {:>12} {:>10} {:>10}\n", "tier", "hit blocks",
               "hit rate", "read", "written", "objects", "evictions");
    for (std::size_t t = 0; t < ntiers; ++t) {
      const Json& tj = tiers[stack.spec(t).name];
      fmt::print("{:<10} {:>12} {:>8.2f}% {:>12} {:>12} {:>10} {:>10}\n", stack.spec(t).name,
                 tj["hit_blocks"].get<std::uint64_t>(), 100 * tj["hit_rate"].get<double>(),
                 format_size(tj["bytes_read"].get<std::uint64_t>()),
                 format_size(tj["bytes_written"].get<std::uint64_t>()),
                 tj["objects"].get<std::uint64_t>(), tj["evictions"].get<std::uint64_t>());
    }
    fmt::print("{:<10} {:>12} {:>8.2f}%\n", "total", hit_blocks, 100 * out["hit_rate"].get<double>());
    fmt::print("moved {:.2f} GB/s; p99 per request: lookup+load {:.0f} us, save {:.0f} us\n",
               out["gb_per_s"].get<double>(), out["load_p99_us"].get<double>(),
               out["save_p99_us"].get<double>());
    fmt::print("failed loads {}, failed saves {}, wrong data {}\n", failed_loads, failed_saves,
               wrong_data);
  }
  return wrong_data == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tier::bench

TIER_CLI_COMMAND(replay,
                 "replay --profile P [--trace FILE] [--block-bytes B] [--limit N] [--sessions N] "
                 "[--json] [--engine dsv4 --preset NAME ...]",
                 "replay a multi-turn conversation workload (a Mooncake-format trace, or the "
                 "built-in generator) through the profile's tiers: hit rate per tier, bytes, "
                 "GB/s, p99 latency",
                 tier::bench::run_replay);
