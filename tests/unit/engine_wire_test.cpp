// The wire format between a scheduler process and its rank processes (tier/engine/wire.hpp,
// docs/engine.md "Wire format"): round trips, the compact form of a save's keys, a message built
// byte by byte from the documentation, every truncation and corruption refused, the rules for
// additions (unknown sections, longer heads and records), and the simulated engine's scenarios
// with every plan and report sent through the format.
#include <doctest/doctest.h>
#include <xxhash.h>

#include <cstring>
#include <string>

#include "support/engine_scenarios.hpp"
#include "tier/engine/wire.hpp"

using namespace tier;
using namespace tier::engine;
using namespace tier::engine::test;

namespace {

using Bytes = std::vector<std::byte>;

Key128 key(std::uint64_t n) { return Key128{n * 0x9E3779B97F4A7C15ull + 1, n + 0x1000}; }
std::vector<Key128> keys(std::uint64_t from, std::size_t n) {
  std::vector<Key128> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(key(from + i));
  return out;
}

template <class Op>
void same_op(const Op& a, const Op& b) {
  CHECK(a.id == b.id);
  CHECK(a.page_start == b.page_start);
  CHECK(a.page_end == b.page_end);
  CHECK(a.chunk_keys == b.chunk_keys);
  CHECK(a.block_ids == b.block_ids);
  CHECK(a.slot == b.slot);
  CHECK(a.slot_group == b.slot_group);
}
void same_load(const LoadOp& a, const LoadOp& b) {
  same_op(a, b);
  CHECK(a.lease == b.lease);
}
void same_save(const SaveOp& a, const SaveOp& b) {
  same_op(a, b);
  CHECK(a.prefix_keys == b.prefix_keys);
}
void same_plan(const StepPlan& a, const StepPlan& b) {
  CHECK(a.step == b.step);
  REQUIRE(a.loads.size() == b.loads.size());
  REQUIRE(a.saves.size() == b.saves.size());
  for (std::size_t i = 0; i < a.loads.size(); ++i) same_load(a.loads[i], b.loads[i]);
  for (std::size_t i = 0; i < a.saves.size(); ++i) same_save(a.saves[i], b.saves[i]);
}

// A plan with every kind of operation the scheduler emits, and some it does not.
StepPlan sample_plan() {
  StepPlan p;
  p.step = 0x0102030405060708ull;
  LoadOp l1;  // PAGE and SLOT, with a lease
  l1.id = {11, 101};
  l1.page_start = 0;
  l1.page_end = 4096;
  l1.chunk_keys = keys(0, 4);
  l1.block_ids = {7, 3, 9, 1, 8, 2, 6, 4};
  l1.slot = Boundary{4096, key(3)};
  l1.slot_group = 2;
  l1.lease = 0xFEDCBA9876543210ull;
  LoadOp l2;  // PAGE only, no group
  l2.id = {12, 102};
  l2.page_start = 1024;
  l2.page_end = 2048;
  l2.chunk_keys = keys(50, 1);
  l2.block_ids = {5, 0};
  p.loads = {l1, l2};
  SaveOp s1;  // the usual SLOT save: its chunk keys are the tail of its prefix keys
  s1.id = {13, 103};
  s1.page_start = 2048;
  s1.page_end = 8192;
  s1.prefix_keys = keys(100, 8);
  s1.chunk_keys = keys(102, 6);
  s1.block_ids = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21};
  s1.slot = Boundary{8192, key(107)};
  s1.slot_group = 0;
  SaveOp s2;  // PAGE only
  s2.id = {14, 104};
  s2.page_start = 0;
  s2.page_end = 2048;
  s2.chunk_keys = keys(200, 2);
  s2.block_ids = {30, 31, 32, 33};
  SaveOp s3;  // SLOT only: the PAGE part is already saved
  s3.id = {15, 105};
  s3.page_start = 4096;
  s3.page_end = 4096;
  s3.prefix_keys = keys(300, 4);
  s3.slot = Boundary{4096, key(303)};
  s3.slot_group = 1;
  SaveOp s4;  // chunk keys inside the prefix keys, not at its end
  s4.id = {16, 106};
  s4.page_start = 1024;
  s4.page_end = 3072;
  s4.prefix_keys = keys(400, 5);
  s4.chunk_keys = keys(401, 2);
  s4.block_ids = {40, 41, 42, 43};
  s4.slot = Boundary{5120, key(404)};
  s4.slot_group = -1;
  SaveOp s5;  // chunk keys that are not prefix keys
  s5.id = {17, 107};
  s5.page_start = 0;
  s5.page_end = 1024;
  s5.prefix_keys = keys(500, 2);
  s5.chunk_keys = keys(600, 1);
  s5.block_ids = {44, 45};
  s5.slot = Boundary{2048, key(501)};
  s5.slot_group = 3;
  p.saves = {s1, s2, s3, s4, s5};
  return p;
}

