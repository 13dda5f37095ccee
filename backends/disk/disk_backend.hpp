#pragma once
// The disk tier: object images in a directory on a local file system, through io_uring with
// O_DIRECT, persistent across restarts and kill -9 (layout: disk_format.hpp, docs/disk.md).
//
// Requests: buffers must be aligned to the block size (capabilities().io_alignment); a put's
// buffer holds the image padded to a whole number of blocks, a get's buffer must be at least the
// image size rounded up to a block (else InvalidArgument with `bytes` = that size).
//
// Put: the image is appended to the open region (one write), then its entry is published in the
// region's directory (one write of the directory block, shared by every entry that became ready
// meanwhile). The put completes, and the object becomes visible to get/contains, only after both
// writes completed. A put of a key being written or already stored is AlreadyExists.
// Remove: the entry is zeroed in the directory; completes when that write completed.
// Get: one read straight into the caller's buffer; Backend::poll verifies it.
//
// Capacity: regions are the unit of eviction, least recently used first (a region's recency is
// its opening, or the latest get or repeated put of an object in it; after a restart, its age).
// When no free region is left, that region is evicted whole (notify_evicted for each object, with
// no image) and its header rewritten with a new generation before the first write into it.
//
// Leases (Backend::lease, docs/leases.md): a region holding a leased object is not evicted while
// the lease lasts; a put that needs a region while every candidate is leased waits (placed by a
// later submit or poll once a lease ends or expires). Leases live in this process only (the
// directory is locked to one instance).
//
// Errors: ENOSPC / EFBIG / EDQUOT turn into NoSpace, every other failure into IoError; both fail
// only the request concerned and are counted in stats(). Short transfers and -EAGAIN are
// resubmitted.
//
// Threads: one owner thread (Backend's contract); one ring per instance, no internal threads.
// Two instances (or processes) cannot open the same directory: the index is locked.

#include <liburing.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "disk_format.hpp"
#include "tier/backend.hpp"
#include "tier/lease.hpp"

namespace tier::disk {

struct DiskOptions {
  std::string path;
  std::uint64_t capacity = 0;
  std::uint64_t region_size = 16ull << 20;
  std::uint32_t block_size = 4096;
  std::uint32_t queue_depth = 64;
  bool durable = false;
  bool preallocate = false;
  std::uint32_t lock_timeout_ms = 5000;
  // Permission bits of the files (the directory, when created: plus x where r is set).
  unsigned mode = 0600;
};

// Counters of the tier beyond the per-op metrics of Backend.
struct DiskStats {
  std::uint64_t recovered_objects = 0;
  double recovery_ms = 0;       // time create() spent scanning the index and rebuilding it
  bool formatted = false;       // create() formatted the store (new, or unreadable superblock)
  std::uint64_t no_space = 0;   // writes that failed with ENOSPC / EFBIG / EDQUOT
  std::uint64_t io_errors = 0;  // other failed I/O
  std::uint64_t resubmits = 0;  // short transfers and -EAGAIN resubmitted
  std::uint64_t dir_writes = 0;
  std::uint64_t data_writes = 0;
  std::uint64_t region_evictions = 0;
};

class DiskBackend final : public Backend {
 public:
  // Opens (or formats) the store and probes io_uring. Files that are not recognisably a store
  // (no valid superblock, not empty) are refused, never formatted; so are symbolic links and files
  // of another user (open_store). Sets SIGXFSZ to SIG_IGN where it has its default action
  // (ignore_sigxfsz), so that writes past `ulimit -f` fail with NoSpace.
  // Returns: the tier, NotSupported (io_uring refused by the kernel, or no O_DIRECT on the file
  // system), InvalidArgument (options; a refused path), BadState (the directory is in use; not a
  // store; a truncated file), NoSpace, IoError.
  static Result<std::unique_ptr<DiskBackend>> create(const BackendContext& ctx);
  static Result<std::unique_ptr<DiskBackend>> open(const std::string& tier_name,
                                                   const DiskOptions& opts);
  // Waits (bounded) for in-flight I/O, then releases the ring and the files.
  ~DiskBackend() override;

  Capabilities capabilities() const noexcept override;
  Usage usage() const noexcept override;
  std::string describe() const override;
  const DiskStats& stats() const noexcept { return stats_; }
  const Geometry& geometry() const noexcept { return geo_; }

 protected:
  Result<std::size_t> do_submit(std::span<const IoRequest> reqs) noexcept override;
  Result<std::size_t> do_poll(std::span<Completion> out, std::size_t min,
                              std::chrono::microseconds wait) noexcept override;
  Result<LeaseId> do_lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                           std::span<std::uint8_t> held) noexcept override;
  LeaseEnd do_release(LeaseId id) noexcept override;
  // The published objects of `ns` (the in-memory index).
  Result<std::vector<ObjectKey>> do_list_keys(const Key128& ns) override;

