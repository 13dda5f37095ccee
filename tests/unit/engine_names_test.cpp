// The offload engine driven by the simulated engine (tests/support/engine_sim.hpp): the names it
// gives the outside world. Object keys are deterministic, rank separated where they must be and
// distinct per kind; counters export under the reference's names as JSON and Prometheus.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "support/engine_scenarios.hpp"
#include "tier/engine/export.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

TEST_CASE("cache keys are deterministic and worker rank separated") {
  SimEngine s1(sim_options(2)), s2(sim_options(2));
  const auto a = tokens(70, 2048);
  const auto keys = chunk_keys(s1.o_.config.page_namespace, a, 1024);
  const Boundary b{2048, keys[1]};
  // The same identity gives the same keys in another process (here: another engine).
  for (std::uint32_t r = 0; r < 2; ++r) {
    CHECK(s1.workers[r]->page_key(keys[0]) == s2.workers[r]->page_key(keys[0]));
    CHECK(s1.workers[r]->slot_key(b) == s2.workers[r]->slot_key(b));
    CHECK(s1.workers[r]->commit_key(b) == s2.workers[r]->commit_key(b));
  }
  // PAGE and sidecar keys are rank-local; the commit record is one per boundary.
  CHECK_FALSE(s1.workers[0]->page_key(keys[0]) == s1.workers[1]->page_key(keys[0]));
  CHECK_FALSE(s1.workers[0]->slot_key(b) == s1.workers[1]->slot_key(b));
  CHECK(s1.workers[0]->commit_key(b) == s1.workers[1]->commit_key(b));
  // PAGE, sidecar and commit ids never coincide, and another boundary is another key.
  const auto& w = *s1.workers[0];
  CHECK_FALSE(w.page_key(keys[1]).id == w.slot_key(b).id);
  CHECK_FALSE(w.slot_key(b).id == w.commit_key(b).id);
  CHECK_FALSE(w.slot_key(b) == w.slot_key(Boundary{1024, keys[0]}));
  // Another PAGE namespace (model identity) moves every key.
  auto o = sim_options(2);
  o.config.page_namespace = namespace_id(Json{{"model", "other"}}).value();
  SimEngine s3(o);
  CHECK_FALSE(s3.workers[0]->page_key(keys[0]) == w.page_key(keys[0]));
  CHECK_FALSE(s3.workers[0]->slot_key(b) == w.slot_key(b));
  CHECK_FALSE(s3.workers[0]->commit_key(b) == w.commit_key(b));
}

TEST_CASE("counters export the reference names as json and prometheus") {
  SimEngine sim(sim_options());
  const auto a = tokens(56, 8192 + 8);
  sim.run(1, a);
  sim.run(2, a);
  std::vector<Worker*> ws;
  for (auto& w : sim.workers) ws.push_back(w.get());
  Json j = metrics_json(*sim.sched, ws);
  for (const char* k : {"load_requests", "loaded_tokens", "load_failures", "save_requests",
                        "saved_tokens", "loads_pending", "saves_pending"})
    CHECK(j["engine"].contains(k));
  CHECK(j["engine"]["load_requests"] == 1);
  CHECK(j["engine"]["loaded_tokens"] == 8192);
  CHECK(j["engine"]["saved_tokens"] == 8192);
  CHECK(j["workers"].size() == 2);
  CHECK(j["workers"][1]["loaded_bytes_by_tier"]["cpu"].get<std::uint64_t>() > 0);
  CHECK(j["tiers"].contains("rank1/cpu"));
  const std::string p = metrics_prometheus(*sim.sched, ws);
  CHECK(p.find("libtier_engine_load_requests_total 1\n") != std::string::npos);
  CHECK(p.find("libtier_engine_loaded_tokens_total 8192\n") != std::string::npos);
  CHECK(p.find("libtier_engine_saves_pending 0\n") != std::string::npos);
  CHECK(p.find("# TYPE libtier_engine_loads_pending gauge") != std::string::npos);
  CHECK(p.find("tier=\"rank1/cpu\"") != std::string::npos);
  // Each rank's stack: usage gauges, the stack's counters and latencies, labelled by rank.
  CHECK(p.find("libtier_tier_used_bytes{tier=\"rank1/cpu\"} ") != std::string::npos);
  CHECK(p.find("libtier_stack_saves_total{rank=\"1\"} ") != std::string::npos);
  CHECK(p.find("libtier_op_duration_seconds_count{op=\"save\",tier=\"rank0/cpu\",rank=\"0\"} ") !=
        std::string::npos);
  CHECK(p.find("# TYPE libtier_stack_saves_total counter") == p.rfind("# TYPE libtier_stack_saves_total"));
}
