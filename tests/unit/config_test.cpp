// Profiles are strict: one test case per error message, each checking the JSON pointer, what
// was expected and what was found.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tier/options.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"

using namespace tier;

namespace {

// The errors of parsing `text`, joined one per line ("" when valid).
std::string errors_of(const std::string& text) {
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(text), Registry::global(), "<test>", &errors);
  CHECK(p.is_ok() == errors.empty());
  return errors.joined();
}

const char* kCpuTier = R"({"name":"cpu","capacity":"1GiB","backend":{"type":"cpu"}})";

std::string with_tier(const std::string& tier) {
  return std::string(R"({"tiers":[)") + kCpuTier + "," + tier + "]}";
}

}  // namespace

TEST_CASE("a valid profile resolves with defaults filled in") {
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(std::string(R"({"tiers":[)") + kCpuTier + "]}"),
                         Registry::global(), "<test>", &errors);
  REQUIRE(p.is_ok());
  CHECK(p->tiers[0].capacity_bytes == (1ull << 30));
  CHECK(p->tiers[0].backend_options["mode"] == "heap");
  CHECK(p->max_inflight_bytes == (256ull << 20));
  CHECK(p->op_timeout_us == 10'000'000);
  Json explained = p->to_json();
  CHECK(explained["tiers"][0]["capacity"] == "1GiB");
  CHECK(explained["tiers"][0]["on_evict"] == "demote");
}

TEST_CASE("negative capacity") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":-3,"backend":{"type":"cpu"}})")) ==
        R"(/tiers/1/capacity: expected a size like "64GiB", got -3)");
}

TEST_CASE("capacity that is not a size") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":"64 gigs","backend":"cpu"})")) ==
        R"(/tiers/1/capacity: expected a size like "64GiB", got string "64 gigs")");
}

TEST_CASE("zero capacity") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":0,"backend":"cpu"})")) ==
        R"(/tiers/1/capacity: expected a size like "64GiB", got 0)");
}

TEST_CASE("unknown top-level key with a hint") {
  CHECK(errors_of(std::string(R"({"tier":[],"tiers":[)") + kCpuTier + "]}") ==
        R"(/tier: unknown key "tier"; did you mean "tiers"?)");
}

TEST_CASE("unknown tier key with a hint") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":"1GiB","backend":"cpu","capcity":1})")) ==
        R"(/tiers/1/capcity: unknown key "capcity"; did you mean "capacity"?)");
}

TEST_CASE("unknown tier key without a close match") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":"1GiB","backend":"cpu","zzzz":1})")) ==
        R"(/tiers/1/zzzz: unknown key "zzzz")");
}

TEST_CASE("missing tiers") {
  CHECK(errors_of("{}") == "/tiers: required key is missing (an array of tiers, fastest first)");
}

TEST_CASE("empty tiers") {
  CHECK(errors_of(R"({"tiers":[]})") == "/tiers: expected a non-empty array of tiers, got an array");
}

TEST_CASE("a profile that is not an object") {
  CHECK(errors_of("[1]") == "/: expected a profile object, got an array");
}

TEST_CASE("a tier that is not an object") {
  CHECK(errors_of(with_tier("7")) == "/tiers/1: expected a tier object, got 7");
}

TEST_CASE("missing name") {
  CHECK(errors_of(with_tier(R"({"capacity":"1GiB","backend":"cpu"})")) ==
        R"(/tiers/1/name: required key is missing (the tier's name, e.g. "cpu"))");
}

TEST_CASE("duplicate name") {
  CHECK(errors_of(with_tier(R"({"name":"cpu","capacity":"1GiB","backend":"cpu"})")) ==
        R"(/tiers/1/name: tier name "cpu" is used twice)");
}

TEST_CASE("missing capacity") {
  CHECK(errors_of(with_tier(R"({"name":"b","backend":"cpu"})")) ==
        R"(/tiers/1/capacity: required key is missing (a size like "64GiB"))");
}

