// GPU copy plans, DSV4 PAGE/SLOT moves, the slot stager and the gpu tier, on a real device.
// Bit-exact round trips for the V4-Pro presets and for odd region sizes (193 and 127 bytes),
// through every image path: zero-copy pinned, staged pinned (one chunk and many), pageable host
// and device images. Exits 77 (Meson: SKIP) on a machine without a GPU.
#include <doctest/doctest.h>

#include <zlib.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <vector>

#include "tier/dsv4/geometry.hpp"
#include "tier/dsv4/page_codec.hpp"
#include "tier/dsv4/slot_codec.hpp"
#include "gpu.hpp"
#include "gpu_backend.hpp"
#include "pinned_pool.hpp"
#include "support/slot_staging.hpp"
#include "support/test_util.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;
using namespace tier::gpu;

namespace {

std::vector<std::byte> pattern(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x);
  }
  return v;
}

void upload(const DeviceBuffer& dst, const std::vector<std::byte>& src, const Stream& s) {
  REQUIRE(copy_async(dst.region(), host_region(const_cast<std::vector<std::byte>&>(src)), s));
  REQUIRE(s.synchronize());
}

std::vector<std::byte> download(const DeviceBuffer& src, const Stream& s) {
  std::vector<std::byte> v(src.size());
  REQUIRE(copy_async(host_region(v), src.region(), s));
  REQUIRE(s.synchronize());
  return v;
}

// Engine allocations on GPU 0, each with a host mirror of its bytes (a pattern, or zeros).
struct Backings {
  std::vector<DeviceBuffer> bufs;
  std::vector<std::vector<std::byte>> host;
  Backings(const std::vector<std::uint64_t>& sizes, std::uint64_t seed, const Stream& s) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto b = DeviceBuffer::allocate(0, sizes[i]);
      REQUIRE(b);
      host.push_back(seed == 0 ? std::vector<std::byte>(sizes[i]) : pattern(sizes[i], seed + i));
      upload(*b, host.back(), s);
      bufs.push_back(std::move(b).value());
    }
  }
  std::vector<Region> regions() const {
    std::vector<Region> r;
    for (const DeviceBuffer& b : bufs) r.push_back(b.region());
    return r;
  }
  // (backing index, offset) of a device address.
  std::pair<std::size_t, std::size_t> locate(const std::byte* p) const {
    for (std::size_t i = 0; i < bufs.size(); ++i)
      if (p >= bufs[i].data() && p < bufs[i].data() + bufs[i].size())
        return {i, static_cast<std::size_t>(p - bufs[i].data())};
    FAIL("address outside every backing");
    return {0, 0};
  }
};

// A layout: the codec's PAGE or SLOT regions bound to a set of backings.
struct Layout {
  std::vector<std::uint64_t> backing_sizes;
  std::function<std::vector<dsv4::BoundRegion>(const Backings&)> bind;
  std::uint64_t count = 0;  // blocks (PAGE) or slot groups (SLOT)
  bool slot = false;
};

// A DSV4 preset's PAGE or SLOT regions; PAGE and SLOT share the planes, as in the engine.
Layout preset_layout(const char* name, std::uint64_t blocks, std::uint64_t slots, bool slot) {
  auto config = dsv4::preset(name);
  REQUIRE(config);
  config->num_blocks = blocks;
  config->num_slots = slots;
  auto geo = dsv4::Geometry::compute(*config);
  REQUIRE(geo);
  Layout l;
  for (const dsv4::Backing& b : geo->backings) l.backing_sizes.push_back(b.bytes);
  l.count = slot ? slots : blocks;
  l.slot = slot;
  l.bind = [g = *geo, slot](const Backings& b) {
    auto bound = dsv4::bind_memory(g, b.regions());
    REQUIRE_MESSAGE(bound, bound.status().to_string());
    return slot ? bound->slot : bound->page;
  };
  return l;
}

// One backing per region of `units` bytes per unit (odd sizes welcome).
Layout plain_layout(std::vector<std::uint64_t> units, std::uint64_t count, bool slot) {
  Layout l;
  for (std::uint64_t u : units) l.backing_sizes.push_back(u * count);
  l.count = count;
  l.slot = slot;
  l.bind = [units, count, slot](const Backings& b) {
    std::vector<dsv4::BoundRegion> r;
    for (std::size_t i = 0; i < units.size(); ++i) {
      std::string role = "r";
      role += std::to_string(i);
      r.push_back(dsv4::BoundRegion{role, b.bufs[i].data(), units[i] * count, units[i], slot,
                                    MemoryKind::kDevice, 0});
    }
    return r;
  };
  return l;
}

struct Plan {
  std::vector<CopySpan> spans;
  std::uint64_t image_bytes = 0;
  CopyPlan plan() const { return CopyPlan{spans, MemoryKind::kDevice, 0, image_bytes}; }
};

// The codec's validated plan for `ids` (PAGE blocks, or the SLOT group ids[0]).
Plan codec_plan(const Layout& l, const Backings& b, const std::vector<std::uint32_t>& ids,
                CopyExecutor* exec) {
  Plan out;
  CopyPlan cp;
  if (l.slot) {
    auto codec = dsv4::SlotCodec::create(l.bind(b), l.count, dsv4::SlotIdentity{}, exec);
    REQUIRE_MESSAGE(codec, codec.status().to_string());
    auto regions = (*codec)->describe(ids.at(0));
    REQUIRE(regions);
    auto p = (*codec)->plan(*regions);
    REQUIRE_MESSAGE(p, p.status().to_string());
    cp = p->plan();
    out.spans.assign(cp.spans.begin(), cp.spans.end());
  } else {
    auto codec = dsv4::PageCodec::create(l.bind(b), l.count, exec);
    REQUIRE_MESSAGE(codec, codec.status().to_string());
    auto regions = (*codec)->describe(ids);
    REQUIRE(regions);
    auto p = (*codec)->plan(*regions);
    REQUIRE_MESSAGE(p, p.status().to_string());
    cp = p->plan();
    out.spans.assign(cp.spans.begin(), cp.spans.end());
  }
  CHECK(cp.engine_kind == MemoryKind::kDevice);
  out.image_bytes = cp.image_bytes;
  return out;
}

std::vector<std::byte> expected_image(const Plan& p, const Backings& b) {
  std::vector<std::byte> img(p.image_bytes);
  for (const CopySpan& sp : p.spans) {
    auto [i, off] = b.locate(sp.engine);
    std::memcpy(img.data() + sp.image_offset, b.host[i].data() + off, sp.bytes);
  }
  return img;
}

