#pragma once
// libtier's GPU layer, without GPU runtime types: streams, events, device and pinned host
// buffers (RAII owners), and the device copy-plan executor whose kernels live in
// copy_kernels.hip. Built from the same source by nvcc (CUDA) or hipcc (HIP); this header
// compiles with the host C++ compiler alone, so backends, tests and apps include it and never
// see <cuda_runtime.h> or <hip/hip_runtime.h>.
//
// Errors: every runtime failure comes back as Status kDeviceError with the runtime's message;
// nothing here throws or exits. A machine without a GPU (or driver) has device_count() == 0.
// Threads: objects are thread-compatible (one caller at a time per object), except CopyContext and
// DeviceCopyExecutor, which any number of threads may call at once.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "tier/codec.hpp"
#include "tier/copy_plan.hpp"
#include "tier/region.hpp"
#include "tier/status.hpp"

namespace tier {
class ImageMemory;  // tier/tier_stack.hpp
}

namespace tier::gpu {

// "cuda" or "hip": the runtime this build uses.
std::string_view api_name() noexcept;
// Usable GPUs; 0 when the runtime reports no device or no driver.
int device_count() noexcept;
// The GPU whose memory `p` points into (memory from the runtime's device or managed
// allocators), or -1: host memory, memory the runtime does not know (a stray or forged
// pointer), or no GPU. Lets an edge that takes device pointers from a caller refuse one that
// is not device memory before any kernel or copy touches it.
int device_of(const void* p) noexcept;
// The allocation device memory at `p` lies in: its GPU (device_of(p)) and the range [base,
// base + size) the driver knows as one allocation, which holds `p`; size 0 when the driver
// cannot say. nullopt where device_of(p) is -1. An edge that checks many regions of a few
// allocations (a tensor's rows and heads) looks each allocation up once, and checks that every
// byte of a region is device memory, not only its first.
struct DeviceAllocation {
  int device = -1;
  const std::byte* base = nullptr;
  std::size_t size = 0;
};
std::optional<DeviceAllocation> device_allocation_of(const void* p) noexcept;

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int multiprocessors = 0;
  std::size_t total_bytes = 0;
  std::size_t free_bytes = 0;
};
// Errors: InvalidArgument (no such device), DeviceError.
Result<DeviceInfo> device_info(int device) noexcept;

// Makes `device` current for its lifetime and restores the previous device on destruction.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) noexcept;
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  // Whether the switch succeeded; callers check before touching the device.
  const Status& status() const noexcept { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

// An owned, non-blocking stream on one device, or a view of a caller's stream (view()).
class Stream {
 public:
  static Result<Stream> create(int device) noexcept;
  // A stream of the caller's (cudaStream_t / hipStream_t cast to void*) on `device`, not owned:
  // work can be enqueued on it through this library's calls; it is never destroyed here.
  static Stream view(void* handle, int device) noexcept { return Stream(handle, device, false); }
  Stream() = default;  // empty until assigned from create()
  Stream(Stream&& o) noexcept : handle_(o.handle_), device_(o.device_), owned_(o.owned_) {
    o.handle_ = nullptr;
  }
  Stream& operator=(Stream&& o) noexcept;
  ~Stream();
  void* handle() const noexcept { return handle_; }  // cudaStream_t / hipStream_t
  int device() const noexcept { return device_; }
  Status synchronize() const noexcept;

 private:
  Stream(void* h, int device, bool owned = true) : handle_(h), device_(device), owned_(owned) {}
  void* handle_ = nullptr;
  int device_ = 0;
  bool owned_ = true;
};

// An owned event. done() is the non-blocking completion proof used by pollers: true once every
// operation enqueued before record() has finished, false while pending, DeviceError when the
// runtime cannot tell (then completion is unproven and the caller must not reuse the memory).
class Event {
 public:
  static Result<Event> create(int device) noexcept;
  Event() = default;  // empty until assigned from create()
  Event(Event&& o) noexcept : handle_(o.handle_), device_(o.device_) { o.handle_ = nullptr; }
  Event& operator=(Event&& o) noexcept;
  ~Event();
  Status record(const Stream& s) noexcept;
  Result<bool> done() const noexcept;
  Status synchronize() const noexcept;
  void* handle() const noexcept { return handle_; }  // cudaEvent_t / hipEvent_t
  int device() const noexcept { return device_; }

 private:
  Event(void* h, int device) : handle_(h), device_(device) {}
  void* handle_ = nullptr;
  int device_ = 0;
};

// Device memory; freed on destruction.
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> allocate(int device, std::size_t bytes) noexcept;
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  Region region() const noexcept { return Region{data_, size_, MemoryKind::kDevice, device_}; }

 private:
  void swap(DeviceBuffer& o) noexcept;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  int device_ = 0;
};

