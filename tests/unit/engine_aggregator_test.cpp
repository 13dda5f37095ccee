// The offload engine's pure logic: the TP aggregator (reference test_kv_aggregator.py) and the
// config and SLOT cadence rules (reference test_offload_profiles.py / test_dsv4_policy.py).
#include <doctest/doctest.h>

#include "tier/engine/aggregator.hpp"
#include "tier/engine/config.hpp"

using namespace tier;
using namespace tier::engine;

namespace {
OpReport rep(Channel c, std::uint64_t gen, std::uint32_t rank, bool ok, RequestId req = 7) {
  return OpReport{c, OperationId{req, gen}, rank,
                  ok ? WorkerOutcome::kOk : WorkerOutcome::kSidecarSubmission};
}
}  // namespace

TEST_CASE("loading failure wins after all workers report") {
  Aggregator a(2);
  CHECK_FALSE(a.add(rep(Channel::kLoad, 1, 0, false)));
  auto t = a.add(rep(Channel::kLoad, 1, 1, true));
  REQUIRE(t);
  CHECK_FALSE(t->ok());
  CHECK(t->outcome == WorkerOutcome::kSidecarSubmission);
}

TEST_CASE("sidecar save failure waits for every terminal report") {
  Aggregator a(4);
  CHECK_FALSE(a.add(rep(Channel::kSlotSave, 3, 2, false)));
  CHECK_FALSE(a.add(rep(Channel::kSlotSave, 3, 0, true)));
  CHECK_FALSE(a.add(rep(Channel::kSlotSave, 3, 1, true)));
  CHECK(a.pending() == 1);
  auto t = a.add(rep(Channel::kSlotSave, 3, 3, true));
  REQUIRE(t);
  CHECK_FALSE(t->ok());
}

TEST_CASE("partial sidecar save success is not emitted") {
  Aggregator a(2);
  CHECK_FALSE(a.add(rep(Channel::kSlotSave, 5, 0, true)));
  // A duplicate from the same rank does not complete the quorum.
  CHECK_FALSE(a.add(rep(Channel::kSlotSave, 5, 0, true)));
  CHECK(a.pending() == 1);
  auto t = a.add(rep(Channel::kSlotSave, 5, 1, true));
  REQUIRE(t);
  CHECK(t->ok());
}

TEST_CASE("save generations never cross complete") {
  Aggregator a(2);
  // Same request id, two generations: rank 0 reports one, rank 1 the other.
  CHECK_FALSE(a.add(rep(Channel::kPageSave, 10, 0, true)));
  CHECK_FALSE(a.add(rep(Channel::kPageSave, 11, 1, true)));
  CHECK(a.pending() == 2);
  // And channels never cross either: the PAGE report of gen 10 does not complete its SLOT.
  CHECK_FALSE(a.add(rep(Channel::kSlotSave, 10, 1, true)));
  auto t = a.add(rep(Channel::kPageSave, 10, 1, true));
  REQUIRE(t);
  CHECK(t->id.generation == 10);
  CHECK(t->channel == Channel::kPageSave);
}

TEST_CASE("late generation duplicate cannot revive a terminal id") {
  Aggregator a(2);
  a.add(rep(Channel::kLoad, 20, 0, true));
  REQUIRE(a.add(rep(Channel::kLoad, 20, 1, true)));
  CHECK_FALSE(a.add(rep(Channel::kLoad, 20, 0, false)));
  CHECK_FALSE(a.add(rep(Channel::kLoad, 20, 1, false)));
  CHECK(a.pending() == 0);
}

TEST_CASE("a contradictory replay stays failed") {
  Aggregator a(2);
  a.add(rep(Channel::kLoad, 21, 0, false));
  a.add(rep(Channel::kLoad, 21, 0, true));  // the same rank contradicts itself
  auto t = a.add(rep(Channel::kLoad, 21, 1, true));
  REQUIRE(t);
  CHECK_FALSE(t->ok());
}

