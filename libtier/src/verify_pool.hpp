#pragma once
// VerifyPool: the process's host threads that hash (and copy) the checksum chunks of object format
// version 2 payloads in parallel (object.cpp; docs/object-format.md). Private to the core: the
// public knobs are tier::verify_threads() and tier::set_verify_threads() (tier/object.hpp).
//
// run() spreads `count` independent calls over the calling thread and the pool's workers and
// returns when every call has returned: the caller always works too, so a pool without workers
// (or with all of them busy on other callers' jobs) runs everything on the caller; so does a
// run() that finds as many callers at work as the pool has threads (many threads of a stack
// verifying at once: each keeps its chunks in its own core's cache), or so many that callers and
// workers together would outnumber the process's CPUs. For that count a thread inside a transfer
// (a Transfer scope: a TierStack save or load) counts whether or not it hashes at the moment: 16
// threads saving on 16 CPUs need 16 CPUs even while half of them copy, so no worker is woken to
// take a CPU from one of them. A thread that shares the host's CPUs with
// other processes verifying at once (share(n), set by tier::VerifyCpuShare) uses at most its
// share of the CPUs, cpus / n threads, the caller included. Workers start when a TierStack opens
// (prestart()), else on the first run() that can use them, spin for a short while after each job
// (so back-to-back gets find them awake) and then sleep on a futex. They run only the chunk
// functions of object.cpp, never user code. A child process after fork() starts its own workers
// on first use.
//
// Threads: run() may be called from any number of threads at once; jobs share the workers.
// Errors: none; a worker that cannot be started leaves its share to the caller.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace tier::detail {

class VerifyPool {
 public:
  using ChunkFn = void (*)(void* ctx, std::size_t chunk) noexcept;

  // The process-wide pool: TIER_VERIFY_THREADS threads (caller included) when set, else
  // min(hardware threads, 8). Never destroyed (workers may outlive static destructors).
  static VerifyPool& instance() noexcept;

  // Calls fn(ctx, i) once for every i in [0, count), on this thread and on free workers.
  void run(std::size_t count, ChunkFn fn, void* ctx) noexcept;

  // run() over a noexcept callable `f(std::size_t chunk)`.
  template <class F>
  void for_each(std::size_t count, F& f) noexcept {
    run(count, &call<F>, &f);
  }

  // Counts the calling thread as a caller while it lives (a save or load moving objects' bytes),
  // whether or not it is inside run() at the moment. Nests.
  class Transfer {
   public:
    Transfer() noexcept { instance().transfers_.fetch_add(1, std::memory_order_relaxed); }
    ~Transfer() { instance().transfers_.fetch_sub(1, std::memory_order_relaxed); }
    Transfer(const Transfer&) = delete;
    Transfer& operator=(const Transfer&) = delete;
  };

  // The processes, this one included, whose verification shares this host's CPUs with the run()
  // calls of this thread (1: none but this one). Thread-local.
  static unsigned& share() noexcept;

  // Whether more threads are inside transfers than half the threads a run() may use: work that
  // pays only while most workers are idle (copy_bytes' pieces) then stays on its caller (8
  // threads saving 1 MiB objects on 16 CPUs ran 15% slower with their copies spread).
  bool crowded() const noexcept {
    return 2 * transfers_.load(std::memory_order_relaxed) > threads();
  }
  // Threads a run() may use, the caller included (>= 1).
  unsigned threads() const noexcept { return workers_wanted_.load(std::memory_order_relaxed) + 1; }
  // Uses `threads` (caller included, at most 256; 0 = the default) from the next run() on; the
  // current workers exit once they finish the chunk they hold.
  void set_threads(unsigned threads) noexcept;
  // Starts the workers now (a TierStack's open) instead of in the first run() that can use them,
  // so that run() neither creates threads nor waits for a thread that has just started.
  void prestart() noexcept;

 private:
  struct Job {
    ChunkFn fn;
    void* ctx;
    std::size_t count;
    std::atomic<std::size_t> next{0};  // next chunk to claim
    std::atomic<unsigned> users{0};    // workers inside work(); the job outlives them
  };

  template <class F>
  static void call(void* f, std::size_t chunk) noexcept {
    (*static_cast<F*>(f))(chunk);
  }

  explicit VerifyPool(unsigned threads) noexcept;
  void start_workers() noexcept;  // under mu_
  // A job with chunks left, for a worker of `generation`; null when none, or when the pool's
  // threads were set again since the worker started (it then leaves: checked under mu_, which
  // set_threads() holds to start a generation, so an old worker never joins a later job).
  Job* claim(std::uint32_t generation) noexcept;
  void worker(std::uint32_t generation) noexcept;
  static void work(Job& j) noexcept;
  static void after_fork_in_child() noexcept;

  std::mutex mu_;                 // jobs_, workers_started_
  std::mutex config_mu_;          // set_threads
  std::vector<Job*> jobs_;        // jobs with chunks left to claim
  unsigned workers_started_ = 0;  // in the current generation
  const unsigned cpus_;  // CPUs of the process's affinity mask, at construction
  std::atomic<unsigned> workers_wanted_;
  std::atomic<std::uint32_t> generation_{0};  // workers of older generations exit
  std::atomic<std::uint32_t> epoch_{0};       // bumped for each job and each stop
  std::atomic<std::uint32_t> sleepers_{0};
  std::atomic<unsigned> callers_{0};    // run() calls in progress
  std::atomic<unsigned> transfers_{0};  // Transfer scopes alive
};

}  // namespace tier::detail