struct Executors {
  Stream stream = std::move(Stream::create(0)).value();
  std::unique_ptr<DeviceCopyExecutor> zero_copy, staged, chunked;
  Executors() {
    ExecutorOptions o;
    o.path = ImagePath::kZeroCopy;
    zero_copy = std::move(DeviceCopyExecutor::create(o)).value();
    o.path = ImagePath::kStaged;
    staged = std::move(DeviceCopyExecutor::create(o)).value();
    o.staging_bytes = 1u << 20;  // forces many chunks for the V4-Pro images
    chunked = std::move(DeviceCopyExecutor::create(o)).value();
  }
};

// Gathers the codec's plan for `ids` through every executor and image kind and checks the
// image; scatters it into zeroed backings and checks every destination byte; finally encodes
// and decodes through the codec itself with the GPU executor (the synchronous path).
void round_trip(const Layout& l, const std::vector<std::uint32_t>& ids) {
  Executors ex;
  Backings src(l.backing_sizes, 7, ex.stream);
  const Plan plan = codec_plan(l, src, ids, ex.zero_copy.get());
  const std::vector<std::byte> want = expected_image(plan, src);

  auto pinned = PinnedBuffer::allocate(plan.image_bytes);
  REQUIRE(pinned);
  auto dev_image = DeviceBuffer::allocate(0, plan.image_bytes);
  REQUIRE(dev_image);
  std::vector<std::byte> pageable(plan.image_bytes);

  struct Case {
    const char* name;
    DeviceCopyExecutor* exec;
    Region image;
  };
  const Case cases[] = {
      {"zero-copy pinned", ex.zero_copy.get(), pinned->region()},
      {"staged pinned", ex.staged.get(), pinned->region()},
      {"chunked staged pinned", ex.chunked.get(), pinned->region()},
      {"pageable", ex.zero_copy.get(), host_region(pageable)},
      {"device image", ex.staged.get(), dev_image->region()},
  };
  auto check_dst = [&](const Backings& dst, const Plan& back) {
    for (std::size_t r = 0; r < dst.bufs.size(); ++r) {
      std::vector<std::byte> expect(dst.host[r].size());
      for (const CopySpan& sp : back.spans) {
        auto [i, off] = dst.locate(sp.engine);
        if (i == r) std::memcpy(expect.data() + off, src.host[r].data() + off, sp.bytes);
      }
      CHECK(download(dst.bufs[r], ex.stream) == expect);
    }
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    std::memset(pinned->data(), 0xA5, pinned->size());
    std::fill(pageable.begin(), pageable.end(), std::byte{0x5A});
    REQUIRE(c.exec->gather_async(plan.plan(), c.image, ex.stream));
    REQUIRE(ex.stream.synchronize());
    std::vector<std::byte> got(plan.image_bytes);
    if (c.image.kind == MemoryKind::kDevice)
      got = download(*dev_image, ex.stream);
    else
      std::memcpy(got.data(), c.image.data, got.size());
    CHECK(got == want);

    Backings dst(l.backing_sizes, 0, ex.stream);
    const Plan back = codec_plan(l, dst, ids, ex.zero_copy.get());
    REQUIRE(c.exec->scatter_async(back.plan(), c.image, ex.stream));
    REQUIRE(ex.stream.synchronize());
    check_dst(dst, back);
  }

  // The codec's own encode/decode, executed by the GPU executor.
  auto exec = DeviceCopyExecutor::create(ExecutorOptions{});
  REQUIRE(exec);
  Backings dst(l.backing_sizes, 0, ex.stream);
  std::vector<std::byte> payload(plan.image_bytes);
  if (l.slot) {
    auto enc = dsv4::SlotCodec::create(l.bind(src), l.count, dsv4::SlotIdentity{}, exec->get());
    auto dec = dsv4::SlotCodec::create(l.bind(dst), l.count, dsv4::SlotIdentity{}, exec->get());
    REQUIRE(enc);
    REQUIRE(dec);
    auto sp = (*enc)->plan(*(*enc)->describe(ids.at(0)));
    REQUIRE(sp);
    REQUIRE((*enc)->executor().gather(sp->plan(), payload));
    CHECK(payload == want);
    auto dp = (*dec)->plan(*(*dec)->describe(ids.at(0)));
    REQUIRE(dp);
    REQUIRE((*dec)->executor().scatter(dp->plan(), payload));
  } else {
    auto enc = dsv4::PageCodec::create(l.bind(src), l.count, exec->get());
    auto dec = dsv4::PageCodec::create(l.bind(dst), l.count, exec->get());
    REQUIRE(enc);
    REQUIRE(dec);
    auto n = (*enc)->encode(*(*enc)->describe(ids), payload);
    REQUIRE_MESSAGE(n, n.status().to_string());
    CHECK(payload == want);
    Status d = (*dec)->decode(payload, *(*dec)->describe(ids));
    REQUIRE_MESSAGE(d, d.to_string());
  }
  check_dst(dst, codec_plan(l, dst, ids, exec->get()));
}

}  // namespace

TEST_CASE("PAGE round trip, V4-Pro fp8, 16 blocks in caller order") {
  round_trip(preset_layout("v4-pro-fp8", 20, 2, false),
             {17, 3, 0, 19, 8, 4, 11, 2, 13, 6, 1, 15, 9, 12, 5, 18});
}

TEST_CASE("PAGE round trip, V4-Pro bf16") {
  round_trip(preset_layout("v4-pro-bf16", 6, 2, false), {4, 0, 5});
}

TEST_CASE("SLOT round trip, V4-Pro fp8 and bf16 (reverse-indexed groups, shared planes)") {
  round_trip(preset_layout("v4-pro-fp8", 4, 3, true), {1});
  round_trip(preset_layout("v4-pro-bf16", 4, 3, true), {2});
}

TEST_CASE("odd region sizes 193 and 127 bytes: byte paths and misaligned image offsets") {
  round_trip(plain_layout({193, 127}, 64, false), {63, 0, 31, 32, 5, 6, 7});
  round_trip(plain_layout({127}, 9, false), {8, 1});
  round_trip(plain_layout({193, 127, 4096}, 4, true), {2});
}

TEST_CASE("4 KiB regions, 64 per block") {
  round_trip(plain_layout(std::vector<std::uint64_t>(64, 4096), 32, false),
             {31, 30, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14});
}