TEST_CASE("terminal tombstones are bounded and reset") {
  Aggregator a(1, 4);
  for (std::uint64_t g = 1; g <= 10; ++g) REQUIRE(a.add(rep(Channel::kLoad, g, 0, true)));
  CHECK(a.tombstones() == 4);
  // The oldest ids fell out of the bounded FIFO; the newest are still dead.
  CHECK_FALSE(a.add(rep(Channel::kLoad, 10, 0, true)));
  CHECK(a.add(rep(Channel::kLoad, 1, 0, true)));
  a.reset();
  CHECK(a.tombstones() == 0);
  CHECK(a.pending() == 0);
}

TEST_CASE("aggregator ignores out-of-range ranks and generation zero") {
  Aggregator a(2);
  CHECK_FALSE(a.add(rep(Channel::kLoad, 1, 2, true)));
  CHECK_FALSE(a.add(rep(Channel::kLoad, 0, 0, true)));
  CHECK(a.pending() == 0);
}

TEST_CASE("scheduler snaps checkpoint interval before sidecar cadence") {
  EngineConfig c;
  c.block_tokens = 512;  // block 256 x dcp 2
  c.chunk_tokens = 8192;
  c.checkpoint_interval_tokens = 8704 + 100;  // snapped down to 8704
  CHECK(c.sidecar_interval() == 139264);
  c.block_tokens = 8;
  c.chunk_tokens = 24;
  c.checkpoint_interval_tokens = 25;
  CHECK(c.sidecar_interval() == 24);
  c.checkpoint_interval_tokens = 7;  // snaps to 0: off
  CHECK(c.sidecar_interval() == 0);
  c.checkpoint_interval_tokens = 0;
  CHECK(c.sidecar_interval() == 0);
  c.checkpoint_interval_tokens = -1;
  CHECK(c.sidecar_interval() == -1);
}

TEST_CASE("state checkpoint can follow each chunk with dcp one") {
  EngineConfig c;
  c.block_tokens = 256;
  c.chunk_tokens = 256;
  c.checkpoint_interval_tokens = 256;
  CHECK(c.slot_boundaries(1000) == std::vector<std::uint64_t>{256, 512, 768});
}

TEST_CASE("sidecar policy skips off-interval terminal boundary") {
  EngineConfig c;
  c.block_tokens = 4;
  c.chunk_tokens = 4;
  c.checkpoint_interval_tokens = 8;
  // Prompt 20: rungs 8 and 16; the terminal 20 is off the interval and gets no SLOT.
  CHECK(c.slot_boundaries(20) == std::vector<std::uint64_t>{8, 16});
  CHECK_FALSE(c.is_slot_boundary(20, 20));
  CHECK(c.is_slot_boundary(16, 20));
}

TEST_CASE("zero sidecar interval disables every slot save") {
  EngineConfig c;
  c.block_tokens = 4;
  c.chunk_tokens = 4;
  c.checkpoint_interval_tokens = 0;
  CHECK(c.slot_boundaries(20).empty());
  CHECK_FALSE(c.is_slot_boundary(20, 20));
}

TEST_CASE("minus one interval keeps only the prompt-end anchor") {
  EngineConfig c;
  c.block_tokens = 4;
  c.chunk_tokens = 4;
  c.checkpoint_interval_tokens = -1;
  // The anchor is the last chunk boundary strictly before the prompt's end.
  CHECK(c.slot_boundaries(20) == std::vector<std::uint64_t>{16});
  CHECK(c.slot_boundaries(22) == std::vector<std::uint64_t>{20});
  CHECK(c.slot_boundaries(4).empty());
  CHECK(c.is_slot_boundary(20, 22));
  CHECK_FALSE(c.is_slot_boundary(16, 22));
}

