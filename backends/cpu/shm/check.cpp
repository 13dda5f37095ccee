#include "shm/check.hpp"

#include <fmt/format.h>

#include "shm/index.hpp"

namespace tier::cpu::shm {

namespace {

const char* state_name(std::uint32_t st) {
  static const char* const kNames[] = {"free", "writing", "ready", "doomed"};
  return st < 4 ? kNames[st] : "invalid";
}

// One pass of the check; p_ collects the lines.
class Checker {
 public:
  explicit Checker(const Tables& t) : t_(t), index_(t) {}

  std::vector<std::string> run() {
    header();
    entries();
    hash();
    lru();
    free_entries();
    free_blocks();
    counters();
    return std::move(p_);
  }

 private:
  template <class... A>
  void problem(fmt::format_string<A...> f, A&&... a) {
    p_.push_back(fmt::format(f, std::forward<A>(a)...));
  }
  std::uint32_t state(std::uint64_t i) const {
    return t_.entries[i].state.load(std::memory_order_acquire);
  }

  void header() {
    const Header& h = *t_.h;
    if (h.magic != kMagic) problem("header magic = {:#x}, expected {:#x}", h.magic, kMagic);
    if (h.version != kVersion) problem("header version = {}, expected {}", h.version, kVersion);
    auto same = [&](const char* field, std::uint64_t got, std::uint64_t want) {
      if (got != want)
        problem("header {} = {}, expected {} (the geometry checked when it was mapped)", field, got,
                want);
    };
    same("block_bytes", h.block_bytes, t_.block_bytes);
    same("blocks", h.blocks, t_.blocks);
    same("max_entries", h.max_entries, t_.max_entries);
    same("buckets", h.buckets, t_.buckets_n);
  }

  // Each live entry's fields and block chain; fills owner_ (block -> entry).
  void entries() {
    owner_.assign(t_.blocks, kNone);
    for (std::uint64_t i = 0; i < t_.max_entries; ++i) {
      const Entry& e = t_.entries[i];
      const std::uint32_t st = state(i);
      if (st == kFree) continue;
      if (st > kDoomed) {
        problem("entry {} state = {}, expected 0-3 (free, writing, ready, doomed)", i, st);
        continue;
      }
      const std::uint64_t bb = t_.block_bytes;
      if (st == kWriting && (e.owner >= kMaxClients ||
                             t_.clients[e.owner].in_use.load(std::memory_order_acquire) == 0))
        problem("entry {} ({}) owner = {}, expected a client slot in use (< {})", i, state_name(st),
                e.owner, kMaxClients);
      if (e.nblocks == 0 || e.nblocks > t_.blocks) {
        problem("entry {} ({}) nblocks = {}, expected [1, {}]", i, state_name(st), e.nblocks,
                t_.blocks);
        continue;
      }
      if (e.image_bytes <= (std::uint64_t{e.nblocks} - 1) * bb || e.image_bytes > e.nblocks * bb)
        problem("entry {} ({}) image_bytes = {}, expected ({}, {}] for {} blocks", i,
                state_name(st), e.image_bytes, (std::uint64_t{e.nblocks} - 1) * bb, e.nblocks * bb,
                e.nblocks);
      std::uint32_t b = e.first_block;
      std::uint64_t from = i;
      for (std::uint32_t k = 0; k < e.nblocks; ++k) {
        if (!t_.block_ok(b)) {
          if (k == 0)
            problem("entry {} ({}) first_block = {}, expected < {}", i, state_name(st), b,
                    t_.blocks);
          else
            problem(
                "entry {} ({}) block chain: block {} next = {} after {} of {} blocks, "
                "expected < {}",
                i, state_name(st), from, b, k, e.nblocks, t_.blocks);
          break;
        }
        if (owner_[b] != kNone) {
          problem(
              "entry {} ({}) block chain: block {} ({} of {}) is also in the chain of entry "
              "{}{}",
              i, state_name(st), b, k + 1, e.nblocks, owner_[b],
              owner_[b] == i ? " (a cycle)" : "");
          break;
        }
        owner_[b] = static_cast<std::uint32_t>(i);
        from = b;
        b = t_.next[b];
        if (k + 1 == e.nblocks && b != kNone)
          problem("entry {} ({}) block chain: last block {} next = {}, expected none", i,
                  state_name(st), from, b);
      }
    }
  }