// Page-locked host memory mapped into the devices' address space (zero-copy capable), from the
// runtime's pinned allocator; freed on destruction.
class PinnedBuffer {
 public:
  static Result<PinnedBuffer> allocate(std::size_t bytes) noexcept;
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& o) noexcept { swap(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  ~PinnedBuffer();
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::span<std::byte> bytes() const noexcept { return {data_, size_}; }
  Region region() const noexcept { return Region{data_, size_, MemoryKind::kPinnedHost, -1}; }

 private:
  void swap(PinnedBuffer& o) noexcept;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// The process's page-locked image memory for TierStack::set_image_memory (tier/tier_stack.hpp):
// one mapped pinned allocation of page_locked_image_bytes(), made at the first call (about as
// long as the runtime takes to page-lock that much; the C API calls it when device memory is
// registered, not on a load), shared by every stack given it, and kept until the last of them
// lets go. It hands out page ranges (best fit, freed ranges merged with their neighbours) and
// says it has none (nullptr) when no free range is large enough: the stack takes the heap for
// that buffer. Threads: any. Errors: NotSupported (no GPU), NoSpace.
Result<std::shared_ptr<ImageMemory>> page_locked_images() noexcept;
constexpr std::size_t page_locked_image_bytes() noexcept { return std::size_t{128} << 20; }

// Page-locks (and maps) existing host memory until destruction. The memory must outlive it.
class PinnedRegistration {
 public:
  static Result<PinnedRegistration> register_host(std::span<std::byte> memory) noexcept;
  PinnedRegistration() = default;
  PinnedRegistration(PinnedRegistration&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
  }
  PinnedRegistration& operator=(PinnedRegistration&& o) noexcept;
  ~PinnedRegistration();
  Region region() const noexcept { return Region{data_, size_, MemoryKind::kPinnedHost, -1}; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// Work ordering with a caller's own runtime objects, given as opaque handles (cudaStream_t /
// hipStream_t, cudaEvent_t / hipEvent_t cast to void*), so that callers above this floor never
// see a runtime type. Both enqueue a device-side dependency and return at once; neither waits on
// the host, and neither synchronizes the device.
//   stream_wait_event(s, event)  work enqueued on `s` from now on starts after everything
//                                enqueued on the event's stream before its last record.
//   record_on(event, stream)     records `event` on a foreign stream.
// Errors: InvalidArgument (null handle), DeviceError.
Status stream_wait_event(const Stream& s, void* event) noexcept;
Status stream_wait_event(void* stream, const Event& event) noexcept;
Status record_on(const Event& event, void* stream) noexcept;

// Test and benchmark kernels (the synthetic forward pass of `tierbench forward`):
//   spin_async      one kernel of `blocks` blocks that busy-waits `nanoseconds` of the device's
//                   wall clock on `stream`: a forward layer of known duration, whatever the
//                   shader clock does (boost, other kernels on the multiprocessors).
//   fill_async      sets every byte of `dst` (device memory) to `value`, on `stream`.
// `stream` is a Stream's handle() or a caller's stream. Errors: InvalidArgument, DeviceError.
//   wall_clock      the clock spin_async waits on, on `device`.
// spin_async's errors also include wall_clock's NotSupported.
Status spin_async(void* stream, int device, std::uint64_t nanoseconds, int blocks = 1) noexcept;
Status fill_async(Region dst, std::uint8_t value, void* stream) noexcept;

// A device counter that runs at a constant rate whatever the shader clock does: CUDA's
// %globaltimer (nanoseconds, by the PTX ISA), HIP's s_memrealtime (wall_clock64(); its rate from
// hipDeviceAttributeWallClockRate where the HIP has it, else from libtier's table of the AMD
// targets that document it: gfx90a, gfx940-gfx942; docs/gpu.md).
struct WallClock {
  std::string counter;    // "%globaltimer", "s_memrealtime (wall_clock64)"
  std::uint64_t khz = 0;  // ticks per millisecond
  std::string rate_from;  // where `khz` comes from
};
// Errors: InvalidArgument (no such device), NotSupported (a HIP that cannot tell the rate, on a
// target the table lacks: the message names it), DeviceError.
Result<WallClock> wall_clock(int device) noexcept;

// One runtime copy of min(dst.size, src.size) bytes between any two kinds, enqueued on `s`.
// Pageable host memory is allowed (the runtime stages it). Errors: InvalidArgument, DeviceError.
Status copy_async(Region dst, Region src, const Stream& s) noexcept;

// How a transfer reaches a host image.
enum class ImagePath : std::uint8_t {
  kAuto = 0,      // zero-copy up to the per-direction threshold, staged above it
  kZeroCopy = 1,  // the kernel reads/writes mapped pinned host memory directly
  kStaged = 2,    // the kernel works on a device staging buffer; one DMA copy moves it
};
std::string_view image_path_name(ImagePath p) noexcept;

// The streams of a GPU's CopyContext, by what their work touches.
enum class Lane : std::uint8_t {
  kFromDevice = 0,  // reads of device memory: gathers, device-to-host copies (saves, snapshots)
  kToDevice = 1,    // writes of device memory: scatters, verification, gated copies (loads)
  kUpload = 2,      // host-to-device copies into the staging ring only (no caller memory)
  kDownload = 3,    // device-to-host copies out of the staging ring only
};
inline constexpr std::size_t kLanes = 4;

// Page-locked host memory lent by CopyContext::take_pinned: returned to the context's pool on
// destruction, reused by a later take once the event given with it (give_back) has completed, so
// a copy still writing it never loses it. Move-only.
class PinnedStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(PinnedStaging&& o) noexcept { swap(o); }
  PinnedStaging& operator=(PinnedStaging&& o) noexcept;
  ~PinnedStaging();
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::span<std::byte> bytes() const noexcept { return {data_, size_}; }
  Region region() const noexcept { return Region{data_, size_, MemoryKind::kPinnedHost, -1}; }
  // The memory is in use until everything enqueued on `s` so far has run (an event recorded
  // there now): a later take() hands it out only after that. Errors: DeviceError.
  Status in_use_until(const Stream& s) noexcept;

 private:
  friend class CopyContext;
  void swap(PinnedStaging& o) noexcept;
  std::shared_ptr<void> pool_;  // the context's pool state (copy_kernels.hip)
  std::size_t index_ = 0;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// A range of a CopyContext's device staging ring (CopyContext::ring_acquire).
struct RingRange {
  std::uint64_t id = 0;  // 0: none
  std::uint64_t offset = 0;
  Region region;  // device memory of the context's GPU, 256-byte aligned
};

// The copy resources of one GPU, one per GPU in the process, shared by every user of that GPU
// (the DSV4 layout's device KV memory, the cpu tier's pinned modes, the C API's device regions,
// tierbench): the three lane streams, an event pool, the copy kernel's descriptor slots, the
// executors' device staging buffers, a pinned host staging pool and a device staging ring.
// Users order their work against each other with events recorded on these streams, never with a
// host wait; nothing here synchronizes a stream or the device, except where a comment says so.
//
// Lifetime: of(device) creates the GPU's context on first use; it lives while any user holds the
// shared_ptr (a later of() after the last user let go makes a new one).
// Threads: every method may be called from any thread (a mutex per resource, held only while
// work is enqueued, never across a wait).
class CopyContext {
 public:
  // Errors: InvalidArgument (no such GPU), DeviceError, NoSpace.
  static Result<std::shared_ptr<CopyContext>> of(int device) noexcept;
  ~CopyContext();
  CopyContext(const CopyContext&) = delete;
  CopyContext& operator=(const CopyContext&) = delete;

  int device() const noexcept;
  int multiprocessors() const noexcept;
  const Stream& stream(Lane lane) const noexcept;

  // An event of this GPU: a pooled one whose last recorded work has completed, or a new one.
  // give_event() returns one to the pool: it is handed out again only once done() says so, unless
  // the giver says it `completed` (waited for, or done() said so), which take_event() hands out
  // first and without asking the runtime: a query of a pooled event cost 2 us on the H200 (by a
  // probe's timestamps; 0.4 us for an event just waited for), on the path to a put's DMA.
  Result<Event> take_event() noexcept;
  void give_event(Event e, bool completed = false) noexcept;

  // Makes the kFromDevice and kToDevice lanes wait for `event` when set, else for everything
  // enqueued on `stream` so far (opaque runtime handles, as stream_wait_event): every transfer
  // that reads or writes caller memory on this GPU from now on, whoever enqueues it, follows the
  // caller's work. Device-side: returns at once. Errors: InvalidArgument, DeviceError.
  Status order_after(void* stream, void* event) noexcept;

  // Page-locked host memory of at least `bytes` for copies that must not wait on the host: a
  // pooled buffer whose last use has completed, else a new one while the pool holds less than
  // pinned_staging_limit() bytes. Errors: Rejected (the limit is reached: the caller takes a
  // path that needs none), NoSpace.
  Result<PinnedStaging> take_pinned(std::size_t bytes) noexcept;
  static constexpr std::size_t pinned_staging_limit() noexcept { return std::size_t{1} << 30; }

  // The device staging ring (64 MiB of this GPU, allocated on first use): ring_acquire() hands
  // out `bytes` (rounded up to 256) after the previous range, from the start when the end is
  // reached, and makes `s` wait (device-side) for every retired range it overlaps; ring_retire()
  // ends a range once everything enqueued on `s` so far has run, and what the range's first
  // stream waited for when it was acquired (no host wait, no runtime query). A range
  // overlapping one that is acquired and not yet retired is refused. Errors: Rejected (larger
  // than the ring, or it would overlap a range not yet retired), NoSpace (the ring cannot be
  // allocated), DeviceError.
  Result<RingRange> ring_acquire(std::uint64_t bytes, const Stream& s) noexcept;
  Status ring_retire(const RingRange& r, const Stream& s) noexcept;
  static constexpr std::uint64_t ring_bytes() noexcept { return std::uint64_t{64} << 20; }

  // Does now what a first transfer would do: allocates the staging ring and loads the floor's
  // kernels (the copy and the verification kernels; the runtime loads a kernel's module at its
  // first launch otherwise). Idempotent. The C API calls it when device memory is registered, so
  // that a fresh process's first load into that memory does not pay for it (about 3-4 ms on the
  // H200, docs/integration.md "The fast path"). Errors: NoSpace, DeviceError.
  Status prepare() noexcept;

  struct State;  // copy_kernels.hip
  State& state() noexcept { return *state_; }

 private:
  explicit CopyContext(std::unique_ptr<State> s);
  std::unique_ptr<State> state_;
};

struct ExecutorOptions {
  int device = 0;
  ImagePath path = ImagePath::kAuto;
  // Under kAuto: largest image moved zero-copy, per direction. Defaults from the H200 (PCIe
  // Gen5 x16, docs/gpu.md): zero-copy writes win up to about 8 MiB, zero-copy reads up to about
  // 4 MiB; above that, a gather or scatter in HBM plus one DMA copy is faster.
  std::size_t zero_copy_max_gather = 8u << 20;
  std::size_t zero_copy_max_scatter = 4u << 20;
  // Largest piece of a staged transfer (default: half the staging ring): the image moves in
  // pieces through ranges of the context's staging ring, each piece's DMA (on the context's
  // upload or download lane) overlapping the kernel of the piece before. A load goes in as few
  // pieces as this allows and a short last one (a tenth of the image, at least 1 MiB), a save in
  // pieces of at most 8 MiB (docs/gpu.md). Pieces larger than half the ring, and those the ring
  // cannot take while another user fills it, go through a staging buffer of the lane instead
  // (of this size), one DMA and one kernel after the other.
  std::size_t staging_bytes = 32u << 20;
};

// Where the short last piece of `n` bytes moved in pieces of at most `most` starts, so that only
// that piece's kernel follows the last byte while the pieces before it go in as few DMAs as
// `most` allows: at a multiple of 64 KiB (of the transfer; also of the checksum chunk), its last
// tenth (at least 1 MiB, at most `most`, which is at least 64 KiB); 0 when the bytes go as one
// piece. A staged load's last piece, and the last DMA part of a large get of the pinned CPU tier.
std::uint64_t last_piece_at(std::uint64_t n, std::uint64_t most) noexcept;

// One scatter of a gated batch (DeviceCopyExecutor::scatter_batch_async): `plan`'s spans out of
// `image` (device memory), written only if *gate == kVerdictMatch when the kernel runs.
struct GatedScatter {
  CopyPlan plan;
  Region image;
  const std::uint32_t* gate = nullptr;  // device memory; null: always written
};

// Executes copy plans whose engine memory is device memory, through the GPU's CopyContext. The
// image may be device memory, mapped pinned host memory (zero-copy or staged) or pageable host
// memory (always staged). Each transfer is one kernel launch over 64 KiB tiles of the plan's
// spans: 16-byte vector copies where source and destination share their 16-byte alignment, byte
// copies otherwise.
//
// The *_async forms enqueue on the caller's stream and return once enqueued; the plan's memory
// and the image must stay valid until the stream has passed the transfer (record an Event). The
// span list itself is consumed before return. The CopyExecutor forms run on the context's lanes
// (gather: kFromDevice, scatter: kToDevice), after this executor's previous transfers and every
// order the context was given, and return when an event recorded behind the transfer has
// completed: never a stream or device-wide synchronize, and other users' work keeps running.
// Many executors may share a context (each with its own options); each is thread-safe.
// Errors: InvalidArgument (host-kind plan, image too small, span out of the image),
// DeviceError. A failed launch leaves the destination partially written.
class DeviceCopyExecutor final : public CopyExecutor {
 public:
  static Result<std::unique_ptr<DeviceCopyExecutor>> create(const ExecutorOptions& opts) noexcept;
  ~DeviceCopyExecutor() override;

  std::string_view name() const noexcept override { return "gpu"; }
  Status gather(const CopyPlan& plan, std::span<std::byte> image) noexcept override;
  Status scatter(const CopyPlan& plan, std::span<const std::byte> image) noexcept override;
  // scatter() of an image that `image` says where it lives: device memory of this GPU is one
  // copy kernel within the device (a staging row committed into engine memory).
  Status scatter_from(const CopyPlan& plan, Region image) noexcept;
  // The context's kToDevice lane (where a tier's copies into this device's memory run) waits,
  // device-side, for this executor's last transfer in each direction: a tier writing the codec's
  // regions through Codec::direct follows every transfer and order this executor was given.
  Status share_order() noexcept override;

  Status gather_async(const CopyPlan& plan, Region image, const Stream& s) noexcept;
  // With `gate` (device memory, e.g. verify_payload_async's verdict), the copy happens only if
  // *gate == kVerdictMatch when the kernel runs; otherwise it writes nothing.
  Status scatter_async(const CopyPlan& plan, Region image, const Stream& s,
                       const std::uint32_t* gate = nullptr) noexcept;
  // Every scatter of `items` in one launch on `s` (images in device memory only).
  // Errors: InvalidArgument (as scatter_async; an image that is not device memory).
  Status scatter_batch_async(std::span<const GatedScatter> items, const Stream& s) noexcept;

  // CopyContext::order_after of this executor's GPU.
  Status order_after(void* stream, void* event) noexcept;

  // The path a transfer of `bytes` to or from an image of `kind` takes.
  ImagePath path_for(MemoryKind kind, std::size_t bytes, bool gather) const noexcept;
  const ExecutorOptions& options() const noexcept { return opts_; }
  CopyContext& context() const noexcept { return *ctx_; }

 private:
  struct Impl;
  DeviceCopyExecutor(ExecutorOptions opts, std::shared_ptr<CopyContext> ctx,
                     std::unique_ptr<Impl> impl);
  Status run(const CopyPlan& plan, Region image, const Stream& s, bool gather,
             const std::uint32_t* gate = nullptr) noexcept;
  Status staged(const CopyPlan& plan, Region image, const Stream& s, bool gather) noexcept;
  // gather() and scatter(): on the lane, ordered after this executor's other direction, waited
  // for with a pooled event.
  Status run_on_lane(const CopyPlan& plan, Region image, bool gather) noexcept;

  ExecutorOptions opts_;
  std::shared_ptr<CopyContext> ctx_;
  std::unique_ptr<Impl> impl_;
};

// Device words a verification counts each payload's finished thread blocks in, so that the
// payload's last block computes the verdict in the same launch (verify_payload_async,
// verify_payloads_async). Zero between payloads: allocate() enqueues their zeroing on `s`, and a
// payload whose launches completed has zeroed what it used (a call that fails after enqueueing
// some of its launches zeroes them behind those). Verifications that share one must not overlap:
// use it on one stream (`s`). A launch that failed on the device may leave them nonzero; the
// device is unusable then anyway.
inline constexpr std::size_t kMaxVerifyBatch = 16;
class VerifyCounters {
 public:
  static Result<VerifyCounters> allocate(const Stream& s) noexcept;
  std::byte* words() const noexcept { return words_.data(); }
  int device() const noexcept { return words_.region().device; }

 private:
  static constexpr std::size_t kWords = 2 * kMaxVerifyBatch;  // per item: count, CRC register
  DeviceBuffer words_;
};

// Object format version 2 payload verification on the device (docs/object-format.md): the
// XXH3-64 of every 64 KiB chunk of `payload` (device memory, 8-byte aligned), the XXH3-64 of
// their list, compared with `expected` (the header's payload checksum). Enqueued on `s` (nothing
// waits on the host), counting in `counters` (of `s`'s GPU, used on `s` alone); the verdict,
// kVerdictMatch or kVerdictMismatch, is written to the first 4 bytes of `scratch` (device
// memory, 8-byte aligned, at least verify_scratch_bytes() bytes; the chunk list follows) and,
// when `host_verdict` is set (mapped pinned host memory), to *host_verdict as well: read it after
// an event recorded behind this on `s` has completed.
// With `crc` (a codec's CrcClaim, PayloadCheck::check_head), the verdict is a match only if the
// payload's bytes from crc->from to its end also have CRC-32 crc->crc (computed in 256-byte pieces
// by as many threads and combined, hip/crc32.hpp).
// Errors: InvalidArgument (memory kinds, alignment, scratch size, unmapped host verdict, a claim
// past the payload, counters of another GPU), DeviceError.
inline constexpr std::uint32_t kVerdictMatch = 1;
inline constexpr std::uint32_t kVerdictMismatch = 2;
std::size_t verify_scratch_bytes(std::size_t payload_bytes) noexcept;
// With `landings` (growing prefixes of the payload, each on the device once its event has
// completed; the last one the whole payload), `s` waits for each in turn and the chunks and CRC
// pieces of each part are checked as soon as it has landed (one launch per part), so little is
// left after the last byte; without, the caller has ordered `s` after the whole payload.
struct Landing {
  std::uint64_t bytes = 0;
  const Event* event = nullptr;
};
Status verify_payload_async(Region payload, std::uint64_t expected, Region scratch,
                            std::uint32_t* host_verdict, VerifyCounters& counters, const Stream& s,
                            const CrcClaim* crc = nullptr,
                            std::span<const Landing> landings = {}) noexcept;

// One payload of a batched verification: as verify_payload_async's arguments (without
// landings: the caller has ordered the stream after every payload of the batch).
struct VerifyItem {
  Region payload;
  std::uint64_t expected = 0;
  Region scratch;
  std::uint32_t* host_verdict = nullptr;
  const CrcClaim* crc = nullptr;  // must stay valid until the call returns
};
// Loads the verification kernel on the current device (CopyContext::prepare). Errors: DeviceError.
Status load_verify_kernels() noexcept;
// verify_payload_async for up to kMaxVerifyBatch payloads in one launch on `s`, whatever their
// number. Errors: InvalidArgument (as verify_payload_async, for any item; more than
// kMaxVerifyBatch items), DeviceError.
Status verify_payloads_async(std::span<const VerifyItem> items, VerifyCounters& counters,
                             const Stream& s) noexcept;

// Whether `p` is page-locked host memory mapped for the devices (cudaHostAlloc'd or registered).
bool is_mapped_pinned(const void* p) noexcept;

namespace testing {
// Fault injection for tests: while set on the calling thread, every Event::synchronize() on that
// thread (the executor's wait for its gather or scatter, a verification's wait) waits for the
// event as usual and then reports a DeviceError, as a failed event sync would. Other threads are
// unaffected, so one TP rank's thread fails while the others go on.
void fail_event_syncs_on_this_thread(bool on) noexcept;
}  // namespace testing

}  // namespace tier::gpu
