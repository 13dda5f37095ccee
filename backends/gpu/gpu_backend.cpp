#include "gpu_backend.hpp"

#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "tier/options.hpp"

namespace tier::gpu {

Result<std::unique_ptr<GpuBackend>> GpuBackend::create(const BackendContext& ctx) {
  if (ctx.capacity_bytes == 0)
    return Status::invalid("the gpu tier needs a capacity greater than 0");
  const int device = ctx.options.value("device", 0);
  const int devices = device_count();
  if (devices == 0)
    return Status(Code::kNotSupported, fmt::format("no {} GPU on this machine", api_name()));
  if (device >= devices)
    return Status::invalid(fmt::format("device {} does not exist ({} GPUs)", device, devices));
  TIER_ASSIGN_OR_RETURN(Stream stream, Stream::create(device));
  std::unique_ptr<PinnedPool> pool;
  const std::uint64_t buffers = ctx.options.value("pinned_staging_buffers", 4ull);
  if (buffers > 0) {
    TIER_ASSIGN_OR_RETURN(pool, PinnedPool::create(ctx.options.value("pinned_staging_bytes",
                                                                     8ull << 20),
                                                   buffers));
  }
  return std::unique_ptr<GpuBackend>(new GpuBackend(ctx.tier_name, ctx.capacity_bytes, device,
                                                    std::move(stream), std::move(pool)));
}

GpuBackend::GpuBackend(std::string tier_name, std::uint64_t capacity, int device, Stream stream,
                       std::unique_ptr<PinnedPool> pool)
    : Backend(std::move(tier_name)),
      capacity_(capacity),
      device_(device),
      stream_(std::move(stream)),
      pool_(std::move(pool)) {}

GpuBackend::~GpuBackend() {
  // Copies in flight still read or write callers' buffers and the pool's leases.
  stream_.synchronize().ignore();
  pending_.clear();
}

Capabilities GpuBackend::capabilities() const noexcept {
  Capabilities c;
  c.memory_kinds = kHostKinds | kind_bit(MemoryKind::kDevice);
  c.max_object_bytes = capacity_;
  return c;
}

Usage GpuBackend::usage() const noexcept { return Usage{capacity_, used_, map_.size()}; }

std::string GpuBackend::describe() const {
  return fmt::format("gpu tier \"{}\" ({} device {}): {} of {} used, {} objects", tier_name(),
                     api_name(), device_, format_size(used_), format_size(capacity_),
                     map_.size());
}

namespace {

// Pageable host memory: the DMA engine cannot read it asynchronously.
bool pageable(const Region& r) {
  return r.kind != MemoryKind::kDevice && r.kind != MemoryKind::kPinnedHost &&
         !is_mapped_pinned(r.data);
}

}  // namespace

Status GpuBackend::enqueue_event(Pending& p) noexcept {
  if (spare_events_.empty()) {
    TIER_ASSIGN_OR_RETURN(Event e, Event::create(device_));
    spare_events_.push_back(std::move(e));
  }
  TIER_RETURN_IF_ERROR(spare_events_.back().record(stream_));
  p.event.emplace(std::move(spare_events_.back()));
  spare_events_.pop_back();
  return Status::ok();
}

void GpuBackend::evict_one() noexcept {
  ObjectKey victim = lru_.back();
  auto it = map_.find(victim);
  std::vector<std::byte> host(it->second.bytes);
  // Hand the bytes to the stack for demotion when they can be read back; drop them otherwise.
  Status s = copy_async(host_region(host), it->second.image.region(), stream_);
  if (s) s = stream_.synchronize();
  std::size_t bytes = it->second.bytes;
  used_ -= bytes;
  lru_.pop_back();
  map_.erase(it);
  notify_evicted(victim, s ? std::span<const std::byte>(host) : std::span<const std::byte>(),
                 bytes);
}

Result<DeviceBuffer> GpuBackend::allocate(std::size_t bytes) noexcept {
  while (used_ + bytes > capacity_ && !lru_.empty()) evict_one();
  return DeviceBuffer::allocate(device_, bytes);
}

GpuBackend::Pending GpuBackend::put(const IoRequest& r) noexcept {
  Pending p;
  p.done.user_data = r.user_data;
  auto it = map_.find(r.key);
  if (it != map_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    p.done.status = Status(Code::kAlreadyExists, "");
    p.done.bytes = it->second.bytes;
    return p;
  }
  const std::size_t bytes = r.buf.size;
  if (bytes > capacity_) {
    p.done.status = Status(Code::kNoSpace, fmt::format("object of {} bytes exceeds the tier "
                                                       "capacity {}",
                                                       bytes, capacity_));
    return p;
  }
  auto buf = allocate(bytes);
  if (!buf) {
    p.done.status = buf.status();
    return p;
  }
  Region src = r.buf;
  if (pool_ && bytes <= pool_->buffer_bytes() && pageable(src)) {
    if (auto lease = pool_->try_acquire()) {
      std::memcpy(lease->bytes().data(), src.data, bytes);
      src = lease->region().slice(0, bytes);
      p.bounce = std::move(lease);
    }
  }
  Status s = copy_async(buf->region(), src, stream_);
  if (s) s = enqueue_event(p);
  if (!s) {
    p.done.status = s;
    return p;
  }
  lru_.push_front(r.key);
  used_ += bytes;
  map_.emplace(r.key, Entry{std::move(buf).value(), bytes, lru_.begin()});
  p.done.bytes = bytes;
  return p;
}

GpuBackend::Pending GpuBackend::get(const IoRequest& r) noexcept {
  Pending p;
  p.done.user_data = r.user_data;
  auto it = map_.find(r.key);
  if (it == map_.end()) {
    p.done.status = Status::not_found();
    return p;
  }
  const std::size_t bytes = it->second.bytes;
  if (r.buf.size < bytes) {
    p.done.status = Status::invalid(fmt::format("buffer of {} bytes is too small for {}",
                                                r.buf.size, bytes));
    p.done.bytes = bytes;
    return p;
  }
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  Region dst = r.buf.slice(0, bytes);
  if (pool_ && bytes <= pool_->buffer_bytes() && pageable(dst)) {
    if (auto lease = pool_->try_acquire()) {
      p.get_dst = dst;
      dst = lease->region().slice(0, bytes);
      p.bounce = std::move(lease);
    }
  }
  Status s = copy_async(dst, it->second.image.region(), stream_);
  if (s) s = enqueue_event(p);
  if (!s) {
    p.done.status = s;
    p.bounce.reset();
    return p;
  }
  p.done.bytes = bytes;
  return p;
}

Result<std::size_t> GpuBackend::do_submit(std::span<const IoRequest> reqs) noexcept {
  for (const IoRequest& r : reqs) {
    switch (r.op) {
      case Op::kPut:
        pending_.push_back(put(r));
        break;
      case Op::kGet:
        pending_.push_back(get(r));
        break;
      case Op::kContains: {
        Pending p;
        auto it = map_.find(r.key);
        p.done = it == map_.end() ? Completion{r.user_data, Status::not_found(), 0}
                                  : Completion{r.user_data, Status::ok(), it->second.bytes};
        pending_.push_back(std::move(p));
        break;
      }
      case Op::kRemove: {
        Pending p;
        p.done.user_data = r.user_data;
        auto it = map_.find(r.key);
        if (it == map_.end()) {
          p.done.status = Status::not_found();
        } else {
          used_ -= it->second.bytes;
          lru_.erase(it->second.lru);
          map_.erase(it);  // freeing device memory waits for copies still reading it
        }
        pending_.push_back(std::move(p));
        break;
      }
    }
  }
  return reqs.size();
}

std::size_t GpuBackend::reap(std::span<Completion> out) noexcept {
  std::size_t n = 0;
  while (n < out.size() && !pending_.empty()) {
    Pending& p = pending_.front();
    if (p.event) {
      auto done = p.event->done();
      if (done && !*done) break;  // stream order: nothing behind it is done either
      if (!done) {
        p.done.status = done.status();
        p.done.bytes = 0;
      } else if (p.bounce && p.get_dst.data != nullptr) {
        std::memcpy(p.get_dst.data, p.bounce->bytes().data(), p.done.bytes);
      }
      spare_events_.push_back(std::move(*p.event));
    }
    out[n++] = std::move(p.done);
    pending_.pop_front();
  }
  return n;
}

Result<std::size_t> GpuBackend::do_poll(std::span<Completion> out, std::size_t min,
                                        std::chrono::microseconds wait) noexcept {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::size_t n = reap(out);
  while (n < min && n < out.size() && !pending_.empty() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    n += reap(out.subspan(n));
  }
  return n;
}

Result<std::vector<ObjectKey>> GpuBackend::do_list_keys(const Key128& ns) {
  std::vector<ObjectKey> out;
  for (const auto& [k, e] : map_)
    if (k.ns == ns) out.push_back(k);
  return out;
}

}  // namespace tier::gpu