TEST_CASE("missing backend") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":"1GiB"})")) ==
        R"(/tiers/1/backend: required key is missing (e.g. {"type": "cpu"}))");
}

TEST_CASE("unknown backend type lists the registered ones") {
  std::string e = errors_of(with_tier(R"({"name":"b","capacity":"1GiB","backend":{"type":"cpux"}})"));
  CHECK(e.rfind(R"(/tiers/1/backend/type: unknown backend "cpux" (did you mean "cpu"?); registered: )", 0) == 0);
  CHECK(e.find("cpu") != std::string::npos);
}

TEST_CASE("backend without type") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":"1GiB","backend":{"mode":"heap"}})")) ==
        "/tiers/1/backend/type: required key is missing (a backend name)");
}

TEST_CASE("backend type that is not a string") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":"1GiB","backend":{"type":3}})")) ==
        "/tiers/1/backend/type: expected a string, got 3");
}

TEST_CASE("backend that is neither a name nor an object") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":"1GiB","backend":true})")) ==
        R"(/tiers/1/backend: expected a backend name or an object with "type", got true)");
}

TEST_CASE("unknown backend option with a hint") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":"1GiB","backend":{"type":"cpu","mdoe":"heap"}})")) ==
        R"(/tiers/1/backend/mdoe: unknown option "mdoe"; did you mean "mode"?)");
}

TEST_CASE("backend option outside its choices") {
  std::string e = errors_of(with_tier(R"({"name":"b","capacity":"1GiB","backend":{"type":"cpu","mode":"disk"}})"));
  CHECK(e.rfind(R"(/tiers/1/backend/mode: expected one of "heap")", 0) == 0);
  CHECK(e.find(R"(, got string "disk")") != std::string::npos);
}

TEST_CASE("read/write flags must be booleans") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":"1GiB","backend":"cpu","read":"yes"})")) ==
        R"(/tiers/1/read: expected true or false, got string "yes")");
}

TEST_CASE("optional must be a boolean") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":"1GiB","backend":"cpu","optional":1})")) ==
        "/tiers/1/optional: expected true or false, got 1");
}

TEST_CASE("a tier neither read nor written") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":"1GiB","backend":"cpu","read":false,"write":false})")) ==
        "/tiers/1: a tier that is neither read nor written does nothing; remove it");
}

TEST_CASE("no writable tier") {
  CHECK(errors_of(R"({"tiers":[{"name":"a","capacity":"1GiB","backend":"cpu","write":false}]})") ==
        R"(/tiers: no tier is writable ("write": true))");
}

TEST_CASE("bad on_evict") {
  CHECK(errors_of(with_tier(R"({"name":"b","capacity":"1GiB","backend":"cpu","on_evict":"spill"})")) ==
        R"(/tiers/1/on_evict: expected one of "demote", "drop", got string "spill")");
}

TEST_CASE("bad version") {
  CHECK(errors_of(std::string(R"({"version":2,"tiers":[)") + kCpuTier + "]}") ==
        "/version: expected 1, got 2");
}

TEST_CASE("stack options are typed") {
  CHECK(errors_of(std::string(R"({"stack":{"max_inflight_bytes":"lots"},"tiers":[)") + kCpuTier + "]}") ==
        R"(/stack/max_inflight_bytes: expected a size like "64GiB" >= 1, got string "lots")");
  CHECK(errors_of(std::string(R"({"stack":{"op_timeout":"5 fortnights"},"tiers":[)") + kCpuTier + "]}") ==
        R"(/stack/op_timeout: expected a duration like "250ms" >= 1000, got string "5 fortnights")");
}

TEST_CASE("plugins must be an array") {
  CHECK(errors_of(std::string(R"({"plugins":"mock","tiers":[)") + kCpuTier + "]}") ==
        R"(/plugins: expected an array of plugin names or paths, got string "mock")");
}

