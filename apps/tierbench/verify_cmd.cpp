// tierbench verify [--object-sizes 1MiB,16MiB] [--threads 1,2,4,8] [--total 512MiB] [--rounds N]
//
// Host-side verification of stored images (docs/object-format.md) against memcpy of the same
// bytes in the same run, for each verification thread count (set_verify_threads; the caller
// counts as one):
//   verify v1       verify_object of a version 1 image: one XXH3 over the payload, one thread
//                   (what a get into device memory waited for before version 2);
//   verify v2       verify_object of a version 2 image: 64 KiB chunks hashed on the threads
//                   (what the pinned tier runs beside the DMA of a get into device memory);
//   copy_verif.     a verified host get (copy_verified, the cpu tier's host path) of a version 1
//                   image (one thread) and of a version 2 image (chunks on the threads);
//   memcpy          one thread's memcpy of the images into the destinations (the baseline).
// The images (--total bytes of --object-sizes each, more than the caches hold) are read in turn,
// as a tier reads its objects; each figure is the best of --rounds passes.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "cli.hpp"
#include "tier/object.hpp"
#include "tier/options.hpp"

namespace {

using namespace tier;
using bench::Clock;

// Best-of-`rounds` seconds of one pass over every image; negative when a pass failed.
template <class F>
double best_pass(int rounds, std::size_t images, F&& per_image) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = Clock::now();
    for (std::size_t i = 0; i < images; ++i)
      if (!per_image(i)) return -1;
    best = std::min(best, bench::seconds_since(t0));
  }
  return best;
}

int run_verify(cli::Args& args) {
  const auto sizes = args.list("object-sizes", "1MiB,16MiB", 1, 16ull << 30, true);
  const auto thread_counts = args.list("threads", "1,2,4,8", 1, 1024);
  const std::uint64_t total = args.size("total", 1, 1ull << 40).value_or(512ull << 20);
  const int rounds = static_cast<int>(args.uint("rounds", 1, 1000).value_or(3));
  args.finish();

  const unsigned default_threads = verify_threads();
  fmt::print("verification threads by default: {} (TIER_VERIFY_THREADS); hardware threads: {}\n",
             default_threads, std::thread::hardware_concurrency());
  fmt::print("  GB/s and x memcpy (one thread's memcpy of the same bytes)\n");
  fmt::print("  {:>10} {:>7} {:>8}  {:>14}  {:>14}  {:>14}  {:>14}\n", "image", "threads", "memcpy",
             "verify v1", "verify v2", "copy_verif. v1", "copy_verif. v2");
  for (std::uint64_t image_bytes : sizes) {
    if (image_bytes <= kObjectHeaderBytes)
      return cli::fail("--object-sizes must exceed the 96-byte header", 2);
    const std::size_t count =
        static_cast<std::size_t>(std::max<std::uint64_t>(2, total / image_bytes));
    const std::size_t n = static_cast<std::size_t>(image_bytes);
    std::vector<bench::AlignedBuffer> v1, v2, dst;
    std::vector<std::byte*> src_ptrs, dst_ptrs;
    std::mt19937_64 rng(7);
    for (std::size_t i = 0; i < count; ++i) {
      v2.push_back(bench::aligned_buffer(n, 4096));
      auto* words = reinterpret_cast<std::uint64_t*>(v2.back().get() + kObjectHeaderBytes);
      for (std::size_t w = 0; w < (n - kObjectHeaderBytes) / 8; ++w) words[w] = rng();
      const ObjectKey key{Key128{1, 2}, Key128{i, n}, 0};
      seal_object({v2.back().get(), n}, 1, 0, key);
      v1.push_back(bench::aligned_buffer(n, 4096));
      std::memcpy(v1.back().get(), v2.back().get(), n);
      seal_object({v1.back().get(), n}, 1, 0, key, kObjectVersionWholePayload);
      dst.push_back(bench::aligned_buffer(n, 4096));
      src_ptrs.push_back(v2.back().get());
      dst_ptrs.push_back(dst.back().get());
    }
    auto key_of = [&](std::size_t i) { return ObjectKey{Key128{1, 2}, Key128{i, n}, 0}; };
    const double bytes = static_cast<double>(n) * count;
    const double memcpy_gbps = bench::memcpy_gb_per_s(src_ptrs, dst_ptrs, n, rounds);
    for (std::uint64_t t : thread_counts) {
      set_verify_threads(static_cast<unsigned>(t));
      const double s1 = best_pass(rounds, count, [&](std::size_t i) {
        return verify_object({v1[i].get(), n}, key_of(i)).is_ok();
      });
      const double s2 = best_pass(rounds, count, [&](std::size_t i) {
        return verify_object({v2[i].get(), n}, key_of(i)).is_ok();
      });
      const double c1 = best_pass(rounds, count, [&](std::size_t i) {
        return copy_verified({dst[i].get(), n}, {v1[i].get(), n}, key_of(i)).is_ok();
      });
      const double c2 = best_pass(rounds, count, [&](std::size_t i) {
        return copy_verified({dst[i].get(), n}, {v2[i].get(), n}, key_of(i)).is_ok();
      });
      if (s1 < 0 || s2 < 0 || c1 < 0 || c2 < 0) return cli::fail("an image failed verification");
      auto col = [&](double s) {
        const double g = bytes / s / 1e9;
        return fmt::format("{:>7.2f} {:>5.2f}x", g, g / memcpy_gbps);
      };
      fmt::print("  {:>10} {:>7} {:>8.2f}  {}  {}  {}  {}\n", n, t, memcpy_gbps, col(s1), col(s2),
                 col(c1), col(c2));
    }
  }
  set_verify_threads(default_threads);
  return 0;
}

}  // namespace

TIER_CLI_COMMAND(verify,
                 "verify [--object-sizes 1MiB,16MiB] [--threads 1,2,4,8] [--total 512MiB] "
                 "[--rounds N]",
                 "host verification of stored images (object format v1 and v2) with N threads "
                 "vs memcpy of the same bytes",
                 run_verify);
