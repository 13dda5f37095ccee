#include "image_pool.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>

namespace tier::detail {

ImageBuffer::ImageBuffer(std::size_t bytes) : size_(bytes), cap_(bytes) {
  const std::size_t padded = (std::max<std::size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kPage, padded));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p + bytes, 0, padded - bytes);  // the padding a rounded-up region writes out
  data_.reset(p);
}

void ImageBuffer::Free::operator()(std::byte* p) const noexcept { std::free(p); }

Image ImagePool::acquire(std::size_t bytes) {
  std::optional<ImageBuffer> found;
  {
    std::lock_guard lock(mu_);
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first <= 2 * bytes + ImageBuffer::kPage) {
      found.emplace(std::move(it->second));
      bytes_ -= it->first;
      free_.erase(it);
    }
  }
  if (!found) return std::make_shared<ImageBuffer>(bytes);
  found->resize(bytes);
  return std::make_shared<ImageBuffer>(std::move(*found));
}

void ImagePool::recycle(Image& image) noexcept {
  if (image && image.use_count() == 1) {
    try {
      std::lock_guard lock(mu_);
      if (bytes_ + image->capacity() <= max_bytes_) {
        bytes_ += image->capacity();
        free_.emplace(image->capacity(), std::move(*image));
      }
    } catch (const std::bad_alloc&) {  // no node for the list: the buffer is freed instead
    }
  }
  image.reset();
}

}  // namespace tier::detail
