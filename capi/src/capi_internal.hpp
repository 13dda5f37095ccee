#pragma once
// Internals shared by the C API's translation units (capi/): the handle structs behind
// tier/tier.h's opaque types, status translation and key conversion. Not installed.
//
// Every exported function runs its body through guarded(): a C++ exception never crosses the C
// boundary (it becomes BAD_STATE, or NO_SPACE for std::bad_alloc), and a failing Status stores
// its message in the calling thread's last-error buffer.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <new>
#include <string>
#include <thread>
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
// Region `index` of a list claims device memory of GPU `device` at `p`: InvalidArgument unless the
// GPU runtime knows `p` as memory of that device (a caller's pointer is never trusted, a stray
// one would fault the GPU context); NotSupported without the GPU floor.
Status check_device_memory(const void* p, int device, std::size_t index) noexcept;

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

struct tier_store {
  // Set at open, read by every call: the TierStack takes calls from several threads at once and
  // runs their transfers in parallel (its locks are the store's only locks around its data).
  std::unique_ptr<tier::TierStack> stack;
  tier::Key128 ns;
  std::uint32_t rank = 0;
  std::vector<std::string> tier_names;
  tier::capi::RegionCodec codec;
  std::uint64_t op_timeout_ms = 10000;

  // Memory registrations: read (shared) while a call converts its regions, never during a
  // transfer; written by tier_memory_register and tier_memory_release.
  std::shared_mutex registrations_mu;
  std::vector<tier_memory*> registrations;

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
  tier_store* store = nullptr;
  tier::Region region;
  std::unique_ptr<tier::capi::PinnedHold> pinned;
};

namespace tier::capi {
// Converts a C region (checking kind, device and pointer) and applies pinned registrations.
// Call with store.registrations_mu held (shared).
Result<Region> to_region(tier_store& store, const tier_region& r);
}  // namespace tier::capi
