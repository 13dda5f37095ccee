// The CPU tier's pinned modes: device-memory puts and gets (pinned_transfer.hpp).
#include "pinned_transfer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <vector>

#include "tier/object.hpp"

namespace tier::cpu {

namespace {

// Host words for the verdicts of device-verified gets in flight (4 bytes each).
constexpr std::size_t kVerdicts = 1024;
// Payloads up to kLandingBytes are batched, and a batch holds at most kBatchBytes of payload:
// its verification and copy start once its last byte landed, so this bounds what follows the
// DMA. A larger payload's DMA goes in two parts (gpu::last_piece_at), each checked as soon as it
// lands.
constexpr std::uint64_t kLandingBytes = 8u << 20;
constexpr std::uint64_t kBatchBytes = 16u << 20;
// Batches whose DMA is still running, per GPU, below which a new get is enqueued at once (so the
// copy engine always has the next DMA queued while later gets gather into the open batch).
constexpr std::size_t kBatchesInFlight = 2;
// The open batch goes once it holds this much payload, inside a submit of several gets (plug())
// or not, and at a plugged submit's end: the host checks and enqueues a batch of 4 MiB in less
// time than its DMA takes, so the copy engine stays busy while the next one gathers. Measured on
// the H200 with 1 MiB objects (16 and 64 per submit): 1 MiB 0.49-0.64x of the bulk copy, 2 MiB
// 0.82-0.89x, 4 MiB 0.83-0.92x, 8 MiB 0.81-0.93x, 16 MiB 0.77-0.93x; sending a batch early
// whenever the copy engine was idle made them vary (0.50-0.91x at 4 MiB).
constexpr std::uint64_t kPluggedBatchBytes = 4u << 20;
// Inside a submit, the batches after its first grow to this until what the submit still brings
// (DeviceTransfer::ahead) is at most kPluggedBatchBytes: then the batch goes at
// kPluggedBatchBytes and the rest is the submit's short last batch. Each DMA costs about 2.5 us
// beyond its bytes (docs/gpu.md), and only the last batch's check and copy follow the last byte.
// Measured on the H200 (1 MiB objects, 5 runs of each in turn, 2026-12-04): 64 gets per submit
// 0.934-0.941x of the bulk copy with 4 MiB between, 0.941-0.948x with 8 MiB, 0.932-0.960x with
// 16 MiB, all within each window of 16 gets (Backend::submit's); 0.937-0.951x (median 0.950)
// against 0.930-0.943x (0.941) once a batch stays open across windows and `ahead` counts the
// later ones (Backend::submit_rest). 16 gets per submit ([4, 8, 4] MiB) 0.87-0.90x either way.
constexpr std::uint64_t kLongBatchBytes = 8u << 20;
static_assert(kPluggedBatchBytes < kAheadHorizon);  // the rule below needs ahead() up to there
constexpr std::uint64_t kAlign = 256;

std::uint64_t round_up(std::uint64_t n, std::uint64_t a) { return (n + a - 1) / a * a; }

Region pinned_region(std::byte* p, std::size_t n) {
  return Region{p, n, MemoryKind::kPinnedHost, -1};
}

// Enqueues the copy of image bytes [begin, end) between `pieces` and `dev`, whose first byte is
// image byte `dev_at` (0: the whole image): device to pieces when `to_host`, pieces to device
// otherwise.
Status enqueue_range(std::span<const Piece> pieces, Region dev, std::size_t begin, std::size_t end,
                     bool to_host, const gpu::Stream& s, std::size_t dev_at = 0) noexcept {
  std::size_t off = 0;
  for (const Piece& p : pieces) {
    const std::size_t lo = std::max(begin, off), hi = std::min(end, off + p.size());
    if (lo < hi) {
      Region host = pinned_region(p.data() + (lo - off), hi - lo);
      Region device = dev.slice(lo - dev_at, hi - lo);
      if (device.data == nullptr) return Status::invalid("device region shorter than the image");
      TIER_RETURN_IF_ERROR(to_host ? gpu::copy_async(host, device, s)
                                   : gpu::copy_async(device, host, s));
    }
    off += p.size();
  }
  return Status::ok();
}

std::size_t total_size(std::span<const Piece> pieces) {
  std::size_t n = 0;
  for (const Piece& p : pieces) n += p.size();
  return n;
}

// The object header at the start of the image held by `pieces` (parse_object_header of its first
// min(kObjectHeaderBytes, image) bytes, gathered from the pieces).
Result<ObjectHeader> header_of(std::span<const Piece> pieces) noexcept {
  std::array<std::byte, kObjectHeaderBytes> head;
  return parse_object_header({head.data(), copy_head(pieces, head)});
}

// The spans that put a payload's bytes after its first `skip` into `regions` (image offsets are
// payload offsets).
void payload_spans(RegionList regions, std::size_t skip, std::vector<CopySpan>& out) {
  out.clear();
  std::uint64_t at = skip;
  for (const Region& r : regions) {
    if (r.size > 0) out.push_back(CopySpan{r.data, at, r.size});
    at += r.size;
  }
}

}  // namespace

Status PinnedTransfer::available() noexcept {
  if (gpu::device_count() == 0)
    return Status(Code::kNotSupported,
                  fmt::format("pinned: true needs a GPU, and this machine has no {} device",
                              gpu::api_name()));
  return Status::ok();
}

Result<std::unique_ptr<PinnedTransfer>> PinnedTransfer::create() {
  TIER_RETURN_IF_ERROR(available());
  return std::unique_ptr<PinnedTransfer>(new PinnedTransfer());
}

Result<std::unique_ptr<DeviceTransfer>> PinnedTransfer::register_mapping(
    std::span<std::byte> mapping) {
  TIER_RETURN_IF_ERROR(available());
  TIER_ASSIGN_OR_RETURN(gpu::PinnedRegistration reg,
                        gpu::PinnedRegistration::register_host(mapping));
  std::unique_ptr<PinnedTransfer> t(new PinnedTransfer());
  t->registration_.emplace(std::move(reg));
  return std::unique_ptr<DeviceTransfer>(std::move(t));
}

PinnedTransfer::~PinnedTransfer() {
  quiesce();  // nothing may read the pieces or the verdict words once they are gone
  while (!tickets_.empty()) end(tickets_.begin(), true);
}

Result<PinnedTransfer::Gpu*> PinnedTransfer::gpu_for(int device) noexcept {
  const auto d = static_cast<std::size_t>(device);
  if (device >= 0 && d < gpus_.size() && gpus_[d]) return gpus_[d].get();
  if (device < 0 || device >= gpu::device_count())
    return Status::invalid(fmt::format("device region names GPU {}, which does not exist", device));
  TIER_ASSIGN_OR_RETURN(auto ctx, gpu::CopyContext::of(device));
  gpu::ExecutorOptions opts;
  opts.device = device;
  TIER_ASSIGN_OR_RETURN(auto executor, gpu::DeviceCopyExecutor::create(opts));
  TIER_ASSIGN_OR_RETURN(auto counters,
                        gpu::VerifyCounters::allocate(ctx->stream(gpu::Lane::kToDevice)));
  try {
    if (gpus_.size() <= d) gpus_.resize(d + 1);
    gpus_[d] =
        std::make_unique<Gpu>(Gpu{std::move(ctx), std::move(executor), std::move(counters)});
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "pinned transfer: out of memory");
  }
  return gpus_[d].get();
}

