#pragma once
// ImagePool: the TierStack's image buffers (private to the core). An ImageBuffer is uninitialized
// bytes that start on a page, its allocation padded to whole pages (the padding zeroed), so that
// the region handed to a tier can be rounded up to its io_alignment (at most a page: O_DIRECT
// tiers). Buffers nobody holds any more go back to the pool and are handed out again, so steady
// state saves and loads neither zero nor fault in fresh memory. The memory comes from the pool's
// ImageMemory (TierStack::set_image_memory) when it has some, else from the heap; each buffer
// returns its memory to where it came from.
//
// Threads: acquire(), recycle() and set_memory() may be called from several threads at once (a
// short lock around the free list; allocation and freeing of memory happen outside it).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>

#include "tier/tier_stack.hpp"

namespace tier::detail {

class ImageBuffer {
 public:
  static constexpr std::size_t kPage = 4096;
  // From `memory` when set and it has the pages, else from the heap. Throws std::bad_alloc.
  explicit ImageBuffer(std::size_t bytes, std::shared_ptr<ImageMemory> memory = nullptr);
  std::byte* data() noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return cap_; }
  void resize(std::size_t n) noexcept { size_ = n; }  // n <= capacity()
  std::span<std::byte> span() noexcept { return {data_.get(), size_}; }
  // The ImageMemory that holds the bytes; null: the heap.
  const ImageMemory* memory() const noexcept { return data_.get_deleter().memory.get(); }

 private:
  struct Free {
    std::shared_ptr<ImageMemory> memory;  // null: the heap
    std::size_t bytes = 0;                // the allocation, padding included
    void operator()(std::byte* p) const noexcept;
  };
  std::unique_ptr<std::byte[], Free> data_;
  std::size_t size_, cap_;
};

// Shared by the request that reads or writes it and the call that made it.
using Image = std::shared_ptr<ImageBuffer>;

class ImagePool {
 public:
  // Keeps at most `max_bytes` of free buffers.
  explicit ImagePool(std::uint64_t max_bytes) : max_bytes_(max_bytes) {}
  // A buffer of `bytes` (its size), from the pool when one of a fitting capacity is free.
  // Throws std::bad_alloc.
  Image acquire(std::size_t bytes);
  // Returns `image` to the pool when nobody else holds it and its memory is the pool's current
  // one; resets it either way.
  void recycle(Image& image) noexcept;
  // New buffers come from `memory` (null: the heap); the free ones are dropped.
  void set_memory(std::shared_ptr<ImageMemory> memory) noexcept;

 private:
  std::mutex mu_;                                 // free_, bytes_, memory_
  std::multimap<std::size_t, ImageBuffer> free_;  // by capacity
  std::uint64_t bytes_ = 0;
  std::shared_ptr<ImageMemory> memory_;
  const std::uint64_t max_bytes_;
};

}  // namespace tier::detail
