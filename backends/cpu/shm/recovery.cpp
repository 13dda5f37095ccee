#include "shm/recovery.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace tier::cpu::shm {

namespace {

// A robust mutex taken with EOWNERDEAD is held by the caller, but ThreadSanitizer's
// pthread_mutex_timedlock records only a 0 return: tell it, or it reports the unlock that
// follows the repair. Nothing in other builds.
void tsan_owner_dead_lock([[maybe_unused]] pthread_mutex_t* m) noexcept {
#if defined(__SANITIZE_THREAD__)
  __tsan_mutex_pre_lock(m, __tsan_mutex_try_lock);
  __tsan_mutex_post_lock(m, __tsan_mutex_try_lock, 0);
#endif
}

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

// Marks the first `n` blocks of the chain from `first` as unused.
void unmark_chain(const Tables& t, std::vector<bool>& used, std::uint32_t first, std::uint32_t n) {
  for (std::uint32_t k = 0, c = first; k < n; ++k, c = t.next[c]) used[c] = false;
}

}  // namespace

std::uint64_t process_start_time(std::int32_t pid) { return read_proc_stat(pid).start_time; }

bool process_alive(std::int32_t pid, std::uint64_t start_time) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  ProcStat now = read_proc_stat(pid);
  if (now.state == 'Z' || now.state == 'X') return false;
  return now.start_time == 0 || start_time == 0 || now.start_time == start_time;
}

Status Recovery::lock(std::uint32_t me) noexcept {
  // Lock sections are short (index work, never copies); one that lasts kLockPatience is a
  // stopped holder or a corrupt lock word, and waiting longer would only hang this process too.
  // pthread_mutex_timedlock (a CLOCK_REALTIME deadline) rather than pthread_mutex_clocklock: a
  // wall-clock step can only stretch or shorten the bound, and ThreadSanitizer knows this call
  // (it does not intercept clocklock, and then reports every unlock as one of an unlocked mutex).
  timespec deadline{};
  ::clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += kLockPatience.count();
  int rc = pthread_mutex_timedlock(&t_.h->mutex, &deadline);
  if (rc == EOWNERDEAD) {
    tsan_owner_dead_lock(&t_.h->mutex);
    rebuild();
    reap_dead(me);
    t_.h->recoveries.fetch_add(1, std::memory_order_relaxed);
    pthread_mutex_consistent(&t_.h->mutex);
    return Status::ok();
  }
  if (rc == 0) return Status::ok();
  if (rc == ETIMEDOUT)
    return Status(Code::kTimedOut,
                  fmt::format("shm segment {}: its lock has been held for more than {} s: a "
                              "stopped process holds it, or its lock word is corrupt (then "
                              "`tierctl shm remove {}` discards the segment)",
                              segment_, kLockPatience.count(), segment_));
  // EINVAL (the mutex's kind or owner bits were scribbled), ENOTRECOVERABLE (a holder died and
  // nobody made it consistent), EDEADLK: the lock can never be taken, as if held forever.
  return Status(
      Code::kTimedOut,
      fmt::format("shm segment {}: its lock word is corrupt ({}: {}): no process can "
                  "take it; `tierctl shm remove {}` discards the segment",
                  segment_, rc == EINVAL ? "EINVAL" : "lock failed", std::strerror(rc), segment_));
}

void Recovery::unlock() noexcept { pthread_mutex_unlock(&t_.h->mutex); }

std::uint64_t Recovery::reap_dead(std::uint32_t me) noexcept {
  std::uint64_t reaped = 0;
  for (std::uint32_t c = 0; c < kMaxClients; ++c) {
    Client& cl = t_.clients[c];
    if (cl.in_use.load(std::memory_order_acquire) == 0 || c == me) continue;
    if (process_alive(cl.pid, cl.start_time)) continue;
    index_.release_client(c);
    ++reaped;
  }
  t_.h->reaped_clients.fetch_add(reaped, std::memory_order_relaxed);
  return reaped;
}

std::uint64_t Recovery::rebuild() noexcept {
  Chains chains = check_entries();
  const std::uint64_t live_clients = recount_pins();
  relink_entries(chains.used);
  relink_blocks(chains.used);
  t_.h->clients.store(live_clients, std::memory_order_relaxed);
  return chains.dropped;
}

