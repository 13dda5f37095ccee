#pragma once
// The KV backings of one Dsv4Layout and how host code reaches them (internal). Host memory is
// implemented in kv_memory.cpp; GPU memory in kv_memory_device.cpp when the build has the GPU
// part (hip/), else kv_memory_no_gpu.cpp refuses it. No GPU runtime type appears here either.

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "tier/copy_plan.hpp"
#include "tier/dsv4/geometry.hpp"
#include "tier/region.hpp"
#include "tier/status.hpp"

namespace tier::dsv4::detail {

// A gather of engine memory into host memory started by KvMemory::snapshot: the bytes as they
// were when it was taken, `header_bytes` free bytes before them for the caller's framing.
class PendingImage {
 public:
  virtual ~PendingImage() = default;
  // The header bytes and the image, once the image is in host memory (waits for its copy).
  // Errors: DeviceError.
  virtual Result<std::span<std::byte>> wait() = 0;
};

class KvMemory {
 public:
  enum class Access : std::uint8_t {
    kRead,   // the views hold the regions' bytes; nothing is written back
    kWrite,  // the views' content is unspecified; `fn` writes every byte, which is written back
  };

  virtual ~KvMemory() = default;
  // One region per geometry backing, in geometry order (what dsv4::bind_memory takes); zeroed.
  virtual const std::vector<Region>& backings() const noexcept = 0;
  // The executor the codecs move bytes with; null means the host executor.
  virtual CopyExecutor* executor() noexcept = 0;
  // Runs `fn` once over host-addressable views of `regions` (spans of the backings), one view
  // per region, same sizes. Host memory hands the regions themselves; device memory copies
  // through a pinned scratch (synchronously). Errors: InvalidArgument (a region outside this
  // memory's kind or device), DeviceError.
  virtual Status visit(RegionList regions, Access access,
                       const std::function<void(RegionList views)>& fn) = 0;
  // Orders the executor's transfers after a caller's stream or event (KvLayout::order_after).
  // Host memory: NotSupported.
  virtual Status order_after(void* stream, void* event) = 0;
  // Takes a snapshot of `plan`'s engine bytes now. Device memory with `stream` (a caller's
  // stream): the gather is enqueued on that stream, behind the caller's work there and ahead of
  // whatever it enqueues next, into a range of the GPU's staging ring, then copied to pinned host
  // memory on the context's download lane; nothing waits on the host. Without `stream`, the
  // gather runs on the executor's lane (after the orders given) and is waited for before this
  // returns. Host memory: a copy made now. Thread-safe with the codecs' transfers.
  // Errors: InvalidArgument (plan), DeviceError, NoSpace.
  virtual Result<std::unique_ptr<PendingImage>> snapshot(const CopyPlan& plan,
                                                         std::size_t header_bytes,
                                                         void* stream) = 0;
  // A row of `bytes` of this memory outside the backings, for a load to land in before
  // commit_row() copies it into them (KvLayout::stage_slot). Allocated on the first call; later
  // calls hand the same row (InvalidArgument when they ask for more). The caller keeps one user
  // at a time. Host memory: NotSupported. Errors: DeviceError, NoSpace.
  virtual Result<Region> staging_row(std::size_t bytes) = 0;
  // Copies `row` (the plan's image) into `plan`'s engine memory after every transfer the
  // executor was given, and returns once it landed. Errors: InvalidArgument, DeviceError.
  virtual Status commit_row(const CopyPlan& plan, Region row) = 0;
};

// Errors: NoSpace.
Result<std::unique_ptr<KvMemory>> make_host_memory(const dsv4::Geometry& geometry);
// Errors: InvalidArgument (device < 0), NotSupported (no GPU part in this build, no such GPU on
// this machine), DeviceError.
Result<std::unique_ptr<KvMemory>> make_device_memory(const dsv4::Geometry& geometry, int device);

}  // namespace tier::dsv4::detail
