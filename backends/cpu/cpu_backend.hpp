#pragma once
// The CPU tier: objects in host memory, bounded by capacity, with LRU eviction. Two modes:
//
//  - "heap": objects in this process's heap, exact LRU. Capacity counts image bytes (header +
//    payload) exactly, so a tier of capacity C holds floor(C / image size) equal-sized objects.
//    Freed buffers are kept for reuse (bounded by the capacity) so a warm cache does not
//    page-fault on every put.
//  - "shm": objects in a named shared-memory segment (shm/store.hpp, docs/shm.md) that every
//    process opening the same segment shares and that outlives the process. Capacity is counted
//    in whole blocks; evicted objects are reported by key only (they are dropped, not demoted).
//
// "pinned": true (either mode; needs a GPU build and a GPU, else create() is NotSupported) keeps
// the storage in page-locked host memory from the GPU runtime (pinned_transfer.hpp): the heap
// mode places its objects in one pinned arena of exactly the capacity (ExtentAllocator: exact
// bytes, best fit, compaction when free bytes are scattered, so capacity stays exact in image
// bytes and LRU is unchanged); the shm mode registers its mapping of the segment. The tier then
// also accepts device-memory buffers (kind kDevice) for put and get, moved by GPU DMA straight
// between the engine's GPU memory and the stored image; a get into device memory is verified
// (header, key, length, payload checksum) on the host while it copies, and fails with
// ChecksumMismatch and a zeroed destination header when the stored bytes are corrupt.
//
// Each mode is a CpuMode (cpu_mode.hpp); this class is the Backend around the one create() picks.
// It is concurrent (Capabilities::concurrent) when its mode is and has no device path: the heap
// mode's puts and gets then copy in parallel, each on its caller's thread, and the puts (or gets)
// of one submit of objects smaller than kPooledPayloadBytes, 256 KiB or more in all, are moved at
// once by the caller and the verification threads (tier/object.hpp), as larger objects' chunks
// are: a save or load of many small objects then uses the cores an object of their size would.
// Their completions keep the submit's order, and so does the recency they leave (the caller
// refreshes their keys in order afterwards). A parallel put never evicts: the caller first evicts
// for all of them (eviction reports stay on its thread) and makes again on its thread any put that
// still finds no room.
// Every request completes synchronously inside submit() (device copies included: submit waits
// for their DMA), except a pinned heap tier's scattered get into device memory: it is verified
// inside submit() and its copy kernel enqueued, and it completes in poll() once the copy
// finished, so the copies of a batch of gets run back to back. Every put and remove first waits
// for such copies (they read stored bytes a put could evict or move); poll() hands the
// completions out.

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "cpu_mode.hpp"
#include "tier/backend.hpp"

namespace tier::cpu {

class DeviceTransfer;

class CpuBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CpuBackend>> create(const BackendContext& ctx);
  CpuBackend(std::string tier_name, std::unique_ptr<CpuMode> mode);
  ~CpuBackend() override;

  Capabilities capabilities() const noexcept override;
  Usage usage() const noexcept override;
  std::string describe() const override;

 protected:
  Result<std::size_t> do_submit(std::span<const IoRequest> reqs) noexcept override;
  Result<std::size_t> do_poll(std::span<Completion> out, std::size_t min,
                              std::chrono::microseconds wait) noexcept override;
  Result<LeaseId> do_lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                           std::span<std::uint8_t> held) noexcept override;
  LeaseEnd do_release(LeaseId id) noexcept override;
  Result<std::vector<ObjectKey>> do_list_keys(const Key128& ns) override;

 private:
  // A scattered get whose copy into device memory is still running.
  struct Copying {
    std::uint64_t user_data = 0;
    std::uint64_t ticket = 0;  // DeviceTransfer::scatter_to_device
    std::uint64_t bytes = 0;   // the image size, for the completion
  };

  // `on_evict`: evicted_, or empty for a put on the verification threads (deferred when it needs
  // room).
  CpuMode::Outcome put(const IoRequest& r, const CpuMode::EvictFn& on_evict);
  // nullopt: a copy into device memory is running (copying_).
  std::optional<Completion> get(const IoRequest& r);
  Completion contains(const IoRequest& r);
  // Whether the window `reqs` is moved at once on the verification threads (the class comment):
  // two requests or more, all puts of distinct keys or all gets, each of less than
  // kPooledPayloadBytes, kSpreadCopyBytes or more in all. The caller checks concurrent_.
  static bool parallel(std::span<const IoRequest> reqs) noexcept;
  // Runs a window parallel() accepted; every request's completion is ready when it returns.
  void submit_in_parallel(std::span<const IoRequest> reqs) noexcept;
  // Promises `n` more completions room in ready_ before their requests run, so that a request
  // that ran always has its completion queued. False (nothing promised): no memory.
  bool reserve_ready(std::size_t n) noexcept;
  // Queues the completions of requests reserve_ready() promised room to, in order.
  void push_ready(std::span<Completion> done) noexcept;
  // Waits for every running copy and makes their completions ready.
  void settle() noexcept;
  // Makes the completions of finished copies ready, in order; with `wait`, blocks until at least
  // `min` of them are.
  void finish_copies(std::size_t min, bool wait) noexcept;

  std::unique_ptr<CpuMode> mode_;
  DeviceTransfer* device_;  // mode_'s device path (pinned modes), or nullptr
  std::uint64_t capacity_;
  bool concurrent_;         // mode_->concurrent() and no device path
  CpuMode::EvictFn evicted_;  // reports to notify_evicted()
  std::mutex ready_mu_;       // ready_, promised_
  std::vector<Completion> ready_;
  // Completions of requests consumed and not queued yet (reserve_ready): ready_'s capacity is
  // always at least its size plus this.
  std::size_t promised_ = 0;
  std::deque<Copying> copying_;  // pinned modes only (never concurrent)
};

}  // namespace tier::cpu
