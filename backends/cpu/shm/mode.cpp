#include "shm/mode.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "device_transfer.hpp"
#include "shm/store.hpp"
#include "tier/options.hpp"

namespace tier::cpu {

namespace {

// The store reports evictions by key only: the image may be gone before the callback runs.
ShmStore::EvictFn by_key(const CpuMode::EvictFn& on_evict) {
  return [&on_evict](const ObjectKey& k, std::uint64_t bytes) { on_evict(k, {}, bytes); };
}

// A put's completion reports the image size when the object is (or already was) stored.
CpuMode::Outcome put_outcome(Status s, std::uint64_t image_bytes) {
  const bool stored = s.is_ok() || s.code() == Code::kAlreadyExists;
  return {std::move(s), stored ? image_bytes : 0};
}

// An operation's outcome, or IoError when the segment was truncated under it (shm/guard.hpp):
// what it read or wrote after that was private zeros.
CpuMode::Outcome checked(const ShmStore& store, CpuMode::Outcome o) {
  if (Status st = store.intact(); !st.is_ok()) return {std::move(st), 0};
  return o;
}

}  // namespace

Result<std::unique_ptr<CpuMode>> ShmMode::create(const BackendContext& ctx, PinFn pin) {
  const Json& o = ctx.options;
  ShmConfig cfg;
  cfg.segment = o.value("segment", std::string("libtier-cpu"));
  cfg.capacity = ctx.capacity_bytes;
  cfg.block_bytes = o.value("block_size", std::uint64_t{16384});
  cfg.max_objects = o.value("max_objects", std::uint64_t{0});
  const std::string prefault = o.value("prefault", std::string("background"));  // schema: an enum
  cfg.prefault = prefault == "off"    ? ShmPrefault::kOff
                 : prefault == "open" ? ShmPrefault::kOpen
                                      : ShmPrefault::kBackground;
  if (pin != nullptr) cfg.prefault = ShmPrefault::kOff;  // registering it below maps every page
  cfg.mode = static_cast<std::uint32_t>(
      std::stoul(o.value("segment_mode", std::string("0600")), nullptr, 8));  // schema: an enum
  TIER_ASSIGN_OR_RETURN(auto store, ShmStore::open(cfg));
  std::unique_ptr<DeviceTransfer> device;
  if (pin != nullptr) {
    TIER_ASSIGN_OR_RETURN(auto registered, pin(store->mapping()));
    device = std::move(registered);
  }
  return std::unique_ptr<CpuMode>(std::make_unique<ShmMode>(std::move(store), std::move(device)));
}

ShmMode::ShmMode(std::unique_ptr<ShmStore> store, std::unique_ptr<DeviceTransfer> device)
    : store_(std::move(store)), device_(std::move(device)) {}

ShmMode::~ShmMode() = default;

CpuMode::Outcome ShmMode::put(const ObjectKey& key, std::span<const std::byte> image, Stores stores,
                              const EvictFn& on_evict) {
  return checked(*store_,
                 put_outcome(store_->put(key, image, by_key(on_evict), stores), image.size()));
}

CpuMode::Outcome ShmMode::put_with(const ObjectKey& key, std::uint64_t image_bytes,
                                   const PiecesFn& fill, const EvictFn& on_evict) {
  return checked(*store_, put_outcome(store_->put_with(key, image_bytes, fill, by_key(on_evict)),
                                      image_bytes));
}

CpuMode::Outcome ShmMode::get(const ObjectKey& key, std::span<std::byte> out, Stores stores) {
  ShmStore::GetResult g = store_->get(key, out, stores);
  return checked(*store_, {std::move(g.status), g.bytes});
}

CpuMode::Outcome ShmMode::get_with(const ObjectKey& key, std::uint64_t capacity,
                                   const PiecesFn& drain) {
  ShmStore::GetResult g = store_->get_with(key, capacity, drain);
  return checked(*store_, {std::move(g.status), g.bytes});
}

Result<std::uint64_t> ShmMode::contains(const ObjectKey& key) {
  auto r = store_->contains(key);
  if (Status st = store_->intact(); !st.is_ok()) return st;
  return r;
}

Status ShmMode::remove(const ObjectKey& key) {
  Status r = store_->remove(key);
  if (Status st = store_->intact(); !st.is_ok()) return st;
  return r;
}

Usage ShmMode::usage() const noexcept {
  ShmStats s = store_->stats();
  return Usage{s.capacity_bytes, s.used_bytes, s.objects};
}

std::string ShmMode::describe(std::string_view tier_name) const {
  ShmStats s = store_->stats();
  return fmt::format("cpu shm tier \"{}\" on segment {}{}: {} of {} used, {} objects, {} clients",
                     tier_name, s.segment, device_ ? " (registered as pinned memory)" : "",
                     format_size(s.used_bytes), format_size(s.capacity_bytes), s.objects,
                     s.clients);
}

Result<LeaseId> ShmMode::lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                               std::span<std::uint8_t> held, Counter& expiries) {
  std::uint64_t expired = 0;
  auto id = store_->lease(keys, ttl, held, expired);
  expiries.add(expired);
  if (Status st = store_->intact(); !st.is_ok()) {
    if (id) store_->release(*id);
    std::fill(held.begin(), held.end(), std::uint8_t{0});
    return st;
  }
  return id;
}

LeaseEnd ShmMode::release_lease(LeaseId id, Counter&) { return store_->release(id); }

Result<std::vector<ObjectKey>> ShmMode::list_keys(const Key128& ns) {
  TIER_ASSIGN_OR_RETURN(ShmInspection seen, store_->inspect());
  std::vector<ObjectKey> out;
  for (const ShmObjectInfo& o : seen.objects)
    if (o.key.ns == ns && std::string_view(o.state) == "ready") out.push_back(o.key);
  return out;
}

}  // namespace tier::cpu
