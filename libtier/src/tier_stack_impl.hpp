#pragma once
// TierStack::Impl: everything the stack keeps (private to the core; libtier/src/tier_stack.cpp,
// libtier/src/stack_stat.cpp, libtier/src/stack_metrics.cpp and libtier/src/metrics_http.cpp
// define its members). None of it is part of libtier's exported symbols.

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "image_pool.hpp"
#include "tier/object.hpp"
#include "tier/tier_stack.hpp"

namespace tier {

namespace detail {

// The longest a waiting poll lasts: the whole wait of a tier that is called by every thread at
// once, and the hold of a tier that is called by one thread at a time (a thread that waits to
// enter it gets in after at most this).
constexpr auto kConcurrentSlice = std::chrono::microseconds(10'000);
constexpr auto kGatedSlice = std::chrono::microseconds(1'000);
// Scattered gets of one load submitted to a tier together, at most; they go as soon as their
// payloads reach kScatterSubmitBytes, so the first transfer does not wait for the host's work on
// the load's later items. Measured on the H200 (a 16k-token DSV4 restore, 16 gets of 5.8 MiB
// into device memory from a pinned tier): with every get of the load in one submit, the first
// DMA started 68-82 us after the load began; 4 MiB gathers a pinned tier's batch (its
// kPluggedBatchBytes) in one submit.
constexpr std::size_t kScatterBatch = 64;
constexpr std::uint64_t kScatterSubmitBytes = 4u << 20;
// A save's gathered puts submitted together (at most kScatterBatch) to a tier that does not seal
// them: until their payloads reach this, so that the first one hashed is still in the core's
// cache (L2) when the tier copies it. A tier that seals them hashes as it copies: its puts go in
// submits of kScatterSubmitBytes (tierbench micro --stack, 256 puts of 64 KiB on the cpu tier,
// 2026-12-04, 4 runs: the stack's saves went from 0.955-0.994x to 0.979-1.006x of the tier's own).
constexpr std::uint64_t kGatherSubmitBytes = 256u << 10;
// Completions taken under one lock (take_all), at most; their images go back to the pool after
// it, from a fixed array.
constexpr std::size_t kTakeChunk = 64;

// Serialises the calls into a backend that is not concurrent. A thread that waits for the
// backend's completions enters for one poll at a time and, when another thread waits to enter,
// lets one in before it enters again (std::mutex alone would let it take the lock back at once).
class Gate {
 public:
  void enter() {
    entering_.fetch_add(1);
    mu_.lock();
    entering_.fetch_sub(1);
    entries_.fetch_add(1);
  }
  void leave() { mu_.unlock(); }
  // leave(), then, when another thread waits to enter, returns once one such thread got in.
  void leave_and_let_in() {
    const std::uint64_t seen = entries_.load();
    mu_.unlock();
    while (entering_.load() > 0 && entries_.load() == seen) std::this_thread::yield();
  }

 private:
  std::mutex mu_;
  std::atomic<int> entering_{0};           // threads blocked in enter()
  std::atomic<std::uint64_t> entries_{0};  // times enter() got in
};

}  // namespace detail

// Everything the stack keeps. Hidden: none of it is part of libtier's exported symbols.
class __attribute__((visibility("hidden"))) TierStack::Impl {
 public:
  using Clock = std::chrono::steady_clock;
  using Image = detail::Image;
  using ImageBuffer = detail::ImageBuffer;
  using Gate = detail::Gate;

  explicit Impl(const Profile& profile)
      : max_inflight_bytes_(profile.max_inflight_bytes),
        op_timeout_(std::chrono::microseconds(profile.op_timeout_us)),
        pool_(profile.max_inflight_bytes) {}
  ~Impl();

  Status open(const Profile& profile, Registry& registry);

  Result<std::size_t> lookup_prefix(std::span<const ObjectKey> keys);
  Result<LeaseId> lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                        std::span<std::uint8_t> held);
  void release(LeaseId id);
  std::size_t active_leases();
  Result<int> locate(const ObjectKey& key);
  Status save(std::span<const SaveItem> items, const Codec& codec, std::span<Status> out);
  Status load(std::span<const LoadItem> items, const Codec& codec, std::span<LoadResult> out);
  Status remove(std::span<const ObjectKey> keys, std::span<Status> out);
  Result<std::uint64_t> clear(const Key128& ns);
  Status stat(std::span<const ObjectKey> keys, std::span<ObjectStat> out);
  void progress();
  Status flush(std::chrono::milliseconds timeout);

  // Metrics (libtier/src/stack_metrics.cpp). Makes gauges_ and durations_ for tiers_ and starts
  // the profile's metrics endpoint, which renders `self`'s metrics.
  Status start_metrics(const Profile& profile, const TierStack& self);
  // Every tier's usage into gauges_ (each backend called inside its gate when not concurrent).
  void note_usage() noexcept;
  // `n` requests of `op` on `tier` (-1: the stack) that took `d` each.
  void note_duration(StackOp op, int tier, Clock::duration d, std::uint64_t n = 1) noexcept;
  // Durations noted in a row, made one observation while op, tier and duration repeat (the
  // requests of a batch share their start and, reaped together, their end): not two atomic adds
  // per request. Notes what it holds when a different one comes and when destroyed.
  class DurationRun {
   public:
    explicit DurationRun(Impl& stack) noexcept : stack_(stack) {}
    DurationRun(const DurationRun&) = delete;
    DurationRun& operator=(const DurationRun&) = delete;
    ~DurationRun() { flush(); }
    void note(StackOp op, int tier, Clock::time_point start, Clock::time_point end) noexcept {
      const Clock::duration d = end - start;
      if (n_ > 0 && op == op_ && tier == tier_ && d == d_) {
        ++n_;
        return;
      }
      flush();
      op_ = op;
      tier_ = tier;
      d_ = d;
      n_ = 1;
    }
    void flush() noexcept {
      if (n_ > 0) stack_.note_duration(op_, tier_, d_, n_);
      n_ = 0;
    }

   private:
    Impl& stack_;
    StackOp op_ = StackOp::kPut;
    int tier_ = -1;
    Clock::duration d_{};
    std::uint64_t n_ = 0;
  };
  Usage usage(std::size_t i) const noexcept;
  const Histogram& op_duration(StackOp op, int tier) const noexcept;
  void set_image_memory(std::shared_ptr<ImageMemory> memory) noexcept {
    pool_.set_memory(std::move(memory));
  }

  class EvictSink;  // per-tier EvictionHandler forwarding to on_evict
  struct Tier {
    TierSpec spec;
    std::unique_ptr<EvictSink> sink;
    PluginPtr<Backend> backend;
    PluginPtr<StageCodec> stage;  // null: raw
    int demote_to = -1;           // next writable tier, or -1
    Capabilities caps;            // the backend's, read once
    Gate gate;                    // entered around every call when !caps.concurrent
    bool polling = false;         // a thread is in a waiting poll of it (under mu_)
  };
  std::vector<std::unique_ptr<Tier>> tiers_;
  std::vector<std::string> skipped_;
  StackCounters counters_;
  std::atomic<std::uint64_t> bg_bytes_{0};
  std::string metrics_endpoint_;  // set once by start_metrics()

 private:
  class MetricsServer;        // the profile's HTTP endpoint (libtier/src/metrics_http.cpp)
  struct MetricsServerStop {  // stops and joins its thread
    void operator()(MetricsServer* s) const noexcept;
  };
  struct TierGauges {  // usage(i), published by note_usage()
    std::atomic<std::uint64_t> capacity_bytes{0}, used_bytes{0}, objects{0};
  };
  // A call into the stack: publishes the tiers' usage when it ends (the gauges are as of the end
  // of the last call).
  struct Call {
    Impl& s;
    ~Call() { s.note_usage(); }
  };
  // Starts metrics_server_ and sets metrics_endpoint_. Errors: IoError (cannot listen),
  // NotSupported (built without the endpoint).
  Status start_endpoint(const MetricsEndpoint& endpoint, const TierStack& self);
  struct Pending {  // a request the stack submitted and has not taken back
    int tier = -1;
    Op op = Op::kGet;
    bool background = false;    // reaped by whoever polls; nobody waits for it
    Image image;                // the bytes the request reads or writes
    std::uint64_t charged = 0;  // bytes counted against max_inflight_bytes
    Completion done;
    bool finished = false;
    Clock::time_point submitted, reaped;  // for op_duration
    // A scattered get's header (IoRequest::buf): the one this load accepts, overwritten by the
    // stored one. It lives as long as the request (poll reads it), also when the get timed out
    // and turned into background work. An entry of pending_, so its address is stable.
    alignas(16) std::array<std::byte, kObjectHeaderBytes> header{};
  };
  // The requests the stack submitted and has not taken back, by id. Entries keep their address
  // (a deque) and their slots are reused through a free list, so that a request allocates nothing
  // once the table has grown to the stack's concurrency (an empty table gives back what a large
  // batch made it grow to). An id is (sequence << 32) | (slot + 1): never 0, and a stale one (its
  // request taken, the slot reused) finds nothing. Under mu_.
  class PendingTable {
   public:
    // Enters `p`: its id and its entry. Throws std::bad_alloc (the table could not grow).
    std::pair<std::uint64_t, Pending*> insert(Pending&& p);
    Pending* find(std::uint64_t id) noexcept;
    void erase(std::uint64_t id) noexcept;
    void clear() noexcept;

   private:
    static constexpr std::size_t kKeptSlots = 1024;  // an empty table keeps at most these
    struct Slot {
      std::uint64_t id = 0;  // 0: free
      Pending p;
    };
    Slot* slot_of(std::uint64_t id) noexcept;  // id's slot while id holds it, else null
    std::deque<Slot> slots_;
    std::vector<std::uint32_t> free_;  // capacity: slots_.size(), so erase() never allocates
    std::uint64_t sequence_ = 1;
  };
  struct Evicted {
    int tier = -1;
    ObjectKey key;
    Image image;
  };
  struct StackLease {
    Clock::time_point deadline;
    std::vector<std::pair<int, LeaseId>> parts;  // (tier, the tier's lease id)
  };

  Tier& at(int t) noexcept { return *tiers_[static_cast<std::size_t>(t)]; }
  const Tier& at(int t) const noexcept { return *tiers_[static_cast<std::size_t>(t)]; }
  // Calls fn(backend) for tier `t`, inside its gate when it is not concurrent.
  template <class F>
  auto call(int t, F&& fn) {
    Tier& tier = at(t);
    if (tier.caps.concurrent) return fn(*tier.backend);
    tier.gate.enter();
    struct Leave {
      Gate& g;
      ~Leave() { g.leave(); }
    } leave{tier.gate};
    return fn(*tier.backend);
  }

  void on_evict(int tier, const ObjectKey& key, std::span<const std::byte> image) noexcept;
  // The region tier `t` reads or writes for `image`: its bytes, rounded up to the tier's
  // io_alignment (the image header gives the exact size).
  Region io_region(int t, ImageBuffer& image) const;
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
  // save_one for a first tier that takes gather puts: writes `item`'s header into `header` and
  // returns its put (the header, then item.src as the payload), which the caller enters and
  // submits (submit_batch) while `header` lives; none (and out: why) when the codec refuses the
  // regions.
  std::optional<IoRequest> gathered_put(const SaveItem& item, const Codec& codec,
                                        std::span<std::byte> header, Status& out);
  // Serves `c`, the completion of the get `id` (0: none was submitted, `c` unused) of `item`
  // from tier `t`, from `buf` into item.dst (null `buf`: a scattered get, already in item.dst):
  // out and unserved say whether it was served, or why not; a served item's latency counts from
  // `start` to `now` (scattered) or to the end of its decode, noted into `notes`.
  void serve_get(int t, const LoadItem& item, const Codec& codec, std::uint64_t id, Completion c,
                 Image& buf, LoadResult& out, char& unserved, Clock::time_point start,
                 Clock::time_point now, DurationRun& notes);
  // InvalidArgument naming the sizes: tier `t` holds an image of `image_bytes` for `item`, which
  // its regions cannot take.
  Status wrong_size(int t, const LoadItem& item, const Codec& codec, std::size_t image_bytes) const;
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
  // Removes `keys` from tier `t` (remove and clear): up to kScatterBatch per submit, then one
  // wait for them all. got[i] is the tier's outcome for keys[i] (NotFound included), or why it
  // was not submitted. `got.size()` equals `keys.size()`.
  void remove_from(int t, std::span<const ObjectKey> keys, std::span<Status> got);
  // Submits one request, pending as `p`. Returns its id (never 0), or why the tier refused it
  // (TimedOut: its queue stayed full).
  Result<std::uint64_t> submit_one(int t, Op op, const ObjectKey& key, Region buf, Pending p);
  // Submits `reqs` (user_data: their pending ids) to tier `t` in as few Backend::submit calls as
  // it takes them, and returns how many it submitted, the first ones; the rest leave pending_ and
  // `why` (if given) says why (TimedOut: the queue stayed full).
  std::size_t submit_requests(int t, std::span<const IoRequest> reqs, Status* why = nullptr);
  // Requests of one op and call that go to a tier in one submit (a save's gathered puts, a
  // load's scattered gets): at most `most` (<= kScatterBatch), or fewer that hold `due_bytes` of
  // payload. Their pending entries are made when the batch is submitted, under one lock for them
  // all; a get's buf then becomes its entry's own header, holding the header it accepts (its
  // item's layout, its key, skip + tail bytes of payload) until the tier writes the stored one.
  // Reserved when made: adding allocates nothing.
  struct RequestBatch {
    RequestBatch(Op op, std::size_t most, std::uint64_t due_bytes);
    // Adds `r`, the request of item `item` with `bytes` of payload (its user_data is set when it
    // is submitted); a get accepts objects of layout `format_id`. True when the batch is due.
    bool add(const IoRequest& r, std::size_t item, std::uint64_t bytes,
             std::uint32_t format_id = 0);
    const Op op;
    std::vector<IoRequest> reqs;
    std::vector<std::size_t> items;      // the item of each request
    std::vector<std::uint32_t> formats;  // gets: the layout each accepts
    std::uint64_t bytes = 0;
    const std::size_t most;
    const std::uint64_t due_bytes;
    // When the first request was added: the op_duration start of them all (one clock read).
    Clock::time_point started;
  };
  // Enters `b`'s requests as pending (ids[item] = their ids), submits them to tier `t` (nothing
  // when empty), empties `b` and looks at what finished; the item of a request the tier did not
  // take gets id 0 and `refused(item, why)`. True when it submitted anything.
  template <class Refused>
  bool submit_batch(int t, RequestBatch& b, std::span<std::uint64_t> ids, Refused&& refused);
  // Polls tier `t` (waiting up to `wait` for `min` completions), routes what it reaped, then
  // advances the demotions that queued up.
  void reap(int t, std::size_t min, std::chrono::microseconds wait);
  // Polls tier `t` and routes the completions: the foreground ones to their callers, the
  // background ones finished here. Returns whether one was a foreground request's.
  bool poll_and_route(int t, std::size_t min, std::chrono::microseconds wait);
  // One waiting poll of tier `t` of at most `wait`, by one thread at a time per tier: when
  // another thread is in one, waits for it to route what it reaped instead. Called with `lock`
  // (of mu_) held; returns with it held.
  void wait_once(int t, std::chrono::microseconds wait, std::unique_lock<std::mutex>& lock);
  void drain_evictions();
  // Waits for foreground ids until `deadline` (default: op_timeout from now); on timeout they
  // turn into background requests (TimedOut).
  void wait_for(std::span<const std::uint64_t> ids) { wait_for(ids, Clock::now() + op_timeout_); }
  void wait_for(std::span<const std::uint64_t> ids, Clock::time_point deadline);
  // How many of `ids`, from the first, have finished (0, never submitted, counts as finished);
  // one look under mu_ for them all.
  std::size_t finished_prefix(std::span<const std::uint64_t> ids);
  // The completion of `id`, and (when `reaped` is given) when it was reaped.
  Completion take(std::uint64_t id, Clock::time_point* reaped = nullptr);
  // take() of each nonzero id of `ids` (at most kTakeChunk) into out[k] (and reaped[k] when
  // given), under one lock; out[k] of an id 0 is left as it is.
  void take_all(std::span<const std::uint64_t> ids, std::span<Completion> out,
                std::span<Clock::time_point> reaped = {});
  // take()'s work, with mu_ held: the completion of `id`; its image (to recycle after the lock)
  // into `image`.
  Completion take_locked(std::uint64_t id, Clock::time_point* reaped, Image& image);
  // Enters `p` as tier `t`'s pending `op`, its op_duration counting from `submitted`, with mu_
  // held: its id and its entry (which stays put while pending).
  std::pair<std::uint64_t, Pending*> enter_locked(int t, Op op, Pending p,
                                                  Clock::time_point submitted);
  void recycle(Image& image) noexcept { pool_.recycle(image); }

  const std::uint64_t max_inflight_bytes_;
  const std::chrono::microseconds op_timeout_;
  int first_writable_ = -1;
  bool gather_saves_ = false;  // the first writable tier takes gathered payloads (save())
  detail::ImagePool pool_;
  std::unique_ptr<TierGauges[]> gauges_;    // one per tier; atomics, read without a lock
  std::unique_ptr<Histogram[]> durations_;  // [op * (tiers + 1) + tier + 1]; atomics
  std::unique_ptr<MetricsServer, MetricsServerStop> metrics_server_;

  std::mutex mu_;                   // the fields below
  std::condition_variable routed_;  // a foreground request finished, or a waiting poll ended
  std::size_t waiting_ = 0;         // threads waiting on routed_
  PendingTable pending_;
  std::unordered_set<std::uint64_t> timed_out_;  // foreground ids given up on
  std::size_t bg_count_ = 0;
  std::deque<Evicted> evicted_;
  // evicted_.size(), also read without mu_: drain_evictions() takes the lock only when it is not
  // 0 (it runs after every submit and reap).
  std::atomic<std::size_t> evicted_count_{0};
  std::unordered_map<LeaseId, StackLease> leases_;
  LeaseId next_lease_ = 1;
};

class TierStack::Impl::EvictSink final : public EvictionHandler {
 public:
  EvictSink(Impl* stack, int tier) : stack_(stack), tier_(tier) {}
  void on_evict(const ObjectKey& key, std::span<const std::byte> image) noexcept override {
    stack_->on_evict(tier_, key, image);
  }

 private:
  Impl* stack_;
  int tier_;
};

}  // namespace tier
