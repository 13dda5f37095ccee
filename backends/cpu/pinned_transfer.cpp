// The CPU tier's pinned modes: device-memory puts and gets (pinned_transfer.hpp).
#include "pinned_transfer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <vector>

#include "tier/object.hpp"

namespace tier::cpu {

namespace {

// The staging ring of gets verified on the device, per GPU: payloads up to this size (with their
// chunk lists) are checked there; larger ones, and version 1 payloads, on the host.
constexpr std::uint64_t kRingBytes = 64u << 20;
constexpr std::uint64_t kRingAlign = 256;
// Host words for the verdicts of device-verified gets in flight (4 bytes each).
constexpr std::size_t kVerdicts = 1024;
// A device-verified payload's DMA goes in parts of this size, each checked as soon as it lands.
constexpr std::uint64_t kLandingBytes = 8u << 20;

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

Result<PinnedTransfer::Gpu*> PinnedTransfer::gpu_for(int device) noexcept {
  const auto d = static_cast<std::size_t>(device);
  if (device >= 0 && d < gpus_.size() && gpus_[d]) return gpus_[d].get();
  if (device < 0 || device >= gpu::device_count())
    return Status::invalid(fmt::format("device region names GPU {}, which does not exist", device));
  TIER_ASSIGN_OR_RETURN(gpu::Stream s, gpu::Stream::create(device));
  TIER_ASSIGN_OR_RETURN(gpu::Stream dma, gpu::Stream::create(device));
  gpu::ExecutorOptions opts;
  opts.device = device;
  TIER_ASSIGN_OR_RETURN(auto executor, gpu::DeviceCopyExecutor::create(opts));
  try {
    if (gpus_.size() <= d) gpus_.resize(d + 1);
    gpus_[d] = std::make_unique<Gpu>(Gpu{std::move(s), std::move(dma), std::move(executor)});
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "pinned transfer: out of memory");
  }
  return gpus_[d].get();
}

Result<gpu::Stream*> PinnedTransfer::stream_for(int device) noexcept {
  TIER_ASSIGN_OR_RETURN(Gpu * g, gpu_for(device));
  return &g->stream;
}

Status PinnedTransfer::put_from_device(std::span<const Piece> pieces, Region src,
                                       const ObjectKey& key) noexcept {
  TIER_ASSIGN_OR_RETURN(gpu::Stream * s, stream_for(src.device));
  const std::size_t n = total_size(pieces);
  Status st = enqueue_range(pieces, src, 0, n, true, *s);
  // Copies already enqueued write into the pieces: wait for them whatever happened.
  Status sync = s->synchronize();
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
  TIER_ASSIGN_OR_RETURN(gpu::Stream * s, stream_for(dst.device));
  // Whatever the destination holds after a failure (the stored bytes, or a valid header of an
  // earlier copy) must not be taken for a valid object: its header is zeroed before returning.
  auto fail = [&](Status why) {
    static constexpr std::array<std::byte, kObjectHeaderBytes> kZeros{};
    if (gpu::copy_async(
            dst.slice(0, kObjectHeaderBytes),
            Region{const_cast<std::byte*>(kZeros.data()), kZeros.size(), MemoryKind::kHost, -1},
            *s))
      s->synchronize().ignore();
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
  Status st = enqueue_range(pieces, dst, 0, n, false, *s);
  std::vector<std::span<const std::byte>> source(pieces.begin(), pieces.end());
  Status verified = st ? verify_payload(source, *h) : st;
  Status sync = s->synchronize();  // copies already enqueued write into dst: wait whatever happened
  if (st && sync && verified) return Status::ok();
  if (!st) return fail(st);
  if (!sync) return fail(sync);
  return fail(verified);
}

Result<bool> PinnedTransfer::enqueue_device_check(Gpu& g, std::span<const Piece> pieces,
                                                  const ObjectHeader& h, const CrcClaim* crc,
                                                  Ticket& t) noexcept {
  const int dev = g.stream.device();
  const std::uint64_t n = h.payload_bytes;
  const std::uint64_t scratch_at = round_up(n, kRingAlign);
  const std::uint64_t need = scratch_at + round_up(gpu::verify_scratch_bytes(n), kRingAlign);
  if (h.version < 2 || need > kRingBytes || g.ring_failed) return false;
  if (verdicts_.data() == nullptr) {
    TIER_ASSIGN_OR_RETURN(verdicts_, gpu::PinnedBuffer::allocate(kVerdicts * sizeof(std::uint32_t)));
    verdict_used_.assign(kVerdicts, false);
  }
  auto free_word = std::find(verdict_used_.begin(), verdict_used_.end(), false);
  if (free_word == verdict_used_.end()) return false;
  if (g.ring.data() == nullptr) {
    auto ring = gpu::DeviceBuffer::allocate(g.stream.device(), kRingBytes);
    if (!ring) {
      g.ring_failed = true;  // device memory is short: every get verifies on the host
      return false;
    }
    g.ring = std::move(*ring);
  }
  // The ring range: after the previous get's, or from the start when it does not fit. The DMA
  // into it waits (on the device) for every get still using part of it.
  std::uint64_t lo = g.ring_head + need <= kRingBytes ? g.ring_head : 0;
  for (const Ticket& o : tickets_)
    if (o.done.device() == dev && o.ring_lo < lo + need && lo < o.ring_hi)
      TIER_RETURN_IF_ERROR(gpu::stream_wait_event(g.dma, o.done.handle()));
  const Region staged{g.ring.data() + lo, n, MemoryKind::kDevice, dev};
  const Region scratch{g.ring.data() + lo + scratch_at, need - scratch_at, MemoryKind::kDevice,
                       dev};
  // The DMA in parts of kLandingBytes, each behind an event, so the GPU checks a part while the
  // next one lands (one part for most objects).
  const std::uint64_t parts = std::max<std::uint64_t>(1, (n + kLandingBytes - 1) / kLandingBytes);
  std::vector<gpu::Landing> landings;
  while (t.landed.size() < parts) {
    TIER_ASSIGN_OR_RETURN(gpu::Event e, take_event(g));
    t.landed.push_back(std::move(e));
  }
  Status st;
  for (std::uint64_t k = 0; k < parts && st; ++k) {
    const std::uint64_t hi = std::min(n, (k + 1) * kLandingBytes);
    st = enqueue_range(pieces, staged, kObjectHeaderBytes + k * kLandingBytes,
                       kObjectHeaderBytes + hi, false, g.dma, kObjectHeaderBytes);
    if (st) st = t.landed[k].record(g.dma);
    landings.push_back(gpu::Landing{hi, &t.landed[k]});
  }
  auto* word = reinterpret_cast<std::uint32_t*>(verdicts_.data()) + (free_word - verdict_used_.begin());
  *word = 0;
  if (st)
    st = gpu::verify_payload_async(staged, h.payload_checksum, scratch, word, g.stream, crc,
                                   landings);
  if (!st) {
    g.dma.synchronize().ignore();  // copies already enqueued read the pieces
    g.stream.synchronize().ignore();
    return st;
  }
  *free_word = true;
  t.verdict = static_cast<int>(free_word - verdict_used_.begin());
  t.ring_lo = lo;
  t.ring_hi = lo + need;
  g.ring_head = lo + need;
  return true;
}

Result<gpu::Event> PinnedTransfer::take_event(Gpu& g) noexcept {
  if (g.spare.empty()) return gpu::Event::create(g.stream.device());
  gpu::Event e = std::move(g.spare.back());
  g.spare.pop_back();
  return e;
}

void PinnedTransfer::release(Ticket& t) noexcept {
  if (t.verdict >= 0) verdict_used_[static_cast<std::size_t>(t.verdict)] = false;
  t.verdict = -1;
}

// A scattered get, checked one of two ways before any byte reaches `payload`:
// - on the device (version 2 payloads that fit the ring): header, key, layout and length on the
//   host, and the codec's check_head() (an AOS1 frame's fields: everything but its CRC), then the
//   payload's DMA into the GPU's staging ring (the `dma` stream) and, on `stream` after it, the
//   chunk checksums, their list, the codec's CRC claim and the verdict (verify_payload_async),
//   and a copy kernel gated by the verdict: it writes the regions only if the bytes that landed
//   are the bytes that were stored and the codec's frame is whole. scatter_done() reads the
//   verdict. No host thread reads the payload, so the DMAs of a batch run back to back. (A codec
//   without check_head() is checked whole on the host while the DMA runs.)
// - on the host otherwise (check_scattered: the chunk checksums on the verification threads), then
//   one copy-kernel launch per piece, reading the page-locked bytes.
Result<std::uint64_t> PinnedTransfer::scatter_to_device(std::span<const Piece> pieces,
                                                        std::span<std::byte> header,
                                                        RegionList payload,
                                                        const ObjectKey& key, std::size_t skip,
                                                        const PayloadCheck* check) noexcept {
  try {
    // The GPU of the payload's regions (one, Backend::submit checked; empty ones name none).
    auto first = std::find_if(payload.begin(), payload.end(), [](const Region& x) { return x.size > 0; });
    TIER_ASSIGN_OR_RETURN(Gpu * g, gpu_for(first == payload.end() ? -1 : first->device));
    Ticket t;
    const int dev = g->stream.device();
    TIER_ASSIGN_OR_RETURN(ObjectHeader h, check_scattered_header(pieces, header,
                                                                 skip + total_bytes(payload), key));
    TIER_ASSIGN_OR_RETURN(t.done, take_event(*g));
    // The codec's check: its fields now, when it leaves the CRC to the GPU.
    std::optional<CrcClaim> claim;
    if (h.version >= 2 && check != nullptr) {
      TIER_ASSIGN_OR_RETURN(claim, check_stored_payload(pieces, check, true));
    }
    TIER_ASSIGN_OR_RETURN(bool on_device,
                          enqueue_device_check(*g, pieces, h, claim ? &*claim : nullptr, t));
    std::vector<CopySpan> spans;
    if (on_device) {
      Status st = claim ? Status::ok() : check_stored_payload(pieces, check).status();
      if (st) {
        std::uint64_t at = skip;
        for (const Region& r : payload) {
          if (r.size > 0) spans.push_back(CopySpan{r.data, at, r.size});
          at += r.size;
        }
        const Region staged{g->ring.data() + t.ring_lo, h.payload_bytes, MemoryKind::kDevice, dev};
        CopyPlan plan{spans, MemoryKind::kDevice, dev, h.payload_bytes};
        st = g->executor->scatter_async(
            plan, staged, g->stream,
            reinterpret_cast<const std::uint32_t*>(g->ring.data() + t.ring_lo +
                                                   round_up(h.payload_bytes, kRingAlign)));
      }
      if (!st) {
        g->stream.synchronize().ignore();  // the ring range is in use until its kernels ran
        release(t);
        return st;
      }
    } else {
      TIER_RETURN_IF_ERROR(check_scattered(pieces, header, skip + total_bytes(payload), key,
                                           t.stored, check));
      // One copy plan per piece: the parts of the payload regions that the piece's bytes fill,
      // with image offsets relative to the piece (the image starts with the object header and
      // `skip` payload bytes that go nowhere).
      std::size_t r = 0, at = 0;      // the payload region and the offset in it
      std::uint64_t image_off = 0;    // image offset of the current piece's first byte
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
          Status st = g->executor->scatter_async(plan, pinned_region(p.data(), p.size()), g->stream);
          if (!st) {
            g->stream.synchronize().ignore();  // copies already enqueued read the pieces
            return st;
          }
        }
        image_off = hi;
      }
    }
    copy_head(pieces, t.stored);
    Status st = t.done.record(g->stream);
    if (!st) {
      g->stream.synchronize().ignore();
      release(t);
      return st;
    }
    t.id = next_ticket_++;
    t.header = header;
    tickets_.push_back(std::move(t));
    return tickets_.back().id;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "pinned transfer: out of memory");
  }
}

