#include "tier/backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "tier/checked.hpp"
#include "tier/object.hpp"

namespace tier {

Backend::~Backend() = default;

namespace {

Status check_buffer(const IoRequest& r, const Region& b, const Capabilities& caps) {
  if (b.data == nullptr || b.size == 0)
    return Status::invalid(fmt::format("{}: empty buffer", op_name(r.op)));
  TIER_RETURN_IF_ERROR(check_region(b));
  if ((caps.memory_kinds & kind_bit(b.kind)) == 0)
    return Status(Code::kNotSupported,
                  fmt::format("{}: this tier does not accept {} memory", op_name(r.op),
                              memory_kind_name(b.kind)));
  if (caps.io_alignment > 1 &&
      (reinterpret_cast<std::uintptr_t>(b.data) % caps.io_alignment != 0 ||
       b.size % caps.io_alignment != 0))
    return Status::invalid(fmt::format("{}: buffer {} (+{} bytes) is not aligned to {} bytes",
                                       op_name(r.op), static_cast<const void*>(b.data), b.size,
                                       caps.io_alignment));
  return Status::ok();
}

Status check_request(const IoRequest& r, const Capabilities& caps) {
  if (static_cast<std::size_t>(r.op) >= kOpCount) return Status::invalid("unknown op");
  if (!r.tail.empty() && !(r.op == Op::kPut && caps.gather_puts) &&
      !(r.op == Op::kGet && caps.scatter_gets))
    return Status::invalid(fmt::format("{}: this tier takes no tail regions", op_name(r.op)));
  if ((r.skip != 0 || r.check != nullptr) && (r.op != Op::kGet || r.tail.empty()))
    return Status::invalid(fmt::format("{}: skip and check belong to scattered gets", op_name(r.op)));
  if (r.op != Op::kPut && r.op != Op::kGet) return Status::ok();
  const Region& b = r.buf;
  TIER_RETURN_IF_ERROR(check_buffer(r, b, caps));
  if (r.op == Op::kPut && !r.tail.empty() && caps.seals_puts &&
      (!b.host_accessible() || b.size != kObjectHeaderBytes))
    return Status::invalid(
        "put: a sealed gather put's header buffer must be 96 bytes of host memory");
  if (r.op == Op::kGet && !r.tail.empty()) {
    if (!b.host_accessible() || b.size != kObjectHeaderBytes)
      return Status::invalid("get: a scattered get's header buffer must be 96 bytes of host memory");
    if (!tail_on_one_side(r.tail))
      return Status::invalid(
          "get: tail regions must be all host memory or all device memory of one GPU");
    TIER_ASSIGN_OR_RETURN(std::size_t tail_bytes, checked_total(r.tail));
    std::size_t payload = 0;
    if (add_overflows(r.skip, tail_bytes, &payload) ||
        add_overflows(payload, kObjectHeaderBytes, &payload))
      return Status::invalid("get: skip and tail regions of more than 2^64 bytes");
    for (const Region& t : r.tail) {
      if (t.size == 0) continue;
      TIER_RETURN_IF_ERROR(check_buffer(r, t, caps));
    }
  }
  if (r.op == Op::kPut) {
    std::size_t bytes = b.size;
    for (const Region& t : r.tail) {
      if (t.size == 0) continue;
      if (!t.host_accessible() || !b.host_accessible())
        return Status::invalid("put: tail regions and their head must be host memory");
      TIER_RETURN_IF_ERROR(check_buffer(r, t, caps));
      if (add_overflows(bytes, t.size, &bytes))
        return Status::invalid("put: an image of more than 2^64 bytes");
    }
    if (bytes > caps.max_object_bytes)  // no room can ever be made: NoSpace, as documented
      return Status(Code::kNoSpace,
                    fmt::format("put: an image of {} bytes is larger than the tier takes ({} bytes)",
                                bytes, caps.max_object_bytes));
    if (b.host_accessible()) {
      auto h = parse_object_header(b.bytes());
      if (!h) return Status::invalid("put: image has no valid object header: " + h.status().to_string());
      if (!(h->key == r.key))
        return Status::invalid("put: image header names another key than the request");
      std::uint64_t declared = 0;
      if (add_overflows<std::uint64_t>(h->payload_bytes, kObjectHeaderBytes, &declared) ||
          declared > bytes)
        return Status::invalid("put: image is shorter than its header declares");
    }
  }
  return Status::ok();
}

// Header, key and length only (the payload was verified by the backend during its copy).
Status verify_header(std::span<const std::byte> image, const ObjectKey& expected) {
  auto h = parse_object_header(image);
  if (!h) return h.status();
  if (!(h->key == expected) || h->payload_bytes != image.size() - kObjectHeaderBytes)
    return Status(Code::kChecksumMismatch, "object header does not match the request");
  return Status::ok();
}

}  // namespace

bool tail_on_one_side(RegionList tail) noexcept {
  bool host = false, device = false;
  std::int32_t gpu = -1;
  for (const Region& t : tail) {
    if (t.size == 0) continue;
    if (t.host_accessible()) {
      host = true;
    } else {
      if (device && t.device != gpu) return false;
      device = true;
      gpu = t.device;
    }
  }
  return !(host && device);
}

std::uint32_t Backend::take_id(const IoRequest& r, bool verified) {
  std::uint32_t id;
  if (!free_pending_.empty()) {
    id = free_pending_.back();
    free_pending_.pop_back();
  } else {
    id = static_cast<std::uint32_t>(pending_.size());
    pending_.emplace_back();
    free_pending_.reserve(pending_.size());  // poll() gives ids back without allocating
  }
  pending_[id] = Pending{r.user_data,
                         r.key,
                         r.buf,
                         r.op == Op::kGet && !r.tail.empty() ? r.skip + total_bytes(r.tail) : 0,
                         r.op,
                         verified,
                         true};
  pending_in_use_.fetch_add(1, std::memory_order_relaxed);
  return id;
}

void Backend::give_back(std::span<const IoRequest> unaccepted) noexcept {
  for (const IoRequest& r : unaccepted) {
    pending_[r.user_data].used = false;
    free_pending_.push_back(static_cast<std::uint32_t>(r.user_data));
    pending_in_use_.fetch_sub(1, std::memory_order_relaxed);
  }
}

// Requests go to do_submit, and completions have their pending entries taken out, in windows of
// Backend::kSubmitWindow.
constexpr std::size_t kWindow = Backend::kSubmitWindow;

// submit_rest() of the do_submit() this thread is in (empty outside one).
thread_local std::span<const IoRequest> t_submit_rest;

// A window's array of T, left unconstructed until add() fills an element: a call with one
// request pays for one element, not for kWindow of them. T is trivially destructible.
template <class T>
class Window {
  static_assert(std::is_trivially_destructible_v<T>);

