// Processes that open one shm tier at the same moment (issue 29: the TP ranks of an engine start
// together): exactly one creates and reserves the segment, the others wait for it and attach, so
// a /dev/shm with room for one segment serves them all. main() moves this process into a private
// mount namespace with a 64 MiB tmpfs on /dev/shm (Docker's default size;
// tests/support/private_shm.hpp); where that is refused the test exits 77 (skipped). Children are
// fork()ed from a process with one thread, so ThreadSanitizer covers them (suite `threads`).
#define DOCTEST_CONFIG_IMPLEMENT
#include <dirent.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "shm/store.hpp"
#include "support/private_shm.hpp"
#include "support/test_util.hpp"
#include "tier/registry.hpp"

using namespace tier;
using tier::cpu::ShmConfig;
using tier::cpu::ShmStore;
using tier::test::key_of;
using tier::test::make_image;
using tier::test::wait_child;

namespace {

// 40 MiB of objects: a segment of about 41 MiB, so a 64 MiB /dev/shm holds one and not two.
constexpr std::uint64_t kCapacity = 40u << 20;

ShmConfig config(const std::string& segment) {
  ShmConfig cfg;
  cfg.segment = segment;
  cfg.capacity = kCapacity;
  cfg.prefault = cpu::ShmPrefault::kOff;  // no mapping thread: ranks are forked after it
  return cfg;
}

std::set<std::string> dev_shm_names() {
  std::set<std::string> names;
  DIR* d = ::opendir("/dev/shm");
  REQUIRE(d != nullptr);
  while (dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
      names.insert(e->d_name);
  ::closedir(d);
  return names;
}

// One rank: waits at the start line (reads EOF once the parent closes the pipe), opens the tier
// through the registry as a profile's tier is made, stores an object of its own and reads it
// back. Exit 0 on success, 1 when the tier did not start, 2 when the object went wrong.
[[noreturn]] void rank(int start_fd, const std::string& segment, std::uint32_t r) {
  ::alarm(60);            // a hung rank dies instead of hanging the suite
  set_verify_threads(1);  // a forked child starts no thread (ThreadSanitizer cannot follow it)
  char c;
  while (::read(start_fd, &c, 1) > 0) {
  }
  auto b = Registry::global().create_backend(
      "cpu", BackendContext{"cpu", kCapacity,  // "off": no mapping thread either
                            Json{{"mode", "shm"}, {"segment", segment}, {"prefault", "off"}}});
  if (!b) {
    std::fprintf(stderr, "rank %u: %s\n", r, b.status().to_string().c_str());
    std::_Exit(1);
  }
  const ObjectKey k = key_of(r, 1, r);
  auto img = make_image(k, 100'000 + r);
  std::vector<std::byte> out(img.size());
  bool ok = tier::test::run(**b, Op::kPut, k, host_region(img)).status.is_ok() &&
            tier::test::run(**b, Op::kGet, k, host_region(out)).status.is_ok() && out == img;
  b->reset();
  std::_Exit(ok ? 0 : 2);
}

// Starts `n` ranks on `segment` at once; returns their exit codes.
std::vector<int> start_together(std::uint32_t n, const std::string& segment) {
  int gate[2];
  REQUIRE(::pipe(gate) == 0);
  std::vector<pid_t> pids;
  for (std::uint32_t r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(gate[1]);
      rank(gate[0], segment, r);
    }
    pids.push_back(pid);
  }
  ::close(gate[0]);
  ::close(gate[1]);  // every rank reads EOF now
  std::vector<int> codes;
  for (pid_t pid : pids) codes.push_back(wait_child(pid));
  return codes;
}

}  // namespace

TEST_CASE(
    "shm: 8 and 16 processes opening one tier at once, with room for one segment, all "
    "attach") {
  for (std::uint32_t n : {8u, 16u}) {
    CAPTURE(n);
    const std::string segment = fmt::format("libtier-start-{}", n);
    REQUIRE(dev_shm_names().empty());
    REQUIRE(tier::test::dev_shm_free_bytes() < 2 * kCapacity);  // room for one segment only
    std::vector<int> codes = start_together(n, segment);
    CHECK(codes == std::vector<int>(n, 0));
    // One segment, and nothing else: no abandoned candidate, no creation lock or file left.
    CHECK(dev_shm_names() == std::set<std::string>{segment});
    // Every rank's object is in it, bit for bit; every rank's client slot was given back.
    auto store = ShmStore::attach(segment);
    REQUIRE_MESSAGE(store.is_ok(), store.status().to_string());
    for (std::uint32_t r = 0; r < n; ++r) {
      const ObjectKey k = key_of(r, 1, r);
      auto want = make_image(k, 100'000 + r);
      std::vector<std::byte> got(want.size());
      auto g = (*store)->get(k, got);
      CHECK_MESSAGE(g.status.is_ok(), g.status.to_string());
      CHECK(got == want);
    }
    const cpu::ShmStats st = (*store)->stats();
    CHECK(st.objects == n);
    CHECK(st.clients == 1);
    CHECK(st.reaped_clients == 0);
    store->reset();
    REQUIRE(ShmStore::remove_segment(segment).is_ok());
  }
}

TEST_CASE("shm: waiting for a creator that does not finish is a clear TimedOut") {
  const std::string segment = "libtier-start-stuck";
  const std::string lock_path = "/dev/shm/." + segment + ".lock";
  // This process plays a creator that stopped while holding the creation lock.
  int fd = ::open(lock_path.c_str(), O_RDONLY | O_CREAT, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  ShmConfig cfg = config(segment);
  cfg.creation_wait = std::chrono::milliseconds(300);
  const auto t0 = std::chrono::steady_clock::now();
  auto store = ShmStore::open(cfg);
  REQUIRE_FALSE(store.is_ok());
  CHECK(store.status().code() == Code::kTimedOut);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(300));
  const std::string msg(store.status().message());
  MESSAGE(msg);
  CHECK(msg.find(lock_path) != std::string::npos);
  CHECK(msg.find("tierctl shm remove " + segment) != std::string::npos);
  // Nothing was reserved while waiting.
  CHECK(dev_shm_names() == std::set<std::string>{"." + segment + ".lock"});
  // The lock held: remove leaves it. Released: the next open creates the segment.
  CHECK(ShmStore::remove_segment(segment).code() == Code::kNotFound);
  CHECK(dev_shm_names().count("." + segment + ".lock") == 1);
  ::close(fd);
  store = ShmStore::open(cfg);
  REQUIRE_MESSAGE(store.is_ok(), store.status().to_string());
  CHECK(dev_shm_names() == std::set<std::string>{segment});
  store->reset();
  REQUIRE(ShmStore::remove_segment(segment).is_ok());
}

TEST_CASE("shm: a creator killed while creating blocks nobody and leaves no room taken") {
  const std::string segment = "libtier-start-killed";
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // takes the creation lock, starts a candidate segment, then is killed
    int fd = ::open(("/dev/shm/." + segment + ".lock").c_str(), O_RDONLY | O_CREAT, 0600);
    int cand = ::open(fmt::format("/dev/shm/{}.init.{}.1", segment, ::getpid()).c_str(),
                      O_RDWR | O_CREAT, 0600);
    bool ok = fd >= 0 && ::flock(fd, LOCK_EX) == 0 && cand >= 0 &&
              ::posix_fallocate(cand, 0, kCapacity) == 0;
    (void)!::write(ready[1], ok ? "1" : "0", 1);
    ::pause();
    std::_Exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  ::close(ready[0]);
  REQUIRE(c == '1');
  ::kill(pid, SIGKILL);
  REQUIRE(wait_child(pid) == 128 + SIGKILL);
  // Its lock died with it; its candidate is removed, so the segment fits.
  ShmConfig cfg = config(segment);
  auto store = ShmStore::open(cfg);
  REQUIRE_MESSAGE(store.is_ok(), store.status().to_string());
  CHECK(dev_shm_names() == std::set<std::string>{segment});
  store->reset();
  REQUIRE(ShmStore::remove_segment(segment).is_ok());
}

TEST_CASE("shm: a FIFO or a symbolic link planted as the creation lock is refused, not waited on") {
  const std::string segment = "libtier-start-planted";
  const std::string lock_path = "/dev/shm/." + segment + ".lock";
  ShmConfig cfg = config(segment);
  ::alarm(30);  // an open that blocked on the FIFO would hang here
  REQUIRE(::mkfifo(lock_path.c_str(), 0600) == 0);
  auto store = ShmStore::open(cfg);
  REQUIRE_FALSE(store.is_ok());
  MESSAGE(store.status().to_string());
  CHECK(store.status().code() == Code::kInvalidArgument);
  CHECK(std::string(store.status().message()).find("not a regular file") != std::string::npos);
  REQUIRE(::unlink(lock_path.c_str()) == 0);
  REQUIRE(::symlink("/dev/shm/elsewhere", lock_path.c_str()) == 0);
  store = ShmStore::open(cfg);
  REQUIRE_FALSE(store.is_ok());
  MESSAGE(store.status().to_string());
  CHECK(store.status().code() == Code::kIoError);
  // Nothing was created, through the link or beside it.
  CHECK(dev_shm_names() == std::set<std::string>{"." + segment + ".lock"});
  REQUIRE(::unlink(lock_path.c_str()) == 0);
  ::alarm(0);
}

int main(int argc, char** argv) {
  if (!tier::test::private_dev_shm("64m")) {
    std::fprintf(stderr, "no private mount namespace with a small /dev/shm here: skipping\n");
    return tier::test::kSkip;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