TEST_CASE("the executor refuses plans it cannot run") {
  Executors ex;
  std::vector<std::byte> host(64);
  CopySpan span{host.data(), 0, 64};
  CopyPlan host_plan{std::span(&span, 1), MemoryKind::kHost, -1, 64};
  CHECK(ex.zero_copy->gather(host_plan, host).code() == Code::kInvalidArgument);
  auto dev = DeviceBuffer::allocate(0, 64);
  REQUIRE(dev);
  CopySpan dspan{dev->data(), 32, 64};  // runs past the image
  CopyPlan bad{std::span(&dspan, 1), MemoryKind::kDevice, 0, 64};
  CHECK(ex.zero_copy->gather(bad, host).code() == Code::kInvalidArgument);
  CopySpan ok{dev->data(), 0, 64};
  CopyPlan small{std::span(&ok, 1), MemoryKind::kDevice, 0, 64};
  CHECK(ex.zero_copy->gather(small, std::span(host).first(32)).code() ==
        Code::kInvalidArgument);
  CHECK(ex.zero_copy->gather(small, host));  // the synchronous CopyExecutor form works
}

// The forward pass of `tierbench forward` spins on this clock. Only a lower bound on the time:
// a busy machine makes a spin longer, never shorter; a wrong rate (too many ticks per
// millisecond assumed) makes it shorter.
TEST_CASE("wall_clock names the spin clock and its rate; a spin lasts at least its time") {
  auto clock = wall_clock(0);
  REQUIRE(clock);
  MESSAGE(clock->counter, " at ", clock->khz, " kHz, rate from ", clock->rate_from);
  CHECK(clock->khz > 0);
  CHECK(!clock->counter.empty());
  CHECK(!clock->rate_from.empty());
  CHECK(wall_clock(device_count()).status().code() == Code::kInvalidArgument);
  CHECK(wall_clock(-1).status().code() == Code::kInvalidArgument);

  auto s = Stream::create(0);
  REQUIRE(s);
  CHECK(spin_async(nullptr, 0, 1000).code() == Code::kInvalidArgument);
  CHECK(spin_async(s->handle(), -1, 1000).code() == Code::kInvalidArgument);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(spin_async(s->handle(), 0, 50'000'000, 2));
  REQUIRE(s->synchronize());
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(50));
}

TEST_CASE("registered host memory is reached zero-copy; the pinned pool leases and returns") {
  Executors ex;
  const Layout l = plain_layout({4096, 193}, 8, false);
  Backings src(l.backing_sizes, 5, ex.stream);
  const Plan plan = codec_plan(l, src, {6, 2, 7}, ex.zero_copy.get());
  std::vector<std::byte> host(plan.image_bytes + 4096);
  CHECK_FALSE(is_mapped_pinned(host.data()));
  {
    auto reg = PinnedRegistration::register_host(host);
    REQUIRE_MESSAGE(reg, reg.status().to_string());
    CHECK(is_mapped_pinned(host.data() + 100));
    // Declared pageable, found pinned: the auto executor moves it zero-copy.
    auto automatic = DeviceCopyExecutor::create(ExecutorOptions{});
    REQUIRE(automatic);
    CHECK((*automatic)->path_for(MemoryKind::kPinnedHost, plan.image_bytes, true) ==
          ImagePath::kZeroCopy);
    REQUIRE((*automatic)->gather(plan.plan(), host));
    CHECK(std::memcmp(host.data(), expected_image(plan, src).data(), plan.image_bytes) == 0);
  }
  CHECK_FALSE(is_mapped_pinned(host.data()));  // unregistered on destruction

  auto pool = PinnedPool::create(1u << 16, 2);
  REQUIRE(pool);
  auto a = (*pool)->try_acquire();
  auto b = (*pool)->try_acquire();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->region().kind == MemoryKind::kPinnedHost);
  CHECK(is_mapped_pinned(a->bytes().data()));
  CHECK_FALSE((*pool)->try_acquire().has_value());
  b.reset();
  CHECK((*pool)->available() == 1);
  a.reset();
  CHECK((*pool)->available() == (*pool)->count());
}

TEST_CASE("device_allocation_of: the GPU and the allocation that holds a device pointer") {
  auto buf = DeviceBuffer::allocate(0, 3u << 20);
  REQUIRE(buf);
  for (std::size_t off : {std::size_t{0}, std::size_t{12345}, (std::size_t{3} << 20) - 1}) {
    auto a = device_allocation_of(buf->data() + off);
    REQUIRE(a.has_value());
    CHECK(a->device == 0);
    // The driver knows the allocation: it starts at the buffer and holds all of it.
    CHECK(a->base == buf->data());
    CHECK(a->size >= buf->size());
  }
  std::vector<std::byte> host(4096);
  CHECK_FALSE(device_allocation_of(host.data()).has_value());
  CHECK_FALSE(device_allocation_of(nullptr).has_value());
}

TEST_CASE("SlotStager: snapshot and restore through bounded rows, bit-exact (V4-Pro fp8)") {
  Executors ex;
  const Layout l = preset_layout("v4-pro-fp8", 2, 3, true);
  Backings engine(l.backing_sizes, 11, ex.stream);
  const Plan snap = codec_plan(l, engine, {2}, ex.zero_copy.get());
  CHECK(snap.image_bytes == 26782720);  // the full SLOT payload (reference §2.1)
  auto stager = SlotStager::create(*ex.zero_copy, 2, snap.image_bytes);
  REQUIRE(stager);
  auto host = PinnedBuffer::allocate(snap.image_bytes);
  REQUIRE(host);

  auto t = (*stager)->snapshot(snap.plan(), host->region(), ex.stream);
  REQUIRE(t);
  CHECK((*stager)->rows().free_rows() == 1);
  auto t2 = (*stager)->snapshot(snap.plan(), host->region(), ex.stream);
  REQUIRE(t2);
  auto t3 = (*stager)->snapshot(snap.plan(), host->region(), ex.stream);
  CHECK(t3.status().code() == Code::kRejected);  // no row left: the caller recomputes
  CHECK((*stager)->wait(*t));
  CHECK((*stager)->wait(*t2));
  CHECK((*stager)->poll(*t).code() == Code::kBadState);
  CHECK((*stager)->rows().free_rows() == 2);
  CHECK((*stager)->rows().quarantined() == 0);
  CHECK(std::memcmp(host->data(), expected_image(snap, engine).data(), host->size()) == 0);

  // Restore into the newly allocated group 0: it becomes group 2's bytes, nothing else moves.
  const Plan restore = codec_plan(l, engine, {0}, ex.zero_copy.get());
  auto r = (*stager)->restore(restore.plan(), host->region(), ex.stream);
  REQUIRE(r);
  Status st;
  while ((st = (*stager)->poll(*r)).code() == Code::kRetry) {
  }
  CHECK(st);
  std::vector<std::vector<std::byte>> expect = engine.host;
  for (std::size_t i = 0; i < restore.spans.size(); ++i) {
    auto [bi, to] = engine.locate(restore.spans[i].engine);
    auto [bj, from] = engine.locate(snap.spans[i].engine);
    std::memcpy(expect[bi].data() + to, engine.host[bj].data() + from, restore.spans[i].bytes);
  }
  for (std::size_t i = 0; i < engine.bufs.size(); ++i)
    CHECK(download(engine.bufs[i], ex.stream) == expect[i]);
  CHECK((*stager)->restore(restore.plan(), host->region().slice(0, 100), ex.stream)
            .status()
            .code() == Code::kInvalidArgument);
}