Result<bool> PinnedTransfer::scatter_done(std::uint64_t ticket, bool wait) noexcept {
  auto it = std::find_if(tickets_.begin(), tickets_.end(),
                         [&](const Ticket& t) { return t.id == ticket; });
  if (it == tickets_.end()) return Status::invalid("pinned transfer: unknown scatter ticket");
  Status st;
  if (wait) {
    st = it->done.synchronize();
  } else {
    auto done = it->done.done();
    if (done && !*done) return false;
    st = done.status();
  }
  if (!st) {
    st = Status(Code::kDeviceError,
                fmt::format("pinned tier: the copy into device memory failed: {}", st.message()));
  } else if (it->verdict >= 0) {
    const std::uint32_t v =
        *reinterpret_cast<volatile const std::uint32_t*>(verdicts_.data() + 4 * it->verdict);
    if (v == gpu::kVerdictMismatch)
      st = Status(Code::kChecksumMismatch,
                  "object payload checksum mismatch (verified on the GPU; nothing written)");
    else if (v != gpu::kVerdictMatch)
      st = Status(Code::kDeviceError, "pinned tier: the GPU verification left no verdict");
  }
  if (st) std::copy(it->stored.begin(), it->stored.end(), it->header.begin());
  release(*it);
  if (st || st.code() == Code::kChecksumMismatch) {
    // Completed events go back to their GPU's spares (after a device error they are dropped).
    Gpu& g = *gpus_[static_cast<std::size_t>(it->done.device())];
    try {
      g.spare.push_back(std::move(it->done));
      for (gpu::Event& e : it->landed) g.spare.push_back(std::move(e));
    } catch (const std::bad_alloc&) {
    }
  }
  tickets_.erase(it);
  if (!st) return st;
  return true;
}

void PinnedTransfer::quiesce() noexcept {
  if (tickets_.empty()) return;
  for (auto& g : gpus_)
    if (g) {
      g->dma.synchronize().ignore();
      g->stream.synchronize().ignore();
    }
}

}  // namespace tier::cpu
