#pragma once
// SLOT snapshot and restore through a bounded pool of device staging rows (reference §2.2).
//
// A snapshot gathers one slot group of the engine's SLOT regions into a free staging row (one
// kernel launch, device to device, so the engine may reuse the group as soon as that launch has
// run) and then copies the row to the caller's host image (one DMA). A restore copies the host
// image into a row and scatters it into the (newly allocated) destination group. A row is held
// by its Transfer until completion is proven through the transfer's event; a row whose
// completion cannot be proven (the runtime fails to enqueue, or to answer for the event) is
// quarantined: never handed out again and never freed while the stager lives.

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "gpu.hpp"
#include "tier/copy_plan.hpp"
#include "tier/status.hpp"

namespace tier::gpu {

// Non-blocking admission of row ids: the smallest free id first. Thread-safe.
class StagingRows {
 public:
  explicit StagingRows(std::size_t rows);
  std::optional<std::size_t> try_acquire();
  // Errors: BadState (the id is not acquired, or is quarantined).
  Status release(std::size_t id);
  // Removes an acquired id permanently. Errors: BadState (not acquired).
  Status quarantine(std::size_t id);
  std::size_t free_rows() const;
  std::size_t quarantined() const;
  std::size_t size() const noexcept { return state_.size(); }

 private:
  enum class State : unsigned char { kFree, kAcquired, kQuarantined };
  mutable std::mutex mu_;
  std::vector<State> state_;
  std::vector<std::size_t> free_;  // min-heap of free ids
};

class SlotStager {
 public:
  // `rows` rows of `slot_bytes` each, in device memory of `exec`'s device.
  // Errors: InvalidArgument, NoSpace, DeviceError.
  static Result<std::unique_ptr<SlotStager>> create(DeviceCopyExecutor& exec, std::size_t rows,
                                                    std::size_t slot_bytes);

  // One snapshot or restore in flight. Its row stays reserved until finish() proves completion.
  struct Transfer {
    std::size_t row = 0;
    Event done;
    bool open = false;
  };

  // Errors: Rejected (no free row: the caller recomputes), InvalidArgument (plan or image size
  // is not slot_bytes), DeviceError (the row is quarantined; nothing is in flight to wait for).
  Result<Transfer> snapshot(const CopyPlan& plan, Region host_image, const Stream& s);
  Result<Transfer> restore(const CopyPlan& plan, Region host_image, const Stream& s);

  // Non-blocking proof of completion. Ok: done, row released. Retry: still running.
  // DeviceError: completion unprovable, row quarantined. BadState: already finished.
  Status poll(Transfer& t);
  // Blocking form of poll().
  Status wait(Transfer& t);

  const StagingRows& rows() const noexcept { return rows_; }
  std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  // The staging row's device memory (for inspection by tests and tools).
  Region row_region(std::size_t row) const noexcept;

 private:
  SlotStager(DeviceCopyExecutor& exec, std::size_t rows, std::size_t slot_bytes,
             DeviceBuffer memory);
  Result<Transfer> start(const CopyPlan& plan, Region host_image, const Stream& s, bool snapshot);
  Status settle(Transfer& t, Result<bool> done);

  DeviceCopyExecutor& exec_;
  std::size_t slot_bytes_;
  DeviceBuffer memory_;
  StagingRows rows_;
};

}  // namespace tier::gpu
