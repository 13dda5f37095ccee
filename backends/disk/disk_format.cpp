#include "disk_format.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>

#include "tier/endian.hpp"

namespace tier::disk {
namespace {

std::uint64_t check_of(const std::byte* p, std::size_t n) noexcept { return XXH3_64bits(p, n); }

// Superblock and region header: fields in [0, 56), XXH3-64 of them at 56.
constexpr std::size_t kCheckAt = 56;
// Entry: fields in [0, 60), low 32 bits of XXH3-64 of them at 60.
constexpr std::size_t kEntryCheckAt = 60;

bool is_pow2(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

std::string Geometry::check() const {
  if (!is_pow2(block_size) || block_size < 512 || block_size > 65536)
    return fmt::format("block size {} is not a power of two in [512, 64KiB]", block_size);
  if (region_size % block_size != 0 || region_size / block_size < 16)
    return fmt::format("region size {} is not a multiple of at least 16 blocks of {}", region_size,
                       block_size);
  if (region_size > (4ull << 30))
    return fmt::format("region size {} is larger than 4GiB", region_size);
  if (region_count < 2)
    return fmt::format("the capacity holds {} region(s) of {}; at least 2 are needed", region_count,
                       region_size);
  return {};
}

void encode_superblock(std::span<std::byte> block, const Geometry& g,
                       std::uint32_t magic) noexcept {
  std::memset(block.data(), 0, block.size());
  std::byte* p = block.data();
  put_le<std::uint32_t>(p + 0, magic);
  put_le<std::uint32_t>(p + 4, kLayoutVersion);
  put_le<std::uint32_t>(p + 8, g.block_size);
  put_le<std::uint32_t>(p + 12, g.region_count);
  put_le<std::uint64_t>(p + 16, g.region_size);
  put_le<std::uint64_t>(p + kCheckAt, check_of(p, kCheckAt));
}

std::optional<Geometry> decode_superblock(std::span<const std::byte> block,
                                          std::uint32_t magic) noexcept {
  if (block.size() < kRecordBytes) return std::nullopt;
  const std::byte* p = block.data();
  if (get_le<std::uint32_t>(p) != magic || get_le<std::uint32_t>(p + 4) != kLayoutVersion)
    return std::nullopt;
  if (get_le<std::uint64_t>(p + kCheckAt) != check_of(p, kCheckAt)) return std::nullopt;
  Geometry g;
  g.block_size = get_le<std::uint32_t>(p + 8);
  g.region_count = get_le<std::uint32_t>(p + 12);
  g.region_size = get_le<std::uint64_t>(p + 16);
  if (!g.check().empty()) return std::nullopt;
  return g;
}

void encode_region_header(std::byte* p, const RegionHeader& h) noexcept {
  std::memset(p, 0, kRecordBytes);
  put_le<std::uint32_t>(p + 0, kRegionMagic);
  put_le<std::uint32_t>(p + 4, h.region);
  put_le<std::uint64_t>(p + 8, h.seq);
  put_le<std::uint64_t>(p + kCheckAt, check_of(p, kCheckAt));
}

std::optional<RegionHeader> decode_region_header(const std::byte* p) noexcept {
  if (get_le<std::uint32_t>(p) != kRegionMagic) return std::nullopt;
  if (get_le<std::uint64_t>(p + kCheckAt) != check_of(p, kCheckAt)) return std::nullopt;
  RegionHeader h;
  h.region = get_le<std::uint32_t>(p + 4);
  h.seq = get_le<std::uint64_t>(p + 8);
  if (h.seq == 0) return std::nullopt;
  return h;
}

void encode_entry(std::byte* p, const Entry& e) noexcept {
  put_le<std::uint32_t>(p + 0, kEntryMagic);
  put_le<std::uint32_t>(p + 4, e.image_bytes);
  put_le<std::uint64_t>(p + 8, e.seq);
  put_le<std::uint64_t>(p + 16, e.key.ns.lo);
  put_le<std::uint64_t>(p + 24, e.key.ns.hi);
  put_le<std::uint64_t>(p + 32, e.key.id.lo);
  put_le<std::uint64_t>(p + 40, e.key.id.hi);
  put_le<std::uint32_t>(p + 48, e.key.rank);
  put_le<std::uint32_t>(p + 52, e.offset_blocks);
  put_le<std::uint32_t>(p + 56, e.payload_check);
  put_le<std::uint32_t>(p + kEntryCheckAt, static_cast<std::uint32_t>(check_of(p, kEntryCheckAt)));
}

std::optional<Entry> decode_entry(const std::byte* p) noexcept {
  if (get_le<std::uint32_t>(p) != kEntryMagic) return std::nullopt;
  if (get_le<std::uint32_t>(p + kEntryCheckAt) !=
      static_cast<std::uint32_t>(check_of(p, kEntryCheckAt)))
    return std::nullopt;
  Entry e;
  e.image_bytes = get_le<std::uint32_t>(p + 4);
  e.seq = get_le<std::uint64_t>(p + 8);
  e.key.ns = Key128{get_le<std::uint64_t>(p + 16), get_le<std::uint64_t>(p + 24)};
  e.key.id = Key128{get_le<std::uint64_t>(p + 32), get_le<std::uint64_t>(p + 40)};
  e.key.rank = get_le<std::uint32_t>(p + 48);
  e.offset_blocks = get_le<std::uint32_t>(p + 52);
  e.payload_check = get_le<std::uint32_t>(p + 56);
  if (e.image_bytes == 0) return std::nullopt;
  return e;
}

bool record_is_zero(const std::byte* p) noexcept {
  for (std::size_t i = 0; i < kRecordBytes; ++i)
    if (p[i] != std::byte{0}) return false;
  return true;
}

Result<ScanResult> scan_index(int fd, const Geometry& g, std::uint64_t index_bytes,
                              std::uint64_t data_bytes,
                              const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  ScanResult out;
  // Whole directories present in the file; the rest are lost. Checked before allocating, so a
  // forged region count costs no more memory than the file's size justifies.
  const std::uint32_t present = static_cast<std::uint32_t>(std::min<std::uint64_t>(
      g.region_count,
      index_bytes < g.block_size ? 0 : (index_bytes - g.block_size) / g.dir_bytes()));
  if (present < g.region_count && data_bytes < g.data_file_bytes())
    return Status(Code::kBadState,
                  fmt::format("index: the geometry names {} regions of {} bytes, but the index "
                              "({} bytes) holds {} of their directories and the data file is {} "
                              "bytes, not {}: not this store's geometry (forged or damaged)",
                              g.region_count, g.region_size, index_bytes, present, data_bytes,
                              g.data_file_bytes()));
  out.regions.resize(g.region_count);
  for (std::uint32_t r = present; r < g.region_count; ++r) out.lost_regions.push_back(r);
  const std::uint64_t dir = g.dir_bytes();
  const std::uint32_t max_blocks = g.region_blocks();
  // Classifies `count` records of region r's directory starting at record `first` (record 0, the
  // header, comes first and decides whether the region is in use).
  std::optional<RegionHeader> header;
  auto classify = [&](std::uint32_t r, const std::byte* d, std::uint32_t first,
                      std::uint32_t count) {
    std::uint32_t s = first;
    if (first == 0) {
      header = decode_region_header(d);
      if (!header || header->region != r) {
        if (!record_is_zero(d)) out.corrupt_regions.push_back(r);
        header.reset();
        return;
      }
      out.regions[r] = ScannedRegion{true, header->seq};
      s = 1;
    }
    if (!header) return;
    for (; s < first + count; ++s) {
      const std::byte* p = d + std::size_t{s - first} * kRecordBytes;
      if (record_is_zero(p)) continue;
      auto entry = decode_entry(p);
      if (!entry) {
        out.corrupt_entries.push_back({r, s});
        continue;
      }
      const Entry& e = *entry;
      if (e.seq != header->seq) {
        // A leftover of an earlier generation, or (seq above the header's) damage.
        if (e.seq < header->seq)
          ++out.stale_entries;
        else
          out.corrupt_entries.push_back({r, s});
        continue;
      }
      if (e.offset_blocks >= max_blocks ||
          g.blocks_for(e.image_bytes) > max_blocks - e.offset_blocks ||
          g.data_offset(r, e.offset_blocks) + e.image_bytes > data_bytes) {
        out.corrupt_entries.push_back({r, s});
        continue;
      }
      out.entries.push_back({e, r, s});
    }
  };
  // Reads of at most 8 MiB: several directories at once, or one directory in pieces.
  constexpr std::uint64_t kRead = 8ull << 20;
  const std::uint64_t total = std::uint64_t{present} * dir;
  if (dir <= kRead) {
    const auto per_read = static_cast<std::uint32_t>(kRead / dir);
    AlignedBuffer buf(std::min<std::uint64_t>(per_read, std::max(present, 1u)) * dir, g.block_size);
    for (std::uint32_t first = 0; first < present; first += per_read) {
      const std::uint32_t n = std::min(per_read, present - first);
      TIER_RETURN_IF_ERROR(pread_full(fd, buf.data(), n * dir, g.dir_offset(first, 0), "index"));
      for (std::uint32_t k = 0; k < n; ++k)
        classify(first + k, buf.data() + k * dir, 0, g.dir_records());
      if (progress) progress(std::uint64_t{first + n} * dir, total);
    }
    return out;
  }
  AlignedBuffer buf(kRead, g.block_size);
  const std::uint64_t records_bytes = std::uint64_t{g.dir_records()} * kRecordBytes;
  for (std::uint32_t r = 0; r < present; ++r) {
    for (std::uint64_t off = 0; off < records_bytes; off += kRead) {
      const std::uint64_t n = std::min(kRead, dir - off);
      TIER_RETURN_IF_ERROR(pread_full(fd, buf.data(), n, g.dir_offset(r, 0) + off, "index"));
      const auto first = static_cast<std::uint32_t>(off / kRecordBytes);
      const auto count = static_cast<std::uint32_t>(
          std::min<std::uint64_t>(n, records_bytes - off) / kRecordBytes);
      classify(r, buf.data(), first, count);
    }
    if (progress) progress(std::uint64_t{r + 1} * dir, total);
  }
  return out;
}

Result<Geometry> read_superblock(int fd, std::uint32_t block_size_hint, bool* formatting) {
  if (formatting != nullptr) *formatting = false;
  // The superblock is the first block; read the largest block size a store may use so that the
  // read is aligned for any of them.
  constexpr std::size_t kMaxBlock = 65536;
  AlignedBuffer buf(kMaxBlock, kMaxBlock);
  ssize_t n;
  do {
    n = ::pread(fd, buf.data(), kMaxBlock, 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EINVAL && block_size_hint < kMaxBlock) {
    do {
      n = ::pread(fd, buf.data(), block_size_hint, 0);
    } while (n < 0 && errno == EINTR);
  }
  if (n < 0)
    return Status::io_error(fmt::format("index: read superblock: {}", std::strerror(errno)));
  if (static_cast<std::size_t>(n) < kRecordBytes) return Status::not_found("index: no superblock");
  auto block = buf.span().first(static_cast<std::size_t>(n));
  auto g = decode_superblock(block);
  if (!g) {
    if (formatting != nullptr) *formatting = decode_superblock(block, kFormattingMagic).has_value();
    return Status::not_found("index: no valid superblock");
  }
  return *g;
}

Result<Geometry> read_data_trailer(int fd, std::uint64_t data_bytes) {
  constexpr std::size_t kMaxBlock = 65536;
  AlignedBuffer buf(kMaxBlock, kMaxBlock);
  for (std::uint64_t bs = 512; bs <= kMaxBlock; bs *= 2) {
    if (data_bytes < 3 * bs || data_bytes % bs != 0) continue;
    ssize_t n;
    do {
      n = ::pread(fd, buf.data(), bs, static_cast<off_t>(data_bytes - bs));
    } while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EINVAL) continue;  // O_DIRECT: smaller than the device's block
    if (n < 0) return Status::io_error(fmt::format("data: read trailer: {}", std::strerror(errno)));
    if (static_cast<std::uint64_t>(n) != bs) continue;
    auto g = decode_superblock(buf.span().first(bs), kTrailerMagic);
    if (g && g->block_size == bs && g->data_file_bytes_with_trailer() == data_bytes) return *g;
  }
  return Status::not_found("data: no geometry trailer");
}

Status write_data_trailer(int fd, const Geometry& g) {
  AlignedBuffer b(g.block_size, g.block_size);
  encode_superblock(b.span(), g, kTrailerMagic);
  return pwrite_full(fd, b.data(), b.size(), g.data_file_bytes(), "data trailer");
}

Status check_file_sizes(const std::string& dir, const Geometry& g, std::uint64_t index_bytes,
                        std::uint64_t data_bytes) {
  if (index_bytes < g.index_file_bytes())
    return Status(Code::kBadState,
                  fmt::format("{}/{} is truncated: {} bytes, its superblock needs {}; `tierctl "
                              "disk repair {}` rebuilds it from the data file",
                              dir, kIndexFile, index_bytes, g.index_file_bytes(), dir));
  if (data_bytes < g.data_file_bytes())
    return Status(Code::kBadState,
                  fmt::format("{}/{} is truncated: {} bytes, the store's geometry needs {}; "
                              "`tierctl disk repair {}` keeps the objects that remain",
                              dir, kDataFile, data_bytes, g.data_file_bytes(), dir));
  return Status::ok();
}

void ignore_sigxfsz() noexcept {
  struct sigaction old {};
  if (::sigaction(SIGXFSZ, nullptr, &old) != 0) return;
  if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) return;
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  (void)::sigaction(SIGXFSZ, &ign, nullptr);
}

StoreFiles::StoreFiles(StoreFiles&& o) noexcept
    : data_(o.data_),
      index_(o.index_),
      dir_fd_(o.dir_fd_),
      data_bytes_(o.data_bytes_),
      index_bytes_(o.index_bytes_),
      created_index_(o.created_index_),
      created_data_(o.created_data_),
      locked_(o.locked_),
      dir_(std::move(o.dir_)) {
  o.data_ = o.index_ = o.dir_fd_ = -1;
  o.locked_ = false;
}

StoreFiles& StoreFiles::operator=(StoreFiles&& o) noexcept {
  // `o` takes what this held and closes it when it goes.
  std::swap(data_, o.data_);
  std::swap(index_, o.index_);
  std::swap(dir_fd_, o.dir_fd_);
  std::swap(data_bytes_, o.data_bytes_);
  std::swap(index_bytes_, o.index_bytes_);
  std::swap(created_index_, o.created_index_);
  std::swap(created_data_, o.created_data_);
  std::swap(locked_, o.locked_);
  std::swap(dir_, o.dir_);
  return *this;
}

StoreFiles::~StoreFiles() {
  if (data_ >= 0) ::close(data_);
  if (index_ >= 0) {
    // Explicitly: a ring that registered the file may hold it open a little longer.
    if (locked_) ::flock(index_, LOCK_UN);
    ::close(index_);
  }
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

void StoreFiles::remove_created() noexcept {
  if (dir_fd_ < 0) return;
  struct stat st {};
  if (created_index_ && index_ >= 0 && ::fstat(index_, &st) == 0 && st.st_size == 0)
    (void)::unlinkat(dir_fd_, kIndexFile, 0);
  if (created_data_ && data_ >= 0 && ::fstat(data_, &st) == 0 && st.st_size == 0)
    (void)::unlinkat(dir_fd_, kDataFile, 0);
  created_index_ = created_data_ = false;
}

Status StoreFiles::refresh_sizes() {
  struct stat st {};
  if (::fstat(index_, &st) != 0)
    return Status::io_error(fmt::format("{}/{}: {}", dir_, kIndexFile, std::strerror(errno)));
  index_bytes_ = static_cast<std::uint64_t>(st.st_size);
  if (::fstat(data_, &st) != 0)
    return Status::io_error(fmt::format("{}/{}: {}", dir_, kDataFile, std::strerror(errno)));
  data_bytes_ = static_cast<std::uint64_t>(st.st_size);
  return Status::ok();
}

namespace {

std::string user_name(uid_t uid) {
  passwd pw{};
  passwd* found = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found != nullptr)
    return fmt::format("uid {} ({})", uid, found->pw_name);
  return fmt::format("uid {}", uid);
}

Status refused(std::string message) { return Status::invalid(std::move(message)); }

Status check_owner(const std::string& path, const struct stat& st, const char* what) {
  if (st.st_uid == ::geteuid()) return Status::ok();
  return refused(
      fmt::format("{}: the {} is owned by {}, not by this process's {}; the disk tier "
                  "uses only its own files (another user could read or plant objects)",
                  path, what, user_name(st.st_uid), user_name(::geteuid())));
}

// Creates `dir` (and missing parents) when missing; the last component with `mode` exactly.
Status make_store_dir(const std::string& dir, unsigned mode) {
  int rc = ::mkdir(dir.c_str(), 0700);
  if (rc != 0 && errno == ENOENT) {
    std::error_code ec;
    const auto parent = std::filesystem::path(dir).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) return Status::io_error(fmt::format("cannot create {}: {}", dir, ec.message()));
    rc = ::mkdir(dir.c_str(), 0700);
  }
  if (rc != 0 && errno == EEXIST) return Status::ok();  // not ours to change
  if (rc != 0)
    return Status::io_error(fmt::format("cannot create {}: {}", dir, std::strerror(errno)));
  // Ours: set the mode whatever the umask, through a descriptor (never following a link).
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::ok();  // open_store reports it
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_uid == ::geteuid()) (void)::fchmod(fd, mode);
  ::close(fd);
  return Status::ok();
}

}  // namespace