TEST_CASE("gpu tier: put/get with pageable, pinned and device buffers; LRU eviction") {
  auto b = Registry::global().create_backend(
      "gpu", BackendContext{"gpu", 3u << 20, Json{{"device", 0},
                                                  {"pinned_staging_bytes", 1u << 20},
                                                  {"pinned_staging_buffers", 2}}});
  REQUIRE_MESSAGE(b, b.status().to_string());
  Backend& be = **b;
  CHECK((be.capabilities().memory_kinds & kind_bit(MemoryKind::kDevice)) != 0);

  test::EvictionRecorder rec;
  be.set_eviction_handler(&rec);

  std::vector<std::vector<std::byte>> images;
  for (std::uint64_t i = 0; i < 3; ++i) {
    images.push_back(test::make_image(test::key_of(i), (900u << 10) + 193 * i));
    auto c = test::run(be, Op::kPut, test::key_of(i), host_region(images.back()));
    REQUIRE_MESSAGE(c.status, c.status.to_string());
  }
  // Pageable get (bounced through the pinned pool), verified by Backend::poll.
  std::vector<std::byte> out(images[1].size());
  auto g = test::run(be, Op::kGet, test::key_of(1), host_region(out));
  CHECK(g.status);
  CHECK(out == images[1]);
  // Pinned get.
  auto pinned = PinnedBuffer::allocate(images[2].size());
  REQUIRE(pinned);
  g = test::run(be, Op::kGet, test::key_of(2), pinned->region());
  CHECK(g.status);
  CHECK(std::memcmp(pinned->data(), images[2].data(), images[2].size()) == 0);
  // Device-kind get and put: the image stays on the device.
  auto dev = DeviceBuffer::allocate(0, images[0].size());
  REQUIRE(dev);
  g = test::run(be, Op::kGet, test::key_of(0), dev->region());
  CHECK(g.status);
  auto k9 = test::key_of(9);
  auto img9 = test::make_image(k9, 900u << 10);
  auto dev9 = DeviceBuffer::allocate(0, img9.size());
  REQUIRE(dev9);
  Stream s = std::move(Stream::create(0)).value();
  upload(*dev9, img9, s);
  auto p = test::run(be, Op::kPut, k9, dev9->region());
  CHECK(p.status);
  // Capacity 3 MiB holds three ~0.9 MiB images: the least recently used (key 1 was read
  // before keys 2 and 0) went down with its bytes.
  REQUIRE(rec.keys.size() == 1);
  CHECK(rec.keys[0] == test::key_of(1));
  CHECK(rec.images[0] == images[1]);
  CHECK(test::run(be, Op::kContains, test::key_of(1)).status.code() == Code::kNotFound);
  std::vector<std::byte> out9(img9.size());
  CHECK(test::run(be, Op::kGet, k9, host_region(out9)).status);
  CHECK(out9 == img9);
  CHECK(test::run(be, Op::kPut, k9, host_region(img9)).status.code() == Code::kAlreadyExists);
  CHECK(test::run(be, Op::kRemove, k9).status);
  CHECK(be.usage().objects == 2);
}

// Device PAGE blocks of a V4-Pro fp8 layout (12 blocks) to save from (`src`, seeded) and to
// load into (`dst`, zeroed), with a PAGE codec bound to each, on one executor.
struct PageRig {
  std::unique_ptr<DeviceCopyExecutor> exec = std::move(DeviceCopyExecutor::create({})).value();
  Stream s = std::move(Stream::create(0)).value();
  Layout l = preset_layout("v4-pro-fp8", 12, 1, false);
  Backings src, dst;
  std::unique_ptr<dsv4::PageCodec> enc, dec;
  explicit PageRig(std::uint64_t seed) : src(l.backing_sizes, seed, s), dst(l.backing_sizes, 0, s) {
    enc = std::move(dsv4::PageCodec::create(l.bind(src), l.count, exec.get())).value();
    dec = std::move(dsv4::PageCodec::create(l.bind(dst), l.count, exec.get())).value();
  }
  // Every PAGE span of the blocks of `chunks` arrived in `dst`; nothing else (the SLOT area) was
  // touched.
  void check_arrived(const std::vector<std::vector<std::uint32_t>>& chunks) {
    std::vector<std::vector<std::byte>> expect;
    for (const auto& h : dst.host) expect.emplace_back(h.size());
    for (const auto& ids : chunks)
      for (const CopySpan& sp : codec_plan(l, dst, ids, exec.get()).spans) {
        auto [i, off] = dst.locate(sp.engine);
        std::memcpy(expect[i].data() + off, src.host[i].data() + off, sp.bytes);
      }
    for (std::size_t i = 0; i < dst.bufs.size(); ++i) CHECK(download(dst.bufs[i], s) == expect[i]);
  }
};

TEST_CASE("TierStack: device PAGE blocks saved and loaded through a gpu tier over a cpu tier") {
  // Device regions go through the stack with the PAGE codec; its GPU executor moves them
  // (gather into the stack's image on save, scatter on load). The gpu tier holds two chunks;
  // the third save demotes the oldest into the cpu tier, from where it loads back.
  PageRig rig(21);
  const std::uint64_t chunk = 4 * rig.enc->bytes_per_block() + 4096;
  auto profile = parse_profile(
      Json{{"tiers",
            {{{"name", "gpu"}, {"capacity", 2 * chunk + 4096}, {"backend", {{"type", "gpu"}}}},
             {{"name", "cpu"}, {"capacity", "64MiB"}, {"backend", {{"type", "cpu"}}}}}}},
      Registry::global(), "<gpu test>");
  REQUIRE_MESSAGE(profile, profile.status().to_string());
  auto stack = TierStack::open(*profile);
  REQUIRE_MESSAGE(stack, stack.status().to_string());

  const std::vector<std::vector<std::uint32_t>> chunks{{0, 1, 2, 3}, {7, 6, 5, 4}, {11, 9, 8, 10}};
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    auto regions = rig.enc->describe(chunks[c]);
    REQUIRE(regions);
    SaveItem item{test::key_of(100 + c), *regions};
    Status out;
    REQUIRE((*stack)->save(std::span(&item, 1), *rig.enc, std::span(&out, 1)));
    REQUIRE_MESSAGE(out, out.to_string());
  }
  REQUIRE((*stack)->flush(std::chrono::milliseconds(10000)));
  // Newest first: a hit in the cpu tier promotes the chunk into the gpu tier, which evicts the
  // least recently used chunk there, so chunk 0 comes last.
  for (std::size_t c : {2, 1, 0}) {
    auto regions = rig.dec->describe(chunks[c]);
    REQUIRE(regions);
    LoadItem item{test::key_of(100 + c), *regions};
    LoadResult out;
    REQUIRE((*stack)->load(std::span(&item, 1), *rig.dec, std::span(&out, 1)));
    CAPTURE(c);
    REQUIRE_MESSAGE(out.status, out.status.to_string());
    CHECK(out.tier == (c == 0 ? 1 : 0));  // chunk 0 was evicted from the gpu tier
  }
  CHECK((*stack)->tier(0).metrics().evictions.get() >= 1);
  rig.check_arrived(chunks);
}

