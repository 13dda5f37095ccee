#include "shm_store.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <boost/interprocess/managed_shared_memory.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <optional>
#include <random>

#include "tier/object.hpp"

namespace tier::cpu {

namespace bip = boost::interprocess;

namespace {

constexpr std::uint64_t kMagic = 0x314D48535245544Cull;  // "LTERSHM1"
constexpr std::uint32_t kVersion = 1;
constexpr const char* kAnchorName = "libtier.cpu.shm.v1";
constexpr std::uint32_t kNone = 0xFFFFFFFFu;
constexpr std::uint32_t kMaxClients = 256;
constexpr std::uint64_t kArenaAlign = 4096;

enum State : std::uint32_t { kFree = 0, kWriting = 1, kReady = 2, kDoomed = 3 };

void (*g_crash_hook)(ShmCrashPoint) = nullptr;

void crash_point(ShmCrashPoint p) {
  if (g_crash_hook != nullptr) g_crash_hook(p);
}

// The only named Boost object: where the raw allocation holding everything else starts.
struct Anchor {
  std::uint64_t magic = 0;
  std::uint32_t version = 0;
  bip::managed_shared_memory::handle_t raw = 0;
  std::uint64_t raw_bytes = 0;
};

struct Header {
  // Geometry, written once before the segment is published.
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t pad0;
  std::uint64_t block_bytes, blocks, max_entries, buckets;
  std::uint64_t clients_off, buckets_off, entries_off, next_off, arena_off, raw_bytes;
  pthread_mutex_t mutex;  // robust, process-shared; guards everything below and the tables
  // Sources of truth that are not per entry.
  std::uint64_t tick;        // LRU clock; entries record the tick of their last use
  std::uint64_t generation;  // stamped on each entry reservation
  // Derived (rebuilt by Impl::rebuild after a lock-holder died).
  std::uint32_t free_block_head, free_entry_head, lru_head, lru_tail;
  std::atomic<std::uint64_t> free_blocks, used_bytes, image_bytes, objects, writing, doomed;
  // Statistics.
  std::atomic<std::uint64_t> clients, recoveries, reaped_clients;
};

struct Entry {
  std::atomic<std::uint32_t> state;  // written last when reserving, first when freeing
  std::uint32_t owner;               // client slot of the writer (kWriting)
  std::uint64_t generation;
  ObjectKey key;
  std::uint32_t nblocks;
  std::uint64_t image_bytes;
  std::uint32_t first_block;
  std::uint32_t readers;  // derived: client slots pinning this entry
  std::uint64_t tick;
  std::uint32_t hash_next, lru_prev, lru_next;  // derived
};

struct Client {
  std::atomic<std::uint32_t> in_use;
  std::int32_t pid;
  std::uint64_t start_time;
  std::uint32_t pinned;  // entry being copied out by a get, or kNone
  std::uint64_t pinned_generation;
};

std::uint64_t align_up(std::uint64_t n, std::uint64_t a) { return (n + a - 1) / a * a; }

struct ProcStat {
  char state = '?';              // field 3: R, S, D, Z (zombie), X (dead), ...
  std::uint64_t start_time = 0;  // field 22: clock ticks since boot; 0 when unreadable
};

ProcStat read_proc_stat(std::int32_t pid) {
  ProcStat ps;
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(f, line)) return ps;
  auto close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= line.size()) return ps;
  ps.state = line[close + 2];
  std::size_t pos = close + 1;
  for (int field = 3; field < 22; ++field) {  // skip fields 3..21
    pos = line.find(' ', pos + 1);
    if (pos == std::string::npos) return ps;
  }
  ps.start_time = std::strtoull(line.c_str() + pos + 1, nullptr, 10);
  return ps;
}

// Whether the process that took a client slot still runs. A zombie counts as dead; a pid reused
// by another process is told apart by its start time.
bool process_alive(std::int32_t pid, std::uint64_t start_time) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  ProcStat now = read_proc_stat(pid);
  if (now.state == 'Z' || now.state == 'X') return false;
  return now.start_time == 0 || start_time == 0 || now.start_time == start_time;
}

std::string shm_path(const std::string& name) { return "/dev/shm/" + name; }

