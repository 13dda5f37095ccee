// tierbench gpu [--preset NAME] [--blocks 16,32,64] [--iters N] [--region-bytes 4096]
//               [--regions-per-block 64] [--device N] [--tier-objects 65536,1048576,16777216]
//               [--tier-batch 1,16,64] [--verify-threads 0]
//
// GPU PAGE save (gather, device to pinned host) and load (scatter, pinned host to device)
// bandwidth through the device copy executor, for the DSV4 codec's plans of a scattered list of
// blocks, beside two baselines of the same bytes in the same run:
//   bulk        one runtime copy of the whole image between a contiguous device buffer and the
//               same pinned host image (the PCIe ceiling for this transfer size);
//   per-region  one runtime copy call per region span (what naive connectors do).
// Save and load run through each image path (zero-copy, staged, and the executor's auto
// choice). The second part repeats this for a synthetic layout of small regions
// (--regions-per-block regions of --region-bytes each), where per-call overhead dominates.
// Each figure is wall time over --iters transfers after one warm-up, stream synchronized.
// The last part measures the cpu tier's pinned mode ("pinned": true) for objects whose payloads
// are --tier-objects bytes, --tier-batch objects per submit: puts from device memory and gets
// into device memory (scattered, as a TierStack's direct loads make them: verified on the GPU for
// object format version 2, on the host threads for version 1, for each --verify-threads count,
// 0 = the default: TIER_VERIFY_THREADS or min(hardware threads, 8)), beside one bulk copy of
// the same bytes between device memory and pinned host memory.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <vector>

#include "bench_util.hpp"
#include "cli.hpp"
#include "gpu.hpp"
#include "tier/dsv4/geometry.hpp"
#include "tier/dsv4/page_codec.hpp"
#include "tier/object.hpp"
#include "tier/registry.hpp"

