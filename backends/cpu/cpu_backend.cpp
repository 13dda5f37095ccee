#include "cpu_backend.hpp"

#include <cstring>

#include <fmt/format.h>

#include "tier/object.hpp"
#include "tier/options.hpp"

#if TIER_CPU_SHM
#include "shm_store.hpp"
#endif

namespace tier::cpu {

Result<std::unique_ptr<CpuBackend>> CpuBackend::create(const BackendContext& ctx) {
  if (ctx.capacity_bytes == 0)
    return Status::invalid("the cpu tier needs a capacity greater than 0");
  if (ctx.options.is_object() && ctx.options.value("mode", "heap") == "shm")
    return create_shm(ctx);
  return std::make_unique<CpuBackend>(ctx.tier_name, ctx.capacity_bytes);
}

CpuBackend::CpuBackend(std::string tier_name, std::uint64_t capacity)
    : Backend(std::move(tier_name)), capacity_(capacity) {}

#if !TIER_CPU_SHM
Result<std::unique_ptr<CpuBackend>> CpuBackend::create_shm(const BackendContext&) {
  return Status(Code::kNotSupported,
                "mode \"shm\" needs libtier built with Boost.Interprocess (meson -Dshm=enabled)");
}
CpuBackend::~CpuBackend() = default;
#endif

Capabilities CpuBackend::capabilities() const noexcept {
#if TIER_CPU_SHM
  if (shm_) return shm_capabilities();
#endif
  Capabilities c;
  c.memory_kinds = kHostKinds;
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
  return fmt::format("cpu heap tier \"{}\": {} of {} used, {} objects", tier_name(),
                     format_size(used_), format_size(capacity_), map_.size());
}

CpuBackend::Buffer CpuBackend::allocate(std::size_t bytes) {
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
  return Buffer{std::unique_ptr<std::byte[]>(new (std::nothrow) std::byte[bytes]), bytes};
}

void CpuBackend::release(Buffer b) {
  if (!b.data) return;
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
    notify_evicted(victim, {image.data.get(), image.size}, image.size);
    release(std::move(image));
  }
  Buffer b = allocate(bytes);
  if (!b.data) return {r.user_data, Status(Code::kNoSpace, "out of host memory"), 0};
  std::memcpy(b.data.get(), r.buf.data, bytes);
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
  Status v = copy_verified(r.buf.bytes(), {b.data.get(), b.size}, r.key);
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