 public:
  T& add(std::size_t i, const T& v) noexcept { return *std::construct_at(data() + i, v); }
  T* data() noexcept { return reinterpret_cast<T*>(bytes_); }
  T& operator[](std::size_t i) noexcept { return data()[i]; }

 private:
  alignas(T) std::byte bytes_[kWindow * sizeof(T)];
};

std::span<const IoRequest> Backend::submit_rest() const noexcept { return t_submit_rest; }

Result<std::size_t> Backend::submit(std::span<const IoRequest> reqs) noexcept {
  const Capabilities caps = capabilities();
  // A window the backend does not take whole ends the call. Raw storage: a request is
  // constructed when it joins (most calls carry one request, not kWindow).
  Window<IoRequest> window;
  std::array<std::size_t, kWindow> origin;  // window index -> index in reqs
  std::size_t consumed = 0;
  while (consumed < reqs.size()) {
    std::size_t n = 0, i = consumed;
    // Checked out: (index in reqs, completion); allocated only when a request fails its checks.
    std::vector<std::pair<std::size_t, Completion>> early;
    try {
      std::lock_guard lock(mu_);
      for (; i < reqs.size() && n < kWindow && early.size() < kWindow; ++i) {
        Status s = check_request(reqs[i], caps);
        if (!s) {
          early.emplace_back(i, Completion{reqs[i].user_data, std::move(s), 0});
          continue;
        }
        IoRequest& w = window.add(n, reqs[i]);
        w.user_data = take_id(reqs[i], caps.verifies_reads);
        origin[n++] = i;
      }
    } catch (const std::bad_alloc&) {  // a table could not grow: nothing more taken
      if (n == 0 && early.empty()) {
        if (consumed > 0) return consumed;
        return Status(Code::kNoSpace, "submit: out of memory");
      }
      i = n > 0 ? origin[n - 1] + 1 : early.back().first + 1;
    }
    std::size_t accepted = 0;
    Status failed;
    if (n > 0) {
      const auto outer = std::exchange(t_submit_rest, reqs.subspan(i));  // a nested submit's too
      auto r = do_submit(std::span(window.data(), n));
      t_submit_rest = outer;
      if (r) accepted = std::min(*r, n);
      else failed = r.status();
      if (accepted < n) {
        std::lock_guard lock(mu_);
        give_back(std::span(window.data() + accepted, n - accepted));
      }
    }
    // Requests consumed: up to the first one not accepted; rejected ones before it fail early.
    const std::size_t end = accepted < n ? origin[accepted] : i;
    if (!early.empty()) {
      std::lock_guard lock(mu_);
      for (auto& [at, c] : early)
        if (at < end) early_.push_back(std::move(c));
    }
    if (!failed.is_ok() && end == consumed) {
      if (consumed > 0) return consumed;
      return failed;
    }
    consumed = end;
    if (accepted < n) break;
  }
  return consumed;
}

void Backend::finish(const Pending& p, Completion& c) noexcept {
  c.user_data = p.user_data;
  if (p.op == Op::kGet && c.status.is_ok() && p.tail_bytes > 0) {
    // A scattered get: the backend verified the payload and the stored header (key, layout,
    // length) before writing it, and wrote that header into buf. A backend that verifies its
    // reads (scatter_verified) parsed it already; only the length is checked again here.
    Status bad;
    if (c.bytes != kObjectHeaderBytes + p.tail_bytes) {
      bad = Status(Code::kChecksumMismatch,
                   fmt::format("tier {}: scattered object of {} bytes, {} expected", tier_name_,
                               c.bytes, kObjectHeaderBytes + p.tail_bytes));
    } else if (!p.verified) {
      auto h = parse_object_header(p.buf.bytes());
      if (!h || !(h->key == p.key) || h->payload_bytes != p.tail_bytes)
        bad = Status(Code::kChecksumMismatch,
                     fmt::format("tier {}: scattered object header does not match", tier_name_));
    }
    if (!bad.is_ok()) {
      scrub_object(p.buf.bytes());
      metrics_.checksum_failures.add();
      c.status = std::move(bad);
    }
  } else if (p.op == Op::kGet && c.status.is_ok() && p.buf.host_accessible()) {
    if (c.bytes > p.buf.size) {
      c.status = Status(Code::kBadState, "backend reported more bytes than the buffer holds");
    } else {
      auto image = p.buf.bytes().first(c.bytes);
      Status v = p.verified ? verify_header(image, p.key) : verify_object(image, p.key);
      if (!v) {
        scrub_object(image);
        metrics_.checksum_failures.add();
        c.status = Status(Code::kChecksumMismatch,
                          fmt::format("tier {}: {}", tier_name_, v.message()));
      }
    }
  }
  OpCounters& oc = metrics_.of(p.op);
  oc.requests.add();
  switch (c.status.code()) {
    case Code::kOk:
      oc.ok.add();
      oc.bytes.add(c.bytes);
      break;
    case Code::kNotFound:
    case Code::kAlreadyExists:
      oc.misses.add();
      break;
    default:
      oc.errors.add();
  }
}

Result<std::size_t> Backend::poll(std::span<Completion> out, std::size_t min,
                                  std::chrono::microseconds wait) noexcept {
  std::size_t n = 0;
  {
    std::lock_guard lock(mu_);
    while (n < out.size() && !early_.empty()) {  // early failures keep submission order
      out[n++] = std::move(early_.front());
      early_.pop_front();
    }
  }
  const std::size_t in_flight = pending_in_use_.load(std::memory_order_relaxed);
  if (n == out.size() || in_flight == 0) return n;
  std::size_t want = min > n ? std::min(min - n, in_flight) : 0;
  auto r = do_poll(out.subspan(n), want, n > 0 ? std::chrono::microseconds(0) : wait);
  if (!r) return n > 0 ? Result<std::size_t>(n) : r;
  // The completions' pending entries, taken out under one lock per window, then finished outside
  // it: several pollers verify in parallel.
  Window<Pending> taken;
  for (std::size_t first = n; first < n + *r; first += kWindow) {
    const std::size_t count = std::min(kWindow, n + *r - first);
    {
      std::lock_guard lock(mu_);
      for (std::size_t k = 0; k < count; ++k) {
        auto idx = static_cast<std::size_t>(out[first + k].user_data);
        if (idx >= pending_.size() || !pending_[idx].used) {
          taken.add(k, Pending{});  // unknown: `used` stays false
        } else {
          taken.add(k, pending_[idx]);
          pending_[idx].used = false;
          free_pending_.push_back(static_cast<std::uint32_t>(idx));  // reserved: never throws
          pending_in_use_.fetch_sub(1, std::memory_order_relaxed);
        }
      }
    }
    for (std::size_t k = 0; k < count; ++k) {
      Completion& c = out[first + k];
      if (taken[k].used)
        finish(taken[k], c);
      else
        c.status = Status(Code::kBadState, "backend returned an unknown completion");
    }
  }
  return n + *r;
}

Result<LeaseId> Backend::lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                               std::span<std::uint8_t> held) noexcept {
  if (held.size() != keys.size()) return Status::invalid("lease: held.size() != keys.size()");
  std::fill(held.begin(), held.end(), std::uint8_t{0});
  if (keys.empty() || ttl.count() <= 0) return LeaseId{0};
  auto r = do_lease(keys, std::min(ttl, kMaxLeaseTtl), held);
  if (!r) {
    if (r.status() == Code::kNotSupported) metrics_.leases_unsupported.add();
    std::fill(held.begin(), held.end(), std::uint8_t{0});
    return r;
  }
  if (*r != 0) {
    metrics_.leases.add();
    metrics_.leased_keys.add(static_cast<std::uint64_t>(std::count(held.begin(), held.end(), 1)));
  }
  return r;
}

