#pragma once
// Backend: one storage tier that stores object images (tier/object.hpp) by ObjectKey.
//
// Asynchronous, io_uring-shaped: the caller submits a batch of IoRequests and later drains
// Completions with poll() on its own thread. No library thread ever calls user code.
//
// Threads: a Backend that declares Capabilities::concurrent may be called (submit, poll, lease,
// release) from several threads at once; any other is used by one thread at a time (its owner;
// a TierStack serialises its calls into such a tier). Either way a completion surfaces only
// inside poll(), in whichever thread's poll() reaps it, and no library thread calls user code.
// Backends may run internal threads (Asio, GPU streams). The base's own bookkeeping (the pending
// table below) is thread-safe in both cases; usage(), describe() and metrics() may be read from
// any thread at any time.
//
// Public methods are non-virtual and keep the invariants for every backend (NVI): submit() checks
// each request against capabilities(), and poll() verifies every image read back (header, key,
// exact length, checksum) and counts metrics before handing the completion out. Implementations
// override the protected do_* hooks.
//
// Semantics per op (codes in Completion::status):
//   kPut      put-if-absent of the image in `buf`. Ok (stored; `bytes` = image size),
//             AlreadyExists (present already; its recency is refreshed), NoSpace, IoError,
//             Rejected, TimedOut.
//   kGet      reads the image into `buf`. Ok (`bytes` = image size), NotFound,
//             ChecksumMismatch, InvalidArgument (buffer too small; `bytes` = the size needed),
//             IoError, TimedOut. A get refreshes recency.
//   kContains Ok (`bytes` = image size) or NotFound. Does not refresh recency.
//   kRemove   Ok, NotFound, IoError, TimedOut.
// Ownership: every Region in a submitted request must stay valid and unchanged until its
// Completion has been reaped from poll() (for a put to a tier with gather_puts: until submit()
// has consumed it).
//
// Lookup leases (lease()/release(), docs/leases.md): a reader that was told a key is present
// holds it against eviction for capacity until it releases the lease or the lease's deadline
// passes. Leases are metadata only: they complete on the caller's thread without I/O.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tier/codec.hpp"
#include "tier/json.hpp"
#include "tier/key.hpp"
#include "tier/metrics.hpp"
#include "tier/region.hpp"
#include "tier/status.hpp"