std::vector<OpReport> sample_reports() {
  return {OpReport{Channel::kLoad, {11, 101}, 0, WorkerOutcome::kOk},
          OpReport{Channel::kPageSave, {13, 103}, 3, WorkerOutcome::kOk},
          OpReport{Channel::kSlotSave, {13, 103}, 3, WorkerOutcome::kSidecarVisibilityTimeout},
          OpReport{Channel::kLoad, {12, 102}, 63, WorkerOutcome::kPageUnavailable}};
}

Bytes encoded(const StepPlan& p) { return require_value(wire::encode_plan(p)); }

// ---- little-endian pieces, written independently of the encoder ----

void put(Bytes& b, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(static_cast<std::byte>(v >> (8 * i)));
}
void put_key(Bytes& b, const Key128& k) {
  put(b, k.lo, 8);
  put(b, k.hi, 8);
}
std::uint64_t get(const Bytes& b, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(b[at + i]);
  return v;
}
void set(Bytes& b, std::size_t at, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b[at + i] = static_cast<std::byte>(v >> (8 * i));
}
// The header of docs/engine.md in front of `body`.
Bytes frame(std::uint8_t kind, const Bytes& body, std::uint16_t version = 1) {
  Bytes m;
  for (char c : std::string("LTWM")) m.push_back(static_cast<std::byte>(c));
  put(m, version, 2);
  put(m, kind, 1);
  put(m, 0, 1);
  put(m, body.size(), 4);
  put(m, 0, 4);
  put(m, XXH3_64bits(body.data(), body.size()), 8);
  m.insert(m.end(), body.begin(), body.end());
  return m;
}
Bytes body_of(const Bytes& m) { return Bytes(m.begin() + 24, m.end()); }
// A message whose body was edited: the header's length and checksum made to fit again, so only
// the edit can make it fail.
Bytes reseal(const Bytes& m) { return frame(static_cast<std::uint8_t>(m[6]), body_of(m)); }
void section(Bytes& b, std::uint16_t tag, std::uint16_t flags, const Bytes& payload) {
  put(b, tag, 2);
  put(b, flags, 2);
  put(b, payload.size(), 4);
  b.insert(b.end(), payload.begin(), payload.end());
}

Code plan_error(const Bytes& m) {
  auto r = wire::decode_plan(m);
  REQUIRE_FALSE(r.is_ok());
  return r.status().code();
}
Code reports_error(const Bytes& m) {
  auto r = wire::decode_reports(m);
  REQUIRE_FALSE(r.is_ok());
  return r.status().code();
}

// The body offsets of the sample plan's records (their section payloads), in order.
std::vector<std::size_t> record_offsets(const Bytes& m) {
  std::vector<std::size_t> out;
  for (std::size_t at = 24; at < m.size(); at += 8 + get(m, at + 4, 4)) out.push_back(at + 8);
  return out;
}

}  // namespace

