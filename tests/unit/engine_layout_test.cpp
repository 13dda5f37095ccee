// dsv4::Dsv4Layout, the engine's KV layout over the DSV4 codecs: its options, device memory refused
// where there is no GPU, and host access (apps/tierbench/kv_content.hpp) on host memory. The
// device-memory side is engine_gpu_test.cpp.
#include <doctest/doctest.h>

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
