// TierStack's metrics: the usage gauges and latency histograms it keeps, and their JSON and
// Prometheus forms (docs/metrics.md). Everything here but note_usage() and start_metrics() reads
// atomics only, so the metrics endpoint's thread calls it without the stack's lock.
#include <fmt/format.h>

#include "tier/log.hpp"
#include "tier/tier_stack.hpp"
#include "tier_stack_impl.hpp"

namespace tier {

using Clock = std::chrono::steady_clock;

std::string_view stack_op_name(StackOp op) noexcept {
  switch (op) {
    case StackOp::kSave:
      return "save";
    case StackOp::kLoad:
      return "load";
    case StackOp::kPut:
      return "put";
    case StackOp::kGet:
      return "get";
  }
  return "unknown";
}

Status TierStack::Impl::start_metrics(const Profile& profile, const TierStack& self) {
  gauges_ = std::make_unique<TierGauges[]>(tiers_.size());
  durations_ = std::make_unique<Histogram[]>(kStackOpCount * (tiers_.size() + 1));
  note_usage();
  if (profile.log_level) set_default_log_level(*profile.log_level);
  if (!profile.metrics.enabled) return Status::ok();
  TIER_RETURN_IF_ERROR(start_endpoint(profile.metrics, self));
  log(LogLevel::kInfo,
      fmt::format("{}: metrics at http://{}/metrics", profile.source, metrics_endpoint_));
  return Status::ok();
}

void TierStack::Impl::note_usage() noexcept {
  if (!gauges_) return;  // a stack whose open() failed before start_metrics, being destroyed
  for (std::size_t i = 0; i < tiers_.size(); ++i) {
    const Usage u = call(static_cast<int>(i), [](Backend& b) { return b.usage(); });
    gauges_[i].capacity_bytes.store(u.capacity_bytes, std::memory_order_relaxed);
    gauges_[i].used_bytes.store(u.used_bytes, std::memory_order_relaxed);
    gauges_[i].objects.store(u.objects, std::memory_order_relaxed);
  }
}

void TierStack::Impl::note_duration(StackOp op, int tier, Clock::duration d,
                                    std::uint64_t n) noexcept {
  if (!durations_) return;
  const std::size_t row = static_cast<std::size_t>(op) * (tiers_.size() + 1);
  durations_[row + static_cast<std::size_t>(tier + 1)].observe(d, n);
}

Usage TierStack::Impl::usage(std::size_t i) const noexcept {
  const TierGauges& g = gauges_[i];
  return Usage{g.capacity_bytes.load(std::memory_order_relaxed),
               g.used_bytes.load(std::memory_order_relaxed),
               g.objects.load(std::memory_order_relaxed)};
}

const Histogram& TierStack::Impl::op_duration(StackOp op, int tier) const noexcept {
  return durations_[static_cast<std::size_t>(op) * (tiers_.size() + 1) +
                    static_cast<std::size_t>(tier + 1)];
}

std::vector<NamedMetrics> TierStack::metrics() const {
  std::vector<NamedMetrics> m;
  for (const auto& t : impl_->tiers_) m.push_back({t->spec.name, &t->backend->metrics()});
  return m;
}

namespace {

constexpr StackOp kStackOps[] = {StackOp::kSave, StackOp::kLoad, StackOp::kPut, StackOp::kGet};

// The tiers a histogram of `op` is kept for: every tier, and -1 (none) for a load that missed.
std::vector<int> duration_tiers(StackOp op, std::size_t tiers) {
  std::vector<int> out;
  if (op == StackOp::kLoad) out.push_back(-1);
  for (std::size_t i = 0; i < tiers; ++i) out.push_back(static_cast<int>(i));
  return out;
}

std::string tier_label(const TierStack& s, int tier, std::string_view prefix) {
  return prometheus_escape(
      fmt::format("{}{}", prefix, tier < 0 ? "none" : s.spec(static_cast<std::size_t>(tier)).name));
}

Json histogram_json(const Histogram& h) {
  return {{"count", h.count()}, {"sum_seconds", h.sum_seconds()}};
}

// The stack's own counters, in Prometheus and JSON order.
struct StackField {
  const char* name;
  const char* help;
  const Counter StackCounters::*field;
};
constexpr StackField kStackFields[] = {
    {"saves", "Items given to save().", &StackCounters::saves},
    {"saved_bytes", "Image bytes the first writable tier stored.", &StackCounters::saved_bytes},
    {"save_failures", "Saves that the first writable tier did not store.",
     &StackCounters::save_failures},
    {"loads", "Items given to load().", &StackCounters::loads},
    {"loaded_bytes", "Payload bytes loads wrote into the caller's regions.",
     &StackCounters::loaded_bytes},
    {"load_misses", "Loads that no tier served (not stored, or failed).",
     &StackCounters::load_misses},
    {"decode_failures", "Images read whose payload the codec or stage refused.",
     &StackCounters::decode_failures},
    {"writethrough_dropped", "Write-through puts dropped (in-flight bound).",
     &StackCounters::writethrough_dropped},
    {"demotions_dropped", "Evicted objects not demoted (in-flight bound, no memory).",
     &StackCounters::demotions_dropped},
    {"staging_copy_bytes",
     "Payload bytes copied through the stack's own image buffers beyond the one move into or "
     "out of a tier.",
     &StackCounters::staging_copy_bytes},
};

}  // namespace

Json TierStack::metrics_json() const {
  Json j;
  j["tiers"] = tier::metrics_json(metrics());
  for (std::size_t i = 0; i < tier_count(); ++i) {
    const Usage u = usage(i);
    j["tiers"][spec(i).name]["usage"] = {
        {"capacity_bytes", u.capacity_bytes}, {"used_bytes", u.used_bytes}, {"objects", u.objects}};
  }
  j["stack"] = counters().to_json();
  Json d = Json::object();
  for (StackOp op : kStackOps) {
    Json per_tier = Json::object();
    for (int t : duration_tiers(op, tier_count()))
      per_tier[t < 0 ? std::string("none") : spec(static_cast<std::size_t>(t)).name] =
          histogram_json(op_duration(op, t));
    d[std::string(stack_op_name(op))] = per_tier;
  }
  j["op_duration"] = d;
  return j;
}

std::string TierStack::metrics_prometheus() const {
  const StackExposition self{this, "", ""};
  return tier::metrics_prometheus(std::span(&self, 1));
}

std::string metrics_prometheus(std::span<const StackExposition> stacks) {
  std::vector<NamedMetrics> named;
  for (const StackExposition& e : stacks)
    for (NamedMetrics& m : e.stack->metrics()) named.push_back({e.tier_prefix + m.tier, m.metrics});
  std::string out = metrics_prometheus(named);
  auto family = [&](std::string_view name, std::string_view help, std::string_view type) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  struct Gauge {
    const char* name;
    const char* help;
    std::uint64_t Usage::*field;
  };
  static constexpr Gauge kGauges[] = {
      {"libtier_tier_used_bytes", "Bytes the tier's stored images take (its usage).",
       &Usage::used_bytes},
      {"libtier_tier_capacity_bytes", "Bytes the tier may hold.", &Usage::capacity_bytes},
      {"libtier_tier_objects", "Objects stored in the tier.", &Usage::objects},
  };
  for (const Gauge& g : kGauges) {
    family(g.name, g.help, "gauge");
    for (const StackExposition& e : stacks)
      for (std::size_t i = 0; i < e.stack->tier_count(); ++i)
        out += fmt::format("{}{{tier=\"{}\"}} {}\n", g.name,
                           tier_label(*e.stack, static_cast<int>(i), e.tier_prefix),
                           e.stack->usage(i).*g.field);
  }
  for (const StackField& f : kStackFields) {
    const std::string name = fmt::format("libtier_stack_{}_total", f.name);
    family(name, f.help, "counter");
    for (const StackExposition& e : stacks)
      out += fmt::format("{}{} {}\n", name, e.labels.empty() ? "" : "{" + e.labels + "}",
                         (e.stack->counters().*f.field).get());
  }
  family("libtier_op_duration_seconds",
         "Latency of saves and loads (per item, from the start of the call) and of the puts and "
         "gets the stack submits to each tier.",
         "histogram");
  for (const StackExposition& e : stacks) {
    const std::string extra = e.labels.empty() ? "" : "," + e.labels;
    for (StackOp op : kStackOps) {
      for (int t : duration_tiers(op, e.stack->tier_count())) {
        const Histogram& h = e.stack->op_duration(op, t);
        const std::string labels = fmt::format("op=\"{}\",tier=\"{}\"{}", stack_op_name(op),
                                               tier_label(*e.stack, t, e.tier_prefix), extra);
        std::uint64_t cumulative = 0;
        for (std::size_t b = 0; b < Histogram::kBounds.size(); ++b) {
          cumulative += h.bucket(b);
          out += fmt::format("libtier_op_duration_seconds_bucket{{{},le=\"{}\"}} {}\n", labels,
                             Histogram::kBounds[b], cumulative);
        }
        cumulative += h.bucket(Histogram::kBounds.size());
        out += fmt::format("libtier_op_duration_seconds_bucket{{{},le=\"+Inf\"}} {}\n", labels,
                           cumulative);
        out += fmt::format("libtier_op_duration_seconds_sum{{{}}} {}\n", labels, h.sum_seconds());
        out += fmt::format("libtier_op_duration_seconds_count{{{}}} {}\n", labels, cumulative);
      }
    }
  }
  return out;
}

}  // namespace tier