namespace {

using namespace tier;
using namespace tier::gpu;
using tier::bench::median;
using tier::bench::timed;
using Clock = std::chrono::steady_clock;

struct Bench {
  int device;
  int iters;
  Stream& stream;
  DeviceCopyExecutor& zero_copy;
  DeviceCopyExecutor& staged;
  DeviceCopyExecutor& automatic;
  PinnedBuffer& image;
  DeviceBuffer& contiguous;
};

// Seconds per call of `op` (a Status-returning enqueue), or a negative value on error.
template <class F>
double per_call(Bench& b, F&& op) {
  Status s = op();  // warm-up: allocations, descriptor slots, page mappings
  if (s) s = b.stream.synchronize();
  if (!s) {
    fmt::print(stderr, "tierbench gpu: {}\n", s.to_string());
    return -1;
  }
  auto t0 = Clock::now();
  for (int i = 0; i < b.iters && s; ++i) s = op();
  if (s) s = b.stream.synchronize();
  if (!s) {
    fmt::print(stderr, "tierbench gpu: {}\n", s.to_string());
    return -1;
  }
  return std::chrono::duration<double>(Clock::now() - t0).count() / b.iters;
}

double gbps(std::uint64_t bytes, double s) { return s > 0 ? bytes / s / 1e9 : 0; }

// One runtime copy per span of `plan` between the engine memory and `img`, as naive connectors
// do: into the image (`to_image`, a save) or out of it (a load).
Status per_region_copies(Bench& b, const CopyPlan& plan, Region img, bool to_image) {
  for (const CopySpan& s : plan.spans) {
    Region engine{s.engine, s.bytes, MemoryKind::kDevice, b.device};
    Region image = img.slice(s.image_offset, s.bytes);
    Status st =
        to_image ? copy_async(image, engine, b.stream) : copy_async(engine, image, b.stream);
    if (!st) return st;
  }
  return Status::ok();
}

// Runs every variant for one plan and prints its rows; returns false on an error.
bool measure(Bench& b, const std::string& label, const CopyPlan& plan, std::size_t spans) {
  const std::uint64_t n = plan.image_bytes;
  Region img = b.image.region().slice(0, n);
  Region dev = b.contiguous.region().slice(0, n);
  struct Row {
    const char* name;
    double seconds;
  };
  std::vector<Row> rows;
  auto add = [&](const char* name, double s) {
    rows.push_back({name, s});
    return s >= 0;
  };
  bool ok = true;
  // Save: device -> pinned host.
  ok &= add("bulk D2H (1 copy)", per_call(b, [&] { return copy_async(img, dev, b.stream); }));
  ok &= add("per-region D2H", per_call(b, [&] { return per_region_copies(b, plan, img, true); }));
  ok &= add("PAGE save zero-copy",
            per_call(b, [&] { return b.zero_copy.gather_async(plan, img, b.stream); }));
  ok &= add("PAGE save staged",
            per_call(b, [&] { return b.staged.gather_async(plan, img, b.stream); }));
  ok &= add("PAGE save auto",
            per_call(b, [&] { return b.automatic.gather_async(plan, img, b.stream); }));
  // Load: pinned host -> device.
  ok &= add("bulk H2D (1 copy)", per_call(b, [&] { return copy_async(dev, img, b.stream); }));
  ok &= add("per-region H2D", per_call(b, [&] { return per_region_copies(b, plan, img, false); }));
  ok &= add("PAGE load zero-copy",
            per_call(b, [&] { return b.zero_copy.scatter_async(plan, img, b.stream); }));
  ok &= add("PAGE load staged",
            per_call(b, [&] { return b.staged.scatter_async(plan, img, b.stream); }));
  ok &= add("PAGE load auto",
            per_call(b, [&] { return b.automatic.scatter_async(plan, img, b.stream); }));
  if (!ok) return false;

  fmt::print("\n{}: {} spans, image {} bytes ({:.2f} MiB)\n", label, spans, n, n / 1048576.0);
  fmt::print("  {:<22} {:>10} {:>9} {:>8} {:>11}\n", "transfer", "us", "GB/s", "x bulk",
             "x per-reg");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const bool save = i < 5;
    const double bulk = rows[save ? 0 : 5].seconds;
    const double naive = rows[save ? 1 : 6].seconds;
    fmt::print("  {:<22} {:>10.1f} {:>9.2f} {:>8.2f} {:>11.1f}\n", rows[i].name,
               rows[i].seconds * 1e6, gbps(n, rows[i].seconds), bulk / rows[i].seconds,
               naive / rows[i].seconds);
  }
  const double save_best = std::min({rows[2].seconds, rows[3].seconds});
  const double load_best = std::min({rows[7].seconds, rows[8].seconds});
  fmt::print("  auto: save {} / load {}; best save {:.2f}x bulk, {:.1f}x per-region; best load "
             "{:.2f}x bulk, {:.1f}x per-region\n",
             image_path_name(b.automatic.path_for(MemoryKind::kPinnedHost, n, true)),
             image_path_name(b.automatic.path_for(MemoryKind::kPinnedHost, n, false)),
             rows[0].seconds / save_best, rows[1].seconds / save_best,
             rows[5].seconds / load_best, rows[6].seconds / load_best);
  return true;
}

// `count` distinct block ids out of [0, num_blocks), in a scattered caller order.
std::vector<std::uint32_t> scattered_ids(std::uint64_t count, std::uint64_t num_blocks) {
  std::vector<std::uint32_t> all(num_blocks);
  std::iota(all.begin(), all.end(), 0u);
  std::mt19937 rng(1234);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(count);
  return all;
}

// Requests through a backend in one submit, then polled until every one completed.
Status requests(Backend& be, std::span<const IoRequest> reqs) {
  std::size_t at = 0;
  while (at < reqs.size()) {
    auto n = be.submit(reqs.subspan(at));
    if (!n) return n.status();
    at += *n;
  }
  std::vector<Completion> c(reqs.size());
  for (std::size_t got = 0; got < reqs.size();) {
    auto n = be.poll(std::span(c).subspan(got), 1, std::chrono::seconds(10));
    if (!n) return n.status();
    if (*n == 0) return Status(Code::kTimedOut, "no completion");
    got += *n;
  }
  for (const Completion& x : c)
    if (!x.status) return x.status;
  return Status::ok();
}

