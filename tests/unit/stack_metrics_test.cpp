// What an operator reads and what a caller is told, over real CPU tiers (docs/metrics.md,
// docs/logging.md): usage gauges, op_duration histograms and the stack's counters in the
// Prometheus text; stat(); NoSpace for an object larger than its tier; a wrong-size load's
// message; the "metrics" and "log" sections of a profile; log levels and the sink.
#include <doctest/doctest.h>

#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "support/test_util.hpp"
#include "tier/log.hpp"
#include "tier/object.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;
using tier::test::key_of;

namespace {

constexpr std::size_t kPayload = 1000;
const std::uint64_t kImage = TierStack::image_bytes(kPayload);

Result<Profile> parse(const std::string& text, ConfigErrors* errors = nullptr) {
  return parse_profile(Json::parse(text), Registry::global(), "<t>", errors);
}

std::unique_ptr<TierStack> open_stack(const std::string& profile) {
  ConfigErrors errors;
  auto p = parse(profile, &errors);
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  auto s = TierStack::open(*p);
  REQUIRE_MESSAGE(s.is_ok(), s.status().to_string());
  return std::move(s).value();
}

std::string cpu_profile(std::size_t objects, const std::string& name = "cpu",
                        const std::string& stage = "") {
  Json tier = {{"name", name},
               {"capacity", std::to_string(objects * kImage + kImage / 2)},
               {"backend", {{"type", "cpu"}}}};
  if (!stage.empty()) tier["stage"] = Json::parse(stage);
  return Json{{"tiers", Json::array({tier})}}.dump();
}

struct Harness {
  std::unique_ptr<TierStack> stack;
  PluginPtr<Codec> codec{nullptr, {}};
  explicit Harness(const std::string& profile) : stack(open_stack(profile)) {
    codec = std::move(Registry::global().create_codec("identity", Json::object())).value();
  }
  static std::vector<std::byte> data_of(std::uint64_t n, std::size_t bytes = kPayload) {
    std::vector<std::byte> d(bytes);
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<std::byte>((n * 131 + i) & 0xff);
    return d;
  }
  // Saves objects first..first+count-1 in one batch.
  std::vector<Status> save(std::uint64_t first, std::size_t count, std::size_t bytes = kPayload) {
    std::vector<std::vector<std::byte>> data;
    std::vector<Region> regions;
    std::vector<SaveItem> items;
    for (std::size_t i = 0; i < count; ++i) data.push_back(data_of(first + i, bytes));
    for (auto& d : data) regions.push_back(host_region(d));
    for (std::size_t i = 0; i < count; ++i)
      items.push_back(SaveItem{key_of(first + i), RegionList(&regions[i], 1)});
    std::vector<Status> out(count);
    REQUIRE(stack->save(items, *codec, out).is_ok());
    return out;
  }
  std::vector<LoadResult> load(std::span<const std::uint64_t> ids, std::size_t bytes = kPayload) {
    std::vector<std::vector<std::byte>> data(ids.size(), std::vector<std::byte>(bytes));
    std::vector<Region> regions;
    std::vector<LoadItem> items;
    for (auto& d : data) regions.push_back(host_region(d));
    for (std::size_t i = 0; i < ids.size(); ++i)
      items.push_back(LoadItem{key_of(ids[i]), RegionList(&regions[i], 1)});
    std::vector<LoadResult> out(ids.size());
    REQUIRE(stack->load(items, *codec, out).is_ok());
    return out;
  }
};

// The value of the sample `series` (name and labels exactly as printed) in Prometheus text.
std::optional<double> sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  return std::nullopt;
}

}  // namespace

