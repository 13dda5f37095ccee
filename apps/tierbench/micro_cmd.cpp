// tierbench micro: put and get throughput and latency of one tier, beside a memcpy baseline of the
// same object sizes and access pattern measured in the same run.
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include <fmt/format.h>

#include "bench_util.hpp"
#include "cli.hpp"
#include "tier/object.hpp"
#include "tier/options.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"

namespace tier::bench {
namespace {

struct PhaseResult {
  double seconds = 0;
  std::vector<double> latencies_us;
  std::size_t errors = 0;
  std::string first_error;
};

// Runs one request per object, keeping up to `depth` in flight; records each latency.
PhaseResult run_phase(Backend& b, Op op, const std::vector<ObjectKey>& keys,
                      const std::vector<Region>& bufs, std::size_t depth, cli::Progress* progress) {
  PhaseResult res;
  const std::size_t n = keys.size();
  std::vector<Clock::time_point> started(n);
  res.latencies_us.reserve(n);
  std::vector<IoRequest> batch;
  std::vector<Completion> done(std::max<std::size_t>(depth, 1));
  std::size_t next = 0, completed = 0, inflight = 0;
  auto t0 = Clock::now();
  while (completed < n) {
    batch.clear();
    while (next + batch.size() < n && inflight + batch.size() < depth) {
      std::size_t i = next + batch.size();
      batch.push_back(IoRequest{op, keys[i], bufs[i], i});
    }
    if (!batch.empty()) {
      auto now = Clock::now();
      for (const auto& r : batch) started[r.user_data] = now;
      auto s = b.submit(batch);
      if (!s) {
        res.errors += n - completed;
        res.first_error = s.status().to_string();
        break;
      }
      next += *s;
      inflight += *s;
    }
    auto r = b.poll(done, 1, std::chrono::microseconds(100'000));
    if (!r) continue;
    auto now = Clock::now();
    for (std::size_t k = 0; k < *r; ++k) {
      const Completion& c = done[k];
      res.latencies_us.push_back(
          std::chrono::duration<double, std::micro>(now - started[c.user_data]).count());
      bool ok = c.status.is_ok() || (op == Op::kPut && c.status == Code::kAlreadyExists);
      if (!ok) {
        if (res.errors++ == 0) res.first_error = c.status.to_string();
      }
    }
    completed += *r;
    inflight -= *r;
    if (progress) progress->update(completed);
  }
  res.seconds = seconds_since(t0);
  return res;
}

// --processes N: N forked processes (rank = process index) run every phase at the same time,
// lined up by this barrier in anonymous shared memory; each process reports its own figures and
// the first adds the sums. A process that fails marks the barrier so that none waits forever.
struct ProcessGroup {
  std::atomic<std::uint32_t> arrived{0}, generation{0};
  std::atomic<bool> failed{false};
  double put_gbps[64], get_gbps[64], base_gbps[64];

  bool wait(std::uint64_t n) {
    if (n <= 1) return true;
    std::uint32_t g = generation.load();
    if (arrived.fetch_add(1) + 1 == n) {
      arrived.store(0);
      generation.fetch_add(1);
      return true;
    }
    while (generation.load() == g)
      if (failed.load()) return false;
      else sched_yield();
    return true;
  }
};

int run_micro_process(const std::string& profile_path, const std::string& tier_name,
                      std::uint64_t object_size, std::uint64_t objects, std::uint64_t depth,
                      std::uint64_t rounds, std::uint64_t processes, std::uint32_t rank, bool json,
                      ProcessGroup& group);

int run_micro(cli::Args& args) {
  auto profile_path = args.get("profile");
  auto tier_name = args.get("tier");
  std::uint64_t object_size = args.size("object-size").value_or(1 << 20);
  std::uint64_t objects = args.uint("objects").value_or(256);
  // --concurrency is the same knob under the name redis-benchmark comparisons use (-c clients).
  std::uint64_t depth = args.uint("concurrency").value_or(args.uint("depth").value_or(1));
  std::uint64_t rounds = args.uint("rounds").value_or(2);
  std::uint64_t processes = args.uint("processes").value_or(1);
  bool json = args.flag("json");
  args.finish();
  if (!profile_path || !tier_name)
    return cli::fail("usage: tierbench micro --profile P --tier NAME [--object-size SIZE] "
                     "[--objects N] [--depth|--concurrency D] [--rounds R] [--processes N] "
                     "[--json]", 2);
  if (objects == 0 || depth == 0 || rounds == 0 || object_size == 0)
    return cli::fail("--objects, --depth, --rounds and --object-size must be > 0", 2);
  if (processes == 0 || processes > 64) return cli::fail("--processes must be in [1, 64]", 2);

  auto* group = static_cast<ProcessGroup*>(::mmap(nullptr, sizeof(ProcessGroup),
                                                  PROT_READ | PROT_WRITE,
                                                  MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (group == MAP_FAILED) return cli::fail("mmap of the process group failed");
  new (group) ProcessGroup{};
  std::uint32_t rank = 0;  // this process's index, and the rank of its keys
  std::vector<pid_t> children;
  for (std::uint32_t p = 1; p < processes; ++p) {
    pid_t pid = ::fork();
    if (pid == 0) {
      rank = p;
      children.clear();
      break;
    }
    children.push_back(pid);
  }
  int rc = run_micro_process(*profile_path, *tier_name, object_size, objects, depth, rounds,
                             processes, rank, json, *group);
  if (rc != 0) group->failed.store(true);
  if (rank != 0) {
    std::fflush(stdout);
    std::_Exit(rc);
  }
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  if (processes > 1 && rc == 0) {
    double put = 0, get = 0, base = 0;
    for (std::uint64_t p = 0; p < processes; ++p) {
      put += group->put_gbps[p];
      get += group->get_gbps[p];
      base += group->base_gbps[p];
    }
    for (auto [op, v] : {std::pair{"put", put}, std::pair{"get", get}}) {
      if (json)
        fmt::print("{}\n", Json{{"tier", *tier_name}, {"op", op}, {"processes", processes},
                                {"gb_per_s", v}, {"baseline_gb_per_s", base},
                                {"ratio", base > 0 ? v / base : 0}}.dump());
      else
        fmt::print("{:4} all {} processes {:8.2f} GB/s  memcpy (all at once) {:8.2f} GB/s  "
                   "ratio {:.2f}\n", op, processes, v, base, base > 0 ? v / base : 0);
    }
  }
  return rc;
}

int run_micro_process(const std::string& profile_path, const std::string& tier_name,
                      std::uint64_t object_size, std::uint64_t objects, std::uint64_t depth,
                      std::uint64_t rounds, std::uint64_t processes, std::uint32_t rank, bool json,
                      ProcessGroup& group) {

  ConfigErrors errors;
  auto profile = load_profile(profile_path, Registry::global(), &errors);
  if (!profile) return cli::fail(profile.status().to_string());
  int t = profile->find_tier(tier_name);
  if (t < 0) return cli::fail(fmt::format("profile {} has no tier \"{}\"", profile_path, tier_name));
  const TierSpec& spec = profile->tiers[static_cast<std::size_t>(t)];
  auto backend = Registry::global().create_backend(
      spec.backend_type, BackendContext{spec.name, spec.capacity_bytes, spec.backend_options});
  if (!backend) return cli::fail(backend.status().to_string());
  Backend& b = **backend;
  const Capabilities caps = b.capabilities();
  const std::size_t align = std::max<std::size_t>(caps.io_alignment, 64);

  // The object is the image: header + payload, padded to the tier's alignment.
  const std::size_t payload = object_size > kObjectHeaderBytes ? object_size - kObjectHeaderBytes : 1;
  const std::size_t image = kObjectHeaderBytes + payload;
  const std::size_t padded = (image + align - 1) / align * align;
  if (padded * objects > b.usage().capacity_bytes)
    fmt::print(stderr, "note: {} objects of {} exceed the tier capacity {}; puts will evict\n",
               objects, format_size(padded), format_size(b.usage().capacity_bytes));

  Json ns_identity = {{"bench", "micro"}, {"object_bytes", object_size}};
  Key128 ns = *namespace_id(ns_identity);
  std::vector<ObjectKey> keys;
  std::vector<AlignedBuffer> images, dests;
  std::vector<Region> put_bufs, get_bufs;
  std::vector<std::byte*> src_ptrs, dst_ptrs;
  // Gets land in distinct buffers, as a load fills distinct engine blocks.
  for (std::uint64_t i = 0; i < objects; ++i) {
    dests.push_back(aligned_buffer(padded, align));
    dst_ptrs.push_back(dests.back().get());
  }
  std::uint64_t x = 0x1234567;
  for (std::uint64_t i = 0; i < objects; ++i) {
    ObjectKey k{ns, Key128{i, 0}, rank};
    keys.push_back(k);
    auto buf = aligned_buffer(padded, align);
    auto* words = reinterpret_cast<std::uint64_t*>(buf.get() + kObjectHeaderBytes);
    for (std::size_t w = 0; w < payload / 8; ++w) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      words[w] = x;
    }
    seal_object({buf.get(), image}, kIdentityLayoutId, 0, k);
    put_bufs.push_back(Region{buf.get(), padded, MemoryKind::kHost, -1});
    get_bufs.push_back(Region{dst_ptrs[i], padded, MemoryKind::kHost, -1});
    src_ptrs.push_back(buf.get());
    images.push_back(std::move(buf));
  }
  // One baseline for both: memcpy of every object into a distinct buffer.
  if (!group.wait(processes)) return 1;
  const double base = memcpy_gb_per_s(src_ptrs, dst_ptrs, padded);

  PhaseResult put, get;
  for (std::uint64_t r = 0; r < rounds; ++r) {
    std::unique_ptr<cli::Progress> bar;
    if (!json) bar = std::make_unique<cli::Progress>(fmt::format("round {} put", r + 1), objects);
    if (!group.wait(processes)) return 1;
    put = run_phase(b, Op::kPut, keys, put_bufs, depth, bar.get());
    if (!json) bar = std::make_unique<cli::Progress>(fmt::format("round {} get", r + 1), objects);
    if (!group.wait(processes)) return 1;
    get = run_phase(b, Op::kGet, keys, get_bufs, depth, bar.get());
    bar.reset();
    if (r + 1 < rounds) {  // start the next round empty, as a warm tier in steady state
      std::vector<Region> none(objects);
      if (!group.wait(processes)) return 1;
      run_phase(b, Op::kRemove, keys, none, depth, nullptr);
    }
  }
  auto report = [&](const char* op, const PhaseResult& p, double base) {
    double bytes = static_cast<double>(padded) * static_cast<double>(objects);
    double gbps = p.seconds > 0 ? bytes / p.seconds / 1e9 : 0;
    Json j = {{"tier", tier_name},
              {"process", rank},
              {"op", op},
              {"object_bytes", padded},
              {"objects", objects},
              {"depth", depth},
              {"seconds", p.seconds},
              {"gb_per_s", gbps},
              {"p50_us", percentile_us(p.latencies_us, 50)},
              {"p99_us", percentile_us(p.latencies_us, 99)},
              {"baseline_gb_per_s", base},
              {"ratio", base > 0 ? gbps / base : 0},
              {"errors", p.errors}};
    if (json) {
      fmt::print("{}\n", j.dump());
    } else {
      if (processes > 1) fmt::print("[process {}] ", rank);
      fmt::print("{:4} {:>10} x {:<6} depth {:<3} {:8.2f} GB/s  p50 {:9.1f} us  p99 {:9.1f} us  "
                 "memcpy {:8.2f} GB/s  ratio {:.2f}{}\n",
                 op, format_size(padded), objects, depth, gbps, j["p50_us"].get<double>(),
                 j["p99_us"].get<double>(), base, j["ratio"].get<double>(),
                 p.errors ? fmt::format("  ({} errors, first: {})", p.errors, p.first_error) : "");
    }
  };
  report("put", put, base);
  report("get", get, base);
  auto gbps = [&](const PhaseResult& p) {
    return p.seconds > 0 ? static_cast<double>(padded) * static_cast<double>(objects) / p.seconds / 1e9 : 0;
  };
  group.put_gbps[rank] = gbps(put);
  group.get_gbps[rank] = gbps(get);
  group.base_gbps[rank] = base;
  return put.errors + get.errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tier::bench

TIER_CLI_COMMAND(micro,
                 "micro --profile P --tier NAME [--object-size SIZE] [--objects N] "
                 "[--depth|--concurrency D] [--rounds R] [--processes N] [--json]",
                 "put and get throughput and p50/p99 latency of one tier, beside memcpy of the "
                 "same sizes in the same run; the last of R rounds is reported (earlier rounds "
                 "warm the tier and are removed); --processes N runs N processes at once (keys of "
                 "rank 0..N-1, e.g. on a shared tier) and adds their figures up",
                 tier::bench::run_micro);
