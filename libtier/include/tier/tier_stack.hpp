#pragma once
// TierStack: the ordered tiers of a profile, fastest first, used as one cache.
//
//  - lookup_prefix: longest leading run of keys present in any readable tier.
//  - save: encode once, put into the first writable tier and wait for it; write through to the
//    other writable tiers in the background, with bounded in-flight bytes. A write-through that
//    does not fit is dropped and counted (the caller never stalls on lower tiers). When the only
//    writable tier takes gather puts and the codec's payload is the host regions' bytes
//    (Codec::direct, no framing), nothing is encoded: the tier copies a header and the caller's
//    regions (Capabilities::gather_puts).
//  - load: from the fastest readable tier that holds the key; verified; decoded; promoted into
//    faster writable tiers on hit (in the background, same bound). A tier with no writable tier
//    above it that takes scattered gets writes a direct payload (Codec::direct: the regions'
//    bytes after the codec's framing, checked by its PayloadCheck) straight into the caller's
//    regions, host or device memory, verified before the first byte is written
//    (Capabilities::scatter_gets; docs/object-format.md, "Direct payloads").
//  - lease: a lookup that will be followed by a load holds the keys it found against eviction
//    until it releases them or a bounded lease time passes (docs/leases.md).
//  - eviction: a tier that evicts for capacity hands the object to the stack, which demotes it
//    to the next writable tier (on_evict "demote") or drops it.
//
// Background work advances inside every call and in progress(), which an engine calls when it
// has no batch (idle progress).
//
// Threads: every method may be called from several threads at once, and their transfers run in
// parallel: encodes, decodes, checksums and the tiers' copies happen on the calling threads with
// no lock of the stack held. Only bookkeeping (request ids, the completions of requests in
// flight, background bounds, evicted objects waiting for demotion, leases, the image buffer pool)
// is under short locks. A tier that declares Capabilities::concurrent (the cpu tier's heap mode)
// is called by every thread at once; any other tier is called by one thread at a time, and a
// thread waiting for such a tier's completions holds it for one poll of at most 1 ms and then
// lets a thread that waits to enter in, so a lookup on one thread runs while a save on another
// waits for its put (the offload engine's scheduler looks up through a worker's stack while the
// worker saves). Completions are routed to the call that submitted them, whichever thread reaped
// them. Order between calls: a save that returned Ok is seen by every later lookup and load;
// two saves of one key at once store one of them whole (put-if-absent); LRU order is the order in
// which the tier's index was touched. tier() and the metrics read counters only.
//
// Metrics (docs/metrics.md): the tiers' counters, the stack's, each tier's usage as of the end of
// the last call, and the latency of saves, loads, puts and gets; all readable from any thread
// without a lock of the stack. A profile's "metrics" section starts an HTTP endpoint serving them
// (a thread of its own that reads those counters and never calls user code).
//
// The installed header carries no private state (pimpl): what the stack keeps is in
// libtier/src/tier_stack_impl.hpp.

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tier/backend.hpp"
#include "tier/codec.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"