TEST_CASE("Histogram: a bucket per upper bound (inclusive), the last takes the rest; count, sum") {
  Histogram h;
  h.observe(std::chrono::microseconds(3));
  h.observe(std::chrono::microseconds(5));  // on the bound: still the first bucket
  h.observe(std::chrono::microseconds(6));
  h.observe(std::chrono::seconds(20));      // past 10 s
  h.observe(std::chrono::nanoseconds(-5));  // a clock that stepped back counts as 0
  CHECK(h.bucket(0) == 3);
  CHECK(h.bucket(1) == 1);
  CHECK(h.bucket(Histogram::kBounds.size()) == 1);
  CHECK(h.count() == 5);
  CHECK(h.sum_seconds() == doctest::Approx(20.000014));
  h.observe(std::chrono::microseconds(7), 4);  // four at once: count and sum of four
  h.observe(std::chrono::microseconds(7), 0);  // none
  CHECK(h.bucket(1) == 5);
  CHECK(h.count() == 9);
  CHECK(h.sum_seconds() == doctest::Approx(20.000042));
}

TEST_CASE("usage: used bytes are the stored images, capacity the tier's, after every call") {
  Harness h(cpu_profile(3));
  CHECK(h.stack->usage(0).used_bytes == 0);
  CHECK(h.stack->usage(0).capacity_bytes == 3 * kImage + kImage / 2);
  for (const Status& s : h.save(0, 2)) CHECK(s.is_ok());
  CHECK(h.stack->usage(0).used_bytes == 2 * kImage);
  CHECK(h.stack->usage(0).objects == 2);
  h.save(2, 3);  // 5 saved, 3 fit: LRU evicts 2
  CHECK(h.stack->usage(0).used_bytes == 3 * kImage);
  CHECK(h.stack->usage(0).objects == 3);
  CHECK(h.stack->tier(0).metrics().evictions.get() == 2);
}

TEST_CASE("op_duration: a save and a load per item, a put and a get per request, misses as none") {
  Harness h(cpu_profile(8));
  h.save(0, 5);
  h.save(0, 2);  // stored already: put-if-absent, still saves and puts
  const std::uint64_t ids[] = {0, 1, 2, 40, 41};
  auto r = h.load(ids);
  CHECK(r[0].status.is_ok());
  CHECK(r[3].status == Code::kNotFound);
  TierStack& s = *h.stack;
  CHECK(s.op_duration(StackOp::kSave, 0).count() == 7);
  CHECK(s.op_duration(StackOp::kPut, 0).count() == 7);
  CHECK(s.op_duration(StackOp::kLoad, 0).count() == 3);
  CHECK(s.op_duration(StackOp::kLoad, -1).count() == 2);
  CHECK(s.op_duration(StackOp::kGet, 0).count() == 5);
  CHECK(s.op_duration(StackOp::kPut, 0).count() == s.tier(0).metrics().of(Op::kPut).requests.get());
  CHECK(s.op_duration(StackOp::kGet, 0).count() == s.tier(0).metrics().of(Op::kGet).requests.get());
  CHECK(s.op_duration(StackOp::kSave, 0).sum_seconds() > 0);
}

TEST_CASE("metrics_prometheus: gauges, the stack's counters, histograms; every line well formed") {
  Harness h(cpu_profile(4, "c\"p\\u"));  // a tier name that needs escaping
  h.save(0, 6);
  const std::uint64_t ids[] = {5, 99};
  h.load(ids);
  const std::string text = h.stack->metrics_prometheus();
  const std::string tier = R"(tier="c\"p\\u")";
  CHECK(sample(text, "libtier_tier_used_bytes{" + tier + "}") == 4.0 * kImage);
  CHECK(sample(text, "libtier_tier_objects{" + tier + "}") == 4);
  CHECK(sample(text, "libtier_tier_capacity_bytes{" + tier + "}") == 4 * kImage + kImage / 2);
  CHECK(sample(text, "libtier_stack_saves_total") == 6);
  CHECK(sample(text, "libtier_stack_load_misses_total") == 1);
  CHECK(sample(text, R"(libtier_op_duration_seconds_count{op="save",)" + tier + "}") == 6);
  CHECK(sample(text,
               R"(libtier_op_duration_seconds_bucket{op="save",)" + tier + R"(,le="+Inf"})") == 6);
  CHECK(sample(text, R"(libtier_op_duration_seconds_count{op="load",tier="none"})") == 1);
  CHECK(sample(text, R"(libtier_ops_total{)" + tier + R"(,op="put",result="ok"})") == 6);
  // HELP/TYPE once per family, then samples: name{labels} value.
  const std::regex comment(R"(# (HELP|TYPE) [a-z_]+ .+)");
  const std::regex series(R"([a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)+\})? [-+0-9.e]+)");
  std::istringstream in(text);
  std::set<std::string> types;
  for (std::string line; std::getline(in, line);) {
    CHECK_MESSAGE((std::regex_match(line, comment) || std::regex_match(line, series)), line);
    if (line.rfind("# TYPE ", 0) == 0) CHECK_MESSAGE(types.insert(line).second, line);
  }
  // The JSON form carries the same.
  const Json j = h.stack->metrics_json();
  CHECK(j["tiers"]["c\"p\\u"]["usage"]["used_bytes"] == 4 * kImage);
  CHECK(j["op_duration"]["save"]["c\"p\\u"]["count"] == 6);
  CHECK(j["op_duration"]["load"]["none"]["count"] == 1);
}

