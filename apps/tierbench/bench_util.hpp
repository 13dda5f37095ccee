#pragma once
// Measurement helpers shared by tierbench commands: aligned buffers, latency percentiles, and the
// memcpy baseline every tier figure is compared with.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cli.hpp"
#include "tier/status.hpp"

namespace tier::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The seconds `op` (a callable returning Status) took, or its error.
template <class F>
Result<double> timed(F&& op) {
  const auto t0 = Clock::now();
  Status st = op();
  if (!st) return st;
  return seconds_since(t0);
}

struct FreeDeleter {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte[], FreeDeleter>;

// `bytes` rounded up to `alignment`, zero-filled so every page is touched.
AlignedBuffer aligned_buffer(std::size_t bytes, std::size_t alignment);

// Checks that `count` x `bytes` x `copies` bytes can be allocated: the product must not overflow
// and must fit in the machine's physical memory and the address-space limit (ulimit -v).
// Returns: empty, or the error to print, naming `what`.
std::string check_memory(std::uint64_t count, std::uint64_t bytes, std::uint64_t copies,
                         std::string_view what);

// The median of `v` (the mean of the middle two for an even count; 0 when empty); sorts a copy.
double median(std::vector<double> v);

// Percentile (0..100) of `samples` in microseconds; sorts a copy.
double percentile_us(std::vector<double> samples, double pct);

// GB/s of memcpy from `sources` into `dests` (dests[i % dests.size()]), `bytes` each, best of
// `repeats` passes. The same access pattern as the tier operation it is a baseline for.
double memcpy_gb_per_s(const std::vector<std::byte*>& sources, const std::vector<std::byte*>& dests,
                       std::size_t bytes, int repeats = 3);

// Rounds taken in turn with other processes (--turns IN,OUT): begin() waits for one byte on the
// descriptor IN, end() writes one to OUT. A driver (python/bench/bench_store.py) holding the other
// ends passes the turn from process to process, so that the processes it compares run their rounds
// interleaved in time and meet the same slow and fast moments of a shared machine (whose memory
// bandwidth moves by up to 2x from one second to the next) instead of a second each. Without
// descriptors both return true at once. Threads: one at a time.
class Turns {
 public:
  Turns() = default;
  // Takes --turns from `args` (unset: no turns); exits 2 when the value is not two open
  // descriptors.
  static Turns from(cli::Args& args);
  bool active() const { return in_ >= 0; }
  // Returns: false when the driver closed its end or the read failed (the run should stop).
  bool begin() const;
  bool end() const;

 private:
  int in_ = -1, out_ = -1;
};

}  // namespace tier::bench
