#pragma once
// The records of a shm segment's raw allocation (docs/shm.md "Layout"), shared by the classes that
// make up ShmStore: shm::Segment lays them out and maps them, shm::Blocks copies images through
// the block chains, shm::Index keeps the hash, LRU and free lists, shm::Recovery repairs them after
// a death. All links are 32-bit indices (kNone = none), never pointers, so each process may map
// the segment at any address. Nothing read from the segment is trusted: the geometry is checked
// once when it is mapped and copied into this process (Tables), and every index, link, offset and
// size is checked against it before use (docs/shm.md "Corrupt segments").

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "shm/store.hpp"
#include "tier/key.hpp"

namespace tier::cpu::shm {

constexpr std::uint64_t kMagic = 0x314D48535245544Cull;  // "LTERSHM1"
constexpr std::uint32_t kVersion = 3;  // 2: mode and owner checked, corruptions counted; 3: leases
constexpr std::uint32_t kNone = 0xFFFFFFFFu;
constexpr std::uint32_t kSharedLease = 0xFFFFFFFEu;  // Entry::lease_client: several clients
// No lease is longer (the engine's lease_timeout_ms is at most an hour): a deadline further away
// than this is damage, and is ignored.
constexpr std::uint64_t kMaxLeaseNs = 3600ull * 1'000'000'000ull;
constexpr std::uint32_t kMaxClients = 256;
constexpr std::uint64_t kArenaAlign = 4096;
// The arena is mapped into each process a chunk at a time, on the chunk's first use there
// (Blocks): one system call per chunk instead of a page fault per page.
constexpr std::uint64_t kMapChunk = 2u << 20;

enum State : std::uint32_t { kFree = 0, kWriting = 1, kReady = 2, kDoomed = 3 };

struct Header {
  // Geometry, written once before the segment is published.
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t pad0;
  std::uint64_t block_bytes, blocks, max_entries, buckets;
  std::uint64_t clients_off, buckets_off, entries_off, next_off, arena_off, raw_bytes;
  pthread_mutex_t mutex;  // robust, process-shared; guards everything below and the tables
  // Sources of truth that are not per entry.
  std::uint64_t tick;        // LRU clock; entries record the tick of their last use
  std::uint64_t generation;  // stamped on each entry reservation
  // Derived (rebuilt by Recovery::rebuild after a lock-holder died).
  std::uint32_t free_block_head, free_entry_head, lru_head, lru_tail;
  std::atomic<std::uint64_t> free_blocks, used_bytes, image_bytes, objects, writing, doomed;
  // Statistics.
  std::atomic<std::uint64_t> clients, recoveries, reaped_clients;
  std::atomic<std::uint64_t> corruptions;  // corrupt fields met by an operation and repaired
};

struct Entry {
  std::atomic<std::uint32_t> state;  // written last when reserving, first when freeing
  std::uint32_t owner;               // client slot of the writer (kWriting)
  std::uint64_t generation;
  ObjectKey key;
  std::uint32_t nblocks;
  std::uint64_t image_bytes;
  std::uint32_t first_block;
  std::uint32_t readers;  // derived: client slots pinning this entry
  std::uint64_t tick;
  std::uint32_t hash_next, lru_prev, lru_next;  // derived
  // Lookup lease (docs/shm.md "Lookup leases"): not evicted before this CLOCK_MONOTONIC time in
  // ns (shared by every process of the host; 0: none), held by client slot `lease_client`, or by
  // several (kSharedLease: then it ends only at the deadline), or none (kNone).
  std::uint64_t lease_deadline_ns;
  std::uint32_t lease_client;
};

struct Client {
  std::atomic<std::uint32_t> in_use;
  std::int32_t pid;
  std::uint64_t start_time;
  std::uint32_t pinned;  // entry being copied out by a get, or kNone
  std::uint64_t pinned_generation;
};

// Where the checks of Index and Blocks record the first corrupt field they meet under the lock,
// in words: which field of which slot, its value and the range expected. Process-local, one per
// mapped segment; the store turns it into a ChecksumMismatch status and repairs the index.
struct FaultLog {
  std::string first;  // empty: none
  void note(std::string what) {
    if (first.empty()) first = std::move(what);
  }
};

// This process's view of the tables of a mapped raw allocation (which must stay mapped): pointers
// and the geometry, validated when the segment was mapped and never read from the segment again
// (another process may scribble over the header; this copy stays the bound for every check).
struct Tables {
  Header* h = nullptr;
  Client* clients = nullptr;
  std::uint32_t* buckets = nullptr;
  Entry* entries = nullptr;
  std::uint32_t* next = nullptr;  // per block: the next block of its chain
  std::byte* arena = nullptr;
  std::uint64_t block_bytes = 0, blocks = 0, max_entries = 0, buckets_n = 0;
  std::uint64_t bucket_mask = 0;
  FaultLog* faults = nullptr;  // owned by the Segment
  // Per kMapChunk of the arena: 1 once it is mapped into this process (process-local, owned by
  // the Segment; relaxed atomics: a chunk mapped twice costs time, never correctness).
  std::atomic<std::uint8_t>* mapped = nullptr;

  // The view of the raw allocation at `raw`, whose header holds the offsets (already validated).
  static Tables bind(std::byte* raw, FaultLog* faults,
                     std::atomic<std::uint8_t>* mapped = nullptr) noexcept {
    Tables t;
    t.h = reinterpret_cast<Header*>(raw);
    t.clients = reinterpret_cast<Client*>(raw + t.h->clients_off);
    t.buckets = reinterpret_cast<std::uint32_t*>(raw + t.h->buckets_off);
    t.entries = reinterpret_cast<Entry*>(raw + t.h->entries_off);
    t.next = reinterpret_cast<std::uint32_t*>(raw + t.h->next_off);
    t.arena = raw + t.h->arena_off;
    t.block_bytes = t.h->block_bytes;
    t.blocks = t.h->blocks;
    t.max_entries = t.h->max_entries;
    t.buckets_n = t.h->buckets;
    t.bucket_mask = t.h->buckets - 1;
    t.faults = faults;
    t.mapped = mapped;
    return t;
  }

  bool entry_ok(std::uint64_t i) const noexcept { return i < max_entries; }
  bool block_ok(std::uint64_t b) const noexcept { return b < blocks; }
  // Records a corrupt field (the first one met counts).
  void fault(std::string what) const { faults->note(std::move(what)); }
  bool faulted() const noexcept { return !faults->first.empty(); }
};

// Calls the test hook (testing::set_crash_hook) at `p`, when one is installed.
void crash_point(ShmCrashPoint p);
bool crash_hook_installed() noexcept;

}  // namespace tier::cpu::shm
