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
// Threads: every method may be called from several threads at once. An internal mutex
// serialises the calls and every call into a Backend (so each backend still sees one thread at a
// time, its contract), and a call that waits for a tier's completions hands the mutex to any
// thread waiting to enter between two polls: a lookup on one thread runs while a save on another
// waits for its put (the offload engine's scheduler looks up through a worker's stack while the
// worker saves). A call still waits while another thread encodes, decodes or polls a tier once
// (bounded by the poll slice, 10 ms at most). tier() and the metrics read counters only.
//
// Metrics (docs/metrics.md): the tiers' counters, the stack's, each tier's usage as of the end of
// the last call, and the latency of saves, loads, puts and gets; all readable from any thread
// without the stack's lock. A profile's "metrics" section starts an HTTP endpoint serving them
// (a thread of its own that reads those counters and never calls user code).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
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

class TierStack {
 public:
  static Result<std::unique_ptr<TierStack>> open(const Profile& profile,
                                                 Registry& registry = Registry::global());
  ~TierStack();

  std::size_t tier_count() const noexcept { return tiers_.size(); }
  Backend& tier(std::size_t i) noexcept { return *tiers_[i].backend; }
  const TierSpec& spec(std::size_t i) const noexcept { return tiers_[i].spec; }
  int find_tier(std::string_view name) const;
  // Optional tiers left out because their backend cannot run here: "name: reason".
  const std::vector<std::string>& skipped_tiers() const noexcept { return skipped_; }

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
  // Loads every item with `codec`. out[i] says which tier served it, or why it missed.
  Status load(std::span<const LoadItem> items, const Codec& codec, std::span<LoadResult> out);
  // Removes `key` from every tier. Ok only if no tier holds it afterwards; otherwise the error
  // of a tier that failed (the key may still be stored there).
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
  std::uint64_t background_bytes() const noexcept { return bg_bytes_.load(); }

  StackCounters& counters() noexcept { return counters_; }
  const StackCounters& counters() const noexcept { return counters_; }
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
  class EvictSink;  // per-tier EvictionHandler forwarding to on_evict
  class MetricsServer;  // the profile's HTTP endpoint (libtier/src/metrics_http.cpp)
  struct MetricsServerStop {  // stops and joins its thread
    void operator()(MetricsServer* s) const noexcept;
  };
  struct TierGauges {   // usage(i), published by note_usage()
    std::atomic<std::uint64_t> capacity_bytes{0}, used_bytes{0}, objects{0};
  };
  // Uninitialized bytes, recycled through pool_ so steady-state saves and loads neither zero
  // nor fault in fresh memory. They start on a page and the allocation is padded to whole pages
  // (the padding zeroed), so that the region handed to a tier can be rounded up to its
  // io_alignment (at most a page: O_DIRECT tiers); see io_region().
  class Buffer {
   public:
    static constexpr std::size_t kPage = 4096;
    explicit Buffer(std::size_t bytes);
    std::byte* data() noexcept { return data_.get(); }
    std::size_t size() const noexcept { return size_; }
    std::size_t capacity() const noexcept { return cap_; }
    void resize(std::size_t n) noexcept { size_ = n; }  // n <= capacity()
    std::span<std::byte> span() noexcept { return {data_.get(), size_}; }

   private:
    struct Free {
      void operator()(std::byte* p) const noexcept;
    };
    std::unique_ptr<std::byte[], Free> data_;
    std::size_t size_, cap_;
  };
  using Image = std::shared_ptr<Buffer>;
  struct Tier {
    TierSpec spec;
    std::unique_ptr<EvictSink> sink;
    PluginPtr<Backend> backend;
    PluginPtr<StageCodec> stage;  // null: raw
    int demote_to = -1;           // next writable tier, or -1
  };
  struct Pending {  // a request the stack submitted and has not reaped
    int tier = -1;
    Op op = Op::kGet;
    bool background = false;  // reaped by progress(); nobody waits for it
    Image image;              // the bytes the request reads or writes
    std::uint64_t charged = 0;  // bytes counted against max_inflight_bytes
    Completion done;
    bool finished = false;
    std::chrono::steady_clock::time_point submitted, reaped;  // for op_duration
  };

  explicit TierStack(const Profile& profile);
  // Takes mu_ for a public call, counted in entering_ so that a waiting call hands it over.
  class Entry {
   public:
    explicit Entry(TierStack& s);
    ~Entry();  // publishes the tiers' usage, then releases mu_
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;

   private:
    TierStack& stack_;
  };
  void lock_counted();
  // Called with mu_ held, between two polls of a wait: when another thread waits to enter,
  // releases mu_ until one such thread got in, then takes it back.
  void let_others_in();
  void on_evict(int tier, const ObjectKey& key, std::span<const std::byte> image) noexcept;
  // Metrics hooks: every tier's usage into gauges_ (with mu_ held), and one latency.
  void note_usage() noexcept;
  void note_duration(StackOp op, int tier, std::chrono::steady_clock::time_point start,
                     std::chrono::steady_clock::time_point end) noexcept;
  // Makes gauges_ and durations_ for tiers_ and starts the profile's metrics endpoint.
  Status start_metrics(const Profile& profile);
  // Starts metrics_server_ and sets metrics_endpoint_. Errors: IoError (cannot listen),
  // NotSupported (built without the endpoint).
  Status start_endpoint(const MetricsEndpoint& endpoint);

