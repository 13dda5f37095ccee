#include <doctest/doctest.h>

#include "tier/region.hpp"
#include "tier/status.hpp"

using namespace tier;

TEST_CASE("an OK status carries no message and converts to true") {
  Status s;
  CHECK(s.is_ok());
  CHECK(static_cast<bool>(s));
  CHECK(s.message().empty());
  CHECK(s.to_string() == "ok");
}

TEST_CASE("error statuses keep code and message; copies share the message") {
  Status s(Code::kChecksumMismatch, "payload differs");
  Status copy = s;
  CHECK_FALSE(copy.is_ok());
  CHECK(copy.code() == Code::kChecksumMismatch);
  CHECK(copy.message() == "payload differs");
  CHECK(copy.to_string() == "checksum_mismatch: payload differs");
  CHECK(copy.message().data() == s.message().data());
}

TEST_CASE("code numbers are stable (they cross the C ABI)") {
  CHECK(static_cast<int>(Code::kOk) == 0);
  CHECK(static_cast<int>(Code::kNotFound) == 1);
  CHECK(static_cast<int>(Code::kChecksumMismatch) == 8);
  CHECK(static_cast<int>(Code::kAlreadyExists) == 12);
  CHECK(static_cast<int>(Code::kNoSpace) == 13);
  CHECK(code_name(Code::kTimedOut) == "timed_out");
}

TEST_CASE("Result holds a value or an error") {
  Result<int> ok(5);
  REQUIRE(ok.is_ok());
  CHECK(*ok == 5);
  CHECK(ok.status().is_ok());
  Result<int> err(Status::not_found("nope"));
  CHECK_FALSE(err.is_ok());
  CHECK(err.status().code() == Code::kNotFound);
  CHECK(err.value_or(9) == 9);
  Result<int> bad{Status::ok()};  // an OK status is not an error: it becomes BadState
  CHECK(bad.status().code() == Code::kBadState);
}

namespace {
Result<int> half(int x) {
  if (x % 2) return Status::invalid("odd");
  return x / 2;
}
Result<int> quarter(int x) {
  TIER_ASSIGN_OR_RETURN(int h, half(x));
  TIER_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}
}  // namespace

TEST_CASE("TIER_ASSIGN_OR_RETURN propagates the first error") {
  CHECK(*quarter(8) == 2);
  CHECK(quarter(6).status().message() == "odd");
}

TEST_CASE("Region::slice is checked and never aliases outside the view") {
  std::byte buf[16];
  Region r{buf, 16, MemoryKind::kHost, -1};
  Region s = r.slice(4, 8);
  CHECK(s.data == buf + 4);
  CHECK(s.size == 8);
  CHECK(r.slice(10, 7).data == nullptr);
  CHECK(r.slice(17, 0).data == nullptr);
  CHECK(r.slice(16, 0).size == 0);
  CHECK(r.host_accessible());
  CHECK_FALSE(Region{buf, 16, MemoryKind::kDevice, 0}.host_accessible());
}
