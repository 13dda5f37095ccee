#pragma once
// The on-disk layout of the disk tier (docs/disk.md has the full description and the crash
// safety argument). Shared by the backend and by `tierctl disk`.
//
// A store is a directory holding two files:
//
//   data   region_count regions of region_size bytes. A region is a log: object images are
//          appended at block-aligned offsets (block_size, the O_DIRECT unit) and padded to a
//          whole number of blocks. Nothing but image bytes lives here.
//   index  block 0: the superblock (geometry); then one directory per region, dir_bytes each.
//          A directory is an array of 64-byte records: record 0 is the region header (the region's
//          sequence number, its generation), records 1.. are entries, one per object, naming the
//          key, the image size, the block offset in the region and a check of the payload.
//
// An entry is valid only when its own checksum holds and its sequence number equals the region
// header's; anything else in a record (zeros, a stale entry of an earlier generation of the region,
// torn or flipped bytes) is not an object. An entry is written only after the image it names has
// been written completely (write-then-publish), and a region's header is rewritten with a new
// sequence number, and that write completed, before any image of the new generation is written.
//
// All integers are little-endian.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tier/key.hpp"
#include "tier/status.hpp"

namespace tier::disk {

inline constexpr std::size_t kRecordBytes = 64;
inline constexpr std::uint32_t kSuperMagic = 0x5344544Cu;   // "LTDS"
inline constexpr std::uint32_t kRegionMagic = 0x5244544Cu;  // "LTDR"
inline constexpr std::uint32_t kEntryMagic = 0x4544544Cu;   // "LTDE"
// A superblock written while the store is being (re)formatted: still recognisably this store's,
// so a crash during formatting leaves a store that the next start formats again.
inline constexpr std::uint32_t kFormattingMagic = 0x4644544Cu;  // "LTDF"
// The geometry record in the block after the last region of the data file, so that the data file
// alone names its geometry (tierctl disk repair rebuilds a lost index from it).
inline constexpr std::uint32_t kTrailerMagic = 0x4744544Cu;  // "LTDG"
inline constexpr std::uint32_t kLayoutVersion = 1;
inline constexpr const char* kDataFile = "data";
inline constexpr const char* kIndexFile = "index";

// The geometry of a store, fixed when it is formatted.
struct Geometry {
  std::uint32_t block_size = 4096;
  std::uint64_t region_size = 16ull << 20;
  std::uint32_t region_count = 0;

