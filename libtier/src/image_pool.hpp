#pragma once
// ImagePool: the TierStack's image buffers (private to the core). An ImageBuffer is uninitialized
// bytes that start on a page, its allocation padded to whole pages (the padding zeroed), so that
// the region handed to a tier can be rounded up to its io_alignment (at most a page: O_DIRECT
// tiers). Buffers nobody holds any more go back to the pool and are handed out again, so steady
// state saves and loads neither zero nor fault in fresh memory.
//
// Threads: acquire() and recycle() may be called from several threads at once (a short lock
// around the free list; allocation and freeing of memory happen outside it).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>

namespace tier::detail {

class ImageBuffer {
 public:
  static constexpr std::size_t kPage = 4096;
  // Throws std::bad_alloc.
  explicit ImageBuffer(std::size_t bytes);
  std::byte* data() noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return cap_; }
  void resize(std::size_t n) noexcept { size_ = n; }  // n <= capacity()
  std::span<std::byte> span() noexcept { return {data_.get(), size_}; }

 private:
  struct Free {
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
  // Returns `image` to the pool when nobody else holds it; resets it either way.
  void recycle(Image& image) noexcept;

 private:
  std::mutex mu_;  // free_, bytes_
  std::multimap<std::size_t, ImageBuffer> free_;  // by capacity
  std::uint64_t bytes_ = 0;
  const std::uint64_t max_bytes_;
};

}  // namespace tier::detail