TEST_CASE("page_locked_images: one mapped arena, best fit, its freed ranges merged") {
  auto mem = page_locked_images();
  REQUIRE_MESSAGE(mem, mem.status().to_string());
  CHECK(std::move(page_locked_images()).value() == *mem);  // one arena while it is held
  ImageMemory& m = **mem;
  const std::size_t mib = std::size_t{1} << 20, n = page_locked_image_bytes() / mib;
  std::vector<std::byte*> got;
  for (std::size_t i = 0; i < n; ++i) {
    got.push_back(m.allocate(mib));
    REQUIRE(got.back() != nullptr);
    CHECK(is_mapped_pinned(got.back()));  // the GPU reaches it by DMA (and zero-copy)
  }
  CHECK(m.allocate(4096) == nullptr);  // full: the stack takes the heap
  CHECK(m.allocate(100) == nullptr);   // not whole pages
  for (std::size_t i = 0; i < n; i += 2) m.free(got[i], mib);
  CHECK(m.allocate(2 * mib) == nullptr);     // holes of 1 MiB only
  std::byte* hole = m.allocate(mib - 4096);  // best fit: one hole, split
  CHECK(hole != nullptr);
  m.free(hole, mib - 4096);
  for (std::size_t i = 1; i < n; i += 2) m.free(got[i], mib);
  std::byte* whole = m.allocate(page_locked_image_bytes());  // every range merged again
  CHECK(whole != nullptr);
  m.free(whole, page_locked_image_bytes());
}

TEST_CASE("TierStack: a disk tier's images in page-locked memory load into device regions") {
  // What the C API sets up when device memory is registered: the stack's images come from
  // page_locked_images(), so a disk tier reads each image straight into memory the GPU copies by
  // DMA. Device PAGE chunks saved to the disk tier come back bit-exact through those images.
  struct Counting final : ImageMemory {
    std::shared_ptr<ImageMemory> inner;
    std::atomic<int> given{0};
    std::byte* allocate(std::size_t bytes) noexcept override {
      std::byte* p = inner->allocate(bytes);
      if (p != nullptr) given.fetch_add(1);
      return p;
    }
    void free(std::byte* p, std::size_t bytes) noexcept override { inner->free(p, bytes); }
  };
  auto images = std::make_shared<Counting>();
  images->inner = std::move(page_locked_images()).value();
  test::TempDir dir;
  REQUIRE(!dir.path.empty());
  PageRig rig(33);
  auto profile =
      parse_profile(Json{{"tiers",
                          {{{"name", "disk"},
                            {"capacity", "64MiB"},
                            {"backend", {{"type", "disk"}, {"path", dir.store()}}}}}}},
                    Registry::global(), "<gpu test>");
  REQUIRE_MESSAGE(profile, profile.status().to_string());
  auto opened = TierStack::open(*profile);
  if (!opened && opened.status() == Code::kNotSupported) {
    MESSAGE("no io_uring or O_DIRECT here: ", opened.status().to_string());
    return;
  }
  REQUIRE_MESSAGE(opened, opened.status().to_string());
  TierStack& stack = **opened;
  stack.set_image_memory(images);
  const std::vector<std::vector<std::uint32_t>> chunks{{0, 1, 2, 3}, {7, 6, 5, 4}, {11, 9, 8, 10}};
  std::vector<std::vector<Region>> in, back;
  std::vector<SaveItem> saves;
  std::vector<LoadItem> loads;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    in.push_back(std::move(rig.enc->describe(chunks[c])).value());
    back.push_back(std::move(rig.dec->describe(chunks[c])).value());
  }
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    saves.push_back({test::key_of(300 + c), in[c]});
    loads.push_back({test::key_of(300 + c), back[c]});
  }
  std::vector<Status> saved(chunks.size());
  REQUIRE(stack.save(saves, *rig.enc, saved));
  for (const Status& st : saved) REQUIRE_MESSAGE(st, st.to_string());
  std::vector<LoadResult> loaded(chunks.size());
  REQUIRE(stack.load(loads, *rig.dec, loaded));
  for (const LoadResult& r : loaded) CHECK_MESSAGE(r.status, r.status.to_string());
  CHECK(images->given.load() > 0);
  rig.check_arrived(chunks);
}

