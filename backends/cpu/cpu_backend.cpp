#include "cpu_backend.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <new>
#include <optional>

#include "device_transfer.hpp"
#include "tier/object.hpp"

namespace tier::cpu {

namespace {

// The bytes a put or get moves (a get's: its destination's capacity).
std::uint64_t moved_bytes(const IoRequest& r) { return r.buf.size + total_bytes(r.tail); }

Completion completion(const IoRequest& r, CpuMode::Outcome o) {
  return {r.user_data, std::move(o.status), static_cast<std::size_t>(o.bytes)};
}

}  // namespace

Result<std::unique_ptr<CpuBackend>> CpuBackend::create(const BackendContext& ctx) {
  if (ctx.capacity_bytes == 0)
    return Status::invalid("the cpu tier needs a capacity greater than 0");
  TIER_ASSIGN_OR_RETURN(auto mode, make_cpu_mode(ctx));
  return std::make_unique<CpuBackend>(ctx.tier_name, std::move(mode));
}

CpuBackend::CpuBackend(std::string tier_name, std::unique_ptr<CpuMode> mode)
    : Backend(std::move(tier_name)),
      mode_(std::move(mode)),
      device_(mode_->device()),
      capacity_(mode_->usage().capacity_bytes),
      concurrent_(device_ == nullptr && mode_->concurrent()),
      evicted_([this](const ObjectKey& k, std::span<const std::byte> image, std::uint64_t n) {
        notify_evicted(k, image, n);
      }) {}

CpuBackend::~CpuBackend() {
  if (device_ != nullptr) device_->quiesce();  // no copy may read the storage once it is freed
}

Capabilities CpuBackend::capabilities() const noexcept {
  Capabilities c;
  c.memory_kinds = device_ != nullptr ? kHostKinds | kind_bit(MemoryKind::kDevice) : kHostKinds;
  c.max_object_bytes = capacity_;
  c.persistent = c.shared = mode_->shared();
  c.verifies_reads = true;  // every mode copies host images with copy_verified
  c.gather_puts = true;     // every put is copied inside submit
  c.seals_puts = true;      // and a gathered one sealed as it is copied (seal_into)
  c.scatter_gets = true;    // scatter_verified over the stored pieces
  c.concurrent = concurrent_;
  return c;
}

Usage CpuBackend::usage() const noexcept { return mode_->usage(); }

std::string CpuBackend::describe() const { return mode_->describe(tier_name()); }

void CpuBackend::settle() noexcept {
  if (copying_.empty()) return;
  device_->quiesce();
  finish_copies(copying_.size(), true);
}

void CpuBackend::finish_copies(std::size_t min, bool wait) noexcept {
  while (!copying_.empty()) {
    const Copying& c = copying_.front();
    auto done = device_->scatter_done(c.ticket, wait && min > 0);
    if (done && !*done) return;
    Completion out{c.user_data, done.status(), done ? static_cast<std::size_t>(c.bytes) : 0};
    push_ready(std::span(&out, 1));
    copying_.pop_front();
    if (min > 0) --min;
  }
}

CpuMode::Outcome CpuBackend::put(const IoRequest& r, const CpuMode::EvictFn& on_evict) {
  settle();               // a put may evict or move stored objects that a copy still reads
  if (!r.tail.empty()) {  // host memory only (Backend::submit checked)
    return mode_->put_with(
        r.key, r.buf.size + total_bytes(r.tail),
        [&](std::span<const Piece> pieces) {
          return seal_into(pieces, r.buf.bytes(), r.tail, stores_for_batch(r.batch_bytes));
        },
        on_evict);
  }
  if (r.buf.kind == MemoryKind::kDevice) {
    // Device buffers are accepted (capabilities()) only when the mode has a device path.
    return mode_->put_with(
        r.key, r.buf.size,
        [&](std::span<const Piece> pieces) {
          return device_->put_from_device(pieces, r.buf, r.key);
        },
        on_evict);
  }
  return mode_->put(r.key, {r.buf.data, r.buf.size}, stores_for_batch(r.batch_bytes), on_evict);
}

namespace {

// The payload bytes a get moves into device memory (0 for any other request).
std::uint64_t device_payload(const IoRequest& r) {
  const bool device_tail = std::any_of(r.tail.begin(), r.tail.end(), [](const Region& t) {
    return t.size > 0 && !t.host_accessible();
  });
  return r.op == Op::kGet && device_tail ? total_bytes(r.tail) : 0;
}

}  // namespace

std::optional<Completion> CpuBackend::get(const IoRequest& r) {
  CpuMode::Outcome o;
  if (device_payload(r) > 0) {
    // Device memory of one GPU (Backend::submit checked; only a pinned mode accepts it). The
    // copy kernel reads the stored pieces after they verified; a heap mode's pieces stay put
    // until this backend's next put or remove (which settle() first), so the copy completes in
    // poll(). A shared segment may change once the hold ends: wait for the copy inside it.
    std::uint64_t ticket = 0;
    o = mode_->get_with(r.key, r.buf.size + r.skip + total_bytes(r.tail),
                        [&](std::span<const Piece> pieces) -> Status {
                          auto t = device_->scatter_to_device(pieces, r.buf.bytes(), r.tail,
                                                              r.key, r.skip, r.check);
                          if (!t) return t.status();
                          ticket = *t;
                          if (!mode_->shared()) return Status::ok();
                          ticket = 0;
                          return device_->scatter_done(*t, true).status();
                        });
    if (o.status.is_ok() && ticket != 0) {
      copying_.push_back(Copying{r.user_data, ticket, o.bytes});
      return std::nullopt;
    }
  } else if (!r.tail.empty()) {  // host memory
    o = mode_->get_with(r.key, r.buf.size + r.skip + total_bytes(r.tail),
                        [&](std::span<const Piece> pieces) {
                          return scatter_verified(pieces, r.buf.bytes(), r.tail, r.key, r.skip,
                                                  r.check, stores_for_batch(r.batch_bytes));
                        });
  } else if (r.buf.kind == MemoryKind::kDevice) {
    o = mode_->get_with(r.key, r.buf.size, [&](std::span<const Piece> pieces) {
      return device_->get_to_device(r.buf, pieces, r.key);
    });
  } else {
    o = mode_->get(r.key, r.buf.bytes(), stores_for_batch(r.batch_bytes));
  }
  if (o.status.code() == Code::kChecksumMismatch) metrics().checksum_failures.add();
  return completion(r, std::move(o));
}

Completion CpuBackend::contains(const IoRequest& r) {
  auto c = mode_->contains(r.key);
  if (!c) return {r.user_data, c.status(), 0};
  return {r.user_data, Status::ok(), static_cast<std::size_t>(*c)};
}

bool CpuBackend::reserve_ready(std::size_t n) noexcept {
  std::lock_guard lock(ready_mu_);
  const std::size_t need = ready_.size() + promised_ + n;
  if (ready_.capacity() < need) {
    try {
      ready_.reserve(std::max(need, 2 * ready_.capacity()));
    } catch (const std::bad_alloc&) {
      return false;
    }
  }
  promised_ += n;
  return true;
}

void CpuBackend::push_ready(std::span<Completion> done) noexcept {
  std::lock_guard lock(ready_mu_);
  promised_ -= done.size();
  for (Completion& c : done) ready_.push_back(std::move(c));  // within reserve_ready()'s capacity
}

bool CpuBackend::parallel(std::span<const IoRequest> reqs) noexcept {
  if (reqs.size() < 2) return false;
  const Op op = reqs.front().op;
  if (op != Op::kPut && op != Op::kGet) return false;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const IoRequest& r = reqs[i];
    const std::uint64_t bytes = moved_bytes(r);
    if (r.op != op || bytes >= kPooledPayloadBytes) return false;
    // Two puts of one key stay in order: the first stores it, the second finds it.
    if (op == Op::kPut)
      for (std::size_t j = 0; j < i; ++j)
        if (reqs[j].key == r.key) return false;
    total += bytes;
  }
  return total >= kSpreadCopyBytes;
}

