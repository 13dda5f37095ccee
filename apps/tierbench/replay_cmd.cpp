// tierbench replay: a multi-turn conversation workload through a profile's tier stack.
// For each request: look up the leading run of its blocks that is cached (its hits), load and
// check them, then save the missing blocks (put-if-absent refreshes the ones already stored).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "cli.hpp"
#include "replay_engine.hpp"
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

// The command line of `replay` (without --engine).
struct ReplayArgs {
  std::optional<std::string> profile_path, trace;
  std::uint64_t block_bytes, limit, sessions;
  bool json;
};

ReplayArgs read_args(cli::Args& args) {
  ReplayArgs a;
  a.profile_path = args.get("profile");
  a.trace = args.get("trace");
  a.block_bytes = args.size("block-bytes", 1, 1ull << 40).value_or(64 * 1024);
  a.limit = args.uint("limit").value_or(0);
  a.sessions = args.uint("sessions", 1, 1 << 24).value_or(400);
  a.json = args.flag("json");
  args.finish();
  return a;
}

// The profile's tier stack; notes the optional tiers it left out on stderr.
Result<std::unique_ptr<TierStack>> open_stack(const std::string& profile_path) {
  ConfigErrors errors;
  TIER_ASSIGN_OR_RETURN(auto profile, load_profile(profile_path, Registry::global(), &errors));
  TIER_ASSIGN_OR_RETURN(auto stack, TierStack::open(profile));
  for (const auto& skipped : stack->skipped_tiers())
    fmt::print(stderr, "note: optional tier left out: {}\n", skipped);
  return stack;
}

// What the replay observed.
struct Tally {
  std::uint64_t blocks = 0, hit_blocks = 0, wrong_data = 0, failed_saves = 0, failed_loads = 0;
  std::vector<std::uint64_t> tier_hits;    // per tier: blocks loaded from it
  std::vector<double> load_lat, save_lat;  // per request, microseconds
  double seconds = 0;
};

// Replays requests through one tier stack: each request's blocks are chained keys of its hash
// ids; the leading run that is cached is loaded and checked, the rest is saved.
class StackReplay {
 public:
  StackReplay(TierStack& stack, const Codec& codec, std::uint64_t block_bytes)
      : stack_(stack), codec_(codec), block_bytes_(block_bytes) {
    Json identity = {{"workload", "tierbench-replay"},
                     {"block_tokens", kTraceBlockTokens},
                     {"block_bytes", block_bytes}};
    ns_ = *namespace_id(identity);
    tally_.tier_hits.assign(stack.tier_count(), 0);
  }

  void run_request(const Request& req) {
    const std::size_t n = req.blocks.size();
    tally_.blocks += n;
    keys_.clear();
    Key128 parent;
    for (std::uint32_t id : req.blocks) {
      parent = chunk_key(ns_, parent, std::span(&id, 1));
      keys_.push_back(ObjectKey{ns_, parent, 0});
    }
    buffer_.resize(n * block_bytes_);
    regions_.clear();
    for (std::size_t i = 0; i < n; ++i)
      regions_.push_back(host_region({buffer_.data() + i * block_bytes_, block_bytes_}));
    auto t1 = Clock::now();
    const std::size_t served = load_hits();
    tally_.load_lat.push_back(micros_since(t1));
    auto t2 = Clock::now();
    save_from(served);
    tally_.save_lat.push_back(micros_since(t2));
    stack_.progress();
  }

  Tally& tally() { return tally_; }

 private:
  static double micros_since(Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
  }

  // Looks up the cached leading run and loads it; returns how many blocks were served (loaded
  // in order without error), each checked for wrong data.
  std::size_t load_hits() {
    std::size_t hits = stack_.lookup_prefix(keys_).value_or(0);
    loads_.clear();
    for (std::size_t i = 0; i < hits; ++i)
      loads_.push_back({keys_[i], RegionList(&regions_[i], 1)});
    load_out_.assign(hits, LoadResult{});
    if (hits) stack_.load(loads_, codec_, load_out_).ignore();
    std::size_t served = 0;
    while (served < hits && load_out_[served].status.is_ok()) {
      ++tally_.tier_hits[static_cast<std::size_t>(load_out_[served].tier)];
      if (!check_block(buffer_.data() + served * block_bytes_, block_bytes_, keys_[served].id,
                       check_))
        ++tally_.wrong_data;
      ++served;
    }
    tally_.failed_loads += hits - served;
    tally_.hit_blocks += served;
    return served;
  }

  // Saves blocks [first, n) (put-if-absent refreshes the ones already stored).
  void save_from(std::size_t first) {
    saves_.clear();
    for (std::size_t i = first; i < keys_.size(); ++i) {
      fill_block(buffer_.data() + i * block_bytes_, block_bytes_, keys_[i].id);
      saves_.push_back({keys_[i], RegionList(&regions_[i], 1)});
    }
    save_out_.assign(saves_.size(), Status());
    if (!saves_.empty()) stack_.save(saves_, codec_, save_out_).ignore();
    for (const Status& s : save_out_) tally_.failed_saves += s.is_ok() ? 0 : 1;
  }

  TierStack& stack_;
  const Codec& codec_;
  const std::uint64_t block_bytes_;
  Key128 ns_;
  Tally tally_;
  // Per-request scratch, kept to reuse its memory.
  std::vector<std::byte> buffer_, check_;
  std::vector<ObjectKey> keys_;
  std::vector<Region> regions_;
  std::vector<LoadItem> loads_;
  std::vector<LoadResult> load_out_;
  std::vector<SaveItem> saves_;
  std::vector<Status> save_out_;
};

