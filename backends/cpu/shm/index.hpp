#pragma once
// shm::Index: the index of a shm segment (docs/shm.md "Per-entry states"): the entry table with
// its hash chains, the exact LRU list of ready entries, the free-entry list, the counters in the
// header, and the client slots with their pins. Every call needs the segment lock held; none
// copies object bytes.

#include <cstdint>

#include "shm/blocks.hpp"
#include "shm/format.hpp"

namespace tier::cpu::shm {

class Index {
 public:
  explicit Index(const Tables& t) noexcept : t_(t), blocks_(t) {}

  // A kWriting or kReady entry holding `k`, or kNone (a fault recorded when the chain is corrupt).
  std::uint32_t find(const ObjectKey& k) const noexcept;
  std::uint32_t state(std::uint32_t i) const noexcept {
    return t_.entries[i].state.load(std::memory_order_relaxed);
  }
  const Entry& entry(std::uint32_t i) const noexcept { return t_.entries[i]; }
  // Whether entry `i`'s block count, image size and first block are in range; records a fault
  // otherwise.
  bool sane(std::uint32_t i) const;

  void hash_insert(std::uint32_t i) noexcept;
  void hash_unlink(std::uint32_t i) noexcept;
  void lru_push_front(std::uint32_t i) noexcept;
  void lru_unlink(std::uint32_t i) noexcept;
  // Refreshes the recency of a ready entry.
  void touch(std::uint32_t i) noexcept;

  // Whether `nblocks` blocks and an entry are free.
  bool has_room(std::uint32_t nblocks) const noexcept;
  // The least recently used ready entry that nobody reads and no lease holds at `now_ns`
  // (CLOCK_MONOTONIC), or kNone. Sets *skipped_lease when it passed over an entry leased by a
  // single client (whose lease ends early if that client is dead and reaped).
  std::uint32_t lru_victim(std::uint64_t now_ns, bool* skipped_lease) const noexcept;

  // Lookup leases: client `c` holds ready entry `i` against eviction until `deadline_ns`. A
  // lease another client holds at `now_ns` becomes shared (it then ends at the later deadline).
  void lease(std::uint32_t c, std::uint32_t i, std::uint64_t now_ns,
             std::uint64_t deadline_ns) noexcept;
  // Ends client `c`'s lease of entry `i` (holding `key`) when `c` is its only holder.
  void unlease(std::uint32_t c, std::uint32_t i, const ObjectKey& key) noexcept;
  // Takes a ready, unpinned entry out of the index for capacity, and frees it.
  void evict(std::uint32_t i) noexcept;

  // What a put reserved: entry `entry` in state kWriting, stamped `generation`, whose image goes
  // into the chain starting at `first_block`.
  struct Reservation {
    std::uint32_t entry = kNone;
    std::uint32_t first_block = kNone;
    std::uint64_t generation = 0;
  };
  // Reserves blocks and an entry for the image of `key` (has_room(nblocks) holds), owned by
  // client slot `owner`, visible to puts of the same key only. No reservation (entry kNone) when
  // the free lists are corrupt (a fault is recorded).
  Reservation reserve(const ObjectKey& key, std::uint64_t image_bytes, std::uint32_t nblocks,
                      std::uint32_t owner) noexcept;
  // Whether `r` is still reserved by client `owner` (a recovery may have released it).
  bool holds(const Reservation& r, std::uint32_t owner) const noexcept;
  // Makes a held reservation a ready object at the LRU head.
  void publish(const Reservation& r) noexcept;
  // Frees a held reservation; the object was never visible.
  void abandon(const Reservation& r) noexcept;

  // Frees an entry that is no longer in the hash nor the LRU list.
  void release_entry(std::uint32_t i) noexcept;
  // Takes a ready entry out of the index; frees it now, or when its last reader unpins.
  void retire_ready(std::uint32_t i) noexcept;

  // Records that client slot `c` copies ready entry `i` out: it is neither evicted nor reused
  // until unpin(c).
  void pin(std::uint32_t c, std::uint32_t i) noexcept;
  void unpin(std::uint32_t c) noexcept;
  // Takes a free client slot for process `pid` started at `start_time`; kNone when all are taken.
  std::uint32_t claim_client(std::int32_t pid, std::uint64_t start_time) noexcept;
  // Frees a client slot with the reservations (kWriting entries), the pin and the leases it
  // holds alone.
  void release_client(std::uint32_t c) noexcept;

  // The hash bucket of `k`.
  std::uint64_t bucket_of(const ObjectKey& k) const noexcept;

 private:
  // Whether link `i` (field `field` of `where` `slot`) is an entry index or kNone; records a fault
  // otherwise.
  bool link_ok(std::uint32_t i, const char* where, std::uint64_t slot, const char* field) const;

  Tables t_;
  Blocks blocks_;
};

}  // namespace tier::cpu::shm
