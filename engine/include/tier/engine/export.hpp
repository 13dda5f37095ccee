#pragma once
// Exposition of the engine's counters (tier/engine/counters.hpp), each worker's counters, and
// every rank's tier metrics, as JSON and as Prometheus text format 0.0.4.
//
// JSON: {"engine": {load_requests, loaded_tokens, load_failures, save_requests, saved_tokens,
//        loads_pending, saves_pending, ...}, "workers": [{"rank": r, counters...,
//        "loaded_bytes_by_tier": {tier: bytes}}], "tiers": {"rank<r>/<tier>": TierMetrics JSON}}
// Prometheus: libtier_engine_<name>_total counters, libtier_engine_loads_pending and
// libtier_engine_saves_pending gauges, libtier_engine_worker_<name>_total{rank="r"},
// libtier_engine_loaded_bytes_total{rank="r",tier="t"}, and the core's libtier_* tier metrics
// with tier="rank<r>/<tier>".
//
// Threads: call on the scheduler thread (worker_metrics_json: any thread); worker parts are read
// under each worker's lock.

#include <span>
#include <string>

#include "tier/engine/scheduler.hpp"
#include "tier/engine/worker.hpp"

namespace tier::engine {

Json metrics_json(const Scheduler& scheduler, std::span<Worker* const> workers);
// One worker's part of metrics_json ({"workers": [its entry], "tiers": {"rank<r>/<tier>": ...}}),
// for a rank process that holds no Scheduler (docs/engine.md "Ranks as processes").
Json worker_metrics_json(Worker& worker);
std::string metrics_prometheus(const Scheduler& scheduler, std::span<Worker* const> workers);

}  // namespace tier::engine
