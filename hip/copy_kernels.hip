// The copy-plan kernel, the per-GPU CopyContext and the device executor (gpu.hpp).
//
// A transfer becomes a list of tiles: pieces of at most kTileBytes of one span, each with its
// source and destination address already resolved (engine memory, and the image: device memory,
// mapped pinned host memory, or the staging buffer) and an optional gate (a verdict word: the tile
// is copied only if it says kVerdictMatch). A list of up to kInlineTiles goes in the launch's
// parameters; a longer one is written to a pinned descriptor slot that the kernel reads in place
// (mapped: no copy engine, so a launch never queues behind another stream's DMA; but each read
// crosses the bus, and behind a host-to-device DMA in flight on the H200 a 4 MiB copy took 20 us
// that way against 11 us from parameters). One launch moves every tile: each block takes tiles
// (or parts of them: copy_part) in a grid-stride loop; threads copy 16-byte words (kUnroll loads
// in flight before their stores, for latency over PCIe) when source and destination share their
// 16-byte alignment, and bytes otherwise; a misaligned head and the tail of a tile go byte by
// byte.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <vector>

#include "gpu.hpp"
#include "gpu_runtime.hpp"

namespace tier::gpu {
namespace {

constexpr std::uint64_t kTileBytes = 64u << 10;
constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int kBlocksPerSm = 8;
constexpr std::size_t kDescriptorSlots = 32;   // made at creation
constexpr std::size_t kSlotBytes = 64 * 1024;  // 2,048 tiles of a slot made at creation
constexpr std::size_t kMaxDescriptorSlots = 256;  // more only while that many launches run
constexpr std::uint64_t kRingAlign = 256;
// Ranges of the staging ring remembered before the oldest completed ones are asked about.
constexpr std::size_t kRangesKept = 64;

struct Tile {
  const unsigned char* src;
  unsigned char* dst;
  unsigned long long bytes;
  const unsigned int* gate;  // copied only if *gate == kVerdictMatch; null: always
};

// Tiles passed by value (a 1 MiB object has 16, a 4 MiB batch of gets 64), within the 4 KiB of
// kernel parameters CUDA and HIP both take.
constexpr unsigned int kInlineTiles = 120;
struct InlineTiles {
  unsigned int count;
  Tile tiles[kInlineTiles];
};
static_assert(sizeof(InlineTiles) <= 4000, "kernel parameters are limited to 4 KiB");

// Part `part` of a tile in `parts` (1 or kParts: the tile's words split by index; part 0 also
// takes the misaligned head and the tail), by the whole block. A gated copy (a verified get's,
// which starts only once its last byte landed and was checked) takes its tiles in kParts parts:
// with one block per 64 KiB tile, 1 MiB took 5 us device to device on the H200 (by ncu), one SM
// per 64 KiB; a submit's last 4 MiB batch's gated copy ran 3 us, 2.8 us in parts (CUPTI). Other
// copies run behind their DMAs and keep one block per tile (in parts, a V4-Pro PAGE load of 64
// blocks fell from 0.98-0.99x of the bulk copy to 0.96-0.97x, and one of small regions from 0.92
// to 0.8).
constexpr unsigned int kPartBytes = 16u << 10;
constexpr unsigned int kParts = kTileBytes / kPartBytes;
static_assert(kPartBytes % 16 == 0 && kTileBytes % kPartBytes == 0);
__device__ void copy_part(const Tile tile, unsigned int part, unsigned int parts) {
  if (tile.gate != nullptr && *tile.gate != kVerdictMatch) return;
  const unsigned int n = static_cast<unsigned int>(tile.bytes);
  const unsigned int part_bytes = static_cast<unsigned int>(kTileBytes) / parts;
  const unsigned int lo = part * part_bytes;
  if (lo >= n) return;
  const unsigned char* s = tile.src;
  unsigned char* d = tile.dst;
  const auto sa = reinterpret_cast<unsigned long long>(s);
  if (((sa ^ reinterpret_cast<unsigned long long>(d)) & 15u) != 0) {
    const unsigned int hi = n - lo < part_bytes ? n : lo + part_bytes;
    for (unsigned int i = lo + threadIdx.x; i < hi; i += blockDim.x) d[i] = s[i];
    return;
  }
  unsigned int head = static_cast<unsigned int>((16u - (sa & 15u)) & 15u);
  if (head > n) head = n;
  const unsigned int words = (n - head) / 16u;
  const unsigned int tail_at = head + words * 16u;
  if (part == 0) {
    if (threadIdx.x < head) d[threadIdx.x] = s[threadIdx.x];
    if (threadIdx.x < n - tail_at) d[tail_at + threadIdx.x] = s[tail_at + threadIdx.x];
  }
  const uint4* vs = reinterpret_cast<const uint4*>(s + head);
  uint4* vd = reinterpret_cast<uint4*>(d + head);
  const unsigned int part_words = part_bytes / 16u;
  const unsigned int first = part * part_words;  // may lie past the words: the head shifted them
  if (first >= words) return;
  const unsigned int end = words - first < part_words ? words : first + part_words;
  for (unsigned int base = first; base < end; base += kThreads * kUnroll) {
    uint4 r[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const unsigned int i = base + k * kThreads + threadIdx.x;
      if (i < end) r[k] = vs[i];
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const unsigned int i = base + k * kThreads + threadIdx.x;
      if (i < end) vd[i] = r[k];
    }
  }
}

// Each block takes (tile, part) units in a grid-stride loop, `parts` per tile (1 or kParts).
__global__ void __launch_bounds__(kThreads) copy_tiles(const Tile* __restrict__ tiles,
                                                       unsigned int count, unsigned int parts) {
  for (unsigned int u = blockIdx.x; u < count * parts; u += gridDim.x)
    copy_part(tiles[u / parts], u % parts, parts);
}
__global__ void __launch_bounds__(kThreads) copy_inline_tiles(const InlineTiles in,
                                                              unsigned int parts) {
  for (unsigned int u = blockIdx.x; u < in.count * parts; u += gridDim.x)
    copy_part(in.tiles[u / parts], u % parts, parts);
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
                 bool gather, const std::uint32_t* gate, std::vector<Tile>& out) {
  for (const CopySpan& span : plan.spans) {
    std::uint64_t a = std::max(lo, span.image_offset);
    std::uint64_t b = std::min(hi, span.image_offset + span.bytes);
    for (std::uint64_t x = a; x < b; x += kTileBytes) {
      std::uint64_t n = std::min(kTileBytes, b - x);
      auto* engine = reinterpret_cast<unsigned char*>(span.engine + (x - span.image_offset));
      auto* image = reinterpret_cast<unsigned char*>(window + (x - lo));
      out.push_back(gather ? Tile{engine, image, n, gate} : Tile{image, engine, n, gate});
    }
  }
}

Status check_plan(const CopyPlan& plan, Region image) {
  if (plan.engine_kind != MemoryKind::kDevice)
    return Status::invalid("the GPU executor moves device-kind plans only");
  if (image.data == nullptr || image.size < plan.image_bytes)
    return Status::invalid("image of " + std::to_string(image.size) +
                           " bytes is smaller than the plan's " +
                           std::to_string(plan.image_bytes));
  for (const CopySpan& span : plan.spans)
    if (span.bytes > plan.image_bytes || span.image_offset > plan.image_bytes - span.bytes)
      return Status::invalid("copy span outside the image");
  return Status::ok();
}

std::uint64_t round_up(std::uint64_t n, std::uint64_t a) { return (n + a - 1) / a * a; }

// The pinned host staging pool of one context (PinnedStaging's pool_): buffers are lent whole
// and handed out again once the event recorded with their last use has completed.
struct PinnedPool {
  struct Buffer {
    PinnedBuffer memory;
    Event free_after;  // recorded by in_use_until(); a never-recorded event reports done
    bool lent = false;
  };
  std::mutex mu;
  int device = 0;
  std::vector<std::unique_ptr<Buffer>> buffers;
  std::size_t total = 0;
};

}  // namespace

// Descriptor slots (mapped pinned memory holding a tile list, and its device address), reused
// once the launch that read them has completed; the executors' staging buffers per lane; the
// event pool; the pinned pool; the device ring. Each group has its own mutex, held only while
// work is enqueued.
struct CopyContext::State {
  // A tile list's memory: a share of `descriptors` (made with the context, one allocation), or a
  // buffer of its own once it outgrew that.
  struct Slot {
    PinnedBuffer own;
    std::byte* host = nullptr;
    std::size_t size = 0;
    const Tile* mapped = nullptr;  // host's device address
    Event done;
    bool in_use = false;
  };
  // A staging buffer of the executors' staged path: reused on another stream only after the
  // event behind its last use (a device-side wait).
  struct Staging {
    DeviceBuffer buffer;
    Event done;
    void* last_stream = nullptr;
  };
  struct Range {
    std::uint64_t id = 0, lo = 0, hi = 0;
    Event done;  // recorded at retirement
    bool retired = false;
    // When it replaced retired ranges: recorded on its first stream after that stream's waits
    // for them, and waited for by its retirement on any other stream.
    Event after;
    void* first = nullptr;  // its first stream
  };