namespace tier {

struct IoRequest {
  Op op = Op::kGet;
  ObjectKey key;
  Region buf;  // kPut: the image to store (its first bytes with `tail`); kGet: the destination
  std::uint64_t user_data = 0;
  // kPut to a tier that declares Capabilities::gather_puts: the rest of the image after `buf`,
  // in order, as host regions (a stack puts a header from `buf` and the payload straight from
  // engine memory). kGet from a tier that declares Capabilities::scatter_gets: where the payload
  // goes, `buf` taking the header (see there). Empty: `buf` is the whole image. Any other
  // request must leave it empty.
  RegionList tail = {};
  // kGet with `tail`: payload bytes before the tail's that go to no region (a codec's framing,
  // Codec::direct), and the caller's check of the stored payload, called with all of it (framing
  // included) after its checksum verified and before any tail byte is written; its error fails
  // the get. Zero and null for any other request.
  std::size_t skip = 0;
  const PayloadCheck* check = nullptr;
  // kPut and kGet: the bytes of the batch this request belongs to (the requests its caller issues
  // together, this one's included: a TierStack save's or load's payloads), or 0 for a request on
  // its own. A hint: a tier that copies on the host writes a batch larger than the caches hold
  // with non-temporal stores (tier/object.hpp stores_for_batch).
  std::uint64_t batch_bytes = 0;
};

struct Completion {
  std::uint64_t user_data = 0;
  Status status;
  std::size_t bytes = 0;
};

// What a backend accepts, declared up front (never discovered by failing).
struct Capabilities {
  MemoryKindMask memory_kinds = kHostKinds;  // kinds a request's `buf` may have
  std::size_t io_alignment = 1;              // required alignment of `buf.data` and `buf.size`
  std::size_t max_object_bytes = SIZE_MAX;   // largest image accepted
  bool persistent = false;                   // objects survive a restart of the process
  bool shared = false;                       // several processes see the same objects
  // The backend verifies every image it returns with copy_verified() (tier/object.hpp) as part of
  // its copy; poll() then re-checks only the header, key and length instead of hashing again.
  bool verifies_reads = false;
  // Puts may carry their image as `buf` followed by IoRequest::tail. Such a backend copies every
  // byte of a put before submit() returns, so the caller may reuse a put's regions (`buf` and
  // `tail`) as soon as submit() has consumed the request.
  bool gather_puts = false;
  // Such puts are sealed by the backend (with gather_puts only): the header in `buf` is written
  // by write_object_header with any payload checksum, and the backend computes the checksum
  // from the bytes it stores, as it copies them, and stores the header with it (seal_into(),
  // tier/object.hpp): the payload is read once, and what is stored matches its checksum even
  // when the caller changes the regions meanwhile. A stack then hashes nothing itself.
  bool seals_puts = false;
  // Gets may carry IoRequest::tail: `buf` is exactly kObjectHeaderBytes of host memory holding,
  // on submit, a header (write_object_header) whose layout and stage ids the caller accepts. The
  // backend writes the payload, after its first IoRequest::skip bytes, into the tail regions, in
  // order, only when the stored image verifies (header, key, payload checksum), has those layout
  // and stage ids and a payload of exactly skip + the tail's size, and IoRequest::check (when
  // set) accepts the payload; then the stored header into `buf`. Otherwise it writes nothing there
  // (InvalidArgument for a size or layout mismatch, ChecksumMismatch). Completion::bytes is the
  // image size. The tail regions are all host memory, or all device memory of one GPU when
  // memory_kinds has kDevice (a pinned tier's copy kernel writes them after the same checks).
  // The tail may be written until the completion is reaped (a device copy completes in poll());
  // `buf` is read again by poll(), so both stay valid until then.
  bool scatter_gets = false;
  // submit(), poll(), lease() and release() may run on several threads at once, their copies in
  // parallel (the cpu tier's heap mode: only its index is under a lock). A completion surfaces in
  // whichever thread's poll() reaps it, so a waiting poll may return fewer than `min` when another
  // thread took them: a caller that shares the backend routes completions by user_data (as a
  // TierStack does). False: one thread at a time.
  bool concurrent = false;
};

// Whether a scattered get's `tail` (empty regions aside) is all host memory, or all device
// memory of one GPU: what Capabilities::scatter_gets accepts.
bool tail_on_one_side(RegionList tail) noexcept;

// A lease's id within one Backend (or one TierStack); 0 is no lease.
using LeaseId = std::uint64_t;
// How a lease ended: released before its deadline, expired, or unknown (ended already).
enum class LeaseEnd : std::uint8_t { kUnknown, kReleased, kExpired };
// The longest lookup lease (docs/leases.md): a longer ttl is cut to it, so no deadline overflows
// and no object is held longer than an hour (the engine's lease_timeout_ms is at most that).
inline constexpr std::chrono::milliseconds kMaxLeaseTtl{3'600'000};

struct Usage {
  std::uint64_t capacity_bytes = 0;
  std::uint64_t used_bytes = 0;
  std::uint64_t objects = 0;
};

// Receives objects a backend evicts for capacity, so a stack can demote them. Called from inside
// submit() or poll() on the thread that called them (for a concurrent backend, possibly several
// at once, and outside the backend's own locks); `image` is valid only during the call and may
// be empty when the backend cannot provide the bytes cheaply (the object is then simply dropped).
class EvictionHandler {
 public:
  virtual ~EvictionHandler() = default;
  virtual void on_evict(const ObjectKey& key, std::span<const std::byte> image) noexcept = 0;
};

// What a backend factory receives: the tier's generic settings and its validated options
// (unknown keys already rejected, defaults filled in, sizes and durations turned into integers).
struct BackendContext {
  std::string tier_name;
  std::uint64_t capacity_bytes = 0;
  Json options = Json::object();
};

class Backend {
 public:
  explicit Backend(std::string tier_name) : tier_name_(std::move(tier_name)) {}
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // submit() hands requests on to do_submit() in windows of at most this many (arrays on the
  // stack, no allocation on the data path); a backend may size its own per-window arrays by it.
  static constexpr std::size_t kSubmitWindow = 16;

  // Submits requests in order. Returns how many were consumed from the front of `reqs`; each
  // consumed request yields exactly one Completion (an invalid request fails through its
  // completion, never through this return). Requests not consumed (the backend's queue is full)
  // may be submitted again after poll(). Errors: only when the backend is closed (BadState).
  Result<std::size_t> submit(std::span<const IoRequest> reqs) noexcept;

  // Moves up to out.size() completions into `out`, waiting until at least `min` are available or
  // `wait` has passed. Returns how many were written (possibly fewer than `min` on timeout).
  Result<std::size_t> poll(std::span<Completion> out, std::size_t min,
                           std::chrono::microseconds wait) noexcept;

  // Requests submitted and not yet reaped through poll().
  std::size_t in_flight() const noexcept { return pending_in_use_.load(std::memory_order_relaxed); }

  const std::string& tier_name() const noexcept { return tier_name_; }
  TierMetrics& metrics() noexcept { return metrics_; }
  const TierMetrics& metrics() const noexcept { return metrics_; }
  void set_eviction_handler(EvictionHandler* h) noexcept { eviction_handler_ = h; }

