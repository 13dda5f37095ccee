// tierbench micro: put and get throughput and latency of one tier, beside a memcpy baseline of the
// same object sizes and access pattern measured in the same run.
#include <fmt/format.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "bench_util.hpp"
#include "cli.hpp"
#include "micro_threads.hpp"
#include "tier/object.hpp"
#include "tier/options.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

namespace tier::bench {
namespace {

struct PhaseResult {
  double seconds = 0;
  std::vector<double> latencies_us;
  std::size_t errors = 0;
  std::string first_error;
};

// Runs one request per object, keeping up to `depth` in flight; records each latency. With
// `seal` a put first seals its image (payload checksum and header), inside the timed phase, as a
// TierStack save does: a tier that seals puts (Capabilities::seals_puts) gets the header and the
// payload as a gather put and hashes the payload as it copies it; any other gets the image
// sealed here first. Every request carries the phase's bytes as its batch's
// (IoRequest::batch_bytes), as a TierStack call's requests carry the call's.
PhaseResult run_phase(Backend& b, Op op, const std::vector<ObjectKey>& keys,
                      const std::vector<Region>& bufs, std::size_t depth, cli::Progress* progress,
                      bool seal = false) {
  PhaseResult res;
  const std::size_t n = keys.size();
  const Capabilities caps = b.capabilities();
  const bool by_tier = seal && op == Op::kPut && caps.gather_puts && caps.seals_puts;
  std::vector<Region> payloads;  // by_tier: each image's payload, the put's tail
  if (by_tier)
    for (const Region& r : bufs)
      payloads.push_back(
          Region{r.data + kObjectHeaderBytes, r.size - kObjectHeaderBytes, MemoryKind::kHost, -1});
  std::uint64_t phase_bytes = 0;
  for (const Region& r : bufs) phase_bytes += r.size;
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
      if (by_tier) {
        write_object_header({bufs[i].data, kObjectHeaderBytes},
                            ObjectHeader{kIdentityLayoutId, 0, keys[i], payloads[i].size, 0});
        batch.push_back(IoRequest{op, keys[i],
                                  Region{bufs[i].data, kObjectHeaderBytes, MemoryKind::kHost, -1},
                                  i, RegionList(&payloads[i], 1), 0, nullptr, phase_bytes});
        continue;
      }
      if (op == Op::kPut && seal) seal_object(bufs[i].bytes(), kIdentityLayoutId, 0, keys[i]);
      batch.push_back(IoRequest{op, keys[i], bufs[i], i, {}, 0, nullptr, phase_bytes});
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

// --stack: the profile's TierStack saving and loading the same objects (their payloads, through
// the identity codec) on the tier the other phases use, so that the two differ only by the
// stack's own work (the storage, the sources and the read buffers are the same).
struct StackRun {
  TierStack& stack;
  const Codec& codec;
  std::vector<Region> src, dst;  // each object's payload in its image, in its read buffer
  std::vector<SaveItem> saves;
  std::vector<LoadItem> loads;
};

// One save or load of every object in one call; each object's latency is the call's mean.
PhaseResult stack_phase(StackRun& s, Op op) {
  PhaseResult res;
  const std::size_t n = s.saves.size();
  std::vector<Status> saved(op == Op::kPut ? n : 0);
  std::vector<LoadResult> loaded(op == Op::kGet ? n : 0);
  auto t0 = Clock::now();
  Status st = op == Op::kPut ? s.stack.save(s.saves, s.codec, saved)
                             : s.stack.load(s.loads, s.codec, loaded);
  res.seconds = seconds_since(t0);
  auto note = [&](const Status& x) {
    if (!x.is_ok() && res.errors++ == 0) res.first_error = x.to_string();
  };
  note(st);
  for (const Status& x : saved) note(x);
  for (const LoadResult& x : loaded) note(x.status);
  res.latencies_us.assign(n, n > 0 ? res.seconds / static_cast<double>(n) * 1e6 : 0);
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

struct MicroOptions {
  std::string profile_path;
  std::string tier_name;
  std::uint64_t object_size = 0;
  std::uint64_t objects = 0;
  std::uint64_t depth = 0;
  std::uint64_t rounds = 0;
  std::uint64_t processes = 1;  // of this run
  bool seal = false;
  bool stack = false;    // also the profile's TierStack on the same tier (StackRun)
  bool best = false;     // report each phase's fastest round instead of the last
  bool json = false;
  bool table = false;    // several process counts: one line per count, then a table
  bool cleanup = false;  // remove this run's objects at the end (another run follows)
  Turns turns;           // --turns: each round (the first with the baseline) in its turn
};

int run_micro_process(const MicroOptions& o, std::uint32_t rank, ProcessGroup& group);

// The sums over the processes of one run.
struct GroupFigures {
  double put = 0, get = 0, base = 0;  // GB/s
};

// Runs `o.processes` processes at once (this one is rank 0); their sums in `out`.
int run_group(const MicroOptions& o, ProcessGroup& group, GroupFigures& out) {
  new (&group) ProcessGroup{};
  std::uint32_t rank = 0;  // this process's index, and the rank of its keys
  std::vector<pid_t> children;
  for (std::uint32_t p = 1; p < o.processes; ++p) {
    pid_t pid = ::fork();
    if (pid == 0) {
      rank = p;
      children.clear();
      break;
    }
    children.push_back(pid);
  }
  int rc = run_micro_process(o, rank, group);
  if (rc != 0) group.failed.store(true);
  if (rank != 0) {
    std::fflush(stdout);
    std::_Exit(rc);
  }
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  for (std::uint64_t p = 0; p < o.processes; ++p) {
    out.put += group.put_gbps[p];
    out.get += group.get_gbps[p];
    out.base += group.base_gbps[p];
  }
  return rc;
}

int run_micro(cli::Args& args) {
  auto profile_path = args.get("profile");
  auto tier_name = args.get("tier");
  if (args.get("threads")) {  // N threads on one TierStack (micro_threads.hpp)
    ThreadsOptions t;
    t.threads = args.list("threads", "1", 1, 1024);
    t.object_size = args.size("object-size").value_or(1 << 20);
    t.objects = args.uint("objects").value_or(64);
    t.rounds = args.uint("rounds").value_or(3);
    t.json = args.flag("json");
    args.finish();  // --depth, --processes and --seal belong to the tier-alone mode
    if (!profile_path || !tier_name)
      return cli::fail("usage: tierbench micro --profile P --tier NAME --threads N[,N...] "
                       "[--object-size SIZE] [--objects PER-THREAD] [--rounds R] [--json]", 2);
    if (t.objects == 0 || t.rounds == 0 || t.object_size == 0)
      return cli::fail("--objects, --rounds and --object-size must be > 0", 2);
    if (t.object_size > (1ull << 40))
      return cli::fail(fmt::format("--object-size {} is larger than 1TiB", t.object_size), 2);
    t.profile_path = *profile_path;
    t.tier_name = *tier_name;
    return run_micro_threads(t);
  }
  MicroOptions o;
  o.object_size = args.size("object-size", 1).value_or(1 << 20);
  o.objects = args.uint("objects", 1).value_or(256);
  // --concurrency is the same knob under the name redis-benchmark comparisons use (-c clients).
  o.depth = args.uint("concurrency", 1, 65536).value_or(args.uint("depth", 1, 65536).value_or(1));
  o.rounds = args.uint("rounds", 1, 1000).value_or(2);
  const std::vector<std::uint64_t> counts = args.list("processes", "1", 1, 64);
  o.seal = args.flag("seal");
  o.stack = args.flag("stack");
  o.seal = o.seal || o.stack;  // the stack's saves seal their images: so do the tier's puts
  o.best = args.flag("best");
  o.json = args.flag("json");
  o.turns = Turns::from(args);
  args.finish();
  if (!profile_path || !tier_name)
    return cli::fail(
        "usage: tierbench micro --profile P --tier NAME [--object-size SIZE] "
        "[--objects N] [--depth|--concurrency D] [--rounds R] [--processes N[,N...]] "
        "[--seal] [--stack] [--best] [--turns IN,OUT] [--json]",
        2);
  if (o.stack && (counts.size() != 1 || counts[0] != 1))
    return cli::fail("--stack runs in one process (no --processes)", 2);
  if (o.turns.active() && (counts.size() != 1 || counts[0] != 1))
    return cli::fail("--turns runs in one process (no --processes)", 2);
  o.profile_path = *profile_path;
  o.tier_name = *tier_name;
  const std::uint64_t most = *std::max_element(counts.begin(), counts.end());
  // Each process holds its objects' images and as many read buffers (padded to the tier's
  // alignment, a page for the tiers that have one).
  if (o.object_size > (1ull << 40))
    return cli::fail(fmt::format("--object-size {} is larger than 1TiB", o.object_size), 2);
  const std::uint64_t padded_max =
      (std::max<std::uint64_t>(o.object_size, kObjectHeaderBytes + 1) + 4095) / 4096 * 4096;
  if (std::string why = check_memory(o.objects, padded_max, 2 * most,
                                     fmt::format("--objects {} of --object-size {} (images and "
                                                 "read buffers, {} process(es))",
                                                 o.objects, o.object_size, most));
      !why.empty())
    return cli::fail(why, 2);

  auto* group = static_cast<ProcessGroup*>(::mmap(nullptr, sizeof(ProcessGroup),
                                                  PROT_READ | PROT_WRITE,
                                                  MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (group == MAP_FAILED) return cli::fail("mmap of the process group failed");
  o.table = counts.size() > 1;
  std::vector<GroupFigures> rows;
  for (std::size_t c = 0; c < counts.size(); ++c) {
    o.processes = counts[c];
    o.cleanup = c + 1 < counts.size();
    GroupFigures sum;
    if (int rc = run_group(o, *group, sum); rc != 0) return rc;
    rows.push_back(sum);
    if (o.processes == 1 && !o.table) continue;  // the process's own lines said it all
    for (auto [op, v] : {std::pair{"put", sum.put}, std::pair{"get", sum.get}}) {
      const double ratio = sum.base > 0 ? v / sum.base : 0;
      if (o.json)
        fmt::print("{}\n", tier::json_text(Json{{"tier", o.tier_name},
                                                {"op", op},
                                                {"processes", o.processes},
                                                {"gb_per_s", v},
                                                {"baseline_gb_per_s", sum.base},
                                                {"ratio", ratio}}));
      else
        fmt::print(
            "{:4} all {} process{} {:8.2f} GB/s  memcpy (all at once) {:8.2f} GB/s  "
            "ratio {:.2f}\n",
            op, o.processes, o.processes > 1 ? "es" : "", v, sum.base, ratio);
    }
    std::fflush(stdout);
  }
  if (o.table && !o.json) {
    fmt::print(
        "\ntier {}, {} objects of {} per process, {} of {} rounds; memcpy: as many "
        "processes copying the same objects at once, in the same run\n",
        o.tier_name, o.objects, format_size(o.object_size), o.best ? "fastest" : "last",
        o.rounds);
    fmt::print("{:>9}  {:>9}  {:>9}  {:>11}  {:>10}  {:>10}\n", "processes", "put GB/s", "get GB/s",
               "memcpy GB/s", "put/memcpy", "get/memcpy");
    for (std::size_t c = 0; c < counts.size(); ++c) {
      const GroupFigures& r = rows[c];
      fmt::print("{:>9}  {:>9.2f}  {:>9.2f}  {:>11.2f}  {:>10.2f}  {:>10.2f}\n", counts[c], r.put,
                 r.get, r.base, r.base > 0 ? r.put / r.base : 0, r.base > 0 ? r.get / r.base : 0);
    }
  }
  return 0;
}

// The objects one process puts and gets: sealed images of pseudo-random payload, and distinct
// buffers for the gets (as a load fills distinct engine blocks).
struct Objects {
  std::size_t padded = 0;  // an image's bytes, header and payload, a multiple of the alignment
  std::vector<ObjectKey> keys;
  std::vector<AlignedBuffer> images, dests;
  std::vector<Region> put_bufs, get_bufs;
  std::vector<std::byte*> src_ptrs, dst_ptrs;
};

Objects make_objects(const MicroOptions& o, std::size_t align, std::uint32_t rank) {
  // The object is the image: header + payload, --object-size bytes (at least the header and one
  // byte) rounded up to the tier's alignment; the payload takes the rounding, so that the header
  // describes every byte a put stores and a get reads.
  const std::size_t wanted = std::max<std::size_t>(o.object_size, kObjectHeaderBytes + 1);
  Objects objs;
  objs.padded = (wanted + align - 1) / align * align;
  const std::size_t payload = objs.padded - kObjectHeaderBytes;
  Json ns_identity = {{"bench", "micro"}, {"object_bytes", o.object_size}};
  Key128 ns = *namespace_id(ns_identity);
  // Where the tier allows it, images start kImageLineOffset bytes into a 64-byte line, so that
  // payloads start on one, as an engine's blocks do and as the cpu tier stores them.
  const std::size_t lead = kImageLineOffset % align == 0 ? kImageLineOffset : 0;
  for (std::uint64_t i = 0; i < o.objects; ++i) {
    objs.dests.push_back(aligned_buffer(lead + objs.padded, align));
    objs.dst_ptrs.push_back(objs.dests.back().get() + lead);
  }
  std::uint64_t x = 0x1234567;
  for (std::uint64_t i = 0; i < o.objects; ++i) {
    ObjectKey k{ns, Key128{i, 0}, rank};
    objs.keys.push_back(k);
    auto buf = aligned_buffer(lead + objs.padded, align);
    std::byte* image = buf.get() + lead;
    auto* words = reinterpret_cast<std::uint64_t*>(image + kObjectHeaderBytes);
    for (std::size_t w = 0; w < payload / 8; ++w) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      words[w] = x;
    }
    seal_object({image, objs.padded}, kIdentityLayoutId, 0, k);
    objs.put_bufs.push_back(Region{image, objs.padded, MemoryKind::kHost, -1});
    objs.get_bufs.push_back(Region{objs.dst_ptrs[i], objs.padded, MemoryKind::kHost, -1});
    objs.src_ptrs.push_back(image);
    objs.images.push_back(std::move(buf));
  }
  return objs;
}

double gb_per_s(const PhaseResult& p, std::size_t padded, std::uint64_t objects) {
  double bytes = static_cast<double>(padded) * static_cast<double>(objects);
  return p.seconds > 0 ? bytes / p.seconds / 1e9 : 0;
}

void report_phase(const MicroOptions& o, std::uint32_t rank, const char* op, const PhaseResult& p,
                  std::size_t padded, double base) {
  const double gbps = gb_per_s(p, padded, o.objects);
  Json j = {{"tier", o.tier_name},
            {"process", rank},
            {"op", op},
            {"object_bytes", padded},
            {"objects", o.objects},
            {"depth", o.depth},
            {"sealed_puts", o.seal},
            {"seconds", p.seconds},
            {"gb_per_s", gbps},
            {"p50_us", percentile_us(p.latencies_us, 50)},
            {"p99_us", percentile_us(p.latencies_us, 99)},
            {"baseline_gb_per_s", base},
            {"ratio", base > 0 ? gbps / base : 0},
            {"errors", p.errors}};
  if (o.json) {
    fmt::print("{}\n", tier::json_text(j));
    return;
  }
  if (o.processes > 1) fmt::print("[process {}] ", rank);
  fmt::print("{:4} {:>10} x {:<6} depth {:<3} {:8.2f} GB/s  p50 {:9.1f} us  p99 {:9.1f} us  "
             "memcpy {:8.2f} GB/s  ratio {:.2f}{}\n",
             op, format_size(padded), o.objects, o.depth, gbps, j["p50_us"].get<double>(),
             j["p99_us"].get<double>(), base, j["ratio"].get<double>(),
             p.errors ? fmt::format("  ({} errors, first: {})", p.errors, p.first_error) : "");
}

// A --stack phase beside the tier's own phase of the same round kind (`alone`).
void report_stack(const MicroOptions& o, const char* op, const PhaseResult& p,
                  const PhaseResult& alone, std::size_t padded) {
  const double gbps = gb_per_s(p, padded, o.objects);
  const double tier_gbps = gb_per_s(alone, padded, o.objects);
  const double ratio = tier_gbps > 0 ? gbps / tier_gbps : 0;
  if (o.json) {
    Json j = {{"tier", o.tier_name},        {"op", op},
              {"object_bytes", padded},     {"objects", o.objects},
              {"seconds", p.seconds},       {"gb_per_s", gbps},
              {"tier_gb_per_s", tier_gbps}, {"ratio_to_tier", ratio},
              {"errors", p.errors}};
    fmt::print("{}\n", tier::json_text(j));
    return;
  }
  fmt::print("{:9} {:>10} x {:<6} {:8.2f} GB/s  {:.3f}x the tier alone on the same storage{}\n", op,
             format_size(padded), o.objects, gbps, ratio,
             p.errors ? fmt::format("  ({} errors, first: {})", p.errors, p.first_error) : "");
}

int run_micro_process(const MicroOptions& o, std::uint32_t rank, ProcessGroup& group) {
  ConfigErrors errors;
  auto profile = load_profile(o.profile_path, Registry::global(), &errors);
  if (!profile) return cli::fail(profile.status().to_string());
  int t = profile->find_tier(o.tier_name);
  if (t < 0)
    return cli::fail(fmt::format("profile {} has no tier \"{}\"", o.profile_path, o.tier_name));
  const TierSpec& spec = profile->tiers[static_cast<std::size_t>(t)];
  // With --stack the tier is the stack's own: its puts and gets and the stack's saves and loads
  // use the same storage.
  Result<PluginPtr<Backend>> backend = Status(Code::kBadState, "not created");
  Result<std::unique_ptr<TierStack>> stack = Status(Code::kBadState, "not opened");
  Result<PluginPtr<Codec>> identity = Status(Code::kBadState, "not created");
  Backend* tier_backend = nullptr;
  if (o.stack) {
    if (profile->tiers.size() != 1)
      return cli::fail(fmt::format("--stack compares a profile's TierStack with its only tier: "
                                   "{} has {} tiers",
                                   o.profile_path, profile->tiers.size()),
                       2);
    stack = TierStack::open(*profile);
    if (!stack) return cli::fail(stack.status().to_string());
    identity = Registry::global().create_codec("identity", Json::object());
    if (!identity) return cli::fail(identity.status().to_string());
    tier_backend = &(*stack)->tier(0);
  } else {
    backend = Registry::global().create_backend(
        spec.backend_type, BackendContext{spec.name, spec.capacity_bytes, spec.backend_options});
    if (!backend) return cli::fail(backend.status().to_string());
    tier_backend = &**backend;
  }
  Backend& b = *tier_backend;
  // Images are padded to the tier's alignment only (an image of --object-size bytes is stored
  // as such where the tier allows it); the buffers start on 64-byte lines at least.
  Objects objs = make_objects(o, std::max<std::size_t>(b.capabilities().io_alignment, 1), rank);
  if (objs.padded * o.objects > b.usage().capacity_bytes)
    fmt::print(stderr, "note: {} objects of {} exceed the tier capacity {}; puts will evict\n",
               o.objects, format_size(objs.padded), format_size(b.usage().capacity_bytes));
  std::optional<StackRun> via;
  if (o.stack) {
    via.emplace(StackRun{**stack, **identity, {}, {}, {}, {}});
    for (std::uint64_t i = 0; i < o.objects; ++i) {
      via->src.push_back(
          objs.put_bufs[i].slice(kObjectHeaderBytes, objs.padded - kObjectHeaderBytes));
      via->dst.push_back(
          objs.get_bufs[i].slice(kObjectHeaderBytes, objs.padded - kObjectHeaderBytes));
    }
    for (std::uint64_t i = 0; i < o.objects; ++i) {
      via->saves.push_back(SaveItem{objs.keys[i], RegionList(&via->src[i], 1)});
      via->loads.push_back(LoadItem{objs.keys[i], RegionList(&via->dst[i], 1)});
    }
  }
  // One baseline for both: memcpy of every object into a distinct buffer (with --turns in the
  // first round's turn).
  double base = 0;
  auto baseline = [&] { base = memcpy_gb_per_s(objs.src_ptrs, objs.dst_ptrs, objs.padded); };
  if (!group.wait(o.processes)) return 1;
  if (!o.turns.active()) baseline();

  // The round a phase reports: the last, or with --best the fastest; a round's errors are
  // reported whichever round that is.
  PhaseResult put, get, stack_put, stack_get;
  auto keep = [&](PhaseResult& kept, PhaseResult round) {
    const std::size_t errors = kept.errors + round.errors;
    std::string first = kept.first_error.empty() ? round.first_error : kept.first_error;
    if (!o.best || kept.latencies_us.empty() || round.seconds < kept.seconds)
      kept = std::move(round);
    kept.errors = errors;
    kept.first_error = std::move(first);
  };
  // --stack: the stack's save and load of the same objects, then their removal; before the
  // tier's phases in odd rounds, after them in even ones, so that neither always follows the
  // other's get.
  auto stack_round = [&]() -> Status {
    keep(stack_put, stack_phase(*via, Op::kPut));
    keep(stack_get, stack_phase(*via, Op::kGet));
    std::vector<Status> removed(o.objects);
    return via->stack.remove(objs.keys, removed);
  };
  for (std::uint64_t r = 0; r < o.rounds; ++r) {
    if (!o.turns.begin()) return cli::fail("--turns: the driver ended the run", 1);
    if (o.turns.active() && r == 0) baseline();
    if (via && r % 2 == 1)
      if (Status st = stack_round(); !st) return cli::fail(st.to_string());
    std::unique_ptr<cli::Progress> bar;
    if (!o.json)
      bar = std::make_unique<cli::Progress>(fmt::format("round {} put", r + 1), o.objects);
    if (!group.wait(o.processes)) return 1;
    keep(put, run_phase(b, Op::kPut, objs.keys, objs.put_bufs, o.depth, bar.get(), o.seal));
    if (!o.json)
      bar = std::make_unique<cli::Progress>(fmt::format("round {} get", r + 1), o.objects);
    if (!group.wait(o.processes)) return 1;
    keep(get, run_phase(b, Op::kGet, objs.keys, objs.get_bufs, o.depth, bar.get()));
    bar.reset();
    // The next round starts empty, as a warm tier in steady state (so does the stack's part).
    if (via || r + 1 < o.rounds) {
      std::vector<Region> none(o.objects);
      if (!group.wait(o.processes)) return 1;
      run_phase(b, Op::kRemove, objs.keys, none, o.depth, nullptr);
    }
    if (via && r % 2 == 0)
      if (Status st = stack_round(); !st) return cli::fail(st.to_string());
    if (!o.turns.end()) return cli::fail("--turns: the driver ended the run", 1);
  }
  if (!o.table) {
    report_phase(o, rank, "put", put, objs.padded, base);
    report_phase(o, rank, "get", get, objs.padded, base);
  }
  if (via) {
    report_stack(o, "stack_put", stack_put, put, objs.padded);
    report_stack(o, "stack_get", stack_get, get, objs.padded);
  }
  if (o.cleanup) {  // the next run starts with an empty tier
    std::vector<Region> none(o.objects);
    run_phase(b, Op::kRemove, objs.keys, none, o.depth, nullptr);
  }
  group.put_gbps[rank] = gb_per_s(put, objs.padded, o.objects);
  group.get_gbps[rank] = gb_per_s(get, objs.padded, o.objects);
  group.base_gbps[rank] = base;
  return put.errors + get.errors + stack_put.errors + stack_get.errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tier::bench

TIER_CLI_COMMAND(micro,
                 "micro --profile P --tier NAME [--object-size SIZE] [--objects N] "
                 "[--depth|--concurrency D] [--rounds R] [--processes N[,N...]] [--seal] "
                 "[--stack] [--best] [--turns IN,OUT] [--json] | micro --profile P --tier NAME "
                 "--threads N[,N...] [--object-size SIZE] [--objects PER-THREAD] [--rounds R] "
                 "[--json]",
                 "put and get throughput and p50/p99 latency of one tier, beside memcpy of the "
                 "same sizes in the same run; the last of R rounds is reported (earlier rounds "
                 "warm the tier and are removed), with --best each phase's fastest round; "
                 "--processes N runs N processes at once (keys of rank 0..N-1, e.g. on a shared "
                 "tier) and adds their figures up, and a list (1,2,4,8,16) runs each count in "
                 "turn and ends with a table; --seal times sealing each image (payload checksum, "
                 "header) as part of its put, as a TierStack save of fresh bytes does (by the "
                 "tier as it copies, where it seals puts); --stack (a profile of one tier; "
                 "implies --seal) also saves and loads the same objects through the profile's "
                 "TierStack (identity codec) each round, on the same tier and storage, and prints "
                 "its rates as ratios to the tier alone (stack_put, stack_get); --turns IN,OUT "
                 "runs each round in a turn passed between processes by a driver (waits for a "
                 "byte on descriptor IN before it, writes one to OUT after it; bench_store.py); "
                 "--threads N,... runs N threads on one TierStack of that tier (saves, then "
                 "loads, of their own host objects through the identity codec) beside N threads' "
                 "memcpy in the same run, every N in each of --rounds rounds; per N: median and "
                 "min-max ratio, and the throughput against N/2's in the same round",
                 tier::bench::run_micro);
