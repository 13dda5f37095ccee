#pragma once
// shm::Segment: a shm segment's name, creation and mapping (docs/shm.md "Layout", "Publication by
// rename" and "Who may open a segment"). Boost.Interprocess's managed_shared_memory creates the
// segment; it holds one named object, the anchor, that locates one raw allocation laid out by
// libtier (header, client slots, hash buckets, entries, block links, page-aligned arena). A new
// segment is created private (0600, then the configured mode), its memory is reserved in its file
// system (fallocate: a full /dev/shm is an error here, never a SIGBUS later), it is initialized
// under a private name and published by an atomic no-replace rename, so a process opens a
// complete segment or none. Processes that start together do not each reserve one: a creation
// lock lets one create it while the others wait and then map it.
//
// Opening never trusts the file: it is opened without following symbolic links, refused when
// another user owns it (unless both sides asked for the same sharing mode) or when its bits are
// wider than asked, mapped by this process (not through Boost, whose own header is not checked),
// and its header is found and checked (magic, version, geometry, every table inside the file)
// before anything is bound. A file that is not recognisably a libtier segment is refused, never
// reinitialized.
//
// Throws nothing: Boost's exceptions become IoError. Threads: one owner thread; with
// ShmPrefault::kBackground the segment also runs a mapping thread of its own, which touches
// nothing but page tables and the process-local chunk bitmap, and which the destructor stops
// and joins before unmapping.

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include "shm/format.hpp"
#include "shm/guard.hpp"
#include "shm/store.hpp"
#include "tier/status.hpp"

namespace tier::cpu::shm {

class Segment {
 public:
  // Maps the segment `cfg.segment`, creating it with `cfg`'s geometry and mode when it does not
  // exist, then maps its arena as `cfg.prefault` says. One process at a time
  // creates it (a creation lock); the others wait for it (at most cfg.creation_wait) and map it.
  // Returns: InvalidArgument (bad config, geometry mismatch, not a libtier segment, owned by
  // another user, mode wider than asked), NoSpace (the file system cannot hold it), TimedOut
  // (another process kept creating it too long), IoError.
  static Result<Segment> open(const ShmConfig& cfg);
  // Maps an existing segment of this user with whatever geometry it has. Returns:
  // InvalidArgument, NotFound, NoSpace, IoError.
  static Result<Segment> attach(const std::string& name);
  // Removes the name (and leftovers of interrupted creations). Returns: Ok, InvalidArgument,
  // NotFound.
  static Status remove(const std::string& name);

  Segment(Segment&& o) noexcept;
  Segment& operator=(Segment&&) = delete;
  Segment(const Segment&) = delete;
  ~Segment();

  const std::string& name() const noexcept { return name_; }
  const Tables& tables() const noexcept { return t_; }
  // This process's mapping of the whole segment.
  std::span<std::byte> mapping() const noexcept { return {base_, bytes_}; }
  // Counters read without the lock (each one is consistent; together they are approximate).
  ShmStats stats() const noexcept;
  // Ok, or IoError when another process truncated the segment under this mapping (a SIGBUS met
  // it, shm/guard.hpp): the mapping then holds private zeros and every operation must fail.
  Status intact() const;

 private:
  explicit Segment(std::string name);
  // Opens, checks and maps the existing segment `name_`; `cfg` null: attach (this user's only).
  // Returns NotFound only when there is no such name.
  Status map_existing(const ShmConfig* cfg);
  // Creates, initializes and publishes the segment; false (cleaned up) when another process
  // published one first.
  Result<bool> create(const ShmConfig& cfg);
  Status check_geometry(const ShmConfig& cfg) const;
  // Maps every page of the arena in this process (keeping the bytes): now, or (`background`) on
  // the idle-priority thread mapper_, chunk by chunk, until done or stopped.
  void prefault(bool background);

  std::string name_;
  std::unique_ptr<FaultLog> faults_;
  std::unique_ptr<std::atomic<std::uint8_t>[]> mapped_;  // Tables::mapped
  std::uint64_t mapped_chunks_ = 0;
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  MappingGuard guard_;  // of [base_, base_ + bytes_)
  Tables t_;
  std::jthread mapper_;  // ShmPrefault::kBackground; refers to the mapping and mapped_ only
};

}  // namespace tier::cpu::shm