  int device = 0;
  int multiprocessors = 1;
  Stream lanes[kLanes];

  std::mutex events_mu;
  std::deque<Event> spare_events;      // given back with their work perhaps pending
  std::vector<Event> completed_events;  // given back with their work completed

  std::mutex launch_mu;  // slots, next_slot, retired_slots
  PinnedBuffer descriptors;  // kDescriptorSlots x kSlotBytes, the first slots' memory
  std::vector<std::unique_ptr<Slot>> slots;
  std::size_t next_slot = 0;
  std::vector<PinnedBuffer> retired_slots;  // outgrown; freed with the context

  std::mutex staging_mu;
  Staging staging[2];                        // kFromDevice, kToDevice
  std::vector<DeviceBuffer> retired_staging;  // outgrown; freed with the context

  std::shared_ptr<PinnedPool> pinned;

  std::mutex ring_mu;
  DeviceBuffer ring;
  std::uint64_t ring_head = 0;
  std::uint64_t next_range = 1;
  std::vector<Range> ranges;  // acquired, in acquisition order

  Result<Event> take_event() noexcept;
  void give_event(Event e, bool completed = false) noexcept;
  // Launches copy_tiles over `tiles` on `s` (a descriptor slot whose last launch completed).
  Status launch(const std::vector<Tile>& tiles, rt::StreamHandle s) noexcept;
};

namespace {
// Gives an event back to the context's pool when it goes out of scope, whatever happened
// (`completed`: its work was waited for).
struct EventBack {
  CopyContext::State& st;
  Event& e;
  bool completed = false;
  ~EventBack();
};
}  // namespace

// The pool is first in, first out: the events given back first are the likeliest to have
// completed, and only the oldest few are asked (a query each, not one per spare).
Result<Event> CopyContext::State::take_event() noexcept {
  {
    std::lock_guard<std::mutex> lock(events_mu);
    if (!completed_events.empty()) {
      Event e = std::move(completed_events.back());
      completed_events.pop_back();
      return std::move(e);
    }
    // The oldest few: one still pending (given back with its work in flight) does not keep the
    // ones behind it from being reused.
    for (std::size_t i = 0; i < spare_events.size() && i < 4; ++i) {
      auto done = spare_events[i].done();
      if (done && *done) {
        Event e = std::move(spare_events[i]);
        spare_events.erase(spare_events.begin() + static_cast<std::ptrdiff_t>(i));
        return std::move(e);
      }
    }
  }
  return Event::create(device);
}

void CopyContext::State::give_event(Event e, bool completed) noexcept {
  if (e.handle() == nullptr) return;
  std::lock_guard<std::mutex> lock(events_mu);
  try {
    if (completed)
      completed_events.push_back(std::move(e));
    else
      spare_events.push_back(std::move(e));
  } catch (const std::bad_alloc&) {  // destroyed instead
  }
}

EventBack::~EventBack() { st.give_event(std::move(e), completed); }

Status CopyContext::State::launch(const std::vector<Tile>& tiles, rt::StreamHandle s) noexcept {
  if (tiles.empty()) return Status::ok();
  if (tiles.size() > std::numeric_limits<unsigned int>::max() / kParts)
    return Status::invalid("copy context: more tiles than one launch takes");
  const auto count = static_cast<unsigned int>(tiles.size());
  const bool gated = std::any_of(tiles.begin(), tiles.end(),
                                 [](const Tile& t) { return t.gate != nullptr; });
  const unsigned int parts = gated ? kParts : 1;
  const unsigned int grid = std::min<unsigned int>(
      count * parts, static_cast<unsigned int>(multiprocessors * kBlocksPerSm));
  if (count <= kInlineTiles) {  // no descriptor slot: nothing to reuse, wait for or ask about
    InlineTiles in;
    in.count = count;
    std::copy(tiles.begin(), tiles.end(), in.tiles);
    copy_inline_tiles<<<grid, kThreads, 0, s>>>(in, parts);
    TIER_GPU_TRY(rt::clear_last_error());
    return Status::ok();
  }
  std::lock_guard<std::mutex> lock(launch_mu);
  Slot* slot = nullptr;
  for (std::size_t k = 0; k < slots.size() && slot == nullptr; ++k) {
    Slot& c = *slots[(next_slot + k) % slots.size()];
    if (c.in_use) {
      auto done = c.done.done();
      if (!done || !*done) continue;
      c.in_use = false;
    }
    slot = &c;
    next_slot = (next_slot + k + 1) % slots.size();
  }
  try {
    if (slot == nullptr && slots.size() < kMaxDescriptorSlots) {
      auto fresh = std::make_unique<Slot>();
      TIER_ASSIGN_OR_RETURN(fresh->done, Event::create(device));
      slots.push_back(std::move(fresh));
      slot = slots.back().get();
    }
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "copy context: out of memory");
  }
  if (slot == nullptr) {  // kMaxDescriptorSlots launches in flight: wait for the next one
    slot = slots[next_slot].get();
    next_slot = (next_slot + 1) % slots.size();
    TIER_RETURN_IF_ERROR(slot->done.synchronize());
    slot->in_use = false;
  }
  const std::size_t bytes = tiles.size() * sizeof(Tile);
  if (slot->size < bytes) {
    // Room for 2,048 tiles (a 128 MiB transfer) from the start. An outgrown buffer is kept until
    // the context goes: freeing page-locked memory waits for the whole device.
    const std::size_t cap = std::max<std::size_t>(bytes, kSlotBytes);
    TIER_ASSIGN_OR_RETURN(PinnedBuffer grown, PinnedBuffer::allocate(cap));
    try {
      if (slot->own.data() != nullptr) retired_slots.push_back(std::move(slot->own));
    } catch (const std::bad_alloc&) {
      return Status(Code::kNoSpace, "copy context: out of memory");
    }
    slot->own = std::move(grown);
    slot->host = slot->own.data();
    slot->size = cap;
    slot->mapped = static_cast<const Tile*>(rt::mapped_device_pointer(slot->host));
    if (slot->mapped == nullptr)
      return Status(Code::kDeviceError, "copy context: descriptor slot is not mapped");
  }
  std::memcpy(slot->host, tiles.data(), bytes);
  copy_tiles<<<grid, kThreads, 0, s>>>(slot->mapped, count, parts);
  TIER_GPU_TRY(rt::clear_last_error());
  TIER_GPU_TRY(rt::event_record(static_cast<rt::EventHandle>(slot->done.handle()), s));
  slot->in_use = true;
  return Status::ok();
}