TEST_CASE("a plan and reports round-trip with every field") {
  const StepPlan p = sample_plan();
  same_plan(require_value(wire::decode_plan(encoded(p))), p);
  same_plan(require_value(wire::decode_plan(encoded(StepPlan{}))), StepPlan{});

  const auto reports = sample_reports();
  const auto back =
      require_value(wire::decode_reports(require_value(wire::encode_reports(reports))));
  REQUIRE(back.size() == reports.size());
  for (std::size_t i = 0; i < back.size(); ++i) {
    CHECK(back[i].channel == reports[i].channel);
    CHECK(back[i].id == reports[i].id);
    CHECK(back[i].rank == reports[i].rank);
    CHECK(back[i].outcome == reports[i].outcome);
  }
  CHECK(require_value(wire::decode_reports(require_value(wire::encode_reports({})))).empty());
}

TEST_CASE("every worker outcome crosses as its stable number") {
  for (int o = 0; o < kWorkerOutcomeCount; ++o) {
    const OpReport r{Channel::kPageSave, {1, 2}, 0, static_cast<WorkerOutcome>(o)};
    const auto m = require_value(wire::encode_reports(std::span(&r, 1)));
    CHECK(get(m, 24 + 8 + 8 + 1, 1) == (o == 0 ? 1u : 0u));             // ok
    CHECK(get(m, 24 + 8 + 8 + 2, 2) == static_cast<std::uint64_t>(o));  // the outcome's number
    const auto back = require_value(wire::decode_reports(m));
    REQUIRE(back.size() == 1);
    CHECK(back[0].outcome == r.outcome);
  }
}

TEST_CASE("a save's chunk keys that lie in its prefix keys are sent once") {
  StepPlan p;
  p.saves.push_back(sample_plan().saves[0]);  // chunk keys are the prefix keys' tail
  const std::size_t compact = encoded(p).size();
  p.saves[0].chunk_keys.back().hi ^= 1;  // no longer a slice
  CHECK(encoded(p).size() == compact + 16 * p.saves[0].chunk_keys.size());
  // 24 header + 16 step section + 8 section head + 80 record head + 8 prefix keys + 12 block ids.
  CHECK(compact == 24 + 16 + 8 + 80 + 8 * 16 + 12 * 4);
}

