#include "bench_util.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>

#include "tier/options.hpp"

namespace tier::bench {

AlignedBuffer aligned_buffer(std::size_t bytes, std::size_t alignment) {
  alignment = std::max<std::size_t>(alignment, 64);
  std::size_t n = (std::max<std::size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(alignment, n));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, n);
  return AlignedBuffer(p);
}

std::string check_memory(std::uint64_t count, std::uint64_t bytes, std::uint64_t copies,
                         std::string_view what) {
  std::uint64_t total = 0;
  if (__builtin_mul_overflow(count, bytes, &total) || __builtin_mul_overflow(total, copies, &total))
    return fmt::format("{}: {} x {} bytes x {} is more than 2^64 bytes", what, count, bytes,
                       copies);
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  std::uint64_t limit =
      pages > 0 && page > 0 ? std::uint64_t(pages) * std::uint64_t(page) : UINT64_MAX;
  const char* bound = "the machine's memory";
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY && as.rlim_cur < limit) {
    limit = as.rlim_cur;
    bound = "the address-space limit (ulimit -v)";
  }
  if (total > limit)
    return fmt::format("{} need {} of memory, more than {} ({})", what, format_size(total), bound,
                       format_size(limit));
  return {};
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double percentile_us(std::vector<double> samples, double pct) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  std::size_t idx =
      static_cast<std::size_t>(pct / 100.0 * static_cast<double>(samples.size() - 1) + 0.5);
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

Turns Turns::from(cli::Args& args) {
  if (!args.get("turns")) return {};
  const std::vector<std::uint64_t> fds = args.list("turns", "", 0, INT_MAX);
  if (fds.size() != 2) std::exit(cli::fail("--turns: expected IN,OUT (two descriptors)", 2));
  for (std::uint64_t fd : fds)
    if (::fcntl(static_cast<int>(fd), F_GETFD) < 0)
      std::exit(cli::fail(fmt::format("--turns: descriptor {} is not open", fd), 2));
  Turns t;
  t.in_ = static_cast<int>(fds[0]);
  t.out_ = static_cast<int>(fds[1]);
  return t;
}

bool Turns::begin() const {
  if (in_ < 0) return true;
  char c;
  ssize_t n;
  while ((n = ::read(in_, &c, 1)) < 0 && errno == EINTR) {
  }
  return n == 1;
}

bool Turns::end() const {
  if (out_ < 0) return true;
  const char c = '.';
  ssize_t n;
  while ((n = ::write(out_, &c, 1)) < 0 && errno == EINTR) {
  }
  return n == 1;
}

}  // namespace tier::bench
