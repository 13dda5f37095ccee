#pragma once
// Dsv4Layout: the engine's KvLayout (tier::engine::KvLayout) over the DSV4 geometry and codecs
// (codecs/dsv4), with the KV memory of one rank in host memory or in GPU memory
// (Dsv4LayoutOptions::memory).
//
//  - PAGE: dsv4::PageCodec; a chunk's regions are PageCodec::describe(block ids), so a chunk's
//    payload is the reference's block-major, region-minor PAGE image.
//  - SLOT: dsv4::SlotCodec; a boundary's codec frames the image as an AOS1 sidecar whose header
//    carries the boundary tokens, the boundary hash (Boundary::key.lo), the slot fingerprint and
//    the TP geometry, and whose decode checks all of them, then the CRC, before writing a byte.
//
// Memory. `host`: every backing of the geometry is a host allocation and the codecs move bytes
// with memcpy. `device`: every backing is a GPU allocation on `device` (MemoryKind::kDevice
// regions) and both codecs move bytes through the GPU copy executor (hip/gpu.hpp
// DeviceCopyExecutor over the GPU's shared CopyContext: one kernel launch per PAGE chunk or SLOT
// image, zero-copy or staged as the executor decides for the image's memory), so the worker saves
// PAGE chunks and SLOT sidecars
// straight from GPU memory and restores into it, with the same all-or-nothing checks (a SLOT
// frame is checked in host memory before the scatter writes a byte of the state group). This
// header carries no GPU runtime type; a build without the GPU part (gpu=disabled, or no GPU
// compiler) or a machine without the device refuses `device` with NotSupported.
//
// The memory is allocated here and zeroed. visit_host() reaches it from host code: the tests
// and tierbench write a forward pass's content and check restores bit for bit through it
// (apps/tierbench/kv_content.hpp). For device memory it copies through the GPU runtime (a pinned
// host scratch, one synchronized copy per region), so it is a test and benchmark tool, not a
// data path.
//
// Threads: one caller at a time, except snapshot_slot(), which may run beside the codecs' calls
// (the device executor and the copy context are thread-safe). The worker's other calls run under
// its lock; visit_host() must not overlap them (as a forward pass does not overlap the worker's
// save of the same layout in the simulated engines).

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "tier/dsv4/geometry.hpp"
#include "tier/dsv4/page_codec.hpp"
#include "tier/dsv4/slot_codec.hpp"
#include "tier/engine/worker.hpp"
#include "tier/json.hpp"
#include "tier/options.hpp"

namespace tier::dsv4 {

namespace detail {
class KvMemory;  // the backings and how to reach them (kv_memory.hpp)
}

// Where a layout keeps the rank's KV memory.
enum class KvMemoryKind : std::uint8_t { kHost = 0, kDevice = 1 };
std::string_view kv_memory_name(KvMemoryKind k) noexcept;

// JSON form (strict: unknown keys, unknown values and wrong types are errors):
//   {"memory": "host" | "device", "device": 0}
struct Dsv4LayoutOptions {
  KvMemoryKind memory = KvMemoryKind::kHost;
  int device = 0;  // GPU ordinal; used when memory is kDevice

  static std::span<const OptionSpec> options();
  // Errors: InvalidArgument listing every problem with its JSON pointer (under `path`).
  static Result<Dsv4LayoutOptions> from_json(const Json& j, const std::string& path = "");
  Json to_json() const;
};

class Dsv4Layout final : public engine::KvLayout {
 public:
  // Errors: InvalidArgument (geometry, TP, device < 0); NotSupported (`device` memory in a
  // build without the GPU part, or no such GPU on this machine); NoSpace (host allocation);
  // DeviceError (GPU allocation or runtime failure).
  static Result<std::unique_ptr<Dsv4Layout>> create(const Geometry& geometry,
                                                    const Key128& page_namespace,
                                                    std::uint32_t tp_size, std::uint32_t tp_rank,
                                                    const Dsv4LayoutOptions& options = {});
  ~Dsv4Layout() override;

