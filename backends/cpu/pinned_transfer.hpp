#pragma once
// PinnedTransfer: the GPU side of the CPU tier's pinned modes (option "pinned": true), the
// DeviceTransfer of PinnedHeapMode and of a pinned ShmMode. Built only when libtier has a GPU
// runtime (backends/cpu/meson.build adds the pinned sources and TIER_CPU_PINNED when the GPU floor is built); the host side of the
// tier sees it only through device_transfer.hpp, never a GPU runtime header.
//
// It moves bytes between page-locked pieces of stored images and device memory (kind kDevice
// regions of any GPU) with runtime DMA on one stream per GPU, created on first use. For the shm
// mode it also owns the gpu::PinnedRegistration (cudaHostRegister / hipHostRegister) of this
// process's mapping of the segment, released when it is destroyed (before the mapping goes away).
//
// Errors: NotSupported (no GPU), InvalidArgument, DeviceError; nothing throws or exits.
// Threads: the tier's owner thread only.

#include <array>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "device_transfer.hpp"
#include "gpu.hpp"
#include "tier/object.hpp"

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
  Result<std::uint64_t> scatter_to_device(std::span<const Piece> pieces,
                                          std::span<std::byte> header, RegionList payload,
                                          const ObjectKey& key, std::size_t skip,
                                          const PayloadCheck* check) noexcept override;
  Result<bool> scatter_done(std::uint64_t ticket, bool wait) noexcept override;
  void quiesce() noexcept override;

 private:
  // One GPU's copy resources, created on first use: the stream every transfer to or from that
  // GPU runs on (and the verification and copy kernels of scattered gets), the stream of the
  // scattered gets' DMA into the staging ring, the copy executor of scattered gets (its kernels),
  // and the ring itself (device memory, allocated by the first get verified on the device).
  struct Gpu {
    gpu::Stream stream;
    gpu::Stream dma;
    std::unique_ptr<gpu::DeviceCopyExecutor> executor;
    gpu::DeviceBuffer ring;
    std::uint64_t ring_head = 0;
    bool ring_failed = false;  // the ring could not be allocated: verify on the host
    std::vector<gpu::Event> spare;  // events of reported tickets, completed, for reuse
  };
  // A scattered get in flight: the event behind its copy, and the header to write when done.
  // Verified on the device: its ring range (in use until `done`), the events behind the parts of
  // its DMA, and the host word its verdict lands in.
  struct Ticket {
    std::uint64_t id = 0;
    gpu::Event done;
    std::vector<gpu::Event> landed;  // behind each part of its DMA
    std::span<std::byte> header;
    std::array<std::byte, kObjectHeaderBytes> stored{};
    std::uint64_t ring_lo = 0, ring_hi = 0;
    int verdict = -1;  // index into verdicts_, or -1: verified on the host
  };

  PinnedTransfer() = default;
  Result<Gpu*> gpu_for(int device) noexcept;
  Result<gpu::Stream*> stream_for(int device) noexcept;
  // Device verification of a version 2 payload (see scatter_to_device in the .cpp): enqueues the
  // payload's DMA into `g`'s ring and its verification behind it, filling `t`'s ring range and
  // verdict. Ok(false): nothing enqueued, verify on the host (too large for the ring, no
  // verdict word free, no ring).
  // With `crc`, the verification also owes that claim of the codec's check.
  Result<bool> enqueue_device_check(Gpu& g, std::span<const Piece> pieces, const ObjectHeader& h,
                                    const CrcClaim* crc, Ticket& t) noexcept;
  void release(Ticket& t) noexcept;
  // An event of `g`'s GPU: a spare one, or a new one.
  Result<gpu::Event> take_event(Gpu& g) noexcept;

  std::optional<gpu::PinnedRegistration> registration_;
  std::vector<std::unique_ptr<Gpu>> gpus_;  // by GPU ordinal
  std::vector<Ticket> tickets_;             // in submission order
  gpu::PinnedBuffer verdicts_;              // kVerdicts host words the kernels write verdicts to
  std::vector<bool> verdict_used_;
  std::uint64_t next_ticket_ = 1;
};

}  // namespace tier::cpu
