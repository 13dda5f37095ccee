#pragma once
// Internals shared by the C API's translation units (capi/): the handle structs behind
// tier/tier.h's opaque types, their lifetimes, status translation and key conversion. Not
// installed.
//
// Every exported function runs its body through guarded(): a C++ exception never crosses the C
// boundary (it becomes BAD_STATE, or NO_SPACE for std::bad_alloc), and a failing Status stores
// its message in the calling thread's last-error buffer. A call through a handle also runs inside
// a Call on the handle's Life (below), so closing a handle never frees anything under a call.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tier/codec.hpp"
#include "tier/copy_plan.hpp"
#include "tier/key.hpp"
#include "tier/tier.h"
#include "tier/tier_stack.hpp"

namespace tier::capi {

// Records `s` as this thread's last error (when not OK) and returns its code.
int report(const Status& s) noexcept;

template <class F>
int guarded(F&& body) noexcept {
  try {
    return report(body());
  } catch (const std::bad_alloc&) {
    return report(Status(Code::kNoSpace, "out of memory"));
  } catch (const std::exception& e) {
    return report(Status(Code::kBadState, e.what()));
  } catch (...) {
    return report(Status(Code::kBadState, "unknown exception"));
  }
}

// The life of a C handle (tier.h "Lifetimes"). Two counts, neither held across a transfer:
//  - references: the caller's own, until its *_close / *_destroy, and one per handle made over
//    this one (a worker's on its store and its layout, a scheduler's on its worker). The last
//    release frees the handle, so a dependent never sees its base freed.
//  - calls in flight: close() marks the handle closed, so a call that begins later returns
//    BAD_STATE, then waits for the calls that began before to return.
// The lock below guards only the call count (a few instructions per call), never a transfer.
class Life {
 public:
  // Begins a call; false when the handle is closed.
  bool enter() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    ++calls_;
    return true;
  }
  void leave() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    if (--calls_ == 0 && closed_) idle_.notify_all();
  }
  // Marks the handle closed; false when it was already (a second close does nothing).
  bool mark_closed() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    return !std::exchange(closed_, true);
  }
  // After mark_closed(): waits until no call is in flight.
  void wait_calls() noexcept {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [&] { return calls_ == 0; });
  }
  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  // Drops a reference; true when it was the last (the caller then frees the handle).
  bool release() noexcept { return refs_.fetch_sub(1, std::memory_order_acq_rel) == 1; }

 private:
  std::mutex mu_;
  std::condition_variable idle_;
  std::size_t calls_ = 0;
  bool closed_ = false;
  std::atomic<std::size_t> refs_{1};
};

// One call through a handle's Life: `if (!call) return closed(...)`; leaves on destruction.
class Call {
 public:
  explicit Call(Life& life) noexcept : life_(life.enter() ? &life : nullptr) {}
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  ~Call() {
    if (life_) life_->leave();
  }
  explicit operator bool() const noexcept { return life_ != nullptr; }

 private:
  Life* life_;
};

// BAD_STATE for a call through a closed handle: "the <what> is closed".
inline Status closed_handle(const char* what) {
  return Status(Code::kBadState, std::string("the ") + what + " is closed");
}
// A C string of `s` the caller frees with tier_free; std::bad_alloc (NO_SPACE through guarded())
// when there is no memory.
inline char* dup_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (!p) throw std::bad_alloc();
  std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}
inline Status need(const void* p, const char* what) {
  return p ? Status::ok() : Status::invalid(std::string(what) + " is NULL");
}

// Runs `body(h)` for a call through handle `h` (NULL: INVALID_ARGUMENT; closed: BAD_STATE),
// inside guarded(). `what` names the handle in messages.
template <class H, class F>
int with_handle(H* h, const char* what, F&& body) noexcept {
  return guarded([&]() -> Status {
    TIER_RETURN_IF_ERROR(need(h, what));
    Call call(h->life);
    if (!call) return closed_handle(what);
    return body(*h);
  });
}

inline Key128 to_key(const tier_key& k) noexcept {
  Key128 out;
  for (int i = 7; i >= 0; --i) {
    out.lo = (out.lo << 8) | k.bytes[i];
    out.hi = (out.hi << 8) | k.bytes[8 + i];
  }
  return out;
}
inline tier_key from_key(const Key128& k) noexcept {
  tier_key out;
  for (int i = 0; i < 8; ++i) {
    out.bytes[i] = static_cast<std::uint8_t>(k.lo >> (8 * i));
    out.bytes[8 + i] = static_cast<std::uint8_t>(k.hi >> (8 * i));
  }
  return out;
}

// The GPU floor's copy executors, one per device, created on first use (gpu.cpp); without the
// GPU floor (no_gpu.cpp) every device region is refused with NotSupported. gpu_executor() may be
// called from any thread; the executor it returns takes one transfer at a time (a lock each).
struct GpuExecutors;
struct GpuExecutorsDeleter {
  void operator()(GpuExecutors* g) const noexcept;
};
using GpuExecutorsPtr = std::unique_ptr<GpuExecutors, GpuExecutorsDeleter>;
GpuExecutorsPtr make_gpu_executors();
Result<CopyExecutor*> gpu_executor(GpuExecutors& g, int device) noexcept;
// A list of regions claims device memory of GPU `device`: InvalidArgument (naming the region)
// unless the GPU runtime knows every byte of each as memory of that device (a caller's pointer
// or size is never trusted, a stray one would fault the GPU context); NotSupported without the
// GPU floor. Each allocation the regions lie in is looked up once.
Status check_device_memory(RegionList regions, int device) noexcept;
// Registered device memory: check_device_memory() of it, then the executor of its GPU made and
// its CopyContext prepared (the staging ring allocated, the kernels loaded), so that the first
// transfer into or out of it pays neither.
Status prepare_device(GpuExecutors& g, const Region& memory) noexcept;

