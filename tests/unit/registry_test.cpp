// Plugins: libtier's own, loaded by name from the plugin directory beside libtier.so; a backend
// built as a separate .so and loaded from a profile; and the refusals (ABI mismatch, missing
// entry symbol, failing create). static_plugins_test covers the statically linked form.
#include <doctest/doctest.h>

#include "support/test_util.hpp"
#include "tier/plugin.h"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;

TEST_CASE("libtier's own plugins load by name from the plugins folder beside libtier.so") {
  Registry& r = Registry::global();
  CHECK(r.find(PluginKind::kCodec, "identity")->source == "built-in");  // the core's only one
  const PluginInfo* cpu = r.find(PluginKind::kBackend, "cpu");
  REQUIRE(cpu != nullptr);
  CHECK(cpu->source.ends_with("/libtier/plugins/libtier_backend_cpu.so"));
  CHECK(cpu->library != nullptr);  // loaded with dlopen through the C ABI
  CHECK(r.find(PluginKind::kBackend, "cpu") == cpu);  // once
  CHECK(r.find(PluginKind::kCodec, "cpu") == nullptr);
  CHECK(r.find(PluginKind::kBackend, "../cpu") == nullptr);  // a name is not a path
  CHECK(&Registry::global() == &r);
  // A profile naming the type is enough: no "plugins" entry needed.
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(R"({"tiers":[{"name":"c","capacity":"1MiB",
      "backend":{"type":"cpu"}}]})"), r, "<t>", &errors);
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  CHECK(TierStack::open(*p).is_ok());
}

TEST_CASE("a plugin built outside the core loads from a profile and serves a tier") {
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(R"({"plugins":["mock"],"tiers":[
      {"name":"m","capacity":"64MiB","backend":{"type":"mock","fail_every":0}}]})"),
                         Registry::global(), "<t>", &errors);
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  const PluginInfo* info = Registry::global().find(PluginKind::kBackend, "mock");
  REQUIRE(info != nullptr);
  CHECK(info->source.find("libtier_backend_mock.so") != std::string::npos);
  auto stack = TierStack::open(*p);
  REQUIRE(stack.is_ok());
  const auto rt = test::stack_round_trip(**stack, 1000, 1);
  REQUIRE(rt.codec.is_ok());
  REQUIRE(rt.save_call.is_ok());
  CHECK(rt.save.is_ok());
  REQUIRE(rt.load_call.is_ok());
  CHECK(rt.load.is_ok());
  CHECK(rt.same);
  // Loading the same plugin again is a no-op, not a duplicate.
  CHECK(Registry::global().load("mock").is_ok());
}

TEST_CASE("the plugin's options are checked by the core before create()") {
  REQUIRE(Registry::global().load("mock").is_ok());
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(R"({"tiers":[
      {"name":"m","capacity":"1MiB","backend":{"type":"mock","fail_evry":3}}]})"),
                         Registry::global(), "<t>", &errors);
  CHECK(errors.joined() ==
        R"(/tiers/0/backend/fail_evry: unknown option "fail_evry"; did you mean "fail_every"?)");
}

TEST_CASE("a plugin whose create() fails is reported with its tier path") {
  REQUIRE(Registry::global().load("mock").is_ok());
  auto p = parse_profile(Json::parse(R"({"tiers":[
      {"name":"m","capacity":"1MiB","backend":{"type":"mock","refuse_start":true}}]})"),
                         Registry::global(), "<t>");
  REQUIRE(p.is_ok());
  auto stack = TierStack::open(*p);
  REQUIRE_FALSE(stack.is_ok());
  CHECK(std::string(stack.status().message()) ==
        R"(/tiers/0/backend: backend "mock" failed to start: asked to refuse to start)");
}

TEST_CASE("a plugin of another ABI version is refused with a clear error") {
  Status s = Registry::global().load("badabi");
  CHECK(s.code() == Code::kInvalidArgument);
  const std::string want = "plugin ABI version " + std::to_string(TIER_PLUGIN_ABI_VERSION + 1) +
                           " does not match libtier's " + std::to_string(TIER_PLUGIN_ABI_VERSION);
  CHECK(std::string(s.message()).find(want) != std::string::npos);
  CHECK(Registry::global().find(PluginKind::kBackend, "badabi") == nullptr);
}

TEST_CASE("a shared object without the entry symbol is refused") {
  Status s = Registry::global().load("nosymbol");
  CHECK(s.code() == Code::kInvalidArgument);
  CHECK(std::string(s.message()).find("does not export tier_plugin_entry()") != std::string::npos);
}

TEST_CASE("a missing plugin names the places searched") {
  Status s = Registry::global().load("absent");
  CHECK(s.code() == Code::kNotFound);
  CHECK(std::string(s.message()).find("libtier_backend_absent.so") != std::string::npos);
  CHECK(Registry::global().load("/no/such/libtier_backend_x.so").code() == Code::kNotFound);
}

TEST_CASE("descriptors are checked when added") {
  Registry r;
  CHECK(r.add(nullptr, "t").code() == Code::kInvalidArgument);
  const PluginInfo* cpu_info = Registry::global().find(PluginKind::kBackend, "cpu");
  REQUIRE(cpu_info != nullptr);
  const tier_plugin* cpu = cpu_info->descriptor;
  CHECK(r.add(cpu, "first").is_ok());
  Status dup = r.add(cpu, "second");
  CHECK(dup.code() == Code::kInvalidArgument);
  CHECK(std::string(dup.message()).find("already registered (from first)") != std::string::npos);
  tier_plugin undocumented = *cpu;
  undocumented.name = "undocumented";
  undocumented.options_json = R"([{"name":"x","type":"uint"}])";
  Status s = r.add(&undocumented, "t");
  CHECK(std::string(s.message()).find("option x has no doc") != std::string::npos);
  auto made = r.create_backend("nope", BackendContext{"t", 1, Json::object()});
  std::string msg(made.status().message());
  CHECK(msg.starts_with(R"(unknown backend "nope"; registered: )"));
  CHECK(msg.find("cpu") != std::string::npos);  // registered here, and a file in the plugin dir
  CHECK(msg.find("mock") != std::string::npos);  // a file in TIER_PLUGIN_DIR
}

TEST_CASE("every built-in option is documented and appears in its schema") {
  for (PluginKind kind : {PluginKind::kBackend, PluginKind::kCodec, PluginKind::kStage}) {
    for (const auto& name : Registry::global().names(kind)) {
      const PluginInfo* info = Registry::global().find(kind, name);
      if (name == "badabi" || name == "nosymbol") {  // the fixtures that must not load
        CHECK(info == nullptr);
        continue;
      }
      REQUIRE_MESSAGE(info != nullptr, name);
      Json schema = options_schema_json(info->options);
      CHECK(schema.size() == info->options.size());
      for (const auto& o : schema) CHECK_MESSAGE(!o["doc"].get<std::string>().empty(), name);
      CHECK_MESSAGE(!info->description.empty(), name);
    }
  }
}

TEST_CASE("a plugin file that fails to load is reported with the reason, not as unknown") {
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(R"({"tiers":[{"name":"b","capacity":"1MiB",
      "backend":{"type":"badabi"}}]})"), Registry::global(), "<t>", &errors);
  CHECK_FALSE(p.is_ok());
  const std::string e = errors.joined();
  CHECK(e.find(R"(/tiers/0/backend/type: backend "badabi": its plugin failed to load: )") !=
        std::string::npos);
  CHECK(e.find("ABI version") != std::string::npos);
}
