#include "shm/store.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "shm/blocks.hpp"
#include "shm/check.hpp"
#include "shm/index.hpp"
#include "shm/recovery.hpp"
#include "shm/segment.hpp"
#include "tier/lease.hpp"
#include "tier/object.hpp"

namespace tier::cpu {

namespace {
void (*g_crash_hook)(ShmCrashPoint) = nullptr;
}  // namespace

namespace shm {
void crash_point(ShmCrashPoint p) {
  if (g_crash_hook != nullptr) g_crash_hook(p);
}
bool crash_hook_installed() noexcept { return g_crash_hook != nullptr; }
}  // namespace shm

using shm::kNone;

namespace {
// CLOCK_MONOTONIC in ns (steady_clock on Linux): one clock for every process of the host.
std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}
}  // namespace

// One open store: the mapped segment, views of its tables, and this process's client slot.
struct ShmStore::Impl {
  shm::Segment segment;
  shm::Blocks blocks;
  shm::Index index;
  shm::Recovery recovery;
  std::uint32_t me = kNone;  // my client slot
  LeaseTable leases;         // this store's leases; hold tags are entry indices

  explicit Impl(shm::Segment s)
      : segment(std::move(s)),
        blocks(segment.tables()),
        index(segment.tables()),
        recovery(segment.tables(), segment.name()) {}

  Status lock() noexcept {
    if (Status st = segment.intact(); !st.is_ok()) return st;
    return recovery.lock(me);
  }
  // Ends a locked section. When a check met a corrupt field in it, the index is rebuilt from the
  // entry table first (malformed entries dropped, as after a death) and the section's result is
  // ChecksumMismatch naming the field; otherwise Ok. IoError when the segment was truncated under
  // the section (shm/guard.hpp): nothing it did holds.
  Status unlock() {
    Status st;
    shm::FaultLog& faults = *segment.tables().faults;
    if (!faults.first.empty()) {
      st = Status(Code::kChecksumMismatch,
                  fmt::format("shm segment {} is corrupt: {}; index repaired", segment.name(),
                              faults.first));
      recovery.rebuild();
      segment.tables().h->corruptions.fetch_add(1, std::memory_order_relaxed);
      faults.first.clear();
    }
    recovery.unlock();
    if (Status lost = segment.intact(); !lost.is_ok()) return lost;
    return st;
  }

  // Takes a client slot, after reaping those of dead processes.
  Status claim_client() {
    TIER_RETURN_IF_ERROR(lock());
    recovery.reap_dead(me);
    const auto pid = static_cast<std::int32_t>(::getpid());
    me = index.claim_client(pid, shm::process_start_time(pid));
    TIER_RETURN_IF_ERROR(unlock());
    if (me != kNone) return Status::ok();
    return Status(Code::kNoSpace, fmt::format("shm segment {}: all {} client slots are taken",
                                              segment.name(), shm::kMaxClients));
  }

  // The ready entry holding `key`, or kNone. Lock held.
  std::uint32_t find_ready(const ObjectKey& key) const noexcept {
    std::uint32_t i = index.find(key);
    return i != kNone && index.state(i) == shm::kReady ? i : kNone;
  }

  // What reserve() did: the reservation, or why there is none (AlreadyExists, NoSpace,
  // BadState), and the objects it evicted either way (to report once the lock is released).
  struct Reserved {
    Status status;
    shm::Index::Reservation reservation;
    std::vector<std::pair<ObjectKey, std::uint64_t>> evicted;
  };
  // Under the lock: put-if-absent's check, eviction from the LRU tail until `nblocks` blocks and
  // an entry are free, and the reservation.
  Reserved reserve(const ObjectKey& key, std::uint64_t image_bytes, std::uint32_t nblocks);
  // Under the lock: publishes the reservation when `written` is Ok, abandons it otherwise.
  Status publish(const shm::Index::Reservation& r, Status written);

