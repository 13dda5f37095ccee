// The disk tier where the kernel refuses io_uring, as a container's seccomp profile does:
// create() fails with NotSupported naming the cause. Exits 77 where seccomp filters cannot be
// installed (the case cannot be set up) or the disk tier cannot run at all.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>

#include "support/disk_support.hpp"
#include "tier/registry.hpp"

using namespace tier;
using namespace tier::test;

namespace {

// Installs a filter under which io_uring_setup fails with EPERM; false when this process may
// not install filters.
bool refuse_io_uring() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// Runs `child` in a forked process; returns its exit status, or -1 when it did not exit.
template <class F>
int in_child(F&& child) {
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) ::_exit(child());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("a kernel that refuses io_uring makes create() fail with NotSupported") {
  TempDir dir;
  int rc = in_child([&] {
    if (!refuse_io_uring()) return 2;
    BackendContext ctx{"disk", 8ull << 20, Json{{"path", dir.store()}, {"region_size", 1 << 20}}};
    auto b = Registry::global().create_backend("disk", ctx);
    const bool refused = !b && b.status().code() == Code::kNotSupported &&
                         b.status().message().find("refused io_uring") != std::string_view::npos;
    if (!refused) std::fprintf(stderr, "create: %s\n", b ? "ok" : b.status().to_string().c_str());
    return refused ? 0 : 1;
  });
  CHECK(rc == 0);
}

int main(int argc, char** argv) {
  if (in_child([] { return refuse_io_uring() ? 0 : 2; }) != 0) {
    std::fprintf(stderr, "skipped: this process may not install seccomp filters\n");
    return kSkip;
  }
  return run_disk_tests(argc, argv);
}
