#pragma once
// ShmStore: the object store behind the CPU tier's "shm" mode. Object images and their index live
// in one named Boost.Interprocess managed segment (/dev/shm/<name>), so every process of a host
// that opens the same name (the TP ranks of one engine, a restarted engine, tierctl) sees the same
// objects. docs/shm.md describes the layout and the crash-safety protocol; in short:
//
//  - One robust, process-shared pthread mutex guards the index. A process killed while holding it
//    hands the next locker EOWNERDEAD; that locker rebuilds every derived structure (hash chains,
//    LRU list, free lists, counters) from the entry table, which is the source of truth, and
//    carries on. Boost.Interprocess's own (non-robust) mutexes are never taken after the segment
//    is published: creation happens under a private name and is published by an atomic rename.
//  - Bytes are copied outside the lock. A put reserves blocks and an entry in state kWriting,
//    copies, then publishes (kReady) under the lock; a get pins the entry (recorded in its client
//    slot), copies, and unpins. Readers never see a kWriting entry, and a pinned entry is never
//    evicted nor its blocks reused, so no torn object is ever visible.
//  - Lookup leases (lease()): a leased entry is not evicted before its deadline, recorded in the
//    entry itself (CLOCK_MONOTONIC, the same in every process of the host), so every process's
//    evictions respect it; release() or the death of the leasing process ends it earlier.
//  - Each open store holds a client slot (pid + process start time). The reservations and pins of
//    a process that died are released when another process notices (on open, when space runs
//    out, on a put of the same key, in verify()).
//
// Threads: one ShmStore is used by one thread at a time (like the Backend that owns it); any
// number of stores, in any number of processes, may use one segment at once.
// Data path calls never throw.
//
// The parts, one class each (namespace shm): Segment (shm/segment.hpp: naming, layout, creation,
// mapping), Blocks (shm/blocks.hpp: block chains and the copies through them), Index
// (shm/index.hpp: hash, LRU, free lists, pins, client slots), Recovery (shm/recovery.hpp: the
// robust lock, the rebuild after a death, dead-client reaping); the records they share are in
// shm/format.hpp.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tier/backend.hpp"
#include "tier/key.hpp"
#include "tier/object.hpp"
#include "tier/status.hpp"