  // Reserves blocks for `image_bytes` (evicting least recently used objects as needed), calls
  // write(first_block) outside the lock, and publishes the object when it returned Ok; abandons
  // the reservation otherwise and returns its status.
  template <class Write>
  Status put(const ObjectKey& key, std::uint64_t image_bytes, const EvictFn& on_evict,
             Write&& write);
  // Pins the ready object, calls read(first_block, nblocks, image_bytes) outside the lock (it
  // copies and verifies), unpins it, and returns what read returned.
  template <class Read>
  GetResult get(const ObjectKey& key, std::uint64_t capacity, Read&& read);
};

ShmStore::Impl::Reserved ShmStore::Impl::reserve(const ObjectKey& key, std::uint64_t image_bytes,
                                                 std::uint32_t nblocks) {
  Reserved out;
  out.status = lock();
  if (!out.status) return out;
  const shm::Tables& t = segment.tables();
  std::uint32_t i = index.find(key);
  if (i != kNone && index.state(i) == shm::kWriting && index.entry(i).owner != me &&
      recovery.reap_dead(me) > 0)
    i = index.find(key);  // the writer had died; its reservation is gone
  if (i != kNone || t.faulted()) {
    if (i != kNone && index.state(i) == shm::kReady) index.touch(i);
    out.status = unlock();
    if (out.status) out.status = Status(Code::kAlreadyExists, "");
    return out;
  }
  bool reaped = false;
  const std::uint64_t now = now_ns();
  // Each round evicts one entry; more rounds than entries means the lists are corrupt.
  for (std::uint64_t round = 0; !index.has_room(nblocks) && !t.faulted(); ++round) {
    bool skipped_lease = false;
    std::uint32_t v = round <= t.max_entries ? index.lru_victim(now, &skipped_lease) : kNone;
    if (round > t.max_entries)
      t.fault(
          fmt::format("eviction freed {} entries without making room for {} blocks (header "
                      "free_blocks = {})",
                      round, nblocks, t.h->free_blocks.load(std::memory_order_relaxed)));
    if (t.faulted()) break;
    // Nothing to evict, or a lease in the way: the pins, reservations and leases of dead clients
    // end first (once per put).
    if ((v == kNone || skipped_lease) && !reaped) {
      reaped = true;
      if (recovery.reap_dead(me) > 0) continue;
    }
    if (v == kNone) {
      out.status = unlock();
      if (out.status)
        out.status =
            Status(Code::kNoSpace, "every stored object is being read or written, or is leased");
      return out;
    }
    out.evicted.emplace_back(index.entry(v).key, index.entry(v).image_bytes);
    index.evict(v);
  }
  if (!t.faulted()) out.reservation = index.reserve(key, image_bytes, nblocks, me);
  out.status = unlock();
  // reserve() records a fault whenever it makes no reservation; this keeps kNone from ever being
  // used as an entry index should that change.
  if (out.status && out.reservation.entry == kNone)
    out.status = Status(Code::kBadState, "shm put: no reservation");
  return out;
}

Status ShmStore::Impl::publish(const shm::Index::Reservation& r, Status written) {
  TIER_RETURN_IF_ERROR(lock());
  if (!index.holds(r, me)) {
    Status st = unlock();
    if (!written) return written;
    return st ? Status(Code::kBadState, "shm put: the reservation was released while writing") : st;
  }
  if (!written) {  // abandon the reservation: the object was never visible
    index.abandon(r);
    unlock().ignore();  // a fault of the chain is already in `written`
    return written;
  }
  index.publish(r);
  return unlock();
}