  // Leases the stored objects among `keys` for at most `ttl`: while the lease lasts, the tier
  // does not evict them for capacity (a put that needs their room fails with NoSpace, or waits,
  // rather than break it). held[i] is set to 1 when keys[i] is stored and now held, else 0
  // (`held.size()` must equal `keys.size()`). A lease refreshes no recency, and an explicit
  // remove still removes a leased object. Returns the lease id, 0 when no key is held (nothing
  // to release); NotSupported when the tier cannot lease (the default; counted in
  // leases_unsupported: the caller then has best effort only); InvalidArgument (sizes);
  // BadState. Leases of a shared tier (shm) live with the objects, across processes, and end
  // when their process dies. A `ttl` above kMaxLeaseTtl is kMaxLeaseTtl (in every tier).
  Result<LeaseId> lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                        std::span<std::uint8_t> held) noexcept;
  // Ends lease `id` (counted as released, or as expired when its deadline has passed). An id
  // that already ended, or 0, is ignored.
  void release(LeaseId id) noexcept;

  // The keys of namespace `ns` this tier stores now (a snapshot; objects being written are not
  // listed), for clearing a namespace (TierStack::clear). A metadata call on the owner's thread:
  // it may wait for the tier's own I/O (a remote tier scans its server) but not for requests
  // in flight. Returns: the keys; NotSupported (the default: the tier cannot enumerate), BadState,
  // the tier's I/O errors.
  Result<std::vector<ObjectKey>> list_keys(const Key128& ns) noexcept;

  virtual Capabilities capabilities() const noexcept = 0;
  virtual Usage usage() const noexcept = 0;
  // A one-line description for `tierctl explain` and logs.
  virtual std::string describe() const { return tier_name_; }

 protected:
  // The request's user_data is an internal request id (an index into the pending table) that do_poll must return unchanged.
  // Returns how many requests of the front of `reqs` were accepted.
  virtual Result<std::size_t> do_submit(std::span<const IoRequest> reqs) noexcept = 0;
  virtual Result<std::size_t> do_poll(std::span<Completion> out, std::size_t min,
                                      std::chrono::microseconds wait) noexcept = 0;

  // Lease hooks (see lease()): do_lease gets `ttl` > 0 and `held` zeroed and of the keys' size;
  // do_release says how the lease ended. Implementations count leases that reach their
  // deadline before release() in metrics().lease_expiries themselves (LeaseTable does).
  virtual Result<LeaseId> do_lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                                   std::span<std::uint8_t> held) noexcept;
  virtual LeaseEnd do_release(LeaseId id) noexcept;
  // list_keys() hook. Default: NotSupported. May throw std::bad_alloc (list_keys() turns it into
  // an error), nothing else.
  virtual Result<std::vector<ObjectKey>> do_list_keys(const Key128& ns);

  // Inside do_submit(): the requests of the same submit() after the window do_submit() was given
  // (kSubmitWindow at a time), so that a backend that gathers work within one
  // call (a pinned cpu tier batching its transfers) knows what follows. Not yet checked: some may
  // be refused before they reach do_submit(). Empty on a submit()'s last window and outside
  // do_submit(). Threads: the calling thread's own submit().
  std::span<const IoRequest> submit_rest() const noexcept;

  // Implementations call this for every object they evict for capacity.
  void notify_evicted(const ObjectKey& key, std::span<const std::byte> image,
                      std::uint64_t image_bytes) noexcept;

 private:
  struct Pending {
    std::uint64_t user_data = 0;
    ObjectKey key;
    Region buf;
    std::size_t tail_bytes = 0;  // a scattered get's payload bytes, skip included (buf: header)
    Op op = Op::kGet;
    bool verified = false;       // capabilities().verifies_reads when it was submitted
    bool used = false;
  };
  // Takes a pending id for `r` (under mu_).
  std::uint32_t take_id(const IoRequest& r, bool verified);
  // Gives back the ids of requests do_submit did not accept (under mu_).
  void give_back(std::span<const IoRequest> unaccepted) noexcept;
  void finish(const Pending& p, Completion& c) noexcept;

  std::string tier_name_;
  TierMetrics metrics_;
  EvictionHandler* eviction_handler_ = nullptr;
  // The fields below. Held for bookkeeping only, never across do_submit or do_poll.
  std::mutex mu_;
  std::vector<Pending> pending_;  // requests submitted and not yet completed, by id
  std::vector<std::uint32_t> free_pending_;
  std::atomic<std::size_t> pending_in_use_{0};
  std::deque<Completion> early_;  // requests rejected by submit() before reaching the backend
};

}  // namespace tier
