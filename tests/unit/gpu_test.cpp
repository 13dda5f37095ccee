// GPU copy plans, DSV4 PAGE/SLOT moves, the slot stager and the gpu tier, on a real device.
// Bit-exact round trips for the V4-Pro presets and for odd region sizes (193 and 127 bytes),
// through every image path: zero-copy pinned, staged pinned (one chunk and many), pageable host
// and device images. Exits 77 (Meson: SKIP) on a machine without a GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "dsv4_plans.hpp"
#include "gpu.hpp"
#include "gpu_backend.hpp"
#include "slot_staging.hpp"
#include "support/test_util.hpp"
#include "tier/registry.hpp"

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

// One device allocation per region, `count` units each, with a host mirror of its bytes.
struct Engine {
  std::vector<DeviceBuffer> bufs;
  std::vector<std::vector<std::byte>> host;
  std::vector<EngineRegion> regions;

  Engine(const std::vector<std::uint64_t>& units, std::uint64_t count, bool reverse,
         std::uint64_t seed, const Stream& s) {
    for (std::size_t i = 0; i < units.size(); ++i) {
      auto b = DeviceBuffer::allocate(0, units[i] * count);
      REQUIRE(b);
      host.push_back(seed == 0 ? std::vector<std::byte>(units[i] * count)
                               : pattern(units[i] * count, seed + i));
      upload(*b, host.back(), s);
      regions.push_back(EngineRegion{b->data(), units[i], units[i] * count, reverse});
      bufs.push_back(std::move(b).value());
    }
  }
  // The image the host mirror predicts for `plan` (same span order, offsets into host copies).
  std::vector<std::byte> expect(const OwnedPlan& plan) const {
    std::vector<std::byte> img(plan.image_bytes);
    for (const CopySpan& sp : plan.spans)
      for (std::size_t r = 0; r < bufs.size(); ++r)
        if (sp.engine >= bufs[r].data() && sp.engine < bufs[r].data() + bufs[r].size())
          std::memcpy(img.data() + sp.image_offset,
                      host[r].data() + (sp.engine - bufs[r].data()), sp.bytes);
    return img;
  }
};

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

// Gathers `plan` from `src` through every executor and image kind, checks the image, scatters
// it into a zeroed copy of the layout and checks every destination byte.
void round_trip(const std::vector<std::uint64_t>& units, std::uint64_t count, bool slot,
                const std::vector<std::uint32_t>& ids) {
  Executors ex;
  Engine src(units, count, slot, 7, ex.stream);
  auto plan = slot ? slot_plan(src.regions, count, ids.at(0), 0)
                   : page_plan(src.regions, count, ids, 0);
  REQUIRE_MESSAGE(plan, plan.status().to_string());
  const std::vector<std::byte> want = src.expect(*plan);

  auto pinned = PinnedBuffer::allocate(plan->image_bytes);
  REQUIRE(pinned);
  auto dev_image = DeviceBuffer::allocate(0, plan->image_bytes);
  REQUIRE(dev_image);
  std::vector<std::byte> pageable(plan->image_bytes);

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
  for (const Case& c : cases) {
    CAPTURE(c.name);
    std::memset(pinned->data(), 0xA5, pinned->size());
    std::fill(pageable.begin(), pageable.end(), std::byte{0x5A});
    REQUIRE(c.exec->gather_async(plan->plan(), c.image, ex.stream));
    REQUIRE(ex.stream.synchronize());
    std::vector<std::byte> got(plan->image_bytes);
    if (c.image.kind == MemoryKind::kDevice)
      got = download(*dev_image, ex.stream);
    else
      std::memcpy(got.data(), c.image.data, got.size());
    CHECK(got == want);

    Engine dst(units, count, slot, 0, ex.stream);
    auto back = slot ? slot_plan(dst.regions, count, ids.at(0), 0)
                     : page_plan(dst.regions, count, ids, 0);
    REQUIRE(back);
    REQUIRE(c.exec->scatter_async(back->plan(), c.image, ex.stream));
    REQUIRE(ex.stream.synchronize());
    // Expected destination: zero everywhere except the moved units, which equal the source.
    for (std::size_t r = 0; r < units.size(); ++r) {
      std::vector<std::byte> expect(dst.host[r].size());
      for (const CopySpan& sp : back->spans) {
        if (sp.engine < dst.bufs[r].data() || sp.engine >= dst.bufs[r].data() + dst.bufs[r].size())
          continue;
        std::size_t off = static_cast<std::size_t>(sp.engine - dst.bufs[r].data());
        std::memcpy(expect.data() + off, src.host[r].data() + off, sp.bytes);
      }
      CHECK(download(dst.bufs[r], ex.stream) == expect);
    }
  }
}

}  // namespace

TEST_CASE("PAGE round trip, V4-Pro fp8, 16 blocks in caller order") {
  const Dsv4Units* p = find_dsv4_preset("v4-pro-fp8");
  REQUIRE(p != nullptr);
  round_trip(p->page_units, 20, false,
             {17, 3, 0, 19, 8, 4, 11, 2, 13, 6, 1, 15, 9, 12, 5, 18});
}

TEST_CASE("PAGE round trip, V4-Pro bf16") {
  const Dsv4Units* p = find_dsv4_preset("v4-pro-bf16");
  REQUIRE(p != nullptr);
  round_trip(p->page_units, 6, false, {4, 0, 5});
}

