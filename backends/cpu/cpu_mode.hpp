#pragma once
// CpuMode: where the CPU tier's objects live, one class per mode, behind the one "cpu" backend
// (cpu_backend.hpp), which turns requests into these calls and their results into completions:
//
//  - HeapMode (heap_mode.hpp): this process's heap, exact LRU;
//  - PinnedHeapMode (pinned_heap_mode.hpp; GPU builds): one page-locked arena, exact LRU;
//  - ShmMode (shm/mode.hpp; builds with Boost.Interprocess): a named shared-memory segment,
//    optionally registered as page-locked memory.
// make_cpu_mode() (cpu_mode_factory.cpp) picks one from the options; it is the only place that
// knows which modes this build has.
//
// Images are host bytes the mode copies in and out itself, or, for memory the CPU cannot address
// (device memory in a pinned mode), pieces: the stored image's bytes in this process, handed to a
// caller's function while the object is reserved (put) or held (get), so nothing else sees or
// reuses them meanwhile.
//
// Errors: Status codes as Backend documents per op; nothing throws. Threads: one at a time,
// unless concurrent() says the mode takes calls from several threads at once (HeapMode).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "tier/backend.hpp"
#include "tier/object.hpp"

namespace tier::cpu {

class DeviceTransfer;

// A contiguous host byte range of a stored image; an image is a list of pieces in image order.
using Piece = std::span<std::byte>;

class CpuMode {
 public:
  // Called for each object evicted for capacity: its image when the mode still has it (heap), or
  // an empty span (shm: keys only), and its size.
  using EvictFn =
      std::function<void(const ObjectKey&, std::span<const std::byte>, std::uint64_t image_bytes)>;
  // Fills (put) or drains (get) the pieces of one image; its status is the operation's.
  using PiecesFn = std::function<Status(std::span<const Piece>)>;

  // A put's or get's status with the image bytes its completion reports.
  struct Outcome {
    Status status;
    std::uint64_t bytes = 0;
    // A put given no EvictFn that would have had to evict: nothing was done (status NoSpace);
    // the caller makes it again with one.
    bool deferred = false;
  };

  virtual ~CpuMode() = default;

  // Put-if-absent of a host image, copied in with `stores` (tier/object.hpp). Returns: Ok,
  // AlreadyExists, NoSpace, BadState. An empty `on_evict` (a concurrent mode's puts on the
  // verification threads, which must not report evictions) makes a put that needs room deferred.
  virtual Outcome put(const ObjectKey& key, std::span<const std::byte> image, Stores stores,
                      const EvictFn& on_evict) = 0;
  // A put of `image_bytes` whose bytes `fill` writes (and checks) into the reserved pieces; when
  // fill fails nothing is stored and its status is returned. `on_evict` as for put().
  virtual Outcome put_with(const ObjectKey& key, std::uint64_t image_bytes, const PiecesFn& fill,
                           const EvictFn& on_evict) = 0;
  // Evicts least recently used objects (reported through `on_evict`, on this thread) until the
  // images of those `keys` that are not stored yet (`image_bytes[i]` each) fit beside what is,
  // so that their puts, made next on other threads without an EvictFn, find room. Only for a
  // concurrent mode (the default does nothing).
  virtual void make_room_for(std::span<const ObjectKey> keys,
                             std::span<const std::uint64_t> image_bytes, const EvictFn& on_evict) {
    (void)keys, (void)image_bytes, (void)on_evict;
  }
  // Makes those of `keys` that are stored the most recently used, in order (the last one most):
  // the recency that puts or gets of them one after the other leave, after they ran on several
  // threads at once. Only for a concurrent mode (the default does nothing).
  virtual void refresh(std::span<const ObjectKey> keys) { (void)keys; }
  // Copies the image into `out`, verified (copy_verified), with `stores`. Returns: Ok, NotFound,
  // InvalidArgument (out too small; `bytes` = the size needed), ChecksumMismatch, BadState.
  virtual Outcome get(const ObjectKey& key, std::span<std::byte> out, Stores stores) = 0;
  // A get into a destination of `capacity` bytes that `drain` copies the pieces into; `drain`
  // verifies them, and its status is the result's.
  virtual Outcome get_with(const ObjectKey& key, std::uint64_t capacity, const PiecesFn& drain) = 0;
  // The image size of a stored object; does not refresh recency. Returns: NotFound, BadState.
  virtual Result<std::uint64_t> contains(const ObjectKey& key) = 0;
  // Returns: Ok, NotFound, BadState.
  virtual Status remove(const ObjectKey& key) = 0;

  // Lookup leases (Backend::lease, docs/leases.md): held[i] = 1 for each stored key now held
  // against eviction for `ttl`. Returns the lease id (0: nothing held), BadState. Leases that
  // reach their deadline unreleased are added to `expiries` (the tier's lease_expiries).
  virtual Result<LeaseId> lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                                std::span<std::uint8_t> held, Counter& expiries) = 0;
  virtual LeaseEnd release_lease(LeaseId id, Counter& expiries) = 0;
  // The keys of namespace `ns` stored and visible now (Backend::list_keys). Returns: BadState.
  virtual Result<std::vector<ObjectKey>> list_keys(const Key128& ns) = 0;

  virtual Usage usage() const noexcept = 0;
  // Whether other processes share the objects and they outlive this one (shm).
  virtual bool shared() const noexcept = 0;
  virtual std::string describe(std::string_view tier_name) const = 0;
  // The device path of a pinned mode (requests whose buffer is device memory), or nullptr.
  virtual DeviceTransfer* device() noexcept = 0;
  // Whether every call above may run on several threads at once, copies in parallel (the tier
  // then declares Capabilities::concurrent). False, the default: one thread at a time.
  virtual bool concurrent() const noexcept { return false; }
};

// The mode the options ask for ("mode", "pinned"; the capacity is > 0). Returns: NotSupported
// when this build or machine lacks it, or the mode's own creation errors.
Result<std::unique_ptr<CpuMode>> make_cpu_mode(const BackendContext& ctx);

}  // namespace tier::cpu