PinnedTransfer::Ticket* PinnedTransfer::find(std::uint64_t id) noexcept {
  for (Ticket& t : tickets_)
    if (t.id == id) return &t;
  return nullptr;
}

PinnedTransfer::Batch* PinnedTransfer::find_batch(std::uint64_t id) noexcept {
  for (auto& b : batches_)
    if (b->id == id) return b.get();
  return nullptr;
}

Result<int> PinnedTransfer::take_verdict() noexcept {
  if (verdicts_.data() == nullptr) {
    TIER_ASSIGN_OR_RETURN(verdicts_,
                          gpu::PinnedBuffer::allocate(kVerdicts * sizeof(std::uint32_t)));
    try {
      verdict_used_.assign(kVerdicts, false);
    } catch (const std::bad_alloc&) {
      return Status(Code::kNoSpace, "pinned transfer: out of memory");
    }
  }
  auto free_word = std::find(verdict_used_.begin(), verdict_used_.end(), false);
  if (free_word == verdict_used_.end()) return -1;
  *free_word = true;
  const int w = static_cast<int>(free_word - verdict_used_.begin());
  reinterpret_cast<std::uint32_t*>(verdicts_.data())[w] = 0;
  return w;
}

void PinnedTransfer::release_verdict(int& word) noexcept {
  if (word >= 0) verdict_used_[static_cast<std::size_t>(word)] = false;
  word = -1;
}

