// The cpu backend's "shm" mode: requests served by a ShmStore (shm_store.hpp).
#include <fmt/format.h>

#include "cpu_backend.hpp"
#include "shm_store.hpp"
#include "tier/options.hpp"

#if TIER_CPU_PINNED
#include "pinned_mode.hpp"
#endif

namespace tier::cpu {

Result<std::unique_ptr<CpuBackend>> CpuBackend::create_shm(const BackendContext& ctx) {
  const Json& o = ctx.options;
  ShmConfig cfg;
  cfg.segment = o.value("segment", std::string("libtier-cpu"));
  cfg.capacity = ctx.capacity_bytes;
  cfg.block_bytes = o.value("block_size", std::uint64_t{16384});
  cfg.max_objects = o.value("max_objects", std::uint64_t{0});
  cfg.prefault = o.value("prefault", false);
#if TIER_CPU_PINNED
  // Before the segment is opened: no GPU means no client slot taken, nothing created.
  if (o.value("pinned", false)) TIER_RETURN_IF_ERROR(pinned_mode_available());
#endif
  TIER_ASSIGN_OR_RETURN(auto store, ShmStore::open(cfg));
  auto b = std::make_unique<CpuBackend>(ctx.tier_name, std::move(store));
#if TIER_CPU_PINNED
  if (o.value("pinned", false)) {
    TIER_ASSIGN_OR_RETURN(auto mode, PinnedMode::register_mapping(b->shm_->mapping()));
    b->enable_pinned(std::move(mode));
  }
#endif
  return b;
}

CpuBackend::CpuBackend(std::string tier_name, std::unique_ptr<ShmStore> shm)
    : Backend(std::move(tier_name)), capacity_(shm->stats().capacity_bytes), shm_(std::move(shm)) {}

Capabilities CpuBackend::shm_capabilities() const noexcept {
  Capabilities c;
  c.memory_kinds = memory_kinds();
  c.max_object_bytes = capacity_;
  c.persistent = true;
  c.shared = true;
  c.verifies_reads = true;  // ShmStore::get copies with copy_verified
  return c;
}

Usage CpuBackend::shm_usage() const noexcept {
  ShmStats s = shm_->stats();
  return Usage{s.capacity_bytes, s.used_bytes, s.objects};
}

std::string CpuBackend::shm_describe() const {
  ShmStats s = shm_->stats();
  const bool pinned = (memory_kinds() & kind_bit(MemoryKind::kDevice)) != 0;
  return fmt::format("cpu shm tier \"{}\" on segment {}{}: {} of {} used, {} objects, {} clients",
                     tier_name(), s.segment, pinned ? " (registered as pinned memory)" : "",
                     format_size(s.used_bytes), format_size(s.capacity_bytes), s.objects,
                     s.clients);
}

Result<std::size_t> CpuBackend::shm_submit(std::span<const IoRequest> reqs) noexcept {
  auto evicted = [this](const ObjectKey& k, std::uint64_t bytes) { notify_evicted(k, {}, bytes); };
  for (const IoRequest& r : reqs) {
    switch (r.op) {
      case Op::kPut: {
#if TIER_CPU_PINNED
        Status s = r.buf.kind == MemoryKind::kDevice  // accepted only in the pinned mode
                       ? shm_->put_with(
                             r.key, r.buf.size,
                             [&](std::span<const Piece> pieces) {
                               return pinned_->put_from_device(pieces, r.buf, r.key);
                             },
                             evicted)
                       : shm_->put(r.key, {r.buf.data, r.buf.size}, evicted);
#else
        Status s = shm_->put(r.key, {r.buf.data, r.buf.size}, evicted);
#endif
        std::size_t bytes = s.is_ok() || s.code() == Code::kAlreadyExists ? r.buf.size : 0;
        ready_.push_back({r.user_data, std::move(s), bytes});
        break;
      }
      case Op::kGet: {
#if TIER_CPU_PINNED
        ShmStore::GetResult g =
            r.buf.kind == MemoryKind::kDevice  // accepted only in the pinned mode
                ? shm_->get_with(r.key, r.buf.size,
                                 [&](std::span<const Piece> pieces) {
                                   return pinned_->get_to_device(r.buf, pieces, r.key);
                                 })
                : shm_->get(r.key, {r.buf.data, r.buf.size});
#else
        ShmStore::GetResult g = shm_->get(r.key, {r.buf.data, r.buf.size});
#endif
        if (g.status.code() == Code::kChecksumMismatch) metrics().checksum_failures.add();
        ready_.push_back({r.user_data, std::move(g.status), static_cast<std::size_t>(g.bytes)});
        break;
      }
      case Op::kContains: {
        auto c = shm_->contains(r.key);
        ready_.push_back(c ? Completion{r.user_data, Status::ok(), static_cast<std::size_t>(*c)}
                           : Completion{r.user_data, c.status(), 0});
        break;
      }
      case Op::kRemove:
        ready_.push_back({r.user_data, shm_->remove(r.key), 0});
        break;
    }
  }
  return reqs.size();
}

}  // namespace tier::cpu
