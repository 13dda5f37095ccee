// TierStack::lease over real CPU tiers and the mock plugin (which cannot lease): each key is held
// in the fastest tier that stores it, a key only the mock holds counts as present but not held
// (best effort, counted), and release() and expiry end the lease in every tier (docs/leases.md).
#include <doctest/doctest.h>

#include <chrono>

#include "support/test_util.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;
using tier::test::key_of;
using tier::test::make_image;
using tier::test::run;

namespace {

std::unique_ptr<TierStack> open_stack() {
  REQUIRE(Registry::global().load("mock").is_ok());
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(R"({"tiers":[
      {"name":"fast","capacity":"1MiB","backend":"cpu"},
      {"name":"slow","capacity":"1MiB","backend":"cpu"},
      {"name":"far","capacity":"1MiB","backend":"mock"}]})"),
                         Registry::global(), "<t>", &errors);
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  auto s = TierStack::open(*p);
  REQUIRE_MESSAGE(s.is_ok(), s.status().to_string());
  return std::move(s).value();
}

void put_in(TierStack& s, std::size_t tier, const ObjectKey& k) {
  auto img = make_image(k, 1000);
  REQUIRE(run(s.tier(tier), Op::kPut, k, host_region(img)).status.is_ok());
}

}  // namespace

TEST_CASE("a stack lease holds each key in the fastest tier that stores it") {
  auto s = open_stack();
  const ObjectKey both = key_of(1), slow_only = key_of(2), absent = key_of(3), far_only = key_of(4);
  put_in(*s, 0, both);
  put_in(*s, 1, both);
  put_in(*s, 1, slow_only);
  put_in(*s, 2, far_only);
  const ObjectKey keys[] = {both, slow_only, absent, far_only};
  std::uint8_t held[4] = {};
  auto id = s->lease(keys, std::chrono::seconds(60), held);
  REQUIRE(id.is_ok());
  CHECK(*id != 0);
  CHECK(held[0] == 1);
  CHECK(held[1] == 1);
  CHECK(held[2] == 0);
  CHECK(held[3] == 1);  // present in a tier that cannot lease: best effort
  CHECK(s->tier(0).metrics().leased_keys.get() == 1);
  CHECK(s->tier(1).metrics().leased_keys.get() == 1);  // slow_only; `both` is held in fast
  CHECK(s->tier(2).metrics().leases_unsupported.get() == 1);
  CHECK(s->active_leases() == 1);
  s->release(*id);
  s->release(*id);  // ignored
  CHECK(s->tier(0).metrics().lease_releases.get() == 1);
  CHECK(s->tier(1).metrics().lease_releases.get() == 1);
  CHECK(s->active_leases() == 0);
}

TEST_CASE("a stack lease past its deadline is ended by the next lease, counted as expired") {
  auto s = open_stack();
  const ObjectKey k = key_of(5);
  put_in(*s, 0, k);
  std::uint8_t held = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto id = s->lease(std::span(&k, 1), std::chrono::milliseconds(1), std::span(&held, 1));
  REQUIRE(id.is_ok());
  REQUIRE(*id != 0);
  // The deadline itself is what is tested: wait until it has certainly passed.
  while (std::chrono::steady_clock::now() < t0 + std::chrono::milliseconds(5)) {
  }
  auto next = s->lease(std::span(&k, 1), std::chrono::seconds(60), std::span(&held, 1));
  REQUIRE(next.is_ok());
  CHECK(s->active_leases() == 1);
  CHECK(s->tier(0).metrics().lease_expiries.get() == 1);
  CHECK(s->tier(0).metrics().lease_releases.get() == 0);
  s->release(*id);  // ended already
  s->release(*next);
  CHECK(s->tier(0).metrics().lease_expiries.get() == 1);
  CHECK(s->tier(0).metrics().lease_releases.get() == 1);
}

TEST_CASE("held and keys must have the same size") {
  auto s = open_stack();
  const ObjectKey k = key_of(6);
  std::uint8_t held[2] = {};
  CHECK(s->lease(std::span(&k, 1), std::chrono::seconds(1), held).status().code() ==
        Code::kInvalidArgument);
}

TEST_CASE("a lease of milliseconds::max() holds, capped at an hour, in the stack and the tier") {
  // Was: now + ttl overflowed into the past, so the lease was counted and protected nothing.
  auto s = open_stack();
  const ObjectKey k = key_of(7);
  put_in(*s, 0, k);
  std::uint8_t held = 0;
  auto id = s->lease(std::span(&k, 1), std::chrono::milliseconds::max(), std::span(&held, 1));
  REQUIRE(id.is_ok());
  REQUIRE(held == 1);
  // Another lease call ends the stack leases past their deadline: this one is not.
  const ObjectKey other = key_of(8);
  auto next = s->lease(std::span(&other, 1), std::chrono::seconds(1), std::span(&held, 1));
  REQUIRE(next.is_ok());
  CHECK(s->active_leases() == 1);
  // The tier does not evict it: fill the 1 MiB fast tier twice over with other objects.
  for (std::uint64_t i = 100; i < 130; ++i) {
    auto img = make_image(key_of(i), 70'000);
    run(s->tier(0), Op::kPut, key_of(i), host_region(img));
  }
  CHECK(run(s->tier(0), Op::kContains, k, Region{}).status.is_ok());
  CHECK(s->tier(0).metrics().lease_expiries.get() == 0);
  s->release(*id);
  CHECK(s->tier(0).metrics().lease_releases.get() == 1);
}
