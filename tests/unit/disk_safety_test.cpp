// The disk tier against careless paths and other local users (issue 14): symbolic links are
// refused and their targets untouched; a directory of unrelated files named `data` and `index` is
// left byte-identical; what the tier creates is 0700/0600 (or the `mode` option) whatever the
// umask; a file that is not a store is refused until `tierctl disk format`; a write past
// `ulimit -f` fails with NoSpace instead of killing the process. Real io_uring on real files;
// exits 77 without them.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <csignal>
#include <fstream>
#include <iterator>

#include "support/disk_support.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;
using namespace tier::test;
using disk::DiskBackend;

namespace {

std::vector<std::byte> image_of(std::uint64_t n, std::size_t payload = 10'000) {
  return make_image(key_of(n), payload, n);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

unsigned mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

// Restores the umask when it goes.
struct Umask {
  mode_t old;
  explicit Umask(mode_t m) : old(::umask(m)) {}
  ~Umask() { ::umask(old); }
};

}  // namespace

TEST_CASE("a symbolic link as data, index or the directory is refused; its target is unchanged") {
  TempDir dir;
  const std::string foreign = dir.path + "/foreign";
  const std::string text = "somebody else's file, not a store\n";
  for (const char* name : {"index", "data"}) {
    CAPTURE(name);
    write_file(foreign, text);
    const std::string store = dir.path + "/store-" + name;
    REQUIRE(::mkdir(store.c_str(), 0700) == 0);
    REQUIRE(::symlink(foreign.c_str(), (store + "/" + name).c_str()) == 0);
    auto b = DiskBackend::open("disk", small_store(store));
    REQUIRE_FALSE(b);
    CHECK(b.status().code() == Code::kInvalidArgument);
    CHECK(b.status().message().find("symbolic link") != std::string::npos);
    CHECK(b.status().message().find(store + "/" + name) != std::string::npos);
    CHECK(read_file(foreign) == text);
    CHECK(mode_of(foreign) != 0);  // still there, still a file
  }
  // The store directory itself as a link.
  const std::string real = dir.path + "/real";
  REQUIRE(::mkdir(real.c_str(), 0700) == 0);
  REQUIRE(::symlink(real.c_str(), (dir.path + "/linked").c_str()) == 0);
  auto b = DiskBackend::open("disk", small_store(dir.path + "/linked"));
  REQUIRE_FALSE(b);
  CHECK(b.status().message().find("symbolic link") != std::string::npos);
  CHECK(std::filesystem::is_empty(real));
}

TEST_CASE("TIER_DATA_DIR at a directory of unrelated files named data and index leaves them") {
  TempDir dir;
  const std::string project = dir.path + "/project";
  REQUIRE(::mkdir(project.c_str(), 0755) == 0);
  std::string data(3 << 20, '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + i / 4096);
  const std::string index = "# my index\nchapter 1 .......... 3\n";
  write_file(project + "/data", data);
  write_file(project + "/index", index);
  ::setenv("TIER_DATA_DIR", project.c_str(), 1);
  const char* profile = R"({"tiers": [{"name": "disk", "capacity": "16MiB",
      "backend": {"type": "disk", "path": "${TIER_DATA_DIR}", "region_size": "1MiB"}}]})";
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(profile), Registry::global(), "<t>", &errors);
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  auto s = TierStack::open(*p);
  REQUIRE_FALSE(s);
  CHECK(s.status().message().find("not a disk tier index") != std::string::npos);
  CHECK(s.status().message().find("tierctl disk format") != std::string::npos);
  CHECK(read_file(project + "/data") == data);
  CHECK(read_file(project + "/index") == index);
  // Only `data` there: refused as well, and the `index` the tier created is gone again.
  REQUIRE(::unlink((project + "/index").c_str()) == 0);
  auto again = TierStack::open(*p);
  REQUIRE_FALSE(again);
  CHECK(again.status().message().find("there is no index") != std::string::npos);
  CHECK(read_file(project + "/data") == data);
  CHECK_FALSE(std::filesystem::exists(project + "/index"));
  ::unsetenv("TIER_DATA_DIR");
}

