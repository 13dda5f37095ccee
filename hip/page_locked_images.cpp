// gpu::page_locked_images() (gpu.hpp): host code over one PinnedBuffer, built by the host
// compiler into libtier_gpu.
#include <iterator>
#include <map>
#include <mutex>
#include <new>

#include "gpu.hpp"
#include "tier/tier_stack.hpp"

namespace tier::gpu {
namespace {

// One page-locked allocation carved into page ranges. The free ranges are kept by offset, each
// merged with its free neighbours when given back; allocate() takes the smallest that fits (the
// lowest on ties) and hands out its end, so the range it splits keeps its node.
class PageLockedImages final : public ImageMemory {
 public:
  static constexpr std::size_t kPage = 4096;

  explicit PageLockedImages(PinnedBuffer arena) : arena_(std::move(arena)) {
    free_.emplace(0, arena_.size());
  }

  std::byte* allocate(std::size_t bytes) noexcept override {
    if (bytes == 0 || bytes % kPage != 0) return nullptr;
    std::lock_guard lock(mu_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second >= bytes && (best == free_.end() || it->second < best->second)) best = it;
    if (best == free_.end()) return nullptr;
    const std::size_t at = best->first + best->second - bytes;
    if (best->second == bytes)
      free_.erase(best);
    else
      best->second -= bytes;
    return arena_.data() + at;
  }

  void free(std::byte* p, std::size_t bytes) noexcept override {
    const std::size_t at = static_cast<std::size_t>(p - arena_.data());
    std::lock_guard lock(mu_);
    auto next = free_.lower_bound(at);
    const bool joins_next = next != free_.end() && at + bytes == next->first;
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        prev->second += bytes;
        if (joins_next) {
          prev->second += next->second;
          free_.erase(next);
        }
        return;
      }
    }
    if (joins_next) {  // the next range starts here now: its node re-keyed, nothing allocated
      auto node = free_.extract(next);
      node.key() = at;
      node.mapped() += bytes;
      free_.insert(std::move(node));
      return;
    }
    try {
      free_.emplace(at, bytes);
    } catch (const std::bad_alloc&) {  // no node for it: the range stays out of use
    }
  }

 private:
  PinnedBuffer arena_;
  std::mutex mu_;                            // free_
  std::map<std::size_t, std::size_t> free_;  // offset -> bytes
};

}  // namespace

Result<std::shared_ptr<ImageMemory>> page_locked_images() noexcept {
  static std::mutex mu;
  static std::weak_ptr<ImageMemory> current;  // kept by the stacks given it
  if (device_count() == 0)
    return Status(Code::kNotSupported, "page-locked image memory: no GPU on this machine");
  std::lock_guard lock(mu);
  if (auto held = current.lock()) return held;
  TIER_ASSIGN_OR_RETURN(PinnedBuffer arena, PinnedBuffer::allocate(page_locked_image_bytes()));
  try {
    std::shared_ptr<ImageMemory> made = std::make_shared<PageLockedImages>(std::move(arena));
    current = made;
    return made;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "page-locked image memory: out of memory");
  }
}

}  // namespace tier::gpu