CopyContext::CopyContext(std::unique_ptr<State> s) : state_(std::move(s)) {}

CopyContext::~CopyContext() {
  State& st = *state_;
  DeviceGuard guard(st.device);
  // Launches, staged copies and ring users may still run: wait for them before their memory goes.
  for (auto& slot : st.slots)
    if (slot->in_use) slot->done.synchronize().ignore();
  for (auto& g : st.staging)
    if (g.last_stream != nullptr) g.done.synchronize().ignore();
  for (auto& r : st.ranges)
    if (r.retired) r.done.synchronize().ignore();
  for (auto& lane : st.lanes) lane.synchronize().ignore();
}

Result<std::shared_ptr<CopyContext>> CopyContext::of(int device) noexcept {
  // Never destroyed: contexts may be let go during static destruction.
  static auto* mu = new std::mutex;
  static auto* contexts = new std::vector<std::weak_ptr<CopyContext>>;  // by ordinal
  try {
    if (device < 0 || device >= device_count())
      return Status::invalid("no GPU with ordinal " + std::to_string(device));
    std::lock_guard<std::mutex> lock(*mu);
    const auto d = static_cast<std::size_t>(device);
    if (contexts->size() <= d) contexts->resize(d + 1);
    if (auto ctx = (*contexts)[d].lock()) return ctx;
    auto st = std::make_unique<State>();
    st->device = device;
    {
      DeviceGuard guard(device);
      TIER_RETURN_IF_ERROR(guard.status());
      TIER_GPU_TRY(rt::multiprocessors(&st->multiprocessors, device));
    }
    st->multiprocessors = std::max(1, st->multiprocessors);
    for (Stream& lane : st->lanes) {
      TIER_ASSIGN_OR_RETURN(lane, Stream::create(device));
    }
    // Every first slot's memory in one page-locked allocation (each one costs about as much as
    // the copy of a few MiB, and the first transfers would pay them one by one).
    TIER_ASSIGN_OR_RETURN(st->descriptors, PinnedBuffer::allocate(kDescriptorSlots * kSlotBytes));
    auto* mapped = static_cast<std::byte*>(rt::mapped_device_pointer(st->descriptors.data()));
    if (mapped == nullptr)
      return Status(Code::kDeviceError, "copy context: descriptor slots are not mapped");
    for (std::size_t i = 0; i < kDescriptorSlots; ++i) {
      auto slot = std::make_unique<State::Slot>();
      TIER_ASSIGN_OR_RETURN(slot->done, Event::create(device));
      slot->host = st->descriptors.data() + i * kSlotBytes;
      slot->size = kSlotBytes;
      slot->mapped = reinterpret_cast<const Tile*>(mapped + i * kSlotBytes);
      st->slots.push_back(std::move(slot));
    }
    for (auto& g : st->staging) {
      TIER_ASSIGN_OR_RETURN(g.done, Event::create(device));
    }
    st->pinned = std::make_shared<PinnedPool>();
    st->pinned->device = device;
    std::shared_ptr<CopyContext> ctx(new CopyContext(std::move(st)));
    (*contexts)[d] = ctx;
    return ctx;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "copy context: out of memory");
  }
}