  std::uint32_t region_blocks() const noexcept {
    return static_cast<std::uint32_t>(region_size / block_size);
  }
  // Slots per directory: the header plus one entry per block (an image takes at least a block).
  std::uint32_t dir_records() const noexcept { return region_blocks() + 1; }
  std::uint32_t records_per_block() const noexcept {
    return static_cast<std::uint32_t>(block_size / kRecordBytes);
  }
  std::uint64_t dir_bytes() const noexcept {
    std::uint64_t raw = std::uint64_t{dir_records()} * kRecordBytes;
    return (raw + block_size - 1) / block_size * block_size;
  }
  std::uint64_t index_file_bytes() const noexcept {
    return block_size + std::uint64_t{region_count} * dir_bytes();
  }
  std::uint64_t data_file_bytes() const noexcept { return region_size * region_count; }
  // The data file with its trailer block (the geometry record).
  std::uint64_t data_file_bytes_with_trailer() const noexcept {
    return data_file_bytes() + block_size;
  }
  // File offset of directory block `block` of region `region` in the index file.
  std::uint64_t dir_offset(std::uint32_t region, std::uint32_t block) const noexcept {
    return block_size + std::uint64_t{region} * dir_bytes() + std::uint64_t{block} * block_size;
  }
  // File offset of data block `block` of region `region` in the data file.
  std::uint64_t data_offset(std::uint32_t region, std::uint32_t block) const noexcept {
    return std::uint64_t{region} * region_size + std::uint64_t{block} * block_size;
  }
  std::uint64_t blocks_for(std::uint64_t bytes) const noexcept {
    return (bytes + block_size - 1) / block_size;
  }
  friend bool operator==(const Geometry&, const Geometry&) = default;
  // Empty when the geometry is usable; else what is wrong with it.
  std::string check() const;
};

struct RegionHeader {
  std::uint64_t seq = 0;  // generation: unique and increasing over the store's life
  std::uint32_t region = 0;
};

struct Entry {
  ObjectKey key;
  std::uint64_t seq = 0;            // the region's generation when the entry was written
  std::uint32_t image_bytes = 0;    // header + payload, unpadded
  std::uint32_t offset_blocks = 0;  // first block of the image in its region
  std::uint32_t payload_check = 0;  // low 32 bits of the image's payload checksum
};

// Record codecs. A decoder returns nullopt when the record does not hold a valid record of its
// kind. The superblock, the formatting superblock and the data trailer share one encoding under
// their own magic (kSuperMagic, kFormattingMagic, kTrailerMagic).
void encode_superblock(std::span<std::byte> block, const Geometry& g,
                       std::uint32_t magic = kSuperMagic) noexcept;
std::optional<Geometry> decode_superblock(std::span<const std::byte> block,
                                          std::uint32_t magic = kSuperMagic) noexcept;
void encode_region_header(std::byte* record, const RegionHeader& h) noexcept;
std::optional<RegionHeader> decode_region_header(const std::byte* record) noexcept;
void encode_entry(std::byte* record, const Entry& e) noexcept;
std::optional<Entry> decode_entry(const std::byte* record) noexcept;
bool record_is_zero(const std::byte* record) noexcept;

// What a scan of the index finds.
struct ScannedEntry {
  Entry entry;
  std::uint32_t region = 0;
  std::uint32_t record = 0;
};
struct ScannedRegion {
  bool in_use = false;  // holds a valid header
  std::uint64_t seq = 0;
};
struct RecordRef {
  std::uint32_t region = 0;
  std::uint32_t record = 0;
};
struct ScanResult {
  std::vector<ScannedRegion> regions;    // one per region
  std::vector<std::uint32_t> lost_regions;  // directories beyond the end of a truncated index
  std::vector<ScannedEntry> entries;     // valid entries of regions in use, by region then record
  std::vector<RecordRef> corrupt_entries;  // non-zero records that are neither valid nor stale
  std::vector<std::uint32_t> corrupt_regions;  // non-zero region headers that do not parse
  std::uint64_t stale_entries = 0;             // valid entries of an earlier generation (ignored)
};

// Reads every directory of the index file (opened with O_DIRECT or not) and classifies its
// records. Directories that do not lie wholly within `index_bytes` (the file's size: a truncated
// index) are not read and are listed in lost_regions; that is accepted only when the data file
// (`data_bytes`) holds every region, else the geometry is not this store's (BadState). Entries
// are checked against their region and against the data file's size (beyond it: corrupt).
// Memory: 16 bytes per region, so bounded by the files' sizes (a region has a directory of at
// least 512 bytes and at least 8 KiB of data), plus an 8 MiB read buffer. `progress(done, total)`
// is called with bytes scanned. Returns: what it found, BadState, IoError.
Result<ScanResult> scan_index(
    int index_fd, const Geometry& g, std::uint64_t index_bytes, std::uint64_t data_bytes,
    const std::function<void(std::uint64_t, std::uint64_t)>& progress = {});

// Reads and checks the superblock. Returns: the geometry, NotFound (no valid superblock; with
// `formatting` set when it is a formatting superblock, see kFormattingMagic), IoError.
Result<Geometry> read_superblock(int index_fd, std::uint32_t block_size_hint = 4096,
                                 bool* formatting = nullptr);
// Reads the data file's trailer (the geometry record after the last region), given the file's
// size. Returns: the geometry, NotFound (none: not a store, damaged, or a store formatted before
// the trailer existed), IoError.
Result<Geometry> read_data_trailer(int data_fd, std::uint64_t data_bytes);
// Writes the trailer for `g` (extending the data file by one block). Returns: Ok, NoSpace, IoError.
Status write_data_trailer(int data_fd, const Geometry& g);

// Checks that the files are as large as `g` says (the index whole, the data file at least its
// regions). Returns: Ok, or BadState naming the file, its size and the size expected.
Status check_file_sizes(const std::string& dir, const Geometry& g, std::uint64_t index_bytes,
                        std::uint64_t data_bytes);

// A write beyond RLIMIT_FSIZE (ulimit -f) raises SIGXFSZ, whose default action kills the process.
// The disk tier and its tools call this when they open a store: where SIGXFSZ still has its
// default action it is set to SIG_IGN, so that such a write fails with EFBIG (Status NoSpace,
// counted). A handler the program installed is left alone.
void ignore_sigxfsz() noexcept;

// The two files of a store, open, with an advisory lock (flock) on the index file: exclusive for
// a running tier or `tierctl disk repair`, shared for inspection. Closing releases the lock, and
// so does the death of the process (kill -9 included) once its in-flight I/O has completed.
struct OpenOptions {
  bool write = true;         // O_RDWR (else O_RDONLY)
  bool create = false;       // create the directory and files when missing
  // Create a missing `index` (mode 0600) in an existing store directory whose `data` is there:
  // `tierctl disk repair` rebuilds a deleted index from the data file.
  bool create_index = false;
  bool direct = true;        // O_DIRECT
  bool dsync = false;        // O_DSYNC: every completed write is on stable storage
  bool exclusive = true;     // lock mode
  bool require_lock = true;  // fail (BadState) when the lock is held elsewhere
  // Permission bits of the files when they are created (0600 by default: only the owner reads
  // the cache); the directory, when created, gets them plus x where r is set (0700). Set exactly,
  // whatever the umask.
  unsigned mode = 0600;
  // Refuse a directory or file owned by another user (the tier and the tools that write).
  bool check_owner = true;
  // How long to wait for the lock. A process that died with I/O in flight holds it until the
  // kernel has finished that I/O (its ring holds the index file open), so a successor never
  // races with writes of its predecessor.
  int lock_wait_ms = 0;
};
class StoreFiles {
 public:
  StoreFiles() = default;
  StoreFiles(StoreFiles&& o) noexcept;
  StoreFiles& operator=(StoreFiles&& o) noexcept;
  ~StoreFiles();
  int data() const noexcept { return data_; }
  int index() const noexcept { return index_; }
  int dir_fd() const noexcept { return dir_fd_; }
  // Sizes when opened (or refreshed).
  std::uint64_t data_bytes() const noexcept { return data_bytes_; }
  std::uint64_t index_bytes() const noexcept { return index_bytes_; }
  // Removes the files that open_store created (empty ones), when the store is refused: a
  // directory of someone else's files is left as it was found.
  void remove_created() noexcept;
  // Reads the sizes again (after the files were resized). Returns: Ok, IoError.
  Status refresh_sizes();
  bool locked() const noexcept { return locked_; }
  const std::string& dir() const noexcept { return dir_; }

