#pragma once
// PinnedTransfer: the GPU side of the CPU tier's pinned modes (option "pinned": true), the
// DeviceTransfer of PinnedHeapMode and of a pinned ShmMode. Built only when libtier has a GPU
// runtime (hip/meson.build adds the pinned sources and TIER_CPU_PINNED); the host side of the
// tier sees it only through device_transfer.hpp, never a GPU runtime header.
//
// It moves bytes between page-locked pieces of stored images and device memory (kind kDevice
// regions of any GPU) with runtime DMA on one stream per GPU, created on first use. For the shm
// mode it also owns the gpu::PinnedRegistration (cudaHostRegister / hipHostRegister) of this
// process's mapping of the segment, released when it is destroyed (before the mapping goes away).
//
// Errors: NotSupported (no GPU), InvalidArgument, DeviceError; nothing throws or exits.
// Threads: the tier's owner thread only.

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "device_transfer.hpp"
#include "gpu.hpp"

namespace tier::cpu {

class PinnedTransfer final : public DeviceTransfer {
 public:
  // Why "pinned": true cannot run here, or Ok: NotSupported without a GPU.
  static Status available() noexcept;
  // Transfers for pieces that are already page-locked (the pinned heap arena).
  static Result<std::unique_ptr<PinnedTransfer>> create();
  // Shm mode: page-locks `mapping` (which must outlive the PinnedTransfer) for the GPUs.
  static Result<std::unique_ptr<DeviceTransfer>> register_mapping(std::span<std::byte> mapping);

  Status put_from_device(std::span<const Piece> pieces, Region src,
                         const ObjectKey& key) noexcept override;
  Status get_to_device(Region dst, std::span<const Piece> pieces,
                       const ObjectKey& key) noexcept override;

 private:
  PinnedTransfer() = default;
  Result<gpu::Stream*> stream_for(int device) noexcept;

  std::optional<gpu::PinnedRegistration> registration_;
  std::vector<std::optional<gpu::Stream>> streams_;  // by GPU ordinal
};

}  // namespace tier::cpu
