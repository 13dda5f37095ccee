#include "bench_util.hpp"

#include <algorithm>
#include <cstring>
#include <new>

namespace tier::bench {

AlignedBuffer aligned_buffer(std::size_t bytes, std::size_t alignment) {
  alignment = std::max<std::size_t>(alignment, 64);
  std::size_t n = (std::max<std::size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(alignment, n));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, n);
  return AlignedBuffer(p);
}

double percentile_us(std::vector<double> samples, double pct) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  std::size_t idx = static_cast<std::size_t>(pct / 100.0 * static_cast<double>(samples.size() - 1) + 0.5);
  return samples[std::min(idx, samples.size() - 1)];
}

double memcpy_gb_per_s(const std::vector<std::byte*>& sources, const std::vector<std::byte*>& dests,
                       std::size_t bytes, int repeats) {
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    for (std::size_t i = 0; i < sources.size(); ++i)
      std::memcpy(dests[i % dests.size()], sources[i], bytes);
    double s = seconds_since(t0);
    if (s > 0) best = std::max(best, static_cast<double>(bytes) * sources.size() / s / 1e9);
  }
  return best;
}

}  // namespace tier::bench
