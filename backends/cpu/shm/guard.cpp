#include "shm/guard.hpp"

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>

namespace tier::cpu::shm {

namespace {

// One registered mapping. `base` is published last (release) and cleared first, so the handler
// never pairs a base with another mapping's size.
struct Slot {
  std::atomic<std::uintptr_t> base{0};
  std::atomic<std::size_t> bytes{0};
  std::atomic<bool> lost{false};
};
static_assert(std::atomic<std::uintptr_t>::is_always_lock_free);

Slot g_slots[MappingGuard::kMaxGuarded];
std::mutex g_register;        // registration only; the handler takes no lock
struct sigaction g_previous;  // the disposition before libtier's, for faults that are not ours

void call_previous(int sig, siginfo_t* info, void* context) {
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    // The default action: restore it and return; the faulting access runs again and gets it
    // (a SIGBUS from kill() is delivered again by raising it).
    signal(sig, SIG_DFL);
    if (info == nullptr || info->si_code <= 0) raise(sig);
  }
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  // Only a fault of this process's own access (si_code > 0) carries the address that faulted.
  if (info != nullptr && info->si_code > 0) {
    const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
    for (Slot& s : g_slots) {
      const std::uintptr_t base = s.base.load(std::memory_order_acquire);
      if (base == 0 || addr < base || addr - base >= s.bytes.load(std::memory_order_relaxed))
        continue;
      void* p = ::mmap(reinterpret_cast<void*>(base), s.bytes.load(std::memory_order_relaxed),
                       PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      if (p == MAP_FAILED) break;  // cannot replace it: the fault keeps its old meaning
      s.lost.store(true, std::memory_order_release);
      return;
    }
  }
  call_previous(sig, info, context);
}

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous);
  });
}

}  // namespace

MappingGuard::MappingGuard(void* base, std::size_t bytes) noexcept {
  if (base == nullptr || bytes == 0) return;
  install_once();
  std::lock_guard<std::mutex> lock(g_register);
  for (int i = 0; i < kMaxGuarded; ++i) {
    Slot& s = g_slots[i];
    if (s.base.load(std::memory_order_relaxed) != 0) continue;
    s.lost.store(false, std::memory_order_relaxed);
    s.bytes.store(bytes, std::memory_order_relaxed);
    s.base.store(reinterpret_cast<std::uintptr_t>(base), std::memory_order_release);
    slot_ = i;
    return;
  }
}

MappingGuard::MappingGuard(MappingGuard&& o) noexcept : slot_(std::exchange(o.slot_, -1)) {}

MappingGuard& MappingGuard::operator=(MappingGuard&& o) noexcept {
  if (this != &o) {
    reset();
    slot_ = std::exchange(o.slot_, -1);
  }
  return *this;
}

void MappingGuard::reset() noexcept {
  if (slot_ < 0) return;
  std::lock_guard<std::mutex> lock(g_register);
  g_slots[std::exchange(slot_, -1)].base.store(0, std::memory_order_release);
}

bool MappingGuard::lost() const noexcept {
  return slot_ >= 0 && g_slots[slot_].lost.load(std::memory_order_acquire);
}

}  // namespace tier::cpu::shm