TEST_CASE("an object larger than its tier: NoSpace, as docs/plugins.md says") {
  Harness h(cpu_profile(2));
  auto out = h.save(0, 1, 4 * kPayload);
  CHECK(out[0] == Code::kNoSpace);
  CHECK(std::string(out[0].message()).find("larger than the tier takes") != std::string::npos);
  CHECK(h.stack->counters().save_failures.get() == 1);
}

TEST_CASE(
    "a load into regions of the wrong size: InvalidArgument naming both sizes, nothing written") {
  Harness h(cpu_profile(4));
  h.save(0, 1);
  const std::uint64_t id[] = {0};
  for (std::size_t bytes : {kPayload / 2, kPayload * 2}) {
    auto r = h.load(id, bytes);
    CHECK(r[0].status == Code::kInvalidArgument);
    const std::string m(r[0].status.message());
    CHECK_MESSAGE(
        m.find("stored payload is " + std::to_string(kPayload) + " bytes") != std::string::npos, m);
    CHECK_MESSAGE(m.find("these regions take " + std::to_string(bytes)) != std::string::npos, m);
  }
}

TEST_CASE("stat: the fastest tier holding each key, its payload and stored bytes") {
  Harness h(R"({"tiers": [{"name": "a", "capacity": ")" + std::to_string(2 * kImage) +
            R"(", "backend": "cpu"}, {"name": "b", "capacity": "1MiB", "backend": "cpu"}]})");
  h.save(0, 3);  // 0 is evicted from a (demoted to b); 1 and 2 stay in a
  REQUIRE(h.stack->flush(std::chrono::seconds(5)).is_ok());
  const ObjectKey keys[] = {key_of(0), key_of(2), key_of(7)};
  std::vector<ObjectStat> st(3);
  REQUIRE(h.stack->stat(keys, st).is_ok());
  CHECK(st[0].tier == 1);
  CHECK(st[1].tier == 0);
  CHECK(st[1].payload_bytes == kPayload);
  CHECK(st[1].stored_bytes == kImage);
  CHECK(st[2].tier == -1);
  std::vector<ObjectStat> wrong(2);
  CHECK(h.stack->stat(keys, wrong) == Code::kInvalidArgument);
}

TEST_CASE("stat: a tier with a stage reports the payload's decoded size, not the encoded one") {
  if (Registry::global().find(PluginKind::kStage, "zstd") == nullptr) return;  // no zstd here
  Harness h(cpu_profile(4, "z", R"({"type": "zstd"})"));
  h.save(0, 1);  // data_of() compresses well
  const ObjectKey keys[] = {key_of(0)};
  std::vector<ObjectStat> st(1);
  REQUIRE(h.stack->stat(keys, st).is_ok());
  CHECK(st[0].tier == 0);
  CHECK(st[0].payload_bytes == kPayload);
  CHECK(st[0].stored_bytes < kImage);
}