namespace tier {

struct SaveItem {
  ObjectKey key;
  RegionList src;
};
struct LoadItem {
  ObjectKey key;
  RegionList dst;
  // The codec of this item; null: the one the load was called with. One call may then fetch
  // objects of several layouts together (an engine's PAGE chunks and their SLOT sidecar), their
  // transfers back to back. Must outlive the call.
  const Codec* codec = nullptr;
};
struct LoadResult {
  Status status;     // Ok, NotFound (no readable tier holds a valid copy), or the decode error
  int tier = -1;     // the tier that served it
};

// The operations timed by the stack (libtier_op_duration_seconds): a save and a load per item, from
// the start of the call to the item's result; a put and a get per request the stack submits to a
// tier, foreground or background, from its submit to its completion.
enum class StackOp : std::uint8_t { kSave = 0, kLoad = 1, kPut = 2, kGet = 3 };
inline constexpr std::size_t kStackOpCount = 4;
std::string_view stack_op_name(StackOp op) noexcept;

// Where an object is stored and how large it is (TierStack::stat).
struct ObjectStat {
  int tier = -1;                    // the fastest readable tier holding it; -1: not stored
  std::uint64_t payload_bytes = 0;  // its raw payload: what Codec::decode receives
  std::uint64_t stored_bytes = 0;   // its image in that tier, header and stage included
};

// Stack-level counters (tier-level ones live in each Backend's metrics).
struct StackCounters {
  Counter saves, saved_bytes, save_failures, loads, loaded_bytes, load_misses, decode_failures;
  Counter writethrough_dropped, demotions_dropped;
  // Payload bytes the stack copied through its own buffers beyond the one move into or out of
  // a tier: a save whose codec encoded into a stack image (not gathered from the caller's
  // regions by the tier), a load whose codec decoded out of one (not scattered into them). 0
  // for host regions on the cpu tier with a direct codec (identity, the C API's).
  Counter staging_copy_bytes;
  Json to_json() const;
};

class TierStack;
// One stack of a Prometheus exposition of several (the offload engine's, one per rank): its tiers
// are labelled `tier_prefix` + their names, and its stack-wide series carry `labels` (text such as
// `rank="0"`, or empty).
struct StackExposition {
  const TierStack* stack = nullptr;
  std::string tier_prefix;
  std::string labels;
};
// Prometheus text format 0.0.4 of every stack: the tiers' counters (tier/metrics.hpp), each
// tier's usage gauges, the stacks' counters and the op_duration histograms (docs/metrics.md).
// Reads counters only: any thread, without the stacks' locks.
std::string metrics_prometheus(std::span<const StackExposition> stacks);

// Memory for a TierStack's own image buffers: the image a get reads into when its tier cannot
// write the caller's regions itself (a disk tier's reads, then decoded into them), the image a
// save encodes into when its tier cannot gather the regions. The default is the heap. A GPU user
// gives page-locked memory (the GPU floor's gpu::page_locked_images(); the C API does so when
// device memory is registered): a disk tier then reads each image straight into memory the GPU
// copies by DMA, not through the runtime's copy of pageable memory (docs/integration.md, "The
// fast path").
// Threads: allocate() and free() are called from any number of threads at once.
class ImageMemory {
 public:
  virtual ~ImageMemory() = default;
  // `bytes` (a whole number of 4 KiB pages) starting on a page, or nullptr when it holds no such
  // range now (the stack then takes heap memory for that buffer).
  virtual std::byte* allocate(std::size_t bytes) noexcept = 0;
  // Gives back a range allocate() returned, with the same `bytes`.
  virtual void free(std::byte* p, std::size_t bytes) noexcept = 0;
};

class TierStack {
 public:
  static Result<std::unique_ptr<TierStack>> open(const Profile& profile,
                                                 Registry& registry = Registry::global());
  ~TierStack();

  // Where the stack's image buffers come from (ImageMemory above; null: the heap). Buffers made
  // from now on come from `memory`; the free buffers the stack keeps for reuse are dropped, and
  // those in use go back to where they came from when their request ends. Any thread, any time.
  void set_image_memory(std::shared_ptr<ImageMemory> memory);

  std::size_t tier_count() const noexcept;
  // Tier `i`'s backend, to read its usage and metrics. Submitting to it directly races the
  // stack's own calls unless it is concurrent or the stack is idle (tests plant objects so).
  Backend& tier(std::size_t i) noexcept;
  const TierSpec& spec(std::size_t i) const noexcept;
  int find_tier(std::string_view name) const;
  // Optional tiers left out because their backend cannot run here: "name: reason".
  const std::vector<std::string>& skipped_tiers() const noexcept;

  // The bytes a stored image of `payload_bytes` of raw payload takes in tier `i` (header
  // included, before any stage), for capacity planning.
  static std::uint64_t image_bytes(std::uint64_t payload_bytes) noexcept;

