// The shm tier on a /dev/shm too small for its segment (issue 14: Docker's default /dev/shm is
// 64 MB): a clear NoSpace error when the tier starts, never a SIGBUS later, whatever the
// `prefault`. main() moves this process into a private mount namespace (a user namespace too when
// not root) with an 8 MiB tmpfs on /dev/shm (tests/support/private_shm.hpp), so nothing outside
// sees it; where the kernel or the container refuses that, the test exits 77 (skipped).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "shm/store.hpp"
#include "support/private_shm.hpp"
#include "support/test_util.hpp"
#include "tier/registry.hpp"

using namespace tier;
using tier::cpu::ShmConfig;
using tier::cpu::ShmPrefault;
using tier::cpu::ShmStore;
using tier::test::key_of;
using tier::test::make_image;

namespace {

// Every prefault mode, with its name in a profile.
constexpr std::pair<ShmPrefault, const char*> kPrefaults[] = {
    {ShmPrefault::kOff, "off"}, {ShmPrefault::kOpen, "open"}, {ShmPrefault::kBackground, "background"}};

ShmConfig config(const std::string& name, std::uint64_t capacity, ShmPrefault prefault) {
  ShmConfig cfg;
  cfg.segment = name;
  cfg.capacity = capacity;
  cfg.prefault = prefault;
  return cfg;
}

std::uint64_t free_bytes() {
  const std::uint64_t n = tier::test::dev_shm_free_bytes();
  REQUIRE(n > 0);
  return n;
}

}  // namespace

TEST_CASE(
    "shm: a segment larger than /dev/shm is a clear error at start, whatever the prefault") {
  REQUIRE(free_bytes() <= (8u << 20));
  for (auto [prefault, prefault_name] : kPrefaults) {
    CAPTURE(prefault_name);
    auto store = ShmStore::open(config("libtier-room-big", 64u << 20, prefault));
    REQUIRE_FALSE(store.is_ok());
    CHECK(store.status().code() == Code::kNoSpace);
    const std::string msg(store.status().message());
    MESSAGE(msg);
    CHECK(msg.find("/dev/shm") != std::string::npos);
    CHECK(msg.find("needs 65") != std::string::npos);  // 65 MiB and some
    // Through the registry, as a profile's tier is made.
    auto b = Registry::global().create_backend(
        "cpu", BackendContext{
                   "cpu", 64u << 20,
                   Json{{"mode", "shm"}, {"segment", "libtier-room-big"}, {"prefault", prefault_name}}});
    REQUIRE_FALSE(b.is_ok());
    CHECK(b.status().code() == Code::kNoSpace);
    // Nothing is left behind: the room is all still free.
    CHECK(free_bytes() == (8u << 20));
    struct stat st {};
    CHECK(::stat("/dev/shm/libtier-room-big", &st) != 0);
  }
}

TEST_CASE("shm: a segment that fits reserves its memory, so filling it never faults") {
  {
    auto store = ShmStore::open(config("libtier-room-fits", 4u << 20, ShmPrefault::kOff));
    REQUIRE_MESSAGE(store.is_ok(), store.status().to_string());
    CHECK(free_bytes() < (3u << 20));  // reserved at creation, not on first touch
    // Someone else fills the rest of /dev/shm; this tier's puts still land in reserved memory.
    int fd = ::open("/dev/shm/filler", O_CREAT | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    (void)::posix_fallocate(fd, 0, static_cast<off_t>(free_bytes()));
    ::close(fd);
    for (std::uint64_t n = 0; n < 64; ++n) {
      auto img = make_image(key_of(n), 200'000);
      CHECK((*store)->put(key_of(n), img, [](const ObjectKey&, std::uint64_t) {}).is_ok());
    }
    auto report = (*store)->verify();
    REQUIRE(report.is_ok());
    CHECK(report->corrupt == 0);
    CHECK(report->problems.empty());
  }
  ::unlink("/dev/shm/filler");
  REQUIRE(ShmStore::remove_segment("libtier-room-fits").is_ok());
}

TEST_CASE(
    "shm: an existing segment whose memory is not all there is reserved at open, or refused") {
  {
    auto store = ShmStore::open(config("libtier-room-sparse", 4u << 20, ShmPrefault::kOff));
    REQUIRE(store.is_ok());
  }
  // Give back the segment's last 2 MiB (its arena's tail), then let a filler take all the room.
  int fd = ::open("/dev/shm/libtier-room-sparse", O_RDWR);
  REQUIRE(fd >= 0);
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  REQUIRE(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, st.st_size - (2 << 20),
                      2 << 20) == 0);
  ::close(fd);
  fd = ::open("/dev/shm/filler", O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  (void)::posix_fallocate(fd, 0, static_cast<off_t>(free_bytes()));
  ::close(fd);
  for (auto [prefault, prefault_name] : kPrefaults) {
    CAPTURE(prefault_name);
    auto store = ShmStore::open(config("libtier-room-sparse", 4u << 20, prefault));
    REQUIRE_FALSE(store.is_ok());
    CHECK(store.status().code() == Code::kNoSpace);
    MESSAGE(store.status().message());
  }
  // With room again, the open reserves what is missing and the segment works.
  ::unlink("/dev/shm/filler");
  auto store = ShmStore::open(config("libtier-room-sparse", 4u << 20, ShmPrefault::kOpen));
  REQUIRE_MESSAGE(store.is_ok(), store.status().to_string());
  for (std::uint64_t n = 0; n < 32; ++n) {
    auto img = make_image(key_of(n), 200'000);
    CHECK((*store)->put(key_of(n), img, [](const ObjectKey&, std::uint64_t) {}).is_ok());
  }
  store->reset();
  REQUIRE(ShmStore::remove_segment("libtier-room-sparse").is_ok());
}

int main(int argc, char** argv) {
  if (!tier::test::private_dev_shm("8m")) {
    std::fprintf(stderr, "no private mount namespace with a small /dev/shm here: skipping\n");
    return tier::test::kSkip;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