namespace tier::cpu {

// When a process maps the segment's arena into its page tables (docs/shm.md "Performance"): a
// page another process wrote costs a fault on its first touch here until it is mapped.
enum class ShmPrefault : std::uint8_t {
  kOff,         // each 2 MiB chunk on its first use by a put or get of this process
  kOpen,        // the whole arena before open() returns (0.3-0.6 s per GiB on 2 busy cores)
  kBackground,  // one idle-priority thread maps the whole arena after open() returns; a put or
                // get that comes first maps its own chunk, as with kOff
};

struct ShmConfig {
  std::string segment;                // segment name (no slash): /dev/shm/<segment>
  std::uint64_t capacity = 0;         // bytes of object storage (rounded down to whole blocks)
  std::uint64_t block_bytes = 16384;  // allocation unit, a power of two in [4KiB, 64MiB]
  std::uint64_t max_objects = 0;      // index entries; 0 = one per block
  ShmPrefault prefault = ShmPrefault::kBackground;
  // Permission bits of a segment this process creates: 0600 (this user only, the default), 0660
  // (the user's group too) or 0666 (every local user). A segment owned by another user is opened
  // only when this is not 0600 and the segment's bits are exactly these (both sides opted in).
  std::uint32_t mode = 0600;
  // How long open() waits while another process creates the segment; 0: 30 s + 2 s per GiB of
  // capacity.
  std::chrono::milliseconds creation_wait{0};
};

// A snapshot of a segment for usage(), describe() and `tierctl shm inspect`.
struct ShmStats {
  std::string segment;
  std::uint64_t capacity_bytes = 0;  // blocks * block_bytes
  std::uint64_t block_bytes = 0;
  std::uint64_t max_objects = 0;
  std::uint64_t used_bytes = 0;      // bytes of the blocks held by stored and reserved objects
  std::uint64_t image_bytes = 0;     // exact image bytes of stored (ready) objects
  std::uint64_t objects = 0;         // ready objects
  std::uint64_t writing = 0;         // reserved by a put that has not published yet
  std::uint64_t doomed = 0;          // removed while a reader still copies them
  std::uint64_t clients = 0;         // open stores (client slots in use)
  std::uint64_t recoveries = 0;      // lock-holder deaths repaired since creation
  std::uint64_t reaped_clients = 0;  // dead clients whose reservations and pins were released
  std::uint64_t corruptions = 0;     // corrupt fields met by operations (each repaired)
  std::uint64_t segment_bytes = 0;   // size of the whole segment
};

struct ShmClientInfo {
  std::int32_t pid = 0;
  bool alive = false;
  bool pinning = false;  // holds a pin (a get is copying)
};

// One object as `tierctl shm inspect --objects` lists it.
struct ShmObjectInfo {
  ObjectKey key;
  std::uint64_t image_bytes = 0;
  std::uint32_t blocks = 0;
  const char* state = "";  // "ready", "writing" or "doomed"
  // A lookup lease that holds it against eviction now: milliseconds left (0: none), and the pid
  // of its holder (0 when several processes hold it).
  std::uint64_t lease_ms = 0;
  std::int32_t lease_pid = 0;
};

// The lookup leases in force in a segment (every process's): a long one blocks every put that
// needs its room, so inspect and verify show them.
struct ShmLeases {
  std::uint64_t objects = 0;     // objects held
  std::uint64_t longest_ms = 0;  // the most time left on one
  std::int32_t longest_pid = 0;  // its holder (0: several processes)
};

// What inspect() found, under the lock.
struct ShmInspection {
  ShmStats stats;
  std::vector<ShmClientInfo> clients;  // client slots in use
  std::vector<ShmObjectInfo> objects;  // entries that are not free
  ShmLeases leases;
};

// What verify() found.
struct ShmVerifyReport {
  std::uint64_t checked = 0;          // ready objects whose image was verified
  std::uint64_t corrupt = 0;          // failed verification; removed
  std::uint64_t index_problems = 0;   // problems found in the index (then repaired)
  std::uint64_t dropped_entries = 0;  // malformed entries the repair dropped
  std::uint64_t reaped_clients = 0;
  ShmLeases leases;  // in force after the repair and the reaping
  // One line per problem: each corrupt index field (which field of which slot, the value found,
  // the range expected), then each corrupt object.
  std::vector<std::string> problems;
};

// Points where a test child process can kill itself to exercise recovery (testing::set_crash_hook).
enum class ShmCrashPoint {
  kPutHoldingLock,    // put: blocks taken off the free list, entry not yet written, lock held
  kPutCopying,        // put: half of the image copied, entry kWriting, lock free
  kGetCopying,        // get: entry pinned, half copied, lock free
  kEvictHoldingLock,  // put: a victim half unlinked during eviction, lock held
};

class ShmStore {
 public:
  // Called for each object evicted for capacity, after the lock is released (keys only).
  using EvictFn = std::function<void(const ObjectKey&, std::uint64_t image_bytes)>;

  // Opens the segment `cfg.segment`, creating it with `cfg`'s geometry when it does not exist.
  // An existing segment must have the same geometry. Takes a client slot. Processes that open a
  // missing segment at once: one creates it, the others wait for it (cfg.creation_wait).
  // Errors: InvalidArgument (bad config, geometry mismatch), NoSpace (no client slot, /dev/shm
  // full), TimedOut (another process kept creating it), IoError.
  static Result<std::unique_ptr<ShmStore>> open(const ShmConfig& cfg);
  // Opens an existing segment with whatever geometry it has (tierctl). Errors: NotFound, IoError.
  static Result<std::unique_ptr<ShmStore>> attach(const std::string& segment);
  // Removes the segment's name (and leftovers of interrupted creations). Processes that have it
  // open keep their mapping; the next open creates a fresh one. Errors: NotFound.
  static Status remove_segment(const std::string& segment);