TEST_CASE("verify_payload_async: the device's chunk checksums equal the host's; a gated copy "
          "writes only verified bytes") {
  auto s = Stream::create(0);
  REQUIRE(s);
  // One set of counters for every call below: each completed call leaves them zero.
  auto counters = VerifyCounters::allocate(*s);
  REQUIRE(counters);
  auto verdicts = PinnedBuffer::allocate(4096);
  REQUIRE(verdicts);
  auto* word = reinterpret_cast<std::uint32_t*>(verdicts->data());
  auto exec = DeviceCopyExecutor::create(ExecutorOptions{});
  REQUIRE(exec);
  // Every XXH3 length class for the last chunk and for the chunk list (0 to 40 chunks), at a
  // payload start that is 8-byte but not 16-byte aligned.
  for (std::size_t n : {0u, 1u, 3u, 8u, 16u, 100u, 240u, 241u, 1024u, 1025u, 65535u, 65536u, 65537u,
                        3u * 65536u + 100u, 16u * 65536u, 20u * 65536u + 5u, 30u * 65536u,
                        31u * 65536u, 40u * 65536u + 7u}) {
    CAPTURE(n);
    auto bytes = pattern(n, n + 1);
    const std::uint64_t want = payload_checksum(bytes, 2);
    auto payload = DeviceBuffer::allocate(0, n + 8);
    auto scratch = DeviceBuffer::allocate(0, verify_scratch_bytes(n));
    auto dst = DeviceBuffer::allocate(0, n + 8);
    REQUIRE((payload && scratch && dst));
    const Region staged = payload->region().slice(8, n);
    if (n > 0) REQUIRE(copy_async(staged, host_region(bytes), *s));
    REQUIRE(fill_async(dst->region(), 0xee, s->handle()));
    const auto* gate = reinterpret_cast<const std::uint32_t*>(scratch->data());
    std::vector<CopySpan> spans{CopySpan{dst->data(), 0, n}};
    const CopyPlan plan{spans, MemoryKind::kDevice, 0, n};
    for (std::uint64_t expected : {want + 1, want}) {  // a wrong checksum first: nothing written
      *word = 0;
      REQUIRE(verify_payload_async(staged, expected, scratch->region(), word, *counters, *s));
      REQUIRE((*exec)->scatter_async(plan, staged, *s, gate));
      REQUIRE(s->synchronize());
      CHECK(*word == (expected == want ? kVerdictMatch : kVerdictMismatch));
      auto got = download(*dst, *s);
      got.resize(n);
      CHECK(got == (expected == want ? bytes : std::vector<std::byte>(n, std::byte{0xee})));
    }
    // A codec's CRC claim over the bytes after the first 128 (an AOS1 frame's): owed too.
    const std::size_t from = std::min<std::size_t>(n, 128);
    const auto crc = static_cast<std::uint32_t>(
        crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()) + from, n - from));
    for (std::uint32_t claimed : {crc ^ 0x100u, crc}) {
      const CrcClaim claim{from, claimed};
      *word = 0;
      REQUIRE(verify_payload_async(staged, want, scratch->region(), word, *counters, *s, &claim));
      REQUIRE(s->synchronize());
      CHECK(*word == (claimed == crc ? kVerdictMatch : kVerdictMismatch));
    }
    // Landing in three parts on another stream, checked part by part (the second part twice:
    // a launch with nothing new to check): the same verdicts, and a batch on the same counters
    // afterwards too.
    {
      auto dma = Stream::create(0);
      REQUIRE(dma);
      REQUIRE(fill_async(payload->region(), 0, s->handle()));  // stale bytes until each part lands
      REQUIRE(s->synchronize());
      std::vector<Event> events;
      std::vector<Landing> landings;
      for (std::size_t k = 0; k < 3; ++k) events.push_back(std::move(Event::create(0)).value());
      for (std::size_t k = 0; k < 3; ++k) {
        const std::size_t lo = n * k / 3, hi = n * (k + 1) / 3;
        if (hi > lo)
          REQUIRE(copy_async(staged.slice(lo, hi - lo), host_region(bytes).slice(lo, hi - lo),
                             *dma));
        REQUIRE(events[k].record(*dma));
        landings.push_back(Landing{hi, &events[k]});
        if (k == 1) landings.push_back(landings.back());
      }
      for (std::uint32_t claimed : {crc ^ 0x100u, crc}) {
        const CrcClaim claim{from, claimed};
        *word = 0;
        REQUIRE(verify_payload_async(staged, want, scratch->region(), word, *counters, *s,
                                     &claim, landings));
        REQUIRE(s->synchronize());
        CHECK(*word == (claimed == crc ? kVerdictMatch : kVerdictMismatch));
      }
      const CrcClaim claim{from, crc};
      const VerifyItem alone{staged, want, scratch->region(), word, &claim};
      *word = 0;
      REQUIRE(verify_payloads_async(std::span(&alone, 1), *counters, *s));
      REQUIRE(s->synchronize());
      CHECK(*word == kVerdictMatch);
      const Landing short_of_it[] = {Landing{n / 2, &events[0]}};
      if (n > 1)
        CHECK(verify_payload_async(staged, want, scratch->region(), word, *counters, *s, nullptr,
                                   short_of_it)
                  .code() == Code::kInvalidArgument);
    }
    // One flipped bit in the first, a middle and the last byte fails.
    for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
      if (n == 0) break;
      CAPTURE(at);
      auto bad = bytes;
      bad[at] ^= std::byte{0x10};
      REQUIRE(copy_async(staged, host_region(bad), *s));
      *word = 0;
      REQUIRE(verify_payload_async(staged, want, scratch->region(), word, *counters, *s));
      REQUIRE(s->synchronize());
      CHECK(*word == kVerdictMismatch);
    }
  }
  // Refusals: host memory, misalignment, a short scratch, an unmapped host word, a claim past
  // the payload, counters not allocated.
  auto payload = DeviceBuffer::allocate(0, 1 << 20);  // 16 chunks: 136 scratch bytes
  auto scratch = DeviceBuffer::allocate(0, 64);
  REQUIRE((payload && scratch));
  std::vector<std::byte> host(64);
  std::uint32_t plain = 0;
  VerifyCounters& c = *counters;
  CHECK(verify_payload_async(host_region(host), 0, scratch->region(), nullptr, c, *s).code() ==
        Code::kInvalidArgument);
  CHECK(verify_payload_async(payload->region().slice(1, 100), 0, scratch->region(), nullptr, c,
                             *s)
            .code() == Code::kInvalidArgument);
  CHECK(verify_payload_async(payload->region(), 0, scratch->region(), nullptr, c, *s).code() ==
        Code::kInvalidArgument);
  CHECK(verify_payload_async(payload->region().slice(0, 100), 0, scratch->region(), &plain, c, *s)
            .code() == Code::kInvalidArgument);
  const CrcClaim past{101, 0};
  CHECK(verify_payload_async(payload->region().slice(0, 100), 0, scratch->region(), nullptr, c,
                             *s, &past)
            .code() == Code::kInvalidArgument);
  VerifyCounters none;
  CHECK(verify_payload_async(payload->region().slice(0, 100), 0, scratch->region(), nullptr, none,
                             *s)
            .code() == Code::kInvalidArgument);
}