int CopyContext::device() const noexcept { return state_->device; }
int CopyContext::multiprocessors() const noexcept { return state_->multiprocessors; }
const Stream& CopyContext::stream(Lane lane) const noexcept {
  return state_->lanes[static_cast<std::size_t>(lane)];
}
Result<Event> CopyContext::take_event() noexcept { return state_->take_event(); }
void CopyContext::give_event(Event e, bool completed) noexcept {
  state_->give_event(std::move(e), completed);
}

Status CopyContext::order_after(void* stream, void* event) noexcept {
  DeviceGuard guard(state_->device);
  TIER_RETURN_IF_ERROR(guard.status());
  const Stream& from = this->stream(Lane::kFromDevice);
  const Stream& to = this->stream(Lane::kToDevice);
  if (event != nullptr) {
    TIER_RETURN_IF_ERROR(stream_wait_event(from, event));
    return stream_wait_event(to, event);
  }
  if (stream == nullptr) return Status::invalid("order_after: neither a stream nor an event");
  // An event of our own behind the caller's work so far; the waits keep what it names now, so it
  // goes back to the pool at once.
  TIER_ASSIGN_OR_RETURN(Event e, take_event());
  const EventBack back{*state_, e};
  TIER_RETURN_IF_ERROR(record_on(e, stream));
  TIER_RETURN_IF_ERROR(stream_wait_event(from, e.handle()));
  return stream_wait_event(to, e.handle());
}

Result<PinnedStaging> CopyContext::take_pinned(std::size_t bytes) noexcept {
  PinnedPool& pool = *state_->pinned;
  std::lock_guard<std::mutex> lock(pool.mu);
  PinnedPool::Buffer* best = nullptr;
  std::size_t index = 0;
  for (std::size_t i = 0; i < pool.buffers.size(); ++i) {
    PinnedPool::Buffer& b = *pool.buffers[i];
    if (b.lent || b.memory.size() < bytes) continue;
    if (best != nullptr && best->memory.size() <= b.memory.size()) continue;
    auto done = b.free_after.done();
    if (!done || !*done) continue;
    best = &b;
    index = i;
  }
  try {
    if (best == nullptr) {
      if (pool.total + bytes > pinned_staging_limit())
        return Status(Code::kRejected, "pinned staging: the pool holds its limit of " +
                                           std::to_string(pinned_staging_limit()) + " bytes");
      auto b = std::make_unique<PinnedPool::Buffer>();
      TIER_ASSIGN_OR_RETURN(b->memory, PinnedBuffer::allocate(bytes));
      TIER_ASSIGN_OR_RETURN(b->free_after, Event::create(pool.device));
      pool.total += bytes;
      pool.buffers.push_back(std::move(b));
      index = pool.buffers.size() - 1;
      best = pool.buffers.back().get();
    }
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "pinned staging: out of memory");
  }
  best->lent = true;
  PinnedStaging out;
  out.pool_ = state_->pinned;
  out.index_ = index;
  out.data_ = best->memory.data();
  out.size_ = best->memory.size();
  return std::move(out);
}

