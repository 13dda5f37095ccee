#include "slot_staging.hpp"

#include <algorithm>
#include <functional>

#include <fmt/format.h>

namespace tier::gpu {

StagingRows::StagingRows(std::size_t rows) : state_(rows, State::kFree) {
  for (std::size_t i = 0; i < rows; ++i) free_.push_back(i);
  std::make_heap(free_.begin(), free_.end(), std::greater<>());
}

std::optional<std::size_t> StagingRows::try_acquire() {
  std::lock_guard lock(mu_);
  if (free_.empty()) return std::nullopt;
  std::pop_heap(free_.begin(), free_.end(), std::greater<>());
  std::size_t id = free_.back();
  free_.pop_back();
  state_[id] = State::kAcquired;
  return id;
}

Status StagingRows::release(std::size_t id) {
  std::lock_guard lock(mu_);
  if (id >= state_.size() || state_[id] != State::kAcquired)
    return Status(Code::kBadState, fmt::format("staging row {} is not acquired", id));
  state_[id] = State::kFree;
  free_.push_back(id);
  std::push_heap(free_.begin(), free_.end(), std::greater<>());
  return Status::ok();
}

Status StagingRows::quarantine(std::size_t id) {
  std::lock_guard lock(mu_);
  if (id >= state_.size() || state_[id] != State::kAcquired)
    return Status(Code::kBadState, fmt::format("staging row {} is not acquired", id));
  state_[id] = State::kQuarantined;
  return Status::ok();
}

std::size_t StagingRows::free_rows() const {
  std::lock_guard lock(mu_);
  return free_.size();
}

std::size_t StagingRows::quarantined() const {
  std::lock_guard lock(mu_);
  return static_cast<std::size_t>(std::count(state_.begin(), state_.end(), State::kQuarantined));
}

Result<std::unique_ptr<SlotStager>> SlotStager::create(DeviceCopyExecutor& exec, std::size_t rows,
                                                       std::size_t slot_bytes) {
  if (rows == 0 || slot_bytes == 0)
    return Status::invalid("slot staging needs at least one row of at least one byte");
  TIER_ASSIGN_OR_RETURN(DeviceBuffer memory,
                        DeviceBuffer::allocate(exec.options().device, rows * slot_bytes));
  return std::unique_ptr<SlotStager>(new SlotStager(exec, rows, slot_bytes, std::move(memory)));
}

SlotStager::SlotStager(DeviceCopyExecutor& exec, std::size_t rows, std::size_t slot_bytes,
                       DeviceBuffer memory)
    : exec_(exec), slot_bytes_(slot_bytes), memory_(std::move(memory)), rows_(rows) {}

Region SlotStager::row_region(std::size_t row) const noexcept {
  return memory_.region().slice(row * slot_bytes_, slot_bytes_);
}

Result<SlotStager::Transfer> SlotStager::start(const CopyPlan& plan, Region host_image,
                                               const Stream& s, bool snapshot) {
  if (plan.image_bytes != slot_bytes_ || host_image.size < slot_bytes_)
    return Status::invalid(fmt::format("slot image of {} bytes (host {}) does not match the "
                                       "stager's {}",
                                       plan.image_bytes, host_image.size, slot_bytes_));
  auto row = rows_.try_acquire();
  if (!row) return Status(Code::kRejected, "no free SLOT staging row");
  Transfer t;
  t.row = *row;
  Region staging = row_region(*row);
  Region host = host_image.slice(0, slot_bytes_);
  auto event = Event::create(exec_.options().device);
  Status st = event ? Status::ok() : event.status();
  if (st && snapshot) {
    st = exec_.gather_async(plan, staging, s);
    if (st) st = copy_async(host, staging, s);
  } else if (st) {
    st = copy_async(staging, host, s);
    if (st) st = exec_.scatter_async(plan, staging, s);
  }
  if (st) st = event->record(s);
  if (!st) {
    // Some of the work may be enqueued and its end can no longer be observed.
    rows_.quarantine(*row).ignore();
    return st;
  }
  t.done = std::move(event).value();
  t.open = true;
  return t;
}

Result<SlotStager::Transfer> SlotStager::snapshot(const CopyPlan& plan, Region host_image,
                                                  const Stream& s) {
  return start(plan, host_image, s, true);
}

Result<SlotStager::Transfer> SlotStager::restore(const CopyPlan& plan, Region host_image,
                                                 const Stream& s) {
  return start(plan, host_image, s, false);
}

Status SlotStager::settle(Transfer& t, Result<bool> done) {
  if (done && !*done) return Status(Code::kRetry, "SLOT transfer still running");
  t.open = false;
  if (!done) {
    rows_.quarantine(t.row).ignore();
    return Status(Code::kDeviceError,
                  fmt::format("SLOT staging row {} quarantined: {}", t.row,
                              done.status().to_string()));
  }
  return rows_.release(t.row);
}

Status SlotStager::poll(Transfer& t) {
  if (!t.open) return Status(Code::kBadState, "SLOT transfer already finished");
  return settle(t, t.done.done());
}

Status SlotStager::wait(Transfer& t) {
  if (!t.open) return Status(Code::kBadState, "SLOT transfer already finished");
  Status s = t.done.synchronize();
  return settle(t, s ? Result<bool>(true) : Result<bool>(s));
}

}  // namespace tier::gpu
