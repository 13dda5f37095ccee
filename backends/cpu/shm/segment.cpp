#include "shm/segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <boost/interprocess/managed_shared_memory.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <random>
#include <thread>
#include <utility>

#include "shm/blocks.hpp"
#include "shm/recovery.hpp"
#include "tier/options.hpp"

namespace tier::cpu::shm {

namespace bip = boost::interprocess;

namespace {

constexpr const char* kAnchorName = "libtier.cpu.shm.v1";
constexpr const char* kShmDir = "/dev/shm";
// The raw allocation starts on a page within this many bytes of the file's start (after Boost's
// own header); an opener looks for the header there.
constexpr std::uint64_t kHeaderSearch = 64 * 1024;

// The only named Boost object: where the raw allocation holding everything else starts (for
// Boost-aware tools; libtier finds the raw allocation by its header).
struct Anchor {
  std::uint64_t magic = 0;
  std::uint32_t version = 0;
  bip::managed_shared_memory::handle_t raw = 0;
  std::uint64_t raw_bytes = 0;
};

// Where each table of the raw allocation starts, for a geometry.
struct Geometry {
  std::uint64_t block_bytes, blocks, max_entries, buckets;
  std::uint64_t clients_off, buckets_off, entries_off, next_off, arena_off, raw_bytes;
};

std::uint64_t align_up(std::uint64_t n, std::uint64_t a) { return (n + a - 1) / a * a; }

Geometry layout(std::uint64_t block_bytes, std::uint64_t blocks, std::uint64_t max_entries) {
  Geometry g{};
  g.block_bytes = block_bytes;
  g.blocks = blocks;
  g.max_entries = max_entries;
  g.buckets = std::bit_ceil(std::max<std::uint64_t>(g.max_entries, 64));
  std::uint64_t off = align_up(sizeof(Header), 64);
  g.clients_off = off;
  off = align_up(off + kMaxClients * sizeof(Client), 64);
  g.buckets_off = off;
  off = align_up(off + g.buckets * sizeof(std::uint32_t), 64);
  g.entries_off = off;
  off = align_up(off + g.max_entries * sizeof(Entry), 64);
  g.next_off = off;
  off = align_up(off + g.blocks * sizeof(std::uint32_t), kArenaAlign);
  g.arena_off = off;
  g.raw_bytes = off + g.blocks * g.block_bytes;
  return g;
}

Geometry layout(const ShmConfig& cfg) {
  const std::uint64_t blocks = cfg.capacity / cfg.block_bytes;
  return layout(cfg.block_bytes, blocks, cfg.max_objects != 0 ? cfg.max_objects : blocks);
}

bool valid_block_bytes(std::uint64_t b) {
  return std::has_single_bit(b) && b >= 4096 && b <= (64u << 20);
}

// Writes the header, the robust mutex, empty client slots and entries, and an empty index into
// the raw allocation at `raw`.
void initialize(std::byte* raw, const Geometry& g, const std::string& name) {
  std::memset(raw, 0, g.arena_off);
  Header* h = new (raw) Header{};
  h->magic = kMagic;
  h->version = kVersion;
  h->block_bytes = g.block_bytes;
  h->blocks = g.blocks;
  h->max_entries = g.max_entries;
  h->buckets = g.buckets;
  h->clients_off = g.clients_off;
  h->buckets_off = g.buckets_off;
  h->entries_off = g.entries_off;
  h->next_off = g.next_off;
  h->arena_off = g.arena_off;
  h->raw_bytes = g.raw_bytes;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&h->mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  FaultLog faults;
  Tables t = Tables::bind(raw, &faults);
  for (std::uint32_t c = 0; c < kMaxClients; ++c) {
    new (&t.clients[c]) Client{};
    t.clients[c].pinned = kNone;
  }
  for (std::uint64_t i = 0; i < g.max_entries; ++i) new (&t.entries[i]) Entry{};
  Recovery(t, name).rebuild();  // an empty index: every list and counter derived from nothing
}

std::string shm_path(const std::string& name) { return std::string(kShmDir) + "/" + name; }

bool valid_segment_name(const std::string& name) {
  if (name.empty() || name.size() > 200 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

Status invalid_name(const std::string& name) {
  return Status::invalid(fmt::format("\"{}\" is not a valid segment name", name));
}

Status validate(const ShmConfig& cfg) {
  if (!valid_segment_name(cfg.segment))
    return Status::invalid(fmt::format(
        "segment: \"{}\" is not a valid name (1-200 of [A-Za-z0-9._-], not starting with '.')",
        cfg.segment));
  if (!valid_block_bytes(cfg.block_bytes))
    return Status::invalid(fmt::format(
        "block_size: expected a power of two in [4KiB, 64MiB], got {}", cfg.block_bytes));
  if (cfg.capacity < cfg.block_bytes)
    return Status::invalid(
        fmt::format("capacity {} is smaller than one block ({})", cfg.capacity, cfg.block_bytes));
  if (cfg.capacity / cfg.block_bytes >= kNone || cfg.max_objects >= kNone)
    return Status::invalid("too many blocks or objects for one segment (at most 2^32 - 2)");
  if (cfg.mode != 0600 && cfg.mode != 0660 && cfg.mode != 0666)
    return Status::invalid(
        fmt::format("segment_mode: expected 0600, 0660 or 0666, got {:04o}", cfg.mode));
  return Status::ok();
}

Status from_exception(const std::string& name, const std::exception& e) {
  return Status::io_error(fmt::format("shm segment {}: {}", name, e.what()));
}

Status not_ours(const std::string& name, const std::string& why) {
  return Status::invalid(fmt::format(
      "shm segment {} is not a usable libtier cpu segment of version {}: {}; refusing to use or "
      "reinitialize it (remove it with `tierctl shm remove {}` if it is yours to discard)",
      name, kVersion, why, name));
}

// The error for a segment of `bytes` that /dev/shm cannot hold.
Status no_room(const std::string& name, std::uint64_t bytes, const std::string& why) {
  struct statvfs vfs {};
  std::string room;
  if (::statvfs(kShmDir, &vfs) == 0)
    room = fmt::format(" ({} of {} free)", format_size(std::uint64_t{vfs.f_bavail} * vfs.f_frsize),
                       format_size(std::uint64_t{vfs.f_blocks} * vfs.f_frsize));
  return Status(Code::kNoSpace,
                fmt::format("shm segment {} needs {} in {}{}: {}; give {} more room (docker: "
                            "--shm-size) or the tier a smaller capacity",
                            name, format_size(bytes), kShmDir, room, why, kShmDir));
}

// Removes "<name>.init.<pid>.*" leftovers of creators that died (all of them when `all`).
void remove_init_leftovers(const std::string& name, bool all) {
  DIR* d = ::opendir(kShmDir);
  if (d == nullptr) return;
  const std::string prefix = name + ".init.";
  while (dirent* e = ::readdir(d)) {
    std::string f = e->d_name;
    if (f.compare(0, prefix.size(), prefix) != 0) continue;
    auto pid = static_cast<std::int32_t>(std::strtol(f.c_str() + prefix.size(), nullptr, 10));
    if (all || pid == 0 || (::kill(pid, 0) != 0 && errno == ESRCH))
      bip::shared_memory_object::remove(f.c_str());
  }
  ::closedir(d);
}

// Checks the header at `off` of a mapping of `file_bytes`: magic, version, a geometry libtier
// could have made, and every table inside the file.
Status check_header(const std::string& name, const std::byte* base, std::uint64_t file_bytes,
                    std::uint64_t off) {
  const Header& h = *reinterpret_cast<const Header*>(base + off);
  if (h.version != kVersion)
    return not_ours(name, fmt::format("its header has version {}", h.version));
  if (!valid_block_bytes(h.block_bytes))
    return not_ours(name, fmt::format("header block_bytes = {}, expected a power of two in "
                                      "[4096, 67108864]",
                                      h.block_bytes));
  if (h.blocks == 0 || h.blocks >= kNone)
    return not_ours(name, fmt::format("header blocks = {}, expected [1, {}]", h.blocks, kNone - 1));
  if (h.max_entries == 0 || h.max_entries >= kNone)
    return not_ours(
        name, fmt::format("header max_entries = {}, expected [1, {}]", h.max_entries, kNone - 1));
  const Geometry g = layout(h.block_bytes, h.blocks, h.max_entries);
  // Each field that differs, with the value found and the one its geometry gives.
  std::string wrong;
  auto same = [&](const char* field, std::uint64_t found, std::uint64_t expected) {
    if (found != expected)
      wrong +=
          fmt::format("{}{} = {}, expected {}", wrong.empty() ? "" : "; ", field, found, expected);
  };
  same("buckets", h.buckets, g.buckets);
  same("clients_off", h.clients_off, g.clients_off);
  same("buckets_off", h.buckets_off, g.buckets_off);
  same("entries_off", h.entries_off, g.entries_off);
  same("next_off", h.next_off, g.next_off);
  same("arena_off", h.arena_off, g.arena_off);
  same("raw_bytes", h.raw_bytes, g.raw_bytes);
  if (!wrong.empty())
    return not_ours(name, fmt::format("its header does not match its geometry ({} blocks of {}, "
                                      "{} entries): {}",
                                      h.blocks, h.block_bytes, h.max_entries, wrong));
  if (g.raw_bytes > file_bytes - off)
    return not_ours(name, fmt::format("its tables end at byte {}, past the end of the file ({})",
                                      off + g.raw_bytes, file_bytes));
  return Status::ok();
}

// The lock that lets one process at a time create a segment (docs/shm.md "Publication by
// rename"): flock() on /dev/shm/.NAME.lock, a name no segment can have (segment names do not
// start with '.'). The kernel drops the lock when its holder dies, so a dead creator blocks
// nobody. The holder removes the file before it unlocks, so a locker checks that the file it
// locked is still the one the name points to. Waiters never reserve memory.
class CreationLock {
 public:
  explicit CreationLock(const std::string& name)
      : name_(name), path_(fmt::format("{}/.{}.lock", kShmDir, name)) {}
  ~CreationLock() { release(); }
  CreationLock(const CreationLock&) = delete;
  CreationLock& operator=(const CreationLock&) = delete;

  const std::string& path() const noexcept { return path_; }

  // Takes the lock when no process holds it; creates the file with `mode` (as the segment's).
  // Returns: true (held), false (another process holds it, or the file is another user's and
  // cannot be opened: wait for the segment), IoError.
  Result<bool> try_take(std::uint32_t mode) {
    for (int attempt = 0; attempt < 8; ++attempt) {
      // O_NONBLOCK: a FIFO planted under the name must not block the open.
      int fd =
          ::open(path_.c_str(), O_RDONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode);
      if (fd < 0) {
        const int err = errno;
        struct stat st {};
        // Another user's lock (protected_regular refuses O_CREAT on it): wait for the segment.
        if ((err == EACCES || err == EPERM) && ::lstat(path_.c_str(), &st) == 0) return false;
        return Status::io_error(fmt::format("shm segment {}: its creation lock {}: {}", name_,
                                            path_, std::strerror(err)));
      }
      struct stat st {};
      if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return Status::invalid(fmt::format(
            "shm segment {}: its creation lock {} is not a regular file; remove it", name_, path_));
      }
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        ::close(fd);
        if (err == EWOULDBLOCK) return false;
        return Status::io_error(fmt::format("shm segment {}: flock of its creation lock {}: {}",
                                            name_, path_, std::strerror(err)));
      }
      if (same_file(fd, path_)) {
        fd_ = fd;
        return true;
      }
      ::close(fd);  // its holder removed it meanwhile: lock the file the name points to now
    }
    return false;
  }

  // Removes the file and unlocks (nothing when not held).
  void release() noexcept {
    if (fd_ < 0) return;
    ::unlink(path_.c_str());
    ::close(std::exchange(fd_, -1));
  }

  // Removes the file of segment `name` unless a process holds it (tierctl shm remove).
  // Returns: whether no process holds it.
  static bool remove_unheld(const std::string& name) {
    CreationLock lock(name);
    int fd = ::open(lock.path_.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return true;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      if (same_file(fd, lock.path_)) {
        lock.fd_ = fd;
        lock.release();
        return true;
      }
    } else if (errno == EWOULDBLOCK) {
      ::close(fd);
      return false;
    }
    ::close(fd);
    return true;
  }

 private:
  static bool same_file(int fd, const std::string& path) {
    struct stat a {};
    struct stat b {};
    return ::fstat(fd, &a) == 0 && ::lstat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
  }

  std::string name_;
  std::string path_;
  int fd_ = -1;
};

// How long open() waits for another process that creates the segment: its reservation
// (fallocate: about 0.4 s per GiB measured here) and initialization, with a wide margin.
std::chrono::milliseconds creation_patience(const ShmConfig& cfg) {
  if (cfg.creation_wait.count() > 0) return cfg.creation_wait;
  return std::chrono::seconds(30) + std::chrono::seconds(2) * (cfg.capacity >> 30);
}

// " (pid P)" naming the processes whose creation files ("<name>.init.<pid>.*") exist; for
// messages only.
std::string creator_pids(const std::string& name) {
  std::string pids;
  DIR* d = ::opendir(kShmDir);
  if (d == nullptr) return pids;
  const std::string prefix = name + ".init.";
  while (dirent* e = ::readdir(d)) {
    std::string f = e->d_name;
    if (f.compare(0, prefix.size(), prefix) != 0) continue;
    pids += fmt::format("{}{}", pids.empty() ? "" : ", ",
                        std::strtol(f.c_str() + prefix.size(), nullptr, 10));
  }
  ::closedir(d);
  return pids.empty() ? pids : fmt::format(" (pid {})", pids);
}
}  // namespace

Segment::Segment(std::string name)
    : name_(std::move(name)), faults_(std::make_unique<FaultLog>()) {}

Segment::Segment(Segment&& o) noexcept
    : name_(std::move(o.name_)),
      faults_(std::move(o.faults_)),
      mapped_(std::move(o.mapped_)),
      mapped_chunks_(o.mapped_chunks_),
      base_(std::exchange(o.base_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      guard_(std::move(o.guard_)),
      t_(o.t_),
      mapper_(std::move(o.mapper_)) {}

Segment::~Segment() {
  if (mapper_.joinable()) {  // it maps pages of the mapping removed below
    mapper_.request_stop();
    mapper_.join();
  }
  guard_.reset();
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

Status Segment::intact() const {
  if (!guard_.lost()) return Status::ok();
  struct stat st {};
  const std::string now = ::stat(shm_path(name_).c_str(), &st) == 0
                              ? fmt::format("{} bytes", st.st_size)
                              : std::string("gone");
  return Status::io_error(fmt::format(
      "shm segment {} was truncated by another process (mapped {} bytes, the file is now {}): "
      "this process no longer uses it; remove it with `tierctl shm remove {}` and restart the "
      "tier",
      name_, bytes_, now, name_));
}

Result<Segment> Segment::open(const ShmConfig& cfg) {
  TIER_RETURN_IF_ERROR(validate(cfg));
  Segment s(cfg.segment);
  CreationLock lock(cfg.segment);
  const auto patience = creation_patience(cfg);
  const auto deadline = std::chrono::steady_clock::now() + patience;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    Status st = s.map_existing(&cfg);
    if (st.code() == Code::kNotFound) {
      // Nobody has published it: create it, unless another process is creating it now.
      TIER_ASSIGN_OR_RETURN(bool mine, lock.try_take(cfg.mode));
      if (mine) {
        st = s.map_existing(&cfg);  // published while this process took the lock?
        if (st.code() == Code::kNotFound) {
          // false: a process that takes no lock (an earlier libtier) published it first.
          TIER_ASSIGN_OR_RETURN(bool created, s.create(cfg));
          (void)created;
          st = s.map_existing(&cfg);
        }
        lock.release();
      }
    }
    if (st.code() != Code::kNotFound) {
      TIER_RETURN_IF_ERROR(st);
      TIER_RETURN_IF_ERROR(s.check_geometry(cfg));
      if (cfg.prefault != ShmPrefault::kOff) s.prefault(cfg.prefault == ShmPrefault::kBackground);
      return s;
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return Status(
          Code::kTimedOut,
          fmt::format("shm segment {}: another process{} has been creating it for more than "
                      "{:.1f} s (it holds {}): a stopped or stuck process; once none is "
                      "starting, `tierctl shm remove {}` clears what it left",
                      cfg.segment, creator_pids(cfg.segment),
                      std::chrono::duration<double>(patience).count(), lock.path(), cfg.segment));
    std::this_thread::sleep_for(pause);
    pause = std::min(2 * pause, std::chrono::milliseconds(50));
  }
}

Result<Segment> Segment::attach(const std::string& name) {
  if (!valid_segment_name(name)) return invalid_name(name);
  Segment s(name);
  TIER_RETURN_IF_ERROR(s.map_existing(nullptr));
  return s;
}

Status Segment::remove(const std::string& name) {
  if (!valid_segment_name(name)) return invalid_name(name);
  // While a process creates the segment, its creation file is left alone.
  remove_init_leftovers(name, CreationLock::remove_unheld(name));
  if (!bip::shared_memory_object::remove(name.c_str()))
    return Status::not_found(fmt::format("no shm segment named {}", name));
  return Status::ok();
}

Status Segment::map_existing(const ShmConfig* cfg) {
  const std::string path = shm_path(name_);
  int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return Status::not_found(fmt::format("no shm segment named {}", name_));
    if (err == ELOOP) return not_ours(name_, fmt::format("{} is a symbolic link", path));
    struct stat st {};
    if (err == EACCES && ::lstat(path.c_str(), &st) == 0 && st.st_uid != ::geteuid())
      return Status::invalid(fmt::format(
          "shm segment {} is owned by uid {} with mode {:04o}, and this process's user (uid {}) "
          "may not open it; choose another segment name, or have its owner share it on purpose "
          "(segment_mode)",
          name_, st.st_uid, st.st_mode & 0777, ::geteuid()));
    return Status::io_error(fmt::format("shm segment {}: {}", name_, std::strerror(err)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    return Status::io_error(fmt::format("shm segment {}: fstat: {}", name_, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return not_ours(name_, fmt::format("{} is not a regular file", path));
  const std::uint32_t bits = st.st_mode & 0777;
  if (st.st_uid != ::geteuid()) {
    // Another user's segment: its objects may be planted, ours would be readable. Only a segment
    // both sides deliberately share (the same non-private segment_mode) is opened.
    if (cfg == nullptr || cfg->mode == 0600 || bits != cfg->mode)
      return Status::invalid(fmt::format(
          "shm segment {} is owned by uid {}, not by this process's user (uid {}), with mode "
          "{:04o}: refusing to attach it (its objects could be planted, and ours read); to share a "
          "segment between users on purpose, give every tier the same segment_mode (0660 or "
          "0666)",
          name_, st.st_uid, ::geteuid(), bits));
  } else if (cfg != nullptr && (bits & ~cfg->mode) != 0) {
    return Status::invalid(fmt::format(
        "shm segment {} has mode {:04o}, wider than this tier's segment_mode {:04o}: refusing to "
        "keep objects there; remove it with `tierctl shm remove {}` or set segment_mode",
        name_, bits, cfg->mode, name_));
  }
  const auto file_bytes = static_cast<std::uint64_t>(st.st_size);
  if (file_bytes < kArenaAlign + sizeof(Header))
    return not_ours(name_, fmt::format("it is only {} bytes long", file_bytes));
  // A segment whose memory is not all reserved (made by another program, or shrunk tmpfs
  // accounting) is reserved now: a full /dev/shm is an error here, never a SIGBUS on a copy.
  if (static_cast<std::uint64_t>(st.st_blocks) * 512 < file_bytes) {
    if (int err = ::posix_fallocate(fd, 0, st.st_size); err != 0)
      return no_room(name_, file_bytes, std::string("fallocate: ") + std::strerror(err));
  }
  void* p = ::mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return Status::io_error(fmt::format("shm segment {}: mmap: {}", name_, std::strerror(errno)));
  base_ = static_cast<std::byte*>(p);
  bytes_ = file_bytes;
  guard_ = MappingGuard(base_, bytes_);
  for (std::uint64_t off = kArenaAlign; off < kHeaderSearch && off + sizeof(Header) <= file_bytes;
       off += kArenaAlign) {
    if (reinterpret_cast<const Header*>(base_ + off)->magic != kMagic) continue;
    TIER_RETURN_IF_ERROR(check_header(name_, base_, file_bytes, off));
    t_ = Tables::bind(base_ + off, faults_.get());
    mapped_chunks_ = (t_.blocks * t_.block_bytes + kMapChunk - 1) / kMapChunk;
    mapped_ = std::make_unique<std::atomic<std::uint8_t>[]>(mapped_chunks_);
    t_.mapped = mapped_.get();
    return Status::ok();
  }
  return not_ours(name_, fmt::format("no libtier header (magic {:#x}) in its first {} bytes",
                                     kMagic, kHeaderSearch));
}

Result<bool> Segment::create(const ShmConfig& cfg) {
  remove_init_leftovers(name_, false);
  const Geometry g = layout(cfg);
  const std::uint64_t seg_bytes = g.raw_bytes + kArenaAlign + (1u << 20);
  // Before Boost writes its first and last page: a /dev/shm too small is an error, not a SIGBUS.
  struct statvfs vfs {};
  if (::statvfs(kShmDir, &vfs) == 0 && std::uint64_t{vfs.f_bavail} * vfs.f_frsize < seg_bytes)
    return no_room(name_, seg_bytes, "not that much is free");
  std::random_device rd;
  const std::string tmp = fmt::format("{}.init.{}.{:x}", name_, ::getpid(), rd());
  struct Cleanup {
    const std::string& tmp;
    bool armed = true;
    ~Cleanup() {
      if (armed) bip::shared_memory_object::remove(tmp.c_str());
    }
  } cleanup{tmp};
  try {
    bip::permissions owner_only;
    owner_only.set_permissions(0600);
    bip::managed_shared_memory fresh(bip::create_only, tmp.c_str(), seg_bytes, nullptr, owner_only);
    // Our own descriptor of the file Boost created: its mode, and its memory reserved now.
    int fd = ::open(shm_path(tmp).c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
      return Status::io_error(
          fmt::format("shm segment {}: reopening {}: {}", name_, tmp, std::strerror(errno)));
    int err = ::fchmod(fd, cfg.mode) != 0 ? errno : ::posix_fallocate(fd, 0, seg_bytes);
    ::close(fd);
    if (err == ENOSPC || err == ENOMEM)
      return no_room(name_, seg_bytes, std::string("fallocate: ") + std::strerror(err));
    if (err != 0)
      return Status::io_error(
          fmt::format("shm segment {}: preparing {}: {}", name_, tmp, std::strerror(err)));
    void* raw = fresh.allocate_aligned(g.raw_bytes, kArenaAlign, std::nothrow);
    if (raw == nullptr)
      return Status(Code::kNoSpace,
                    fmt::format("shm segment {}: cannot lay out {} bytes", name_, g.raw_bytes));
    Anchor* anchor = fresh.construct<Anchor>(kAnchorName)();
    anchor->magic = kMagic;
    anchor->version = kVersion;
    anchor->raw = fresh.get_handle_from_address(raw);
    anchor->raw_bytes = g.raw_bytes;
    initialize(static_cast<std::byte*>(raw), g, name_);
  } catch (const std::exception& e) {
    return from_exception(name_, e);
  }
  if (::renameat2(AT_FDCWD, shm_path(tmp).c_str(), AT_FDCWD, shm_path(name_).c_str(),
                  RENAME_NOREPLACE) != 0) {
    int err = errno;
    if (err == EEXIST) return false;
    return Status::io_error(
        fmt::format("shm segment {}: publishing failed: {}", name_, std::strerror(err)));
  }
  cleanup.armed = false;
  return true;
}

void Segment::prefault(bool background) {
  if (!background) {
    for (std::uint64_t c = 0; c < mapped_chunks_; ++c) map_chunk(t_, c);
    return;
  }
  mapper_ = std::jthread([t = t_, chunks = mapped_chunks_](std::stop_token stop) {
    ::pthread_setname_np(::pthread_self(), "tier-shm-map");
    // SCHED_IDLE: it runs on cores nothing else wants, never ahead of the process's own work.
    // Refused (a seccomp policy): it runs at normal priority.
    sched_param idle{};
    ::pthread_setschedparam(::pthread_self(), SCHED_IDLE, &idle);
    // Without MADV_POPULATE_READ (or on a truncated segment) it stops: first uses map the rest.
    for (std::uint64_t c = 0; c < chunks && !stop.stop_requested(); ++c)
      if (!map_chunk(t, c, /*populate_only=*/true)) return;
  });
}

Status Segment::check_geometry(const ShmConfig& cfg) const {
  Geometry g = layout(cfg);
  if (g.block_bytes == t_.block_bytes && g.blocks == t_.blocks && g.max_entries == t_.max_entries)
    return Status::ok();
  return Status::invalid(fmt::format(
      "shm segment {} exists with capacity {} in blocks of {} and {} entries, but this tier "
      "asks for capacity {} in blocks of {} and {} entries; use the same settings or remove "
      "the segment with `tierctl shm remove {}`",
      name_, t_.blocks * t_.block_bytes, t_.block_bytes, t_.max_entries, g.blocks * g.block_bytes,
      g.block_bytes, g.max_entries, name_));
}

ShmStats Segment::stats() const noexcept {
  const Header& h = *t_.h;
  ShmStats s;
  s.segment = name_;
  s.capacity_bytes = t_.blocks * t_.block_bytes;
  s.block_bytes = t_.block_bytes;
  s.max_objects = t_.max_entries;
  s.used_bytes = h.used_bytes.load(std::memory_order_relaxed);
  s.image_bytes = h.image_bytes.load(std::memory_order_relaxed);
  s.objects = h.objects.load(std::memory_order_relaxed);
  s.writing = h.writing.load(std::memory_order_relaxed);
  s.doomed = h.doomed.load(std::memory_order_relaxed);
  s.clients = h.clients.load(std::memory_order_relaxed);
  s.recoveries = h.recoveries.load(std::memory_order_relaxed);
  s.reaped_clients = h.reaped_clients.load(std::memory_order_relaxed);
  s.corruptions = h.corruptions.load(std::memory_order_relaxed);
  s.segment_bytes = bytes_;
  return s;
}

}  // namespace tier::cpu::shm