void PinnedStaging::swap(PinnedStaging& o) noexcept {
  std::swap(pool_, o.pool_);
  std::swap(index_, o.index_);
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
}

PinnedStaging& PinnedStaging::operator=(PinnedStaging&& o) noexcept {
  swap(o);
  return *this;
}

PinnedStaging::~PinnedStaging() {
  if (!pool_) return;
  auto& pool = *static_cast<PinnedPool*>(pool_.get());
  std::lock_guard<std::mutex> lock(pool.mu);
  pool.buffers[index_]->lent = false;
}

Status PinnedStaging::in_use_until(const Stream& s) noexcept {
  if (!pool_) return Status::invalid("pinned staging: empty");
  auto& pool = *static_cast<PinnedPool*>(pool_.get());
  std::lock_guard<std::mutex> lock(pool.mu);
  return pool.buffers[index_]->free_after.record(s);
}

Result<RingRange> CopyContext::ring_acquire(std::uint64_t bytes, const Stream& s) noexcept {
  State& st = *state_;
  const std::uint64_t n = round_up(std::max<std::uint64_t>(bytes, 1), kRingAlign);
  if (n > ring_bytes())
    return Status(Code::kRejected, "staging ring: " + std::to_string(bytes) +
                                       " bytes do not fit in its " + std::to_string(ring_bytes()));
  std::lock_guard<std::mutex> lock(st.ring_mu);
  if (st.ring.data() == nullptr) {
    TIER_ASSIGN_OR_RETURN(st.ring, DeviceBuffer::allocate(st.device, ring_bytes()));
  }
  const std::uint64_t lo = st.ring_head + n <= ring_bytes() ? st.ring_head : 0, hi = lo + n;
  auto overlaps = [&](const State::Range& r) { return r.lo < hi && lo < r.hi; };
  for (const State::Range& r : st.ranges)
    if (!r.retired && overlaps(r))
      return Status(Code::kRejected, "staging ring: the range is still being filled");
  // The retired ranges it overlaps are waited for on `s` (device-side), then give up the bytes
  // it covers: a later range that overlaps those overlaps the new range too and waits for its
  // retirement, which follows `s`'s waits (`after`). One covered whole is forgotten; one that
  // reaches past an end keeps guarding the rest; one that the new range lies inside stays whole.
  // No runtime query: asking whether an event completed cost up to 2 us per event on the H200 (a
  // probe's timestamps), and this runs before a batch's DMA.
  Event after;
  for (const State::Range& r : st.ranges) {
    if (!overlaps(r)) continue;
    TIER_RETURN_IF_ERROR(stream_wait_event(s, r.done.handle()));
    if (after.handle() == nullptr) {
      TIER_ASSIGN_OR_RETURN(after, st.take_event());
    }
  }
  if (after.handle() != nullptr) {
    Status rec = after.record(s);
    if (!rec) {
      st.give_event(std::move(after));
      return rec;
    }
  }
  try {
    st.ranges.reserve(st.ranges.size() + 1);  // the push_back below cannot fail once bytes moved
  } catch (const std::bad_alloc&) {
    st.give_event(std::move(after));
    return Status(Code::kNoSpace, "staging ring: out of memory");
  }
  for (auto it = st.ranges.begin(); it != st.ranges.end();) {
    if (!overlaps(*it)) {
      ++it;
    } else if (lo <= it->lo && it->hi <= hi) {
      st.give_event(std::move(it->done));
      it = st.ranges.erase(it);
    } else {
      if (lo <= it->lo) it->lo = hi;       // its front is the new range's
      else if (it->hi <= hi) it->hi = lo;  // its back is
      ++it;
    }
  }
  // Many small ranges: the oldest that completed are forgotten, so their events go back.
  while (st.ranges.size() >= kRangesKept && st.ranges.front().retired) {
    auto done = st.ranges.front().done.done();
    if (!done || !*done) break;
    st.give_event(std::move(st.ranges.front().done), true);
    st.ranges.erase(st.ranges.begin());
  }
  st.ranges.push_back(State::Range{st.next_range, lo, hi, Event{}, false, std::move(after),
                                   s.handle()});
  st.ring_head = hi;
  return RingRange{st.next_range++, lo, Region{st.ring.data() + lo, n, MemoryKind::kDevice,
                                               st.device}};
}

Status CopyContext::prepare() noexcept {
  State& st = *state_;
  DeviceGuard guard(st.device);
  TIER_RETURN_IF_ERROR(guard.status());
  {
    std::lock_guard<std::mutex> lock(st.ring_mu);
    if (st.ring.data() == nullptr) {
      TIER_ASSIGN_OR_RETURN(st.ring, DeviceBuffer::allocate(st.device, ring_bytes()));
    }
  }
  TIER_GPU_TRY(rt::load_kernel(reinterpret_cast<const void*>(&copy_tiles)));
  TIER_GPU_TRY(rt::load_kernel(reinterpret_cast<const void*>(&copy_inline_tiles)));
  return load_verify_kernels();
}

Status CopyContext::ring_retire(const RingRange& r, const Stream& s) noexcept {
  State& st = *state_;
  TIER_ASSIGN_OR_RETURN(Event e, st.take_event());
  std::lock_guard<std::mutex> lock(st.ring_mu);
  for (State::Range& x : st.ranges)
    if (x.id == r.id && !x.retired) {
      const bool follow = x.after.handle() != nullptr && x.first != s.handle();
      Status waited = follow ? stream_wait_event(s, x.after.handle()) : Status::ok();
      Status rec = waited ? e.record(s) : std::move(waited);
      if (!rec) {  // the event proves nothing: wait here for what it would have followed
        s.synchronize().ignore();
        if (follow) x.after.synchronize().ignore();
      }
      st.give_event(std::move(x.after));
      x.done = std::move(e);
      x.retired = true;
      return rec;
    }
  st.give_event(std::move(e), true);  // never recorded
  return Status::invalid("staging ring: unknown range");
}