Status PinnedTransfer::put_from_device(std::span<const Piece> pieces, Region src,
                                       const ObjectKey& key) noexcept {
  TIER_ASSIGN_OR_RETURN(Gpu * g, gpu_for(src.device));
  // The DMA reads the caller's device memory: on the lane that follows the caller's order.
  const gpu::Stream& s = g->ctx->stream(gpu::Lane::kFromDevice);
  TIER_ASSIGN_OR_RETURN(gpu::Event done, g->ctx->take_event());
  const std::size_t n = total_size(pieces);
  Status st = enqueue_range(pieces, src, 0, n, true, s);
  if (st) st = done.record(s);
  // Copies already enqueued write into the pieces: wait for them whatever happened.
  Status sync = st ? done.synchronize() : s.synchronize();
  g->ctx->give_event(std::move(done), sync.is_ok());
  TIER_RETURN_IF_ERROR(st);
  TIER_RETURN_IF_ERROR(sync);
  auto h = header_of(pieces);
  if (!h)
    return Status::invalid("put: image has no valid object header: " + h.status().to_string());
  if (!(h->key == key))
    return Status::invalid("put: image header names another key than the request");
  if (h->payload_bytes + kObjectHeaderBytes > n)
    return Status::invalid("put: image is shorter than its header declares");
  return Status::ok();
}

Status PinnedTransfer::get_to_device(Region dst, std::span<const Piece> pieces,
                                     const ObjectKey& key) noexcept {
  const std::size_t n = total_size(pieces);
  if (dst.size < n) return Status::invalid("destination smaller than the object");
  TIER_ASSIGN_OR_RETURN(Gpu * g, gpu_for(dst.device));
  const gpu::Stream& s = g->ctx->stream(gpu::Lane::kToDevice);
  TIER_ASSIGN_OR_RETURN(gpu::Event done, g->ctx->take_event());
  // Whatever the destination holds after a failure (the stored bytes, or a valid header of an
  // earlier copy) must not be taken for a valid object: its header is zeroed before returning.
  auto fail = [&](Status why) {
    static constexpr std::array<std::byte, kObjectHeaderBytes> kZeros{};
    if (gpu::copy_async(
            dst.slice(0, kObjectHeaderBytes),
            Region{const_cast<std::byte*>(kZeros.data()), kZeros.size(), MemoryKind::kHost, -1},
            s) &&
        done.record(s))
      done.synchronize().ignore();
    g->ctx->give_event(std::move(done));
    return why;
  };
  // Header, key and length first: nothing moves for an image that fails them.
  auto h = header_of(pieces);
  if (!h) return fail(h.status());
  if (!(h->key == key))
    return fail(Status(Code::kChecksumMismatch, "object header names another key"));
  if (h->payload_bytes != n - kObjectHeaderBytes)
    return fail(Status(Code::kChecksumMismatch, "object length does not match its header"));

  // The whole image's DMA starts at once; meanwhile this thread and the verification threads
  // hash the same page-locked bytes chunk by chunk. Success is reported only when both finished
  // and every chunk matched.
  Status st = enqueue_range(pieces, dst, 0, n, false, s);
  if (st) st = done.record(s);
  std::vector<std::span<const std::byte>> source(pieces.begin(), pieces.end());
  Status verified = st ? verify_payload(source, *h) : st;
  // Copies already enqueued write into dst: wait whatever happened.
  Status sync = st ? done.synchronize() : s.synchronize();
  if (st && sync && verified) {
    g->ctx->give_event(std::move(done), true);
    return Status::ok();
  }
  if (!st) return fail(st);
  if (!sync) return fail(sync);
  return fail(verified);
}

std::size_t PinnedTransfer::in_flight(int device) noexcept {
  std::size_t n = 0;
  for (auto& b : batches_) {
    if (!b->flushed || b->landed_seen || b->device != device || b->landed.handle() == nullptr)
      continue;
    auto landed = b->landed.done();
    if (landed && *landed)
      b->landed_seen = true;
    else
      ++n;
  }
  return n;
}