TEST_CASE("SLOT round trip, V4-Pro fp8 and bf16 presets (reverse-indexed groups)") {
  for (const char* name : {"v4-pro-fp8", "v4-pro-bf16"}) {
    CAPTURE(name);
    round_trip(find_dsv4_preset(name)->slot_units, 3, true, {1});
  }
}

TEST_CASE("odd region sizes 193 and 127 bytes: byte paths and misaligned image offsets") {
  round_trip({193, 127}, 64, false, {63, 0, 31, 32, 5, 6, 7});
  round_trip({127}, 9, false, {8, 1});
  round_trip({193, 127, 4096}, 4, true, {2});
}

TEST_CASE("4 KiB regions, 64 per block") {
  round_trip(std::vector<std::uint64_t>(64, 4096), 32, false,
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

TEST_CASE("page_plan validation") {
  auto dev = DeviceBuffer::allocate(0, 4096);
  REQUIRE(dev);
  EngineRegion r{dev->data(), 1024, 4096, false};
  const std::uint32_t dup[] = {1, 1};
  CHECK(page_plan(std::span(&r, 1), 4, dup, 0).status().code() == Code::kInvalidArgument);
  const std::uint32_t out_of_range[] = {4};
  CHECK(page_plan(std::span(&r, 1), 4, out_of_range, 0).status().code() ==
        Code::kInvalidArgument);
  CHECK(page_plan(std::span(&r, 1), 5, dup, 0).status().code() == Code::kInvalidArgument);
  CHECK(slot_plan(std::span(&r, 1), 4, 0, 0).status().code() == Code::kInvalidArgument);
}

TEST_CASE("SlotStager: snapshot and restore through bounded rows, bit-exact") {
  Executors ex;
  const Dsv4Units* p = find_dsv4_preset("v4-pro-fp8");
  Engine engine(p->slot_units, 3, true, 11, ex.stream);
  auto stager = SlotStager::create(*ex.zero_copy, 2, 26782720);
  REQUIRE(stager);
  auto snap_plan = slot_plan(engine.regions, 3, 2, 0);
  REQUIRE(snap_plan);
  auto host = PinnedBuffer::allocate(26782720);
  REQUIRE(host);

  auto t = (*stager)->snapshot(snap_plan->plan(), host->region(), ex.stream);
  REQUIRE(t);
  CHECK((*stager)->rows().free_rows() == 1);
  auto t2 = (*stager)->snapshot(snap_plan->plan(), host->region(), ex.stream);
  REQUIRE(t2);
  auto t3 = (*stager)->snapshot(snap_plan->plan(), host->region(), ex.stream);
  CHECK(t3.status().code() == Code::kRejected);  // no row left: the caller recomputes
  CHECK((*stager)->wait(*t));
  CHECK((*stager)->wait(*t2));
  CHECK((*stager)->poll(*t).code() == Code::kBadState);
  CHECK((*stager)->rows().free_rows() == 2);
  CHECK(std::memcmp(host->data(), engine.expect(*snap_plan).data(), host->size()) == 0);

  // Restore into the newly allocated group 0 and compare with the snapshot of group 2.
  auto restore_plan = slot_plan(engine.regions, 3, 0, 0);
  REQUIRE(restore_plan);
  auto r = (*stager)->restore(restore_plan->plan(), host->region(), ex.stream);
  REQUIRE(r);
  Status st;
  while ((st = (*stager)->poll(*r)).code() == Code::kRetry) {
  }
  CHECK(st);
  for (std::size_t i = 0; i < engine.bufs.size(); ++i) {
    auto now = download(engine.bufs[i], ex.stream);
    const std::size_t unit = p->slot_units[i];
    // reverse indexed: group g lives at total - (g + 1) * unit
    CHECK(std::memcmp(now.data() + 2 * unit, engine.host[i].data(), unit) == 0);  // group 0
    CHECK(std::memcmp(now.data(), engine.host[i].data(), 2 * unit) == 0);          // 2, 1 kept
  }
}

TEST_CASE("gpu tier: put/get with pageable, pinned and device buffers; LRU eviction") {
  auto b = Registry::global().create_backend(
      "gpu", BackendContext{"gpu", 3u << 20, Json{{"device", 0},
                                                  {"pinned_staging_bytes", 1u << 20},
                                                  {"pinned_staging_buffers", 2}}});
  REQUIRE_MESSAGE(b, b.status().to_string());
  Backend& be = **b;
  CHECK((be.capabilities().memory_kinds & kind_bit(MemoryKind::kDevice)) != 0);

  struct Recorder : EvictionHandler {
    std::vector<ObjectKey> keys;
    std::vector<std::vector<std::byte>> images;
    void on_evict(const ObjectKey& k, std::span<const std::byte> image) noexcept override {
      keys.push_back(k);
      images.emplace_back(image.begin(), image.end());
    }
  } rec;
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

int main(int argc, char** argv) {
  if (device_count() == 0) {
    std::fprintf(stderr, "no %s GPU here: skipping\n", std::string(api_name()).c_str());
    return tier::test::kSkip;
  }
  auto info = device_info(0);
  if (info)
    std::printf("GPU 0: %s, %d multiprocessors, %zu MiB (%s)\n", info->name.c_str(),
                info->multiprocessors, info->total_bytes >> 20, std::string(api_name()).c_str());
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
