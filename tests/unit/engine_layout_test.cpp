// dsv4::Dsv4Layout, the engine's KV layout over the DSV4 codecs: its options, device memory refused
// where there is no GPU, and host access (apps/tierbench/kv_content.hpp) on host memory. The
// device-memory side is engine_gpu_test.cpp.
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "support/engine_sim.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

TEST_CASE("layout options are strict") {
  auto d = dsv4::Dsv4LayoutOptions::from_json(Json::object());
  REQUIRE(d.is_ok());
  CHECK(d->memory == dsv4::KvMemoryKind::kHost);
  CHECK(d->device == 0);
  auto dev = dsv4::Dsv4LayoutOptions::from_json(Json{{"memory", "device"}, {"device", 1}});
  REQUIRE(dev.is_ok());
  CHECK(dev->memory == dsv4::KvMemoryKind::kDevice);
  CHECK(dev->device == 1);
  CHECK(dev->to_json() == Json{{"memory", "device"}, {"device", 1}});
  auto bad = dsv4::Dsv4LayoutOptions::from_json(Json{{"memory", "gpu"}}, "/layout");
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status() == Code::kInvalidArgument);
  CHECK(bad.status().to_string().find("/layout/memory") != std::string::npos);
  auto typo = dsv4::Dsv4LayoutOptions::from_json(Json{{"memroy", "device"}});
  REQUIRE_FALSE(typo.is_ok());
  CHECK(typo.status().to_string().find("memroy") != std::string::npos);
  CHECK_FALSE(dsv4::Dsv4LayoutOptions::from_json(Json{{"device", -1}}).is_ok());
  CHECK_FALSE(dsv4::Dsv4LayoutOptions::from_json(Json{{"device", "0"}}).is_ok());
  for (const OptionSpec& spec : dsv4::Dsv4LayoutOptions::options()) CHECK_FALSE(spec.doc.empty());
}

TEST_CASE("device KV memory without a GPU is NotSupported") {
  const auto geo = small_geometry(128, 16, 2);
  const Key128 ns = default_config().page_namespace;
  dsv4::Dsv4LayoutOptions o;
  o.memory = dsv4::KvMemoryKind::kDevice;
  auto l = dsv4::Dsv4Layout::create(geo, ns, 1, 0, o);
  if (l.is_ok()) {
    // This machine has a GPU (engine_gpu_test covers it): the memory is device memory.
    const std::uint32_t block = 0;
    CHECK((*l)->page_regions(std::span(&block, 1)).value()[0].kind == MemoryKind::kDevice);
  } else {
    CHECK(l.status() == Code::kNotSupported);
    CHECK(l.status().to_string().find("device KV memory needs") != std::string::npos);
  }
  o.device = -1;
  auto neg = dsv4::Dsv4Layout::create(geo, ns, 1, 0, o);
  REQUIRE_FALSE(neg.is_ok());
  CHECK(neg.status() == Code::kInvalidArgument);
}

TEST_CASE("host layout: fill, zero and digest report bad ids and see the bytes") {
  const auto geo = small_geometry(128, 16, 2);
  auto l = dsv4::Dsv4Layout::create(geo, default_config().page_namespace, 1, 0).value();
  const std::uint64_t zero = digest_block(*l, 3).value();
  REQUIRE(fill_block(*l, 3, 42).is_ok());
  const std::uint64_t filled = digest_block(*l, 3).value();
  CHECK(filled != zero);
  CHECK(digest_block(*l, 4).value() == zero);  // only block 3 was written
  REQUIRE(zero_block(*l, 3).is_ok());
  CHECK(digest_block(*l, 3).value() == zero);
  CHECK(fill_block(*l, 16, 1) == Code::kInvalidArgument);
  CHECK(digest_block(*l, 16).status() == Code::kInvalidArgument);
  CHECK(fill_slot(*l, -1, 1) == Code::kInvalidArgument);
  CHECK(digest_slot(*l, 2).status() == Code::kInvalidArgument);
  // Host access refuses a region that is not this layout's memory kind.
  Region device_region = require_value(l->slot_regions(0))[0];
  device_region.kind = MemoryKind::kDevice;
  CHECK(l->visit_host(std::span(&device_region, 1), dsv4::Dsv4Layout::HostAccess::kRead,
                      [](RegionList) {}) == Code::kInvalidArgument);
}