// A batch in the ring: each run of images that lie back to back in page-locked memory (and keep
// their payloads 8-byte aligned) moves with one DMA, headers included, placed so that the run's
// first payload is 256-byte aligned; the verification scratch of every item follows the runs.
// Then, on the kToDevice lane once the DMAs landed: one verification launch for every payload
// and one copy launch whose tiles are gated by their own payload's verdict.
Status PinnedTransfer::flush() noexcept {
  if (batches_.empty() || batches_.back()->flushed) return Status::ok();
  Batch& b = *batches_.back();
  b.flushed = true;
  if (plugged_) ++plugged_batches_;
  Gpu& g = *gpus_[static_cast<std::size_t>(b.device)];
  const int dev = b.device;
  try {
    // The layout: per item, its image's offset in the ring range; per item, its scratch.
    struct Run {
      const std::byte* src;  // single-piece runs
      std::uint64_t at, bytes;
      const Item* multi;  // an item of several pieces, alone in its run
    };
    std::vector<Run> runs;
    std::vector<std::uint64_t> image_at(b.items.size()), scratch_at(b.items.size());
    std::uint64_t p = 0;
    for (std::size_t i = 0; i < b.items.size(); ++i) {
      const Item& it = b.items[i];
      const bool single = it.pieces.size() == 1;
      if (single && !runs.empty() && runs.back().multi == nullptr &&
          runs.back().src + runs.back().bytes == it.pieces[0].data() &&
          runs.back().bytes % 8 == 0) {
        image_at[i] = runs.back().at + runs.back().bytes;
        runs.back().bytes += it.pieces[0].size();
      } else {
        const std::uint64_t at = round_up(p + kObjectHeaderBytes, kAlign) - kObjectHeaderBytes;
        image_at[i] = at;
        runs.push_back(Run{single ? it.pieces[0].data() : nullptr, at,
                           kObjectHeaderBytes + it.header.payload_bytes, single ? nullptr : &it});
      }
      p = runs.back().at + runs.back().bytes;
    }
    for (std::size_t i = 0; i < b.items.size(); ++i) {
      scratch_at[i] = round_up(p, kAlign);
      p = scratch_at[i] + gpu::verify_scratch_bytes(b.items[i].header.payload_bytes);
    }
    const gpu::Stream& up = g.ctx->stream(gpu::Lane::kUpload);
    const gpu::Stream& to = g.ctx->stream(gpu::Lane::kToDevice);
    Status st;
    bool enqueued = false;  // the lanes may hold some of this batch's work
    if (auto e = g.ctx->take_event())
      b.done = std::move(*e);
    else
      st = e.status();
    if (st) {
      if (auto e = g.ctx->take_event())
        b.landed = std::move(*e);
      else
        st = e.status();
    }
    Result<gpu::RingRange> range = st;
    if (st) {
      range = g.ctx->ring_acquire(p, up);
      st = range.status();
    }
    if (st) {
      enqueued = true;
      std::byte* base = range->region.data;
      for (const Run& r : runs) {
        if (!st) break;
        if (r.multi == nullptr) {
          st = gpu::copy_async(Region{base + r.at, r.bytes, MemoryKind::kDevice, dev},
                               pinned_region(const_cast<std::byte*>(r.src), r.bytes), up);
        } else {
          st =
              enqueue_range(r.multi->pieces, Region{base + r.at, r.bytes, MemoryKind::kDevice, dev},
                            0, r.bytes, false, up);
        }
      }
      // Landed: the verification and the copies wait for it on the kToDevice lane.
      if (st) st = b.landed.record(up);
      if (st) st = gpu::stream_wait_event(to, b.landed.handle());
      std::vector<gpu::VerifyItem> verify;
      std::vector<gpu::GatedScatter> copies;
      std::vector<std::vector<CopySpan>> spans(b.items.size());
      for (std::size_t i = 0; i < b.items.size() && st; ++i) {
        const Item& it = b.items[i];
        const Region payload{base + image_at[i] + kObjectHeaderBytes, it.header.payload_bytes,
                             MemoryKind::kDevice, dev};
        const Region scratch{base + scratch_at[i],
                             gpu::verify_scratch_bytes(it.header.payload_bytes),
                             MemoryKind::kDevice, dev};
        verify.push_back(
            gpu::VerifyItem{payload, it.header.payload_checksum, scratch,
                            reinterpret_cast<std::uint32_t*>(verdicts_.data()) + it.verdict,
                            it.claim ? &*it.claim : nullptr});
        payload_spans(it.payload, it.skip, spans[i]);
        copies.push_back(
            gpu::GatedScatter{CopyPlan{spans[i], MemoryKind::kDevice, dev, it.header.payload_bytes},
                              payload, reinterpret_cast<const std::uint32_t*>(scratch.data)});
      }
      if (st) st = gpu::verify_payloads_async(verify, g.counters, to);
      if (st) st = g.executor->scatter_batch_async(copies, to);
      if (st) st = b.done.record(to);
      // Retired behind its last reader whatever happened: enqueued work may still read it.
      Status ret = g.ctx->ring_retire(*range, to);
      if (st) st = ret;
    }
    if (!st) {
      // Nothing of this batch is reported as loaded: the copies may be partly enqueued, so wait
      // for both lanes before the pieces may change.
      if (enqueued) {
        up.synchronize().ignore();
        to.synchronize().ignore();
      }
      for (const Item& it : b.items)
        if (Ticket* t = find(it.ticket)) t->failed = st;
    }
    b.items.clear();
    b.items.shrink_to_fit();
    return st;
  } catch (const std::bad_alloc&) {
    for (const Item& it : b.items)
      if (Ticket* t = find(it.ticket))
        t->failed = Status(Code::kNoSpace, "pinned transfer: out of memory");
    b.items.clear();
    return Status(Code::kNoSpace, "pinned transfer: out of memory");
  }
}