bool valid_segment_name(const std::string& name) {
  if (name.empty() || name.size() > 200 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

// Removes "<name>.init.<pid>.*" leftovers of creators that died (all of them when `all`).
void remove_init_leftovers(const std::string& name, bool all) {
  DIR* d = ::opendir("/dev/shm");
  if (d == nullptr) return;
  const std::string prefix = name + ".init.";
  while (dirent* e = ::readdir(d)) {
    std::string f = e->d_name;
    if (f.compare(0, prefix.size(), prefix) != 0) continue;
    auto pid = static_cast<std::int32_t>(std::strtol(f.c_str() + prefix.size(), nullptr, 10));
    if (all || pid == 0 || (::kill(pid, 0) != 0 && errno == ESRCH))
      bip::shared_memory_object::remove(f.c_str());
  }
  ::closedir(d);
}

}  // namespace

struct ShmStore::Impl {
  std::string name;
  std::unique_ptr<bip::managed_shared_memory> seg;
  Header* h = nullptr;
  Client* clients = nullptr;
  std::uint32_t* buckets = nullptr;
  Entry* entries = nullptr;
  std::uint32_t* next = nullptr;
  std::byte* arena = nullptr;
  std::uint32_t me = kNone;  // my client slot
  std::uint64_t bucket_mask = 0;

  // ---- mapping -------------------------------------------------------------------------------

  void bind(std::byte* raw) {
    h = reinterpret_cast<Header*>(raw);
    clients = reinterpret_cast<Client*>(raw + h->clients_off);
    buckets = reinterpret_cast<std::uint32_t*>(raw + h->buckets_off);
    entries = reinterpret_cast<Entry*>(raw + h->entries_off);
    next = reinterpret_cast<std::uint32_t*>(raw + h->next_off);
    arena = raw + h->arena_off;
    bucket_mask = h->buckets - 1;
  }

  // ---- lock ----------------------------------------------------------------------------------

  // Takes the segment lock; repairs the index when its previous holder died.
  Status lock() noexcept {
    int rc = pthread_mutex_lock(&h->mutex);
    if (rc == EOWNERDEAD) {
      rebuild();
      reap_dead();
      h->recoveries.fetch_add(1, std::memory_order_relaxed);
      pthread_mutex_consistent(&h->mutex);
      return Status::ok();
    }
    if (rc == 0) return Status::ok();
    return Status(Code::kBadState,
                  fmt::format("shm segment {}: lock failed: {}", name, std::strerror(rc)));
  }
  void unlock() noexcept { pthread_mutex_unlock(&h->mutex); }

  // ---- index primitives (lock held) ----------------------------------------------------------

  std::uint64_t bucket_of(const ObjectKey& k) const noexcept {
    std::uint64_t x = std::hash<ObjectKey>{}(k);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 29;
    return x & bucket_mask;
  }

  // A kWriting or kReady entry holding `k`, or kNone.
  std::uint32_t find(const ObjectKey& k) const noexcept {
    for (std::uint32_t i = buckets[bucket_of(k)]; i != kNone; i = entries[i].hash_next)
      if (entries[i].key == k) return i;
    return kNone;
  }
  void hash_insert(std::uint32_t i) noexcept {
    std::uint32_t& head = buckets[bucket_of(entries[i].key)];
    entries[i].hash_next = head;
    head = i;
  }
  void hash_unlink(std::uint32_t i) noexcept {
    std::uint32_t* p = &buckets[bucket_of(entries[i].key)];
    while (*p != kNone && *p != i) p = &entries[*p].hash_next;
    if (*p == i) *p = entries[i].hash_next;
  }
  void lru_push_front(std::uint32_t i) noexcept {
    Entry& e = entries[i];
    e.lru_prev = kNone;
    e.lru_next = h->lru_head;
    if (h->lru_head != kNone) entries[h->lru_head].lru_prev = i;
    h->lru_head = i;
    if (h->lru_tail == kNone) h->lru_tail = i;
  }
  void lru_unlink(std::uint32_t i) noexcept {
    Entry& e = entries[i];
    if (e.lru_prev != kNone)
      entries[e.lru_prev].lru_next = e.lru_next;
    else
      h->lru_head = e.lru_next;
    if (e.lru_next != kNone)
      entries[e.lru_next].lru_prev = e.lru_prev;
    else
      h->lru_tail = e.lru_prev;
  }
  void touch(std::uint32_t i) noexcept {
    entries[i].tick = ++h->tick;
    if (h->lru_head != i) {
      lru_unlink(i);
      lru_push_front(i);
    }
  }

  // Takes `n` blocks off the free list as one chain. Requires free_blocks >= n >= 1.
  std::uint32_t take_blocks(std::uint32_t n) noexcept {
    std::uint32_t first = h->free_block_head, last = first;
    for (std::uint32_t k = 1; k < n; ++k) last = next[last];
    h->free_block_head = next[last];
    next[last] = kNone;
    h->free_blocks.fetch_sub(n, std::memory_order_relaxed);
    return first;
  }
  void give_blocks(std::uint32_t first, std::uint32_t n) noexcept {
    std::uint32_t last = first;
    for (std::uint32_t k = 1; k < n; ++k) last = next[last];
    next[last] = h->free_block_head;
    h->free_block_head = first;
    h->free_blocks.fetch_add(n, std::memory_order_relaxed);
  }

  // Frees an entry that is no longer in the hash nor the LRU list.
  void release_entry(std::uint32_t i) noexcept {
    Entry& e = entries[i];
    std::uint32_t st = e.state.load(std::memory_order_relaxed);
    e.state.store(kFree, std::memory_order_release);
    if (st == kWriting) h->writing.fetch_sub(1, std::memory_order_relaxed);
    if (st == kDoomed) h->doomed.fetch_sub(1, std::memory_order_relaxed);
    h->used_bytes.fetch_sub(std::uint64_t{e.nblocks} * h->block_bytes, std::memory_order_relaxed);
    give_blocks(e.first_block, e.nblocks);
    e.hash_next = h->free_entry_head;
    h->free_entry_head = i;
  }

  // Takes a ready entry out of the index; frees it now, or when its last reader unpins.
  void retire_ready(std::uint32_t i) noexcept {
    Entry& e = entries[i];
    hash_unlink(i);
    lru_unlink(i);
    h->objects.fetch_sub(1, std::memory_order_relaxed);
    h->image_bytes.fetch_sub(e.image_bytes, std::memory_order_relaxed);
    if (e.readers > 0) {
      e.state.store(kDoomed, std::memory_order_release);
      h->doomed.fetch_add(1, std::memory_order_relaxed);
    } else {
      release_entry(i);
    }
  }

  void unpin(std::uint32_t c) noexcept {
    Client& cl = clients[c];
    std::uint32_t i = cl.pinned;
    cl.pinned = kNone;
    if (i == kNone) return;
    Entry& e = entries[i];
    if (e.generation != cl.pinned_generation || e.readers == 0) return;
    --e.readers;
    if (e.readers == 0 && e.state.load(std::memory_order_relaxed) == kDoomed) release_entry(i);
  }

  // Frees a client slot with the reservations (kWriting entries) and the pin it holds.
  void release_client(std::uint32_t c) noexcept {
    unpin(c);
    for (std::uint64_t n = 0; n < h->max_entries; ++n) {
      auto i = static_cast<std::uint32_t>(n);
      if (entries[i].state.load(std::memory_order_relaxed) == kWriting && entries[i].owner == c) {
        hash_unlink(i);
        release_entry(i);
      }
    }
    clients[c].in_use.store(0, std::memory_order_release);
    h->clients.fetch_sub(1, std::memory_order_relaxed);
  }

  // Releases the reservations and pins of client slots whose process is gone.
  std::uint64_t reap_dead() noexcept {
    std::uint64_t reaped = 0;
    for (std::uint32_t c = 0; c < kMaxClients; ++c) {
      Client& cl = clients[c];
      if (cl.in_use.load(std::memory_order_acquire) == 0 || c == me) continue;
      if (process_alive(cl.pid, cl.start_time)) continue;
      release_client(c);
      ++reaped;
    }
    h->reaped_clients.fetch_add(reaped, std::memory_order_relaxed);
    return reaped;
  }

  // Rebuilds every derived structure from the entry table and the client slots. Entries that do
  // not describe a well-formed, exclusively owned block chain are dropped. Returns how many.
  std::uint64_t rebuild() noexcept {
    const std::uint64_t nb = h->blocks, ne = h->max_entries, bb = h->block_bytes;
    std::uint64_t dropped = 0;
    auto drop = [&](Entry& e) {
      e.state.store(kFree, std::memory_order_release);
      ++dropped;
    };
    // Entries: shape, owner, exclusive chains.
    std::vector<bool> used(nb, false);
    for (std::uint64_t i = 0; i < ne; ++i) {
      Entry& e = entries[i];
      std::uint32_t st = e.state.load(std::memory_order_acquire);
      if (st == kFree) continue;
      bool ok = (st == kWriting || st == kReady || st == kDoomed) && e.nblocks >= 1 &&
                e.image_bytes > (std::uint64_t{e.nblocks} - 1) * bb &&
                e.image_bytes <= std::uint64_t{e.nblocks} * bb &&
                (st != kWriting || (e.owner < kMaxClients &&
                                    clients[e.owner].in_use.load(std::memory_order_acquire)));
      std::uint32_t b = e.first_block, walked = 0;
      while (ok && walked < e.nblocks) {
        if (b >= nb || used[b])
          ok = false;
        else {
          used[b] = true;
          ++walked;
          b = next[b];
        }
      }
      if (ok && b != kNone) ok = false;
      if (!ok) {
        for (std::uint32_t k = 0, c = e.first_block; k < walked; ++k, c = next[c]) used[c] = false;
        drop(e);
      }
    }
    // Pins: recount readers from the client slots.
    for (std::uint64_t i = 0; i < ne; ++i) entries[i].readers = 0;
    std::uint64_t live_clients = 0;
    for (std::uint32_t c = 0; c < kMaxClients; ++c) {
      Client& cl = clients[c];
      if (cl.in_use.load(std::memory_order_acquire) == 0) continue;
      ++live_clients;
      std::uint32_t i = cl.pinned;
      if (i == kNone) continue;
      std::uint32_t st = i < ne ? entries[i].state.load(std::memory_order_acquire) : kFree;
      if ((st == kReady || st == kDoomed) && entries[i].generation == cl.pinned_generation)
        ++entries[i].readers;
      else
        cl.pinned = kNone;
    }
    // Doomed entries nobody reads any more, then the free lists and the counters.
    h->free_entry_head = kNone;
    std::uint64_t used_bytes = 0, image_bytes = 0, objects = 0, writing = 0, doomed = 0;
    std::vector<std::pair<std::uint64_t, std::uint32_t>> ready;  // (tick, entry)
    for (std::uint64_t k = 0; k < h->buckets; ++k) buckets[k] = kNone;
    for (std::uint64_t n = ne; n-- > 0;) {
      auto i = static_cast<std::uint32_t>(n);
      Entry& e = entries[i];
      std::uint32_t st = e.state.load(std::memory_order_acquire);
      if (st == kDoomed && e.readers == 0) {
        for (std::uint32_t k = 0, c = e.first_block; k < e.nblocks; ++k, c = next[c])
          used[c] = false;
        e.state.store(kFree, std::memory_order_release);
        st = kFree;
      }
      if (st == kFree) {
        e.hash_next = h->free_entry_head;
        h->free_entry_head = i;
        continue;
      }
      used_bytes += std::uint64_t{e.nblocks} * bb;
      if (st == kDoomed) ++doomed;
      if (st == kWriting) ++writing;
      if (st == kReady) {
        ++objects;
        image_bytes += e.image_bytes;
        ready.emplace_back(e.tick, i);
      }
      if (st != kDoomed) hash_insert(i);
    }
    h->free_block_head = kNone;
    std::uint64_t free_blocks = 0;
    for (std::uint64_t n = nb; n-- > 0;) {
      if (used[n]) continue;
      next[n] = h->free_block_head;
      h->free_block_head = static_cast<std::uint32_t>(n);
      ++free_blocks;
    }
    std::sort(ready.begin(), ready.end());
    h->lru_head = h->lru_tail = kNone;
    for (auto& [tick, i] : ready) lru_push_front(i);
    if (!ready.empty()) h->tick = std::max(h->tick, ready.back().first);
    h->free_blocks.store(free_blocks, std::memory_order_relaxed);
    h->used_bytes.store(used_bytes, std::memory_order_relaxed);
    h->image_bytes.store(image_bytes, std::memory_order_relaxed);
    h->objects.store(objects, std::memory_order_relaxed);
    h->writing.store(writing, std::memory_order_relaxed);
    h->doomed.store(doomed, std::memory_order_relaxed);
    h->clients.store(live_clients, std::memory_order_relaxed);
    return dropped;
  }

  // ---- copies (lock free; the chain is reserved or pinned) -----------------------------------

  // Calls f(image_offset, arena_pointer, length) for the bytes [begin, end) of the image stored
  // in the chain starting at `first`, merging physically consecutive blocks into one call.
  template <class F>
  void for_each_run(std::uint32_t first, std::uint64_t begin, std::uint64_t end, F&& f) const {
    const std::uint64_t bb = h->block_bytes;
    std::uint32_t b = first;
    for (std::uint64_t skip = begin / bb; skip > 0; --skip) b = next[b];
    std::uint64_t off = begin;
    while (off < end) {
      std::uint64_t in_block = off % bb;
      std::uint32_t run_first = b;
      std::uint64_t run = bb - in_block;
      while (off + run < end && next[b] == b + 1) {
        b = next[b];
        run += bb;
      }
      std::uint64_t len = std::min(run, end - off);
      f(off, arena + std::uint64_t{run_first} * bb + in_block, len);
      off += len;
      b = next[b];
    }
  }
  void write_image(std::uint32_t first, std::span<const std::byte> image) const {
    auto copy = [&](std::uint64_t begin, std::uint64_t end) {
      for_each_run(first, begin, end, [&](std::uint64_t off, std::byte* p, std::uint64_t n) {
        std::memcpy(p, image.data() + off, n);
      });
    };
    if (g_crash_hook == nullptr) return copy(0, image.size());
    copy(0, image.size() / 2);
    crash_point(ShmCrashPoint::kPutCopying);
    copy(image.size() / 2, image.size());
  }
  // Copies the image into `out` and verifies it (header, key, length, payload checksum) on the
  // way; on failure `out` holds no valid header. A chain of consecutive blocks is copied by
  // copy_verified in one pass; a fragmented one is copied run by run, then verified.
  Status read_image(const ObjectKey& key, std::uint32_t first, std::uint32_t nblocks,
                    std::span<std::byte> out) const {
    std::uint32_t last = first;
    while (last + 1 - first < nblocks && next[last] == last + 1) ++last;
    if (g_crash_hook == nullptr && last + 1 - first == nblocks)
      return copy_verified(out, {arena + std::uint64_t{first} * h->block_bytes, out.size()}, key);
    auto copy = [&](std::uint64_t begin, std::uint64_t end) {
      for_each_run(first, begin, end, [&](std::uint64_t off, std::byte* p, std::uint64_t n) {
        std::memcpy(out.data() + off, p, n);
      });
    };
    copy(0, out.size() / 2);
    crash_point(ShmCrashPoint::kGetCopying);
    copy(out.size() / 2, out.size());
    Status v = verify_object(out, key);
    if (!v) scrub_object(out);
    return v;
  }

  // The bytes [0, bytes) of the image stored from `first`, as runs of consecutive blocks.
  std::vector<std::span<std::byte>> pieces(std::uint32_t first, std::uint64_t bytes) const {
    std::vector<std::span<std::byte>> out;
    for_each_run(first, 0, bytes,
                 [&](std::uint64_t, std::byte* p, std::uint64_t n) { out.emplace_back(p, n); });
    return out;
  }

  // ---- put and get (ShmStore's public calls run these) -----------------------------------------

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

  // ---- setup ---------------------------------------------------------------------------------

  struct Geometry {
    std::uint64_t block_bytes, blocks, max_entries, buckets;
    std::uint64_t clients_off, buckets_off, entries_off, next_off, arena_off, raw_bytes;
  };
  static Geometry layout(const ShmConfig& cfg) {
    Geometry g{};
    g.block_bytes = cfg.block_bytes;
    g.blocks = cfg.capacity / cfg.block_bytes;
    g.max_entries = cfg.max_objects != 0 ? cfg.max_objects : g.blocks;
    g.buckets = std::bit_ceil(std::max<std::uint64_t>(g.max_entries, 64));
    std::uint64_t off = align_up(sizeof(Header), 64);
    g.clients_off = off;
    off = align_up(off + kMaxClients * sizeof(Client), 64);
    g.buckets_off = off;
    off = align_up(off + g.buckets * sizeof(std::uint32_t), 64);
    g.entries_off = off;
    off = align_up(off + g.max_entries * sizeof(Entry), 64);
    g.next_off = off;
    off = align_up(off + g.blocks * sizeof(std::uint32_t), kArenaAlign);
    g.arena_off = off;
    g.raw_bytes = off + g.blocks * g.block_bytes;
    return g;
  }

  void initialize(std::byte* raw, const Geometry& g) {
    std::memset(raw, 0, g.arena_off);
    h = new (raw) Header{};
    h->magic = kMagic;
    h->version = kVersion;
    h->block_bytes = g.block_bytes;
    h->blocks = g.blocks;
    h->max_entries = g.max_entries;
    h->buckets = g.buckets;
    h->clients_off = g.clients_off;
    h->buckets_off = g.buckets_off;
    h->entries_off = g.entries_off;
    h->next_off = g.next_off;
    h->arena_off = g.arena_off;
    h->raw_bytes = g.raw_bytes;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    bind(raw);
    for (std::uint32_t c = 0; c < kMaxClients; ++c) {
      new (&clients[c]) Client{};
      clients[c].pinned = kNone;
    }
    for (std::uint64_t i = 0; i < g.max_entries; ++i) new (&entries[i]) Entry{};
    rebuild();  // an empty index: every list and counter derived from nothing
  }

  Status claim_client() {
    TIER_RETURN_IF_ERROR(lock());
    reap_dead();
    for (std::uint32_t c = 0; c < kMaxClients; ++c) {
      Client& cl = clients[c];
      if (cl.in_use.load(std::memory_order_acquire) != 0) continue;
      cl.pid = static_cast<std::int32_t>(::getpid());
      cl.start_time = read_proc_stat(cl.pid).start_time;
      cl.pinned = kNone;
      cl.pinned_generation = 0;
      cl.in_use.store(1, std::memory_order_release);
      h->clients.fetch_add(1, std::memory_order_relaxed);
      me = c;
      unlock();
      return Status::ok();
    }
    unlock();
    return Status(Code::kNoSpace,
                  fmt::format("shm segment {}: all {} client slots are taken", name, kMaxClients));
  }

  // Maps an existing segment and checks its anchor.
  Status map_existing() {
    seg = std::make_unique<bip::managed_shared_memory>(bip::open_only, name.c_str());
    auto [anchor, n] = seg->find_no_lock<Anchor>(kAnchorName);
    if (anchor == nullptr || n != 1 || anchor->magic != kMagic || anchor->version != kVersion)
      return Status::invalid(
          fmt::format("shm segment {} is not a libtier cpu segment of version {}; remove it with "
                      "`tierctl shm remove {}`",
                      name, kVersion, name));
    auto* raw = static_cast<std::byte*>(seg->get_address_from_handle(anchor->raw));
    bind(raw);
    if (h->magic != kMagic || h->raw_bytes != anchor->raw_bytes)
      return Status::invalid(fmt::format("shm segment {} has a damaged header", name));
    return Status::ok();
  }

  // Creates the segment under a private name, initializes it, and publishes it under `name` with
  // an atomic no-replace rename. Returns false (and cleans up) when another process won.
  Result<bool> create(const ShmConfig& cfg) {
    remove_init_leftovers(name, false);
    Geometry g = layout(cfg);
    std::random_device rd;
    std::string tmp = fmt::format("{}.init.{}.{:x}", name, ::getpid(), rd());
    auto fresh = std::make_unique<bip::managed_shared_memory>(
        bip::create_only, tmp.c_str(), g.raw_bytes + kArenaAlign + (1u << 20));
    void* raw = seg_allocate(*fresh, g.raw_bytes);
    if (raw == nullptr) {
      bip::shared_memory_object::remove(tmp.c_str());
      return Status(Code::kNoSpace,
                    fmt::format("shm segment {}: cannot lay out {} bytes", name, g.raw_bytes));
    }
    Anchor* anchor = fresh->construct<Anchor>(kAnchorName)();
    anchor->magic = kMagic;
    anchor->version = kVersion;
    anchor->raw = fresh->get_handle_from_address(raw);
    anchor->raw_bytes = g.raw_bytes;
    initialize(static_cast<std::byte*>(raw), g);
    if (cfg.prefault) prefault(true);
    if (::renameat2(AT_FDCWD, shm_path(tmp).c_str(), AT_FDCWD, shm_path(name).c_str(),
                    RENAME_NOREPLACE) != 0) {
      int err = errno;
      bip::shared_memory_object::remove(tmp.c_str());
      if (err == EEXIST) return false;
      return Status::io_error(
          fmt::format("shm segment {}: publishing failed: {}", name, std::strerror(err)));
    }
    seg = std::move(fresh);
    return true;
  }

  static void* seg_allocate(bip::managed_shared_memory& m, std::uint64_t bytes) {
    return m.allocate_aligned(bytes, kArenaAlign, std::nothrow);
  }

  // Allocates (when `fresh`) and maps every page of the arena in this process. Without
  // MADV_POPULATE_WRITE (Linux < 5.14) pages are touched one by one: written with zero in a fresh
  // segment, only read in one that may hold objects.
  void prefault(bool fresh) {
    std::uint64_t bytes = h->blocks * h->block_bytes;
    if (::madvise(arena, bytes, 23 /* MADV_POPULATE_WRITE */) == 0) return;
    const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    auto* p = reinterpret_cast<volatile std::byte*>(arena);
    for (std::uint64_t off = 0; off < bytes; off += page) {
      if (fresh)
        p[off] = std::byte{0};
      else
        (void)p[off];
    }
  }

  Status check_geometry(const ShmConfig& cfg) const {
    Geometry g = layout(cfg);
    if (g.block_bytes == h->block_bytes && g.blocks == h->blocks && g.max_entries == h->max_entries)
      return Status::ok();
    return Status::invalid(fmt::format(
        "shm segment {} exists with capacity {} in blocks of {} and {} entries, but this tier "
        "asks for capacity {} in blocks of {} and {} entries; use the same settings or remove "
        "the segment with `tierctl shm remove {}`",
        name, h->blocks * h->block_bytes, h->block_bytes, h->max_entries, g.blocks * g.block_bytes,
        g.block_bytes, g.max_entries, name));
  }

  ShmStats stats() const noexcept {
    ShmStats s;
    s.segment = name;
    s.capacity_bytes = h->blocks * h->block_bytes;
    s.block_bytes = h->block_bytes;
    s.max_objects = h->max_entries;
    s.used_bytes = h->used_bytes.load(std::memory_order_relaxed);
    s.image_bytes = h->image_bytes.load(std::memory_order_relaxed);
    s.objects = h->objects.load(std::memory_order_relaxed);
    s.writing = h->writing.load(std::memory_order_relaxed);
    s.doomed = h->doomed.load(std::memory_order_relaxed);
    s.clients = h->clients.load(std::memory_order_relaxed);
    s.recoveries = h->recoveries.load(std::memory_order_relaxed);
    s.reaped_clients = h->reaped_clients.load(std::memory_order_relaxed);
    s.segment_bytes = seg ? seg->get_size() : 0;
    return s;
  }
};

// ---- ShmStore ----------------------------------------------------------------------------------

namespace {
Status validate(const ShmConfig& cfg) {
  if (!valid_segment_name(cfg.segment))
    return Status::invalid(fmt::format(
        "segment: \"{}\" is not a valid name (1-200 of [A-Za-z0-9._-], not starting with '.')",
        cfg.segment));
  if (!std::has_single_bit(cfg.block_bytes) || cfg.block_bytes < 4096 ||
      cfg.block_bytes > (64u << 20))
    return Status::invalid(fmt::format(
        "block_size: expected a power of two in [4KiB, 64MiB], got {}", cfg.block_bytes));
  if (cfg.capacity < cfg.block_bytes)
    return Status::invalid(
        fmt::format("capacity {} is smaller than one block ({})", cfg.capacity, cfg.block_bytes));
  if (cfg.capacity / cfg.block_bytes >= kNone || cfg.max_objects >= kNone)
    return Status::invalid("too many blocks or objects for one segment (at most 2^32 - 2)");
  return Status::ok();
}

Status from_exception(const std::string& name, const std::exception& e) {
  return Status::io_error(fmt::format("shm segment {}: {}", name, e.what()));
}
}  // namespace

ShmStore::ShmStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ShmStore::~ShmStore() {
  Impl& s = *impl_;
  if (s.h == nullptr || s.me == kNone) return;
  if (!s.lock()) return;
  s.release_client(s.me);
  s.unlock();
}

Result<std::unique_ptr<ShmStore>> ShmStore::open(const ShmConfig& cfg) {
  TIER_RETURN_IF_ERROR(validate(cfg));
  auto impl = std::make_unique<Impl>();
  impl->name = cfg.segment;
  try {
    for (int attempt = 0; attempt < 4 && !impl->seg; ++attempt) {
      try {
        TIER_RETURN_IF_ERROR(impl->map_existing());
        TIER_RETURN_IF_ERROR(impl->check_geometry(cfg));
        if (cfg.prefault) impl->prefault(false);  // map every page here too: no minor faults
      } catch (const bip::interprocess_exception& e) {
        if (e.get_error_code() != bip::not_found_error) throw;
        impl->seg.reset();
        TIER_ASSIGN_OR_RETURN(bool created, impl->create(cfg));
        (void)created;  // lost the race: the next attempt opens the winner's segment
      }
    }
  } catch (const std::exception& e) {
    return from_exception(cfg.segment, e);
  }
  if (!impl->seg) return Status::io_error(fmt::format("shm segment {}: cannot open", cfg.segment));
  TIER_RETURN_IF_ERROR(impl->claim_client());
  return std::unique_ptr<ShmStore>(new ShmStore(std::move(impl)));
}

Result<std::unique_ptr<ShmStore>> ShmStore::attach(const std::string& segment) {
  if (!valid_segment_name(segment))
    return Status::invalid(fmt::format("\"{}\" is not a valid segment name", segment));
  auto impl = std::make_unique<Impl>();
  impl->name = segment;
  try {
    TIER_RETURN_IF_ERROR(impl->map_existing());
  } catch (const bip::interprocess_exception& e) {
    if (e.get_error_code() == bip::not_found_error)
      return Status::not_found(fmt::format("no shm segment named {}", segment));
    return from_exception(segment, e);
  } catch (const std::exception& e) {
    return from_exception(segment, e);
  }
  TIER_RETURN_IF_ERROR(impl->claim_client());
  return std::unique_ptr<ShmStore>(new ShmStore(std::move(impl)));
}

Status ShmStore::remove_segment(const std::string& segment) {
  if (!valid_segment_name(segment))
    return Status::invalid(fmt::format("\"{}\" is not a valid segment name", segment));
  remove_init_leftovers(segment, true);
  if (!bip::shared_memory_object::remove(segment.c_str()))
    return Status::not_found(fmt::format("no shm segment named {}", segment));
  return Status::ok();
}

template <class Write>
Status ShmStore::Impl::put(const ObjectKey& key, std::uint64_t image_bytes,
                           const EvictFn& on_evict, Write&& write) {
  Impl& s = *this;
  const std::uint64_t bb = s.h->block_bytes;
  const auto n = static_cast<std::uint32_t>((image_bytes + bb - 1) / bb);
  if (image_bytes == 0 || n > s.h->blocks)
    return Status(Code::kNoSpace,
                  fmt::format("object of {} bytes does not fit in the segment", image_bytes));
  std::vector<std::pair<ObjectKey, std::uint64_t>> evicted;
  TIER_RETURN_IF_ERROR(s.lock());
  std::uint32_t i = s.find(key);
  if (i != kNone && s.entries[i].state.load(std::memory_order_relaxed) == kWriting &&
      s.entries[i].owner != s.me && s.reap_dead() > 0)
    i = s.find(key);  // the writer had died; its reservation is gone
  if (i != kNone) {
    if (s.entries[i].state.load(std::memory_order_relaxed) == kReady) s.touch(i);
    s.unlock();
    return Status(Code::kAlreadyExists, "");
  }
  bool reaped = false;
  while (s.h->free_blocks.load(std::memory_order_relaxed) < n || s.h->free_entry_head == kNone) {
    std::uint32_t v = s.h->lru_tail;
    while (v != kNone && s.entries[v].readers > 0) v = s.entries[v].lru_prev;
    if (v == kNone) {
      if (!reaped && s.reap_dead() > 0) {
        reaped = true;
        continue;
      }
      s.unlock();
      for (auto& [k, bytes] : evicted) on_evict(k, bytes);
      return Status(Code::kNoSpace, "every stored object is being read or written");
    }
    evicted.emplace_back(s.entries[v].key, s.entries[v].image_bytes);
    s.hash_unlink(v);
    crash_point(ShmCrashPoint::kEvictHoldingLock);
    s.lru_unlink(v);
    s.h->objects.fetch_sub(1, std::memory_order_relaxed);
    s.h->image_bytes.fetch_sub(s.entries[v].image_bytes, std::memory_order_relaxed);
    s.release_entry(v);
  }
  std::uint32_t first = s.take_blocks(n);
  crash_point(ShmCrashPoint::kPutHoldingLock);
  i = s.h->free_entry_head;
  Entry& e = s.entries[i];
  s.h->free_entry_head = e.hash_next;
  const std::uint64_t gen = ++s.h->generation;
  e.owner = s.me;
  e.generation = gen;
  e.key = key;
  e.nblocks = n;
  e.image_bytes = image_bytes;
  e.first_block = first;
  e.readers = 0;
  e.tick = ++s.h->tick;
  e.state.store(kWriting, std::memory_order_release);
  s.hash_insert(i);
  s.h->writing.fetch_add(1, std::memory_order_relaxed);
  s.h->used_bytes.fetch_add(std::uint64_t{n} * bb, std::memory_order_relaxed);
  s.unlock();
  for (auto& [k, bytes] : evicted) on_evict(k, bytes);

  Status written = write(first);

  TIER_RETURN_IF_ERROR(s.lock());
  if (e.state.load(std::memory_order_relaxed) != kWriting || e.owner != s.me ||
      e.generation != gen) {
    s.unlock();
    return written ? Status(Code::kBadState, "shm put: the reservation was released while writing")
                   : written;
  }
  if (!written) {  // abandon the reservation: the object was never visible
    s.hash_unlink(i);
    s.release_entry(i);
    s.unlock();
    return written;
  }
  e.tick = ++s.h->tick;
  e.state.store(kReady, std::memory_order_release);
  s.lru_push_front(i);
  s.h->writing.fetch_sub(1, std::memory_order_relaxed);
  s.h->objects.fetch_add(1, std::memory_order_relaxed);
  s.h->image_bytes.fetch_add(image_bytes, std::memory_order_relaxed);
  s.unlock();
  return Status::ok();
}

Status ShmStore::put(const ObjectKey& key, std::span<const std::byte> image,
                     const EvictFn& on_evict) {
  return impl_->put(key, image.size(), on_evict, [&](std::uint32_t first) {
    impl_->write_image(first, image);
    return Status::ok();
  });
}

Status ShmStore::put_with(const ObjectKey& key, std::uint64_t image_bytes, const PiecesFn& fill,
                          const EvictFn& on_evict) {
  return impl_->put(key, image_bytes, on_evict, [&](std::uint32_t first) {
    return fill(impl_->pieces(first, image_bytes));
  });
}

template <class Read>
ShmStore::GetResult ShmStore::Impl::get(const ObjectKey& key, std::uint64_t capacity,
                                        Read&& read) {
  Impl& s = *this;
  if (Status st = s.lock(); !st) return {st, 0};
  std::uint32_t i = s.find(key);
  if (i == kNone || s.entries[i].state.load(std::memory_order_relaxed) != kReady) {
    s.unlock();
    return {Status::not_found(), 0};
  }
  Entry& e = s.entries[i];
  const std::uint64_t bytes = e.image_bytes;
  if (capacity < bytes) {
    s.unlock();
    return {
        Status::invalid(fmt::format("buffer of {} bytes is too small for {}", capacity, bytes)),
        bytes};
  }
  Client& me = s.clients[s.me];
  me.pinned_generation = e.generation;
  me.pinned = i;
  ++e.readers;
  s.touch(i);
  const std::uint32_t first = e.first_block, nblocks = e.nblocks;
  s.unlock();

  Status verified = read(first, nblocks, bytes);

  if (Status st = s.lock(); !st) return {st, 0};
  s.unpin(s.me);
  s.unlock();
  return {std::move(verified), bytes};
}

ShmStore::GetResult ShmStore::get(const ObjectKey& key, std::span<std::byte> out) {
  return impl_->get(key, out.size(),
                    [&](std::uint32_t first, std::uint32_t nblocks, std::uint64_t bytes) {
                      return impl_->read_image(key, first, nblocks, out.first(bytes));
                    });
}

ShmStore::GetResult ShmStore::get_with(const ObjectKey& key, std::uint64_t capacity,
                                       const PiecesFn& drain) {
  return impl_->get(key, capacity, [&](std::uint32_t first, std::uint32_t, std::uint64_t bytes) {
    return drain(impl_->pieces(first, bytes));
  });
}

std::span<std::byte> ShmStore::mapping() const noexcept {
  return {static_cast<std::byte*>(impl_->seg->get_address()), impl_->seg->get_size()};
}

Result<std::uint64_t> ShmStore::contains(const ObjectKey& key) {
  Impl& s = *impl_;
  TIER_RETURN_IF_ERROR(s.lock());
  std::uint32_t i = s.find(key);
  std::optional<std::uint64_t> bytes;
  if (i != kNone && s.entries[i].state.load(std::memory_order_relaxed) == kReady)
    bytes = s.entries[i].image_bytes;
  s.unlock();
  if (!bytes) return Status::not_found();
  return *bytes;
}

Status ShmStore::remove(const ObjectKey& key) {
  Impl& s = *impl_;
  TIER_RETURN_IF_ERROR(s.lock());
  std::uint32_t i = s.find(key);
  if (i == kNone || s.entries[i].state.load(std::memory_order_relaxed) != kReady) {
    s.unlock();
    return Status::not_found();
  }
  s.retire_ready(i);
  s.unlock();
  return Status::ok();
}

ShmStats ShmStore::stats() const noexcept { return impl_->stats(); }

Result<ShmStats> ShmStore::inspect(std::vector<ShmClientInfo>* clients,
                                   std::vector<ShmObjectInfo>* objects) {
  Impl& s = *impl_;
  TIER_RETURN_IF_ERROR(s.lock());
  ShmStats st = s.stats();
  if (clients != nullptr) {
    for (std::uint32_t c = 0; c < kMaxClients; ++c) {
      const Client& cl = s.clients[c];
      if (cl.in_use.load(std::memory_order_acquire) == 0) continue;
      clients->push_back(
          {cl.pid, c == s.me || process_alive(cl.pid, cl.start_time), cl.pinned != kNone});
    }
  }
  if (objects != nullptr) {
    for (std::uint64_t i = 0; i < s.h->max_entries; ++i) {
      const Entry& e = s.entries[i];
      std::uint32_t state = e.state.load(std::memory_order_acquire);
      if (state == kFree) continue;
      objects->push_back({e.key, e.image_bytes, e.nblocks,
                          state == kReady     ? "ready"
                          : state == kWriting ? "writing"
                                              : "doomed"});
    }
  }
  s.unlock();
  return st;
}

Result<ShmVerifyReport> ShmStore::verify() {
  Impl& s = *impl_;
  ShmVerifyReport report;
  std::vector<ObjectKey> keys;
  TIER_RETURN_IF_ERROR(s.lock());
  report.reaped_clients = s.reap_dead();
  if (std::uint64_t dropped = s.rebuild(); dropped > 0)
    report.problems.push_back(fmt::format("{} malformed index entries dropped", dropped));
  for (std::uint64_t i = 0; i < s.h->max_entries; ++i)
    if (s.entries[i].state.load(std::memory_order_acquire) == kReady)
      keys.push_back(s.entries[i].key);
  s.unlock();
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