TEST_CASE("a message built byte by byte from docs/engine.md decodes field by field") {
  // Plan: step 9; a load with a SLOT and a lease; a save whose chunk keys are prefix keys [1, 3).
  Bytes body;
  Bytes step;
  put(step, 9, 8);
  section(body, 1, 1, step);
  Bytes load;
  put(load, 80, 2);          // head bytes
  put(load, 1, 2);           // flags: has slot
  put(load, 0xFFFFFFFE, 4);  // slot group -2
  put(load, 21, 8);          // request
  put(load, 31, 8);          // generation
  put(load, 0, 8);           // page start
  put(load, 2048, 8);        // page end
  put(load, 77, 8);          // lease
  put(load, 2048, 8);        // slot tokens
  put_key(load, key(1));     // slot key
  put(load, 2, 4);           // chunk count
  put(load, 3, 4);           // block count
  put_key(load, key(0));
  put_key(load, key(1));
  put(load, 5, 4);
  put(load, 6, 4);
  put(load, 7, 4);
  section(body, 2, 1, load);
  Bytes save;
  put(save, 80, 2);        // head bytes
  put(save, 3, 2);         // flags: has slot, chunk keys in the prefix keys
  put(save, 4, 4);         // slot group
  put(save, 22, 8);        // request
  put(save, 32, 8);        // generation
  put(save, 1024, 8);      // page start
  put(save, 3072, 8);      // page end
  put(save, 3072, 8);      // slot tokens
  put_key(save, key(12));  // slot key
  put(save, 2, 4);         // chunk count
  put(save, 1, 4);         // block count
  put(save, 3, 4);         // prefix count
  put(save, 1, 4);         // first chunk key in the prefix keys
  put_key(save, key(10));
  put_key(save, key(11));
  put_key(save, key(12));
  put(save, 8, 4);
  section(body, 3, 1, save);
  const Bytes m = frame(1, body);

  const StepPlan p = require_value(wire::decode_plan(m));
  CHECK(p.step == 9);
  REQUIRE(p.loads.size() == 1);
  REQUIRE(p.saves.size() == 1);
  const LoadOp& l = p.loads[0];
  CHECK(l.id == OperationId{21, 31});
  CHECK(l.page_end == 2048);
  CHECK(l.lease == 77);
  CHECK(l.slot_group == -2);
  CHECK(l.slot == Boundary{2048, key(1)});
  CHECK(l.chunk_keys == keys(0, 2));
  CHECK(l.block_ids == std::vector<std::uint32_t>{5, 6, 7});
  const SaveOp& s = p.saves[0];
  CHECK(s.id == OperationId{22, 32});
  CHECK(s.page_start == 1024);
  CHECK(s.page_end == 3072);
  CHECK(s.slot == Boundary{3072, key(12)});
  CHECK(s.slot_group == 4);
  CHECK(s.prefix_keys == keys(10, 3));
  CHECK(s.chunk_keys == keys(11, 2));
  CHECK(s.block_ids == std::vector<std::uint32_t>{8});
  // The encoder writes exactly these bytes.
  CHECK(encoded(p) == m);

  // Reports: record size 24, two records.
  Bytes rbody;
  Bytes recs;
  put(recs, 24, 2);
  put(recs, 0, 2);
  put(recs, 2, 4);
  put(recs, 2, 1);   // channel slot_save
  put(recs, 0, 1);   // failed
  put(recs, 5, 2);   // sidecar_corrupt
  put(recs, 1, 4);   // rank
  put(recs, 22, 8);  // request
  put(recs, 32, 8);  // generation
  put(recs, 0, 1);   // channel load
  put(recs, 1, 1);   // ok
  put(recs, 0, 2);
  put(recs, 0, 4);
  put(recs, 21, 8);
  put(recs, 31, 8);
  section(rbody, 1, 1, recs);
  const Bytes rm = frame(2, rbody);
  const auto reps = require_value(wire::decode_reports(rm));
  REQUIRE(reps.size() == 2);
  CHECK(reps[0].channel == Channel::kSlotSave);
  CHECK(reps[0].outcome == WorkerOutcome::kSidecarCorrupt);
  CHECK(reps[0].rank == 1);
  CHECK(reps[0].id == OperationId{22, 32});
  CHECK(reps[1].channel == Channel::kLoad);
  CHECK(reps[1].ok());
  CHECK(require_value(wire::encode_reports(reps)) == rm);
}

TEST_CASE("every truncation and every flipped bit of a message is refused") {
  const Bytes m = encoded(sample_plan());
  for (std::size_t n = 0; n < m.size(); ++n) {
    const Bytes cut(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(n));
    CHECK_FALSE(wire::decode_plan(cut).is_ok());
  }
  Bytes extended = m;
  extended.push_back(std::byte{0});
  CHECK(plan_error(extended) == Code::kInvalidArgument);
  for (std::size_t i = 0; i < m.size(); ++i) {
    for (int bit : {0, 7}) {
      Bytes f = m;
      f[i] ^= static_cast<std::byte>(1 << bit);
      auto r = wire::decode_plan(f);
      CHECK_MESSAGE(!r.is_ok(), "byte ", i, " bit ", bit);
    }
  }
  // A flip in the body is caught by the checksum.
  Bytes f = m;
  f[m.size() - 1] ^= std::byte{1};
  CHECK(plan_error(f) == Code::kChecksumMismatch);
  const Bytes rm = require_value(wire::encode_reports(sample_reports()));
  for (std::size_t n = 0; n < rm.size(); ++n)
    CHECK_FALSE(wire::decode_reports(Bytes(rm.begin(), rm.begin() + static_cast<long>(n))).is_ok());
}

