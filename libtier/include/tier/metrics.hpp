#pragma once
// Counters per tier and operation, readable while the owner thread works (relaxed atomics), and
// exported as JSON and as Prometheus text exposition (metric names are stable; see docs/metrics.md).

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tier/json.hpp"

namespace tier {

enum class Op : std::uint8_t { kPut = 0, kGet = 1, kContains = 2, kRemove = 3 };
inline constexpr std::size_t kOpCount = 4;
std::string_view op_name(Op op) noexcept;

struct Counter {
  std::atomic<std::uint64_t> v{0};
  void add(std::uint64_t n = 1) noexcept { v.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t get() const noexcept { return v.load(std::memory_order_relaxed); }
};

struct OpCounters {
  Counter requests;  // completions of this op
  Counter ok;        // completed OK (a hit for get/contains, stored for put)
  Counter misses;    // NotFound (get/contains/remove) or AlreadyExists (put)
  Counter errors;    // anything else
  Counter bytes;     // bytes moved by OK completions
};

struct TierMetrics {
  std::array<OpCounters, kOpCount> ops;
  Counter checksum_failures;  // reads whose bytes failed verification (never handed out)
  Counter evictions;          // objects evicted for capacity
  Counter evicted_bytes;
  Counter dropped_saves;      // write-through or demotion saves dropped (no room in flight, no space)
  Counter demotions;          // evicted objects written to the next tier
  Counter promotions;         // hits copied up into faster tiers
  // Lookup leases (Backend::lease): leases taken (holding at least one key), keys they held,
  // leases ended by release() before their deadline, leases that reached their deadline first,
  // and lease calls the tier answered NotSupported (it cannot lease: best effort only).
  Counter leases, leased_keys, lease_releases, lease_expiries, leases_unsupported;

  OpCounters& of(Op op) noexcept { return ops[static_cast<std::size_t>(op)]; }
  const OpCounters& of(Op op) const noexcept { return ops[static_cast<std::size_t>(op)]; }
  Json to_json() const;
};

// One named tier's metrics, for exposition.
struct NamedMetrics {
  std::string tier;
  const TierMetrics* metrics;
};
Json metrics_json(const std::vector<NamedMetrics>& tiers);
// Prometheus text format 0.0.4, e.g. `libtier_ops_total{tier="cpu",op="get",result="ok"} 12`.
std::string metrics_prometheus(const std::vector<NamedMetrics>& tiers);

}  // namespace tier