// A gated copy takes its tiles in parts, an ungated one whole (copy_kernels.hip: copy_part): every
// size around the parts' and tiles' edges, at a start that leaves a head of 8 bytes (the words
// shift against the parts), of 3 (bytes only past it) and none; exactly the span's bytes, nothing
// past them, and nothing at all when the gate says mismatch.
TEST_CASE("a copy writes exactly its bytes: gated tiles in parts, ungated whole, every edge") {
  auto s = Stream::create(0);
  REQUIRE(s);
  auto exec = DeviceCopyExecutor::create(ExecutorOptions{});
  REQUIRE(exec);
  auto gate = DeviceBuffer::allocate(0, 8);
  REQUIRE(gate);
  const auto* word = reinterpret_cast<const std::uint32_t*>(gate->data());
  for (std::uint32_t verdict : {kVerdictMismatch, kVerdictMatch, 0u}) {  // 0: no gate
    std::vector<std::byte> v(8);
    std::memcpy(v.data(), &verdict, 4);
    upload(*gate, v, *s);
    for (std::size_t n : {1u, 15u, 16u, 17u, 16383u, 16384u, 16392u, 16400u, 32773u, 65535u, 65536u,
                          65537u, 3u * 65536u + 100u}) {
      for (std::size_t at : {0u, 3u, 8u}) {
        CAPTURE(n);
        CAPTURE(at);
        auto src = DeviceBuffer::allocate(0, n + 64);
        auto dst = DeviceBuffer::allocate(0, n + 64);
        REQUIRE((src && dst));
        const auto bytes = pattern(n + 64, n + at);
        upload(*src, bytes, *s);
        upload(*dst, std::vector<std::byte>(n + 64, std::byte{0xee}), *s);
        const std::vector<CopySpan> spans{CopySpan{dst->data() + at, 0, n}};
        REQUIRE((*exec)->scatter_async(CopyPlan{spans, MemoryKind::kDevice, 0, n},
                                       src->region().slice(at, n), *s,
                                       verdict == 0 ? nullptr : word));
        REQUIRE(s->synchronize());
        auto want = std::vector<std::byte>(n + 64, std::byte{0xee});
        if (verdict != kVerdictMismatch)
          std::copy(bytes.begin() + at, bytes.begin() + at + n, want.begin() + at);
        CHECK(download(*dst, *s) == want);
      }
    }
  }
}

TEST_CASE(
    "verify_payloads_async: a batch's verdicts equal one call each, launch after launch on the "
    "same counters; a batched gated copy writes only the verified payloads") {
  auto s = Stream::create(0);
  REQUIRE(s);
  auto counters = VerifyCounters::allocate(*s);
  REQUIRE(counters);
  auto verdicts = PinnedBuffer::allocate(4096);
  REQUIRE(verdicts);
  auto* words = reinterpret_cast<std::uint32_t*>(verdicts->data());
  auto exec = DeviceCopyExecutor::create(ExecutorOptions{});
  REQUIRE(exec);
  // Sizes of every chunk-list length class, one empty; item 2 claims a CRC, item 4 a wrong one,
  // item 5 has a wrong checksum: those two fail, the rest pass.
  const std::vector<std::size_t> sizes{100, 65536, 0, 3 * 65536 + 9, 241, 1 << 20, 7};
  const std::size_t n = sizes.size();
  std::vector<std::vector<std::byte>> bytes;
  std::vector<DeviceBuffer> payloads, scratches, dsts;
  std::vector<CrcClaim> claims(n);
  std::vector<VerifyItem> items;
  std::vector<std::vector<CopySpan>> spans(n);
  std::vector<GatedScatter> copies;
  for (std::size_t i = 0; i < n; ++i) {
    bytes.push_back(pattern(sizes[i], 50 + i));
    payloads.push_back(std::move(DeviceBuffer::allocate(0, sizes[i] + 8)).value());
    scratches.push_back(
        std::move(DeviceBuffer::allocate(0, verify_scratch_bytes(sizes[i]))).value());
    dsts.push_back(std::move(DeviceBuffer::allocate(0, sizes[i] + 8)).value());
    const Region staged = payloads[i].region().slice(0, sizes[i]);
    if (sizes[i] > 0) REQUIRE(copy_async(staged, host_region(bytes[i]), *s));
    std::uint64_t expected = payload_checksum(bytes[i], 2);
    if (i == 5) expected ^= 1;
    VerifyItem v{staged, expected, scratches[i].region(), words + i, nullptr};
    if (i == 2 || i == 4) {
      const std::size_t from = std::min<std::size_t>(sizes[i], 16);
      auto crc = static_cast<std::uint32_t>(
          crc32_z(0, reinterpret_cast<const Bytef*>(bytes[i].data()) + from, sizes[i] - from));
      claims[i] = CrcClaim{from, i == 4 ? crc ^ 1u : crc};
      v.crc = &claims[i];
    }
    items.push_back(v);
    spans[i] = {CopySpan{dsts[i].data(), 0, sizes[i]}};
    copies.push_back(GatedScatter{CopyPlan{spans[i], MemoryKind::kDevice, 0, sizes[i]}, staged,
                                  reinterpret_cast<const std::uint32_t*>(scratches[i].data())});
  }
  // Each launch's last block per item leaves the counters zero for the next: the same batch three
  // times, then each item alone in reverse order (other counter words than in the batch).
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    for (std::size_t i = 0; i < n; ++i) {
      words[i] = 0;
      REQUIRE(fill_async(dsts[i].region(), 0xee, s->handle()));
    }
    if (round < 3) {
      REQUIRE(verify_payloads_async(items, *counters, *s));
      REQUIRE((*exec)->scatter_batch_async(copies, *s));
    } else {
      for (std::size_t i = n; i-- > 0;) {
        REQUIRE(verify_payloads_async(std::span(&items[i], 1), *counters, *s));
        REQUIRE((*exec)->scatter_batch_async(std::span(&copies[i], 1), *s));
      }
    }
    REQUIRE(s->synchronize());
    for (std::size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      const bool ok = i != 4 && i != 5;
      CHECK(words[i] == (ok ? kVerdictMatch : kVerdictMismatch));
      auto got = download(dsts[i], *s);
      got.resize(sizes[i]);
      CHECK(got == (ok ? bytes[i] : std::vector<std::byte>(sizes[i], std::byte{0xee})));
    }
  }
  std::vector<VerifyItem> too_many(kMaxVerifyBatch + 1, items[0]);
  CHECK(verify_payloads_async(too_many, *counters, *s).code() == Code::kInvalidArgument);
  VerifyCounters none;
  CHECK(verify_payloads_async(items, none, *s).code() == Code::kInvalidArgument);
  std::vector<std::byte> host(64);
  std::vector<CopySpan> one{CopySpan{dsts[0].data(), 0, 64}};
  const GatedScatter from_host[] = {
      GatedScatter{CopyPlan{one, MemoryKind::kDevice, 0, 64}, host_region(host), nullptr}};
  CHECK((*exec)->scatter_batch_async(from_host, *s).code() == Code::kInvalidArgument);
}