TEST_CASE("a well-sealed message with a malformed body is refused with its byte offset") {
  const Bytes m = encoded(sample_plan());
  const auto rec = record_offsets(m);  // step, 2 loads, 5 saves
  REQUIRE(rec.size() == 8);
  auto refused = [&](Bytes edited, const char* what, Code code = Code::kInvalidArgument) {
    auto r = wire::decode_plan(reseal(edited));
    REQUIRE_FALSE(r.is_ok());
    CHECK_MESSAGE(r.status().code() == code, what, ": ", r.status().to_string());
    return r.status().to_string();
  };
  Bytes e = m;
  set(e, rec[1] + 72, 0xFFFFFFFF, 4);  // a load's chunk count: 64 GiB of keys
  CHECK(refused(e, "chunk count").find("at byte") != std::string::npos);
  e = m;
  set(e, rec[1] + 76, 0x40000000, 4);  // its block count
  refused(e, "block count");
  e = m;
  set(e, rec[3] + 72, 0xFFFFFFFF, 4);  // a save's prefix count
  refused(e, "prefix count");
  e = m;
  set(e, rec[3] + 76, 3, 4);  // its first chunk key: [3, +6) of 8 prefix keys
  refused(e, "chunk slice");
  e = m;
  set(e, rec[4] + 76, 1, 4);  // a first index without the slice flag
  refused(e, "first without flag");
  e = m;
  set(e, rec[1], 40, 2);  // a head shorter than version 1's
  refused(e, "short head");
  e = m;
  set(e, rec[1], 0xFFFF, 2);  // a head longer than the record
  refused(e, "long head");
  e = m;
  set(e, rec[1] + 2, 4, 2);  // an unknown record flag
  refused(e, "record flag");
  e = m;
  set(e, rec[2] + 48, 5, 8);  // slot tokens without the slot flag
  refused(e, "slot without flag");
  e = m;
  set(e, rec[0] - 4, 0x10000, 4);  // a section length past the body
  refused(e, "section length");
  e = m;
  set(e, rec[0] - 6, 2, 2);  // an unknown section flag
  refused(e, "section flag");
  e = m;
  set(e, rec[1] - 8, 1, 2);  // a second step section (the load's tag becomes step)
  refused(e, "second step");
  e = m;
  set(e, rec[0] - 8, 9, 2);  // the step section becomes an unknown required section
  refused(e, "unknown required", Code::kNotSupported);
  set(e, rec[0] - 6, 0, 2);  // ... an optional one: skipped, and then there is no step
  refused(e, "no step");
  e = m;
  e.resize(e.size() - 1);  // the last record one byte short
  refused(e, "short record");
  e = m;
  e.insert(e.begin() + 24, std::byte{0});  // a stray byte before the first section
  refused(e, "stray byte");

  // The header.
  e = m;
  e[0] = std::byte{'X'};
  CHECK(plan_error(e) == Code::kInvalidArgument);
  CHECK(plan_error(frame(1, body_of(m), 2)) == Code::kNotSupported);
  CHECK(plan_error(frame(2, body_of(m))) == Code::kInvalidArgument);  // a reports message
  e = m;
  e[7] = std::byte{1};
  CHECK(plan_error(e) == Code::kInvalidArgument);
  e = m;
  e[12] = std::byte{1};
  CHECK(plan_error(e) == Code::kInvalidArgument);
  CHECK(reports_error(m) == Code::kInvalidArgument);  // a plan message
  auto big = wire::decode_plan(m, wire::DecodeLimits{m.size() - 1});
  REQUIRE_FALSE(big.is_ok());
  CHECK(big.status().code() == Code::kNoSpace);
}

