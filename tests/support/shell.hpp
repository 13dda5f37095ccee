#pragma once
// Running programs (tierctl) from tests and flipping bytes in files they read: test-only helpers
// shared by the CLI, disk and shm tests.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace tier::test {

struct Run {
  int rc = -1;  // exit status; -1 when killed by a signal
  std::string out;
};

// Runs `cmd` through /bin/sh and collects its standard output.
inline Run run_shell(const std::string& cmd) {
  Run r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = ::pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// Flips one byte of the stored copy of image `good` inside the file `path` (a shm segment),
// through a separate mapping: the byte at image offset `off`, found by a window of the image
// around it that lies within one block (stored images start at block boundaries, multiples of
// `block`).
inline void flip_stored_byte(const std::string& path, const std::vector<std::byte>& good,
                             std::size_t off, std::size_t block) {
  const std::size_t block_start = off / block * block;
  const std::size_t lo = std::max(block_start, off >= 128 ? off - 128 : 0);
  const std::size_t hi = std::min({block_start + block, off + 128, good.size()});
  int fd = ::open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  auto* m = static_cast<std::byte*>(::mmap(nullptr, static_cast<std::size_t>(st.st_size),
                                           PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ::close(fd);
  REQUIRE(m != MAP_FAILED);
  std::byte* end = m + st.st_size;
  std::byte* at = std::search(m, end, good.data() + lo, good.data() + hi);
  REQUIRE(at != end);
  at[off - lo] ^= std::byte{0x08};
  ::munmap(m, static_cast<std::size_t>(st.st_size));
}

}  // namespace tier::test