Recovery::Chains Recovery::check_entries() noexcept {
  const std::uint64_t nb = t_.blocks, bb = t_.block_bytes;
  Chains out{std::vector<bool>(nb, false), 0};
  for (std::uint64_t i = 0; i < t_.max_entries; ++i) {
    Entry& e = t_.entries[i];
    std::uint32_t st = e.state.load(std::memory_order_acquire);
    if (st == kFree) continue;
    bool ok = (st == kWriting || st == kReady || st == kDoomed) && e.nblocks >= 1 &&
              e.image_bytes > (std::uint64_t{e.nblocks} - 1) * bb &&
              e.image_bytes <= std::uint64_t{e.nblocks} * bb &&
              (st != kWriting || (e.owner < kMaxClients &&
                                  t_.clients[e.owner].in_use.load(std::memory_order_acquire)));
    std::uint32_t b = e.first_block, walked = 0;
    while (ok && walked < e.nblocks) {
      if (b >= nb || out.used[b]) {
        ok = false;
      } else {
        out.used[b] = true;
        ++walked;
        b = t_.next[b];
      }
    }
    if (ok && b != kNone) ok = false;
    if (!ok) {
      unmark_chain(t_, out.used, e.first_block, walked);
      e.state.store(kFree, std::memory_order_release);
      ++out.dropped;
    }
  }
  return out;
}

std::uint64_t Recovery::recount_pins() noexcept {
  const std::uint64_t ne = t_.max_entries;
  for (std::uint64_t i = 0; i < ne; ++i) t_.entries[i].readers = 0;
  std::uint64_t live_clients = 0;
  for (std::uint32_t c = 0; c < kMaxClients; ++c) {
    Client& cl = t_.clients[c];
    if (cl.in_use.load(std::memory_order_acquire) == 0) continue;
    ++live_clients;
    std::uint32_t i = cl.pinned;
    if (i == kNone) continue;
    std::uint32_t st = i < ne ? t_.entries[i].state.load(std::memory_order_acquire) : kFree;
    if ((st == kReady || st == kDoomed) && t_.entries[i].generation == cl.pinned_generation)
      ++t_.entries[i].readers;
    else
      cl.pinned = kNone;
  }
  return live_clients;
}

void Recovery::relink_entries(std::vector<bool>& used) noexcept {
  Header& h = *t_.h;
  h.free_entry_head = kNone;
  std::uint64_t used_bytes = 0, image_bytes = 0, objects = 0, writing = 0, doomed = 0;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> ready;  // (tick, entry)
  for (std::uint64_t k = 0; k < t_.buckets_n; ++k) t_.buckets[k] = kNone;
  for (std::uint64_t n = t_.max_entries; n-- > 0;) {
    auto i = static_cast<std::uint32_t>(n);
    Entry& e = t_.entries[i];
    std::uint32_t st = e.state.load(std::memory_order_acquire);
    if (st == kDoomed && e.readers == 0) {
      unmark_chain(t_, used, e.first_block, e.nblocks);
      e.state.store(kFree, std::memory_order_release);
      st = kFree;
    }
    if (st == kFree) {
      e.hash_next = h.free_entry_head;
      h.free_entry_head = i;
      continue;
    }
    used_bytes += std::uint64_t{e.nblocks} * t_.block_bytes;
    if (st == kDoomed) ++doomed;
    if (st == kWriting) ++writing;
    if (st == kReady) {
      ++objects;
      image_bytes += e.image_bytes;
      ready.emplace_back(e.tick, i);
    }
    if (st != kDoomed) index_.hash_insert(i);
  }
  std::sort(ready.begin(), ready.end());
  h.lru_head = h.lru_tail = kNone;
  for (auto& [tick, i] : ready) index_.lru_push_front(i);
  if (!ready.empty()) h.tick = std::max(h.tick, ready.back().first);
  h.used_bytes.store(used_bytes, std::memory_order_relaxed);
  h.image_bytes.store(image_bytes, std::memory_order_relaxed);
  h.objects.store(objects, std::memory_order_relaxed);
  h.writing.store(writing, std::memory_order_relaxed);
  h.doomed.store(doomed, std::memory_order_relaxed);
}

void Recovery::relink_blocks(const std::vector<bool>& used) noexcept {
  t_.h->free_block_head = kNone;
  std::uint64_t free_blocks = 0;
  for (std::uint64_t n = t_.blocks; n-- > 0;) {
    if (used[n]) continue;
    t_.next[n] = t_.h->free_block_head;
    t_.h->free_block_head = static_cast<std::uint32_t>(n);
    ++free_blocks;
  }
  t_.h->free_blocks.store(free_blocks, std::memory_order_relaxed);
}

}  // namespace tier::cpu::shm
