#include "cpu_backend.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "tier/object.hpp"
#include "tier/options.hpp"

#if TIER_CPU_SHM
#include "shm_store.hpp"
#endif
#if TIER_CPU_PINNED
#include "pinned_mode.hpp"
#endif

namespace tier::cpu {

Result<std::unique_ptr<CpuBackend>> CpuBackend::create(const BackendContext& ctx) {
  if (ctx.capacity_bytes == 0)
    return Status::invalid("the cpu tier needs a capacity greater than 0");
  const bool pinned = ctx.options.is_object() && ctx.options.value("pinned", false);
#if !TIER_CPU_PINNED
  if (pinned)
    return Status(Code::kNotSupported,
                  "pinned: true needs libtier built with a GPU runtime (meson -Dgpu=auto, cuda or "
                  "hip); this build has none");
#endif
  if (ctx.options.is_object() && ctx.options.value("mode", "heap") == "shm")
    return create_shm(ctx);
  auto b = std::make_unique<CpuBackend>(ctx.tier_name, ctx.capacity_bytes);
#if TIER_CPU_PINNED
  if (pinned) {
    TIER_ASSIGN_OR_RETURN(auto mode, PinnedMode::create_arena(ctx.capacity_bytes));
    b->enable_pinned(std::move(mode));
  }
#endif
  return b;
}

CpuBackend::CpuBackend(std::string tier_name, std::uint64_t capacity)
    : Backend(std::move(tier_name)), capacity_(capacity) {}

CpuBackend::~CpuBackend() = default;

#if !TIER_CPU_SHM
Result<std::unique_ptr<CpuBackend>> CpuBackend::create_shm(const BackendContext&) {
  return Status(Code::kNotSupported,
                "mode \"shm\" needs libtier built with Boost.Interprocess (meson -Dshm=enabled)");
}
#endif

#if TIER_CPU_PINNED
void CpuBackend::enable_pinned(std::unique_ptr<PinnedMode> pinned) {
  pinned_ = std::move(pinned);
#if TIER_CPU_SHM
  if (shm_) return;
#endif
  extents_.emplace(capacity_);
}

void CpuBackend::compact() {
  std::vector<Buffer*> live;
  live.reserve(map_.size());
  for (auto& [key, e] : map_) live.push_back(&e.image);
  std::sort(live.begin(), live.end(),
            [](const Buffer* a, const Buffer* b) { return a->data < b->data; });
  std::byte* const arena = pinned_->arena().data();
  std::byte* cursor = arena;
  for (Buffer* b : live) {
    if (b->data != cursor) std::memmove(cursor, b->data, b->size);
    b->data = cursor;
    cursor += b->size;
  }
  extents_->reset(static_cast<std::uint64_t>(cursor - arena));
  ++compactions_;
}
#endif

MemoryKindMask CpuBackend::memory_kinds() const noexcept {
#if TIER_CPU_PINNED
  if (pinned_) return kHostKinds | kind_bit(MemoryKind::kDevice);
#endif
  return kHostKinds;
}

Capabilities CpuBackend::capabilities() const noexcept {
#if TIER_CPU_SHM
  if (shm_) return shm_capabilities();
#endif
  Capabilities c;
  c.memory_kinds = memory_kinds();
  c.max_object_bytes = capacity_;
  c.verifies_reads = true;
  return c;
}

Usage CpuBackend::usage() const noexcept {
#if TIER_CPU_SHM
  if (shm_) return shm_usage();
#endif
  return Usage{capacity_, used_, map_.size()};
}

std::string CpuBackend::describe() const {
#if TIER_CPU_SHM
  if (shm_) return shm_describe();
#endif
#if TIER_CPU_PINNED
  if (pinned_)
    return fmt::format("cpu heap tier \"{}\" in pinned memory: {} of {} used, {} objects, {} free "
                       "extents, {} compactions",
                       tier_name(), format_size(used_), format_size(capacity_), map_.size(),
                       extents_->free_extents(), compactions_);
#endif
  return fmt::format("cpu heap tier \"{}\": {} of {} used, {} objects", tier_name(),
                     format_size(used_), format_size(capacity_), map_.size());
}

CpuBackend::Buffer CpuBackend::allocate(std::size_t bytes) {
#if TIER_CPU_PINNED
  if (pinned_) {
    // put() evicted until used_ + bytes <= capacity_, so the arena has the free bytes; when they
    // are scattered, packing the live objects makes them one extent.
    auto offset = extents_->allocate(bytes);
    if (!offset && extents_->free_bytes() >= bytes) {
      compact();
      offset = extents_->allocate(bytes);
    }
    if (!offset) return Buffer{};
    return Buffer{pinned_->arena().data() + *offset, bytes, nullptr};
  }
#endif
  auto it = spare_.find(bytes);
  if (it != spare_.end()) {
    Buffer b = std::move(it->second);
    spare_.erase(it);
    spare_bytes_ -= bytes;
    return b;
  }
  // Spare buffers of other sizes count against the capacity: give them back first.
  while (!spare_.empty() && used_ + spare_bytes_ + bytes > capacity_) {
    spare_bytes_ -= spare_.begin()->first;
    spare_.erase(spare_.begin());
  }
  Buffer b;
  b.heap.reset(new (std::nothrow) std::byte[bytes]);
  b.data = b.heap.get();
  b.size = bytes;
  return b;
}

void CpuBackend::release(Buffer b) {
  if (!b.data) return;
#if TIER_CPU_PINNED
  if (pinned_) {
    extents_->release(static_cast<std::uint64_t>(b.data - pinned_->arena().data()), b.size);
    return;
  }
#endif
  spare_bytes_ += b.size;
  std::size_t size = b.size;
  spare_.emplace(size, std::move(b));
}

Completion CpuBackend::put(const IoRequest& r) {
  auto it = map_.find(r.key);
  if (it != map_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return {r.user_data, Status(Code::kAlreadyExists, ""), it->second.image.size};
  }
  std::size_t bytes = r.buf.size;
  if (bytes > capacity_)
    return {r.user_data,
            Status(Code::kNoSpace, fmt::format("object of {} bytes exceeds the tier capacity {}",
                                               bytes, capacity_)),
            0};
  while (used_ + bytes > capacity_ && !lru_.empty()) {
    ObjectKey victim = lru_.back();
    auto v = map_.find(victim);
    Buffer image = std::move(v->second.image);
    used_ -= image.size;
    lru_.pop_back();
    map_.erase(v);
    notify_evicted(victim, {image.data, image.size}, image.size);
    release(std::move(image));
  }
  Buffer b = allocate(bytes);
  if (!b.data) return {r.user_data, Status(Code::kNoSpace, "out of host memory"), 0};
#if TIER_CPU_PINNED
  if (r.buf.kind == MemoryKind::kDevice) {  // accepted only in the pinned mode
    const Piece piece{b.data, bytes};
    Status s = pinned_->put_from_device(std::span(&piece, 1), r.buf, r.key);
    if (!s) {
      release(std::move(b));
      return {r.user_data, std::move(s), 0};
    }
  } else {
    std::memcpy(b.data, r.buf.data, bytes);
  }
#else
  std::memcpy(b.data, r.buf.data, bytes);
#endif
  lru_.push_front(r.key);
  used_ += bytes;
  map_.emplace(r.key, Entry{std::move(b), lru_.begin()});
  return {r.user_data, Status::ok(), bytes};
}

Completion CpuBackend::get(const IoRequest& r) {
  auto it = map_.find(r.key);
  if (it == map_.end()) return {r.user_data, Status::not_found(), 0};
  const Buffer& b = it->second.image;
  if (r.buf.size < b.size)
    return {r.user_data,
            Status::invalid(fmt::format("buffer of {} bytes is too small for {}", r.buf.size,
                                        b.size)),
            b.size};
  lru_.splice(lru_.begin(), lru_, it->second.lru);
#if TIER_CPU_PINNED
  if (r.buf.kind == MemoryKind::kDevice) {  // accepted only in the pinned mode
    const Piece piece{b.data, b.size};
    Status v = pinned_->get_to_device(r.buf, std::span(&piece, 1), r.key);
    if (v.code() == Code::kChecksumMismatch) metrics().checksum_failures.add();
    return {r.user_data, std::move(v), b.size};
  }
#endif
  Status v = copy_verified(r.buf.bytes(), {b.data, b.size}, r.key);
  if (!v) metrics().checksum_failures.add();
  return {r.user_data, std::move(v), b.size};
}

Result<std::size_t> CpuBackend::do_submit(std::span<const IoRequest> reqs) noexcept {
#if TIER_CPU_SHM
  if (shm_) return shm_submit(reqs);
#endif
  for (const IoRequest& r : reqs) {
    switch (r.op) {
      case Op::kPut:
        ready_.push_back(put(r));
        break;
      case Op::kGet:
        ready_.push_back(get(r));
        break;
      case Op::kContains: {
        auto it = map_.find(r.key);
        ready_.push_back(it == map_.end()
                             ? Completion{r.user_data, Status::not_found(), 0}
                             : Completion{r.user_data, Status::ok(), it->second.image.size});
        break;
      }
      case Op::kRemove: {
        auto it = map_.find(r.key);
        if (it == map_.end()) {
          ready_.push_back({r.user_data, Status::not_found(), 0});
          break;
        }
        used_ -= it->second.image.size;
        lru_.erase(it->second.lru);
        release(std::move(it->second.image));
        map_.erase(it);
        ready_.push_back({r.user_data, Status::ok(), 0});
        break;
      }
    }
  }
  return reqs.size();
}

Result<std::size_t> CpuBackend::do_poll(std::span<Completion> out, std::size_t,
                                        std::chrono::microseconds) noexcept {
  std::size_t n = std::min(out.size(), ready_.size());
  for (std::size_t i = 0; i < n; ++i) out[i] = std::move(ready_[i]);
  ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(n));
  return n;
}

}  // namespace tier::cpu
