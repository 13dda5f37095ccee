#include "verify_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TIER_CPU_RELAX() _mm_pause()
#else
#define TIER_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace tier::detail {

namespace {

// How long an idle worker spins before it sleeps: longer than the gap between the gets of a
// batch (a DMA completion wait), short enough not to matter to anyone else.
constexpr auto kSpin = std::chrono::microseconds(100);
constexpr unsigned kMaxThreads = 256;

// The CPUs this process may run on (its affinity mask: a container's or taskset's limit).
unsigned usable_cpus() noexcept {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(CPU_COUNT(&set), 1);
  return std::max(std::thread::hardware_concurrency(), 1u);
}

unsigned default_threads() noexcept {
  if (const char* env = std::getenv("TIER_VERIFY_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const unsigned long v = std::strtoul(env, &end, 10);
    if (end != nullptr && *end == '\0' && v >= 1)
      return static_cast<unsigned>(std::min<unsigned long>(v, kMaxThreads));
  }
  return std::clamp(usable_cpus(), 1u, 8u);
}

}  // namespace

VerifyPool::VerifyPool(unsigned threads) noexcept
    : cpus_(usable_cpus()), workers_wanted_(threads - 1) {}

VerifyPool& VerifyPool::instance() noexcept {
  static VerifyPool* pool = [] {
    auto* p = new VerifyPool(default_threads());
    ::pthread_atfork([] { instance().mu_.lock(); }, [] { instance().mu_.unlock(); },
                     &VerifyPool::after_fork_in_child);
    return p;
  }();
  return *pool;
}

void VerifyPool::after_fork_in_child() noexcept {
  // Only the forking thread exists here: no worker, no other caller. prepare locked mu_.
  VerifyPool& p = instance();
  p.jobs_.clear();
  p.workers_started_ = 0;
  p.sleepers_.store(0);
  p.generation_.fetch_add(1);
  p.mu_.unlock();
}

void VerifyPool::set_threads(unsigned threads) noexcept {
  std::lock_guard config(config_mu_);
  threads = threads == 0 ? default_threads() : std::min(threads, kMaxThreads);
  {
    std::lock_guard lock(mu_);
    generation_.fetch_add(1);
    workers_started_ = 0;
    workers_wanted_.store(threads - 1);
  }
  // Older workers finish the chunk they hold, see the new generation and exit.
  epoch_.fetch_add(1);
  epoch_.notify_all();
}

void VerifyPool::start_workers() noexcept {
  const unsigned wanted = workers_wanted_.load(std::memory_order_relaxed);
  const std::uint32_t gen = generation_.load();
  while (workers_started_ < wanted) {
    try {
      std::thread([this, gen] { worker(gen); }).detach();
      ++workers_started_;
    } catch (...) {  // no more threads: the callers do the work
      workers_wanted_.store(workers_started_);
      return;
    }
  }
}

void VerifyPool::prestart() noexcept {
  std::lock_guard lock(mu_);
  start_workers();
}

void VerifyPool::work(Job& j) noexcept {
  for (std::size_t i = j.next.fetch_add(1, std::memory_order_relaxed); i < j.count;
       i = j.next.fetch_add(1, std::memory_order_relaxed))
    j.fn(j.ctx, i);
}

VerifyPool::Job* VerifyPool::claim(std::uint32_t generation) noexcept {
  std::lock_guard lock(mu_);
  if (generation_.load() != generation) return nullptr;
  for (Job* j : jobs_) {
    if (j->next.load(std::memory_order_relaxed) < j->count) {
      j->users.fetch_add(1, std::memory_order_relaxed);
      return j;
    }
  }
  return nullptr;
}

void VerifyPool::worker(std::uint32_t generation) noexcept {
  using Clock = std::chrono::steady_clock;
  for (;;) {
    const std::uint32_t e = epoch_.load();
    if (generation_.load() != generation) break;
    if (Job* j = claim(generation)) {
      work(*j);
      j->users.fetch_sub(1, std::memory_order_release);  // the last touch of *j
      continue;
    }
    const auto until = Clock::now() + kSpin;
    for (unsigned n = 1; epoch_.load(std::memory_order_relaxed) == e; ++n) {
      TIER_CPU_RELAX();
      if (n % 64 == 0 && Clock::now() > until) break;
    }
    if (epoch_.load() != e) continue;
    sleepers_.fetch_add(1);
    epoch_.wait(e);  // returns at once if a job or a stop bumped the epoch meanwhile
    sleepers_.fetch_sub(1);
  }
}

unsigned& VerifyPool::share() noexcept {
  thread_local unsigned processes = 1;
  return processes;
}

void VerifyPool::run(std::size_t count, ChunkFn fn, void* ctx) noexcept {
  if (count == 0) return;
  struct Caller {  // counted in callers_ while it runs
    std::atomic<unsigned>& n;
    const unsigned before = n.fetch_add(1, std::memory_order_relaxed);
    ~Caller() { n.fetch_sub(1, std::memory_order_relaxed); }
  } caller{callers_};
  // Alone when as many callers as verification threads are at work already (each thread then
  // has a caller of its own, and chunks handed to a worker would only be read into another
  // core's cache before the caller copies them), or when the callers and the workers together
  // would be more threads than the process has CPUs (16 threads of a stack copying on 16 CPUs:
  // a worker woken for them would only take a CPU from a caller).
  // The threads that need a CPU besides the workers: the callers in run(), or the threads inside
  // a transfer (hashing or copying) if more.
  const unsigned busy = std::max(caller.before + 1, transfers_.load(std::memory_order_relaxed));
  unsigned workers = workers_wanted_.load(std::memory_order_relaxed);
  if (const unsigned n = share(); n > 1) workers = std::min(workers, std::max(cpus_ / n, 1u) - 1);
  if (count == 1 || workers == 0 || caller.before + 1 >= workers + 1 || busy + workers > cpus_) {
    for (std::size_t i = 0; i < count; ++i) fn(ctx, i);
    return;
  }
  Job job{fn, ctx, count};
  {
    std::lock_guard lock(mu_);
    start_workers();
    try {
      jobs_.push_back(&job);
    } catch (...) {  // no memory for the list: run it here
    }
  }
  epoch_.fetch_add(1);
  if (sleepers_.load() != 0) epoch_.notify_all();
  work(job);
  {
    std::lock_guard lock(mu_);
    jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), &job), jobs_.end());
  }
  // Workers still inside work() finish the chunk they claimed; nobody can join after the erase.
  for (unsigned n = 1; job.users.load(std::memory_order_acquire) != 0; ++n) {
    TIER_CPU_RELAX();
    if (n % 1024 == 0) std::this_thread::yield();
  }
}

}  // namespace tier::detail
