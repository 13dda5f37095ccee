#pragma once
// PinnedTransfer: the GPU side of the CPU tier's pinned modes (option "pinned": true), the
// DeviceTransfer of PinnedHeapMode and of a pinned ShmMode. Built only when libtier has a GPU
// runtime (backends/cpu/meson.build adds the pinned sources and TIER_CPU_PINNED when the GPU floor
// is built); the host side of the tier sees it only through device_transfer.hpp, never a GPU
// runtime header.
//
// It moves bytes between page-locked pieces of stored images and device memory (kind kDevice
// regions of any GPU) through that GPU's gpu::CopyContext, the one the process's other users of
// the GPU share (the DSV4 layout's device KV memory, the C API): its lanes, events and staging
// ring. Copies into device memory run on the context's kToDevice lane, after every order a user
// gave the context (a layout's DeviceOrder), so they never race the caller's forward; copies out
// of device memory on its kFromDevice lane. For the shm mode it also owns the
// gpu::PinnedRegistration (cudaHostRegister / hipHostRegister) of this process's mapping of the
// segment, released when it is destroyed (before the mapping goes away).
//
// Scattered gets verified on the device are batched: each (a payload of at most 8 MiB) is checked
// on the host when submitted and joins the open batch; a batch (up to kMaxVerifyBatch objects,
// 16 MiB of payload) is enqueued as one DMA per run of adjacent stored images into one range of
// the staging ring, one verification launch and one gated copy launch. A batch goes once it holds
// kPluggedBatchBytes (4 MiB); a smaller one at once while fewer than two batches' DMAs are
// running on the GPU, otherwise when one of them has landed, the batch is full, or a caller
// waits. Inside a submit of several gets (plug()), a smaller batch waits for more gets until the
// submit ends: enqueueing a batch costs the host more than one 1 MiB object's DMA takes, so
// batches of one object each would starve the bus. There the batches between the submit's first
// and its last two grow to kLongBatchBytes (8 MiB), and a batch stays open across the submit's
// windows (DeviceTransfer::unplug): fewer DMAs, while what follows the submit's last DMA stays
// one short batch's check and copy.
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
  ~PinnedTransfer() override;

  Status put_from_device(std::span<const Piece> pieces, Region src,
                         const ObjectKey& key) noexcept override;
  Status get_to_device(Region dst, std::span<const Piece> pieces,
                       const ObjectKey& key) noexcept override;
  Result<std::uint64_t> scatter_to_device(std::span<const Piece> pieces,
                                          std::span<std::byte> header, RegionList payload,
                                          const ObjectKey& key, std::size_t skip,
                                          const PayloadCheck* check) noexcept override;
  Result<bool> scatter_done(std::uint64_t ticket, bool wait) noexcept override;
  void plug() noexcept override;
  void unplug(bool more) noexcept override;
  void ahead(std::uint64_t bytes) noexcept override { ahead_ = bytes; }
  void quiesce() noexcept override;

 private:
  // One GPU's share of its CopyContext, created on first use, and an executor on it (the copy
  // kernels of scattered gets).
  struct Gpu {
    std::shared_ptr<gpu::CopyContext> ctx;
    std::unique_ptr<gpu::DeviceCopyExecutor> executor;
    gpu::VerifyCounters counters;  // every verification of this GPU's, on the kToDevice lane
  };
  // A scattered get of the open batch: checked on the host, not yet enqueued.
  struct Item {
    std::uint64_t ticket = 0;
    std::vector<Piece> pieces;
    std::vector<Region> payload;
    std::size_t skip = 0;
    ObjectHeader header;
    std::optional<CrcClaim> claim;
    int verdict = -1;
  };
  // Scattered gets enqueued together; `landed` is recorded behind their DMAs, `done` behind their
  // gated copies.
  struct Batch {
    std::uint64_t id = 0;
    int device = -1;
    std::vector<Item> items;  // until flushed
    std::uint64_t payload_bytes = 0;
    bool flushed = false;
    bool landed_seen = false;  // `landed` was found complete (no need to ask again)
    bool done_seen = false;    // `done` too: its other tickets end without asking the runtime
    gpu::Event landed, done;
    std::size_t open = 0;  // its tickets not yet ended
  };
  // A scattered get in flight: in a batch, or with a transfer of its own (`done`: the event
  // behind its copy); the header to write when done; the host word its verdict lands in when
  // verified on the device (-1: verified on the host); `failed`: why it failed at its batch's
  // flush (reported by scatter_done).
  struct Ticket {
    std::uint64_t id = 0;
    int device = -1;
    std::uint64_t batch = 0;
    gpu::Event done;
    std::vector<gpu::Event> landed;  // behind each part of its own DMA
    std::span<std::byte> header;
    std::array<std::byte, kObjectHeaderBytes> stored{};
    int verdict = -1;
    Status failed;
  };

  PinnedTransfer() = default;
  Result<Gpu*> gpu_for(int device) noexcept;
  Ticket* find(std::uint64_t id) noexcept;
  Batch* find_batch(std::uint64_t id) noexcept;
  // A free verdict word (allocating the words on first use), or -1 when all are in use.
  Result<int> take_verdict() noexcept;
  void release_verdict(int& word) noexcept;
  // Enqueues the open batch (nothing when none): its DMAs, verification and gated copies.
  Status flush() noexcept;
  // Batches flushed on `device` whose DMA is still running.
  std::size_t in_flight(int device) noexcept;
  // A v2 payload too large for a batch: its own DMA in parts into the ring, each verified as it
  // lands (the sidecar of a V4-Pro SLOT). Ok(false): nothing enqueued (the ring cannot take it).
  Result<bool> enqueue_large(Gpu& g, std::span<const Piece> pieces, const ObjectHeader& h,
                             const CrcClaim* crc, RegionList payload, std::size_t skip,
                             Ticket& t) noexcept;
  // Checked on the host, then one copy-kernel launch per piece from the page-locked bytes.
  Status enqueue_host_checked(Gpu& g, std::span<const Piece> pieces, std::span<std::byte> header,
                              RegionList payload, const ObjectKey& key, std::size_t skip,
                              const PayloadCheck* check, Ticket& t) noexcept;
  // Ends a ticket: its verdict word, its events back to its GPU's context, its batch's count.
  void end(std::vector<Ticket>::iterator it, bool events_completed) noexcept;

  std::optional<gpu::PinnedRegistration> registration_;
  std::vector<std::unique_ptr<Gpu>> gpus_;  // by GPU ordinal
  std::vector<Ticket> tickets_;             // in submission order
  std::vector<std::unique_ptr<Batch>> batches_;  // the open one (last, unflushed) and in flight
  gpu::PinnedBuffer verdicts_;              // kVerdicts host words the kernels write verdicts to
  std::vector<bool> verdict_used_;
  std::uint64_t next_ticket_ = 1;
  std::uint64_t next_batch_ = 1;
  bool plugged_ = false;             // inside a submit of several gets (plug())
  bool continuing_ = false;          // unplug(true): the next plug() continues the same submit
  std::size_t plugged_batches_ = 0;  // batches flushed inside the current submit
  std::uint64_t ahead_ = 0;          // inside plug(): payload bytes after the next get (ahead())
};

}  // namespace tier::cpu
