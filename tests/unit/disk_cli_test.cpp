// `tierctl disk` on a real store: verify finds flipped bytes (exit 1, --json counts), repair drops
// them and rebuilds the index, and the tier then serves exactly the good objects.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>

#include "support/disk_support.hpp"

using namespace tier;
using namespace tier::test;

namespace {

struct Run {
  int rc = -1;
  std::string out;
};

Run tierctl(const std::string& args) {
  const char* exe = std::getenv("TIERCTL");
  REQUIRE(exe != nullptr);
  Run r;
  FILE* p = ::popen((std::string(exe) + " " + args + " 2>/dev/null").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = ::pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

Json json_of(const Run& r) {
  Json j = Json::parse(r.out, nullptr, false);
  REQUIRE_MESSAGE(!j.is_discarded(), r.out);
  return j;
}

std::vector<std::byte> image_of(std::uint64_t n) { return make_image(key_of(n), 10'000, n); }

}  // namespace

TEST_CASE("tierctl disk verify finds flipped bytes; repair drops them") {
  TempDir dir;
  auto opts = small_store(dir.store());
  {
    auto b = open_disk(opts);
    REQUIRE(b);
    for (std::uint64_t i = 0; i < 10; ++i)
      REQUIRE(put_image(*b, key_of(i), image_of(i)).status.is_ok());
    // While the tier runs, the tools read a snapshot; repair refuses.
    CHECK(tierctl("disk verify " + dir.store()).rc == 0);
    CHECK(tierctl("disk repair " + dir.store()).rc != 0);
  }
  Run clean = tierctl("disk verify " + dir.store() + " --json");
  CHECK(clean.rc == 0);
  CHECK(json_of(clean)["objects"] == 10);
  CHECK(json_of(clean)["bad_objects"] == 0);

  flip_byte(dir.store() + "/data", 3 * 3 * 4096 + 4000);  // payload of object 3
  flip_byte(dir.store() + "/index", 4096 + 8 * 64 + 20);  // entry of object 7 (record 8)
  Run bad = tierctl("disk verify " + dir.store() + " --json");
  CHECK(bad.rc == 1);
  CHECK(json_of(bad)["objects"] == 9);
  CHECK(json_of(bad)["bad_objects"] == 2);

  Run inspect = tierctl("disk inspect " + dir.store() + " --json");
  CHECK(inspect.rc == 0);
  CHECK(json_of(inspect)["objects"] == 9);
  CHECK(json_of(inspect)["namespaces"] == 1);
  CHECK(json_of(inspect)["corrupt_entries"] == 1);

  Run repair = tierctl("disk repair " + dir.store() + " --json");
  CHECK(repair.rc == 0);
  CHECK(json_of(repair)["objects_after"] == 8);
  Run after = tierctl("disk verify " + dir.store() + " --json");
  CHECK(after.rc == 0);
  CHECK(json_of(after)["objects"] == 8);

  auto b = open_disk(opts);
  REQUIRE(b);
  CHECK(b->usage().objects == 8);
  for (std::uint64_t i = 0; i < 10; ++i) {
    std::vector<std::byte> got;
    Completion c = get_image(*b, key_of(i), 16384, &got);
    if (i == 3 || i == 7) {
      CHECK(c.status.code() == Code::kNotFound);
    } else {
      REQUIRE(c.status.is_ok());
      CHECK(got == image_of(i));
    }
  }
  CHECK(tierctl("disk verify /nonexistent-dir").rc == 2);
}

int main(int argc, char** argv) { return run_disk_tests(argc, argv); }
