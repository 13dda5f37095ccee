#pragma once
// shm::Segment: a shm segment's name, creation and mapping (docs/shm.md "Layout" and
// "Publication by rename"). Boost.Interprocess's managed_shared_memory creates and maps the
// segment; it holds one named object, the anchor, that locates one raw allocation laid out by
// libtier (header, client slots, hash buckets, entries, block links, page-aligned arena). A new
// segment is created and initialized under a private name and published by an atomic no-replace
// rename, so a process opens a complete segment or none; Boost's own (non-robust) locks are never
// taken after that.
//
// Throws nothing: Boost's exceptions become IoError. Threads: one owner thread.

#include <boost/interprocess/managed_shared_memory.hpp>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "shm_format.hpp"
#include "shm_store.hpp"
#include "tier/status.hpp"

namespace tier::cpu::shm {

class Segment {
 public:
  // Maps the segment `cfg.segment`, creating it with `cfg`'s geometry when it does not exist
  // (and, with `cfg.prefault`, populating or mapping every page of its arena).
  // Returns: InvalidArgument (bad config, geometry mismatch, not a libtier segment), NoSpace,
  // IoError.
  static Result<Segment> open(const ShmConfig& cfg);
  // Maps an existing segment with whatever geometry it has. Returns: InvalidArgument, NotFound,
  // IoError.
  static Result<Segment> attach(const std::string& name);
  // Removes the name (and leftovers of interrupted creations). Returns: Ok, InvalidArgument,
  // NotFound.
  static Status remove(const std::string& name);

  const std::string& name() const noexcept { return name_; }
  const Tables& tables() const noexcept { return t_; }
  // This process's mapping of the whole segment.
  std::span<std::byte> mapping() const noexcept;
  // Counters read without the lock (each one is consistent; together they are approximate).
  ShmStats stats() const noexcept;

 private:
  explicit Segment(std::string name) : name_(std::move(name)) {}
  // Maps the existing segment `name_` and checks its anchor. Throws Boost's exceptions.
  Status map_existing();
  // Creates, initializes and publishes the segment; false (cleaned up) when another process
  // published one first.
  Result<bool> create(const ShmConfig& cfg);
  Status check_geometry(const ShmConfig& cfg) const;
  // Allocates (when `fresh`) and maps every page of the arena in this process.
  void prefault(bool fresh);

  std::string name_;
  std::unique_ptr<boost::interprocess::managed_shared_memory> seg_;
  Tables t_;
};

}  // namespace tier::cpu::shm