void CpuBackend::submit_in_parallel(std::span<const IoRequest> reqs) noexcept {
  constexpr std::size_t kGroup = kSubmitWindow;  // this function's arrays
  for (std::size_t first = 0; first < reqs.size(); first += kGroup) {
    const auto group = reqs.subspan(first, std::min(kGroup, reqs.size() - first));
    const std::size_t n = group.size();
    const bool puts = group.front().op == Op::kPut;
    std::array<ObjectKey, kGroup> keys;
    for (std::size_t i = 0; i < n; ++i) keys[i] = group[i].key;
    if (puts) {  // room for the puts, evicted here (the reports stay on this thread)
      std::array<std::uint64_t, kGroup> bytes;
      for (std::size_t i = 0; i < n; ++i) bytes[i] = moved_bytes(group[i]);
      mode_->make_room_for({keys.data(), n}, {bytes.data(), n}, evicted_);
    }
    struct Job {
      CpuBackend* self;
      std::span<const IoRequest> group;
      std::array<Completion, kGroup> done;
      std::array<bool, kGroup> deferred{};
    } job{this, group, {}, {}};
    for_each_on_verify_threads(
        n,
        [](void* ctx, std::size_t i) noexcept {
          auto& j = *static_cast<Job*>(ctx);
          const IoRequest& r = j.group[i];
          if (r.op == Op::kGet) {
            j.done[i] = *j.self->get(r);  // a host get: complete here
            return;
          }
          CpuMode::Outcome o = j.self->put(r, {});  // no EvictFn: a put on a worker never evicts
          j.deferred[i] = o.deferred;
          j.done[i] = completion(r, std::move(o));
        },
        &job);
    for (std::size_t i = 0; i < n; ++i)
      if (job.deferred[i])  // other threads' puts took the room: evicting here
        job.done[i] = completion(group[i], put(group[i], evicted_));
    mode_->refresh({keys.data(), n});  // the recency of the requests made in order
    push_ready({job.done.data(), n});
  }
}

