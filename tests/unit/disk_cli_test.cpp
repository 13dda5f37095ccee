// `tierctl disk` on a real store: verify finds flipped bytes (exit 1, --json counts), repair drops
// them and rebuilds the index, and the tier then serves exactly the good objects.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>

#include "support/disk_support.hpp"
#include "support/shell.hpp"

using namespace tier;
using namespace tier::test;

namespace {

// Runs tierctl through the shell, after `shell_prefix` (e.g. "ulimit -v N;"); stderr is kept in
// the output when `with_stderr`.
Run tierctl(const std::string& args, const std::string& shell_prefix = "",
            bool with_stderr = false) {
  const char* exe = std::getenv("TIERCTL");
  REQUIRE(exe != nullptr);
  return run_shell(shell_prefix + " " + exe + " " + args +
                   (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

// Address space for a tierctl run: the sanitizers reserve terabytes of shadow memory, so their
// builds run without the limit (and still check the error).
std::string memory_limit() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return "";
#else
  return "ulimit -v 1048576;";  // 1 GiB
#endif
}

// A store of `n` objects in `dir`, closed.
disk::DiskOptions filled_store(const TempDir& dir, std::uint64_t n) {
  auto opts = small_store(dir.store(), 8ull << 20, 256ull << 10);  // 32 regions of 256 KiB
  auto b = open_disk(opts);
  REQUIRE(b);
  for (std::uint64_t i = 0; i < n; ++i)
    REQUIRE(put_image(*b, key_of(i), make_image(key_of(i), 10'000, i)).status.is_ok());
  return opts;
}

// Every one of the `n` objects reads back bit-exact from a tier opened over `opts`.
void check_all_readable(const disk::DiskOptions& opts, std::uint64_t n) {
  auto b = disk::DiskBackend::open("disk", opts);
  REQUIRE_MESSAGE(b, b.status().to_string());
  CHECK((*b)->usage().objects == n);
  for (std::uint64_t i = 0; i < n; ++i) {
    std::vector<std::byte> got;
    Completion c = get_image(**b, key_of(i), 16384, &got);
    REQUIRE_MESSAGE(c.status.is_ok(), i, ": ", c.status.to_string());
    CHECK(got == make_image(key_of(i), 10'000, i));
  }
}

// Rewrites the superblock of the store in `dir` with geometry `g` (a valid checksum: forged).
void forge_superblock(const std::string& dir, const disk::Geometry& g) {
  std::vector<std::byte> block(4096);
  disk::encode_superblock(block, g);
  FILE* f = std::fopen((dir + "/index").c_str(), "r+b");
  REQUIRE(f != nullptr);
  REQUIRE(std::fwrite(block.data(), 1, block.size(), f) == block.size());
  std::fclose(f);
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

TEST_CASE("a truncated index stops the tier with a clear error; repair restores every object") {
  for (std::uint64_t keep :
       {std::uint64_t{0}, std::uint64_t{4096 + 3 * 4096}, std::uint64_t{100'000}}) {
    CAPTURE(keep);
    TempDir dir;
    const std::uint64_t n = 150;  // 20 per 256 KiB region: 8 regions
    auto opts = filled_store(dir, n);
    REQUIRE(::truncate((dir.store() + "/index").c_str(), static_cast<off_t>(keep)) == 0);
    auto refused = disk::DiskBackend::open("disk", opts);
    REQUIRE_FALSE(refused);
    CHECK(refused.status().code() == Code::kBadState);
    CHECK(refused.status().message().find("tierctl disk repair") != std::string::npos);
    if (keep > 0) {
      Run verify = tierctl("disk verify " + dir.store() + " --json");
      CHECK(verify.rc == 1);
    }
    Run repair = tierctl("disk repair " + dir.store() + " --json");
    REQUIRE_MESSAGE(repair.rc == 0, repair.out);
    CHECK(json_of(repair)["objects_after"] == n);
    CHECK(json_of(repair)["bad_objects"] == 0);
    CHECK(tierctl("disk verify " + dir.store()).rc == 0);
    check_all_readable(opts, n);
  }
}

TEST_CASE("a store of an earlier version (no data trailer) is repaired given its geometry") {
  TempDir dir;
  auto opts = filled_store(dir, 30);
  // The data file as an earlier version left it, then the index lost.
  REQUIRE(::truncate((dir.store() + "/data").c_str(), static_cast<off_t>(8ull << 20)) == 0);
  REQUIRE(::truncate((dir.store() + "/index").c_str(), 0) == 0);
  Run refused = tierctl("disk repair " + dir.store(), "", true);
  CHECK(refused.rc == 1);
  CHECK(refused.out.find("--region-size") != std::string::npos);
  CHECK(std::filesystem::file_size(dir.store() + "/index") == 0);
  Run repair = tierctl("disk repair " + dir.store() + " --region-size 256KiB --json");
  REQUIRE_MESSAGE(repair.rc == 0, repair.out);
  CHECK(json_of(repair)["objects_after"] == 30);
  check_all_readable(opts, 30);
}

TEST_CASE("a forged superblock gives a clear error within bounded memory") {
  TempDir dir;
  auto opts = filled_store(dir, 10);
  disk::Geometry huge;
  huge.block_size = 512;
  huge.region_size = 4ull << 30;
  huge.region_count = 0xFFFFFFFFu;  // 16 EiB of data, a 2 EiB index: what the files cannot hold
  forge_superblock(dir.store(), huge);
  for (const char* cmd : {"inspect", "verify", "repair"}) {
    CAPTURE(cmd);
    Run r = tierctl(std::string("disk ") + cmd + " " + dir.store(), memory_limit(), true);
    CHECK_MESSAGE(r.rc == 1, r.out);  // an error exit, not a signal (-1) or a success
    CHECK_MESSAGE(r.out.find("forged or damaged") != std::string::npos, r.out);
  }
  // The tier itself compares the superblock with its configuration: another geometry is
  // formatted anew (the file is recognisably a store); nothing is sized from the forged values.
  auto b = disk::DiskBackend::open("disk", opts);
  REQUIRE_MESSAGE(b, b.status().to_string());
  CHECK((*b)->stats().formatted);
  CHECK((*b)->usage().capacity_bytes == opts.capacity);
}

TEST_CASE("a deleted index: the tier names repair, and repair rebuilds it from the data file") {
  TempDir dir;
  const std::uint64_t n = 40;
  auto opts = filled_store(dir, n);
  REQUIRE(::unlink((dir.store() + "/index").c_str()) == 0);
  auto refused = disk::DiskBackend::open("disk", opts);
  REQUIRE_FALSE(refused);
  CHECK(refused.status().message().find("tierctl disk repair") != std::string::npos);
  // Was: repair failed "not_found ... index" (it worked only after `touch index`).
  Run repair = tierctl("disk repair " + dir.store() + " --json");
  REQUIRE_MESSAGE(repair.rc == 0, repair.out);
  CHECK(json_of(repair)["objects_after"] == n);
  CHECK(tierctl("disk verify " + dir.store()).rc == 0);
  check_all_readable(opts, n);
}

TEST_CASE("a forged data trailer: repair is bounded by what the files hold") {
  TempDir dir;
  filled_store(dir, 10);
  // 2^20 regions of 16 blocks of 512 bytes: an 8 GiB data file (sparse: it costs the forger
  // nothing) and a 1.5 GiB index, by the trailer's word alone. Was: ~570 MB of memory and a
  // 1 GiB index written.
  disk::Geometry g;
  g.block_size = 512;
  g.region_size = 16 * 512;
  g.region_count = 1u << 20;
  const std::string data = dir.store() + "/data";
  REQUIRE(::truncate(data.c_str(), static_cast<off_t>(g.data_file_bytes())) == 0);
  std::vector<std::byte> trailer(512);
  disk::encode_superblock(trailer, g, disk::kTrailerMagic);
  {
    std::FILE* f = std::fopen(data.c_str(), "r+b");
    REQUIRE(f != nullptr);
    REQUIRE(std::fseek(f, static_cast<long>(g.data_file_bytes()), SEEK_SET) == 0);
    REQUIRE(std::fwrite(trailer.data(), 1, trailer.size(), f) == trailer.size());
    std::fclose(f);
  }
  REQUIRE(::unlink((dir.store() + "/index").c_str()) == 0);
  Run r = tierctl("disk repair " + dir.store(), memory_limit(), true);
  CHECK_MESSAGE((r.rc == 0 || r.rc == 1), r.out);  // an answer, within 1 GiB of address space
  struct stat st {};
  REQUIRE(::stat((dir.store() + "/index").c_str(), &st) == 0);
  CHECK(static_cast<std::uint64_t>(st.st_blocks) * 512 < (64ull << 20));  // written: < 64 MiB
}

TEST_CASE("tierctl disk format makes a store where the tier refused foreign files") {
  TempDir dir;
  REQUIRE(::mkdir(dir.store().c_str(), 0700) == 0);
  {
    std::FILE* f = std::fopen((dir.store() + "/index").c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs("not a store", f);
    std::fclose(f);
  }
  auto opts = small_store(dir.store());
  CHECK_FALSE(disk::DiskBackend::open("disk", opts));
  CHECK(tierctl("disk format " + dir.store()).rc == 2);  // which size? refused
  Run fmt = tierctl("disk format " + dir.store() + " --capacity 16MiB --region-size 1MiB --json");
  REQUIRE_MESSAGE(fmt.rc == 0, fmt.out);
  CHECK(json_of(fmt)["regions"] == 16);
  auto b = disk::DiskBackend::open("disk", opts);
  REQUIRE_MESSAGE(b, b.status().to_string());
  CHECK_FALSE((*b)->stats().formatted);
  REQUIRE(put_image(**b, key_of(1), make_image(key_of(1), 10'000, 1)).status.is_ok());
}

int main(int argc, char** argv) { return run_disk_tests(argc, argv); }
