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
  const auto rt = test::stack_round_trip(**stack, 4000, 7);
  REQUIRE(rt.codec.is_ok());
  REQUIRE(rt.save_call.is_ok());
  CHECK(rt.save.is_ok());
  REQUIRE(rt.load_call.is_ok());
  CHECK(rt.load.is_ok());
  CHECK(rt.same);
}
