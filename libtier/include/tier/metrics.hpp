#pragma once
// Counters per tier and operation, readable while the owner thread works (relaxed atomics), and
// exported as JSON and as Prometheus text exposition (metric names are stable; see docs/metrics.md).

#include <array>
#include <atomic>
#include <chrono>
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

// A latency histogram (Prometheus's cumulative buckets are made when it is exported): a count per
// bucket and the sum of what was observed. observe() and the getters may run on any threads at
// once without a lock (relaxed atomics); a reader racing an observe() may see its count before its
// sum, never a count lost.
class Histogram {
 public:
  // Upper bounds of the buckets in seconds, from 5 us to 10 s; a last bucket takes the rest.
  static constexpr std::array<double, 20> kBounds = {
      5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
      1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0};
  static constexpr std::size_t kBuckets = kBounds.size() + 1;

  // `n` observations of `d` (several requests of one batch share their start and end).
  void observe(std::chrono::nanoseconds d, std::uint64_t n = 1) noexcept;
  // Observations in bucket `i` alone (not cumulative); i == kBounds.size() is the last bucket.
  std::uint64_t bucket(std::size_t i) const noexcept { return buckets_[i].get(); }
  std::uint64_t count() const noexcept;  // the sum of the buckets
  double sum_seconds() const noexcept { return static_cast<double>(sum_ns_.get()) * 1e-9; }

 private:
  std::array<Counter, kBuckets> buckets_;
  Counter sum_ns_;
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
// `value` escaped for a label value of the text format (backslash, double quote, newline).
std::string prometheus_escape(std::string_view value);

}  // namespace tier