template <class Write>
Status ShmStore::Impl::put(const ObjectKey& key, std::uint64_t image_bytes, const EvictFn& on_evict,
                           Write&& write) {
  const std::uint64_t bb = segment.tables().block_bytes;
  if (image_bytes == 0 || (image_bytes + bb - 1) / bb > segment.tables().blocks)
    return Status(Code::kNoSpace,
                  fmt::format("object of {} bytes does not fit in the segment", image_bytes));
  const auto n = static_cast<std::uint32_t>((image_bytes + bb - 1) / bb);
  Reserved r = reserve(key, image_bytes, n);
  for (auto& [k, bytes] : r.evicted) on_evict(k, bytes);
  if (!r.status) return r.status;
  return publish(r.reservation, write(r.reservation.first_block));
}

template <class Read>
ShmStore::GetResult ShmStore::Impl::get(const ObjectKey& key, std::uint64_t capacity, Read&& read) {
  if (Status st = lock(); !st) return {st, 0};
  std::uint32_t i = find_ready(key);
  if (i == kNone || !index.sane(i)) {
    Status st = unlock();
    return {st ? Status::not_found() : st, 0};
  }
  const shm::Entry& e = index.entry(i);
  const std::uint64_t bytes = e.image_bytes;
  if (capacity < bytes) {
    if (Status st = unlock(); !st) return {st, 0};
    return {Status::invalid(fmt::format("buffer of {} bytes is too small for {}", capacity, bytes)),
            bytes};
  }
  index.pin(me, i);
  const std::uint32_t first = e.first_block, nblocks = e.nblocks;
  if (Status st = unlock(); !st) {  // the repair kept the pin only if the entry was sound
    if (lock()) {
      index.unpin(me);
      unlock().ignore();
    }
    return {st, 0};
  }

  // The segment's processes verify on the same cores: this get takes its share of them.
  const std::uint64_t clients = segment.tables().h->clients.load(std::memory_order_relaxed);
  VerifyCpuShare share(static_cast<unsigned>(std::min<std::uint64_t>(clients, shm::kMaxClients)));
  Status verified = read(first, nblocks, bytes);

  if (Status st = lock(); !st) return {st, 0};
  index.unpin(me);
  Status st = unlock();
  if (verified && !st) verified = std::move(st);
  return {std::move(verified), bytes};
}

// ---- ShmStore ----------------------------------------------------------------------------------

ShmStore::ShmStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ShmStore::~ShmStore() {
  Impl& s = *impl_;
  if (s.me == kNone) return;
  if (!s.lock()) return;
  s.index.release_client(s.me);
  s.unlock().ignore();
}

Result<std::unique_ptr<ShmStore>> ShmStore::open(const ShmConfig& cfg) {
  TIER_ASSIGN_OR_RETURN(shm::Segment segment, shm::Segment::open(cfg));
  auto impl = std::make_unique<Impl>(std::move(segment));
  TIER_RETURN_IF_ERROR(impl->claim_client());
  return std::unique_ptr<ShmStore>(new ShmStore(std::move(impl)));
}

Result<std::unique_ptr<ShmStore>> ShmStore::attach(const std::string& segment) {
  TIER_ASSIGN_OR_RETURN(shm::Segment mapped, shm::Segment::attach(segment));
  auto impl = std::make_unique<Impl>(std::move(mapped));
  TIER_RETURN_IF_ERROR(impl->claim_client());
  return std::unique_ptr<ShmStore>(new ShmStore(std::move(impl)));
}

Status ShmStore::remove_segment(const std::string& segment) {
  return shm::Segment::remove(segment);
}

Status ShmStore::put(const ObjectKey& key, std::span<const std::byte> image,
                     const EvictFn& on_evict, Stores stores) {
  return impl_->put(key, image.size(), on_evict, [&](std::uint32_t first) {
    return impl_->blocks.write_image(first, image, stores);
  });
}

Status ShmStore::put_with(const ObjectKey& key, std::uint64_t image_bytes, const PiecesFn& fill,
                          const EvictFn& on_evict) {
  return impl_->put(key, image_bytes, on_evict, [&](std::uint32_t first) {
    auto pieces = impl_->blocks.pieces(first, image_bytes);
    return pieces ? fill(*pieces) : pieces.status();
  });
}

