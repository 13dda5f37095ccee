#include "shm/index.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

namespace tier::cpu::shm {

namespace {
const char* const kStateNames[] = {"free", "writing", "ready", "doomed"};
}  // namespace

std::uint64_t Index::bucket_of(const ObjectKey& k) const noexcept {
  std::uint64_t x = std::hash<ObjectKey>{}(k);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 29;
  return x & t_.bucket_mask;
}

bool Index::link_ok(std::uint32_t i, const char* where, std::uint64_t slot,
                    const char* field) const {
  if (i == kNone || t_.entry_ok(i)) return true;
  t_.fault(
      fmt::format("{} {} {} = {}, expected < {} or none", where, slot, field, i, t_.max_entries));
  return false;
}

bool Index::sane(std::uint32_t i) const {
  const Entry& e = t_.entries[i];
  const std::uint64_t bb = t_.block_bytes;
  if (e.nblocks == 0 || e.nblocks > t_.blocks) {
    t_.fault(fmt::format("entry {} nblocks = {}, expected [1, {}]", i, e.nblocks, t_.blocks));
    return false;
  }
  if (e.image_bytes <= (std::uint64_t{e.nblocks} - 1) * bb || e.image_bytes > e.nblocks * bb) {
    t_.fault(fmt::format("entry {} image_bytes = {}, expected ({}, {}] for {} blocks", i,
                         e.image_bytes, (std::uint64_t{e.nblocks} - 1) * bb, e.nblocks * bb,
                         e.nblocks));
    return false;
  }
  if (!t_.block_ok(e.first_block)) {
    t_.fault(fmt::format("entry {} first_block = {}, expected < {}", i, e.first_block, t_.blocks));
    return false;
  }
  return true;
}

std::uint32_t Index::find(const ObjectKey& k) const noexcept {
  const std::uint64_t b = bucket_of(k);
  std::uint64_t steps = 0;
  if (!link_ok(t_.buckets[b], "bucket", b, "head")) return kNone;
  for (std::uint32_t i = t_.buckets[b]; i != kNone; i = t_.entries[i].hash_next) {
    if (++steps > t_.max_entries) {
      t_.fault(fmt::format("bucket {}: hash chain longer than the {} entries (a cycle)", b,
                           t_.max_entries));
      return kNone;
    }
    if (t_.entries[i].key == k) {
      std::uint32_t st = state(i);
      if (st == kWriting || st == kReady) return i;
      t_.fault(
          fmt::format("entry {} state = {} ({}), expected writing or ready: it is in the hash "
                      "chain of bucket {}",
                      i, st, st < 4 ? kStateNames[st] : "invalid", b));
      return kNone;
    }
    if (!link_ok(t_.entries[i].hash_next, "entry", i, "hash_next")) return kNone;
  }
  return kNone;
}

void Index::hash_insert(std::uint32_t i) noexcept {
  std::uint32_t& head = t_.buckets[bucket_of(t_.entries[i].key)];
  t_.entries[i].hash_next = head;
  head = i;
}

void Index::hash_unlink(std::uint32_t i) noexcept {
  const std::uint64_t b = bucket_of(t_.entries[i].key);
  std::uint32_t* p = &t_.buckets[b];
  for (std::uint64_t steps = 0; *p != kNone && *p != i; p = &t_.entries[*p].hash_next) {
    if (!link_ok(*p, "hash chain of bucket", b, "link")) return;
    if (++steps > t_.max_entries) {
      t_.fault(fmt::format("bucket {}: hash chain longer than the {} entries (a cycle)", b,
                           t_.max_entries));
      return;
    }
  }
  if (*p == i) *p = t_.entries[i].hash_next;
}

void Index::lru_push_front(std::uint32_t i) noexcept {
  Entry& e = t_.entries[i];
  const std::uint32_t head = t_.h->lru_head;
  if (!link_ok(head, "header", 0, "lru_head")) return;
  e.lru_prev = kNone;
  e.lru_next = head;
  if (head != kNone) t_.entries[head].lru_prev = i;
  t_.h->lru_head = i;
  if (t_.h->lru_tail == kNone) t_.h->lru_tail = i;
}

void Index::lru_unlink(std::uint32_t i) noexcept {
  Entry& e = t_.entries[i];
  const std::uint32_t prev = e.lru_prev, next = e.lru_next;
  if (!link_ok(prev, "entry", i, "lru_prev") || !link_ok(next, "entry", i, "lru_next")) return;
  if (prev != kNone)
    t_.entries[prev].lru_next = next;
  else
    t_.h->lru_head = next;
  if (next != kNone)
    t_.entries[next].lru_prev = prev;
  else
    t_.h->lru_tail = prev;
}

void Index::touch(std::uint32_t i) noexcept {
  t_.entries[i].tick = ++t_.h->tick;
  if (t_.h->lru_head != i) {
    lru_unlink(i);
    lru_push_front(i);
  }
}

bool Index::has_room(std::uint32_t nblocks) const noexcept {
  return t_.h->free_blocks.load(std::memory_order_relaxed) >= nblocks &&
         t_.h->free_entry_head != kNone;
}

std::uint32_t Index::lru_victim(std::uint64_t now_ns, bool* skipped_lease) const noexcept {
  std::uint32_t v = t_.h->lru_tail;
  if (!link_ok(v, "header", 0, "lru_tail")) return kNone;
  for (std::uint64_t steps = 0; v != kNone; v = t_.entries[v].lru_prev) {
    if (++steps > t_.max_entries) {
      t_.fault(fmt::format("LRU list longer than the {} entries (a cycle)", t_.max_entries));
      return kNone;
    }
    if (state(v) != kReady) {
      t_.fault(fmt::format("entry {} state = {}, expected ready (2): it is in the LRU list", v,
                           state(v)));
      return kNone;
    }
    const Entry& e = t_.entries[v];
    const bool leased = e.lease_deadline_ns > now_ns && e.lease_deadline_ns - now_ns <= kMaxLeaseNs;
    if (e.readers == 0 && !leased) return sane(v) ? v : kNone;
    if (leased && e.lease_client < kMaxClients) *skipped_lease = true;
    if (!link_ok(e.lru_prev, "entry", v, "lru_prev")) return kNone;
  }
  return kNone;
}

void Index::lease(std::uint32_t c, std::uint32_t i, std::uint64_t now_ns,
                  std::uint64_t deadline_ns) noexcept {
  Entry& e = t_.entries[i];
  if (e.lease_deadline_ns <= now_ns || e.lease_client == kNone) {
    e.lease_client = c;
    e.lease_deadline_ns = deadline_ns;
    return;
  }
  if (e.lease_client != c) e.lease_client = kSharedLease;
  e.lease_deadline_ns = std::max(e.lease_deadline_ns, deadline_ns);
}

void Index::unlease(std::uint32_t c, std::uint32_t i, const ObjectKey& key) noexcept {
  if (i >= t_.max_entries) return;
  Entry& e = t_.entries[i];
  if (e.lease_client != c || !(e.key == key)) return;
  e.lease_client = kNone;
  e.lease_deadline_ns = 0;
}

void Index::evict(std::uint32_t i) noexcept {
  hash_unlink(i);
  crash_point(ShmCrashPoint::kEvictHoldingLock);
  lru_unlink(i);
  t_.h->objects.fetch_sub(1, std::memory_order_relaxed);
  t_.h->image_bytes.fetch_sub(t_.entries[i].image_bytes, std::memory_order_relaxed);
  release_entry(i);
}

Index::Reservation Index::reserve(const ObjectKey& key, std::uint64_t image_bytes,
                                  std::uint32_t nblocks, std::uint32_t owner) noexcept {
  Reservation r;
  const std::uint32_t entry = t_.h->free_entry_head;
  if (!link_ok(entry, "header", 0, "free_entry_head") || entry == kNone) return r;
  if (state(entry) != kFree) {
    t_.fault(fmt::format("entry {} state = {}, expected free (0): it is on the free entry list",
                         entry, state(entry)));
    return r;
  }
  if (!link_ok(t_.entries[entry].hash_next, "free entry", entry, "hash_next")) return r;
  r.first_block = blocks_.take(nblocks);
  if (r.first_block == kNone) return r;
  crash_point(ShmCrashPoint::kPutHoldingLock);
  r.entry = entry;
  Entry& e = t_.entries[r.entry];
  t_.h->free_entry_head = e.hash_next;
  r.generation = ++t_.h->generation;
  e.owner = owner;
  e.generation = r.generation;
  e.key = key;
  e.nblocks = nblocks;
  e.image_bytes = image_bytes;
  e.first_block = r.first_block;
  e.readers = 0;
  e.lease_deadline_ns = 0;
  e.lease_client = kNone;
  e.tick = ++t_.h->tick;
  e.state.store(kWriting, std::memory_order_release);
  hash_insert(r.entry);
  t_.h->writing.fetch_add(1, std::memory_order_relaxed);
  t_.h->used_bytes.fetch_add(std::uint64_t{nblocks} * t_.block_bytes, std::memory_order_relaxed);
  return r;
}

bool Index::holds(const Reservation& r, std::uint32_t owner) const noexcept {
  const Entry& e = t_.entries[r.entry];
  return e.state.load(std::memory_order_relaxed) == kWriting && e.owner == owner &&
         e.generation == r.generation;
}

void Index::publish(const Reservation& r) noexcept {
  Entry& e = t_.entries[r.entry];
  e.tick = ++t_.h->tick;
  e.state.store(kReady, std::memory_order_release);
  lru_push_front(r.entry);
  t_.h->writing.fetch_sub(1, std::memory_order_relaxed);
  t_.h->objects.fetch_add(1, std::memory_order_relaxed);
  t_.h->image_bytes.fetch_add(e.image_bytes, std::memory_order_relaxed);
}

void Index::abandon(const Reservation& r) noexcept {
  hash_unlink(r.entry);
  release_entry(r.entry);
}

void Index::release_entry(std::uint32_t i) noexcept {
  Entry& e = t_.entries[i];
  std::uint32_t st = e.state.load(std::memory_order_relaxed);
  e.state.store(kFree, std::memory_order_release);
  if (st == kWriting) t_.h->writing.fetch_sub(1, std::memory_order_relaxed);
  if (st == kDoomed) t_.h->doomed.fetch_sub(1, std::memory_order_relaxed);
  // A corrupt chain stays off the free list; the repair that follows finds its blocks unused.
  if (sane(i)) {
    t_.h->used_bytes.fetch_sub(std::uint64_t{e.nblocks} * t_.block_bytes,
                               std::memory_order_relaxed);
    blocks_.give(e.first_block, e.nblocks);
  }
  e.hash_next = t_.h->free_entry_head;
  t_.h->free_entry_head = i;
}

void Index::retire_ready(std::uint32_t i) noexcept {
  Entry& e = t_.entries[i];
  hash_unlink(i);
  lru_unlink(i);
  t_.h->objects.fetch_sub(1, std::memory_order_relaxed);
  t_.h->image_bytes.fetch_sub(e.image_bytes, std::memory_order_relaxed);
  if (e.readers > 0) {
    e.state.store(kDoomed, std::memory_order_release);
    t_.h->doomed.fetch_add(1, std::memory_order_relaxed);
  } else {
    release_entry(i);
  }
}

void Index::pin(std::uint32_t c, std::uint32_t i) noexcept {
  Client& cl = t_.clients[c];
  cl.pinned_generation = t_.entries[i].generation;
  cl.pinned = i;
  ++t_.entries[i].readers;
  touch(i);
}

void Index::unpin(std::uint32_t c) noexcept {
  Client& cl = t_.clients[c];
  std::uint32_t i = cl.pinned;
  cl.pinned = kNone;
  if (i == kNone || !link_ok(i, "client", c, "pinned")) return;
  Entry& e = t_.entries[i];
  if (e.generation != cl.pinned_generation || e.readers == 0) return;
  --e.readers;
  if (e.readers == 0 && e.state.load(std::memory_order_relaxed) == kDoomed) release_entry(i);
}

std::uint32_t Index::claim_client(std::int32_t pid, std::uint64_t start_time) noexcept {
  for (std::uint32_t c = 0; c < kMaxClients; ++c) {
    Client& cl = t_.clients[c];
    if (cl.in_use.load(std::memory_order_acquire) != 0) continue;
    cl.pid = pid;
    cl.start_time = start_time;
    cl.pinned = kNone;
    cl.pinned_generation = 0;
    cl.in_use.store(1, std::memory_order_release);
    t_.h->clients.fetch_add(1, std::memory_order_relaxed);
    return c;
  }
  return kNone;
}

void Index::release_client(std::uint32_t c) noexcept {
  unpin(c);
  for (std::uint64_t n = 0; n < t_.max_entries; ++n) {
    auto i = static_cast<std::uint32_t>(n);
    if (state(i) == kWriting && t_.entries[i].owner == c) {
      hash_unlink(i);
      release_entry(i);
    }
    if (t_.entries[i].lease_client == c) {  // the leases it held alone end with it
      t_.entries[i].lease_client = kNone;
      t_.entries[i].lease_deadline_ns = 0;
    }
  }
  t_.clients[c].in_use.store(0, std::memory_order_release);
  t_.h->clients.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace tier::cpu::shm