 private:
  friend Result<StoreFiles> open_store(const std::string&, const OpenOptions&);
  int data_ = -1;
  int index_ = -1;
  int dir_fd_ = -1;
  std::uint64_t data_bytes_ = 0;
  std::uint64_t index_bytes_ = 0;
  bool created_index_ = false;
  bool created_data_ = false;
  bool locked_ = false;
  std::string dir_;
};
//
// Safety against other local users and careless paths: the directory is opened once
// (O_DIRECTORY | O_NOFOLLOW) and the files relative to it (openat with O_NOFOLLOW), so a symbolic
// link as the directory's last component or as `data`/`index` is refused, never followed; the files
// must be regular files with one link; with `check_owner`, a directory or file owned by another
// user is refused. Nothing is truncated or written here. Files are created only when missing
// (O_EXCL) with `mode`.
// Returns: the files, NotFound (no store and !create), InvalidArgument (refused: a symbolic
// link, not a directory / regular file, another owner, hard links), NotSupported (no O_DIRECT on
// this file system), BadState (locked by another process), IoError.
Result<StoreFiles> open_store(const std::string& dir, const OpenOptions& opts);
// Formats the store: sizes both files (the data file sparse unless `preallocate`), zeroes the
// index and writes the superblock last. The caller must have established that the files are this
// store's (a valid or formatting superblock, both files empty, or an explicit `tierctl disk
// format`): formatting destroys what they hold. A crash at any point leaves a store that is
// recognised and formatted again (kFormattingMagic). Returns: Ok, NoSpace, IoError.
Status format_store(const StoreFiles& files, const Geometry& g, bool preallocate);

// A block-aligned heap buffer (for O_DIRECT), zero-filled.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(std::size_t bytes, std::size_t alignment);
  AlignedBuffer(AlignedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  ~AlignedBuffer();
  std::byte* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }
  std::span<std::byte> span() const noexcept { return {p_, n_}; }

 private:
  std::byte* p_ = nullptr;
  std::size_t n_ = 0;
};

// Full-length positional I/O, retrying on EINTR and short transfers. Returns: Ok or IoError
// (with the errno text and `what`).
Status pread_full(int fd, std::byte* buf, std::size_t n, std::uint64_t offset, const char* what);
Status pwrite_full(int fd, const std::byte* buf, std::size_t n, std::uint64_t offset,
                   const char* what);

}  // namespace tier::disk
