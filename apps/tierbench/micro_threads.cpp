// tierbench micro --threads: N threads on one TierStack against N threads' memcpy (micro_threads.hpp).
#include "micro_threads.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>
#include <functional>
#include <thread>

#include "bench_util.hpp"
#include "cli.hpp"
#include "tier/options.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

namespace tier::bench {
namespace {

// One round's GB/s of the three phases.
struct Round {
  double memcpy = 0, save = 0, load = 0;
};

// Threads that run phases on command: run(n, fn) has the first n threads call fn(thread) at
// once and returns the seconds from their start to the last one's end.
class Crew {
 public:
  explicit Crew(std::size_t size)
      : start_(static_cast<std::ptrdiff_t>(size + 1)), done_(static_cast<std::ptrdiff_t>(size + 1)) {
    for (std::size_t t = 0; t < size; ++t)
      threads_.emplace_back([this, t] {
        for (;;) {
          start_.arrive_and_wait();
          if (stop_) return;
          if (t < active_) work_(t);
          done_.arrive_and_wait();
        }
      });
  }
  ~Crew() {
    stop_ = true;
    start_.arrive_and_wait();
    for (auto& th : threads_) th.join();
  }
  double run(std::size_t n, std::function<void(std::size_t)> fn) {
    active_ = n;
    work_ = std::move(fn);
    start_.arrive_and_wait();
    const auto t0 = Clock::now();
    done_.arrive_and_wait();
    return seconds_since(t0);
  }

