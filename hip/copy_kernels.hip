// The copy-plan kernel and the device executor (gpu.hpp: DeviceCopyExecutor).
//
// A transfer becomes a list of tiles: pieces of at most kTileBytes of one span, each with its
// source and destination address already resolved (engine memory, and the image: device memory,
// mapped pinned host memory, or the staging buffer). The tile list is written to a pinned
// descriptor slot that the kernel reads in place (mapped: no copy engine, so a launch never
// queues behind another stream's DMA), and one launch moves every tile: each block takes
// tiles in a grid-stride loop; threads copy 16-byte words (kUnroll loads in flight before their
// stores, for latency over PCIe) when source and destination share their 16-byte alignment, and
// bytes otherwise; a misaligned head and the tail of a tile go byte by byte.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "gpu.hpp"
#include "gpu_runtime.hpp"

namespace tier::gpu {
namespace {

constexpr std::uint64_t kTileBytes = 64u << 10;
constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int kBlocksPerSm = 8;
constexpr std::size_t kDescriptorSlots = 32;

struct Tile {
  const unsigned char* src;
  unsigned char* dst;
  unsigned long long bytes;
};

// With `gate` set, the launch copies only if *gate == kVerdictMatch (a verified payload).
__global__ void __launch_bounds__(kThreads) copy_tiles(const Tile* __restrict__ tiles,
                                                       unsigned int count,
                                                       const unsigned int* gate) {
  if (gate != nullptr && *gate != kVerdictMatch) return;
  for (unsigned int t = blockIdx.x; t < count; t += gridDim.x) {
    const Tile tile = tiles[t];
    const unsigned char* s = tile.src;
    unsigned char* d = tile.dst;
    const unsigned int n = static_cast<unsigned int>(tile.bytes);
    const auto sa = reinterpret_cast<unsigned long long>(s);
    if (((sa ^ reinterpret_cast<unsigned long long>(d)) & 15u) != 0) {
      for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
      continue;
    }
    unsigned int head = static_cast<unsigned int>((16u - (sa & 15u)) & 15u);
    if (head > n) head = n;
    const unsigned int words = (n - head) / 16u;
    const unsigned int tail_at = head + words * 16u;
    if (threadIdx.x < head) d[threadIdx.x] = s[threadIdx.x];
    if (threadIdx.x < n - tail_at) d[tail_at + threadIdx.x] = s[tail_at + threadIdx.x];
    const uint4* vs = reinterpret_cast<const uint4*>(s + head);
    uint4* vd = reinterpret_cast<uint4*>(d + head);
    for (unsigned int base = 0; base < words; base += kThreads * kUnroll) {
      uint4 r[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const unsigned int i = base + k * kThreads + threadIdx.x;
        if (i < words) r[k] = vs[i];
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const unsigned int i = base + k * kThreads + threadIdx.x;
        if (i < words) vd[i] = r[k];
      }
    }
  }
}

rt::StreamHandle stream_of(const Stream& s) { return static_cast<rt::StreamHandle>(s.handle()); }

// Busy-waits `ticks` of the device's wall clock (rt::wall_ticks): a forward layer of known
// duration, the same wall time whether the shader clock boosts or other kernels share the
// multiprocessors.
__global__ void spin_wall(unsigned long long ticks) {
  const unsigned long long start = rt::wall_ticks();
  while (rt::wall_ticks() - start < ticks) {
  }
}

// The wall clock's rate per device in kHz, once known (0: not asked yet); devices past the
// table ask the runtime every time.
constexpr int kCachedDevices = 64;
std::atomic<std::uint64_t> wall_khz[kCachedDevices];

// Appends the tiles of every span's part inside the image window [lo, hi), with the window's
// first byte at `window` (device-addressable).
void build_tiles(const CopyPlan& plan, std::uint64_t lo, std::uint64_t hi, std::byte* window,
                 bool gather, std::vector<Tile>& out) {
  out.clear();
  for (const CopySpan& span : plan.spans) {
    std::uint64_t a = std::max(lo, span.image_offset);
    std::uint64_t b = std::min(hi, span.image_offset + span.bytes);
    for (std::uint64_t x = a; x < b; x += kTileBytes) {
      std::uint64_t n = std::min(kTileBytes, b - x);
      auto* engine = reinterpret_cast<unsigned char*>(span.engine + (x - span.image_offset));
      auto* image = reinterpret_cast<unsigned char*>(window + (x - lo));
      out.push_back(gather ? Tile{engine, image, n} : Tile{image, engine, n});
    }
  }
}

}  // namespace

// Descriptor slots (mapped pinned memory holding a tile list, and its device address), reused
// round robin once the launch that read them has completed; and the staging buffer of staged
// transfers.
struct DeviceCopyExecutor::Impl {
  struct Slot {
    PinnedBuffer host;
    const Tile* mapped = nullptr;  // host's device address
    Event done;
    bool in_use = false;
  };
  int device = 0;
  int multiprocessors = 1;
  std::vector<Slot> slots;
  std::size_t next_slot = 0;
  std::vector<Tile> tiles;
  DeviceBuffer staging;
  Event staging_done;
  Event order;  // recorded on a caller's stream by order_after() when it gives no event
  Event done;   // behind each gather() / scatter() on the executor's stream
  void* staging_stream = nullptr;  // the stream of the last staged transfer