TEST_CASE("profile \"metrics\": loopback by default, other addresses only when allowed") {
  auto tiers = std::string(R"("tiers": [{"name": "c", "capacity": "1MiB", "backend": "cpu"}])");
  auto p = parse("{" + tiers + R"(, "metrics": {}})");
  REQUIRE(p.is_ok());
  CHECK(p->metrics.enabled);
  CHECK(p->metrics.host == "127.0.0.1");
  CHECK(p->metrics.port == 9464);
  CHECK(p->metrics.timeout_us == 5'000'000);
  CHECK_FALSE(parse("{" + tiers + "}")->metrics.enabled);
  CHECK(parse("{" + tiers + R"(, "metrics": {"listen": "localhost:0"}})")->metrics.port == 0);
  CHECK(parse("{" + tiers + R"(, "metrics": {"listen": "[::1]:9000"}})")->metrics.host == "::1");
  auto error_of = [&](const std::string& metrics) {
    ConfigErrors e;
    CHECK_FALSE(parse("{" + tiers + R"(, "metrics": )" + metrics + "}", &e).is_ok());
    return e.joined();
  };
  CHECK(error_of(R"({"listen": "10.1.2.3:9464"})")
            .find("/metrics/listen: 10.1.2.3 is not a loopback address") != std::string::npos);
  CHECK(parse("{" + tiers + R"(, "metrics": {"listen": "0.0.0.0:9464", "allow_remote": true}})")
            ->metrics.host == "0.0.0.0");
  CHECK(error_of(R"({"listen": "127.0.0.1:65536"})").find("/metrics/listen: port") !=
        std::string::npos);
  CHECK(error_of(R"({"listen": "metrics.example:80"})").find("names are not resolved") !=
        std::string::npos);
  CHECK(error_of(R"({"lisen": "127.0.0.1:1"})")
            .find(R"(/metrics/lisen: unknown option "lisen"; did you mean "listen"?)") !=
        std::string::npos);
  CHECK(error_of(R"({"timeout": "1us"})").find("/metrics/timeout") != std::string::npos);
}

TEST_CASE("log: a profile's level applies until set_log_level; the sink gets what passes") {
  auto tiers = std::string(R"("tiers": [{"name": "c", "capacity": "1MiB", "backend": "cpu"}])");
  ConfigErrors e;
  CHECK_FALSE(parse("{" + tiers + R"(, "log": {"level": "loud"}})", &e).is_ok());
  CHECK(e.joined().find("/log/level") != std::string::npos);
  if (std::getenv("TIER_LOG_LEVEL") != nullptr) return;  // the environment pins the level
  CHECK(log_level() == LogLevel::kWarn);                 // the default
  open_stack("{" + tiers + R"(, "log": {"level": "debug"}})");
  CHECK(log_level() == LogLevel::kDebug);
  set_log_level(LogLevel::kError);
  open_stack("{" + tiers + R"(, "log": {"level": "info"}})");  // pinned: no longer applies
  CHECK(log_level() == LogLevel::kError);
  CHECK_FALSE(set_default_log_level(LogLevel::kInfo));

  struct Seen {
    std::vector<std::pair<LogLevel, std::string>> messages;
  } seen;
  set_log_sink(
      [](void* user, LogLevel level, std::string_view text) {
        static_cast<Seen*>(user)->messages.emplace_back(level, std::string(text));
      },
      &seen);
  log(LogLevel::kWarn, "dropped: below the level");
  log(LogLevel::kError, "kept");
  set_log_level(LogLevel::kDebug);
  log(LogLevel::kDebug, "kept too");
  set_log_sink(nullptr, nullptr);
  log(LogLevel::kError, "to stderr, not to the sink");
  REQUIRE(seen.messages.size() == 2);
  CHECK(seen.messages[0] == std::make_pair(LogLevel::kError, std::string("kept")));
  CHECK(seen.messages[1] == std::make_pair(LogLevel::kDebug, std::string("kept too")));
  CHECK(parse_log_level("verbose").status() == Code::kInvalidArgument);
  set_log_level(LogLevel::kWarn);
}