 private:
  enum class RecordState : std::uint8_t { kEmpty, kWriting, kPublishing, kLive, kDead };
  struct Record {
    ObjectKey key;
    std::uint32_t offset_blocks = 0;
    std::uint32_t image_bytes = 0;
    std::uint32_t payload_check = 0;
    RecordState state = RecordState::kEmpty;
  };
  // kResetting: its new header is being written; writes into it wait. kReady: writable. Whether a
  // ready region is open or sealed is said by open_ and sealed_.
  enum class RegionState : std::uint8_t { kFree, kResetting, kReady };
  // One region of the data file (disk_format.hpp): the unit of allocation and eviction. Not a
  // tier::Region, which is a span of memory.
  struct DiskRegion {
    RegionState state = RegionState::kFree;
    std::uint64_t seq = 0;
    std::uint32_t write_blocks = 0;      // next free data block
    std::vector<Record> records;             // index 0 stands for the header
    std::uint32_t pending = 0;           // in-flight I/O touching the region
    std::uint64_t touched = 0;           // recency: opened, or an object in it got or put again
    std::vector<std::uint32_t> waiting;  // data writes held until the reset completes
    std::uint32_t leased = 0;            // lease holds of objects in it: not evicted while > 0
  };
  enum class IoKind : std::uint8_t { kRead, kWrite, kDir };
  // One I/O in the ring (resubmitted in place on a short transfer or -EAGAIN).
  struct Io {
    IoKind kind = IoKind::kRead;
    std::uint32_t region = 0;
    std::uint32_t record = 0;  // kRead/kWrite: the object's record; kDir: the directory block
    std::byte* buf = nullptr;
    std::uint64_t offset = 0;
    std::uint32_t len = 0;
    std::uint32_t done = 0;
    int fixed_buf = -1;           // registered buffer index, or -1
    std::uint64_t user_data = 0;  // kRead/kWrite: the request's
  };
  // A request waiting for a directory block write.
  enum class WaitKind : std::uint8_t { kPublish, kRemove, kReset };
  struct Waiter {
    WaitKind kind;
    std::uint64_t user_data;
    std::uint32_t record;
  };
  struct DirBlock {
    bool in_flight = false;
    std::vector<Waiter> flying;  // covered by the write in flight
    std::vector<Waiter> next;    // need another write
  };
  struct DirBuffer {
    std::byte* data;
    int fixed;  // registered index or -1
  };
  struct Location {
    std::uint32_t region;
    std::uint32_t record;
  };
  struct PutWait {  // an accepted put that has no place yet
    std::uint64_t user_data;
    ObjectKey key;
    std::byte* buf;
    std::uint32_t image_bytes;
    std::uint32_t payload_check;
  };

  DiskBackend(std::string tier_name, const DiskOptions& opts, const Geometry& g, StoreFiles files);
  Status init_ring();
  Status adopt_store();
  Status recover();

  void accept_put(const IoRequest& r);
  // Where r.key is published; completes `r` with NotFound when it is not.
  std::optional<Location> locate_or_complete(const IoRequest& r);
  void accept_get(const IoRequest& r);
  void accept_remove(const IoRequest& r);
  void place_puts();
  std::optional<std::uint32_t> take_region();
  void prepare_spare();
  void evict_region(std::uint32_t r);
  // Gives a lease hold's region back (LeaseTable::OnEnd).
  LeaseTable::OnEnd unlease();
  void begin_reset(std::uint32_t r);

  std::uint32_t new_io(IoKind kind, std::uint32_t region);
  void release_io(std::uint32_t id);
  void queue_io(std::uint32_t id) { backlog_.push_back(id); }
  void pump();
  void reap();
  void on_cqe(std::uint32_t id, int res);
  void finish_io(std::uint32_t id, int err);
  void schedule_dir(std::uint32_t region, std::uint32_t block, Waiter w);
  void start_dir_write(std::uint32_t region, std::uint32_t block);
  void finish_dir(std::uint32_t region, std::uint32_t block, int err);
  void fill_dir_block(std::uint32_t region, std::uint32_t block, std::byte* out) const;
  DirBuffer take_dir_buffer();
  Status error_status(int err, const char* what);
  void complete(std::uint64_t user_data, Status s, std::size_t bytes);

  static std::uint64_t block_key(std::uint32_t region, std::uint32_t block) {
    return (std::uint64_t{region} << 32) | block;
  }

  DiskOptions opts_;
  Geometry geo_;
  StoreFiles files_;
  io_uring ring_{};
  bool ring_ready_ = false;
  bool fixed_files_ = false;
  std::uint32_t ring_entries_ = 0;
  std::uint32_t ring_inflight_ = 0;
  std::uint32_t user_inflight_ = 0;  // accepted get/put/remove not yet completed

  std::vector<DiskRegion> regions_;
  std::vector<std::uint32_t> sealed_;  // full regions, eviction candidates
  std::uint64_t clock_ = 0;            // recency clock of DiskRegion::touched
  std::deque<std::uint32_t> free_;     // regions without a generation
  std::int64_t open_ = -1;             // region receiving appends
  std::int64_t spare_ = -1;            // region readied to be opened next
  static constexpr std::uint32_t kSpareMinRegions = 16;
  std::uint64_t next_seq_ = 1;
  std::uint64_t used_bytes_ = 0;  // blocks of live objects, in bytes

  std::unordered_map<ObjectKey, Location> index_;  // published objects
  std::unordered_set<ObjectKey> writing_;          // puts accepted and not yet completed
  std::deque<PutWait> unplaced_;

  std::vector<Io> ios_;
  std::vector<std::uint32_t> free_ios_;
  std::deque<std::uint32_t> backlog_;  // I/O waiting for a submission queue entry
  std::unordered_map<std::uint64_t, DirBlock> dir_blocks_;
  std::unique_ptr<std::byte[], void (*)(void*)> dir_pool_{nullptr, nullptr};
  std::vector<DirBuffer> free_dir_bufs_;
  std::vector<AlignedBuffer> extra_dir_bufs_;  // unregistered, when the pool runs dry
  bool registered_buffers_ = false;

  std::vector<Completion> ready_;
  LeaseTable leases_;  // hold tags are region indices
  DiskStats stats_;
};

// Parses the resolved plugin options into DiskOptions. Returns: InvalidArgument.
Result<DiskOptions> parse_disk_options(const BackendContext& ctx);

}  // namespace tier::disk