  Status launch(const Stream& s, const std::uint32_t* gate = nullptr) noexcept;
  Status claim_staging(const Stream& s, std::size_t bytes) noexcept;
};

Status DeviceCopyExecutor::Impl::launch(const Stream& s, const std::uint32_t* gate) noexcept {
  if (tiles.empty()) return Status::ok();
  Slot& slot = slots[next_slot];
  next_slot = (next_slot + 1) % slots.size();
  if (slot.in_use) {
    TIER_RETURN_IF_ERROR(slot.done.synchronize());
    slot.in_use = false;
  }
  const std::size_t bytes = tiles.size() * sizeof(Tile);
  if (slot.host.size() < bytes) {
    // Room for 2,730 tiles (a 170 MiB image) from the start: growing a slot frees its buffer,
    // which waits for the whole device, and slots are taken in turn, so each would grow once.
    std::size_t cap = std::max<std::size_t>(bytes, 64 * 1024);
    slot.mapped = nullptr;
    TIER_ASSIGN_OR_RETURN(slot.host, PinnedBuffer::allocate(cap));
    slot.mapped = static_cast<const Tile*>(rt::mapped_device_pointer(slot.host.data()));
    if (slot.mapped == nullptr)
      return Status(Code::kDeviceError, "copy executor: descriptor slot is not mapped");
  }
  std::memcpy(slot.host.data(), tiles.data(), bytes);
  const auto count = static_cast<unsigned int>(tiles.size());
  const unsigned int grid =
      std::min<unsigned int>(count, static_cast<unsigned int>(multiprocessors * kBlocksPerSm));
  copy_tiles<<<grid, kThreads, 0, stream_of(s)>>>(
      slot.mapped, count, gate);
  TIER_GPU_TRY(rt::clear_last_error());
  TIER_RETURN_IF_ERROR(slot.done.record(s));
  slot.in_use = true;
  return Status::ok();
}

Status DeviceCopyExecutor::Impl::claim_staging(const Stream& s, std::size_t bytes) noexcept {
  // Another stream may still be using the buffer: wait for its last staged transfer.
  if (staging_stream != nullptr && staging_stream != s.handle())
    TIER_RETURN_IF_ERROR(staging_done.synchronize());
  staging_stream = s.handle();
  if (staging.size() < bytes) {
    staging = DeviceBuffer();
    TIER_ASSIGN_OR_RETURN(staging, DeviceBuffer::allocate(device, bytes));
  }
  return Status::ok();
}

Result<std::unique_ptr<DeviceCopyExecutor>> DeviceCopyExecutor::create(
    const ExecutorOptions& opts) noexcept {
  if (opts.staging_bytes < kTileBytes)
    return Status::invalid("staging_bytes must be at least " + std::to_string(kTileBytes));
  TIER_ASSIGN_OR_RETURN(DeviceInfo info, device_info(opts.device));
  TIER_ASSIGN_OR_RETURN(Stream stream, Stream::create(opts.device));
  auto impl = std::make_unique<Impl>();
  impl->device = opts.device;
  impl->multiprocessors = std::max(1, info.multiprocessors);
  impl->slots.resize(kDescriptorSlots);
  for (Impl::Slot& slot : impl->slots) {
    TIER_ASSIGN_OR_RETURN(slot.done, Event::create(opts.device));
  }
  TIER_ASSIGN_OR_RETURN(impl->staging_done, Event::create(opts.device));
  TIER_ASSIGN_OR_RETURN(impl->order, Event::create(opts.device));
  TIER_ASSIGN_OR_RETURN(impl->done, Event::create(opts.device));
  return std::unique_ptr<DeviceCopyExecutor>(
      new DeviceCopyExecutor(opts, std::move(stream), std::move(impl)));
}

DeviceCopyExecutor::DeviceCopyExecutor(ExecutorOptions opts, Stream stream,
                                       std::unique_ptr<Impl> impl)
    : opts_(opts), stream_(std::move(stream)), impl_(std::move(impl)) {}

DeviceCopyExecutor::~DeviceCopyExecutor() {
  // Descriptor slots and staging may still be read by launches in flight.
  for (Impl::Slot& slot : impl_->slots)
    if (slot.in_use) slot.done.synchronize().ignore();
  if (impl_->staging_stream != nullptr) impl_->staging_done.synchronize().ignore();
}

ImagePath DeviceCopyExecutor::path_for(MemoryKind kind, std::size_t bytes,
                                       bool gather) const noexcept {
  if (kind == MemoryKind::kDevice) return ImagePath::kZeroCopy;  // the kernel writes it directly
  if (kind == MemoryKind::kHost) return ImagePath::kStaged;
  if (opts_.path != ImagePath::kAuto) return opts_.path;
  return bytes <= (gather ? opts_.zero_copy_max_gather : opts_.zero_copy_max_scatter)
             ? ImagePath::kZeroCopy
             : ImagePath::kStaged;
}

Status DeviceCopyExecutor::run(const CopyPlan& plan, Region image, const Stream& s,
                               bool gather, const std::uint32_t* gate) noexcept {
  if (plan.engine_kind != MemoryKind::kDevice)
    return Status::invalid("the GPU executor moves device-kind plans only");
  if (image.data == nullptr || image.size < plan.image_bytes)
    return Status::invalid("image of " + std::to_string(image.size) +
                           " bytes is smaller than the plan's " +
                           std::to_string(plan.image_bytes));
  for (const CopySpan& span : plan.spans)
    if (span.bytes > plan.image_bytes || span.image_offset > plan.image_bytes - span.bytes)
      return Status::invalid("copy span outside the image");
  if (plan.image_bytes == 0) return Status::ok();
  DeviceGuard guard(opts_.device);
  TIER_RETURN_IF_ERROR(guard.status());
  Impl& im = *impl_;

  // A host image declared pageable may still be registered memory: detect it.
  std::byte* window = image.data;  // the image as the kernel addresses it
  MemoryKind kind = image.kind;
  if (kind != MemoryKind::kDevice) {
    window = static_cast<std::byte*>(rt::mapped_device_pointer(image.data));
    kind = window != nullptr ? MemoryKind::kPinnedHost : MemoryKind::kHost;
  }
  ImagePath path = path_for(kind, plan.image_bytes, gather);
  if (path == ImagePath::kZeroCopy) {
    build_tiles(plan, 0, plan.image_bytes, window, gather, im.tiles);
    return im.launch(s, gate);
  }
  if (gate != nullptr) return Status::invalid("a gated scatter needs its image in device memory");

  const std::size_t chunk = std::min<std::size_t>(opts_.staging_bytes, plan.image_bytes);
  TIER_RETURN_IF_ERROR(im.claim_staging(s, chunk));
  for (std::uint64_t lo = 0; lo < plan.image_bytes; lo += chunk) {
    const std::uint64_t hi = std::min<std::uint64_t>(plan.image_bytes, lo + chunk);
    build_tiles(plan, lo, hi, im.staging.data(), gather, im.tiles);
    if (gather) {
      TIER_RETURN_IF_ERROR(im.launch(s));
      TIER_GPU_TRY(rt::memcpy_async(image.data + lo, im.staging.data(), hi - lo, stream_of(s)));
    } else {
      TIER_GPU_TRY(rt::memcpy_async(im.staging.data(), image.data + lo, hi - lo, stream_of(s)));
      TIER_RETURN_IF_ERROR(im.launch(s));
    }
  }
  return im.staging_done.record(s);
}

Status DeviceCopyExecutor::gather_async(const CopyPlan& plan, Region image,
                                        const Stream& s) noexcept {
  return run(plan, image, s, true);
}

Status DeviceCopyExecutor::scatter_async(const CopyPlan& plan, Region image, const Stream& s,
                                         const std::uint32_t* gate) noexcept {
  return run(plan, image, s, false, gate);
}

Status DeviceCopyExecutor::order_after(void* stream, void* event) noexcept {
  DeviceGuard guard(opts_.device);
  TIER_RETURN_IF_ERROR(guard.status());
  if (event != nullptr) return stream_wait_event(stream_, event);
  if (stream == nullptr) return Status::invalid("order_after: neither a stream nor an event");
  TIER_RETURN_IF_ERROR(record_on(impl_->order, stream));
  return stream_wait_event(stream_, impl_->order.handle());
}

Status DeviceCopyExecutor::gather(const CopyPlan& plan, std::span<std::byte> image) noexcept {
  TIER_RETURN_IF_ERROR(run(plan, Region{image.data(), image.size(), MemoryKind::kHost, -1},
                           stream_, true));
  TIER_RETURN_IF_ERROR(impl_->done.record(stream_));
  return impl_->done.synchronize();
}

Status DeviceCopyExecutor::scatter(const CopyPlan& plan, std::span<const std::byte> image) noexcept {
  auto* p = const_cast<std::byte*>(image.data());  // only read: the image is the copy source
  TIER_RETURN_IF_ERROR(run(plan, Region{p, image.size(), MemoryKind::kHost, -1}, stream_, false));
  TIER_RETURN_IF_ERROR(impl_->done.record(stream_));
  return impl_->done.synchronize();
}

Result<WallClock> wall_clock(int device) noexcept {
  if (device < 0 || device >= device_count())
    return Status::invalid("no GPU with ordinal " + std::to_string(device));
  WallClock c;
  c.counter = rt::kWallCounter;
  unsigned long long khz = 0;
  TIER_GPU_TRY(rt::wall_clock_rate(device, &khz, &c.rate_from));
  if (khz == 0)
    return Status(Code::kNotSupported,
                  "wall clock of GPU " + std::to_string(device) + ": " + c.rate_from);
  c.khz = khz;
  return c;
}

Status spin_async(void* stream, int device, std::uint64_t nanoseconds, int blocks) noexcept {
  if (stream == nullptr || blocks < 1)
    return Status::invalid("spin_async: null stream or no block");
  if (device < 0) return Status::invalid("spin_async: no device");
  std::uint64_t khz =
      device < kCachedDevices ? wall_khz[device].load(std::memory_order_relaxed) : 0;
  if (khz == 0) {
    TIER_ASSIGN_OR_RETURN(WallClock c, wall_clock(device));
    khz = c.khz;
    if (device < kCachedDevices) wall_khz[device].store(khz, std::memory_order_relaxed);
  }
  // ticks = nanoseconds * khz / 10^6, without overflow for rates up to 1 GHz.
  const std::uint64_t ticks =
      nanoseconds / 1000000u * khz + nanoseconds % 1000000u * khz / 1000000u;
  spin_wall<<<blocks, 32, 0, static_cast<rt::StreamHandle>(stream)>>>(ticks);
  TIER_GPU_TRY(rt::clear_last_error());
  return Status::ok();
}

}  // namespace tier::gpu
