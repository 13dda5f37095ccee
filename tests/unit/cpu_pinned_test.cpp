// The cpu tier's pinned mode without a GPU: the arena allocator behind the pinned heap mode
// (exact placement, coalescing, best fit, compaction hand-off), the "pinned" option's schema, and
// what "pinned": true does on a build or machine without a GPU (NotSupported naming the option;
// an optional tier is skipped). Device transfers are in cpu_pinned_gpu_test.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "extent_allocator.hpp"
#include "support/test_util.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;
using tier::cpu::ExtentAllocator;

namespace {

// Whether this build and machine can run the pinned mode: a GPU runtime built in (the gpu
// backend is registered) and a device (the gpu tier starts).
bool gpu_here() {
  auto names = Registry::global().names(PluginKind::kBackend);
  if (std::find(names.begin(), names.end(), "gpu") == names.end()) return false;
  auto g =
      Registry::global().create_backend("gpu", BackendContext{"gpu", 1u << 20, Json::object()});
  return g.is_ok();
}

Json cpu_tier(Json backend, bool optional) {
  return Json{{"name", "pinned"},
              {"capacity", "4MiB"},
              {"backend", std::move(backend)},
              {"optional", optional}};
}

}  // namespace

TEST_CASE("extent allocator: exact bytes, equal sizes fill the arena exactly") {
  ExtentAllocator a(193 * 5);
  for (std::uint64_t i = 0; i < 5; ++i) {
    auto off = a.allocate(193);
    REQUIRE(off);
    CHECK(*off == 193 * i);
  }
  CHECK(a.free_bytes() == 0);
  CHECK_FALSE(a.allocate(1));
  a.release(193 * 2, 193);
  CHECK(a.allocate(193) == std::optional<std::uint64_t>(193 * 2));  // the hole is reused
}

TEST_CASE("extent allocator: neighbours coalesce; best fit; scattered free bytes ask to compact") {
  ExtentAllocator a(1000);
  auto x = a.allocate(100), y = a.allocate(200), z = a.allocate(300), w = a.allocate(400);
  REQUIRE((x && y && z && w));
  CHECK(a.free_bytes() == 0);
  a.release(*x, 100);
  a.release(*z, 300);
  CHECK(a.free_extents() == 2);
  CHECK(a.largest_free() == 300);
  a.release(*y, 200);  // joins both neighbours: [0, 600)
  CHECK(a.free_extents() == 1);
  CHECK(a.largest_free() == 600);
  CHECK(a.free_bytes() == 600);

  // Best fit: a 50-byte request takes the smaller of two holes that hold it.
  ExtentAllocator b(1000);
  std::vector<std::uint64_t> offs;
  for (int i = 0; i < 10; ++i) offs.push_back(*b.allocate(100));
  b.release(offs[1], 100);  // hole of 100 at 100
  b.release(offs[5], 100);
  b.release(offs[6], 100);  // hole of 200 at 500
  CHECK(b.allocate(50) == std::optional<std::uint64_t>(100));
  // 250 free bytes in holes of 50 and 200: 250 bytes fit only after compaction.
  CHECK(b.free_bytes() == 250);
  CHECK_FALSE(b.allocate(250));
  b.reset(750);  // the owner packed its 750 live bytes to the front
  CHECK(b.allocate(250) == std::optional<std::uint64_t>(750));
  CHECK(b.free_bytes() == 0);
}

TEST_CASE("the pinned option is a strict bool with a doc string") {
  auto bad = parse_profile(
      Json{{"tiers", Json::array({cpu_tier(Json{{"type", "cpu"}, {"pinned", "yes"}}, false)})}},
      Registry::global(), "<test>");
  REQUIRE_FALSE(bad);
  CHECK(bad.status().message().find("/tiers/0/backend/pinned") != std::string::npos);
  auto typo = parse_profile(
      Json{{"tiers", Json::array({cpu_tier(Json{{"type", "cpu"}, {"pined", true}}, false)})}},
      Registry::global(), "<test>");
  REQUIRE_FALSE(typo);
  CHECK(typo.status().message().find("pinned") != std::string::npos);  // "did you mean"
  auto ok = parse_profile(
      Json{{"tiers", Json::array({cpu_tier(Json{{"type", "cpu"}, {"pinned", false}}, false)})}},
      Registry::global(), "<test>");
  CHECK_MESSAGE(ok, ok.status().to_string());
}

TEST_CASE("pinned: true without a GPU is NotSupported naming the option, in both modes") {
  if (gpu_here()) {
    MESSAGE("a GPU is here: cpu_pinned_gpu_test covers the pinned mode");
    auto b = Registry::global().create_backend(
        "cpu", BackendContext{"pinned", 1u << 20, Json{{"pinned", true}}});
    REQUIRE_MESSAGE(b, b.status().to_string());
    CHECK(((*b)->capabilities().memory_kinds & kind_bit(MemoryKind::kDevice)) != 0);
    return;
  }
  for (Json options :
       {Json{{"pinned", true}},
        Json{{"pinned", true}, {"mode", "shm"}, {"segment", "libtier-unit-nogpu"}}}) {
    CAPTURE(options.dump());
    auto b = Registry::global().create_backend("cpu", BackendContext{"pinned", 1u << 20, options});
    REQUIRE_FALSE(b);
    // The shm mode may be built out; then its own NotSupported comes first.
    CHECK(b.status().code() == Code::kNotSupported);
    if (options.contains("mode") && b.status().message().find("shm") != std::string::npos) continue;
    CHECK(b.status().message().find("pinned: true needs") != std::string_view::npos);
  }
  // The shm mode checks before it creates anything: no segment was left behind.
  CHECK_FALSE(std::filesystem::exists("/dev/shm/libtier-unit-nogpu"));
  // Without "pinned" the same tier is an ordinary host tier.
  auto plain = Registry::global().create_backend(
      "cpu", BackendContext{"plain", 1u << 20, Json{{"pinned", false}}});
  REQUIRE(plain);
  CHECK((*plain)->capabilities().memory_kinds == kHostKinds);
}

TEST_CASE("an optional pinned tier is kept with a GPU; without one it is skipped, or named") {
  auto profile = parse_profile(
      Json{{"tiers", Json::array({cpu_tier(Json{{"type", "cpu"}, {"pinned", true}}, true),
                                  Json{{"name", "host"},
                                       {"capacity", "4MiB"},
                                       {"backend", Json{{"type", "cpu"}}}}})}},
      Registry::global(), "<test>");
  REQUIRE_MESSAGE(profile, profile.status().to_string());
  auto stack = TierStack::open(*profile);
  REQUIRE_MESSAGE(stack, stack.status().to_string());
  if (gpu_here()) {
    CHECK((*stack)->tier_count() == 2);
    CHECK((*stack)->skipped_tiers().empty());
    return;  // the strict stack opens too; cpu_pinned_gpu_test covers the tier itself
  }
  CHECK((*stack)->tier_count() == 1);
  REQUIRE((*stack)->skipped_tiers().size() == 1);
  CHECK((*stack)->skipped_tiers()[0].rfind("pinned: ", 0) == 0);  // the tier's name
  CHECK((*stack)->skipped_tiers()[0].find("pinned: true needs") != std::string::npos);

  profile->tiers[0].optional = false;
  auto strict = TierStack::open(*profile);
  REQUIRE_FALSE(strict);
  CHECK(strict.status().code() == Code::kNotSupported);
  CHECK(strict.status().message().rfind("/tiers/0/backend: ", 0) == 0);
  CHECK(strict.status().message().find("pinned: true needs") != std::string_view::npos);
}