TEST_CASE(
    "copy context: one per GPU, shared by every executor; its ring and pinned pool wait for "
    "their users by events") {
  auto a = CopyContext::of(0);
  auto b = CopyContext::of(0);
  REQUIRE((a && b));
  CHECK(a->get() == b->get());
  auto e1 = DeviceCopyExecutor::create(ExecutorOptions{});
  REQUIRE(e1);
  CHECK(&(*e1)->context() == a->get());
  CHECK(CopyContext::of(device_count()).status().code() == Code::kInvalidArgument);
  CopyContext& ctx = **a;

  // The ring: a range not yet retired is never handed out again; a retired one is, once the
  // next user's stream waited for the work behind it. A 100 ms spin holds the first range.
  auto s = Stream::create(0);
  auto t = Stream::create(0);
  REQUIRE((s && t));
  const std::uint64_t half = CopyContext::ring_bytes() / 2;
  auto whole = ctx.ring_acquire(CopyContext::ring_bytes(), *s);  // earlier tests' ranges end here
  REQUIRE(whole);
  REQUIRE(ctx.ring_retire(*whole, *s));
  auto r1 = ctx.ring_acquire(half, *s);
  REQUIRE(r1);
  auto r2 = ctx.ring_acquire(half, *s);
  REQUIRE(r2);
  CHECK(ctx.ring_acquire(1, *s).status().code() == Code::kRejected);  // both still being filled
  CHECK(ctx.ring_acquire(CopyContext::ring_bytes() + 1, *s).status().code() == Code::kRejected);
  REQUIRE(spin_async(s->handle(), 0, 100'000'000));
  REQUIRE(fill_async(r1->region, 0x11, s->handle()));
  REQUIRE(ctx.ring_retire(*r1, *s));
  REQUIRE(ctx.ring_retire(*r2, *s));
  auto r3 = ctx.ring_acquire(4096, *t);  // from the start again: r1's bytes
  REQUIRE(r3);
  CHECK(r3->region.data == r1->region.data);
  REQUIRE(fill_async(r3->region, 0x22, t->handle()));  // after r1's fill, on the device
  auto ev = Event::create(0);
  REQUIRE(ev);
  REQUIRE(ev->record(*t));
  CHECK_FALSE(*ev->done());  // t waits for s's spin: nothing waited on the host
  REQUIRE(ctx.ring_retire(*r3, *t));
  REQUIRE(t->synchronize());
  std::vector<std::byte> head(4096);
  REQUIRE(copy_async(host_region(head), r3->region, *t));
  REQUIRE(t->synchronize());
  CHECK(head == std::vector<std::byte>(4096, std::byte{0x22}));

  // A retired range that a later range covers only in part keeps guarding its rest: a range on
  // a third stream that overlaps only that rest still waits for the work behind it.
  auto u = Stream::create(0);
  REQUIRE(u);
  auto all = ctx.ring_acquire(CopyContext::ring_bytes(), *s);  // from the start: [0, ring)
  REQUIRE(all);
  REQUIRE(spin_async(s->handle(), 0, 100'000'000));  // stands for a reader of `all`
  REQUIRE(ctx.ring_retire(*all, *s));
  auto head4k = ctx.ring_acquire(4096, *t);  // [0, 4096): waits for the spin, covers `all` in part
  REQUIRE(head4k);
  CHECK(head4k->region.data == all->region.data);
  REQUIRE(ctx.ring_retire(*head4k, *t));
  auto next4k = ctx.ring_acquire(4096, *u);  // [4096, 8192): overlaps `all` only
  REQUIRE(next4k);
  CHECK(next4k->region.data == all->region.data + 4096);
  REQUIRE(fill_async(next4k->region, 0x44, u->handle()));
  auto behind = Event::create(0);
  REQUIRE(behind);
  REQUIRE(behind->record(*u));
  CHECK_FALSE(*behind->done());  // u waits for the spin too
  REQUIRE(ctx.ring_retire(*next4k, *u));
  REQUIRE(u->synchronize());
  REQUIRE(s->synchronize());
  REQUIRE(t->synchronize());
  // A range that replaced a retired one and is retired on a stream other than its first still
  // ends only after the work its first stream waited for.
  auto v = Stream::create(0);
  REQUIRE(v);
  auto old_range = ctx.ring_acquire(CopyContext::ring_bytes(), *s);
  REQUIRE(old_range);
  REQUIRE(spin_async(s->handle(), 0, 100'000'000));
  REQUIRE(ctx.ring_retire(*old_range, *s));
  auto replacing = ctx.ring_acquire(CopyContext::ring_bytes(), *t);  // t waits for the spin
  REQUIRE(replacing);
  REQUIRE(ctx.ring_retire(*replacing, *u));  // u never waited for t
  auto after_both = ctx.ring_acquire(4096, *v);
  REQUIRE(after_both);
  REQUIRE(fill_async(after_both->region, 0x55, v->handle()));
  REQUIRE(behind->record(*v));
  CHECK_FALSE(*behind->done());  // v waits for the spin through `replacing`
  REQUIRE(ctx.ring_retire(*after_both, *v));
  for (auto* x : {&*s, &*t, &*u, &*v}) REQUIRE(x->synchronize());

  // The event pool: an event given back with its work pending is not handed out while that work
  // runs; one given back as completed is handed out first, without asking the runtime.
  auto ev1 = ctx.take_event();
  REQUIRE(ev1);
  void* const pending = ev1->handle();
  REQUIRE(spin_async(s->handle(), 0, 100'000'000));
  REQUIRE(ev1->record(*s));
  ctx.give_event(std::move(*ev1));
  auto ev2 = ctx.take_event();
  REQUIRE(ev2);
  CHECK(ev2->handle() != pending);
  void* const completed = ev2->handle();
  ctx.give_event(std::move(*ev2), true);
  auto ev3 = ctx.take_event();
  REQUIRE(ev3);
  CHECK(ev3->handle() == completed);
  REQUIRE(s->synchronize());

  // The pinned pool: a buffer whose last use has not run is not lent again.
  auto p1 = ctx.take_pinned(1 << 20);
  REQUIRE(p1);
  std::byte* first = p1->data();
  REQUIRE(spin_async(s->handle(), 0, 100'000'000));
  REQUIRE(p1->in_use_until(*s));
  *p1 = PinnedStaging();
  auto p2 = ctx.take_pinned(1 << 20);
  REQUIRE(p2);
  CHECK(p2->data() != first);
  *p2 = PinnedStaging();
  REQUIRE(s->synchronize());
  auto p3 = ctx.take_pinned(1 << 20);
  REQUIRE(p3);
  CHECK((p3->data() == first || p3->data() == p2->data()));
  CHECK(ctx.take_pinned(CopyContext::pinned_staging_limit() + 1).status().code() ==
        Code::kRejected);
}
