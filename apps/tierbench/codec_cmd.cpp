// tierbench codec --preset NAME [--blocks N] [--rounds N] [--zstd-level L]
//
// Host PAGE encode/decode throughput against memcpy of the same bytes in the same run, SLOT
// (AOS1 + CRC-32) encode/decode, and zstd throughput and ratio on the PAGE image. The engine
// memory is filled with synthetic fp8-like values (a quantized bell curve), which compress about
// as well as real KV data of that dtype; the numbers are for comparison within one run.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "bench_util.hpp"
#include "cli.hpp"
#include "tier/dsv4/geometry.hpp"
#include "tier/dsv4/page_codec.hpp"
#include "tier/dsv4/slot_codec.hpp"
#include "tier/options.hpp"
#include "tier/registry.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using tier::bench::median;

// `n` synthetic fp8-like bytes: a quantized bell curve.
std::vector<std::byte> synthetic_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> bell(0.0, 12.0);
  std::vector<std::byte> buf(n);
  for (auto& b : buf)
    b = static_cast<std::byte>(static_cast<std::int8_t>(std::clamp(bell(rng), -127.0, 127.0)));
  return buf;
}

// Best-of-`rounds` seconds for `fn` (the least disturbed run on a shared machine).
template <class F>
double best_seconds(int rounds, F&& fn) {
  double best = 1e30;
  for (int i = 0; i < rounds; ++i) {
    auto t0 = Clock::now();
    if (!fn()) return -1;
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

double gbps(std::uint64_t bytes, double s) { return s > 0 ? bytes / s / 1e9 : 0; }

// The engine memory of one geometry, filled with synthetic values, and its codecs.
struct Bench {
  tier::dsv4::Geometry geometry;
  std::vector<std::vector<std::byte>> backing;
  std::unique_ptr<tier::dsv4::PageCodec> page;
  std::unique_ptr<tier::dsv4::SlotCodec> slot;
  std::vector<tier::Region> blocks;  // every block, in reverse order (caller order is honoured)
  std::vector<std::byte> image;      // the PAGE image of `blocks`
};

tier::Result<Bench> set_up(const std::string& preset, std::uint64_t blocks) {
  TIER_ASSIGN_OR_RETURN(auto config, tier::dsv4::preset(preset));
  config.num_blocks = std::max<std::uint64_t>(blocks, 1);
  config.num_slots = 2;
  Bench b;
  TIER_ASSIGN_OR_RETURN(b.geometry, tier::dsv4::Geometry::compute(config));
  std::vector<tier::Region> regions;
  for (std::size_t i = 0; i < b.geometry.backings.size(); ++i) {
    b.backing.push_back(synthetic_bytes(b.geometry.backings[i].bytes, i + 1));
    regions.push_back(tier::host_region(b.backing.back()));
  }
  TIER_ASSIGN_OR_RETURN(auto layout, tier::dsv4::bind_memory(b.geometry, regions));
  TIER_ASSIGN_OR_RETURN(b.page, tier::dsv4::PageCodec::create(layout.page, config.num_blocks));
  tier::dsv4::SlotIdentity id{
      tier::dsv4::slot_fingerprint(b.geometry, tier::Key128{1, 2}, 1, 0), 1, 0};
  TIER_ASSIGN_OR_RETURN(b.slot, tier::dsv4::SlotCodec::create(layout.slot, config.num_slots, id));
  std::vector<std::uint32_t> ids(config.num_blocks);
  std::iota(ids.rbegin(), ids.rend(), 0u);
  TIER_ASSIGN_OR_RETURN(b.blocks, b.page->describe(ids));
  b.image.resize(config.num_blocks * b.geometry.page_bytes_per_block);
  return b;
}

// PAGE encode and decode against memcpy of the same bytes; leaves the image in b.image.
tier::Status bench_page(Bench& b, int rounds) {
  const std::uint64_t image_bytes = b.image.size();
  std::vector<std::byte> contiguous = synthetic_bytes(image_bytes, 99);
  // The four copies alternate inside every round, so each codec run and its memcpy baseline see
  // the same machine load. Throughput is the best round; the ratio is the median of the
  // per-round ratios (robust against load changing between rounds on a shared machine).
  double t_memcpy = 1e30, t_enc = 1e30, t_memcpy_back = 1e30, t_dec = 1e30;
  std::vector<double> enc_ratio, dec_ratio;
  for (int r = 0; r < rounds; ++r) {
    double m = best_seconds(1, [&] {
      std::memcpy(b.image.data(), contiguous.data(), image_bytes);
      return true;
    });
    double e = best_seconds(1, [&] { return b.page->encode(b.blocks, b.image).is_ok(); });
    double mb = best_seconds(1, [&] {
      std::memcpy(contiguous.data(), b.image.data(), image_bytes);
      return true;
    });
    double d = best_seconds(1, [&] { return b.page->decode(b.image, b.blocks).is_ok(); });
    if (e < 0 || d < 0) return tier::Status::invalid("PAGE codec failed during the benchmark");
    t_memcpy = std::min(t_memcpy, m);
    t_enc = std::min(t_enc, e);
    t_memcpy_back = std::min(t_memcpy_back, mb);
    t_dec = std::min(t_dec, d);
    enc_ratio.push_back(m / e);
    dec_ratio.push_back(mb / d);
  }
  fmt::print("memcpy            {:7.2f} GB/s  (one contiguous copy of the image; back: {:.2f})\n",
             gbps(image_bytes, t_memcpy), gbps(image_bytes, t_memcpy_back));
  fmt::print("PAGE encode       {:7.2f} GB/s  {:.2f}x memcpy  ({} spans, plan + gather)\n",
             gbps(image_bytes, t_enc), median(enc_ratio), b.blocks.size());
  fmt::print("PAGE decode       {:7.2f} GB/s  {:.2f}x memcpy  (validate + scatter)\n",
             gbps(image_bytes, t_dec), median(dec_ratio));
  return tier::Status::ok();
}

tier::Status bench_slot(const Bench& b, int rounds) {
  TIER_ASSIGN_OR_RETURN(auto slot_src, b.slot->describe(0));
  const tier::dsv4::SlotBoundaryCodec sc = b.slot->at({256, 0x1234});
  const std::uint64_t slot_bytes = b.geometry.slot_bytes;
  std::vector<std::byte> frame(tier::dsv4::kAos1HeaderBytes + slot_bytes);
  double t_senc = best_seconds(rounds, [&] { return sc.encode(slot_src, frame).is_ok(); });
  double t_sdec = best_seconds(rounds, [&] { return sc.decode(frame, slot_src).is_ok(); });
  if (t_senc < 0 || t_sdec < 0)
    return tier::Status::invalid("SLOT codec failed during the benchmark");
  fmt::print("SLOT encode       {:7.2f} GB/s  ({} slot, gather + CRC-32)\n",
             gbps(slot_bytes, t_senc), tier::format_size(slot_bytes));
  fmt::print("SLOT decode       {:7.2f} GB/s  (AOS1 checks + CRC-32 + scatter)\n",
             gbps(slot_bytes, t_sdec));
  return tier::Status::ok();
}

// zstd on the PAGE image. Returns: the exit code (1 when the round trip is not bit-exact).
int bench_zstd(const Bench& b, int rounds, int level) {
  auto stage = tier::Registry::global().create_stage("zstd", tier::Json{{"level", level}});
  if (!stage) {
    fmt::print("zstd              not built ({})\n", stage.status().to_string());
    return 0;
  }
  const std::uint64_t image_bytes = b.image.size();
  std::vector<std::byte> packed((*stage)->max_encoded_size(image_bytes)), back(image_bytes);
  std::size_t packed_bytes = 0;
  int zrounds = std::max(1, rounds / 2);
  double t_z = best_seconds(zrounds, [&] {
    auto n = (*stage)->encode(tier::dsv4::kPageLayoutId, b.image, packed);
    if (n) packed_bytes = *n;
    return n.is_ok();
  });
  std::span<const std::byte> packed_view(packed.data(), packed_bytes);
  double t_uz = best_seconds(zrounds, [&] {
    return (*stage)->decode(packed_view, tier::dsv4::kPageLayoutId, back).is_ok();
  });
  if (t_z < 0 || t_uz < 0) return tier::cli::fail("zstd failed during the benchmark");
  bool exact = std::memcmp(back.data(), b.image.data(), image_bytes) == 0;
  fmt::print("zstd level {:<3}    compress {:.2f} GB/s, decompress {:.2f} GB/s, ratio {:.3f} "
             "({} -> {}), bit-exact {}\n",
             level, gbps(image_bytes, t_z), gbps(image_bytes, t_uz),
             static_cast<double>(image_bytes) / static_cast<double>(packed_bytes),
             tier::format_size(image_bytes), tier::format_size(packed_bytes),
             exact ? "yes" : "NO");
  return exact ? 0 : 1;
}

int run_codec(tier::cli::Args& args) {
  std::string preset = args.get_or("preset", "v4-pro-fp8");
  std::uint64_t blocks = args.uint("blocks", 1, 65536).value_or(64);
  int rounds = static_cast<int>(args.uint("rounds", 1, 1000).value_or(11));
  int level = static_cast<int>(args.uint("zstd-level", 1, 22).value_or(3));
  args.finish();
  auto bench = set_up(preset, blocks);
  if (!bench)
    return tier::cli::fail(bench.status().to_string(),
                           bench.status() == tier::Code::kNotFound ? 2 : 1);
  fmt::print("== tierbench codec --preset {}: {} blocks x {} = {} PAGE image, {} rounds (best)\n",
             preset, bench->geometry.config.num_blocks,
             tier::format_size(bench->geometry.page_bytes_per_block),
             tier::format_size(bench->image.size()), rounds);
  tier::Status st = bench_page(*bench, rounds);
  if (st) st = bench_slot(*bench, rounds);
  if (!st) return tier::cli::fail(std::string(st.message()));
  return bench_zstd(*bench, rounds, level);
}

}  // namespace

TIER_CLI_COMMAND(codec, "codec [--preset v4-pro-fp8] [--blocks N] [--rounds N] [--zstd-level L]",
                 "DSV4 PAGE/SLOT codec and zstd throughput against memcpy of the same bytes",
                 run_codec);