TEST_CASE("a missing plugin is reported with where it was looked for") {
  std::string e = errors_of(std::string(R"({"plugins":["nonesuch"],"tiers":[)") + kCpuTier + "]}");
  CHECK(e.rfind(R"(/plugins/0: plugin "nonesuch" not found (looked for: )", 0) == 0);
}

TEST_CASE("environment variables expand, with defaults; an unset one without default is an error") {
  ::unsetenv("TIER_TEST_UNSET");
  ::setenv("TIER_TEST_CAP", "2GiB", 1);
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(R"({"tiers":[{"name":"${TIER_TEST_NAME:-cpu}",
      "capacity":"${TIER_TEST_CAP}","backend":"cpu"}]})"), Registry::global(), "<t>", &errors);
  REQUIRE(p.is_ok());
  CHECK(p->tiers[0].name == "cpu");
  CHECK(p->tiers[0].capacity_bytes == (2ull << 30));
  CHECK(errors_of(R"({"tiers":[{"name":"a","capacity":"${TIER_TEST_UNSET}","backend":"cpu"}]})") ==
        R"(/tiers/0/capacity: environment variable TIER_TEST_UNSET is not set and "${TIER_TEST_UNSET}" gives no default)");
  CHECK(errors_of(R"({"tiers":[{"name":"a","capacity":"${BAD-NAME}","backend":"cpu"}]})") ==
        R"(/tiers/0/capacity: bad variable name "BAD-NAME" in "${BAD-NAME}")");
}

TEST_CASE("every error is reported, not just the first") {
  std::string e = errors_of(R"({"tierz":1,"tiers":[{"name":"a","capacity":-1,"backend":"nope"}]})");
  CHECK(std::count(e.begin(), e.end(), '\n') == 2);
}

TEST_CASE("invalid JSON in a file names line and column") {
  auto path = std::filesystem::temp_directory_path() / "libtier-bad-profile.json";
  std::ofstream(path) << "{\n  \"tiers\": [\n    {\"name\": \"a\",, }\n  ]\n}\n";
  ConfigErrors errors;
  auto p = load_profile(path.string(), Registry::global(), &errors);
  CHECK(p.status().code() == Code::kInvalidArgument);
  CHECK(std::string(p.status().message()).find(path.string() + ":3:") == 0);
  std::filesystem::remove(path);
  CHECK(load_profile("/nonexistent/profile.json", Registry::global()).status().code() ==
        Code::kNotFound);
}

TEST_CASE("sizes and durations") {
  CHECK(*parse_size(Json("64GiB")) == 64ull << 30);
  CHECK(*parse_size(Json("1.5 MiB")) == 1572864);
  CHECK(*parse_size(Json("2KB")) == 2000);
  CHECK(*parse_size(Json(512)) == 512);
  CHECK(*parse_size(Json("512")) == 512);
  CHECK_FALSE(parse_size(Json(-1)).has_value());
  CHECK_FALSE(parse_size(Json("1.3B")).has_value());
  CHECK_FALSE(parse_size(Json("GiB")).has_value());
  CHECK_FALSE(parse_size(Json(true)).has_value());
  CHECK(*parse_duration_us(Json("250ms")) == 250'000);
  CHECK(*parse_duration_us(Json("2s")) == 2'000'000);
  CHECK(*parse_duration_us(Json("1m")) == 60'000'000);
  CHECK_FALSE(parse_duration_us(Json("3 weeks")).has_value());
  CHECK(format_size(64ull << 30) == "64GiB");
  CHECK(format_size(1536) == "1.50KiB");
  CHECK(format_size(7) == "7B");
}

TEST_CASE("option schemas need a doc for every option and a default that fits") {
  CHECK_THROWS_WITH_AS(parse_option_specs(R"([{"name":"x","type":"uint"}])"),
                       "options schema: option x has no doc", std::invalid_argument);
  CHECK_THROWS_AS(parse_option_specs(R"([{"name":"x","type":"uint","doc":"d","default":-1}])"),
                  std::invalid_argument);
  CHECK_THROWS_AS(parse_option_specs(R"([{"name":"x","type":"colour","doc":"d"}])"),
                  std::invalid_argument);
  auto specs = parse_option_specs(
      R"([{"name":"qd","type":"uint","doc":"depth","min":1,"max":64,"default":8},
          {"name":"path","type":"path","doc":"where"}])");
  ConfigErrors errors;
  Json resolved = resolve_options(Json{{"qd", "64"}}, specs, "/x", errors);
  CHECK(errors.joined() ==
        "/x/qd: expected an unsigned integer in [1, 64], got string \"64\"\n"
        "/x/path: required option is missing (expected a path string)");
  ::setenv("TIER_TEST_QD", "32", 1);
  ConfigErrors e2;
  resolved = resolve_options(Json{{"qd", "${TIER_TEST_QD}"}, {"path", "/tmp"}}, specs, "/x", e2);
  CHECK(e2.empty());
  CHECK(resolved["qd"] == 32);
}