// The cpu tier's pinned mode against bulk copies of the same bytes: for each payload size and
// batch size K, K objects per submit (one request each, polled until all completed): K puts from
// device memory, K gets into device memory (scattered: the object's header into host memory, its
// payload straight into device memory, verified on the GPU; images in object format v2), and
// the same gets of v1 images (verified on the host threads: one row per --verify-threads count,
// 0 = the default). The baselines move the K images in one runtime copy between a contiguous
// device buffer and pinned host memory, followed by a stream synchronization: the bus's rate for
// those bytes. --iters rounds, each measuring every figure once in turn; each ratio is the median
// of the rounds' ratios to their own bulk copy. Returns the exit code.
int measure_pinned_tier(int device, int iters, const std::vector<std::uint64_t>& sizes,
                        const std::vector<std::uint64_t>& batches,
                        const std::vector<std::uint64_t>& thread_counts, Stream& stream) {
  fmt::print(
      "\ncpu tier, \"pinned\": true: K objects per submit, puts from and gets into device "
      "memory; gets verified (object format v{}: on the GPU; v1: on the host threads); bulk = "
      "one copy of the K images\n",
      kObjectVersion);
  fmt::print("  {:>10} {:>5} {:>7} {:>9} {:>9} {:>6} {:>9} {:>9} {:>6} {:>9} {:>6}\n", "image", "K",
             "threads", "D2H GB/s", "put GB/s", "x bulk", "H2D GB/s", "get v2", "x bulk", "get v1",
             "x bulk");
  const unsigned default_threads = verify_threads();
  for (std::uint64_t payload : sizes) {
    for (std::uint64_t k : batches) {
      const std::uint64_t n = payload + kObjectHeaderBytes;
      const std::uint64_t all = k * n;
      auto tier = Registry::global().create_backend(
          "cpu", BackendContext{"pinned", 2 * all + n, Json{{"pinned", true}}});
      if (!tier) return cli::fail(tier.status().to_string());
      std::vector<ObjectKey> keys, keys_v1;
      std::vector<std::byte> img(all), img_v1(all);
      std::mt19937_64 rng(n);
      for (std::uint64_t i = 0; i < k; ++i) {
        keys.push_back(ObjectKey{Key128{1, 2}, Key128{3 + 2 * i, n}, 0});
        keys_v1.push_back(ObjectKey{Key128{1, 2}, Key128{4 + 2 * i, n}, 0});
        auto one = std::span(img).subspan(i * n, n);
        for (std::size_t b = kObjectHeaderBytes; b + 8 <= n; b += 8) {
          const std::uint64_t w = rng();
          std::memcpy(one.data() + b, &w, 8);
        }
        std::copy(one.begin(), one.end(), img_v1.begin() + static_cast<std::ptrdiff_t>(i * n));
        seal_object(one, 1, 0, keys[i]);
        seal_object(std::span(img_v1).subspan(i * n, n), 1, 0, keys_v1[i],
                    kObjectVersionWholePayload);
      }
      auto src = DeviceBuffer::allocate(device, all);
      auto src_v1 = DeviceBuffer::allocate(device, all);
      auto dst = DeviceBuffer::allocate(device, all);
      auto host = PinnedBuffer::allocate(all);
      if (!src || !src_v1 || !dst || !host)
        return cli::fail("cannot allocate the tier benchmark's buffers");
      Status s = copy_async(src->region(), host_region(img), stream);
      if (s) s = copy_async(src_v1->region(), host_region(img_v1), stream);
      if (s) s = stream.synchronize();
      if (!s) return cli::fail(s.to_string());
      Backend& be = **tier;
      auto puts = [&](const std::vector<ObjectKey>& ks, const DeviceBuffer& from) {
        std::vector<IoRequest> r;
        for (std::uint64_t i = 0; i < k; ++i)
          r.push_back(IoRequest{Op::kPut, ks[i], from.region().slice(i * n, n), i});
        return requests(be, r);
      };
      std::vector<std::array<std::byte, kObjectHeaderBytes>> heads(k);
      std::vector<Region> tails(k);
      // K scattered gets: each object's header into host memory, its payload into `dst`.
      auto get_requests = [&](const std::vector<ObjectKey>& ks) {
        std::vector<IoRequest> r;
        for (std::uint64_t i = 0; i < k; ++i) {
          write_object_header(heads[i], ObjectHeader{1, 0, ks[i], payload, 0});
          tails[i] = dst->region().slice(i * n + kObjectHeaderBytes, payload);
          IoRequest q{Op::kGet, ks[i], host_region(heads[i]), i};
          q.tail = std::span(&tails[i], 1);
          r.push_back(q);
        }
        return r;
      };
      auto gets = [&](const std::vector<ObjectKey>& ks) { return requests(be, get_requests(ks)); };
      // Rounds of every figure in turn (round 0 warms up): the bulk D2H, K puts, the bulk H2D, K
      // gets of the v2 images, K gets of the v1 images, then untimed removes of the puts' keys.
      // Each "x bulk" is the median of the rounds' ratios to their own bulk copy, so that the
      // bus's drift between figures does not enter it; rates are medians.
      auto bulk = [&](Region to, Region from) {
        Status st = copy_async(to, from, stream);
        return st ? stream.synchronize() : st;
      };
      if (Status stored = puts(keys_v1, *src_v1); !stored) return cli::fail(stored.to_string());
      for (std::uint64_t threads : thread_counts) {
        set_verify_threads(static_cast<unsigned>(threads));
        std::vector<double> d2h, put, h2d, get, get_v1, put_x, get_x, get_v1_x;
        for (int round = 0; round <= iters; ++round) {
          auto d = timed([&] { return bulk(host->region(), src->region()); });
          auto p = timed([&] { return puts(keys, *src); });
          auto h = timed([&] { return bulk(dst->region(), host->region()); });
          auto g = timed([&] { return gets(keys); });
          auto g1 = timed([&] { return gets(keys_v1); });
          Status st;
          for (std::uint64_t i = 0; i < k && st; ++i) {
            IoRequest rm{Op::kRemove, keys[i], Region{}, i};
            st = requests(be, std::span(&rm, 1));
          }
          for (const Status& s : {d.status(), p.status(), h.status(), g.status(), g1.status(), st})
            if (!s) return cli::fail(s.to_string());
          if (round == 0) continue;
          d2h.push_back(*d), put.push_back(*p), h2d.push_back(*h), get.push_back(*g);
          get_v1.push_back(*g1);
          put_x.push_back(*d / *p), get_x.push_back(*h / *g), get_v1_x.push_back(*h / *g1);
        }
        fmt::print(
            "  {:>10} {:>5} {:>7} {:>9.2f} {:>9.2f} {:>6.3f} {:>9.2f} {:>9.2f} {:>6.3f} {:>9.2f} "
            "{:>6.3f}\n",
            n, k, verify_threads(), gbps(all, median(d2h)), gbps(all, median(put)), median(put_x),
            gbps(all, median(h2d)), gbps(all, median(get)), median(get_x),
            gbps(all, median(get_v1)), median(get_v1_x));
      }
      if (Status stored = puts(keys, *src); !stored) return cli::fail(stored.to_string());
      set_verify_threads(default_threads);
      // Where a get's time goes: the submit alone (the host's checks and enqueues), and the same
      // device work from the runtime alone (per object: its payload's DMA into device memory on
      // one stream; on another, once it landed, the verification and a gated copy into the
      // destination), which bounds what the tier can reach.
      double submit_s = 0;
      Status st;
      for (int i = 0; i < iters && st; ++i) {
        const std::vector<IoRequest> r = get_requests(keys);
        auto t0 = Clock::now();
        auto sub = be.submit(r);
        submit_s += std::chrono::duration<double>(Clock::now() - t0).count();
        if (!sub || *sub != k) st = sub ? Status(Code::kBadState, "partial submit") : sub.status();
        std::vector<Completion> c(k);
        for (std::uint64_t got = 0; st && got < k;) {
          auto m = be.poll(std::span(c).subspan(got), 1, std::chrono::seconds(10));
          if (!m || *m == 0)
            st = m ? Status(Code::kTimedOut, "no completion") : m.status();
          else
            got += *m;
        }
      }
      auto up = Stream::create(device);
      auto ring =
          DeviceBuffer::allocate(device, k * (n + 4096) + verify_scratch_bytes(payload) + 512);
      auto exec = DeviceCopyExecutor::create(ExecutorOptions{device});
      auto words = PinnedBuffer::allocate(4 * k);
      auto counters = VerifyCounters::allocate(stream);
      if (!st || !up || !ring || !exec || !words || !counters)
        return cli::fail("tier diagnostics failed");
      std::vector<Event> landed;
      for (std::uint64_t j = 0; j < k; ++j)
        landed.push_back(std::move(Event::create(device)).value());
      std::vector<std::uint64_t> sums;
      for (std::uint64_t j = 0; j < k; ++j)
        sums.push_back(
            payload_checksum(std::span(img).subspan(j * n + kObjectHeaderBytes, payload)));
      const std::uint64_t slot = (n + 4095) / 4096 * 4096;
      std::vector<std::vector<CopySpan>> spans(k);
      auto raw_op = [&]() -> Status {
        for (std::uint64_t j = 0; j < k; ++j) {
          const Region staged{ring->data() + j * slot, payload, MemoryKind::kDevice, device};
          const Region scratch{ring->data() + j * slot + (payload + 255) / 256 * 256,
                               verify_scratch_bytes(payload), MemoryKind::kDevice, device};
          TIER_RETURN_IF_ERROR(
              copy_async(staged, host->region().slice(j * n + kObjectHeaderBytes, payload), *up));
          TIER_RETURN_IF_ERROR(landed[j].record(*up));
          TIER_RETURN_IF_ERROR(stream_wait_event(stream, landed[j].handle()));
          TIER_RETURN_IF_ERROR(
              verify_payload_async(staged, sums[j], scratch,
                                   reinterpret_cast<std::uint32_t*>(words->data()) + j, *counters,
                                   stream));
          spans[j] = {CopySpan{dst->data() + j * n, 0, payload}};
          TIER_RETURN_IF_ERROR((*exec)->scatter_async(
              CopyPlan{spans[j], MemoryKind::kDevice, device, payload}, staged, stream,
              reinterpret_cast<const std::uint32_t*>(scratch.data)));
        }
        return stream.synchronize();
      };
      // The least the tier's batches allow, whatever their verification costs: the same bytes
      // as DMAs of a submit's batches back to back (4 MiB first, 8 MiB between, 4 MiB or less
      // last: backends/cpu/pinned_transfer.cpp), each followed on another stream by two kernels
      // that do nothing (where a batch's verification and gated copy go).
      constexpr std::uint64_t kShort = 4u << 20, kLong = 8u << 20;
      std::vector<std::uint64_t> batch_bytes{std::min(kShort, all)};
      for (std::uint64_t rest = all - batch_bytes[0]; rest > 0; rest -= batch_bytes.back())
        batch_bytes.push_back(rest <= kShort ? rest : rest <= kLong ? kShort : kLong);
      while (landed.size() < batch_bytes.size())
        landed.push_back(std::move(Event::create(device)).value());
      auto chain_op = [&]() -> Status {
        std::uint64_t at = 0;
        for (std::size_t j = 0; j < batch_bytes.size(); at += batch_bytes[j++]) {
          TIER_RETURN_IF_ERROR(copy_async(dst->region().slice(at, batch_bytes[j]),
                                          host->region().slice(at, batch_bytes[j]), *up));
          TIER_RETURN_IF_ERROR(landed[j].record(*up));
          TIER_RETURN_IF_ERROR(stream_wait_event(stream, landed[j].handle()));
          TIER_RETURN_IF_ERROR(spin_async(stream.handle(), device, 0));
          TIER_RETURN_IF_ERROR(spin_async(stream.handle(), device, 0));
        }
        return stream.synchronize();
      };
      // The least any gets verified on the GPU before their copy allow: all the bytes in one
      // DMA, then on another stream (the handoff every landing takes) the last object's
      // verification and its gated copy, which cannot start before its last byte landed.
      const std::uint64_t last_at = (k - 1) * n + kObjectHeaderBytes;
      const std::uint64_t shift = (256 - last_at % 256) % 256;  // its payload 256-byte aligned
      const Region last{ring->data() + shift + last_at, payload, MemoryKind::kDevice, device};
      const Region last_scratch{ring->data() + (shift + all + 255) / 256 * 256,
                                verify_scratch_bytes(payload), MemoryKind::kDevice, device};
      const std::vector<CopySpan> last_span{CopySpan{dst->data() + last_at, 0, payload}};
      *reinterpret_cast<volatile std::uint32_t*>(words->data()) = 0;
      auto one_dma_op = [&]() -> Status {
        TIER_RETURN_IF_ERROR(copy_async(
            Region{ring->data() + shift, all, MemoryKind::kDevice, device}, host->region(), *up));
        TIER_RETURN_IF_ERROR(landed[0].record(*up));
        TIER_RETURN_IF_ERROR(stream_wait_event(stream, landed[0].handle()));
        TIER_RETURN_IF_ERROR(verify_payload_async(last, sums[k - 1], last_scratch,
                                                  reinterpret_cast<std::uint32_t*>(words->data()),
                                                  *counters, stream));
        TIER_RETURN_IF_ERROR((*exec)->scatter_async(
            CopyPlan{last_span, MemoryKind::kDevice, device, payload}, last, stream,
            reinterpret_cast<const std::uint32_t*>(last_scratch.data)));
        return stream.synchronize();
      };
      // Rounds of the bulk H2D and each of them in turn (round 0 warms up): medians of seconds
      // and of the rounds' ratios to their bulk copy.
      std::vector<double> get, raw, chain, one_dma, raw_x, chain_x, one_dma_x;
      for (int round = 0; round <= iters; ++round) {
        auto h = timed([&] { return bulk(dst->region(), host->region()); });
        auto g = timed([&] { return gets(keys); });
        auto r = timed(raw_op);
        auto c = timed(chain_op);
        auto o = timed(one_dma_op);
        for (const Status& s : {h.status(), g.status(), r.status(), c.status(), o.status()})
          if (!s) return cli::fail(s.to_string());
        if (round == 0) continue;
        get.push_back(*g), raw.push_back(*r), chain.push_back(*c), one_dma.push_back(*o);
        raw_x.push_back(*h / *r), chain_x.push_back(*h / *c), one_dma_x.push_back(*h / *o);
      }
      const auto verdict = *reinterpret_cast<volatile const std::uint32_t*>(words->data());
      if (verdict != kVerdictMatch)
        return cli::fail("the one-DMA bound's verification found no match");
      fmt::print(
          "  {:>10} {:>5}   get v2: submit {:.1f} us of {:.1f} us; the device work from "
          "the runtime alone {:.1f} us ({:.2f} GB/s, {:.3f}x bulk); the batches' DMAs each "
          "followed by two empty kernels {:.1f} us ({:.3f}x bulk); one DMA, then the last "
          "object's verification and gated copy {:.1f} us ({:.3f}x bulk)\n",
          n, k, submit_s / iters * 1e6, median(get) * 1e6, median(raw) * 1e6,
          gbps(all, median(raw)), median(raw_x), median(chain) * 1e6, median(chain_x),
          median(one_dma) * 1e6, median(one_dma_x));
    }
  }
  return 0;
}