  const Codec& page_codec() const noexcept override { return *page_; }
  Result<std::vector<Region>> page_regions(std::span<const std::uint32_t> block_ids) const override;
  Result<std::vector<Region>> slot_regions(std::int32_t group) const override;
  Result<std::unique_ptr<Codec>> slot_codec(const engine::SlotIdentity& id) const override;
  // block_size x dcp_size of the geometry.
  std::uint32_t block_tokens() const noexcept override;
  // dsv4::slot_fingerprint(geometry, page namespace, tp_size, tp_rank).
  std::array<std::byte, 16> slot_fingerprint(std::uint32_t tp_rank) const override;
  // Device memory: a row of GPU memory (slot_bytes(), allocated on first use) that the load
  // writes through a SLOT codec of one group over it (same identity, same frame checks), and
  // commit() copies into `group` on the executor's lane (one kernel within the GPU, waited for).
  // One row per layout: a second stage_slot() while one is held is Rejected. Host memory:
  // NotSupported (a load is a copy on the caller's thread; a row would only add one).
  // Errors: as slot_codec() and slot_regions(), NoSpace, DeviceError.
  Result<std::unique_ptr<engine::SlotStaging>> stage_slot(const engine::SlotIdentity& id,
                                                          std::int32_t group) override;
  // Device memory: the copy executor's stream waits for `after` (libtier_gpu
  // DeviceCopyExecutor::order_after), so every snapshot, save and load follows the caller's
  // forward without a host wait. Host memory: NotSupported for a non-empty order.
  Status order_after(const engine::DeviceOrder& after) override;
  // The SLOT of `group` as of now, framed as slot_codec(id) frames it. Device memory with
  // `after.stream`: one gather kernel on that stream into the GPU's staging ring, then a copy to
  // pinned host memory on the copy context's download lane, framed (AOS1 header, CRC-32) when
  // the worker asks for the frame; nothing waits on the host. Otherwise the bytes are copied
  // before this returns. Thread-safe with the codecs' calls. Errors: InvalidArgument (group,
  // identity of another rank), DeviceError, NoSpace.
  Result<std::unique_ptr<engine::SlotSnapshot>> snapshot_slot(
      const engine::SlotIdentity& id, std::int32_t group,
      const engine::DeviceOrder& after) override;

  const Geometry& geometry() const noexcept { return geometry_; }
  const Dsv4LayoutOptions& options() const noexcept { return options_; }
  std::uint64_t page_bytes_per_block() const noexcept { return page_->bytes_per_block(); }
  std::uint64_t slot_bytes() const noexcept { return slot_->slot_bytes(); }

  enum class HostAccess : std::uint8_t {
    kRead,   // the views hold the regions' bytes; nothing is written back
    kWrite,  // the views' content is unspecified; `fn` writes every byte, which is written back
  };
  // Runs `fn` once over host-addressable views of `regions` (from page_regions() or
  // slot_regions() of this layout), one view per region, same sizes. Host memory hands the
  // regions themselves; device memory copies through a pinned scratch, synchronously.
  // Errors: InvalidArgument (a region of another memory kind or device), DeviceError.
  Status visit_host(RegionList regions, HostAccess access,
                    const std::function<void(RegionList views)>& fn);

 private:
  Dsv4Layout();
  // InvalidArgument unless `id` names this layout's TP size and rank.
  Status same_rank(const engine::SlotIdentity& id) const;

  Geometry geometry_;
  Key128 page_namespace_;
  std::uint32_t tp_size_ = 1;
  Dsv4LayoutOptions options_;
  // Declared before the codecs: they refer to its executor, so it is destroyed after them.
  std::unique_ptr<detail::KvMemory> memory_;
  std::unique_ptr<PageCodec> page_;
  std::unique_ptr<SlotCodec> slot_;
  // stage_slot()'s row: a SLOT codec of one group over the memory's staging row, made on first
  // use, and whether a SlotStaging holds it (under staging_mu_).
  class StagedSlot;
  std::mutex staging_mu_;
  std::unique_ptr<SlotCodec> staging_;
  bool staging_held_ = false;
};

}  // namespace tier::dsv4