Result<std::size_t> CpuBackend::do_submit(std::span<const IoRequest> reqs) noexcept {
  // Room for every completion first: a request that ran must be able to complete.
  if (!reserve_ready(reqs.size())) return std::size_t{0};
  if (concurrent_ && parallel(reqs)) {
    submit_in_parallel(reqs);
    return reqs.size();
  }
  // Gets into device memory of one submit may go to the GPU together (DeviceTransfer::plug),
  // across the windows Backend::submit hands on (its open batch stays open from one to the next):
  // `later` is the payload of those after this one, counted up to kAheadHorizon.
  std::uint64_t later = 0;
  if (device_ != nullptr)
    for (const IoRequest& r : submit_rest()) {
      if (later >= kAheadHorizon) break;
      later += device_payload(r);
    }
  struct Plug {
    DeviceTransfer* d;
    bool more;
    ~Plug() {
      if (d != nullptr) d->unplug(more);
    }
  } plug{device_ != nullptr && (reqs.size() > 1 || later > 0) ? device_ : nullptr, later > 0};
  // The payload bytes of the submit's gets into device memory not yet taken
  // (DeviceTransfer::ahead).
  std::uint64_t ahead = later;
  if (plug.d != nullptr) {
    plug.d->plug();
    for (const IoRequest& r : reqs) ahead += device_payload(r);
  }
  for (const IoRequest& r : reqs) {
    std::optional<Completion> c;  // the request's work, without ready_mu_
    switch (r.op) {
      case Op::kPut:
        c = completion(r, put(r, evicted_));
        break;
      case Op::kGet:
        if (plug.d != nullptr) {
          ahead -= device_payload(r);
          plug.d->ahead(ahead);
        }
        c = get(r);  // nullopt: its promised room waits for finish_copies()
        break;
      case Op::kContains:
        c = contains(r);
        break;
      case Op::kRemove:
        settle();
        c = Completion{r.user_data, mode_->remove(r.key), 0};
        break;
    }
    if (c) push_ready(std::span(&*c, 1));
  }
  return reqs.size();
}

Result<std::size_t> CpuBackend::do_poll(std::span<Completion> out, std::size_t min,
                                        std::chrono::microseconds wait) noexcept {
  // Copies into device memory finish in order; wait for one only when the caller waits for
  // completions that are not ready yet (a copy takes milliseconds at most).
  if (!copying_.empty())
    finish_copies(ready_.size() < min ? min - ready_.size() : 0, wait.count() > 0);
  std::lock_guard lock(ready_mu_);
  std::size_t n = std::min(out.size(), ready_.size());
  for (std::size_t i = 0; i < n; ++i) out[i] = std::move(ready_[i]);
  ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(n));
  return n;
}

Result<LeaseId> CpuBackend::do_lease(std::span<const ObjectKey> keys, std::chrono::milliseconds ttl,
                                     std::span<std::uint8_t> held) noexcept {
  try {
    return mode_->lease(keys, ttl, held, metrics().lease_expiries);
  } catch (const std::bad_alloc&) {
    return Status(Code::kBadState, "lease: out of memory");
  }
}

LeaseEnd CpuBackend::do_release(LeaseId id) noexcept {
  return mode_->release_lease(id, metrics().lease_expiries);
}

Result<std::vector<ObjectKey>> CpuBackend::do_list_keys(const Key128& ns) {
  return mode_->list_keys(ns);
}

}  // namespace tier::cpu
