#pragma once
// ShmMode: the CPU tier's "shm" mode (builds with Boost.Interprocess): requests served by a
// ShmStore (shm/store.hpp, docs/shm.md) on a named segment that every process opening it shares.
// Capacity is counted in whole blocks; evicted objects are reported by key only (they are
// dropped, not demoted). With "pinned": true this process's mapping of the segment is registered
// as page-locked memory by its DeviceTransfer, which moves device-memory images straight into and
// out of the blocks. Threads: the tier's owner thread only.

#include <memory>
#include <span>

#include "cpu_mode.hpp"

namespace tier::cpu {

class ShmStore;

class ShmMode final : public CpuMode {
 public:
  // Registers a mapping of the segment for device transfers (the pinned mode).
  using PinFn = Result<std::unique_ptr<DeviceTransfer>> (*)(std::span<std::byte> mapping);

  // Opens (or creates) the segment the options name; with `pin`, then registers its mapping.
  // Returns: ShmStore::open's errors, `pin`'s.
  static Result<std::unique_ptr<CpuMode>> create(const BackendContext& ctx, PinFn pin = nullptr);
  ShmMode(std::unique_ptr<ShmStore> store, std::unique_ptr<DeviceTransfer> device);
  ~ShmMode() override;

  Result<std::uint64_t> contains(const ObjectKey& key) override;
  Status remove(const ObjectKey& key) override;
  // Evicted objects are reported by key only (an empty image): they are dropped, not demoted.
  // A put's bytes are the request's image size when it is stored or already was. The store
  // verifies host copies on the way (copy_verified); a get's `drain` verifies its own.
  Outcome put(const ObjectKey& key, std::span<const std::byte> image, Stores stores,
              const EvictFn& on_evict) override;
  Outcome get(const ObjectKey& key, std::span<std::byte> out, Stores stores) override;
  Outcome put_with(const ObjectKey& key, std::uint64_t image_bytes, const PiecesFn& fill,
                   const EvictFn& on_evict) override;
  Outcome get_with(const ObjectKey& key, std::uint64_t capacity, const PiecesFn& drain) override;

  Result<LeaseId> lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                        std::span<std::uint8_t> held, Counter& expiries) override;
  LeaseEnd release_lease(LeaseId id, Counter& expiries) override;
  // Every process's ready objects of `ns` (ShmStore::inspect, under the segment's lock).
  Result<std::vector<ObjectKey>> list_keys(const Key128& ns) override;

  // The whole segment's, counted in blocks: every process's objects.
  Usage usage() const noexcept override;
  bool shared() const noexcept override { return true; }
  std::string describe(std::string_view tier_name) const override;
  DeviceTransfer* device() noexcept override { return device_.get(); }

 private:
  std::unique_ptr<ShmStore> store_;
  // Declared after store_ so the mapping's registration ends before the mapping does.
  std::unique_ptr<DeviceTransfer> device_;
};

}  // namespace tier::cpu
