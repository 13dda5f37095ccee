// tierctl size's one-pass curve (tier/sizing/mrc.hpp) against brute-force LRU simulations that
// count hits as tierbench replay does, on synthetic traces and on the real trace when
// $TIER_TEST_DATA holds it; the trace reader's errors on malformed lines.
#include "tier/sizing/mrc.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "support/lru_model.hpp"
#include "tier/sizing/trace.hpp"

using tier::Code;
using tier::sizing::CurveBuilder;
using tier::sizing::CurveEstimate;
using tier::sizing::CurveOptions;
using tier::sizing::Request;
using tier::test::lru_hits;  // the replay's LRU model, by brute force
using Trace = tier::test::TraceIds;

namespace {

CurveEstimate curve_of(const Trace& trace, CurveOptions options = {}) {
  auto builder = CurveBuilder::create(options);
  REQUIRE(builder.is_ok());
  for (const auto& ids : trace) REQUIRE(builder->add(ids).is_ok());
  return std::move(*builder).finish();
}

std::uint64_t block_count(const Trace& trace) {
  std::uint64_t n = 0;
  for (const auto& ids : trace) n += ids.size();
  return n;
}

// Multi-turn conversations over a small id alphabet: a request extends an earlier one's prefix
// (or starts anew), so equal ids sit under different prefixes, ids repeat inside a request, and
// some requests are empty.
Trace synthetic_trace(unsigned seed, std::size_t requests, std::uint32_t alphabet) {
  std::mt19937 rng(seed);
  Trace t;
  for (std::size_t i = 0; i < requests; ++i) {
    std::vector<std::uint32_t> r;
    if (!t.empty() && rng() % 4 != 0) {
      const auto& base = t[t.size() - 1 - rng() % std::min<std::size_t>(t.size(), 30)];
      r.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(
                                                base.empty() ? 0 : rng() % (base.size() + 1)));
    }
    const std::size_t add = rng() % 7;
    for (std::size_t k = 0; k < add; ++k) r.push_back(rng() % alphabet);
    t.push_back(std::move(r));
  }
  return t;
}

std::string write_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("tier_mrc_test_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

}  // namespace

TEST_CASE("stack distances equal a naive LRU stack's, across renumberings") {
  std::mt19937 rng(7);
  tier::sizing::StackDistances sd;
  std::list<std::uint64_t> stack;    // most recent first
  for (int i = 0; i < 20000; ++i) {  // far past the first 1024 slots: many renumberings
    const std::uint64_t k = rng() % (i < 10000 ? 50 : 700);
    std::uint64_t expected = 0, pos = 1;
    for (auto it = stack.begin(); it != stack.end(); ++it, ++pos)
      if (*it == k) {
        expected = pos;
        stack.erase(it);
        break;
      }
    stack.push_front(k);
    REQUIRE(sd.access(tier::Key128{k, 0}) == expected);
  }
  CHECK(sd.distinct() == stack.size());
}

TEST_CASE("the one-pass curve equals brute-force LRU at every capacity (synthetic traces)") {
  for (unsigned seed : {1u, 2u, 3u, 4u}) {
    const Trace t = synthetic_trace(seed, 400, seed % 2 ? 3 : 40);
    const CurveEstimate e = curve_of(t);
    REQUIRE(e.exact());
    CHECK(e.blocks == block_count(t));
    CHECK(e.requests == t.size());
    const std::uint64_t all = e.tracked + 2;
    for (std::uint64_t c = 0; c <= all; ++c) {
      const double expected = static_cast<double>(lru_hits(t, c)) / e.blocks;
      INFO("seed " << seed << " capacity " << c);
      REQUIRE(e.curve.at(c) == expected);
    }
    // Past saturation nothing changes, and saturation is the first capacity with the most hits.
    CHECK(e.curve.at(e.curve.saturation()) == e.curve.at(UINT64_MAX));
    if (e.curve.saturation() > 0) CHECK(e.curve.at(e.curve.saturation() - 1) < e.curve.max_ratio());
  }
}

TEST_CASE("hits are the leading run of chained blocks, worked by hand") {
  // Blocks [1], [1,2], [3]: at 2 blocks, [3] evicts [1] while [1,2] stays, and request 3 finds
  // [1] missing, so [1,2] present behind it is no hit; at 3 blocks both hit.
  const Trace t = {{1, 2}, {3}, {1, 2}};
  const CurveEstimate e = curve_of(t);
  CHECK(lru_hits(t, 2) == 0);
  CHECK(lru_hits(t, 3) == 2);
  for (std::uint64_t c = 0; c <= 4; ++c)
    CHECK(e.curve.at(c) == static_cast<double>(lru_hits(t, c)) / e.blocks);
  // [2] after [1] is not [2] first: different blocks.
  const CurveEstimate f = curve_of({{1, 2}, {2}});
  CHECK(f.curve.max_ratio() == 0);
}

TEST_CASE("the steps are the whole curve") {
  const Trace t = synthetic_trace(9, 300, 5);
  const CurveEstimate e = curve_of(t);
  const auto steps = e.curve.steps();
  REQUIRE(!steps.empty());
  CHECK(steps.back().blocks == e.curve.saturation());
  double last = 0;
  std::uint64_t last_blocks = 0;
  for (const auto& s : steps) {
    CHECK(s.blocks > last_blocks);
    CHECK(s.hit_ratio > last);
    CHECK(e.curve.at(s.blocks) == s.hit_ratio);
    CHECK(e.curve.at(s.blocks - 1) == last);
    last = s.hit_ratio;
    last_blocks = s.blocks;
  }
}

