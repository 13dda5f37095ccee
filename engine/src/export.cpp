#include "tier/engine/export.hpp"

#include <fmt/format.h>

namespace tier::engine {
namespace {

struct Field {
  const char* name;
  const Counter EngineCounters::*field;
};
constexpr Field kEngineFields[] = {
    {"load_requests", &EngineCounters::load_requests},
    {"loaded_tokens", &EngineCounters::loaded_tokens},
    {"load_failures", &EngineCounters::load_failures},
    {"save_requests", &EngineCounters::save_requests},
    {"saved_tokens", &EngineCounters::saved_tokens},
    {"lookups", &EngineCounters::lookups},
    {"lookup_hit_tokens", &EngineCounters::lookup_hit_tokens},
    {"page_hit_tokens", &EngineCounters::page_hit_tokens},
    {"lookups_without_commit", &EngineCounters::lookups_without_commit},
    {"commits_rediscovered", &EngineCounters::commits_rediscovered},
    {"slot_commits", &EngineCounters::slot_commits},
    {"slot_save_failures", &EngineCounters::slot_save_failures},
    {"decommits", &EngineCounters::decommits},
    {"save_failures", &EngineCounters::save_failures},
    {"loads_skipped", &EngineCounters::loads_skipped},
    {"leased_lookups", &EngineCounters::leased_lookups},
    {"lease_shortfalls", &EngineCounters::lease_shortfalls},
    {"sidecars_missing", &EngineCounters::sidecars_missing},
    {"slot_boundaries_missed", &EngineCounters::slot_boundaries_missed},
};

struct WorkerField {
  const char* name;
  const Counter WorkerCounters::*field;
};
constexpr WorkerField kWorkerFields[] = {
    {"loads_ok", &WorkerCounters::loads_ok},
    {"loads_failed", &WorkerCounters::loads_failed},
    {"page_chunks_loaded", &WorkerCounters::page_chunks_loaded},
    {"slot_restores", &WorkerCounters::slot_restores},
    {"saves_ok", &WorkerCounters::saves_ok},
    {"saves_failed", &WorkerCounters::saves_failed},
    {"page_chunks_saved", &WorkerCounters::page_chunks_saved},
    {"slot_publishes", &WorkerCounters::slot_publishes},
    {"saves_rejected", &WorkerCounters::saves_rejected},
    {"slot_invalidations", &WorkerCounters::slot_invalidations},
    {"page_invalidations", &WorkerCounters::page_invalidations},
    {"fenced_refusals", &WorkerCounters::fenced_refusals},
    {"visibility_probes", &WorkerCounters::visibility_probes},
};

std::vector<std::string> tier_names(Worker& w) {
  return w.with_stack([](TierStack& s) {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < s.tier_count(); ++i) names.push_back(s.spec(i).name);
    return names;
  });
}

}  // namespace

Json worker_metrics_json(Worker& w) {
  Json j;
  Json wj;
  wj["rank"] = w.rank();
  for (const WorkerField& f : kWorkerFields) wj[f.name] = (w.counters().*f.field).get();
  auto names = tier_names(w);
  auto loaded = w.loaded_bytes_by_tier();
  Json by_tier = Json::object();
  for (std::size_t i = 0; i < names.size(); ++i) by_tier[names[i]] = loaded[i];
  wj["loaded_bytes_by_tier"] = by_tier;
  j["workers"] = Json::array({wj});
  j["tiers"] = Json::object();
  Json tiers = w.with_stack([](TierStack& s) { return s.metrics_json(); });
  for (auto& [name, m] : tiers["tiers"].items())
    j["tiers"][fmt::format("rank{}/{}", w.rank(), name)] = m;
  return j;
}

Json metrics_json(const Scheduler& scheduler, std::span<Worker* const> workers) {
  Json j;
  Json& e = j["engine"];
  for (const Field& f : kEngineFields) e[f.name] = (scheduler.counters().*f.field).get();
  e["loads_pending"] = scheduler.loads_pending();
  e["saves_pending"] = scheduler.saves_pending();
  Json reasons = Json::object();
  for (const auto& [reason, n] : scheduler.load_failure_reasons()) reasons[reason] = n;
  e["load_failure_reasons"] = reasons;
  j["workers"] = Json::array();
  j["tiers"] = Json::object();
  for (Worker* w : workers) {
    Json one = worker_metrics_json(*w);
    j["workers"].push_back(one["workers"][0]);
    for (auto& [name, m] : one["tiers"].items()) j["tiers"][name] = m;
  }
  return j;
}

std::string metrics_prometheus(const Scheduler& scheduler, std::span<Worker* const> workers) {
  std::string out;
  auto family = [&](const std::string& name, std::string_view help, std::string_view type) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  for (const Field& f : kEngineFields) {
    const std::string name = fmt::format("libtier_engine_{}_total", f.name);
    family(name, "Offload engine counter (docs/engine.md).", "counter");
    out += fmt::format("{} {}\n", name, (scheduler.counters().*f.field).get());
  }
  family("libtier_engine_loads_pending", "Loads emitted and not yet terminal.", "gauge");
  out += fmt::format("libtier_engine_loads_pending {}\n", scheduler.loads_pending());
  family("libtier_engine_saves_pending", "Saves emitted and not yet terminal.", "gauge");
  out += fmt::format("libtier_engine_saves_pending {}\n", scheduler.saves_pending());
  family("libtier_engine_load_failures_by_reason_total",
         "Failed loads by the reason the first failing rank gave.", "counter");
  for (const auto& [reason, n] : scheduler.load_failure_reasons())
    out += fmt::format("libtier_engine_load_failures_by_reason_total{{reason=\"{}\"}} {}\n", reason,
                       n);
  for (const WorkerField& f : kWorkerFields) {
    const std::string name = fmt::format("libtier_engine_worker_{}_total", f.name);
    family(name, "Offload worker counter, per TP rank.", "counter");
    for (Worker* w : workers)
      out += fmt::format("{}{{rank=\"{}\"}} {}\n", name, w->rank(), (w->counters().*f.field).get());
  }
  family("libtier_engine_loaded_bytes_total", "PAGE and SLOT bytes loaded, by serving tier.",
         "counter");
  for (Worker* w : workers) {
    auto names = tier_names(*w);
    auto loaded = w->loaded_bytes_by_tier();
    for (std::size_t i = 0; i < names.size(); ++i)
      out += fmt::format("libtier_engine_loaded_bytes_total{{rank=\"{}\",tier=\"{}\"}} {}\n",
                         w->rank(), names[i], loaded[i]);
  }
  // Each rank's stack: its tiers labelled rank<r>/<name>, its own series rank="<r>" (the workers
  // keep the stacks alive; formatting reads counters only).
  std::vector<StackExposition> stacks;
  for (Worker* w : workers)
    stacks.push_back({w->with_stack([](TierStack& s) { return &s; }),
                      fmt::format("rank{}/", w->rank()), fmt::format("rank=\"{}\"", w->rank())});
  out += tier::metrics_prometheus(stacks);
  return out;
}

}  // namespace tier::engine