// Row "fp4 indexer" of docs/engine.md: the reference rejects the fp4 indexer (its scale pool is
// not in its region map); libtier moves an fp4 block with its scale pool. A PAGE chunk is stored
// through a real cpu tier and loaded into other blocks, every region (NoPE, RoPE, each CSA
// layer's fp4 indexer and its scale pool) bit exact; a scale pool altered alone is noticed.
TEST_CASE("fp4 indexer: a PAGE chunk moves with its scale pool, bit exact, through a tier") {
  dsv4::ModelConfig m;
  m.compress_ratios = {4, 128, 4, 0};
  m.kv_head_dim = 64;
  m.rope_head_dim = 16;
  m.index_head_dim = 64;
  m.index_dtype = dsv4::IndexDtype::kFp4;
  m.block_size = 128;
  m.sliding_window = 8;
  m.num_blocks = 16;
  m.num_slots = 2;
  const auto geo = require_value(dsv4::Geometry::compute(m));
  std::size_t scale_regions = 0;
  for (const auto& r : geo.page_regions)
    scale_regions += r.role.find("indexer_scale") != std::string::npos ? 1 : 0;
  REQUIRE(scale_regions == 2);  // one per CSA layer
  const Key128 ns = namespace_id(Json{{"model", "fp4-indexer-test"}}).value();
  auto layout = require_value(dsv4::Dsv4Layout::create(geo, ns, 1, 0));
  auto stack = require_value(TierStack::open(
      require_value(parse_profile(cpu_profile(), Registry::global(), "<fp4>"))));
  const std::vector<std::uint32_t> src = {1, 2}, dst = {9, 12};
  for (std::uint32_t b : src) require_ok(fill_block(*layout, b, 1000 + b));
  auto src_regions = require_value(layout->page_regions(src));
  const ObjectKey key{ns, Key128{7, 7}, 0};
  SaveItem item{key, src_regions};
  Status st;
  require_ok(stack->save(std::span(&item, 1), layout->page_codec(), std::span(&st, 1)));
  require_ok(st);
  auto dst_regions = require_value(layout->page_regions(dst));
  LoadItem load{key, dst_regions};
  LoadResult res;
  require_ok(stack->load(std::span(&load, 1), layout->page_codec(), std::span(&res, 1)));
  require_ok(res.status);
  for (std::size_t i = 0; i < src.size(); ++i)
    CHECK(require_value(digest_block(*layout, dst[i])) ==
          require_value(digest_block(*layout, src[i])));
  // Every region, scale pools included, compared byte for byte.
  REQUIRE(src_regions.size() == dst_regions.size());
  for (std::size_t i = 0; i < src_regions.size(); ++i) {
    CAPTURE(i);
    REQUIRE(src_regions[i].size == dst_regions[i].size);
    CHECK(std::memcmp(src_regions[i].data, dst_regions[i].data, src_regions[i].size) == 0);
  }
  // The scale pool is part of the chunk: altering it alone changes the block's content.
  std::size_t scale = 0;
  while (geo.page_regions[scale].role.find("indexer_scale") == std::string::npos) ++scale;
  REQUIRE(dst_regions.size() == 2 * geo.page_regions.size());  // block-major: dst[0]'s first
  const std::uint64_t before = require_value(digest_block(*layout, dst[0]));
  dst_regions[scale].data[0] ^= std::byte{1};
  CHECK(require_value(digest_block(*layout, dst[0])) != before);
}
