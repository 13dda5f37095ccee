#include "pinned_pool.hpp"

#include <cassert>

namespace tier::gpu {

Result<std::unique_ptr<PinnedPool>> PinnedPool::create(std::size_t buffer_bytes,
                                                       std::size_t count) {
  if (buffer_bytes == 0 || count == 0)
    return Status::invalid("a pinned pool needs a buffer size and a count greater than 0");
  std::vector<PinnedBuffer> buffers;
  buffers.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    TIER_ASSIGN_OR_RETURN(PinnedBuffer b, PinnedBuffer::allocate(buffer_bytes));
    buffers.push_back(std::move(b));
  }
  return std::unique_ptr<PinnedPool>(new PinnedPool(buffer_bytes, std::move(buffers)));
}

PinnedPool::PinnedPool(std::size_t buffer_bytes, std::vector<PinnedBuffer> buffers)
    : buffer_bytes_(buffer_bytes), buffers_(std::move(buffers)) {
  for (std::size_t i = buffers_.size(); i > 0; --i) free_.push_back(i - 1);
}

PinnedPool::~PinnedPool() { assert(free_.size() == buffers_.size() && "leases outlive the pool"); }

std::optional<PinnedPool::Lease> PinnedPool::try_acquire() noexcept {
  std::lock_guard lock(mu_);
  if (free_.empty()) return std::nullopt;
  std::size_t i = free_.back();
  free_.pop_back();
  return Lease(this, i);
}

std::size_t PinnedPool::available() const noexcept {
  std::lock_guard lock(mu_);
  return free_.size();
}

void PinnedPool::give_back(std::size_t index) noexcept {
  std::lock_guard lock(mu_);
  free_.push_back(index);
}

PinnedPool::Lease& PinnedPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    if (pool_ != nullptr) pool_->give_back(index_);
    pool_ = o.pool_;
    index_ = o.index_;
    o.pool_ = nullptr;
  }
  return *this;
}

PinnedPool::Lease::~Lease() {
  if (pool_ != nullptr) pool_->give_back(index_);
}

std::span<std::byte> PinnedPool::Lease::bytes() const noexcept {
  return pool_->buffers_[index_].bytes();
}

Region PinnedPool::Lease::region() const noexcept { return pool_->buffers_[index_].region(); }

}  // namespace tier::gpu