Result<bool> PinnedTransfer::enqueue_large(Gpu& g, std::span<const Piece> pieces,
                                           const ObjectHeader& h, const CrcClaim* crc,
                                           RegionList payload, std::size_t skip,
                                           Ticket& t) noexcept {
  const int dev = g.ctx->device();
  const std::uint64_t n = h.payload_bytes;
  const std::uint64_t scratch_at = round_up(n, kAlign);
  const std::uint64_t need = scratch_at + gpu::verify_scratch_bytes(n);
  if (need > gpu::CopyContext::ring_bytes()) return false;
  TIER_ASSIGN_OR_RETURN(int word, take_verdict());
  if (word < 0) return false;
  const gpu::Stream& up = g.ctx->stream(gpu::Lane::kUpload);
  const gpu::Stream& to = g.ctx->stream(gpu::Lane::kToDevice);
  auto range = g.ctx->ring_acquire(need, up);
  if (!range) {
    release_verdict(word);
    if (range.status() == Code::kRejected) return false;
    return range.status();
  }
  t.verdict = word;
  const Region staged{range->region.data, n, MemoryKind::kDevice, dev};
  const Region scratch{range->region.data + scratch_at, need - scratch_at, MemoryKind::kDevice,
                       dev};
  // The DMA in two parts (gpu::last_piece_at), each behind an event, so the GPU checks the first
  // while the short last one lands. Each part is a DMA of its own, about 2.5 us beyond its bytes
  // (docs/gpu.md): a 16k-token V4-Pro restore, whose 25.5 MiB sidecar went in 8 MiB parts before
  // (4 DMAs), took 1.079-1.102x the bulk copy against 1.067-1.072x in two parts (the H200, 3 runs
  // of each in turn, 2026-12-04).
  std::uint64_t ends[2];  // each part's end
  std::size_t parts = 0;
  if (const std::uint64_t last = gpu::last_piece_at(n, n); last > 0) ends[parts++] = last;
  ends[parts++] = n;
  std::vector<gpu::Landing> landings;
  Status st;
  try {
    while (st && t.landed.size() < parts) {
      auto e = g.ctx->take_event();
      if (!e)
        st = e.status();
      else
        t.landed.push_back(std::move(*e));
    }
    for (std::uint64_t k = 0; k < parts && st; ++k) {
      const std::uint64_t lo = k == 0 ? 0 : ends[k - 1], hi = ends[k];
      st = enqueue_range(pieces, staged, kObjectHeaderBytes + lo, kObjectHeaderBytes + hi, false,
                         up, kObjectHeaderBytes);
      if (st) st = t.landed[k].record(up);
      landings.push_back(gpu::Landing{hi, &t.landed[k]});
    }
    if (st)
      st = gpu::verify_payload_async(staged, h.payload_checksum, scratch,
                                     reinterpret_cast<std::uint32_t*>(verdicts_.data()) + word,
                                     g.counters, to, crc, landings);
    std::vector<CopySpan> spans;
    payload_spans(payload, skip, spans);
    if (st)
      st = g.executor->scatter_async(CopyPlan{spans, MemoryKind::kDevice, dev, n}, staged, to,
                                     reinterpret_cast<const std::uint32_t*>(scratch.data));
    if (st) st = t.done.record(to);
  } catch (const std::bad_alloc&) {
    st = Status(Code::kNoSpace, "pinned transfer: out of memory");
  }
  Status ret = g.ctx->ring_retire(*range, to);
  if (st) st = ret;
  if (!st) {
    up.synchronize().ignore();  // copies already enqueued read the pieces and the ring
    to.synchronize().ignore();
    release_verdict(t.verdict);
    return st;
  }
  return true;
}

