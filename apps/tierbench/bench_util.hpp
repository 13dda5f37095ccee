#pragma once
// Measurement helpers shared by tierbench commands: aligned buffers, latency percentiles, and the
// memcpy baseline every tier figure is compared with.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

namespace tier::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct FreeDeleter {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte[], FreeDeleter>;

// `bytes` rounded up to `alignment`, zero-filled so every page is touched.
AlignedBuffer aligned_buffer(std::size_t bytes, std::size_t alignment);

// Percentile (0..100) of `samples` in microseconds; sorts a copy.
double percentile_us(std::vector<double> samples, double pct);

// GB/s of memcpy from `sources` into `dests` (dests[i % dests.size()]), `bytes` each, best of
// `repeats` passes. The same access pattern as the tier operation it is a baseline for.
double memcpy_gb_per_s(const std::vector<std::byte*>& sources, const std::vector<std::byte*>& dests,
                       std::size_t bytes, int repeats = 3);

}  // namespace tier::bench