TEST_CASE("every profile key has a type and a doc") {
  Json schema = profile_schema_json();
  for (const char* table : {"profile", "stack", "tier"}) {
    REQUIRE(schema[table].is_array());
    CHECK_FALSE(schema[table].empty());
    for (const Json& key : schema[table]) {
      CHECK_MESSAGE(!key["type"].get<std::string>().empty(), key.dump());
      CHECK_MESSAGE(!key["doc"].get<std::string>().empty(), key.dump());
    }
  }
  // The keys of TierSpec that to_json() shows are the keys the tier table reads.
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(std::string(R"({"tiers":[)") + kCpuTier + "]}"),
                         Registry::global(), "<test>", &errors);
  REQUIRE(p.is_ok());
  for (const Json& key : schema["tier"])
    CHECK_MESSAGE(p->to_json()["tiers"][0].contains(key["name"].get<std::string>()), key.dump());
}

TEST_CASE("every shipped profile is valid") {
  const char* root = std::getenv("TIER_SOURCE_ROOT");
  REQUIRE(root != nullptr);
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(root) / "profiles")) {
    if (entry.path().extension() != ".json") continue;
    ConfigErrors errors;
    auto p = load_profile(entry.path().string(), Registry::global(), &errors);
    CHECK_MESSAGE(p.is_ok(), entry.path().string() << ": " << errors.joined());
    ++n;
  }
  CHECK(n >= 2);
}

TEST_CASE("a default may hold a variable: ${A:-${B}/x} expands both levels") {
  ::unsetenv("TIER_TEST_UNSET");
  ::setenv("TIER_TEST_HOME", "/home/u", 1);
  CHECK(*expand_env("${TIER_TEST_UNSET:-${TIER_TEST_HOME}/x}") == "/home/u/x");
  CHECK(*expand_env("${TIER_TEST_UNSET:-${TIER_TEST_UNSET:-deep}}/y") == "deep/y");
  ::setenv("TIER_TEST_SET", "given", 1);
  CHECK(*expand_env("${TIER_TEST_SET:-${TIER_TEST_HOME}}") == "given");
  CHECK(expand_env("${TIER_TEST_UNSET:-${TIER_TEST_HOME}").status().code() ==
        Code::kInvalidArgument);  // unterminated
  std::string deep = "end";
  for (int i = 0; i < 12; ++i) deep = "${TIER_TEST_UNSET:-" + deep + "}";
  auto r = expand_env(deep);
  REQUIRE_FALSE(r.is_ok());
  CHECK(std::string(r.status().message()).find("nested deeper than 8 levels") != std::string::npos);
}

namespace {
// Writes `text` to a fresh file and loads it as a profile: the error message, or "" when valid.
std::string load_error_of(const std::string& text) {
  auto path = std::filesystem::temp_directory_path() / "libtier-hostile-profile.json";
  std::ofstream(path) << text;
  auto p = load_profile(path.string(), Registry::global());
  std::filesystem::remove(path);
  return p.is_ok() ? "" : std::string(p.status().message());
}
}  // namespace

