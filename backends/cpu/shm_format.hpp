#pragma once
// The records of a shm segment's raw allocation (docs/shm.md "Layout"), shared by the classes that
// make up ShmStore: shm::Segment lays them out and maps them, shm::Blocks copies images through
// the block chains, shm::Index keeps the hash, LRU and free lists, shm::Recovery repairs them after
// a death. All links are 32-bit indices (kNone = none), never pointers, so each process may map
// the segment at any address.

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "shm_store.hpp"
#include "tier/key.hpp"

namespace tier::cpu::shm {

constexpr std::uint64_t kMagic = 0x314D48535245544Cull;  // "LTERSHM1"
constexpr std::uint32_t kVersion = 2;                    // 2: entries carry a lookup lease
constexpr std::uint32_t kNone = 0xFFFFFFFFu;
constexpr std::uint32_t kSharedLease = 0xFFFFFFFEu;  // Entry::lease_client: several clients
// No lease is longer (the engine's lease_timeout_ms is at most an hour): a deadline further away
// than this is damage, and is ignored.
constexpr std::uint64_t kMaxLeaseNs = 3600ull * 1'000'000'000ull;
constexpr std::uint32_t kMaxClients = 256;
constexpr std::uint64_t kArenaAlign = 4096;

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

// This process's view of the tables of a mapped raw allocation (which must stay mapped).
struct Tables {
  Header* h = nullptr;
  Client* clients = nullptr;
  std::uint32_t* buckets = nullptr;
  Entry* entries = nullptr;
  std::uint32_t* next = nullptr;  // per block: the next block of its chain
  std::byte* arena = nullptr;
  std::uint64_t bucket_mask = 0;

  // The view of the raw allocation at `raw`, whose header holds the offsets.
  static Tables bind(std::byte* raw) noexcept {
    Tables t;
    t.h = reinterpret_cast<Header*>(raw);
    t.clients = reinterpret_cast<Client*>(raw + t.h->clients_off);
    t.buckets = reinterpret_cast<std::uint32_t*>(raw + t.h->buckets_off);
    t.entries = reinterpret_cast<Entry*>(raw + t.h->entries_off);
    t.next = reinterpret_cast<std::uint32_t*>(raw + t.h->next_off);
    t.arena = raw + t.h->arena_off;
    t.bucket_mask = t.h->buckets - 1;
    return t;
  }
};

// Calls the test hook (testing::set_crash_hook) at `p`, when one is installed.
void crash_point(ShmCrashPoint p);
bool crash_hook_installed() noexcept;

}  // namespace tier::cpu::shm