// The GPU floor's page-locked image memory (gpu::page_locked_images), for the stack of a store
// whose device memory is registered; NotSupported without the GPU floor.
Result<std::shared_ptr<ImageMemory>> page_locked_images() noexcept;

// Moves the bytes of a region list to and from a stored payload: the payload is the regions'
// bytes concatenated (layout id kIdentityLayoutId, so host and device copies of one object are
// interchangeable). A list is all host kinds, or all device memory of one GPU, which moves
// through the GPU floor's copy executor (NotSupported in a build without it). Its payload is
// direct (Codec::direct, no framing): a tier that gathers puts or scatters gets moves the bytes
// between its storage and the regions itself, the one copy (the cpu tier, host regions; a pinned
// tier, device regions too), and encode()/decode() run only where a tier cannot.
// Threads: any number at once (the GPU executors are shared under a lock each).
class RegionCodec final : public Codec {
 public:
  RegionCodec();
  ~RegionCodec() override;
  std::string_view name() const noexcept override { return "capi-regions"; }
  std::uint32_t format_id() const noexcept override { return kIdentityLayoutId; }
  Result<std::size_t> encoded_size(RegionList src) const noexcept override;
  Result<std::size_t> encode(RegionList src, std::span<std::byte> dst) const noexcept override;
  Status decode(std::span<const std::byte> payload, RegionList dst) const noexcept override;
  Result<DirectPayload> direct(RegionList regions) const noexcept override;
  // prepare_device() on this codec's executors (tier_memory_register of device memory).
  Status prepare_device(const Region& memory) const noexcept;

 private:
  struct Plan;
  // The checks every use makes of a list: one side (host, or one GPU), no NULL region, device
  // memory the GPU runtime knows. Returns the GPU's ordinal, or -1 for host memory.
  static Result<std::int32_t> check(RegionList regions) noexcept;
  // The plan of `regions` and the executor that runs it.
  Status plan(RegionList regions, Plan& out) const noexcept;
  GpuExecutorsPtr gpu_;
};

// Page-locks host memory through the GPU floor (gpu.cpp); NotSupported without it.
class PinnedHold {
 public:
  virtual ~PinnedHold() = default;
};
Result<std::unique_ptr<PinnedHold>> pin_host(void* ptr, std::size_t bytes) noexcept;

}  // namespace tier::capi

struct tier_completion {
  std::uint64_t ticket = 0;
  std::int32_t op = TIER_OP_SAVE;
  std::int32_t status = TIER_OK;
  std::vector<std::int32_t> codes;
  std::vector<std::int32_t> tiers;
};

struct tier_memory;

namespace tier::capi {
// The registrations of a store, shared with each of them: a tier_memory_release after its store
// was closed finds the set (emptied by the close) rather than a freed store.
struct Registrations {
  // Guards `list`: shared while a call converts its regions, exclusive to register, release and
  // close; never held across a transfer.
  std::shared_mutex mu;
  std::vector<tier_memory*> list;
};
}  // namespace tier::capi

struct tier_store {
  tier::capi::Life life;
  // Set at open, read by every call: the TierStack takes calls from several threads at once and
  // runs their transfers in parallel (its locks are the store's only locks around its data).
  std::unique_ptr<tier::TierStack> stack;
  tier::Key128 ns;
  std::uint32_t rank = 0;
  std::vector<std::string> tier_names;
  tier::capi::RegionCodec codec;
  std::shared_ptr<tier::capi::Registrations> registrations =
      std::make_shared<tier::capi::Registrations>();
  std::uint64_t op_timeout_ms = 10000;

  // Asynchronous batches: queued by submit, run by `thread`, handed out by poll/wait.
  struct Job {
    std::uint64_t ticket = 0;
    std::int32_t op = TIER_OP_SAVE;
    std::vector<tier::ObjectKey> keys;
    std::vector<tier::Region> regions;
    std::vector<std::size_t> first;  // item i's regions: [first[i], first[i + 1])
  };
  std::mutex qmu;
  std::condition_variable work_cv, done_cv;
  std::deque<Job> jobs;
  std::map<std::uint64_t, std::unique_ptr<tier_completion>> done;
  std::uint64_t next_ticket = 1;
  std::size_t running = 0;            // jobs taken by the thread and not yet done
  std::vector<std::uint64_t> issued;  // tickets submitted and not handed out (sorted)
  bool stopping = false;
  std::thread thread;  // started by the first submit
};

struct tier_memory {
  std::shared_ptr<tier::capi::Registrations> set;
  tier::Region region;
  std::unique_ptr<tier::capi::PinnedHold> pinned;
};

namespace tier::capi {
// Converts a C region (checking kind, device, pointer and that it does not wrap the address
// space) and applies pinned registrations. Call with store.registrations->mu held (shared).
Result<Region> to_region(tier_store& store, const tier_region& r);
// Drops a reference to `store` (the caller's at close, a worker's at its end); the last one
// flushes and closes the tiers and frees the handle.
void release_store(tier_store* store) noexcept;
}  // namespace tier::capi
