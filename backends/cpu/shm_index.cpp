#include "shm_index.hpp"

#include <algorithm>
#include <functional>

namespace tier::cpu::shm {

std::uint64_t Index::bucket_of(const ObjectKey& k) const noexcept {
  std::uint64_t x = std::hash<ObjectKey>{}(k);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 29;
  return x & t_.bucket_mask;
}

std::uint32_t Index::find(const ObjectKey& k) const noexcept {
  for (std::uint32_t i = t_.buckets[bucket_of(k)]; i != kNone; i = t_.entries[i].hash_next)
    if (t_.entries[i].key == k) return i;
  return kNone;
}

void Index::hash_insert(std::uint32_t i) noexcept {
  std::uint32_t& head = t_.buckets[bucket_of(t_.entries[i].key)];
  t_.entries[i].hash_next = head;
  head = i;
}

void Index::hash_unlink(std::uint32_t i) noexcept {
  std::uint32_t* p = &t_.buckets[bucket_of(t_.entries[i].key)];
  while (*p != kNone && *p != i) p = &t_.entries[*p].hash_next;
  if (*p == i) *p = t_.entries[i].hash_next;
}

void Index::lru_push_front(std::uint32_t i) noexcept {
  Entry& e = t_.entries[i];
  e.lru_prev = kNone;
  e.lru_next = t_.h->lru_head;
  if (t_.h->lru_head != kNone) t_.entries[t_.h->lru_head].lru_prev = i;
  t_.h->lru_head = i;
  if (t_.h->lru_tail == kNone) t_.h->lru_tail = i;
}

void Index::lru_unlink(std::uint32_t i) noexcept {
  Entry& e = t_.entries[i];
  if (e.lru_prev != kNone)
    t_.entries[e.lru_prev].lru_next = e.lru_next;
  else
    t_.h->lru_head = e.lru_next;
  if (e.lru_next != kNone)
    t_.entries[e.lru_next].lru_prev = e.lru_prev;
  else
    t_.h->lru_tail = e.lru_prev;
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
  while (v != kNone) {
    const Entry& e = t_.entries[v];
    const bool leased = e.lease_deadline_ns > now_ns && e.lease_deadline_ns - now_ns <= kMaxLeaseNs;
    if (e.readers == 0 && !leased) break;
    if (leased && e.lease_client < kMaxClients) *skipped_lease = true;
    v = e.lru_prev;
  }
  return v;
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
  if (i >= t_.h->max_entries) return;
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
  r.first_block = blocks_.take(nblocks);
  crash_point(ShmCrashPoint::kPutHoldingLock);
  r.entry = t_.h->free_entry_head;
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
  t_.h->used_bytes.fetch_add(std::uint64_t{nblocks} * t_.h->block_bytes, std::memory_order_relaxed);
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
  t_.h->used_bytes.fetch_sub(std::uint64_t{e.nblocks} * t_.h->block_bytes,
                             std::memory_order_relaxed);
  blocks_.give(e.first_block, e.nblocks);
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
  if (i == kNone) return;
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
  for (std::uint64_t n = 0; n < t_.h->max_entries; ++n) {
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