Status PinnedTransfer::enqueue_host_checked(Gpu& g, std::span<const Piece> pieces,
                                            std::span<std::byte> header, RegionList payload,
                                            const ObjectKey& key, std::size_t skip,
                                            const PayloadCheck* check, Ticket& t) noexcept {
  TIER_RETURN_IF_ERROR(
      check_scattered(pieces, header, skip + total_bytes(payload), key, t.stored, check));
  const int dev = g.ctx->device();
  const gpu::Stream& to = g.ctx->stream(gpu::Lane::kToDevice);
  // One copy plan per piece: the parts of the payload regions that the piece's bytes fill, with
  // image offsets relative to the piece (the image starts with the object header and `skip`
  // payload bytes that go nowhere).
  try {
    std::vector<CopySpan> spans;
    std::size_t r = 0, at = 0;    // the payload region and the offset in it
    std::uint64_t image_off = 0;  // image offset of the current piece's first byte
    for (const Piece& p : pieces) {
      spans.clear();
      const std::uint64_t lo = std::max<std::uint64_t>(image_off, kObjectHeaderBytes + skip);
      const std::uint64_t hi = image_off + p.size();
      for (std::uint64_t x = lo; x < hi;) {
        while (payload[r].size == at) ++r, at = 0;  // sizes add up (checked): r stays in range
        const std::uint64_t n = std::min<std::uint64_t>(hi - x, payload[r].size - at);
        spans.push_back(CopySpan{payload[r].data + at, x - image_off, n});
        x += n;
        at += n;
      }
      if (!spans.empty()) {
        CopyPlan plan{spans, MemoryKind::kDevice, dev, p.size()};
        Status st = g.executor->scatter_async(plan, pinned_region(p.data(), p.size()), to);
        if (!st) {
          to.synchronize().ignore();  // copies already enqueued read the pieces
          return st;
        }
      }
      image_off = hi;
    }
  } catch (const std::bad_alloc&) {
    to.synchronize().ignore();
    return Status(Code::kNoSpace, "pinned transfer: out of memory");
  }
  Status st = t.done.record(to);
  if (!st) to.synchronize().ignore();
  return st;
}