TEST_CASE("created directory and files are 0700 and 0600 whatever the umask; mode widens them") {
  TempDir dir;
  {
    Umask open_umask(0);
    auto b = open_disk(small_store(dir.store()));
    REQUIRE(b);
    REQUIRE(put_image(*b, key_of(1), image_of(1)).status.is_ok());
  }
  CHECK(mode_of(dir.store()) == 0700);
  CHECK(mode_of(dir.store() + "/data") == 0600);
  CHECK(mode_of(dir.store() + "/index") == 0600);
  // An existing store (an earlier version made it 0644) is tightened to the configured mode.
  REQUIRE(::chmod((dir.store() + "/data").c_str(), 0644) == 0);
  {
    auto b = open_disk(small_store(dir.store()));
    REQUIRE(b);
    CHECK(b->usage().objects == 1);
  }
  CHECK(mode_of(dir.store() + "/data") == 0600);
  // Deliberate sharing with the group, under a umask that would forbid it.
  Umask strict(077);
  auto opts = small_store(dir.path + "/shared");
  opts.mode = 0640;
  {
    auto b = open_disk(opts);
    REQUIRE(b);
  }
  CHECK(mode_of(dir.path + "/shared") == 0750);
  CHECK(mode_of(dir.path + "/shared/data") == 0640);
  CHECK(mode_of(dir.path + "/shared/index") == 0640);
}

TEST_CASE("the mode option is in the schema and checked") {
  ConfigErrors errors;
  auto bad = parse_profile(Json::parse(R"({"tiers": [{"name": "disk", "capacity": "16MiB",
      "backend": {"type": "disk", "path": "/tmp/x", "mode": "0666"}}]})"),
                           Registry::global(), "<t>", &errors);
  CHECK_FALSE(bad);
  CHECK(errors.joined().find("/tiers/0/backend/mode") != std::string::npos);
}

TEST_CASE("an index that is not a store is refused, not reformatted, until tierctl disk format") {
  TempDir dir;
  auto opts = small_store(dir.store());
  {
    auto b = open_disk(opts);
    REQUIRE(b);
    REQUIRE(put_image(*b, key_of(1), image_of(1)).status.is_ok());
  }
  // A damaged superblock: the store is no longer recognisable, so the tier leaves it alone.
  flip_byte(dir.store() + "/index", 10);
  const std::string before = read_file(dir.store() + "/index");
  auto b = DiskBackend::open("disk", opts);
  REQUIRE_FALSE(b);
  CHECK(b.status().code() == Code::kBadState);
  CHECK(b.status().message().find("tierctl disk repair") != std::string::npos);
  CHECK(read_file(dir.store() + "/index") == before);
  // A crash while formatting (the formatting superblock) is formatted again at the next start.
  {
    disk::OpenOptions oo;
    oo.direct = false;
    auto f = disk::open_store(dir.store(), oo);
    REQUIRE(f);
    disk::Geometry g;
    g.region_size = opts.region_size;
    g.region_count = static_cast<std::uint32_t>(opts.capacity / opts.region_size);
    std::vector<std::byte> sb(4096);
    disk::encode_superblock(sb, g, disk::kFormattingMagic);
    REQUIRE(disk::pwrite_full(f->index(), sb.data(), sb.size(), 0, "index").is_ok());
  }
  auto again = open_disk(opts);
  REQUIRE(again);
  CHECK(again->stats().formatted);
}

TEST_CASE("a write past ulimit -f fails with NoSpace; the process lives on") {
  TempDir dir;
  auto opts = small_store(dir.store(), 8ull << 20, 1ull << 20);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child: SIGXFSZ at its default action (which kills), as in a program that never
    // touched it. The tier must set it aside; the exit code says what happened.
    std::signal(SIGXFSZ, SIG_DFL);
    rlimit lim{};
    ::getrlimit(RLIMIT_FSIZE, &lim);
    lim.rlim_cur = 2ull << 20;
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(10);
    // Formatting an 8 MiB store under a 2 MiB limit fails cleanly.
    auto refused = DiskBackend::open("disk", opts);
    if (refused || refused.status().code() != Code::kNoSpace) ::_exit(11);
    lim.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(10);
    std::signal(SIGXFSZ, SIG_DFL);
    auto b = DiskBackend::open("disk", opts);
    if (!b) ::_exit(12);
    lim.rlim_cur = 2ull << 20;
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(10);
    std::size_t no_space = 0;
    for (std::uint64_t i = 0; i < 40; ++i) {
      Completion c = put_image(**b, key_of(i), image_of(i, 100'000));
      if (c.status.code() == Code::kNoSpace) ++no_space;
    }
    if (no_space == 0 || (*b)->stats().no_space != no_space) ::_exit(13);
    ::_exit(0);
  }
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  CHECK_MESSAGE(WIFEXITED(st), "killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0));
  CHECK(WEXITSTATUS(st) == 0);
}

int main(int argc, char** argv) { return run_disk_tests(argc, argv); }
