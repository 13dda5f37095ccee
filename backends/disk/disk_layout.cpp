#include "disk_layout.hpp"
#include "tier/endian.hpp"

#include <fcntl.h>
#include <fmt/format.h>
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
  if (region_size / block_size > (1ull << 31))
    return fmt::format("region size {} has too many blocks", region_size);
  if (region_count < 2)
    return fmt::format("the capacity holds {} region(s) of {}; at least 2 are needed", region_count,
                       region_size);
  return {};
}

void encode_superblock(std::span<std::byte> block, const Geometry& g) noexcept {
  std::memset(block.data(), 0, block.size());
  std::byte* p = block.data();
  put_le<std::uint32_t>(p + 0, kSuperMagic);
  put_le<std::uint32_t>(p + 4, kLayoutVersion);
  put_le<std::uint32_t>(p + 8, g.block_size);
  put_le<std::uint32_t>(p + 12, g.region_count);
  put_le<std::uint64_t>(p + 16, g.region_size);
  put_le<std::uint64_t>(p + kCheckAt, check_of(p, kCheckAt));
}

std::optional<Geometry> decode_superblock(std::span<const std::byte> block) noexcept {
  if (block.size() < kRecordBytes) return std::nullopt;
  const std::byte* p = block.data();
  if (get_le<std::uint32_t>(p) != kSuperMagic || get_le<std::uint32_t>(p + 4) != kLayoutVersion)
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

Result<ScanResult> scan_index(int fd, const Geometry& g,
                              const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  ScanResult out;
  out.regions.resize(g.region_count);
  const std::uint64_t dir = g.dir_bytes();
  const std::uint32_t per_read =
      static_cast<std::uint32_t>(std::max<std::uint64_t>(1, (8ull << 20) / dir));
  AlignedBuffer buf(per_read * dir, g.block_size);
  const std::uint64_t total = std::uint64_t{g.region_count} * dir;
  const std::uint32_t max_blocks = g.region_blocks();
  for (std::uint32_t first = 0; first < g.region_count; first += per_read) {
    std::uint32_t n = std::min(per_read, g.region_count - first);
    TIER_RETURN_IF_ERROR(pread_full(fd, buf.data(), n * dir, g.dir_offset(first, 0), "index"));
    for (std::uint32_t k = 0; k < n; ++k) {
      const std::uint32_t r = first + k;
      const std::byte* d = buf.data() + k * dir;
      auto h = decode_region_header(d);
      if (!h || h->region != r) {
        if (!record_is_zero(d)) out.corrupt_regions.push_back(r);
        continue;
      }
      out.regions[r] = ScannedRegion{true, h->seq};
      for (std::uint32_t s = 1; s < g.dir_records(); ++s) {
        const std::byte* p = d + std::size_t{s} * kRecordBytes;
        if (record_is_zero(p)) continue;
        auto entry = decode_entry(p);
        if (!entry) {
          out.corrupt_entries.push_back({r, s});
          continue;
        }
        const Entry& e = *entry;
        if (e.seq != h->seq) {
          // A leftover of an earlier generation, or (seq above the header's) damage.
          if (e.seq < h->seq)
            ++out.stale_entries;
          else
            out.corrupt_entries.push_back({r, s});
          continue;
        }
        if (e.offset_blocks >= max_blocks ||
            g.blocks_for(e.image_bytes) > max_blocks - e.offset_blocks) {
          out.corrupt_entries.push_back({r, s});
          continue;
        }
        out.entries.push_back({e, r, s});
      }
    }
    if (progress) progress(std::uint64_t{first + n} * dir, total);
  }
  return out;
}

Result<Geometry> read_superblock(int fd, std::uint32_t block_size_hint) {
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
  auto g = decode_superblock(buf.span().first(static_cast<std::size_t>(n)));
  if (!g) return Status::not_found("index: no valid superblock");
  return *g;
}

StoreFiles::StoreFiles(StoreFiles&& o) noexcept
    : data_(o.data_), index_(o.index_), locked_(o.locked_), dir_(std::move(o.dir_)) {
  o.data_ = o.index_ = -1;
  o.locked_ = false;
}

StoreFiles& StoreFiles::operator=(StoreFiles&& o) noexcept {
  // `o` takes what this held and closes it when it goes.
  std::swap(data_, o.data_);
  std::swap(index_, o.index_);
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
}

Result<StoreFiles> open_store(const std::string& dir, const OpenOptions& opts) {
  StoreFiles f;
  f.dir_ = dir;
  if (opts.create) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Status::io_error(fmt::format("cannot create {}: {}", dir, ec.message()));
  }
  int flags = (opts.write ? O_RDWR : O_RDONLY) | O_CLOEXEC;
  if (opts.create) flags |= O_CREAT;
  if (opts.direct) flags |= O_DIRECT;
  if (opts.dsync) flags |= O_DSYNC;
  auto open_one = [&](const char* name, int* out) -> Status {
    std::string path = dir + "/" + name;
    int fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0 && errno == EINVAL && opts.direct)
      return Status(Code::kNotSupported,
                    fmt::format("{}: the file system does not support O_DIRECT (tmpfs and some "
                                "network file systems do not); put the disk tier on ext4, xfs "
                                "or btrfs",
                                path));
    if (fd < 0 && errno == ENOENT) return Status::not_found(fmt::format("{}: no such file", path));
    if (fd < 0) return Status::io_error(fmt::format("{}: {}", path, std::strerror(errno)));
    *out = fd;
    return Status::ok();
  };
  TIER_RETURN_IF_ERROR(open_one(kIndexFile, &f.index_));
  TIER_RETURN_IF_ERROR(open_one(kDataFile, &f.data_));
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
  return f;
}

Status format_store(const StoreFiles& f, const Geometry& g, bool preallocate) {
  auto err = [&](const char* what) {
    int e = errno;
    return Status(e == ENOSPC || e == EFBIG || e == EDQUOT ? Code::kNoSpace : Code::kIoError,
                  fmt::format("{}/{}: {}", f.dir(), what, std::strerror(e)));
  };
  // Invalidate first: a crash during formatting leaves no superblock, so the store is
  // formatted again on the next start.
  if (::ftruncate(f.index(), 0) != 0) return err(kIndexFile);
  if (::ftruncate(f.data(), 0) != 0) return err(kDataFile);
  if (::ftruncate(f.index(), static_cast<off_t>(g.index_file_bytes())) != 0) return err(kIndexFile);
  if (::ftruncate(f.data(), static_cast<off_t>(g.data_file_bytes())) != 0) return err(kDataFile);
  if (preallocate && ::fallocate(f.data(), 0, 0, static_cast<off_t>(g.data_file_bytes())) != 0)
    return err(kDataFile);
  if (::fsync(f.data()) != 0) return err(kDataFile);
  if (::fsync(f.index()) != 0) return err(kIndexFile);
  AlignedBuffer sb(g.block_size, g.block_size);
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