// Per executor: the tile list being built, and the events behind its last transfer in each
// direction (on whatever stream it ran), which the other direction and share_order() wait for.
struct DeviceCopyExecutor::Impl {
  std::mutex mu;
  std::vector<Tile> tiles;
  Event last[2];  // [0]: gathers, [1]: scatters
  bool recorded[2] = {false, false};
};

Result<std::unique_ptr<DeviceCopyExecutor>> DeviceCopyExecutor::create(
    const ExecutorOptions& opts) noexcept {
  if (opts.staging_bytes < kTileBytes)
    return Status::invalid("staging_bytes must be at least " + std::to_string(kTileBytes));
  TIER_ASSIGN_OR_RETURN(auto ctx, CopyContext::of(opts.device));
  try {
    auto impl = std::make_unique<Impl>();
    for (Event& e : impl->last) {
      TIER_ASSIGN_OR_RETURN(e, Event::create(opts.device));
    }
    return std::unique_ptr<DeviceCopyExecutor>(
        new DeviceCopyExecutor(opts, std::move(ctx), std::move(impl)));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "copy executor: out of memory");
  }
}

DeviceCopyExecutor::DeviceCopyExecutor(ExecutorOptions opts, std::shared_ptr<CopyContext> ctx,
                                       std::unique_ptr<Impl> impl)
    : opts_(opts), ctx_(std::move(ctx)), impl_(std::move(impl)) {}

DeviceCopyExecutor::~DeviceCopyExecutor() = default;

ImagePath DeviceCopyExecutor::path_for(MemoryKind kind, std::size_t bytes,
                                       bool gather) const noexcept {
  if (kind == MemoryKind::kDevice) return ImagePath::kZeroCopy;  // the kernel writes it directly
  if (kind == MemoryKind::kHost) return ImagePath::kStaged;
  if (opts_.path != ImagePath::kAuto) return opts_.path;
  return bytes <= (gather ? opts_.zero_copy_max_gather : opts_.zero_copy_max_scatter)
             ? ImagePath::kZeroCopy
             : ImagePath::kStaged;
}

// Enqueues on `s`; the caller holds impl_->mu.
Status DeviceCopyExecutor::run(const CopyPlan& plan, Region image, const Stream& s, bool gather,
                               const std::uint32_t* gate) noexcept {
  TIER_RETURN_IF_ERROR(check_plan(plan, image));
  if (plan.image_bytes == 0) return Status::ok();
  DeviceGuard guard(opts_.device);
  TIER_RETURN_IF_ERROR(guard.status());
  CopyContext::State& st = ctx_->state();
  Impl& im = *impl_;
  const auto stream = stream_of(s);

  // A host image declared pageable may still be registered memory: detect it.
  std::byte* window = image.data;  // the image as the kernel addresses it
  MemoryKind kind = image.kind;
  if (kind != MemoryKind::kDevice) {
    window = static_cast<std::byte*>(rt::mapped_device_pointer(image.data));
    kind = window != nullptr ? MemoryKind::kPinnedHost : MemoryKind::kHost;
  }
  ImagePath path = path_for(kind, plan.image_bytes, gather);
  im.tiles.clear();
  if (path == ImagePath::kZeroCopy) {
    build_tiles(plan, 0, plan.image_bytes, window, gather, gate, im.tiles);
    TIER_RETURN_IF_ERROR(st.launch(im.tiles, stream));
  } else {
    if (gate != nullptr)
      return Status::invalid("a gated scatter needs its image in device memory");
    TIER_RETURN_IF_ERROR(staged(plan, image, s, gather));
  }
  const int dir = gather ? 0 : 1;
  TIER_RETURN_IF_ERROR(im.last[dir].record(s));
  im.recorded[dir] = true;
  return Status::ok();
}

namespace {

// A load's pieces start at multiples of kPieceAlign of the image: a DMA from an unaligned host
// address ran at a fraction of the bus's rate on the H200 (a 16-block V4-Pro load whose last piece
// began at an offset of 2 mod 4 took 557-559 us against 458-461 us, 2026-12-04).
constexpr std::uint64_t kPieceAlign = 64u << 10;
static_assert(kPieceAlign <= kTileBytes);  // staging_bytes is at least a tile (create())
// A save's pieces: at most this. Its first DMA waits for the first piece's gather, and every DMA
// for its own; in larger pieces (a tenth of the image first, then as few as the ring allows) a
// V4-Pro save of 64 blocks took 1818-1823 us against 1804-1808 us, though 16 blocks took 458-460
// against 463-464 us (the H200, 3 runs each, 2026-12-04).
constexpr std::uint64_t kSavePieceBytes = 8u << 20;

// The pieces of a staged transfer of `n` bytes, each at most `most`. A save: pieces of
// kSavePieceBytes. A load: a short last one (last_piece_at), the rest in as few equal pieces as
// `most` allows: every DMA costs about 2.5 us beyond its bytes and 1.3 us passes between two
// (docs/gpu.md), and a long piece's scatter (HBM to HBM) overlaps the DMA of the short last
// piece. On the H200, 2026-12-04, V4-Pro fp8 loads of 16 blocks (23.2 MiB) as 20.9 + 2.3 MiB took
// 458.4-461.3 us against 466.0-467.6 us in pieces of at most 8 MiB (the bulk copy 441-443 us),
// 64 blocks (92.9 MiB: 3 x 27.9 + 9.3 MiB) 1788.8-1791.7 against 1804-1809 us (bulk 1756-1762).
class Pieces {
 public:
  Pieces(std::uint64_t n, std::uint64_t most, bool gather)
      : n_(n), last_(gather ? n : last_piece_at(n, most)) {
    const std::uint64_t count = last_ == 0 ? 1 : (last_ + most - 1) / most;
    body_ = gather ? std::min(most, kSavePieceBytes)
                   : std::min(most, round_up((last_ + count - 1) / count, kPieceAlign));
  }
  // The end of the piece that starts at `lo`.
  std::uint64_t end_of(std::uint64_t lo) const noexcept {
    return lo < last_ ? std::min(last_, lo + body_) : n_;
  }

