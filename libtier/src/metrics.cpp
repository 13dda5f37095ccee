#include "tier/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace tier {

std::string_view op_name(Op op) noexcept {
  switch (op) {
    case Op::kPut: return "put";
    case Op::kGet: return "get";
    case Op::kContains: return "contains";
    case Op::kRemove: return "remove";
  }
  return "unknown";
}

void Histogram::observe(std::chrono::nanoseconds d, std::uint64_t n) noexcept {
  if (n == 0) return;
  const std::int64_t ns = std::max<std::int64_t>(0, d.count());
  const double seconds = static_cast<double>(ns) * 1e-9;
  std::size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  buckets_[i].add(n);
  sum_ns_.add(static_cast<std::uint64_t>(ns) * n);
}

std::uint64_t Histogram::count() const noexcept {
  std::uint64_t n = 0;
  for (const Counter& b : buckets_) n += b.get();
  return n;
}

Json TierMetrics::to_json() const {
  Json j = Json::object();
  for (std::size_t i = 0; i < kOpCount; ++i) {
    const OpCounters& c = ops[i];
    j[std::string(op_name(static_cast<Op>(i)))] = {
        {"requests", c.requests.get()}, {"ok", c.ok.get()},       {"misses", c.misses.get()},
        {"errors", c.errors.get()},     {"bytes", c.bytes.get()},
    };
  }
  j["checksum_failures"] = checksum_failures.get();
  j["evictions"] = evictions.get();
  j["evicted_bytes"] = evicted_bytes.get();
  j["dropped_saves"] = dropped_saves.get();
  j["demotions"] = demotions.get();
  j["promotions"] = promotions.get();
  j["leases"] = leases.get();
  j["leased_keys"] = leased_keys.get();
  j["lease_releases"] = lease_releases.get();
  j["lease_expiries"] = lease_expiries.get();
  j["leases_unsupported"] = leases_unsupported.get();
  return j;
}

Json metrics_json(const std::vector<NamedMetrics>& tiers) {
  Json j = Json::object();
  for (const auto& t : tiers) j[t.tier] = t.metrics->to_json();
  return j;
}

std::string prometheus_escape(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string metrics_prometheus(const std::vector<NamedMetrics>& tiers) {
  std::string out;
  auto family = [&](std::string_view name, std::string_view help, std::string_view type) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  family("libtier_ops_total", "Completed operations by tier, op and result.", "counter");
  for (const auto& t : tiers) {
    const std::string tier = prometheus_escape(t.tier);
    for (std::size_t i = 0; i < kOpCount; ++i) {
      const OpCounters& c = t.metrics->ops[i];
      auto op = op_name(static_cast<Op>(i));
      out += fmt::format("libtier_ops_total{{tier=\"{}\",op=\"{}\",result=\"ok\"}} {}\n", tier,
                         op, c.ok.get());
      out += fmt::format("libtier_ops_total{{tier=\"{}\",op=\"{}\",result=\"miss\"}} {}\n", tier,
                         op, c.misses.get());
      out += fmt::format("libtier_ops_total{{tier=\"{}\",op=\"{}\",result=\"error\"}} {}\n", tier,
                         op, c.errors.get());
    }
  }
  family("libtier_bytes_total", "Bytes moved by successful operations.", "counter");
  for (const auto& t : tiers)
    for (std::size_t i = 0; i < kOpCount; ++i)
      out += fmt::format("libtier_bytes_total{{tier=\"{}\",op=\"{}\"}} {}\n",
                         prometheus_escape(t.tier), op_name(static_cast<Op>(i)),
                         t.metrics->ops[i].bytes.get());
  struct Single {
    const char* name;
    const char* help;
    const Counter TierMetrics::*field;
  };
  static constexpr Single kSingles[] = {
      {"libtier_checksum_failures_total", "Reads that failed verification.",
       &TierMetrics::checksum_failures},
      {"libtier_evictions_total", "Objects evicted for capacity.", &TierMetrics::evictions},
      {"libtier_evicted_bytes_total", "Bytes evicted for capacity.", &TierMetrics::evicted_bytes},
      {"libtier_dropped_saves_total", "Saves dropped (in-flight bound, no space).",
       &TierMetrics::dropped_saves},
      {"libtier_demotions_total", "Evicted objects written to the next tier.",
       &TierMetrics::demotions},
      {"libtier_promotions_total", "Hits copied into faster tiers.", &TierMetrics::promotions},
      {"libtier_leases_total", "Lookup leases taken.", &TierMetrics::leases},
      {"libtier_leased_keys_total", "Keys held by lookup leases.", &TierMetrics::leased_keys},
      {"libtier_lease_releases_total", "Lookup leases released before their deadline.",
       &TierMetrics::lease_releases},
      {"libtier_lease_expiries_total", "Lookup leases that reached their deadline.",
       &TierMetrics::lease_expiries},
      {"libtier_leases_unsupported_total", "Lease calls on a tier that cannot lease.",
       &TierMetrics::leases_unsupported},
  };
  for (const Single& s : kSingles) {
    family(s.name, s.help, "counter");
    for (const auto& t : tiers)
      out += fmt::format("{}{{tier=\"{}\"}} {}\n", s.name, prometheus_escape(t.tier),
                         (t.metrics->*s.field).get());
  }
  return out;
}

}  // namespace tier
