// libtier's own plugins linked statically (Meson: plugin_static, -Dstatic_plugins=true): each
// registers its descriptor before main() with source "static", through the same C ABI as the
// dlopen form, and serves a profile without any plugin file being opened.
#include <doctest/doctest.h>

#include <string>

#include "support/test_util.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;

TEST_CASE("statically linked plugins are registered before main, with source static") {
  Registry& r = Registry::global();
  const PluginInfo* cpu = r.find(PluginKind::kBackend, "cpu");
  REQUIRE(cpu != nullptr);
  CHECK(cpu->source == "static");
  CHECK(cpu->library == nullptr);  // nothing was dlopen'ed for it
  CHECK(cpu->descriptor->abi_version == TIER_PLUGIN_ABI_VERSION);
  // Every other plugin this build has is linked here too: none of them comes from a file.
  for (const char* name : {"disk", "gpu", "redis"}) {
    if (const PluginInfo* info = r.find(PluginKind::kBackend, name))
      CHECK_MESSAGE(info->source == "static", name);
  }
  if (const PluginInfo* zstd = r.find(PluginKind::kStage, "zstd")) CHECK(zstd->source == "static");
}

TEST_CASE("a statically linked backend serves a tier") {
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(R"({"tiers":[{"name":"c","capacity":"1MiB",
      "backend":{"type":"cpu"}}]})"), Registry::global(), "<t>", &errors);
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  auto stack = TierStack::open(*p);
  REQUIRE(stack.is_ok());
  auto codec = Registry::global().create_codec("identity", Json::object());
  REQUIRE(codec.is_ok());
  std::vector<std::byte> data(4000, std::byte{3}), back(4000);
  Region src = host_region(data), dst = host_region(back);
  ObjectKey k = test::key_of(7);
  Status s;
  REQUIRE((*stack)->save(std::span<const SaveItem>({SaveItem{k, RegionList(&src, 1)}}), **codec,
                         std::span(&s, 1)).is_ok());
  CHECK(s.is_ok());
  LoadResult lr;
  REQUIRE((*stack)->load(std::span<const LoadItem>({LoadItem{k, RegionList(&dst, 1)}}), **codec,
                         std::span(&lr, 1)).is_ok());
  CHECK(lr.status.is_ok());
  CHECK(back == data);
}