// A scattered get, checked before any byte reaches `payload`, one of three ways:
// - batched (version 2 payloads up to kBatchBytes): header, key, layout and length on the host,
//   and the codec's check_head() (an AOS1 frame's fields: everything but its CRC); the payload
//   joins the open batch (flush()), whose verification computes the chunk checksums, their list,
//   the codec's CRC claim and the verdict on the GPU, and whose copy kernel writes the regions
//   only if the bytes that landed are the bytes that were stored and the codec's frame is whole.
//   No host thread reads the payload, so the DMAs of a batch of gets run back to back.
// - alone, the same checks on the GPU (larger version 2 payloads that fit the ring): the DMA in
//   parts, each verified as it lands (enqueue_large).
// - on the host otherwise (check_scattered: the chunk checksums on the verification threads), then
//   one copy-kernel launch per piece, reading the page-locked bytes.
// (A codec without check_head() is checked whole on the host before the get joins a batch.)
// scatter_done() reads the verdict.
Result<std::uint64_t> PinnedTransfer::scatter_to_device(std::span<const Piece> pieces,
                                                        std::span<std::byte> header,
                                                        RegionList payload,
                                                        const ObjectKey& key, std::size_t skip,
                                                        const PayloadCheck* check) noexcept {
  try {
    // The GPU of the payload's regions (one, Backend::submit checked; empty ones name none).
    auto first = std::find_if(payload.begin(), payload.end(), [](const Region& x) { return x.size > 0; });
    TIER_ASSIGN_OR_RETURN(Gpu * g, gpu_for(first == payload.end() ? -1 : first->device));
    const int dev = g->ctx->device();
    TIER_ASSIGN_OR_RETURN(ObjectHeader h,
                          check_scattered_header(pieces, header, skip + total_bytes(payload), key));
    // The codec's check: its fields now, when it leaves the CRC to the GPU.
    std::optional<CrcClaim> claim;
    if (h.version >= 2 && check != nullptr) {
      TIER_ASSIGN_OR_RETURN(claim, check_stored_payload(pieces, check, true));
      if (!claim) {  // no split: its whole check on the host now
        TIER_RETURN_IF_ERROR(check_stored_payload(pieces, check).status());
      }
    }
    Ticket t;
    t.id = next_ticket_;
    t.device = dev;
    t.header = header;
    copy_head(pieces, t.stored);

    if (h.version >= 2 && h.payload_bytes <= kLandingBytes) {
      TIER_ASSIGN_OR_RETURN(int word, take_verdict());
      if (word >= 0) {
        Batch* open =
            batches_.empty() || batches_.back()->flushed ? nullptr : batches_.back().get();
        if (open != nullptr && (open->device != dev || open->items.size() == gpu::kMaxVerifyBatch ||
                                open->payload_bytes + h.payload_bytes > kBatchBytes)) {
          flush().ignore();  // a failure is its tickets' (scatter_done reports it)
          open = nullptr;
        }
        if (open == nullptr) {
          batches_.push_back(std::make_unique<Batch>());
          open = batches_.back().get();
          open->id = next_batch_++;
          open->device = dev;
        }
        Item it;
        it.ticket = t.id;
        it.pieces.assign(pieces.begin(), pieces.end());
        it.payload.assign(payload.begin(), payload.end());
        it.skip = skip;
        it.header = h;
        it.claim = claim;
        it.verdict = word;
        open->items.push_back(std::move(it));
        open->payload_bytes += h.payload_bytes;
        ++open->open;
        t.verdict = word;
        t.batch = open->id;
        tickets_.push_back(std::move(t));
        ++next_ticket_;
        // A batch of kPluggedBatchBytes goes now. A smaller one goes now while the GPU has little
        // to do; otherwise it grows until a batch in flight finishes or the caller waits. Inside
        // a submit of several gets, it grows to kPluggedBatchBytes when it is the submit's first
        // or what follows it is short (ahead()), to kLongBatchBytes between.
        const std::uint64_t id = tickets_.back().id;
        const bool long_batch = plugged_ && plugged_batches_ > 0 && ahead_ > kPluggedBatchBytes;
        const bool go =
            open->payload_bytes >= (long_batch ? kLongBatchBytes : kPluggedBatchBytes) ||
            (!plugged_ && in_flight(dev) < kBatchesInFlight);
        if (go) flush().ignore();  // the ticket reports a failure
        return id;
      }
    }
    // Not batched: what is open goes first, so tickets complete in order.
    flush().ignore();  // a failure is its tickets'

    TIER_ASSIGN_OR_RETURN(t.done, g->ctx->take_event());
    Result<bool> on_device = false;
    if (h.version >= 2)
      on_device = enqueue_large(*g, pieces, h, claim ? &*claim : nullptr, payload, skip, t);
    Status st = on_device.status();
    if (st && !*on_device)
      st = enqueue_host_checked(*g, pieces, header, payload, key, skip, check, t);
    if (!st) {
      g->ctx->give_event(std::move(t.done));
      for (gpu::Event& e : t.landed) g->ctx->give_event(std::move(e));
      return st;
    }
    tickets_.push_back(std::move(t));
    ++next_ticket_;
    return tickets_.back().id;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "pinned transfer: out of memory");
  }
}

