#pragma once
// The engine's counters. The first seven carry the reference's names and increment rules:
//   load_requests   +1 per successful aggregated load terminal
//   loaded_tokens   + (page_end - page_start) of that load, counted only on success
//   load_failures   +1 per failed aggregated load
//   save_requests   +1 per save operation once all its channels are terminal (a SLOT-only save
//                   counts with 0 PAGE tokens)
//   saved_tokens    + PAGE tokens of a save, counted when it is emitted
//   loads_pending   gauge: loads emitted and not terminal (abandoned ones excluded)
//   saves_pending   gauge: saves emitted and not terminal
// The rest are libtier's: lookups, SLOT commits and failures, decisions, rejections.
// Duplicate and late terminals are never counted (the Aggregator drops them).
//
// Export (stable names): JSON keys as above; Prometheus `libtier_engine_<name>` (counters with
// `_total`, gauges without); worker and tier metrics are added by tier/engine/export.hpp.

#include <cstdint>

#include "tier/json.hpp"
#include "tier/metrics.hpp"

namespace tier::engine {

struct EngineCounters {
  Counter load_requests, loaded_tokens, load_failures, save_requests, saved_tokens;
  Counter lookups, lookup_hit_tokens;  // lookups; tokens offered by them (after the shrink)
  Counter page_hit_tokens;             // PAGE prefix found, before the SLOT shrink
  Counter lookups_without_commit;      // stateful PAGE hits with no committed boundary
  Counter commits_rediscovered;        // boundaries re-indexed from a persisted commit record
  Counter slot_commits, slot_save_failures, decommits;
  Counter save_failures;  // aggregated PAGE save failures
  Counter loads_skipped;  // after_alloc decisions other than kLoad (with a hit)
  // Lookup leases (EngineConfig::lease_timeout_ms): hits held by a lease; leases that found
  // fewer chunks than the lookup (the hit shrank to what they hold); committed boundaries whose
  // sidecar was gone at lookup (de-committed there instead of failing the load).
  Counter leased_lookups, lease_shortfalls, sidecars_missing;
  // SLOT boundaries the state group moved past before their snapshot could be emitted (the
  // request's previous SLOT save was still in flight, or a forward ran through the boundary):
  // skipped, never snapshotted later (docs/engine.md "Save cadence").
  Counter slot_boundaries_missed;
};

}  // namespace tier::engine