TEST_CASE("engine config is strict and reports the JSON pointer") {
  auto bad = EngineConfig::from_json(Json::parse(R"({"chunk_tokens": 100, "block_tokens": 64})"));
  REQUIRE_FALSE(bad.is_ok());
  CHECK(bad.status().message().find("/chunk_tokens") != std::string_view::npos);
  auto typo = EngineConfig::from_json(Json::parse(R"({"chunk_token": 256})"));
  REQUIRE_FALSE(typo.is_ok());
  CHECK(typo.status().message().find("chunk_tokens") != std::string_view::npos);
  auto ok =
      EngineConfig::from_json(Json::parse(R"({"checkpoint_interval_tokens": -1, "tp_size": 8})"));
  REQUIRE_MESSAGE(ok.is_ok(), ok.status().to_string());
  CHECK(ok->tp_size == 8);
  CHECK(ok->to_json()["checkpoint_interval_tokens"] == -1);
  for (const auto& spec : EngineConfig::options()) CHECK_FALSE(spec.doc.empty());
}

TEST_CASE("wait for publication settings are finite, non-negative and the interval positive") {
  auto ok = EngineConfig::from_json(
      Json::parse(R"({"publication_timeout_ms": 5000, "publication_poll_interval_ms": 10})"));
  REQUIRE_MESSAGE(ok.is_ok(), ok.status().to_string());
  CHECK(ok->publication_timeout_ms == 5000);
  CHECK(ok->to_json()["publication_poll_interval_ms"] == 10);
  CHECK(EngineConfig{}.publication_timeout_ms == 0);  // default: exactly one probe
  CHECK(EngineConfig::from_json(Json::parse(R"({"publication_timeout_ms": 0})")).is_ok());
  for (const char* bad : {R"({"publication_timeout_ms": -1})", R"({"publication_timeout_ms": 0.5})",
                          R"({"publication_timeout_ms": "5"})",
                          R"({"publication_timeout_ms": 1e300})",
                          R"({"publication_poll_interval_ms": 0})",
                          R"({"publication_poll_interval_ms": true})"}) {
    auto r = EngineConfig::from_json(Json::parse(bad));
    REQUIRE_FALSE_MESSAGE(r.is_ok(), bad);
    CHECK(r.status().message().find("/publication_") != std::string_view::npos);
  }
  EngineConfig c;
  c.publication_poll_interval_ms = 0;
  CHECK(c.validate().message().find("/publication_poll_interval_ms") != std::string_view::npos);
}

TEST_CASE("reports of another epoch are dropped: a restarted scheduler's generations never meet "
          "the old one's") {
  const std::uint32_t epoch = 5;
  const std::uint64_t mine = (std::uint64_t{epoch} << kEpochShift) + 1;
  const std::uint64_t old = (std::uint64_t{4} << kEpochShift) + 1;
  Aggregator a(2, 16, epoch);
  // The old scheduler's operation with the same counter: both ranks' reports are ignored.
  CHECK_FALSE(a.add(rep(Channel::kPageSave, old, 0, true)));
  CHECK_FALSE(a.add(rep(Channel::kPageSave, old, 1, true)));
  CHECK(a.pending() == 0);
  CHECK_FALSE(a.add(rep(Channel::kPageSave, mine, 0, false)));
  auto t = a.add(rep(Channel::kPageSave, mine, 1, true));
  REQUIRE(t);
  CHECK(t->outcome == WorkerOutcome::kSidecarSubmission);
  CHECK(epoch_of(t->id.generation) == epoch);
}

TEST_CASE("every outcome has a stable name that names it back") {
  for (std::uint8_t i = 0; i < kWorkerOutcomeCount; ++i) {
    const auto o = static_cast<WorkerOutcome>(i);
    CHECK(outcome_from_name(outcome_name(o)) == o);
  }
  CHECK(outcome_name(WorkerOutcome::kOk).empty());
  CHECK(outcome_name(static_cast<WorkerOutcome>(kWorkerOutcomeCount)) == "unknown");
  CHECK_FALSE(outcome_from_name("unknown"));
  CHECK(outcome_name(WorkerOutcome::kSidecarCorrupt) == "sidecar_corrupt");
}