TEST_CASE("a profile file: duplicate keys, deep nesting, size and non-regular files are refused") {
  std::string e = load_error_of(
      R"({"tiers":[{"name":"a","capacity":"1MiB","capacity":"2MiB","backend":"cpu"}]})");
  CHECK(e.find(R"(/tiers/0/capacity: duplicate key "capacity")") != std::string::npos);
  e = load_error_of(R"({"tiers":[],"tiers":[]})");
  CHECK(e.find(R"(/tiers: duplicate key "tiers")") != std::string::npos);
  // 200,000 levels: refused at level 65 in bounded time and memory, no crash.
  std::string deep = R"({"tiers":[{"name":"a","capacity":"1MiB","backend":{"type":"cpu","x":)" +
                     std::string(200000, '[') + std::string(200000, ']') + "}}]}";
  e = load_error_of(deep);
  CHECK(e.find("nesting deeper than 64 levels") != std::string::npos);
  // Over 1 MiB: refused before reading.
  e = load_error_of(std::string((1 << 20) + 1, ' ') + "{}");
  CHECK(e.find("a profile is at most 1048576 bytes") != std::string::npos);
  // /dev/zero would be read until memory runs out: only regular files are profiles.
  auto z = load_profile("/dev/zero", Registry::global());
  CHECK(z.status().code() == Code::kInvalidArgument);
  CHECK(std::string(z.status().message()).find("must be a regular file") != std::string::npos);
  // The same keys in different objects are fine.
  CHECK(load_error_of(R"({"tiers":[{"name":"a","capacity":"1MiB","backend":"cpu"},
      {"name":"b","capacity":"1MiB","backend":"cpu"}]})") == "");
}

TEST_CASE("a plugin named by a relative path is found beside the profile, not in the cwd") {
  namespace fs = std::filesystem;
  const char* dir = std::getenv("TIER_PLUGIN_DIR");
  REQUIRE(dir != nullptr);
  fs::path work = fs::temp_directory_path() / "libtier-plugin-anchor";
  fs::remove_all(work);
  fs::create_directories(work / "profiles" / "lib");
  fs::copy_file(fs::path(dir) / "libtier_backend_mock.so",
                work / "profiles" / "lib" / "libtier_backend_mock.so");
  std::ofstream(work / "profiles" / "p.json")
      << R"({"plugins":["lib/libtier_backend_mock.so"],"tiers":[{"name":"m","capacity":"1MiB",)"
      << R"("backend":{"type":"mock"}}]})";
  const fs::path cwd = fs::current_path();
  fs::current_path(work);  // lib/... does not exist here: only beside the profile
  ConfigErrors errors;
  auto p = load_profile((work / "profiles" / "p.json").string(), Registry::global(), &errors);
  fs::current_path(cwd);
  CHECK_MESSAGE(p.is_ok(), errors.joined());
  // A bare file name is searched in the plugin directories only, never the working directory.
  std::ofstream(work / "libtier_backend_cwdonly.so") << "not a plugin";
  fs::current_path(work);
  Status s = Registry::global().load("libtier_backend_cwdonly.so");
  fs::current_path(cwd);
  CHECK(s.code() == Code::kNotFound);
  fs::remove_all(work);
}

TEST_CASE("credentials never leave through explain or an error message") {
  CHECK(redact_url_passwords("redis://alice:s3cret@cache:7001/5") ==
        "redis://alice:(redacted)@cache:7001/5");
  CHECK(redact_url_passwords("rediss://:pw@h") == "rediss://:(redacted)@h");
  CHECK(redact_url_passwords("redis://h:6379/0") == "redis://h:6379/0");  // a port, no userinfo
  CHECK(redact_url_passwords("/data/tier") == "/data/tier");
  // The redis tier's password option is marked secret (the build always has the redis plugin
  // where Boost is installed: .ci/install-deps).
  REQUIRE(Registry::global().find(PluginKind::kBackend, "redis") != nullptr);
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(R"({"tiers":[{"name":"r","capacity":"1MiB","backend":{
      "type":"redis","url":"redis://alice:s3cret@127.0.0.1:1","password":"hunter2"}}]})"),
                         Registry::global(), "<t>", &errors);
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  const std::string shown = p->to_json().dump();
  CHECK(shown.find("s3cret") == std::string::npos);
  CHECK(shown.find("hunter2") == std::string::npos);
  CHECK(shown.find("(redacted)") != std::string::npos);
  const std::string e = errors_of(R"({"tiers":[{"name":"r","capacity":"1MiB","backend":{
      "type":"redis","password":31415926}}]})");
  CHECK(e.find("/tiers/0/backend/password: expected") == 0);
  CHECK(e.find("31415926") == std::string::npos);
}

