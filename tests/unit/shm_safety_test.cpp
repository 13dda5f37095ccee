// The shm tier against local users and corrupt segments (issue 14, docs/shm.md "Who may open a
// segment" and "Corrupt segments"), on real segments in /dev/shm:
//  - segments are created 0600 whatever the umask, or with the segment_mode asked for; another
//    user's segment, a wider mode than asked, a symbolic link, a file that is not a libtier
//    segment and a bad magic or version are refused, and nothing refused is rewritten;
//  - each kind of corrupt field (offset, size, state, hash chain cycle, block chain cycle,
//    free-list cycles, list heads out of range) is written into a real segment: a fresh process
//    using it neither crashes nor hangs (it runs under alarm()), every hit it gets is bit-exact,
//    and the corruption shows as an error or a miss; `tierctl shm verify` names the field and
//    exits 1, then repairs, so the next verify exits 0.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "shm/format.hpp"
#include "shm/index.hpp"
#include "shm/store.hpp"
#include "support/shell.hpp"
#include "support/test_util.hpp"
#include "tier/registry.hpp"

using namespace tier;
using tier::cpu::ShmConfig;
using tier::cpu::ShmStore;
using tier::test::key_of;
using tier::test::make_image;
using tier::test::Run;
using tier::test::run_shell;

namespace {

constexpr std::uint64_t kNs = 11;
constexpr std::size_t kPayload = 10'000;  // three 4 KiB blocks per image
constexpr int kObjects = 8;

struct Segment {
  std::string name;
  Segment() {
    static int counter = 0;
    name = fmt::format("libtier-safety-{}-{}", ::getpid(), counter++);
  }
  ~Segment() {
    ShmStore::remove_segment(name).ignore();
    ::unlink(path().c_str());
  }
  std::string path() const { return "/dev/shm/" + name; }
};

ShmConfig config(const std::string& name) {
  ShmConfig cfg;
  cfg.segment = name;
  cfg.capacity = 256 * 1024;  // 64 blocks of 4 KiB, 64 entries
  cfg.block_bytes = 4096;
  return cfg;
}

std::vector<std::byte> image(std::uint64_t n) { return make_image(key_of(n, kNs), kPayload, n); }

// A segment holding objects 0..kObjects-1.
void fill(const std::string& name) {
  auto store = ShmStore::open(config(name));
  REQUIRE_MESSAGE(store.is_ok(), store.status().to_string());
  for (std::uint64_t n = 0; n < kObjects; ++n)
    REQUIRE((*store)->put(key_of(n, kNs), image(n), [](const ObjectKey&, std::uint64_t) {}));
}

Run tierctl(const std::string& args) {
  const char* exe = std::getenv("TIERCTL");
  REQUIRE(exe != nullptr);
  return run_shell(std::string(exe) + " " + args + " 2>&1");
}

// A writable mapping of a segment's file and the tables in it, found the way an opener finds them.
struct Raw {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  cpu::shm::FaultLog log;
  cpu::shm::Tables t;

  explicit Raw(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    struct stat st {};
    REQUIRE(::fstat(fd, &st) == 0);
    bytes = static_cast<std::size_t>(st.st_size);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    REQUIRE(p != MAP_FAILED);
    base = static_cast<std::byte*>(p);
    for (std::size_t off = 4096; off < 65536; off += 4096)
      if (reinterpret_cast<cpu::shm::Header*>(base + off)->magic == cpu::shm::kMagic) {
        t = cpu::shm::Tables::bind(base + off, &log);
        return;
      }
    FAIL("no header");
  }
  ~Raw() { ::munmap(base, bytes); }