  ~ShmStore();
  ShmStore(const ShmStore&) = delete;
  ShmStore& operator=(const ShmStore&) = delete;

  // Put-if-absent of a complete image. Returns: Ok, AlreadyExists (ready or being written by
  // another client; a ready one has its recency refreshed), NoSpace, BadState. The image is
  // copied in with `stores` (tier/object.hpp).
  Status put(const ObjectKey& key, std::span<const std::byte> image, const EvictFn& on_evict,
             Stores stores = Stores::kCached);

  // For images in memory the CPU cannot address (device memory, the pinned mode): the object's
  // bytes in this process's mapping, handed over as pieces (runs of consecutive blocks, in image
  // order, together exactly the image), while the entry is reserved (put) or pinned (get), so no
  // other client sees or reuses them.
  using PiecesFn = std::function<Status(std::span<const std::span<std::byte>>)>;
  // put() whose bytes `fill` writes (and checks) into the reserved pieces. When fill fails the
  // reservation is abandoned (the object never becomes visible) and its status returned.
  Status put_with(const ObjectKey& key, std::uint64_t image_bytes, const PiecesFn& fill,
                  const EvictFn& on_evict);

  struct GetResult {
    Status status;            // Ok, NotFound, InvalidArgument (out too small), ChecksumMismatch,
                              // BadState
    std::uint64_t bytes = 0;  // image bytes copied, or needed when `out` is too small
  };
  // Copies the image into `out`, verifying it on the way (tier/object.hpp copy_verified: header,
  // `key`, length, payload checksum; on a mismatch `out` holds no valid header) with `stores`, and
  // refreshes recency.
  GetResult get(const ObjectKey& key, std::span<std::byte> out, Stores stores = Stores::kCached);
  // get() into a destination of `capacity` bytes that `drain` copies the pinned pieces into. The
  // store does not verify them: `drain` must (header, key, length, payload checksum), and its
  // status is the result's.
  GetResult get_with(const ObjectKey& key, std::uint64_t capacity, const PiecesFn& drain);
  // The image size of a ready object. Does not refresh recency. Returns: NotFound, BadState.
  Result<std::uint64_t> contains(const ObjectKey& key);
  // Returns: Ok, NotFound (absent, or not yet published), BadState.
  Status remove(const ObjectKey& key);

  // Lookup leases (Backend::lease, docs/shm.md "Lookup leases"): held[i] = 1 for each ready key
  // now held against eviction (by every process) for `ttl`. Returns the lease id (0: nothing
  // held), BadState. Leases of this store that reached their deadline unreleased are added to
  // `expiries`. An entry leased by several processes ends at the latest deadline.
  Result<std::uint64_t> lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                              std::span<std::uint8_t> held, std::uint64_t& expiries);
  // Ends a lease of this store (kExpired when its deadline had passed; kUnknown: ended already).
  LeaseEnd release(std::uint64_t id);

  // This process's mapping of the whole segment (for page-locking it; the pinned mode).
  std::span<std::byte> mapping() const noexcept;
  // Ok, or IoError once another process truncated the segment under this mapping (shm/guard.hpp):
  // every operation from then on fails, and one that was running when it happened must not be
  // trusted (callers check after it too).
  Status intact() const;

  // Counters read without the lock (each one is consistent; together they are approximate).
  ShmStats stats() const noexcept;
  // Under the lock: counts states and lists clients and objects (tierctl).
  Result<ShmInspection> inspect();
  // Checks every structure of the index and names each problem (then repairs the index from the
  // entry table, dropping malformed entries), releases what dead clients held, and verifies every
  // ready image (header, key, length, checksum); corrupt objects are removed. Bounded: every walk
  // stops at the table sizes.
  Result<ShmVerifyReport> verify();

 private:
  struct Impl;
  explicit ShmStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

namespace testing {
// Installs a hook called at each ShmCrashPoint (nullptr: none). Only tests install one, in a
// child process, to die with SIGKILL at a chosen instant.
void set_crash_hook(void (*hook)(ShmCrashPoint));
}  // namespace testing

}  // namespace tier::cpu