  void hash() {
    std::vector<bool> seen(t_.max_entries, false);
    for (std::uint64_t bk = 0; bk < t_.buckets_n; ++bk) {
      std::uint32_t i = t_.buckets[bk];
      std::uint64_t prev = kNone;
      while (i != kNone) {
        if (!t_.entry_ok(i)) {
          if (prev == kNone)
            problem("bucket {} head = {}, expected < {} or none", bk, i, t_.max_entries);
          else
            problem("entry {} hash_next = {}, expected < {} or none (bucket {})", prev, i,
                    t_.max_entries, bk);
          break;
        }
        if (seen[i]) {
          problem(
              "bucket {}: hash chain reaches entry {} a second time (a cycle, or two chains "
              "joined)",
              bk, i);
          break;
        }
        seen[i] = true;
        const std::uint32_t st = state(i);
        if (st != kWriting && st != kReady)
          problem(
              "entry {} state = {} ({}), expected writing or ready: it is in the hash chain "
              "of bucket {}",
              i, st, state_name(st), bk);
        else if (index_.bucket_of(t_.entries[i].key) != bk)
          problem("entry {} is in the hash chain of bucket {}, but its key hashes to bucket {}", i,
                  bk, index_.bucket_of(t_.entries[i].key));
        prev = i;
        i = t_.entries[i].hash_next;
      }
    }
    for (std::uint64_t i = 0; i < t_.max_entries; ++i)
      if ((state(i) == kWriting || state(i) == kReady) && !seen[i])
        problem("entry {} ({}) is missing from the hash chain of its bucket", i,
                state_name(state(i)));
  }

  void lru() {
    std::vector<bool> seen(t_.max_entries, false);
    std::uint32_t i = t_.h->lru_head, prev = kNone;
    while (i != kNone) {
      if (!t_.entry_ok(i)) {
        if (prev == kNone)
          problem("header lru_head = {}, expected < {} or none", i, t_.max_entries);
        else
          problem("entry {} lru_next = {}, expected < {} or none", prev, i, t_.max_entries);
        return;
      }
      if (seen[i]) {
        problem("LRU list reaches entry {} a second time (a cycle)", i);
        return;
      }
      seen[i] = true;
      const Entry& e = t_.entries[i];
      if (state(i) != kReady)
        problem("entry {} state = {} ({}), expected ready: it is in the LRU list", i, state(i),
                state_name(state(i)));
      if (e.lru_prev != prev) problem("entry {} lru_prev = {}, expected {}", i, e.lru_prev, prev);
      prev = i;
      i = e.lru_next;
    }
    if (t_.h->lru_tail != prev) problem("header lru_tail = {}, expected {}", t_.h->lru_tail, prev);
    for (std::uint64_t k = 0; k < t_.max_entries; ++k)
      if (state(k) == kReady && !seen[k])
        problem("entry {} (ready) is missing from the LRU list", k);
  }

  void free_entries() {
    std::vector<bool> seen(t_.max_entries, false);
    std::uint32_t i = t_.h->free_entry_head, prev = kNone;
    std::uint64_t listed = 0;
    while (i != kNone) {
      if (!t_.entry_ok(i)) {
        if (prev == kNone)
          problem("header free_entry_head = {}, expected < {} or none", i, t_.max_entries);
        else
          problem("free entry {} hash_next = {}, expected < {} or none", prev, i, t_.max_entries);
        return;
      }
      if (seen[i]) {
        problem("free entry list reaches entry {} a second time (a cycle)", i);
        return;
      }
      seen[i] = true;
      ++listed;
      if (state(i) != kFree)
        problem("entry {} state = {} ({}), expected free: it is on the free entry list", i,
                state(i), state_name(state(i)));
      prev = i;
      i = t_.entries[i].hash_next;
    }
    std::uint64_t free = 0;
    for (std::uint64_t k = 0; k < t_.max_entries; ++k) free += state(k) == kFree;
    if (listed != free)
      problem("free entry list holds {} entries, expected {} (the free entries)", listed, free);
  }

