// The verification threads start when a TierStack opens, not inside its first verified save or
// load (docs/object-format.md, "Verification threads"), which started them and then waited for a
// new thread's first chunk. Threads are counted in /proc/self/task: this binary runs one case,
// so the process's pool has not started before it.
#include <doctest/doctest.h>

#include <filesystem>
#include <vector>

#include "support/test_util.hpp"
#include "tier/object.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;

namespace {

std::size_t threads_now() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

}  // namespace

TEST_CASE("the verification workers start with the first TierStack, not in its first transfer") {
  const std::size_t before = threads_now();
  ConfigErrors errors;
  auto p = parse_profile(
      Json::parse(R"({"tiers": [{"name": "cpu", "capacity": "64MiB", "backend": {"type": "cpu"}}]})"),
      Registry::global(), "<prestart>", &errors);
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  auto stack = TierStack::open(*p);
  REQUIRE_MESSAGE(stack.is_ok(), stack.status().to_string());
  const std::size_t opened = threads_now();
  CHECK(opened == before + (verify_threads() - 1));

  // A save and a load of 16 chunks: verified by the caller and the workers, none started now.
  auto codec = std::move(Registry::global().create_codec("identity", Json::object())).value();
  std::vector<std::byte> data(1 << 20), back(1 << 20);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 131 + 7);
  Region src = host_region(data), dst = host_region(back);
  const ObjectKey k = tier::test::key_of(1);
  Status saved;
  REQUIRE((*stack)->save(std::span<const SaveItem>({SaveItem{k, RegionList(&src, 1)}}), *codec,
                         std::span(&saved, 1)).is_ok());
  REQUIRE(saved.is_ok());
  LoadResult loaded;
  REQUIRE((*stack)->load(std::span<const LoadItem>({LoadItem{k, RegionList(&dst, 1)}}), *codec,
                         std::span(&loaded, 1)).is_ok());
  REQUIRE(loaded.status.is_ok());
  CHECK(back == data);
  CHECK(threads_now() == opened);
}
