// Crash safety of the disk tier: a child process puts objects (many in flight) and reports each
// acknowledged put through a pipe; the parent kills it with SIGKILL at a random instant, reopens
// the store and checks that every acknowledged object reads back bit-exact and that no get ever
// returns anything but the exact object or a miss. Repeated kIterations times on one store.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <set>
#include <thread>

#include "support/disk_support.hpp"

using namespace tier;
using namespace tier::test;

namespace {

constexpr int kIterations = 24;
constexpr std::uint64_t kPerChild = 160;  // keys a child may put; it is killed long before, mostly
constexpr std::uint64_t kNamespace = 9;
constexpr std::uint64_t kReady = ~0ull;  // written by a child once its store is open

std::size_t payload_of(std::uint64_t k) { return 1000 + (k * 7919) % (96 * 1024); }
std::vector<std::byte> image_of(std::uint64_t k) {
  return make_image(key_of(k, kNamespace), payload_of(k), k);
}

disk::DiskOptions store_options(const std::string& path) {
  // 256 MiB: more than every child together can write, so nothing is evicted.
  auto o = small_store(path, 256ull << 20, 4ull << 20);
  o.queue_depth = 8;
  return o;
}

// The child: puts keys [base, base + kPerChild) at queue depth 8; writes each acknowledged key to
// `ack_fd`. Never returns.
[[noreturn]] void child(const std::string& path, std::uint64_t base, int ack_fd) {
  // No verification workers in the forked child: it starts no thread (ThreadSanitizer cannot
  // follow threads started after a multi-threaded process forked), the caller verifies alone.
  set_verify_threads(1);
  auto b = open_disk(store_options(path));
  if (!b) ::_exit(3);
  std::vector<AlignedImage> imgs;
  std::vector<IoRequest> reqs;
  for (std::uint64_t k = base; k < base + kPerChild; ++k) {
    imgs.push_back(aligned_copy(image_of(k)));
    reqs.push_back(IoRequest{Op::kPut, key_of(k, kNamespace), imgs.back().region(), k});
  }
  if (::write(ack_fd, &kReady, sizeof kReady) != sizeof kReady) ::_exit(7);
  std::size_t next = 0, done = 0;
  Completion out[16];
  while (done < reqs.size()) {
    if (next < reqs.size()) {
      auto r =
          b->submit(std::span(reqs).subspan(next, std::min<std::size_t>(4, reqs.size() - next)));
      if (!r) ::_exit(4);
      next += *r;
    }
    auto n = b->poll(out, 1, std::chrono::microseconds(50'000));
    if (!n) ::_exit(5);
    for (std::size_t i = 0; i < *n; ++i, ++done) {
      if (!out[i].status.is_ok()) ::_exit(6);
      std::uint64_t k = out[i].user_data;
      if (::write(ack_fd, &k, sizeof k) != sizeof k) ::_exit(7);
    }
  }
  ::_exit(0);
}

}  // namespace

TEST_CASE("acknowledged puts survive kill -9 at random instants; nothing corrupt is served") {
  TempDir dir;
  std::mt19937_64 rng(20261129);
  std::set<std::uint64_t> acked;
  std::uint64_t killed_busy = 0;  // kills that hit a child with puts in flight
  std::uint64_t torn_seen = 0;
  for (int it = 0; it < kIterations; ++it) {
    const std::uint64_t base = 1'000'000 + static_cast<std::uint64_t>(it) * kPerChild;
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      child(dir.store(), base, fds[1]);
    }
    ::close(fds[1]);
    // Kill anywhere from start-up (index rebuild) to deep into the puts.
    std::uint64_t k;
    std::uint64_t acked_now = 0;
    if (it % 6 == 5) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 5'000));
    } else {
      while (::read(fds[0], &k, sizeof k) == sizeof k && k != kReady) {
      }
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 25'000));
    }
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const bool was_killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    CHECK_MESSAGE((was_killed || (WIFEXITED(status) && WEXITSTATUS(status) == 0)),
                  "child failed on its own: status ", status);
    while (::read(fds[0], &k, sizeof k) == sizeof k) {
      if (k == kReady) continue;
      acked.insert(k);
      ++acked_now;
    }
    ::close(fds[0]);
    if (was_killed && acked_now > 0 && acked_now < kPerChild) ++killed_busy;

    auto b = open_disk(store_options(dir.store()));
    REQUIRE(b);
    CHECK(b->stats().recovered_objects >= acked.size());
    for (std::uint64_t key : acked) {
      std::vector<std::byte> got;
      Completion c = get_image(*b, key_of(key, kNamespace), 128 * 1024, &got);
      REQUIRE_MESSAGE(c.status.is_ok(), "acknowledged key ", key, " after kill ", it, ": ",
                      c.status.to_string());
      REQUIRE_MESSAGE(got == image_of(key), "acknowledged key ", key, " differs");
    }
    // Keys the child may have been writing when it died: the exact object or a miss.
    for (std::uint64_t key = base; key < base + kPerChild; ++key) {
      if (acked.count(key)) continue;
      std::vector<std::byte> got;
      Completion c = get_image(*b, key_of(key, kNamespace), 128 * 1024, &got);
      if (c.status.is_ok())
        CHECK_MESSAGE(got == image_of(key), "unacknowledged key ", key, " served corrupt");
      else if (c.status.code() == Code::kChecksumMismatch)
        ++torn_seen;
      else
        CHECK(c.status.code() == Code::kNotFound);
    }
  }
  MESSAGE(acked.size(), " acknowledged puts over ", kIterations, " kills, ", killed_busy,
          " of them with puts in flight");
  CHECK(torn_seen == 0);  // write-then-publish: a torn image is never even indexed
  CHECK(killed_busy >= kIterations / 4);
}

int main(int argc, char** argv) { return run_disk_tests(argc, argv); }