  // Longest prefix of `keys` present in a readable tier. Errors: only BadState/TimedOut.
  Result<std::size_t> lookup_prefix(std::span<const ObjectKey> keys);
  // Lookup leases (docs/leases.md): holds every key among `keys` that a readable tier stores,
  // in the fastest tier that stores it, against eviction for `ttl`. held[i] is set to 1 when
  // keys[i] is held; on a tier that cannot lease (Backend::lease NotSupported, e.g. Redis), when
  // it is merely present: best effort, counted in that tier's leases_unsupported. Returns the
  // stack's lease id (0: nothing to release). Errors: InvalidArgument (held.size() !=
  // keys.size()).
  Result<LeaseId> lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                        std::span<std::uint8_t> held);
  // Ends a stack lease in every tier that holds its keys. An id that ended already, or 0, is
  // ignored. Leases past their deadline are also ended by later lease() calls.
  void release(LeaseId id);
  // Stack leases not yet released nor swept.
  std::size_t active_leases();

  // Index of the fastest readable tier holding `key`, or -1.
  Result<int> locate(const ObjectKey& key);
  // out[i] for keys[i]: where it is stored and its sizes. A key's image is read only from a tier
  // that applies a stage (the payload's size is then in the stage's encoding); a key that tier
  // cannot read back has payload_bytes 0. Errors: InvalidArgument (out.size() != keys.size()).
  Status stat(std::span<const ObjectKey> keys, std::span<ObjectStat> out);

  // Saves every item with `codec`. out[i] is Ok (stored, or present already), or the error of
  // the first writable tier. `out.size()` must equal `items.size()`.
  Status save(std::span<const SaveItem> items, const Codec& codec, std::span<Status> out);
  // Loads every item with its own codec (LoadItem::codec), else with `codec`. out[i] says which
  // tier served it, or why it missed.
  Status load(std::span<const LoadItem> items, const Codec& codec, std::span<LoadResult> out);
  // Removes every key from every tier: each tier's removes go in batches, then one wait for them
  // all. out[i] is Ok only if no tier holds keys[i] afterwards; otherwise the error of the first
  // tier that failed (the key may still be stored there). `out.size()` must equal `keys.size()`.
  Status remove(std::span<const ObjectKey> keys, std::span<Status> out);
  // remove() of one key: Ok, or its out[0].
  Status remove(const ObjectKey& key);

  // Removes every object of namespace `ns` from every tier (an engine's clear: new weights make
  // all its cached KV stale). Lists each tier's keys of `ns` (Backend::list_keys) and removes
  // them as remove() does. Returns how many objects were removed; the first error of a tier that
  // cannot list (NotSupported) or whose removals failed, after trying every tier (objects of other
  // namespaces are never touched). Objects saved meanwhile by another thread may remain.
  Result<std::uint64_t> clear(const Key128& ns);

  // Advances background work without blocking.
  void progress();
  // Waits until background work is done or `timeout` passes. Errors: TimedOut.
  Status flush(std::chrono::milliseconds timeout);
  std::uint64_t background_bytes() const noexcept;

  StackCounters& counters() noexcept;
  const StackCounters& counters() const noexcept;
  std::vector<NamedMetrics> metrics() const;
  // Tier `i`'s usage (Backend::usage) as of the end of the last call into the stack.
  Usage usage(std::size_t i) const noexcept;
  // Latencies of `op` on tier `tier`; tier -1: none (a load that missed every tier, a save that
  // reached none).
  const Histogram& op_duration(StackOp op, int tier) const noexcept;
  Json metrics_json() const;
  std::string metrics_prometheus() const;
  // "host:port" of the metrics endpoint the profile started (the port chosen when it asked for
  // 0), or empty.
  const std::string& metrics_endpoint() const noexcept;

 private:
  class Impl;
  // Hidden: no private member of TierStack is exported from libtier.
  __attribute__((visibility("hidden"))) explicit TierStack(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tier