TEST_CASE("additions: unknown optional sections are skipped, longer heads and records read") {
  const StepPlan p = sample_plan();
  const Bytes m = encoded(p);
  Bytes body = body_of(m);
  section(body, 0x7001, 0, Bytes(13, std::byte{0xAB}));  // a section of a later version
  same_plan(require_value(wire::decode_plan(frame(1, body))), p);

  // A load record whose head grew by 8 bytes (a field appended by a later version).
  StepPlan one;
  one.loads.push_back(p.loads[0]);
  const Bytes lm = encoded(one);
  const std::size_t rec = record_offsets(lm)[1];
  Bytes grown(lm.begin(), lm.begin() + static_cast<long>(rec + 80));
  put(grown, 0xDDDDDDDDDDDDDDDDull, 8);
  grown.insert(grown.end(), lm.begin() + static_cast<long>(rec + 80), lm.end());
  set(grown, rec, 88, 2);
  set(grown, rec - 4, get(lm, rec - 4, 4) + 8, 4);
  same_plan(require_value(wire::decode_plan(reseal(grown))), one);

  // Report records of 32 bytes.
  const auto reports = sample_reports();
  const Bytes rm = require_value(wire::encode_reports(reports));
  Bytes recs;
  put(recs, 32, 2);
  put(recs, 0, 2);
  put(recs, reports.size(), 4);
  for (std::size_t i = 0; i < reports.size(); ++i) {
    recs.insert(recs.end(), rm.begin() + static_cast<long>(24 + 16 + 24 * i),
                rm.begin() + static_cast<long>(24 + 16 + 24 * (i + 1)));
    put(recs, 0xEEEEEEEEEEEEEEEEull, 8);
  }
  Bytes rbody;
  section(rbody, 1, 1, recs);
  const auto back = require_value(wire::decode_reports(frame(2, rbody)));
  REQUIRE(back.size() == reports.size());
  CHECK(back[2].outcome == WorkerOutcome::kSidecarVisibilityTimeout);
  CHECK(back[3].rank == 63);
}

TEST_CASE("reports with an unknown outcome, channel or ok value are refused") {
  CHECK_FALSE(wire::encode_reports(std::vector<OpReport>{OpReport{
                                       Channel::kLoad, {1, 1}, 0,
                                       static_cast<WorkerOutcome>(kWorkerOutcomeCount)}})
                  .is_ok());
  CHECK_FALSE(wire::encode_reports(std::vector<OpReport>{
                                       OpReport{static_cast<Channel>(3), {1, 1}, 0,
                                                WorkerOutcome::kOk}})
                  .is_ok());
  const Bytes m = require_value(wire::encode_reports(sample_reports()));
  const std::size_t rec = 24 + 16;  // the first record
  Bytes e = m;
  set(e, rec + 2, kWorkerOutcomeCount, 2);  // an outcome after the last one: a later version's
  e = reseal(e);
  CHECK(reports_error(e) == Code::kInvalidArgument);  // on a success
  e = m;
  set(e, rec + 2 * 24 + 2, kWorkerOutcomeCount, 2);  // on a failure
  CHECK(reports_error(reseal(e)) == Code::kNotSupported);
  e = m;
  set(e, rec, 3, 1);
  CHECK(reports_error(reseal(e)) == Code::kInvalidArgument);
  e = m;
  set(e, rec + 1, 2, 1);
  CHECK(reports_error(reseal(e)) == Code::kInvalidArgument);
  e = m;
  set(e, 24 + 8, 16, 2);  // records shorter than version 1's
  CHECK(reports_error(reseal(e)) == Code::kInvalidArgument);
  e = m;
  set(e, 24 + 12, 0x7FFFFFFF, 4);  // a count the section cannot hold
  CHECK(reports_error(reseal(e)) == Code::kInvalidArgument);
}

// The simulated engine with every plan and report through the format: the scenarios of the
// threaded tests behave exactly as without it.
TEST_CASE("over the wire: save then resume bit exact on every rank, TP 2 and TP 8") {
  for (std::uint32_t tp : {2u, 8u}) {
    SimOptions o = sim_options(tp);
    o.wire = true;
    resume_bit_exact_on_every_rank(o);
  }
}

TEST_CASE("over the wire: commits survive a scheduler restart") {
  SimOptions o = sim_options(2);
  o.wire = true;
  commits_survive_restart(o);
}

TEST_CASE("over the wire: a foreign sidecar fails the whole load") {
  SimOptions o = rank1_faulty(2);
  o.wire = true;
  foreign_sidecar_fails_whole_load(o);
}
