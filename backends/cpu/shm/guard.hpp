#pragma once
// shm::MappingGuard: a segment mapping that another process may truncate without killing this one
// (docs/security.md "Shared-memory segments").
//
// Any process that may write a segment's file (its owner's other processes; every local user for
// segment_mode 0666) can ftruncate it, and each access of a page past the new end then raises
// SIGBUS in every process that maps it. A guarded mapping is registered in a process-wide table
// read by a SIGBUS handler that libtier installs on first use. For a fault inside a registered
// mapping the handler replaces the whole mapping with private zero pages (mmap MAP_FIXED, one
// system call, no lock and no allocation) and marks it lost, then returns: the faulting access
// and every later one complete on memory the other process cannot touch. The mapping's users
// check lost() around their operations and fail with IoError: nothing read after the fault is
// served (the zeros also fail every object check), nothing written after it is reported stored.
// A SIGBUS outside every registered mapping, or one sent by kill(), goes to the handler that was
// installed before (or takes the default action), as if libtier had installed none.
//
// A program that installs its own SIGBUS handler after libtier replaces this one; the guard is
// then gone and a truncation kills the process as before. Threads: any; the table has room for
// kMaxGuarded mappings, and a mapping that finds it full is unguarded (guarded() false).

#include <cstddef>

namespace tier::cpu::shm {

class MappingGuard {
 public:
  static constexpr int kMaxGuarded = 256;

  MappingGuard() = default;
  // Registers [base, base + bytes).
  MappingGuard(void* base, std::size_t bytes) noexcept;
  MappingGuard(MappingGuard&& o) noexcept;
  MappingGuard& operator=(MappingGuard&& o) noexcept;
  MappingGuard(const MappingGuard&) = delete;
  ~MappingGuard() { reset(); }
  // Unregisters; call before the mapping is unmapped.
  void reset() noexcept;

  bool guarded() const noexcept { return slot_ >= 0; }
  // A SIGBUS hit the mapping: it now holds private zero pages, not the segment.
  bool lost() const noexcept;

 private:
  int slot_ = -1;
};

}  // namespace tier::cpu::shm
