// The CPU tier's pinned modes: device-memory puts and gets (pinned_transfer.hpp).
#include "pinned_transfer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <vector>

#include "tier/object.hpp"

namespace tier::cpu {

namespace {

Region pinned_region(std::byte* p, std::size_t n) {
  return Region{p, n, MemoryKind::kPinnedHost, -1};
}

// Enqueues the copy of image bytes [begin, end) between `pieces` and the same offsets of `dev`:
// device to pieces when `to_host`, pieces to device otherwise.
Status enqueue_range(std::span<const Piece> pieces, Region dev, std::size_t begin, std::size_t end,
                     bool to_host, const gpu::Stream& s) noexcept {
  std::size_t off = 0;
  for (const Piece& p : pieces) {
    const std::size_t lo = std::max(begin, off), hi = std::min(end, off + p.size());
    if (lo < hi) {
      Region host = pinned_region(p.data() + (lo - off), hi - lo);
      Region device = dev.slice(lo, hi - lo);
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
  gpu::ExecutorOptions opts;
  opts.device = device;
  TIER_ASSIGN_OR_RETURN(auto executor, gpu::DeviceCopyExecutor::create(opts));
  try {
    if (gpus_.size() <= d) gpus_.resize(d + 1);
    gpus_[d] = std::make_unique<Gpu>(Gpu{std::move(s), std::move(executor)});
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
    TIER_RETURN_IF_ERROR(
        check_scattered(pieces, header, skip + total_bytes(payload), key, t.stored, check));
    TIER_ASSIGN_OR_RETURN(t.done, gpu::Event::create(g->stream.device()));
    // One copy plan per piece: the parts of the payload regions that the piece's bytes fill, with
    // image offsets relative to the piece (the image starts with the object header and `skip`
    // payload bytes that go nowhere).
    std::vector<CopySpan> spans;
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
        CopyPlan plan{spans, MemoryKind::kDevice, g->stream.device(), p.size()};
        Status st = g->executor->scatter_async(plan, pinned_region(p.data(), p.size()), g->stream);
        if (!st) {
          g->stream.synchronize().ignore();  // copies already enqueued read the pieces
          return st;
        }
      }
      image_off = hi;
    }
    TIER_RETURN_IF_ERROR(t.done.record(g->stream));
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
  if (st)
    std::copy(it->stored.begin(), it->stored.end(), it->header.begin());
  else
    st = Status(Code::kDeviceError,
                fmt::format("pinned tier: the copy into device memory failed: {}", st.message()));
  tickets_.erase(it);
  if (!st) return st;
  return true;
}

void PinnedTransfer::quiesce() noexcept {
  for (auto& g : gpus_)
    if (g && !tickets_.empty()) g->stream.synchronize().ignore();
}

}  // namespace tier::cpu
