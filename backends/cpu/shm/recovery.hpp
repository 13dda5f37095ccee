#pragma once
// shm::Recovery: how a shm segment survives the death of any process at any instant (docs/shm.md
// "Concurrency and crash safety"):
//
//  - lock(): the segment's robust, process-shared mutex. When its holder died, the kernel hands
//    the next locker EOWNERDEAD; that locker rebuilds the index, reaps dead clients, and marks the
//    mutex consistent before carrying on.
//  - rebuild(): every derived structure (hash chains, LRU list, free lists, reader counts,
//    counters) recomputed from the sources of truth (the entry table, the block chains of live
//    entries, the client slots, the header's clock and generation). Also builds the empty index
//    of a new segment.
//  - reap_dead(): releases the reservations and pins of client slots whose process is gone.
//
// Threads: any number of processes, each through its own Recovery; the lock orders them.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "shm/format.hpp"
#include "shm/index.hpp"
#include "tier/status.hpp"

namespace tier::cpu::shm {

// The start time (clock ticks since boot, /proc/<pid>/stat field 22) of process `pid`; 0 when
// unreadable.
std::uint64_t process_start_time(std::int32_t pid);
// Whether the process that took a client slot still runs. A zombie counts as dead; a pid reused
// by another process is told apart by its start time.
bool process_alive(std::int32_t pid, std::uint64_t start_time);

class Recovery {
 public:
  // `segment` names the segment in messages.
  Recovery(const Tables& t, std::string segment) : t_(t), index_(t), segment_(std::move(segment)) {}

  // How long lock() waits for a holder that is alive.
  static constexpr std::chrono::seconds kLockPatience{10};

  // Takes the segment lock for client slot `me` (kNone before it has one); repairs the index when
  // the previous holder died. Returns: Ok, TimedOut (held for more than kLockPatience: a stopped
  // holder), TimedOut at once when the lock word is corrupt (it can never be taken).
  Status lock(std::uint32_t me) noexcept;
  void unlock() noexcept;

  // Releases the reservations and pins of client slots other than `me` whose process is gone;
  // returns how many were reaped. Lock held.
  std::uint64_t reap_dead(std::uint32_t me) noexcept;
  // Rebuilds every derived structure from the entry table and the client slots. Entries that do
  // not describe a well-formed, exclusively owned block chain are dropped; returns how many.
  // Lock held.
  std::uint64_t rebuild() noexcept;

 private:
  // Drops malformed entries and those whose chains overlap; returns the blocks the remaining
  // chains use (`used`) and how many entries were dropped.
  struct Chains {
    std::vector<bool> used;
    std::uint64_t dropped = 0;
  };
  Chains check_entries() noexcept;
  // Recounts every entry's readers from the client slots' pins (dropping stale pins); returns
  // how many client slots are in use.
  std::uint64_t recount_pins() noexcept;
  // Frees doomed entries nobody reads, rebuilds the hash chains, the free-entry list, the LRU
  // list and the entry counters.
  void relink_entries(std::vector<bool>& used) noexcept;
  // Rebuilds the free-block list from the blocks no chain uses.
  void relink_blocks(const std::vector<bool>& used) noexcept;

  Tables t_;
  Index index_;
  std::string segment_;
};

}  // namespace tier::cpu::shm