  std::uint32_t entry_of(const ObjectKey& k) const {
    for (std::uint32_t i = 0; i < t.max_entries; ++i)
      if (t.entries[i].state.load() == cpu::shm::kReady && t.entries[i].key == k) return i;
    FAIL("key not stored");
    return 0;
  }
};

// Runs `fn` in a child under a 20 s alarm; its exit code, or 128 + the signal that ended it.
int in_child(const std::function<int()>& fn) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(20);
    ::_exit(fn());
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("shm: a segment is created 0600 whatever the umask, or with the segment_mode asked for") {
  Segment a, b;
  const mode_t old = ::umask(0);
  { REQUIRE(ShmStore::open(config(a.name)).is_ok()); }
  ShmConfig shared = config(b.name);
  shared.mode = 0660;
  { REQUIRE(ShmStore::open(shared).is_ok()); }
  ::umask(old);
  struct stat st {};
  REQUIRE(::stat(a.path().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(st.st_uid == ::geteuid());
  REQUIRE(::stat(b.path().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0660);
  // The option reaches the segment through the backend's schema.
  Segment c;
  auto be = Registry::global().create_backend(
      "cpu", BackendContext{"cpu", 256 * 1024,
                            Json{{"mode", "shm"}, {"segment", c.name}, {"segment_mode", "0666"}}});
  REQUIRE_MESSAGE(be.is_ok(), be.status().to_string());
  REQUIRE(::stat(c.path().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0666);
  auto bad = Registry::global().create_backend(
      "cpu", BackendContext{"cpu", 256 * 1024,
                            Json{{"mode", "shm"}, {"segment", c.name}, {"segment_mode", "0644"}}});
  CHECK_FALSE(bad.is_ok());
}

TEST_CASE("shm: a segment with wider bits than asked is refused") {
  Segment s;
  fill(s.name);
  REQUIRE(::chmod(s.path().c_str(), 0644) == 0);
  auto store = ShmStore::open(config(s.name));
  REQUIRE_FALSE(store.is_ok());
  CHECK(std::string(store.status().message()).find("mode 0644, wider than") != std::string::npos);
}

TEST_CASE("shm: another user cannot open a private segment, and is told whose it is") {
  if (::geteuid() != 0) {
    MESSAGE("not root: cannot become another user here");
    return;
  }
  Segment s;
  fill(s.name);
  int rc = in_child([&] {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) return 5;
    auto store = ShmStore::open(config(s.name));
    if (store.is_ok()) return 1;
    std::fprintf(stderr, "%s\n", store.status().to_string().c_str());
    return std::string(store.status().message()).find("is owned by uid 0 with mode 0600") !=
                   std::string::npos
               ? 0
               : 2;
  });
  CHECK(rc == 0);
}

TEST_CASE("shm: another user's segment is refused unless both sides share it deliberately") {
  Segment s;
  fill(s.name);
  if (::chown(s.path().c_str(), 65534, 65534) != 0) {
    MESSAGE("chown refused (not root): the foreign-owner case is not exercised");
    return;
  }
  auto store = ShmStore::open(config(s.name));
  REQUIRE_FALSE(store.is_ok());
  CHECK(store.status().code() == Code::kInvalidArgument);
  CHECK(std::string(store.status().message()).find("owned by uid 65534") != std::string::npos);
  auto attached = ShmStore::attach(s.name);  // tierctl's way in is refused too
  CHECK_FALSE(attached.is_ok());
  // Deliberate sharing: the segment's bits are the segment_mode this tier asks for.
  ShmConfig shared = config(s.name);
  shared.mode = 0660;
  CHECK_FALSE(ShmStore::open(shared).is_ok());  // still 0600: its owner did not opt in
  REQUIRE(::chmod(s.path().c_str(), 0660) == 0);
  auto ok = ShmStore::open(shared);
  CHECK_MESSAGE(ok.is_ok(), ok.status().to_string());
}

TEST_CASE(
    "shm: a symbolic link, a foreign file and a bad magic or version are refused, untouched") {
  Segment link, junk, empty, magic, version;
  // A symbolic link planted under the segment's name.
  Segment target;
  fill(target.name);
  REQUIRE(::symlink(target.path().c_str(), link.path().c_str()) == 0);
  auto r = ShmStore::open(config(link.name));
  REQUIRE_FALSE(r.is_ok());
  CHECK(std::string(r.status().message()).find("symbolic link") != std::string::npos);
  // A file of another program (zeros, which would make Boost wait for ever) and an empty one.
  {
    int fd = ::open(junk.path().c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, 1 << 20) == 0);
    ::close(fd);
    fd = ::open(empty.path().c_str(), O_CREAT | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  for (const Segment* s : {&junk, &empty}) {
    int rc = in_child([&] { return ShmStore::open(config(s->name)).is_ok() ? 1 : 0; });
    CHECK(rc == 0);
    Run v = tierctl("shm verify " + s->name);
    CHECK(v.rc == 1);
    CHECK(v.out.find("not a usable libtier cpu segment") != std::string::npos);
  }
  struct stat st {};
  REQUIRE(::stat(empty.path().c_str(), &st) == 0);
  CHECK(st.st_size == 0);  // not reinitialized
  // Bad magic, bad version: refused by openers and by tierctl, and left as they are.
  fill(magic.name);
  fill(version.name);
  { Raw(magic.path()).t.h->magic = 0x1234; }
  { Raw(version.path()).t.h->version = 99; }
  auto m = ShmStore::open(config(magic.name));
  REQUIRE_FALSE(m.is_ok());
  CHECK(std::string(m.status().message()).find("no libtier header") != std::string::npos);
  auto v = ShmStore::open(config(version.name));
  REQUIRE_FALSE(v.is_ok());
  CHECK(std::string(v.status().message()).find("version 99") != std::string::npos);
  Run tv = tierctl("shm verify " + version.name);
  CHECK(tv.rc == 1);
  CHECK(tv.out.find("version 99") != std::string::npos);
  CHECK(Raw(version.path()).t.h->version == 99);
}

namespace {

// One kind of corrupt field: how to write it, and what `tierctl shm verify` must say.
struct Corruption {
  const char* name;
  std::function<void(Raw&)> write;
  std::function<std::string(Raw&)> expect;  // a substring of verify's output
  // An extra operation that must reach the field (besides getting every object), run in the
  // child; returns false when it went wrong (a wrong read).
  std::function<void(ShmStore&)> poke = [](ShmStore&) {};
};

std::uint32_t target(Raw& r) { return r.entry_of(key_of(3, kNs)); }

// A key that is not stored and hashes to the bucket of stored object 3.
ObjectKey collider(Raw& r) {
  cpu::shm::Index index(r.t);
  const auto b = index.bucket_of(key_of(3, kNs));
  for (std::uint64_t n = 1000;; ++n)
    if (index.bucket_of(key_of(n, kNs)) == b) return key_of(n, kNs);
}

// More than the free blocks hold: runs the free lists to their ends.
void put_some(ShmStore& s) {
  for (std::uint64_t n = 100; n < 116; ++n)
    s.put(key_of(n, kNs), image(n), [](const ObjectKey&, std::uint64_t) {}).ignore();
}

std::vector<Corruption> corruptions() {
  using cpu::shm::kNone;
  return {
      {"first_block out of range",
       [](Raw& r) {
         r.t.entries[target(r)].first_block = static_cast<std::uint32_t>(r.t.blocks + 7);
       },
       [](Raw& r) {
         return fmt::format("first_block = {}, expected < {}", r.t.blocks + 7, r.t.blocks);
       }},
      {"image_bytes out of range", [](Raw& r) { r.t.entries[target(r)].image_bytes = 1ull << 40; },
       [](Raw&) { return std::string("image_bytes = 1099511627776, expected"); }},
      {"nblocks out of range", [](Raw& r) { r.t.entries[target(r)].nblocks = 0xFFFF0000u; },
       [](Raw&) { return std::string("nblocks = 4294901760, expected [1, 64]"); }},
      {"state out of range", [](Raw& r) { r.t.entries[target(r)].state.store(77); },
       [](Raw& r) { return fmt::format("entry {} state = 77", target(r)); }},
      {"hash chain cycle",
       [](Raw& r) {
         const std::uint32_t i = target(r);
         r.t.entries[i].hash_next = i;
       },
       [](Raw& r) { return fmt::format("reaches entry {} a second time", target(r)); },
       [](ShmStore& s) {
         // Looking up another key of the bucket walks into the cycle.
         std::vector<std::byte> buf(16384);
         Raw r("/dev/shm/" + s.stats().segment);
         (void)s.get(collider(r), buf);
       }},
      {"hash bucket head out of range",
       [](Raw& r) {
         cpu::shm::Index index(r.t);
         r.t.buckets[index.bucket_of(key_of(3, kNs))] = 0x7FFFFFF0u;
       },
       [](Raw& r) {
         cpu::shm::Index index(r.t);
         return fmt::format("bucket {} head = 2147483632", index.bucket_of(key_of(3, kNs)));
       }},
      {"block chain cycle",
       [](Raw& r) {
         const auto& e = r.t.entries[target(r)];
         r.t.next[r.t.next[e.first_block]] = e.first_block;  // the third link back to the first
       },
       [](Raw& r) {
         return fmt::format(
             "entry {} (ready) block chain: block {} (3 of 3) is also in the chain "
             "of entry {} (a cycle)",
             target(r), r.t.entries[target(r)].first_block, target(r));
       }},
      {"free block list cycle",
       [](Raw& r) { r.t.next[r.t.h->free_block_head] = r.t.h->free_block_head; },
       [](Raw& r) {
         return fmt::format("free block list reaches block {} a second time (a cycle)",
                            r.t.h->free_block_head);
       },
       put_some},
      {"free block list link out of range", [](Raw& r) { r.t.next[r.t.h->free_block_head] = 5000; },
       [](Raw& r) {
         return fmt::format("free block {} next = 5000, expected < 64", r.t.h->free_block_head);
       },
       put_some},
      {"free entry list cycle",
       [](Raw& r) {
         const std::uint32_t f = r.t.h->free_entry_head;
         r.t.entries[f].hash_next = f;
       },
       [](Raw& r) {
         return fmt::format("free entry list reaches entry {} a second time (a cycle)",
                            r.t.h->free_entry_head);
       },
       put_some},
      {"LRU head out of range", [](Raw& r) { r.t.h->lru_head = 4000000000u; },
       [](Raw&) { return std::string("header lru_head = 4000000000, expected < 64 or none"); }},
      {"LRU link out of range", [](Raw& r) { r.t.entries[target(r)].lru_prev = 123456; },
       [](Raw& r) { return fmt::format("entry {} lru_prev = 123456", target(r)); }},
      {"counter out of range", [](Raw& r) { r.t.h->free_blocks.store(1ull << 50); },
       [](Raw&) { return std::string("header free_blocks = 1125899906842624"); }, put_some},
  };
  (void)kNone;
}

// In a fresh process: every object is read (each hit must be bit-exact) and `poke` runs.
// Exit 0 when the corruption showed (an error or a miss), 2 when it went unnoticed, 3 on a wrong
// read, 4 when the segment could not be opened.
int use_corrupt_segment(const std::string& name, const Corruption& c) {
  auto store = ShmStore::open(config(name));
  if (!store) {
    std::fprintf(stderr, "%s\n", store.status().to_string().c_str());
    return 4;
  }
  std::uint64_t noticed = 0;
  std::vector<std::byte> buf(16384);
  for (int pass = 0; pass < 2; ++pass) {
    c.poke(**store);
    for (std::uint64_t n = 0; n < kObjects; ++n) {
      auto g = (*store)->get(key_of(n, kNs), buf);
      if (g.status.is_ok()) {
        auto want = image(n);
        if (g.bytes != want.size() || std::memcmp(buf.data(), want.data(), want.size()) != 0)
          return 3;
      } else {
        ++noticed;
      }
    }
    for (std::uint64_t n = 100; n < 116; ++n) {  // what poke may have stored
      auto g = (*store)->get(key_of(n, kNs), buf);
      if (g.status.is_ok()) {
        auto want = image(n);
        if (g.bytes != want.size() || std::memcmp(buf.data(), want.data(), want.size()) != 0)
          return 3;
      } else if (g.status.code() != Code::kNotFound) {
        ++noticed;
      }
    }
  }
  noticed += (*store)->stats().corruptions;
  return noticed > 0 ? 0 : 2;
}

}  // namespace

TEST_CASE(
    "shm: each kind of corrupt field is an error or a miss, never a crash, hang or wrong read") {
  for (const Corruption& c : corruptions()) {
    const std::string kind = c.name;
    CAPTURE(kind);
    Segment s;
    fill(s.name);
    {
      Raw r(s.path());
      c.write(r);
    }
    CHECK(in_child([&] { return use_corrupt_segment(s.name, c); }) == 0);
    // What the operations did not repair (a damaged chain that only the checksums caught), verify
    // does; then the segment is sound.
    Run v = tierctl("shm verify " + s.name);
    CHECK_MESSAGE((v.rc == 0 || v.rc == 1), v.out);
    v = tierctl("shm verify " + s.name);
    CHECK_MESSAGE(v.rc == 0, v.out);
  }
}

TEST_CASE("shm: tierctl shm verify names each corrupt field, exits 1, and repairs") {
  for (const Corruption& c : corruptions()) {
    const std::string kind = c.name;
    CAPTURE(kind);
    Segment s;
    fill(s.name);
    std::string expected;
    {
      Raw r(s.path());
      expected = c.expect(r);
      c.write(r);
    }
    Run v = tierctl("shm verify " + s.name);
    CHECK(v.rc == 1);
    CHECK_MESSAGE(v.out.find(expected) != std::string::npos,
                  fmt::format("expected \"{}\" in:\n{}", expected, v.out));
    Run again = tierctl("shm verify " + s.name);
    CHECK_MESSAGE(again.rc == 0, again.out);
    // The objects the repair kept are intact.
    auto store = ShmStore::attach(s.name);
    REQUIRE(store.is_ok());
    std::vector<std::byte> buf(16384);
    int kept = 0;
    for (std::uint64_t n = 0; n < kObjects; ++n) {
      auto g = (*store)->get(key_of(n, kNs), buf);
      if (!g.status.is_ok()) continue;
      ++kept;
      auto want = image(n);
      CHECK(std::memcmp(buf.data(), want.data(), want.size()) == 0);
    }
    CHECK(kept >= kObjects - 1);
  }
}

TEST_CASE("shm: a corrupt lock word is a TimedOut error, not a hang") {
  Segment s;
  fill(s.name);
  {  // The owner field of the robust mutex names a thread that does not exist.
    Raw r(s.path());
    *reinterpret_cast<volatile int*>(&r.t.h->mutex) = 0x3FFFFFF0;
  }
  int rc = in_child([&] {
    auto store = ShmStore::open(config(s.name));  // claiming a client slot takes the lock
    if (store.is_ok()) return 1;
    std::fprintf(stderr, "%s\n", store.status().to_string().c_str());
    return store.status().code() == Code::kTimedOut ? 0 : 2;
  });
  CHECK(rc == 0);
}

TEST_CASE("shm: a scribbled mutex kind is TimedOut at once, with the remove hint") {
  Segment s;
  fill(s.name);
  {  // pthread_mutex_t's __kind (x86-64 glibc: the int at byte 16) says no kind that exists.
    Raw r(s.path());
    reinterpret_cast<volatile int*>(&r.t.h->mutex)[4] = 0x7FFFFF7F;
  }
  int rc = in_child([&] {
    auto store = ShmStore::open(config(s.name));
    if (store.is_ok()) return 1;
    std::fprintf(stderr, "%s\n", store.status().to_string().c_str());
    const std::string msg(store.status().message());
    if (store.status().code() != Code::kTimedOut) return 2;
    return msg.find("tierctl shm remove " + s.name) != std::string::npos ? 0 : 3;
  });
  CHECK(rc == 0);
}

// Another process (here: this one, through a second descriptor; the kernel makes no difference)
// truncates a segment a store has mapped. Each access past the new end raised SIGBUS and killed
// every process using it; now the store's operations fail with IoError naming the truncation,
// and the process lives on (shm/guard.hpp).
TEST_CASE("shm: a segment truncated under a store is IoError, not SIGBUS") {
  for (const std::uint64_t keep : {std::uint64_t{0}, std::uint64_t{4096}}) {
    CAPTURE(keep);
    Segment s;
    fill(s.name);
    int rc = in_child([&] {
      auto store = ShmStore::open(config(s.name));
      if (!store.is_ok()) return 10;
      auto other = ShmStore::attach(s.name);  // a second mapping in the same process
      if (!other.is_ok()) return 11;
      std::vector<std::byte> buf(16384);
      if (!(*store)->get(key_of(0, kNs), buf).status.is_ok()) return 12;
      if (::truncate(s.path().c_str(), static_cast<off_t>(keep)) != 0) return 13;
      int failures = 0;
      for (std::uint64_t n = 0; n < kObjects; ++n) {
        auto g = (*store)->get(key_of(n, kNs), buf);
        if (g.status.is_ok()) return 14;  // nothing is served from a truncated segment
        failures += g.status.code() == Code::kIoError;
      }
      Status put =
          (*store)->put(key_of(100, kNs), image(100), [](const ObjectKey&, std::uint64_t) {});
      if (put.code() != Code::kIoError) return 15;
      if (std::string(put.message()).find("truncated") == std::string::npos) return 16;
      if ((*other)->contains(key_of(1, kNs)).status().code() != Code::kIoError) return 17;
      std::fprintf(stderr, "%s\n", put.to_string().c_str());
      return failures == kObjects ? 0 : 18;
    });
    CHECK(rc == 0);
    // The tools refuse the truncated file with a message, no signal.
    Run r = tierctl("shm inspect " + s.name);
    CHECK_MESSAGE(r.rc == 1, r.out);
  }
}

TEST_CASE("shm: inspect and verify show the leases that hold objects") {
  Segment s;
  fill(s.name);
  auto store = ShmStore::open(config(s.name));
  REQUIRE(store.is_ok());
  std::vector<ObjectKey> keys{key_of(1, kNs), key_of(2, kNs)};
  std::vector<std::uint8_t> held(2);
  std::uint64_t expired = 0;
  auto id = (*store)->lease(keys, std::chrono::minutes(30), held, expired);
  REQUIRE(id.is_ok());
  REQUIRE(held[0] == 1);
  Run r = tierctl("shm inspect " + s.name);
  CHECK_MESSAGE(r.out.find("leases      2 objects held against eviction") != std::string::npos,
                r.out);
  CHECK_MESSAGE(r.out.find(fmt::format("(pid {})", ::getpid())) != std::string::npos, r.out);
  r = tierctl("shm inspect " + s.name + " --json");
  CHECK_MESSAGE(r.out.find("\"longest_pid\": " + std::to_string(::getpid())) != std::string::npos,
                r.out);
  r = tierctl("shm verify " + s.name);
  CHECK_MESSAGE(r.out.find("leases      2 objects") != std::string::npos, r.out);
  (*store)->release(*id);
  r = tierctl("shm inspect " + s.name);
  CHECK_MESSAGE(r.out.find("leases      none") != std::string::npos, r.out);
}

TEST_CASE("shm: a header offset that does not match its geometry names the field") {
  Segment s;
  fill(s.name);
  std::uint64_t was = 0;
  {
    Raw r(s.path());
    was = r.t.h->entries_off;
    r.t.h->entries_off = was + 64;
  }
  Run v = tierctl("shm verify " + s.name);
  CHECK(v.rc == 1);
  CHECK_MESSAGE(
      v.out.find(fmt::format("entries_off = {}, expected {}", was + 64, was)) != std::string::npos,
      v.out);
}