void PinnedTransfer::end(std::vector<Ticket>::iterator it, bool events_completed) noexcept {
  release_verdict(it->verdict);
  Gpu* g = it->device >= 0 && static_cast<std::size_t>(it->device) < gpus_.size()
               ? gpus_[static_cast<std::size_t>(it->device)].get()
               : nullptr;
  if (g != nullptr && events_completed) {
    // Completed events go back to the context's pool (after a device error they are dropped).
    g->ctx->give_event(std::move(it->done), true);
    for (gpu::Event& e : it->landed) g->ctx->give_event(std::move(e), true);
  }
  if (it->batch != 0) {
    auto b = std::find_if(batches_.begin(), batches_.end(),
                          [&](const auto& x) { return x->id == it->batch; });
    if (b != batches_.end() && --(*b)->open == 0 && (*b)->flushed) {
      if (g != nullptr && events_completed) {
        g->ctx->give_event(std::move((*b)->done), true);
        g->ctx->give_event(std::move((*b)->landed), true);
      }
      batches_.erase(b);
    }
  }
  tickets_.erase(it);
}

Result<bool> PinnedTransfer::scatter_done(std::uint64_t ticket, bool wait) noexcept {
  // A caller that waits will wait for the rest too: what is open goes now, behind the DMAs in
  // flight, instead of after this ticket's copy.
  if (wait) flush().ignore();  // a failure is its tickets'
  auto it = std::find_if(tickets_.begin(), tickets_.end(),
                         [&](const Ticket& t) { return t.id == ticket; });
  if (it == tickets_.end()) return Status::invalid("pinned transfer: unknown scatter ticket");
  const gpu::Event* done = &it->done;
  Batch* b = nullptr;
  if (it->batch != 0) {
    b = find_batch(it->batch);
    if (b == nullptr) return Status(Code::kBadState, "pinned transfer: a ticket lost its batch");
    if (!b->flushed) {
      // Waiting, or the GPU has nothing else of this tier's to do: enqueue it now.
      if (!wait && in_flight(b->device) > 0) return false;
      flush().ignore();  // a failure is the ticket's `failed`
    }
    done = &b->done;
  }
  Status st = it->failed;  // a failed flush has waited for what it enqueued
  bool completed = true;   // the events' work has run: they may be reused
  if (st && !(b != nullptr && b->done_seen)) {
    if (wait) {
      st = done->synchronize();
    } else {
      auto d = done->done();
      if (d && !*d) return false;
      st = d.status();
    }
    if (!st) {
      completed = false;
      st = Status(Code::kDeviceError,
                  fmt::format("pinned tier: the copy into device memory failed: {}", st.message()));
    } else if (b != nullptr) {
      b->done_seen = true;
    }
  }
  if (st && it->verdict >= 0) {
    const std::uint32_t v =
        *reinterpret_cast<volatile const std::uint32_t*>(verdicts_.data() + 4 * it->verdict);
    if (v == gpu::kVerdictMismatch)
      st = Status(Code::kChecksumMismatch,
                  "object payload checksum mismatch (verified on the GPU; nothing written)");
    else if (v != gpu::kVerdictMatch)
      st = Status(Code::kDeviceError, "pinned tier: the GPU verification left no verdict");
  }
  if (st) std::copy(it->stored.begin(), it->stored.end(), it->header.begin());
  end(it, completed);
  if (!st) return st;
  return true;
}

void PinnedTransfer::plug() noexcept {
  if (!continuing_) plugged_batches_ = 0;
  continuing_ = false;
  plugged_ = true;
}

void PinnedTransfer::unplug(bool more) noexcept {
  plugged_ = false;
  continuing_ = more;
  ahead_ = 0;
  if (!more) flush().ignore();  // its failure is its tickets'
}

void PinnedTransfer::quiesce() noexcept {
  flush().ignore();  // its failure is its tickets'
  for (auto& b : batches_)
    if (b->flushed) b->done.synchronize().ignore();
  for (Ticket& t : tickets_)
    if (t.batch == 0 && t.failed) t.done.synchronize().ignore();
}

}  // namespace tier::cpu