// Measures, for each count, the plan of that many scattered blocks out of `total`; `label`
// names a row set by its block count. Returns the exit code.
int measure_scattered(Bench& b, const dsv4::PageCodec& codec,
                      std::span<const std::uint64_t> block_counts, std::uint64_t total,
                      const std::function<std::string(std::uint64_t)>& label) {
  for (std::uint64_t blocks : block_counts) {
    auto regions = codec.describe(scattered_ids(blocks, total));
    if (!regions) return cli::fail(regions.status().to_string());
    auto plan = codec.plan(*regions);
    if (!plan) return cli::fail(plan.status().to_string());
    if (!measure(b, label(blocks), plan->plan(), plan->plan().spans.size())) return 1;
  }
  return 0;
}

// Device buffers and the regions of a PAGE layout bound to them.
struct DeviceLayout {
  std::vector<DeviceBuffer> buffers;
  std::vector<dsv4::BoundRegion> page;
};

// Engine memory: the geometry's backings on the device.
Result<DeviceLayout> engine_layout(const dsv4::Geometry& geo, int device) {
  DeviceLayout out;
  std::vector<Region> regions;
  for (const dsv4::Backing& bk : geo.backings) {
    TIER_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::allocate(device, bk.bytes));
    regions.push_back(buf.region());
    out.buffers.push_back(std::move(buf));
  }
  TIER_ASSIGN_OR_RETURN(auto layout, dsv4::bind_memory(geo, regions));
  out.page = std::move(layout.page);
  return out;
}