Json report_json(TierStack& stack, std::size_t requests, std::uint64_t block_bytes,
                 const Tally& t) {
  const double image = static_cast<double>(TierStack::image_bytes(block_bytes));
  const std::uint64_t blocks = t.blocks;
  Json tiers = Json::object();
  std::uint64_t moved = 0;
  for (std::size_t i = 0; i < stack.tier_count(); ++i) {
    const TierMetrics& m = stack.tier(i).metrics();
    std::uint64_t read = m.of(Op::kGet).bytes.get(), written = m.of(Op::kPut).bytes.get();
    moved += read + written;
    Usage u = stack.tier(i).usage();
    tiers[stack.spec(i).name] = {
        {"hit_blocks", t.tier_hits[i]},
        {"hit_rate", blocks ? static_cast<double>(t.tier_hits[i]) / blocks : 0.0},
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
  const double seconds = t.seconds;
  return {{"requests", requests},
          {"blocks", blocks},
          {"hit_blocks", t.hit_blocks},
          {"hit_rate", blocks ? static_cast<double>(t.hit_blocks) / blocks : 0.0},
          {"block_bytes", block_bytes},
          {"image_bytes", static_cast<std::uint64_t>(image)},
          {"seconds", seconds},
          {"gb_per_s", seconds > 0 ? moved / seconds / 1e9 : 0.0},
          {"load_p99_us", percentile_us(t.load_lat, 99)},
          {"save_p99_us", percentile_us(t.save_lat, 99)},
          {"failed_loads", t.failed_loads},
          {"failed_saves", t.failed_saves},
          {"wrong_data", t.wrong_data},
          {"tiers", tiers},
          {"stack", stack.counters().to_json()}};
}

void print_report(TierStack& stack, const std::optional<std::string>& trace, const Json& out) {
  const std::uint64_t block_bytes = out["block_bytes"].get<std::uint64_t>();
  fmt::print("replay: {} requests, {} blocks of {} ({} per image), {:.1f} s{}\n",
             out["requests"].get<std::size_t>(), out["blocks"].get<std::uint64_t>(),
             format_size(block_bytes), format_size(out["image_bytes"].get<std::uint64_t>()),
             out["seconds"].get<double>(),
             trace ? " (trace " + *trace + ")" : " (built-in conversations)");
  fmt::print("{:<10} {:>12} {:>9} {:>12} {:>12} {:>10} {:>10}\n", "tier", "hit blocks", "hit rate",
             "read", "written", "objects", "evictions");
  for (std::size_t t = 0; t < stack.tier_count(); ++t) {
    const Json& tj = out["tiers"][stack.spec(t).name];
    fmt::print("{:<10} {:>12} {:>8.2f}% {:>12} {:>12} {:>10} {:>10}\n", stack.spec(t).name,
               tj["hit_blocks"].get<std::uint64_t>(), 100 * tj["hit_rate"].get<double>(),
               format_size(tj["bytes_read"].get<std::uint64_t>()),
               format_size(tj["bytes_written"].get<std::uint64_t>()),
               tj["objects"].get<std::uint64_t>(), tj["evictions"].get<std::uint64_t>());
  }
  fmt::print("{:<10} {:>12} {:>8.2f}%\n", "total", out["hit_blocks"].get<std::uint64_t>(),
             100 * out["hit_rate"].get<double>());
  fmt::print("moved {:.2f} GB/s; p99 per request: lookup+load {:.0f} us, save {:.0f} us\n",
             out["gb_per_s"].get<double>(), out["load_p99_us"].get<double>(),
             out["save_p99_us"].get<double>());
  fmt::print("failed loads {}, failed saves {}, wrong data {}\n",
             out["failed_loads"].get<std::uint64_t>(), out["failed_saves"].get<std::uint64_t>(),
             out["wrong_data"].get<std::uint64_t>());
}

int run_replay(cli::Args& args) {
  if (auto engine = args.get("engine")) return run_replay_engine(args, *engine);
  const ReplayArgs a = read_args(args);
  if (!a.profile_path)
    return cli::fail(
        "usage: tierbench replay --profile P [--trace FILE] [--block-bytes B] "
        "[--limit N] [--sessions N] [--json]",
        2);
  if (a.block_bytes == 0) return cli::fail("--block-bytes must be > 0", 2);

  auto workload = load_workload(a.trace, a.limit, a.sessions);
  if (!workload) return cli::fail(workload.status().to_string());
  const std::vector<Request> requests = std::move(workload).value();
  auto opened = open_stack(*a.profile_path);
  if (!opened) return cli::fail(opened.status().to_string());
  TierStack& stack = **opened;
  auto codec = Registry::global().create_codec("identity", Json::object());
  if (!codec) return cli::fail(codec.status().to_string());

  StackReplay replay(stack, **codec, a.block_bytes);
  std::unique_ptr<cli::Progress> bar;
  if (!a.json) bar = std::make_unique<cli::Progress>("replay", requests.size());
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < requests.size(); ++i) {
    replay.run_request(requests[i]);
    if (bar) bar->update(i + 1);
  }
  stack.flush(std::chrono::seconds(60)).ignore();
  replay.tally().seconds = seconds_since(t0);
  bar.reset();

  const Json out = report_json(stack, requests.size(), a.block_bytes, replay.tally());
  if (a.json) {
    fmt::print("{}\n", tier::json_text(out));
  } else {
    print_report(stack, a.trace, out);
  }
  return replay.tally().wrong_data == 0 ? 0 : 1;
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
