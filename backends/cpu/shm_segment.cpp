#include "shm_segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <new>
#include <random>

#include "shm_recovery.hpp"

namespace tier::cpu::shm {

namespace bip = boost::interprocess;

namespace {

constexpr const char* kAnchorName = "libtier.cpu.shm.v1";

// The only named Boost object: where the raw allocation holding everything else starts.
struct Anchor {
  std::uint64_t magic = 0;
  std::uint32_t version = 0;
  bip::managed_shared_memory::handle_t raw = 0;
  std::uint64_t raw_bytes = 0;
};

// Where each table of the raw allocation starts, for a configuration.
struct Geometry {
  std::uint64_t block_bytes, blocks, max_entries, buckets;
  std::uint64_t clients_off, buckets_off, entries_off, next_off, arena_off, raw_bytes;
};

std::uint64_t align_up(std::uint64_t n, std::uint64_t a) { return (n + a - 1) / a * a; }

Geometry layout(const ShmConfig& cfg) {
  Geometry g{};
  g.block_bytes = cfg.block_bytes;
  g.blocks = cfg.capacity / cfg.block_bytes;
  g.max_entries = cfg.max_objects != 0 ? cfg.max_objects : g.blocks;
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

// Writes the header, the robust mutex, empty client slots and entries, and an empty index into
// the raw allocation at `raw`.
Tables initialize(std::byte* raw, const Geometry& g, const std::string& name) {
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
  Tables t = Tables::bind(raw);
  for (std::uint32_t c = 0; c < kMaxClients; ++c) {
    new (&t.clients[c]) Client{};
    t.clients[c].pinned = kNone;
  }
  for (std::uint64_t i = 0; i < g.max_entries; ++i) new (&t.entries[i]) Entry{};
  Recovery(t, name).rebuild();  // an empty index: every list and counter derived from nothing
  return t;
}

std::string shm_path(const std::string& name) { return "/dev/shm/" + name; }

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
  if (!std::has_single_bit(cfg.block_bytes) || cfg.block_bytes < 4096 ||
      cfg.block_bytes > (64u << 20))
    return Status::invalid(fmt::format(
        "block_size: expected a power of two in [4KiB, 64MiB], got {}", cfg.block_bytes));
  if (cfg.capacity < cfg.block_bytes)
    return Status::invalid(
        fmt::format("capacity {} is smaller than one block ({})", cfg.capacity, cfg.block_bytes));
  if (cfg.capacity / cfg.block_bytes >= kNone || cfg.max_objects >= kNone)
    return Status::invalid("too many blocks or objects for one segment (at most 2^32 - 2)");
  return Status::ok();
}

Status from_exception(const std::string& name, const std::exception& e) {
  return Status::io_error(fmt::format("shm segment {}: {}", name, e.what()));
}

// Removes "<name>.init.<pid>.*" leftovers of creators that died (all of them when `all`).
void remove_init_leftovers(const std::string& name, bool all) {
  DIR* d = ::opendir("/dev/shm");
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

}  // namespace

Result<Segment> Segment::open(const ShmConfig& cfg) {
  TIER_RETURN_IF_ERROR(validate(cfg));
  Segment s(cfg.segment);
  try {
    for (int attempt = 0; attempt < 4 && !s.seg_; ++attempt) {
      try {
        TIER_RETURN_IF_ERROR(s.map_existing());
        TIER_RETURN_IF_ERROR(s.check_geometry(cfg));
        if (cfg.prefault) s.prefault(false);  // map every page here too: no minor faults
      } catch (const bip::interprocess_exception& e) {
        if (e.get_error_code() != bip::not_found_error) throw;
        s.seg_.reset();
        TIER_ASSIGN_OR_RETURN(bool created, s.create(cfg));
        (void)created;  // lost the race: the next attempt opens the winner's segment
      }
    }
  } catch (const std::exception& e) {
    return from_exception(cfg.segment, e);
  }
  if (!s.seg_) return Status::io_error(fmt::format("shm segment {}: cannot open", cfg.segment));
  return s;
}

Result<Segment> Segment::attach(const std::string& name) {
  if (!valid_segment_name(name)) return invalid_name(name);
  Segment s(name);
  try {
    TIER_RETURN_IF_ERROR(s.map_existing());
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() == bip::not_found_error)
      return Status::not_found(fmt::format("no shm segment named {}", name));
    return from_exception(name, e);
  } catch (const std::exception& e) {
    return from_exception(name, e);
  }
  return s;
}

Status Segment::remove(const std::string& name) {
  if (!valid_segment_name(name)) return invalid_name(name);
  remove_init_leftovers(name, true);
  if (!bip::shared_memory_object::remove(name.c_str()))
    return Status::not_found(fmt::format("no shm segment named {}", name));
  return Status::ok();
}

Status Segment::map_existing() {
  seg_ = std::make_unique<bip::managed_shared_memory>(bip::open_only, name_.c_str());
  auto [anchor, n] = seg_->find_no_lock<Anchor>(kAnchorName);
  if (anchor == nullptr || n != 1 || anchor->magic != kMagic || anchor->version != kVersion)
    return Status::invalid(
        fmt::format("shm segment {} is not a libtier cpu segment of version {}; remove it with "
                    "`tierctl shm remove {}`",
                    name_, kVersion, name_));
  t_ = Tables::bind(static_cast<std::byte*>(seg_->get_address_from_handle(anchor->raw)));
  if (t_.h->magic != kMagic || t_.h->raw_bytes != anchor->raw_bytes)
    return Status::invalid(fmt::format("shm segment {} has a damaged header", name_));
  return Status::ok();
}

Result<bool> Segment::create(const ShmConfig& cfg) {
  remove_init_leftovers(name_, false);
  Geometry g = layout(cfg);
  std::random_device rd;
  std::string tmp = fmt::format("{}.init.{}.{:x}", name_, ::getpid(), rd());
  auto fresh = std::make_unique<bip::managed_shared_memory>(bip::create_only, tmp.c_str(),
                                                            g.raw_bytes + kArenaAlign + (1u << 20));
  void* raw = fresh->allocate_aligned(g.raw_bytes, kArenaAlign, std::nothrow);
  if (raw == nullptr) {
    bip::shared_memory_object::remove(tmp.c_str());
    return Status(Code::kNoSpace,
                  fmt::format("shm segment {}: cannot lay out {} bytes", name_, g.raw_bytes));
  }
  Anchor* anchor = fresh->construct<Anchor>(kAnchorName)();
  anchor->magic = kMagic;
  anchor->version = kVersion;
  anchor->raw = fresh->get_handle_from_address(raw);
  anchor->raw_bytes = g.raw_bytes;
  t_ = initialize(static_cast<std::byte*>(raw), g, name_);
  if (cfg.prefault) prefault(true);
  if (::renameat2(AT_FDCWD, shm_path(tmp).c_str(), AT_FDCWD, shm_path(name_).c_str(),
                  RENAME_NOREPLACE) != 0) {
    int err = errno;
    bip::shared_memory_object::remove(tmp.c_str());
    if (err == EEXIST) return false;
    return Status::io_error(
        fmt::format("shm segment {}: publishing failed: {}", name_, std::strerror(err)));
  }
  seg_ = std::move(fresh);
  return true;
}

// Without MADV_POPULATE_WRITE (Linux < 5.14) pages are touched one by one: written with zero in
// a fresh segment, only read in one that may hold objects.
void Segment::prefault(bool fresh) {
  std::uint64_t bytes = t_.h->blocks * t_.h->block_bytes;
  if (::madvise(t_.arena, bytes, 23 /* MADV_POPULATE_WRITE */) == 0) return;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  auto* p = reinterpret_cast<volatile std::byte*>(t_.arena);
  for (std::uint64_t off = 0; off < bytes; off += page) {
    if (fresh)
      p[off] = std::byte{0};
    else
      (void)p[off];
  }
}

Status Segment::check_geometry(const ShmConfig& cfg) const {
  Geometry g = layout(cfg);
  const Header& h = *t_.h;
  if (g.block_bytes == h.block_bytes && g.blocks == h.blocks && g.max_entries == h.max_entries)
    return Status::ok();
  return Status::invalid(fmt::format(
      "shm segment {} exists with capacity {} in blocks of {} and {} entries, but this tier "
      "asks for capacity {} in blocks of {} and {} entries; use the same settings or remove "
      "the segment with `tierctl shm remove {}`",
      name_, h.blocks * h.block_bytes, h.block_bytes, h.max_entries, g.blocks * g.block_bytes,
      g.block_bytes, g.max_entries, name_));
}

std::span<std::byte> Segment::mapping() const noexcept {
  return {static_cast<std::byte*>(seg_->get_address()), seg_->get_size()};
}

ShmStats Segment::stats() const noexcept {
  const Header& h = *t_.h;
  ShmStats s;
  s.segment = name_;
  s.capacity_bytes = h.blocks * h.block_bytes;
  s.block_bytes = h.block_bytes;
  s.max_objects = h.max_entries;
  s.used_bytes = h.used_bytes.load(std::memory_order_relaxed);
  s.image_bytes = h.image_bytes.load(std::memory_order_relaxed);
  s.objects = h.objects.load(std::memory_order_relaxed);
  s.writing = h.writing.load(std::memory_order_relaxed);
  s.doomed = h.doomed.load(std::memory_order_relaxed);
  s.clients = h.clients.load(std::memory_order_relaxed);
  s.recoveries = h.recoveries.load(std::memory_order_relaxed);
  s.reaped_clients = h.reaped_clients.load(std::memory_order_relaxed);
  s.segment_bytes = seg_ ? seg_->get_size() : 0;
  return s;
}

}  // namespace tier::cpu::shm
