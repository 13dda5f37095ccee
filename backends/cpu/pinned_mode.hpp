#pragma once
// PinnedMode: the GPU side of the CPU tier's pinned mode (option "pinned": true). Built only when
// libtier has a GPU runtime (hip/meson.build adds cpu_pinned.cpp and TIER_CPU_PINNED); the host
// side of the tier (cpu_backend.cpp, cpu_shm_mode.cpp) never sees a GPU runtime header.
//
// It owns the page-locked memory of the tier, or the registration that page-locks it:
//  - heap mode: one pinned, device-mapped arena of exactly the tier's capacity
//    (gpu::PinnedBuffer, cudaHostAlloc / hipHostMalloc), allocated once at creation;
//  - shm mode: a gpu::PinnedRegistration (cudaHostRegister / hipHostRegister) of this process's
//    mapping of the segment, released before the mapping goes away.
// and it moves bytes between that memory and device memory (kind kDevice regions of any GPU) with
// runtime DMA on one stream per GPU, created on first use.
//
// A stored image is a list of pieces: contiguous host byte ranges, in image order, that together
// hold it (one piece in heap mode; the block runs of an shm object).
//
// Errors: NotSupported (no GPU), InvalidArgument, DeviceError; nothing throws or exits.
// Threads: the tier's owner thread only.

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "gpu.hpp"
#include "tier/key.hpp"
#include "tier/region.hpp"
#include "tier/status.hpp"

namespace tier::cpu {

using Piece = std::span<std::byte>;

class PinnedMode {
 public:
  // Heap mode: a pinned arena of `bytes`.
  static Result<std::unique_ptr<PinnedMode>> create_arena(std::size_t bytes);
  // Shm mode: page-locks `mapping` (which must outlive the PinnedMode) for the GPUs.
  static Result<std::unique_ptr<PinnedMode>> register_mapping(std::span<std::byte> mapping);

  // The heap arena (empty in shm mode).
  std::span<std::byte> arena() const noexcept;

  // A put from device memory: copies `src` (kind kDevice, exactly the image) into `pieces` and
  // waits for it; then checks what check_request() checks for host images (an object header that
  // names `key` and declares at most the image's length).
  // Returns: Ok, InvalidArgument (bad header), DeviceError.
  Status put_from_device(std::span<const Piece> pieces, Region src, const ObjectKey& key) noexcept;

  // A get into device memory: copies the stored image held by `pieces` into `dst` (kind kDevice,
  // at least the image's size), verifying it on the way like copy_verified (header, `key`, exact
  // length, payload checksum); the checksum is computed on the host while the payload's DMA runs.
  // On a mismatch the destination's header is zeroed before this returns, so the device never
  // holds a valid-looking copy of a corrupt object; nothing is copied at all when the header or
  // key is wrong. Returns when the copy has finished.
  // Returns: Ok, ChecksumMismatch, DeviceError.
  Status get_to_device(Region dst, std::span<const Piece> pieces, const ObjectKey& key) noexcept;

 private:
  PinnedMode() = default;
  Result<gpu::Stream*> stream_for(int device) noexcept;

  std::optional<gpu::PinnedBuffer> arena_;
  std::optional<gpu::PinnedRegistration> registration_;
  std::vector<std::optional<gpu::Stream>> streams_;  // by GPU ordinal
};

// Why "pinned": true cannot run here, or Ok: NotSupported without a GPU.
Status pinned_mode_available() noexcept;

}  // namespace tier::cpu
