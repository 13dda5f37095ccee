#include "extent_allocator.hpp"

#include <cassert>
#include <iterator>

namespace tier::cpu {

ExtentAllocator::ExtentAllocator(std::uint64_t capacity) : capacity_(capacity) { reset(0); }

void ExtentAllocator::insert(std::uint64_t offset, std::uint64_t n) {
  by_offset_.emplace(offset, n);
  by_size_.emplace(n, offset);
  free_bytes_ += n;
}

void ExtentAllocator::erase(std::map<std::uint64_t, std::uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  by_offset_.erase(it);
}

std::optional<std::uint64_t> ExtentAllocator::allocate(std::uint64_t n) {
  assert(n > 0);
  auto fit = by_size_.lower_bound({n, 0});
  if (fit == by_size_.end()) return std::nullopt;
  const auto [bytes, offset] = *fit;
  erase(by_offset_.find(offset));
  if (bytes > n) insert(offset + n, bytes - n);
  return offset;
}

void ExtentAllocator::release(std::uint64_t offset, std::uint64_t n) {
  assert(n > 0 && offset + n <= capacity_);
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first == offset + n) {  // merge with the one after
    n += next->second;
    erase(next);
  }
  auto after = by_offset_.lower_bound(offset);
  if (after != by_offset_.begin()) {  // merge with the one before
    auto prev = std::prev(after);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      n += prev->second;
      erase(prev);
    }
  }
  insert(offset, n);
}

void ExtentAllocator::reset(std::uint64_t used) {
  assert(used <= capacity_);
  by_offset_.clear();
  by_size_.clear();
  free_bytes_ = 0;
  if (used < capacity_) insert(used, capacity_ - used);
}

std::uint64_t ExtentAllocator::largest_free() const noexcept {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

}  // namespace tier::cpu
