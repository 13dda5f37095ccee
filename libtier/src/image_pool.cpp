#include "image_pool.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>

namespace tier::detail {

namespace {
// `bytes` rounded up to whole pages.
std::size_t padded_size(std::size_t bytes) noexcept {
  return (std::max<std::size_t>(bytes, 1) + ImageBuffer::kPage - 1) / ImageBuffer::kPage *
         ImageBuffer::kPage;
}
}  // namespace

ImageBuffer::ImageBuffer(std::size_t bytes, std::shared_ptr<ImageMemory> memory)
    : data_(nullptr, Free{std::move(memory), padded_size(bytes)}), size_(bytes), cap_(bytes) {
  Free& f = data_.get_deleter();
  std::byte* p = f.memory ? f.memory->allocate(f.bytes) : nullptr;
  if (p == nullptr) {
    f.memory.reset();  // none left there: the heap
    p = static_cast<std::byte*>(std::aligned_alloc(kPage, f.bytes));
    if (p == nullptr) throw std::bad_alloc();
  }
  std::memset(p + bytes, 0, f.bytes - bytes);  // the padding a rounded-up region writes out
  data_.reset(p);
}

void ImageBuffer::Free::operator()(std::byte* p) const noexcept {
  if (memory)
    memory->free(p, bytes);
  else
    std::free(p);
}

Image ImagePool::acquire(std::size_t bytes) {
  std::optional<ImageBuffer> found;
  std::shared_ptr<ImageMemory> memory;
  {
    std::lock_guard lock(mu_);
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first <= 2 * bytes + ImageBuffer::kPage) {
      found.emplace(std::move(it->second));
      bytes_ -= it->first;
      free_.erase(it);
    } else {
      memory = memory_;
    }
  }
  if (!found) return std::make_shared<ImageBuffer>(bytes, std::move(memory));
  found->resize(bytes);
  return std::make_shared<ImageBuffer>(std::move(*found));
}

void ImagePool::recycle(Image& image) noexcept {
  if (image && image.use_count() == 1) {
    try {
      std::lock_guard lock(mu_);
      if (image->memory() == memory_.get() && bytes_ + image->capacity() <= max_bytes_) {
        bytes_ += image->capacity();
        free_.emplace(image->capacity(), std::move(*image));
      }
    } catch (const std::bad_alloc&) {  // no node for the list: the buffer is freed instead
    }
  }
  image.reset();
}

void ImagePool::set_memory(std::shared_ptr<ImageMemory> memory) noexcept {
  std::multimap<std::size_t, ImageBuffer> dropped;  // freed outside the lock
  std::lock_guard lock(mu_);
  if (memory == memory_) return;
  memory_.swap(memory);
  dropped.swap(free_);
  bytes_ = 0;
}

}  // namespace tier::detail