ShmStore::GetResult ShmStore::get(const ObjectKey& key, std::span<std::byte> out, Stores stores) {
  return impl_->get(
      key, out.size(), [&](std::uint32_t first, std::uint32_t nblocks, std::uint64_t bytes) {
        return impl_->blocks.read_image(key, first, nblocks, out.first(bytes), stores);
      });
}

ShmStore::GetResult ShmStore::get_with(const ObjectKey& key, std::uint64_t capacity,
                                       const PiecesFn& drain) {
  return impl_->get(key, capacity, [&](std::uint32_t first, std::uint32_t, std::uint64_t bytes) {
    auto pieces = impl_->blocks.pieces(first, bytes);
    return pieces ? drain(*pieces) : pieces.status();
  });
}

std::span<std::byte> ShmStore::mapping() const noexcept { return impl_->segment.mapping(); }

Status ShmStore::intact() const { return impl_->segment.intact(); }

Result<std::uint64_t> ShmStore::contains(const ObjectKey& key) {
  Impl& s = *impl_;
  TIER_RETURN_IF_ERROR(s.lock());
  std::uint32_t i = s.find_ready(key);
  const std::uint64_t bytes = i != kNone ? s.index.entry(i).image_bytes : 0;
  TIER_RETURN_IF_ERROR(s.unlock());
  if (i == kNone) return Status::not_found();
  return bytes;
}

Status ShmStore::remove(const ObjectKey& key) {
  Impl& s = *impl_;
  TIER_RETURN_IF_ERROR(s.lock());
  std::uint32_t i = s.find_ready(key);
  if (i != kNone) s.index.retire_ready(i);
  TIER_RETURN_IF_ERROR(s.unlock());
  return i != kNone ? Status::ok() : Status::not_found();
}

ShmStats ShmStore::stats() const noexcept { return impl_->segment.stats(); }