Result<StoreFiles> open_store(const std::string& dir, const OpenOptions& opts) {
  StoreFiles f;
  f.dir_ = dir;
  const unsigned dir_mode = opts.mode | ((opts.mode & 0444u) >> 2);
  if (opts.create) TIER_RETURN_IF_ERROR(make_store_dir(dir, dir_mode));
  f.dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (f.dir_fd_ < 0) {
    const int e = errno;
    struct stat lst {};
    // O_NOFOLLOW | O_DIRECTORY on a link fails with ELOOP or ENOTDIR, depending on the kernel.
    if (e == ELOOP || (e == ENOTDIR && ::lstat(dir.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)))
      return refused(
          fmt::format("{} is a symbolic link; the disk tier does not follow it (name "
                      "the directory itself)",
                      dir));
    if (e == ENOTDIR) return refused(fmt::format("{} is not a directory", dir));
    if (e == ENOENT) return Status::not_found(fmt::format("{}: no such directory", dir));
    return Status::io_error(fmt::format("{}: {}", dir, std::strerror(e)));
  }
  struct stat dst {};
  if (::fstat(f.dir_fd_, &dst) != 0)
    return Status::io_error(fmt::format("{}: {}", dir, std::strerror(errno)));
  if (opts.check_owner) TIER_RETURN_IF_ERROR(check_owner(dir, dst, "directory"));

  int flags = (opts.write ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW;
  if (opts.direct) flags |= O_DIRECT;
  if (opts.dsync) flags |= O_DSYNC;
  auto open_one = [&](const char* name, int* out, std::uint64_t* bytes, bool* created) -> Status {
    const std::string path = dir + "/" + name;
    // The type first, without opening: opening a FIFO or a device could block or act.
    struct stat st {};
    if (::fstatat(f.dir_fd_, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
      if (S_ISLNK(st.st_mode))
        return refused(
            fmt::format("{} is a symbolic link; the disk tier does not follow it "
                        "(it could point at another user's file)",
                        path));
      if (!S_ISREG(st.st_mode)) return refused(fmt::format("{} is not a regular file", path));
    }
    int fd = ::openat(f.dir_fd_, name, flags);
    if (fd < 0 && errno == ENOENT &&
        (opts.create || (opts.create_index && std::string_view(name) == kIndexFile))) {
      fd = ::openat(f.dir_fd_, name, flags | O_CREAT | O_EXCL, 0600);
      if (fd >= 0) {
        *created = true;
        (void)::fchmod(fd, opts.mode);  // exactly, whatever the umask
      }
    }
    if (fd < 0 && errno == EINVAL && opts.direct)
      return Status(Code::kNotSupported,
                    fmt::format("{}: the file system does not support O_DIRECT (tmpfs and some "
                                "network file systems do not); put the disk tier on ext4, xfs "
                                "or btrfs",
                                path));
    if (fd < 0 && errno == ELOOP)
      return refused(fmt::format("{} is a symbolic link; the disk tier does not follow it", path));
    if (fd < 0 && errno == ENOENT) return Status::not_found(fmt::format("{}: no such file", path));
    if (fd < 0) return Status::io_error(fmt::format("{}: {}", path, std::strerror(errno)));
    *out = fd;
    if (::fstat(fd, &st) != 0)
      return Status::io_error(fmt::format("{}: {}", path, std::strerror(errno)));
    if (!S_ISREG(st.st_mode)) return refused(fmt::format("{} is not a regular file", path));
    if (opts.check_owner) TIER_RETURN_IF_ERROR(check_owner(path, st, "file"));
    if (st.st_nlink != 1)
      return refused(
          fmt::format("{} has {} hard links; the disk tier uses only files that no "
                      "other name reaches",
                      path, st.st_nlink));
    *bytes = static_cast<std::uint64_t>(st.st_size);
    return Status::ok();
  };
  Status opened = open_one(kIndexFile, &f.index_, &f.index_bytes_, &f.created_index_);
  if (opened) opened = open_one(kDataFile, &f.data_, &f.data_bytes_, &f.created_data_);
  if (!opened) {
    f.remove_created();
    return opened;
  }
  const int mode = (opts.exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB;
  for (int waited = 0;; waited += 10) {
    if (::flock(f.index_, mode) == 0) {
      f.locked_ = true;
      break;
    }
    if (waited >= opts.lock_wait_ms) break;
    ::usleep(10'000);
  }
  if (!f.locked_ && opts.require_lock) {
    return Status(Code::kBadState,
                  fmt::format("{} is in use by another process (its index is locked)", dir));
  }
  // The sizes again under the lock: a previous holder may have changed them.
  struct stat st {};
  if (::fstat(f.index_, &st) == 0) f.index_bytes_ = static_cast<std::uint64_t>(st.st_size);
  if (::fstat(f.data_, &st) == 0) f.data_bytes_ = static_cast<std::uint64_t>(st.st_size);
  return f;
}

Status format_store(const StoreFiles& f, const Geometry& g, bool preallocate) {
  auto err = [&](const char* what) {
    int e = errno;
    return Status(e == ENOSPC || e == EFBIG || e == EDQUOT ? Code::kNoSpace : Code::kIoError,
                  fmt::format("{}/{}: {}", f.dir(), what, std::strerror(e)));
  };
  // First mark the store as being formatted: a crash from here on leaves a superblock that the
  // next start recognises as this store's, and formats again.
  AlignedBuffer sb(g.block_size, g.block_size);
  encode_superblock(sb.span(), g, kFormattingMagic);
  TIER_RETURN_IF_ERROR(pwrite_full(f.index(), sb.data(), sb.size(), 0, "index superblock"));
  if (::fsync(f.index()) != 0) return err(kIndexFile);
  if (::ftruncate(f.index(), static_cast<off_t>(g.block_size)) != 0) return err(kIndexFile);
  if (::ftruncate(f.data(), 0) != 0) return err(kDataFile);
  if (::ftruncate(f.index(), static_cast<off_t>(g.index_file_bytes())) != 0) return err(kIndexFile);
  if (::ftruncate(f.data(), static_cast<off_t>(g.data_file_bytes())) != 0) return err(kDataFile);
  if (preallocate && ::fallocate(f.data(), 0, 0, static_cast<off_t>(g.data_file_bytes())) != 0)
    return err(kDataFile);
  TIER_RETURN_IF_ERROR(write_data_trailer(f.data(), g));
  if (::fsync(f.data()) != 0) return err(kDataFile);
  if (::fsync(f.index()) != 0) return err(kIndexFile);
  encode_superblock(sb.span(), g);
  TIER_RETURN_IF_ERROR(pwrite_full(f.index(), sb.data(), sb.size(), 0, "index superblock"));
  if (::fsync(f.index()) != 0) return err(kIndexFile);
  return Status::ok();
}

AlignedBuffer::AlignedBuffer(std::size_t bytes, std::size_t alignment) {
  std::size_t n = (bytes + alignment - 1) / alignment * alignment;
  if (n == 0) return;
  void* p = std::aligned_alloc(alignment, n);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, n);
  p_ = static_cast<std::byte*>(p);
  n_ = n;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(p_);
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(p_); }

Status pread_full(int fd, std::byte* buf, std::size_t n, std::uint64_t offset, const char* what) {
  std::size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, buf + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return Status::io_error(
          fmt::format("{}: read of {} bytes at {}: {}", what, n, offset, std::strerror(errno)));
    if (r == 0)
      return Status::io_error(fmt::format("{}: unexpected end of file at {}", what, offset + done));
    done += static_cast<std::size_t>(r);
  }
  return Status::ok();
}

Status pwrite_full(int fd, const std::byte* buf, std::size_t n, std::uint64_t offset,
                   const char* what) {
  std::size_t done = 0;
  while (done < n) {
    ssize_t r = ::pwrite(fd, buf + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return Status(
          errno == ENOSPC || errno == EFBIG || errno == EDQUOT ? Code::kNoSpace : Code::kIoError,
          fmt::format("{}: write of {} bytes at {}: {}", what, n, offset, std::strerror(errno)));
    done += static_cast<std::size_t>(r);
  }
  return Status::ok();
}

}  // namespace tier::disk
