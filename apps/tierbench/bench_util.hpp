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

}  // namespace tier::bench