namespace {
// The lease on entry `e` now (a deadline past, or further than any lease may be, is none): ms
// left and the holder's pid; counted into `sum`.
std::pair<std::uint64_t, std::int32_t> lease_of(const shm::Tables& t, const shm::Entry& e,
                                                std::uint64_t now, ShmLeases& sum) {
  if (e.lease_deadline_ns <= now || e.lease_deadline_ns - now > shm::kMaxLeaseNs) return {0, 0};
  const std::uint64_t ms = (e.lease_deadline_ns - now + 999'999) / 1'000'000;
  const std::int32_t pid = e.lease_client < shm::kMaxClients ? t.clients[e.lease_client].pid : 0;
  ++sum.objects;
  if (ms > sum.longest_ms) {
    sum.longest_ms = ms;
    sum.longest_pid = pid;
  }
  return {ms, pid};
}
}  // namespace

Result<ShmInspection> ShmStore::inspect() {
  Impl& s = *impl_;
  const shm::Tables& t = s.segment.tables();
  ShmInspection out;
  TIER_RETURN_IF_ERROR(s.lock());
  const std::uint64_t now = now_ns();
  out.stats = s.segment.stats();
  for (std::uint32_t c = 0; c < shm::kMaxClients; ++c) {
    const shm::Client& cl = t.clients[c];
    if (cl.in_use.load(std::memory_order_acquire) == 0) continue;
    out.clients.push_back(
        {cl.pid, c == s.me || shm::process_alive(cl.pid, cl.start_time), cl.pinned != kNone});
  }
  for (std::uint64_t i = 0; i < t.max_entries; ++i) {
    const shm::Entry& e = t.entries[i];
    std::uint32_t state = e.state.load(std::memory_order_acquire);
    if (state == shm::kFree) continue;
    const auto [lease_ms, lease_pid] = lease_of(t, e, now, out.leases);
    out.objects.push_back({e.key, e.image_bytes, e.nblocks,
                           state == shm::kReady     ? "ready"
                           : state == shm::kWriting ? "writing"
                           : state == shm::kDoomed  ? "doomed"
                                                    : "invalid",
                           lease_ms, lease_pid});
  }
  TIER_RETURN_IF_ERROR(s.unlock());
  return out;
}

Result<ShmVerifyReport> ShmStore::verify() {
  Impl& s = *impl_;
  const shm::Tables& t = s.segment.tables();
  ShmVerifyReport report;
  std::vector<ObjectKey> keys;
  TIER_RETURN_IF_ERROR(s.lock());
  // First the index as found (named, field by field), then the repair, then the reaping (on a
  // sound index).
  report.problems = shm::find_problems(t);
  if (!report.problems.empty()) {
    report.index_problems = report.problems.size();
    report.dropped_entries = s.recovery.rebuild();
  }
  report.reaped_clients = s.recovery.reap_dead(s.me);
  const std::uint64_t now = now_ns();
  for (std::uint64_t i = 0; i < t.max_entries; ++i)
    if (t.entries[i].state.load(std::memory_order_acquire) == shm::kReady) {
      keys.push_back(t.entries[i].key);
      lease_of(t, t.entries[i], now, report.leases);
    }
  if (Status st = s.unlock(); !st) report.problems.push_back(std::string(st.message()));
  std::vector<std::byte> buf;
  for (const ObjectKey& k : keys) {
    auto size = contains(k);
    if (!size) continue;  // evicted or removed meanwhile
    buf.resize(*size);
    GetResult g = get(k, buf);  // copies and verifies
    if (g.status.code() != Code::kChecksumMismatch) {
      report.checked += g.status.is_ok() ? 1 : 0;
      continue;
    }
    ++report.checked;
    ++report.corrupt;
    report.problems.push_back(fmt::format("{}: {}; removed", k.to_string(), g.status.message()));
    remove(k).ignore();
  }
  return report;
}

namespace testing {
void set_crash_hook(void (*hook)(ShmCrashPoint)) { g_crash_hook = hook; }
}  // namespace testing

}  // namespace tier::cpu

namespace tier::cpu {

Result<std::uint64_t> ShmStore::lease(std::span<const ObjectKey> keys,
                                      std::chrono::milliseconds ttl, std::span<std::uint8_t> held,
                                      std::uint64_t& expiries) {
  Impl& s = *impl_;
  const auto now = LeaseTable::Clock::now();
  expiries += s.leases.expire(now);
  const std::uint64_t t = now_ns();
  const auto ttl_ns =
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(ttl).count());
  const std::uint64_t deadline = t + std::min(shm::kMaxLeaseNs, ttl_ns);
  std::vector<LeaseTable::Hold> holds;
  TIER_RETURN_IF_ERROR(s.lock());
  for (std::size_t k = 0; k < keys.size(); ++k) {
    const std::uint32_t i = s.find_ready(keys[k]);
    if (i == kNone) continue;
    s.index.lease(s.me, i, t, deadline);
    held[k] = 1;
    holds.push_back({keys[k], i});
  }
  TIER_RETURN_IF_ERROR(s.unlock());
  return s.leases.add(now + ttl, std::move(holds));
}

LeaseEnd ShmStore::release(std::uint64_t id) {
  Impl& s = *impl_;
  std::vector<LeaseTable::Hold> ended;  // entries no other lease of this store holds
  const LeaseEnd end = s.leases.end(id, LeaseTable::Clock::now(), [&](const LeaseTable::Hold& h) {
    if (!s.leases.held(h.key)) ended.push_back(h);
  });
  if (!ended.empty() && s.lock().is_ok()) {
    for (const LeaseTable::Hold& h : ended) s.index.unlease(s.me, h.tag, h.key);
    s.unlock().ignore();  // a lock that cannot be released is the next caller's TimedOut
  }
  return end;
}

}  // namespace tier::cpu