TEST_CASE("sampling: rate 1 is exact; sampled curves carry an error; bad rates refused") {
  const Trace t = synthetic_trace(5, 2000, 50);
  CurveOptions one;
  one.sample_rate = 1;
  CHECK(curve_of(t, one).exact());
  CurveOptions half;
  half.sample_rate = 0.5;
  const CurveEstimate s = curve_of(t, half);
  CHECK(!s.exact());
  CHECK(s.groups.size() == CurveEstimate::kGroups);
  CHECK(s.sample_rate == 0.5);
  CHECK(s.tracked < curve_of(t).tracked);
  for (std::uint64_t c : {1ul, 10ul, 100ul, 1000ul}) {
    CHECK(s.error_at(c) >= 0);
    CHECK(s.curve.at(c) >= 0);
    CHECK(s.curve.at(c) <= 1);
  }
  for (double bad : {0.0, -0.5, 1.5, std::nan(""), 1e-9}) {
    CurveOptions o;
    o.sample_rate = bad;
    CHECK(CurveBuilder::create(o).status().code() == Code::kInvalidArgument);
  }
}

TEST_CASE("tracking more distinct blocks than max_tracked is NoSpace") {
  CurveOptions o;
  o.max_tracked = 10;
  auto b = CurveBuilder::create(o);
  REQUIRE(b.is_ok());
  CHECK(b->add(std::vector<std::uint32_t>{1, 2, 3, 4, 5}).is_ok());
  const tier::Status st = b->add(std::vector<std::uint32_t>{6, 7, 8, 9, 10, 11});
  CHECK(st.code() == Code::kNoSpace);
  CHECK(std::string(st.message()).find("--sample") != std::string::npos);
}

TEST_CASE("malformed trace lines: an error with the line number") {
  const std::string ok = R"({"timestamp": 0, "input_length": 10, "hash_ids": [1, 2]})";
  const std::pair<std::string, std::string> cases[] = {
      {"{nope", ":3: the line is not valid JSON"},
      {"[1, 2]", ":3: not a JSON object"},
      {R"({"timestamp": 0, "input_length": 1})", ":3: missing \"hash_ids\""},
      {R"({"input_length": 1, "hash_ids": []})", ":3: missing \"timestamp\""},
      {R"({"timestamp": 0, "input_length": 1, "hash_ids": 5})", "hash_ids: expected an array"},
      {R"({"timestamp": 0, "input_length": 1, "hash_ids": [1, -1]})", "hash_ids/1: expected an "},
      {R"({"timestamp": 0, "input_length": 1, "hash_ids": [0.5]})", "hash_ids/0: expected an "},
      {R"({"timestamp": 0, "input_length": 1, "hash_ids": [4294967296]})", "up to 4294967295"},
      {R"({"timestamp": -3, "input_length": 1, "hash_ids": []})", "timestamp: expected an"},
      {R"({"timestamp": 0, "input_length": "7", "hash_ids": []})", "input_length: expected"},
  };
  for (const auto& [line, message] : cases) {
    // A blank line still counts: the bad one is line 3.
    const std::string path = write_file("bad.jsonl", ok + "\n\n" + line + "\n" + ok + "\n");
    auto e = tier::sizing::trace_curve(path, {});
    INFO(line);
    REQUIRE(!e.is_ok());
    CHECK(e.status().code() == Code::kInvalidArgument);
    CHECK(std::string(e.status().message()).find(message) != std::string::npos);
    CHECK(std::string(e.status().message()).find(path + ":3:") == 0);
    std::filesystem::remove(path);
  }
  // A line past the bound, without a newline, is refused without reading it whole.
  const std::string path =
      write_file("long.jsonl", ok + "\n" + std::string(tier::sizing::kMaxTraceLineBytes + 10, ' '));
  auto e = tier::sizing::trace_curve(path, {});
  REQUIRE(!e.is_ok());
  CHECK(std::string(e.status().message()).find(":2: line longer than") != std::string::npos);
  std::filesystem::remove(path);
  CHECK(tier::sizing::trace_curve("/nonexistent/trace.jsonl", {}).status().code() == Code::kNotFound);
}

TEST_CASE("the real trace: the curve equals brute-force LRU at several capacities") {
  const std::string path = tier::test::real_trace_path();
  if (path.empty()) {
    MESSAGE("no mooncake_conversation_trace.jsonl under $TIER_TEST_DATA: case skipped");
    return;
  }
  auto requests = tier::sizing::load_trace(path);
  REQUIRE(requests.is_ok());
  Trace t;
  for (const Request& r : *requests) t.push_back(r.blocks);
  auto e = tier::sizing::trace_curve(path, {});
  REQUIRE(e.is_ok());
  CHECK(e->blocks == block_count(t));
  for (std::uint64_t c : {1ul, 64ul, 1000ul, 5000ul, 8192ul, 40000ul, e->curve.saturation(),
                          e->curve.saturation() - 1}) {
    INFO("capacity " << c);
    CHECK(e->curve.at(c) == static_cast<double>(lru_hits(t, c)) / e->blocks);
  }
}