TEST_CASE("a profile checked without loading plugins loads none and lists what it did not check") {
  // A registry of this test's own: the global one may have loaded plugins already.
  Registry registry;
  auto dir = std::filesystem::temp_directory_path() / "libtier-noload-profile";
  std::filesystem::create_directories(dir);
  auto path = dir / "p.json";
  std::ofstream(path) << R"({"tiers":[{"name":"m","capacity":"1MiB",
                                      "backend":{"type":"mock","bogus":1}}]})";
  std::vector<std::string> unchecked;
  ConfigErrors errors;
  auto p = load_profile(path.string(), registry, &errors,
                        ProfileLoad{.load_plugins = false, .unchecked = &unchecked});
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  REQUIRE(unchecked.size() == 1);
  CHECK(unchecked[0] ==
        "/tiers/0/backend: backend \"mock\" is a plugin that is not loaded and has no option "
        "schema beside it: its options are not checked");
  CHECK(p->tiers[0].backend_options == Json{{"bogus", 1}});  // as written
  CHECK(registry.find_registered(PluginKind::kBackend, "mock") == nullptr);
  // Loading checks the options.
  p = load_profile(path.string(), registry, &errors);
  CHECK(std::string(p.status().message()).find(R"(/tiers/0/backend/bogus: unknown option)") !=
        std::string::npos);
  CHECK(registry.find_registered(PluginKind::kBackend, "mock") != nullptr);

  // An unknown type is an error without loading; a listed plugin is located, never opened, and a
  // type it may provide is not checked; a listed plugin that is not there is an error.
  std::ofstream(path) << R"({"tiers":[{"name":"m","capacity":"1MiB","backend":"nosuch"}]})";
  unchecked.clear();
  p = load_profile(path.string(), registry, &errors,
                   ProfileLoad{.load_plugins = false, .unchecked = &unchecked});
  CHECK(std::string(p.status().message()).find(R"(/tiers/0/backend: unknown backend "nosuch")") !=
        std::string::npos);
  std::ofstream(path) << R"({"plugins":["libtier_backend_badabi.so"],
                             "tiers":[{"name":"m","capacity":"1MiB","backend":"badabi"}]})";
  unchecked.clear();
  p = load_profile(path.string(), registry, &errors,
                   ProfileLoad{.load_plugins = false, .unchecked = &unchecked});
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  REQUIRE(unchecked.size() == 2);
  CHECK(unchecked[0].find("/plugins/0: plugin ") == 0);
  CHECK(unchecked[0].find("libtier_backend_badabi.so not loaded") != std::string::npos);
  CHECK(unchecked[1].find(R"(/tiers/0/backend: backend "badabi" is a plugin that is not loaded)") ==
        0);
  std::ofstream(path) << R"({"plugins":["lib/none.so"],
                             "tiers":[{"name":"m","capacity":"1MiB","backend":"x"}]})";
  p = load_profile(path.string(), registry, &errors, ProfileLoad{.load_plugins = false});
  const std::string missing = (dir / "lib/none.so").string();
  CHECK(
      std::string(p.status().message()).find("/plugins/0: plugin \"" + missing + "\" not found") !=
      std::string::npos);
  std::filesystem::remove_all(dir);
}