 private:
  std::uint64_t n_;
  std::uint64_t last_;  // where the last piece starts (a save: no short last piece)
  std::uint64_t body_ = 0;
};

}  // namespace

std::uint64_t last_piece_at(std::uint64_t n, std::uint64_t most) noexcept {
  const std::uint64_t tail =
      std::min(most, std::max<std::uint64_t>(1u << 20, round_up(n / 10, kPieceAlign)));
  // Rounded up, so the last piece is at most `tail`; below `n`, as n > tail >= kPieceAlign
  // (`most` is at least a tile unless it is `n` itself).
  return n > tail ? round_up(n - tail, kPieceAlign) : 0;
}

// The staged path (the caller holds impl_->mu): the image in pieces (Pieces: at most
// staging_bytes) through ranges of the context's ring. A load: each piece's DMA on the upload
// lane into its range, then the scatter kernel on `s` once it landed; a save: the gather kernel
// on `s`, then the piece's DMA on the download lane. The DMAs run back to back while the kernels
// of earlier pieces run, and `s` is left ordered after all of it (for a save, after the last
// DMA). Pieces the ring cannot take go through the lane's staging buffer, DMA and kernel one
// after the other.
Status DeviceCopyExecutor::staged(const CopyPlan& plan, Region image, const Stream& s,
                                  bool gather) noexcept {
  CopyContext::State& st = ctx_->state();
  Impl& im = *impl_;
  const auto stream = stream_of(s);
  const std::uint64_t piece =
      std::min<std::uint64_t>(opts_.staging_bytes, plan.image_bytes);
  std::uint64_t lo = 0;
  if (piece <= CopyContext::ring_bytes() / 2) {
    const Stream& dma = ctx_->stream(gather ? Lane::kDownload : Lane::kUpload);
    TIER_ASSIGN_OR_RETURN(Event ev, ctx_->take_event());
    const EventBack back{st, ev};
    if (!gather) {  // the DMAs follow what the caller enqueued on `s` before this transfer
      TIER_RETURN_IF_ERROR(ev.record(s));
      TIER_RETURN_IF_ERROR(stream_wait_event(dma, ev.handle()));
    }
    bool moved = false;  // a save enqueued a DMA: `s` must wait for the last one
    const Pieces pieces(plan.image_bytes, piece, gather);
    for (std::uint64_t hi = 0; lo < plan.image_bytes; lo = hi) {
      hi = pieces.end_of(lo);
      auto range = ctx_->ring_acquire(hi - lo, gather ? s : dma);
      if (!range) {
        if (range.status() == Code::kRejected) break;  // the rest through the lane's buffer
        return range.status();
      }
      im.tiles.clear();
      build_tiles(plan, lo, hi, range->region.data, gather, nullptr, im.tiles);
      auto piece_enqueue = [&]() -> Status {
        if (gather) {
          TIER_RETURN_IF_ERROR(st.launch(im.tiles, stream));
          TIER_RETURN_IF_ERROR(ev.record(s));
          TIER_RETURN_IF_ERROR(stream_wait_event(dma, ev.handle()));
          TIER_GPU_TRY(rt::memcpy_async(image.data + lo, range->region.data, hi - lo,
                                        stream_of(dma)));
          moved = true;
          return Status::ok();
        }
        TIER_GPU_TRY(rt::memcpy_async(range->region.data, image.data + lo, hi - lo,
                                      stream_of(dma)));
        TIER_RETURN_IF_ERROR(ev.record(dma));
        TIER_RETURN_IF_ERROR(stream_wait_event(s, ev.handle()));
        return st.launch(im.tiles, stream);
      };
      const Status stp = piece_enqueue();
      // Retired behind its last user whatever happened (its DMA or kernel may be enqueued).
      Status ret = ctx_->ring_retire(*range, gather ? dma : s);
      TIER_RETURN_IF_ERROR(stp);
      TIER_RETURN_IF_ERROR(ret);
    }
    if (moved) {
      TIER_RETURN_IF_ERROR(ev.record(dma));
      TIER_RETURN_IF_ERROR(stream_wait_event(s, ev.handle()));
    }
    if (lo >= plan.image_bytes) return Status::ok();
  }
  std::lock_guard<std::mutex> lock(st.staging_mu);
  CopyContext::State::Staging& g = st.staging[gather ? 0 : 1];
  if (g.buffer.size() < piece) {
    TIER_ASSIGN_OR_RETURN(DeviceBuffer grown, DeviceBuffer::allocate(opts_.device, piece));
    try {
      if (g.buffer.data() != nullptr) st.retired_staging.push_back(std::move(g.buffer));
    } catch (const std::bad_alloc&) {
      return Status(Code::kNoSpace, "copy executor: out of memory");
    }
    g.buffer = std::move(grown);
    g.last_stream = nullptr;  // a fresh buffer: nothing to wait for
  }
  // Another stream used it last: its copies must have run first (device-side).
  if (g.last_stream != nullptr && g.last_stream != s.handle())
    TIER_RETURN_IF_ERROR(stream_wait_event(s, g.done.handle()));
  for (; lo < plan.image_bytes; lo += piece) {
    const std::uint64_t hi = std::min<std::uint64_t>(plan.image_bytes, lo + piece);
    im.tiles.clear();
    build_tiles(plan, lo, hi, g.buffer.data(), gather, nullptr, im.tiles);
    if (gather) {
      TIER_RETURN_IF_ERROR(st.launch(im.tiles, stream));
      TIER_GPU_TRY(rt::memcpy_async(image.data + lo, g.buffer.data(), hi - lo, stream));
    } else {
      TIER_GPU_TRY(rt::memcpy_async(g.buffer.data(), image.data + lo, hi - lo, stream));
      TIER_RETURN_IF_ERROR(st.launch(im.tiles, stream));
    }
  }
  TIER_RETURN_IF_ERROR(g.done.record(s));
  g.last_stream = s.handle();
  return Status::ok();
}

