#pragma once
// A private /dev/shm for tests that need a small one: moves the calling process into a private
// mount namespace (a user namespace too when not root) and mounts a tmpfs of `size` (a tmpfs
// size option, e.g. "8m") on /dev/shm, so nothing outside sees it. Call it first in main(), while
// the process has one thread (a user namespace needs that); where the kernel or the container
// refuses, it prints why and returns false, and the test exits 77 (skipped).

#include <fmt/format.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace tier::test {

inline bool private_dev_shm(const char* size) {
  auto write_file = [](const char* path, const std::string& text) {
    std::ofstream f(path);
    f << text;
    return static_cast<bool>(f.flush());
  };
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  if (uid != 0) {
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
      std::perror("unshare(CLONE_NEWUSER | CLONE_NEWNS)");
      return false;
    }
    if (!write_file("/proc/self/setgroups", "deny") ||
        !write_file("/proc/self/uid_map", fmt::format("0 {} 1", uid)) ||
        !write_file("/proc/self/gid_map", fmt::format("0 {} 1", gid))) {
      std::perror("uid_map");
      return false;
    }
  } else if (::unshare(CLONE_NEWNS) != 0) {
    std::perror("unshare(CLONE_NEWNS)");
    return false;
  }
  if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      ::mount("tmpfs", "/dev/shm", "tmpfs", 0, fmt::format("size={},mode=1777", size).c_str()) !=
          0) {
    std::perror("mount tmpfs on /dev/shm");
    return false;
  }
  return true;
}

// Bytes free in /dev/shm (0 when statvfs fails).
inline std::uint64_t dev_shm_free_bytes() {
  struct statvfs v {};
  if (::statvfs("/dev/shm", &v) != 0) return 0;
  return std::uint64_t{v.f_bavail} * v.f_frsize;
}

}  // namespace tier::test