 private:
  std::barrier<> start_, done_;
  std::vector<std::thread> threads_;
  std::function<void(std::size_t)> work_;
  std::size_t active_ = 0;
  std::atomic<bool> stop_{false};
};

}  // namespace

int run_micro_threads(const ThreadsOptions& o) {
  ConfigErrors errors;
  auto profile = load_profile(o.profile_path, Registry::global(), &errors);
  if (!profile) return cli::fail(profile.status().to_string());
  const int t = profile->find_tier(o.tier_name);
  if (t < 0)
    return cli::fail(fmt::format("profile {} has no tier \"{}\"", o.profile_path, o.tier_name));
  Profile one = *profile;  // the stack of that tier alone
  one.tiers = {profile->tiers[static_cast<std::size_t>(t)]};
  one.tiers[0].write = one.tiers[0].read = true;
  auto stack_or = TierStack::open(one);
  if (!stack_or) return cli::fail(stack_or.status().to_string());
  TierStack& stack = **stack_or;
  auto codec_or = Registry::global().create_codec("identity", Json::object());
  if (!codec_or) return cli::fail(codec_or.status().to_string());
  const Codec& codec = **codec_or;

  const std::size_t max_threads = *std::max_element(o.threads.begin(), o.threads.end());
  const std::size_t size = o.object_size, per = o.objects;
  if (std::string why = check_memory(max_threads * per, size, 2,
                                     fmt::format("--threads {} x --objects {} of --object-size {}"
                                                 " (sources and destinations)",
                                                 max_threads, per, size));
      !why.empty())
    return cli::fail(why, 2);
  const std::uint64_t stored = max_threads * per * TierStack::image_bytes(size);
  if (stored > stack.tier(0).usage().capacity_bytes)
    return cli::fail(fmt::format("{} objects of {} need {} in tier \"{}\", which holds {}: lower "
                                 "--objects or raise its capacity",
                                 max_threads * per, format_size(size), format_size(stored),
                                 o.tier_name, format_size(stack.tier(0).usage().capacity_bytes)),
                     2);
  // Sources (a pattern per object) and destinations of every thread, faulted in up front.
  std::vector<std::vector<AlignedBuffer>> src(max_threads), dst(max_threads);
  for (std::size_t th = 0; th < max_threads; ++th) {
    std::uint64_t x = 0x9E3779B97F4A7C15ull * (th + 1);
    for (std::size_t i = 0; i < per; ++i) {
      src[th].push_back(aligned_buffer(size, 64));
      dst[th].push_back(aligned_buffer(size, 64));
      auto* w = reinterpret_cast<std::uint64_t*>(src[th].back().get());
      for (std::size_t k = 0; k < size / 8; ++k) w[k] = (x ^= x << 13, x ^= x >> 7, x ^= x << 17);
    }
  }
  const Key128 ns = *namespace_id(Json{{"bench", "micro-threads"}});
  auto key = [&](std::size_t th, std::size_t i) {
    return ObjectKey{ns, Key128{th * per + i, 0}, 0};
  };
  std::atomic<std::uint64_t> errors_seen{0};
  std::string first_error;
  std::mutex error_mu;
  auto failed = [&](const Status& s) {
    if (errors_seen.fetch_add(1) == 0) {
      std::lock_guard lock(error_mu);
      first_error = s.to_string();
    }
  };

  Crew crew(max_threads);
  const double bytes_per_thread = static_cast<double>(size) * static_cast<double>(per);
  if (!o.json)
    fmt::print("TierStack of tier \"{}\" ({}), {} objects of {} per thread, identity codec; "
               "ratio = GB/s / GB/s of N threads' memcpy of the same objects in the same round, "
               "median [min-max] of {} rounds after a warm-up round, each round running every N "
               "in turn; vs N/2 = GB/s / GB/s of N/2 threads in the same round\n"
               "{:>7}  {:>11}  {:>9}  {:>18}  {:>9}  {:>18}  {:>18}  {:>18}\n",
               o.tier_name, o.profile_path, per, format_size(size), o.rounds, "threads",
               "memcpy GB/s", "save GB/s", "save/memcpy", "load GB/s", "load/memcpy",
               "save vs N/2", "load vs N/2");
  // Every round runs every N in turn, so a drift of the shared host (another tenant's traffic)
  // falls on N and N/2 alike: "vs N/2" is the median of the ratios of the same round.
  std::vector<std::vector<Round>> rounds(o.threads.size());  // per N, its measured rounds
  for (std::uint64_t r = 0; r <= o.rounds; ++r) {
    const bool last = r == o.rounds;
    for (std::size_t at = 0; at < o.threads.size(); ++at) {
      const std::size_t n = o.threads[at];
      Round g;
      const double total = bytes_per_thread * static_cast<double>(n);
      g.memcpy = total / crew.run(n, [&](std::size_t th) {
        for (std::size_t i = 0; i < per; ++i) std::memcpy(dst[th][i].get(), src[th][i].get(), size);
      }) / 1e9;
      g.save = total / crew.run(n, [&](std::size_t th) {
        for (std::size_t i = 0; i < per; ++i) {
          Region reg{src[th][i].get(), size, MemoryKind::kHost, -1};
          SaveItem item{key(th, i), RegionList(&reg, 1)};
          Status out;
          Status st = stack.save(std::span(&item, 1), codec, std::span(&out, 1));
          if (!st || !out) failed(st ? out : st);
        }
      }) / 1e9;
      if (last)  // the last load is checked byte for byte: nothing of the memcpy may remain
        crew.run(n, [&](std::size_t th) {
          for (std::size_t i = 0; i < per; ++i) std::memset(dst[th][i].get(), 0, size);
        });
      g.load = total / crew.run(n, [&](std::size_t th) {
        for (std::size_t i = 0; i < per; ++i) {
          Region reg{dst[th][i].get(), size, MemoryKind::kHost, -1};
          LoadItem item{key(th, i), RegionList(&reg, 1)};
          LoadResult out;
          Status st = stack.load(std::span(&item, 1), codec, std::span(&out, 1));
          if (!st || !out.status) failed(st ? out.status : st);
        }
      }) / 1e9;
      crew.run(n, [&](std::size_t th) {
        for (std::size_t i = 0; i < per; ++i) {
          if (last && std::memcmp(dst[th][i].get(), src[th][i].get(), size) != 0)
            failed(Status(Code::kChecksumMismatch, "a load's bytes differ from the save's"));
          if (Status st = stack.remove(key(th, i)); !st) failed(st);  // the next round starts empty
        }
      });
      if (r > 0) rounds[at].push_back(g);  // round 0 warms the tier's storage and the caches
    }
  }
  for (std::size_t at = 0; at < o.threads.size(); ++at) {
    const std::size_t n = o.threads[at];
    const std::vector<Round>& mine = rounds[at];
    const std::vector<Round>* half = nullptr;  // N/2's rounds, when N/2 ran too
    for (std::size_t h = 0; h < o.threads.size(); ++h)
      if (o.threads[h] * 2 == n) half = &rounds[h];
    std::vector<double> save_ratio, load_ratio, mem, sv, ld, save_half, load_half;
    for (std::size_t k = 0; k < mine.size(); ++k) {
      const Round& g = mine[k];
      save_ratio.push_back(g.save / g.memcpy);
      load_ratio.push_back(g.load / g.memcpy);
      mem.push_back(g.memcpy);
      sv.push_back(g.save);
      ld.push_back(g.load);
      if (half) {
        save_half.push_back(g.save / (*half)[k].save);
        load_half.push_back(g.load / (*half)[k].load);
      }
    }
    const Round med{median(mem), median(sv), median(ld)};
    auto [smin, smax] = std::minmax_element(save_ratio.begin(), save_ratio.end());
    auto [lmin, lmax] = std::minmax_element(load_ratio.begin(), load_ratio.end());
    auto spread = [](const std::vector<double>& v) {  // "median [min-max]", or "-" when none
      if (v.empty()) return std::string("-");
      auto [lo, hi] = std::minmax_element(v.begin(), v.end());
      return fmt::format("{:.2f} [{:.2f}-{:.2f}]", median(v), *lo, *hi);
    };
    if (o.json) {
      fmt::print("{}\n", Json{{"tier", o.tier_name},
                              {"threads", n},
                              {"object_bytes", size},
                              {"objects_per_thread", per},
                              {"rounds", o.rounds},
                              {"memcpy_gb_per_s", med.memcpy},
                              {"save_gb_per_s", med.save},
                              {"load_gb_per_s", med.load},
                              {"save_ratio", median(save_ratio)},
                              {"save_ratio_min", *smin},
                              {"save_ratio_max", *smax},
                              {"load_ratio", median(load_ratio)},
                              {"load_ratio_min", *lmin},
                              {"load_ratio_max", *lmax},
                              {"save_vs_half", half ? Json(median(save_half)) : Json()},
                              {"load_vs_half", half ? Json(median(load_half)) : Json()},
                              {"errors", errors_seen.load()}}
                             .dump());
    } else {
      fmt::print("{:>7}  {:>11.2f}  {:>9.2f}  {:>18}  {:>9.2f}  {:>18}  {:>18}  {:>18}\n", n,
                 med.memcpy, med.save, spread(save_ratio), med.load, spread(load_ratio),
                 spread(save_half), spread(load_half));
    }
  }
  std::fflush(stdout);
  if (errors_seen > 0) {
    fmt::print(stderr, "{} failed saves, loads or removes; first: {}\n", errors_seen.load(),
               first_error);
    return 1;
  }
  return 0;
}

}  // namespace tier::bench
