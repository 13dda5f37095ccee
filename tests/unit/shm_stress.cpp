// shm_stress: several processes doing puts, gets and removes on one shared-memory segment while
// workers are killed with SIGKILL at random instants and restarted; then `tierctl shm verify`.
// Every object's bytes are derived from its key, so every hit is checked bit for bit, and every
// tenth kill the parent verifies the segment while the workers go on (the whole index, under the
// lock, and every image). Exits 0 only with 0 wrong reads, 0 checksum failures, 0 unexpected
// errors, no worker hung, no problem found by a verify during the run, and a final verify that
// finds nothing (exit 0, no problem, nothing reserved or pinned left over).
//
//   shm_stress [--seconds 3] [--workers 4] [--keys 400] [--seed 1] [--tierctl PATH]
//
// `make test` runs it for a few seconds; `make bench` (.ci/bench) for a minute or more
// (SHM_STRESS_SECONDS). Workers talk to the segment through the registry-made cpu backend, as an
// engine does, so the core's checks are on the path too.
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shm/store.hpp"
#include "support/test_util.hpp"
#include "tier/registry.hpp"

using namespace tier;
using tier::test::key_of;
using tier::test::make_image;
using tier::test::run;

namespace {

constexpr std::uint64_t kCapacity = 16u << 20;

// Counters every worker adds to, in shared anonymous memory (they survive a worker's death).
struct Counters {
  std::atomic<std::uint64_t> puts, stored, gets, hits, removes, wrong, checksum, errors;
  std::atomic<bool> stop;
};

struct Options {
  double seconds = 3;
  int workers = 4;
  std::uint64_t keys = 400;
  std::uint64_t seed = 1;
  std::string tierctl;
};

std::size_t payload_of(const ObjectKey& k) { return 1024 + (k.id.lo * 7919) % 300'000; }

// One worker: random operations until told to stop (or killed).
int worker(const std::string& segment, const Options& o, std::uint64_t seed, Counters& c) {
  auto b = Registry::global().create_backend(
      "cpu", BackendContext{"cpu", kCapacity,
                            Json{{"mode", "shm"}, {"segment", segment}, {"block_size", 16384}}});
  if (!b) {
    std::fprintf(stderr, "worker: %s\n", b.status().to_string().c_str());
    c.errors.fetch_add(1);
    return 1;
  }
  std::mt19937_64 rng(seed);
  std::vector<std::byte> buf(kObjectHeaderBytes + 310'000);
  while (!c.stop.load(std::memory_order_relaxed)) {
    const ObjectKey k = key_of(rng() % o.keys, 1);
    const unsigned op = rng() % 100;
    if (op < 35) {
      auto img = make_image(k, payload_of(k));
      Completion r = run(**b, Op::kPut, k, host_region(img));
      c.puts.fetch_add(1, std::memory_order_relaxed);
      if (r.status.is_ok())
        c.stored.fetch_add(1, std::memory_order_relaxed);
      else if (r.status.code() != Code::kAlreadyExists && r.status.code() != Code::kNoSpace) {
        std::fprintf(stderr, "put %s: %s\n", k.to_string().c_str(), r.status.to_string().c_str());
        c.errors.fetch_add(1);
      }
    } else if (op < 85) {
      Completion r = run(**b, Op::kGet, k, host_region(buf));
      c.gets.fetch_add(1, std::memory_order_relaxed);
      if (r.status.is_ok()) {
        auto want = make_image(k, payload_of(k));
        if (r.bytes != want.size() || std::memcmp(buf.data(), want.data(), want.size()) != 0) {
          std::fprintf(stderr, "WRONG READ of %s\n", k.to_string().c_str());
          c.wrong.fetch_add(1);
        } else {
          c.hits.fetch_add(1, std::memory_order_relaxed);
        }
      } else if (r.status.code() == Code::kChecksumMismatch) {
        std::fprintf(stderr, "get %s: %s\n", k.to_string().c_str(), r.status.to_string().c_str());
        c.checksum.fetch_add(1);
      } else if (r.status.code() != Code::kNotFound) {
        std::fprintf(stderr, "get %s: %s\n", k.to_string().c_str(), r.status.to_string().c_str());
        c.errors.fetch_add(1);
      }
    } else {
      Completion r = run(**b, Op::kRemove, k);
      c.removes.fetch_add(1, std::memory_order_relaxed);
      if (!r.status.is_ok() && r.status.code() != Code::kNotFound) {
        std::fprintf(stderr, "remove %s: %s\n", k.to_string().c_str(),
                     r.status.to_string().c_str());
        c.errors.fetch_add(1);
      }
    }
  }
  return 0;
}

pid_t spawn(const std::string& segment, const Options& o, std::uint64_t seed, Counters& c) {
  pid_t pid = ::fork();
  if (pid == 0) {
    set_verify_threads(1);  // a forked child starts no thread (ThreadSanitizer cannot follow it)
    ::_exit(worker(segment, o, seed, c));
  }
  return pid;
}

// Waits up to `limit` for `pid`; false (and kills it) when it does not end.
bool reap(pid_t pid, std::chrono::seconds limit, int* status) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, status, 0);
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--seconds")
      o.seconds = std::stod(v);
    else if (a == "--workers")
      o.workers = std::stoi(v);
    else if (a == "--keys")
      o.keys = std::stoull(v);
    else if (a == "--seed")
      o.seed = std::stoull(v);
    else if (a == "--tierctl")
      o.tierctl = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const std::string segment = fmt::format("libtier-stress-{}", ::getpid());
  {  // create it first, so that every worker agrees on the geometry
    cpu::ShmConfig cfg;
    cfg.segment = segment;
    cfg.capacity = kCapacity;
    auto s = cpu::ShmStore::open(cfg);
    if (!s) {
      std::fprintf(stderr, "%s\n", s.status().to_string().c_str());
      return 1;
    }
  }
  auto* c = static_cast<Counters*>(
      ::mmap(nullptr, sizeof(Counters), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (c == MAP_FAILED) return 1;
  new (c) Counters{};

  std::mt19937_64 rng(o.seed);
  std::vector<pid_t> pids;
  std::uint64_t next_seed = o.seed * 1000;
  for (int w = 0; w < o.workers; ++w) pids.push_back(spawn(segment, o, ++next_seed, *c));
  std::uint64_t kills = 0, hung = 0, live_verifies = 0, live_problems = 0;
  auto watcher = cpu::ShmStore::attach(segment);
  if (!watcher) {
    std::fprintf(stderr, "%s\n", watcher.status().to_string().c_str());
    return 1;
  }
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(static_cast<std::int64_t>(o.seconds * 1000));
  while (std::chrono::steady_clock::now() < end) {
    // Random instants: the kill lands wherever the victim is (holding the lock, copying, ...).
    std::this_thread::sleep_for(std::chrono::microseconds(2000 + rng() % 40'000));
    const std::size_t w = rng() % pids.size();
    ::kill(pids[w], SIGKILL);
    int status = 0;
    if (!reap(pids[w], std::chrono::seconds(30), &status)) ++hung;
    ++kills;
    pids[w] = spawn(segment, o, ++next_seed, *c);
    if (kills % 10 == 0) {
      auto r = (*watcher)->verify();
      ++live_verifies;
      if (!r) {
        std::fprintf(stderr, "verify during the run: %s\n", r.status().to_string().c_str());
        ++live_problems;
        continue;
      }
      live_problems += r->problems.size() + r->corrupt;
      for (const auto& p : r->problems)
        std::fprintf(stderr, "verify during the run: %s\n", p.c_str());
    }
  }
  watcher->reset();
  c->stop.store(true);
  for (pid_t p : pids) {
    int status = 0;
    if (!reap(p, std::chrono::seconds(30), &status) || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "worker %d did not stop cleanly\n", p);
      ++hung;
    }
  }

  // The segment as the workers left it: tierctl first (a separate process, as an operator runs
  // it), then a check of what is left reserved or pinned.
  int verify_rc = 0;
  if (!o.tierctl.empty()) {
    std::string cmd = fmt::format("{} shm verify {}", o.tierctl, segment);
    int st = std::system(cmd.c_str());
    verify_rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  }
  std::uint64_t problems = 0, corrupt = 0, left = 0, objects = 0, recoveries = 0, reaped = 0;
  {
    auto s = cpu::ShmStore::attach(segment);
    if (!s) {
      std::fprintf(stderr, "%s\n", s.status().to_string().c_str());
      return 1;
    }
    auto r = (*s)->verify();
    if (!r) return 1;
    problems = r->problems.size();
    corrupt = r->corrupt;
    for (const auto& p : r->problems) std::fprintf(stderr, "verify: %s\n", p.c_str());
    auto st = (*s)->stats();
    left = st.writing + st.doomed + (st.clients - 1);
    objects = st.objects;
    recoveries = st.recoveries;
    reaped = st.reaped_clients;
  }
  cpu::ShmStore::remove_segment(segment).ignore();

  fmt::print(
      "shm stress: {} s, {} workers, {} kills (restarted), {} lock-holder deaths repaired, "
      "{} dead clients reaped\n",
      o.seconds, o.workers, kills, recoveries, reaped);
  fmt::print("  {} puts ({} stored), {} gets ({} hits), {} removes; {} objects at the end\n",
             c->puts.load(), c->stored.load(), c->gets.load(), c->hits.load(), c->removes.load(),
             objects);
  fmt::print(
      "  wrong reads {}, checksum failures {}, errors {}, hung workers {}; {} verifies during the "
      "run found {} problems; tierctl shm verify exit {}, problems {}, corrupt entries {}, left "
      "reserved/pinned {}\n",
      c->wrong.load(), c->checksum.load(), c->errors.load(), hung, live_verifies, live_problems,
      verify_rc, problems, corrupt, left);
  const bool ok = c->wrong == 0 && c->checksum == 0 && c->errors == 0 && hung == 0 &&
                  live_problems == 0 && verify_rc == 0 && problems == 0 && corrupt == 0 &&
                  left == 0 && c->hits > 0 && kills > 0;
  fmt::print("{}\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