Status DeviceCopyExecutor::gather_async(const CopyPlan& plan, Region image,
                                        const Stream& s) noexcept {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return run(plan, image, s, true);
}

Status DeviceCopyExecutor::scatter_async(const CopyPlan& plan, Region image, const Stream& s,
                                         const std::uint32_t* gate) noexcept {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return run(plan, image, s, false, gate);
}

Status DeviceCopyExecutor::scatter_batch_async(std::span<const GatedScatter> items,
                                               const Stream& s) noexcept {
  for (const GatedScatter& g : items) {
    TIER_RETURN_IF_ERROR(check_plan(g.plan, g.image));
    if (g.image.kind != MemoryKind::kDevice)
      return Status::invalid("a batched scatter needs its images in device memory");
  }
  DeviceGuard guard(opts_.device);
  TIER_RETURN_IF_ERROR(guard.status());
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& im = *impl_;
  try {
    im.tiles.clear();
    for (const GatedScatter& g : items)
      build_tiles(g.plan, 0, g.plan.image_bytes, g.image.data, false, g.gate, im.tiles);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "copy executor: out of memory");
  }
  TIER_RETURN_IF_ERROR(ctx_->state().launch(im.tiles, stream_of(s)));
  TIER_RETURN_IF_ERROR(im.last[1].record(s));
  im.recorded[1] = true;
  return Status::ok();
}

Status DeviceCopyExecutor::order_after(void* stream, void* event) noexcept {
  return ctx_->order_after(stream, event);
}

Status DeviceCopyExecutor::run_on_lane(const CopyPlan& plan, Region image, bool gather) noexcept {
  const int dir = gather ? 0 : 1;
  const Stream& lane = ctx_->stream(gather ? Lane::kFromDevice : Lane::kToDevice);
  DeviceGuard guard(opts_.device);
  TIER_RETURN_IF_ERROR(guard.status());
  TIER_ASSIGN_OR_RETURN(Event done, ctx_->take_event());
  EventBack back{ctx_->state(), done};
  auto enqueue = [&]() -> Status {
    std::lock_guard<std::mutex> lock(impl_->mu);
    Impl& im = *impl_;
    // This executor's transfers keep their order across the two lanes (as on one stream).
    if (im.recorded[1 - dir]) {
      auto other = im.last[1 - dir].done();
      if (!other || !*other)
        TIER_RETURN_IF_ERROR(stream_wait_event(lane, im.last[1 - dir].handle()));
    }
    TIER_RETURN_IF_ERROR(run(plan, image, lane, gather));
    return done.record(lane);
  };
  const Status st = enqueue();
  // Copies already enqueued use the caller's memory: wait for them whatever happened.
  if (!st) {
    lane.synchronize().ignore();
    return st;
  }
  Status synced = done.synchronize();
  back.completed = synced.is_ok();
  return synced;
}

Status DeviceCopyExecutor::gather(const CopyPlan& plan, std::span<std::byte> image) noexcept {
  return run_on_lane(plan, Region{image.data(), image.size(), MemoryKind::kHost, -1}, true);
}

Status DeviceCopyExecutor::scatter(const CopyPlan& plan, std::span<const std::byte> image) noexcept {
  auto* p = const_cast<std::byte*>(image.data());  // only read: the image is the copy source
  return run_on_lane(plan, Region{p, image.size(), MemoryKind::kHost, -1}, false);
}

Status DeviceCopyExecutor::scatter_from(const CopyPlan& plan, Region image) noexcept {
  return run_on_lane(plan, image, false);
}

Status DeviceCopyExecutor::share_order() noexcept {
  DeviceGuard guard(opts_.device);
  TIER_RETURN_IF_ERROR(guard.status());
  const Stream& to = ctx_->stream(Lane::kToDevice);
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (int dir = 0; dir < 2; ++dir) {
    if (!impl_->recorded[dir]) continue;
    auto done = impl_->last[dir].done();
    if (done && *done) continue;
    TIER_RETURN_IF_ERROR(stream_wait_event(to, impl_->last[dir].handle()));
  }
  return Status::ok();
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