  void free_blocks() {
    std::vector<bool> seen(t_.blocks, false);
    std::uint32_t b = t_.h->free_block_head, prev = kNone;
    std::uint64_t listed = 0;
    while (b != kNone) {
      if (!t_.block_ok(b)) {
        if (prev == kNone)
          problem("header free_block_head = {}, expected < {} or none", b, t_.blocks);
        else
          problem("free block {} next = {}, expected < {} or none", prev, b, t_.blocks);
        break;
      }
      if (seen[b]) {
        problem("free block list reaches block {} a second time (a cycle)", b);
        break;
      }
      seen[b] = true;
      ++listed;
      if (owner_[b] != kNone)
        problem("free block list holds block {}, which is in the chain of entry {}", b, owner_[b]);
      prev = b;
      b = t_.next[b];
    }
    const std::uint64_t free_now = t_.h->free_blocks.load(std::memory_order_relaxed);
    if (listed != free_now)
      problem("header free_blocks = {}, expected {} (the free block list)", free_now, listed);
    std::uint64_t leaked = 0;
    for (std::uint64_t k = 0; k < t_.blocks; ++k) leaked += owner_[k] == kNone && !seen[k];
    if (leaked > 0) problem("{} blocks are neither free nor in an entry's chain (leaked)", leaked);
  }

  void counters() {
    std::uint64_t used = 0, image = 0, objects = 0, writing = 0, doomed = 0;
    std::vector<std::uint32_t> pins(t_.max_entries, 0);
    for (std::uint32_t c = 0; c < kMaxClients; ++c) {
      const Client& cl = t_.clients[c];
      if (cl.in_use.load(std::memory_order_acquire) == 0 || cl.pinned == kNone) continue;
      if (!t_.entry_ok(cl.pinned))
        problem("client {} pinned = {}, expected < {} or none", c, cl.pinned, t_.max_entries);
      else
        ++pins[cl.pinned];
    }
    for (std::uint64_t i = 0; i < t_.max_entries; ++i) {
      const Entry& e = t_.entries[i];
      const std::uint32_t st = state(i);
      if (st == kFree || st > kDoomed) continue;
      if (e.nblocks <= t_.blocks) used += std::uint64_t{e.nblocks} * t_.block_bytes;
      objects += st == kReady;
      writing += st == kWriting;
      doomed += st == kDoomed;
      if (st == kReady) image += e.image_bytes;
      if (e.readers != pins[i])
        problem("entry {} ({}) readers = {}, expected {} (the client slots pinning it)", i,
                state_name(st), e.readers, pins[i]);
    }
    const Header& h = *t_.h;
    auto same = [&](const char* field, std::uint64_t got, std::uint64_t want, const char* what) {
      if (got != want) problem("header {} = {}, expected {} ({})", field, got, want, what);
    };
    same("used_bytes", h.used_bytes.load(), used, "blocks of live entries");
    same("image_bytes", h.image_bytes.load(), image, "images of ready entries");
    same("objects", h.objects.load(), objects, "ready entries");
    same("writing", h.writing.load(), writing, "writing entries");
    same("doomed", h.doomed.load(), doomed, "doomed entries");
  }

  const Tables& t_;
  Index index_;
  std::vector<std::uint32_t> owner_;  // block -> entry whose chain holds it
  std::vector<std::string> p_;
};

}  // namespace

std::vector<std::string> find_problems(const Tables& t) { return Checker(t).run(); }

}  // namespace tier::cpu::shm