// A synthetic layout: `count` regions of `region_bytes` per block, one backing each.
Result<DeviceLayout> small_layout(int device, std::uint64_t count, std::uint64_t region_bytes,
                                  std::uint64_t blocks) {
  DeviceLayout out;
  for (std::uint64_t r = 0; r < count; ++r) {
    TIER_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::allocate(device, region_bytes * blocks));
    out.page.push_back(dsv4::BoundRegion{fmt::format("r{}", r), buf.data(), region_bytes * blocks,
                                         region_bytes, false, MemoryKind::kDevice, device});
    out.buffers.push_back(std::move(buf));
  }
  return out;
}

int run_gpu(cli::Args& args) {
  const std::string preset = args.get_or("preset", "v4-pro-fp8");
  const auto block_counts = args.list("blocks", "16,32,64", 1, 1 << 20);
  const int iters = static_cast<int>(args.uint("iters", 1, 100000).value_or(20));
  const std::uint64_t region_bytes = args.size("region-bytes", 1, 1ull << 30).value_or(4096);
  const std::uint64_t regions_per_block = args.uint("regions-per-block", 1, 1 << 20).value_or(64);
  const int device = static_cast<int>(args.uint("device", 0, 1023).value_or(0));
  const auto tier_objects = args.list("tier-objects", "65536,1048576,16777216", 1, 1ull << 40);
  const auto verify_thread_counts = args.list("verify-threads", "0", 0, 1024);
  const auto tier_batches = args.list("tier-batch", "1,16,64", 1, 1 << 16);
  args.finish();
  if (block_counts.empty() || iters < 1 || region_bytes == 0 || regions_per_block == 0)
    return cli::fail("--blocks, --iters, --region-bytes and --regions-per-block must be > 0", 2);
  if (device_count() == 0) {
    fmt::print("tierbench gpu: no {} GPU on this machine\n", api_name());
    return 77;
  }
  auto info = device_info(device);
  if (!info) return cli::fail(info.status().to_string());
  fmt::print("GPU {}: {} ({}), {} multiprocessors, {} MiB\n", device, info->name, api_name(),
             info->multiprocessors, info->total_bytes >> 20);

  const std::uint64_t max_blocks = *std::max_element(block_counts.begin(), block_counts.end());
  auto config = dsv4::preset(preset);
  if (!config) return cli::fail(config.status().to_string(), 2);
  config->num_blocks = max_blocks * 2;
  config->num_slots = 1;
  auto geo = dsv4::Geometry::compute(*config);
  if (!geo) return cli::fail(geo.status().to_string());
  auto stream = Stream::create(device);
  if (!stream) return cli::fail(stream.status().to_string());
  auto engine = engine_layout(*geo, device);
  if (!engine) return cli::fail(engine.status().to_string());
  ExecutorOptions opts;
  opts.device = device;
  opts.path = ImagePath::kZeroCopy;
  auto zero_copy = DeviceCopyExecutor::create(opts);
  auto automatic = DeviceCopyExecutor::create(ExecutorOptions{device});
  if (!zero_copy || !automatic) return cli::fail("cannot create the executors");
  auto codec = dsv4::PageCodec::create(engine->page, config->num_blocks, zero_copy->get());
  if (!codec) return cli::fail(codec.status().to_string());

  const std::uint64_t small_block = region_bytes * regions_per_block;
  const std::uint64_t image_max =
      std::max(max_blocks * (*codec)->bytes_per_block(), max_blocks * small_block);
  auto image = PinnedBuffer::allocate(image_max);
  auto contiguous = DeviceBuffer::allocate(device, image_max);
  if (!image || !contiguous) return cli::fail("cannot allocate the image buffers");
  std::memset(image->data(), 0x3C, image->size());
  for (const DeviceBuffer& bk : engine->buffers) {  // fill the engine memory once
    Status s = copy_async(bk.region(), image->region().slice(0, std::min(bk.size(), image_max)),
                          *stream);
    if (!s) return cli::fail(s.to_string());
  }

  opts.path = ImagePath::kStaged;
  auto staged = DeviceCopyExecutor::create(opts);
  if (!staged) return cli::fail(staged.status().to_string());
  Bench b{device, iters, *stream, **zero_copy, **staged, **automatic, *image, *contiguous};

  fmt::print("PAGE preset {}: {} bytes per block, {} regions per block; {} iterations each\n",
             preset, (*codec)->bytes_per_block(), engine->page.size(), iters);
  int rc = measure_scattered(b, **codec, block_counts, config->num_blocks, [&](std::uint64_t n) {
    return fmt::format("{} x {} blocks", preset, n);
  });
  if (rc != 0) return rc;

  const std::uint64_t small_blocks_total = max_blocks * 2;
  auto small = small_layout(device, regions_per_block, region_bytes, small_blocks_total);
  if (!small) return cli::fail(small.status().to_string());
  auto small_codec = dsv4::PageCodec::create(small->page, small_blocks_total, zero_copy->get());
  if (!small_codec) return cli::fail(small_codec.status().to_string());
  fmt::print("\nsmall regions: {} regions of {} bytes per block\n", regions_per_block,
             region_bytes);
  rc = measure_scattered(b, **small_codec, block_counts, small_blocks_total, [&](std::uint64_t n) {
    return fmt::format("{} x {} B regions, {} blocks", regions_per_block, region_bytes, n);
  });
  if (rc != 0) return rc;
  return measure_pinned_tier(device, iters, tier_objects, tier_batches, verify_thread_counts,
                             *stream);
}

}  // namespace

TIER_CLI_COMMAND(gpu,
                 "gpu [--preset NAME] [--blocks 16,32,64] [--iters N] [--region-bytes 4096] "
                 "[--regions-per-block 64] [--device N] [--tier-objects 65536,1048576,16777216] "
                 "[--tier-batch 1,16,64] [--verify-threads 0]",
                 "GPU PAGE save/load bandwidth vs bulk pinned copy and one copy per region; the "
                 "pinned cpu tier's device puts/gets vs bulk copy",
                 run_gpu);