void Backend::release(LeaseId id) noexcept {
  if (id == 0) return;
  switch (do_release(id)) {
    case LeaseEnd::kReleased:
      metrics_.lease_releases.add();
      break;
    case LeaseEnd::kExpired:
      metrics_.lease_expiries.add();
      break;
    case LeaseEnd::kUnknown:
      break;
  }
}

Result<LeaseId> Backend::do_lease(std::span<const ObjectKey>, std::chrono::milliseconds,
                                  std::span<std::uint8_t>) noexcept {
  return Status(Code::kNotSupported, fmt::format("tier {} cannot lease objects", tier_name_));
}

LeaseEnd Backend::do_release(LeaseId) noexcept { return LeaseEnd::kUnknown; }

Result<std::vector<ObjectKey>> Backend::list_keys(const Key128& ns) noexcept {
  try {
    return do_list_keys(ns);
  } catch (const std::exception& e) {  // a std::bad_alloc of the list
    return Status(Code::kIoError, fmt::format("tier {}: listing keys failed: {}", tier_name_,
                                              e.what()));
  }
}

Result<std::vector<ObjectKey>> Backend::do_list_keys(const Key128&) {
  return Status(Code::kNotSupported, fmt::format("tier {} cannot list its keys", tier_name_));
}

void Backend::notify_evicted(const ObjectKey& key, std::span<const std::byte> image,
                             std::uint64_t image_bytes) noexcept {
  metrics_.evictions.add();
  metrics_.evicted_bytes.add(image_bytes);
  if (eviction_handler_ != nullptr) eviction_handler_->on_evict(key, image);
}

}  // namespace tier