  Image acquire(std::size_t bytes);
  // The region tier `t` reads or writes for `image`: its bytes, rounded up to the tier's
  // io_alignment (the image header gives the exact size).
  Region io_region(int t, Buffer& image) const;
  // Returns an image nobody else holds to the pool.
  void recycle(Image& image) noexcept;
  // Builds the image tier `t` stores from a raw payload (stage applied, header sealed).
  Result<Image> make_image(int t, const ObjectKey& key, std::uint32_t format_id,
                           std::span<const std::byte> raw);
  struct RawPayload {
    std::span<const std::byte> bytes;  // into the image, or into `holder`
    std::uint32_t format_id = 0;       // the image header's
    Image holder;                      // the decoded bytes when the tier has a stage; else null
  };
  // The raw payload of a verified image read from tier `t` (stage undone).
  Result<RawPayload> raw_payload(int t, std::span<const std::byte> image);
  // Encodes `item` once, submits its put to tier `first` (id: the request, or out: why none)
  // and queues the write-through to the other writable tiers.
  void save_one(int first, const SaveItem& item, const Codec& codec, std::uint64_t& id,
                Status& out);
  // save_one for a first tier that takes gather puts: a header, then item.src as the payload.
  void save_gathered(int first, const SaveItem& item, const Codec& codec, std::uint64_t& id,
                     Status& out);
  // Takes the finished get `id` (0: none was submitted) of `item` from tier `t` and serves it
  // from `buf` into item.dst (null `buf`: a scattered get, already in item.dst): out and
  // unserved say whether it was served, or why not; a served item's latency counts from `start`.
  void serve_get(int t, const LoadItem& item, const Codec& codec, std::uint64_t id, Image& buf,
                 LoadResult& out, char& unserved, std::chrono::steady_clock::time_point start);
  // InvalidArgument naming the sizes: tier `t` holds an image of `image_bytes` for `item`, which
  // its regions cannot take.
  Status wrong_size(int t, const LoadItem& item, const Codec& codec,
                    std::size_t image_bytes) const;
  // Decodes `image`, read from tier `t` for `item`, into item.dst and promotes its payload into
  // the faster writable tiers. Returns: Ok, or why the image cannot be served (a copy that
  // fails its checks is removed from tier `t`).
  Status serve_load(int t, const LoadItem& item, const Codec& codec,
                    std::span<const std::byte> image);
  // Queues background puts of a raw payload read from tier `t` into the writable tiers above it.
  void promote(int t, const ObjectKey& key, std::uint32_t format_id,
               std::span<const std::byte> raw);
  // Largest image tier `t` may hold for `raw_bytes` of payload.
  std::size_t max_image_bytes(int t, std::size_t raw_bytes) const;
  // Queues a background put; drops it (counted) when the in-flight bound would be exceeded.
  void put_background(int t, const ObjectKey& key, Image image, bool demotion);
  // Queues a background remove of `key` from tier `t` (a corrupt copy); nobody waits for it.
  void remove_background(int t, const ObjectKey& key);
  // Submits one request. Returns its id (never 0), or why the tier refused it (TimedOut: its
  // queue stayed full).
  Result<std::uint64_t> submit_one(int t, Op op, const ObjectKey& key, Region buf, Pending p,
                                   RegionList tail = {}, std::size_t skip = 0,
                                   const PayloadCheck* check = nullptr);
  void reap(int t, std::size_t min, std::chrono::microseconds wait);
  void drain_evictions();
  // Waits for foreground ids; on timeout they turn into background requests (TimedOut).
  void wait_for(const std::vector<std::uint64_t>& ids);
  // The completion of `id`, and (when `reaped` is given) when it was reaped.
  Completion take(std::uint64_t id, std::chrono::steady_clock::time_point* reaped = nullptr);

  std::vector<Tier> tiers_;
  std::vector<std::string> skipped_;
  std::uint64_t max_inflight_bytes_;
  std::chrono::microseconds op_timeout_;
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::unordered_set<std::uint64_t> timed_out_;  // foreground ids given up on
  std::uint64_t next_id_ = 1;
  std::atomic<std::uint64_t> bg_bytes_{0};
  std::size_t bg_count_ = 0;
  std::vector<std::pair<int, std::pair<ObjectKey, Image>>> evicted_;
  std::vector<Buffer> pool_;  // recycled image buffers
  std::uint64_t pool_bytes_ = 0;
  struct StackLease {
    std::chrono::steady_clock::time_point deadline;
    std::vector<std::pair<int, LeaseId>> parts;  // (tier, the tier's lease id)
  };
  std::unordered_map<LeaseId, StackLease> leases_;
  LeaseId next_lease_ = 1;
  StackCounters counters_;
  std::unique_ptr<TierGauges[]> gauges_;   // one per tier
  std::unique_ptr<Histogram[]> durations_;  // [op * (tiers + 1) + tier + 1]
  std::unique_ptr<MetricsServer, MetricsServerStop> metrics_server_;
  std::string metrics_endpoint_;
  std::mutex mu_;  // everything above but the metrics, and every call into a backend
  std::atomic<int> entering_{0};           // threads blocked taking mu_
  std::atomic<std::uint64_t> entries_{0};  // times mu_ was taken through lock_counted()
};

}  // namespace tier
