// The disk tier refuses a store directory or file owned by another user, naming the path and the
// owner (issue 14). Needs root to give files away (chown to uid 65534); exits 77 otherwise, and
// where the disk tier cannot run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>

#include "support/disk_support.hpp"

using namespace tier;
using namespace tier::test;
using disk::DiskBackend;

namespace {

constexpr uid_t kOther = 65534;  // nobody

}  // namespace

TEST_CASE("a directory owned by another user is refused") {
  TempDir dir;
  REQUIRE(::mkdir(dir.store().c_str(), 0755) == 0);
  REQUIRE(::chown(dir.store().c_str(), kOther, kOther) == 0);
  auto b = DiskBackend::open("disk", small_store(dir.store()));
  REQUIRE_FALSE(b);
  CHECK(b.status().code() == Code::kInvalidArgument);
  CHECK(b.status().message().find(dir.store()) != std::string::npos);
  CHECK(b.status().message().find("uid 65534") != std::string::npos);
  CHECK(std::filesystem::is_empty(dir.store()));
}

TEST_CASE("a data or index file owned by another user is refused, the store left as it is") {
  for (const char* name : {"index", "data"}) {
    CAPTURE(name);
    TempDir dir;
    auto opts = small_store(dir.store());
    {
      auto b = open_disk(opts);
      REQUIRE(b);
      REQUIRE(put_image(*b, key_of(1), make_image(key_of(1), 5000, 1)).status.is_ok());
    }
    const std::string file = dir.store() + "/" + name;
    REQUIRE(::chown(file.c_str(), kOther, kOther) == 0);
    auto b = DiskBackend::open("disk", opts);
    REQUIRE_FALSE(b);
    CHECK(b.status().message().find(file) != std::string::npos);
    CHECK(b.status().message().find("uid 65534") != std::string::npos);
    // Given back, the store opens with its object.
    REQUIRE(::chown(file.c_str(), ::geteuid(), ::getegid()) == 0);
    auto ok = open_disk(opts);
    REQUIRE(ok);
    CHECK(ok->usage().objects == 1);
  }
}

int main(int argc, char** argv) {
  if (::geteuid() != 0) {
    std::fprintf(stderr, "skipped: giving files to another user needs root\n");
    return kSkip;
  }
  TempDir probe;
  if (::chown(probe.path.c_str(), kOther, kOther) != 0) {
    std::fprintf(stderr, "skipped: chown to uid %u refused here\n", kOther);
    return kSkip;
  }
  return run_disk_tests(argc, argv);
}
