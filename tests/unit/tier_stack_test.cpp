// TierStack over real CPU tiers (and the mock plugin for faults): LRU order, demotion and
// promotion, bounded write-through, namespace isolation, put-if-absent, corruption never served.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "support/fault_backend.hpp"
#include "support/test_util.hpp"
#include "tier/object.hpp"
#include "tier/profile.hpp"
#include "tier/registry.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;
using tier::test::key_of;

namespace {

constexpr std::size_t kPayload = 1000;
const std::uint64_t kImage = TierStack::image_bytes(kPayload);

std::unique_ptr<TierStack> open_stack(const std::string& profile) {
  REQUIRE(Registry::global().load("mock").is_ok());
  ConfigErrors errors;
  auto p = parse_profile(Json::parse(profile), Registry::global(), "<t>", &errors);
  REQUIRE_MESSAGE(p.is_ok(), errors.joined());
  auto s = TierStack::open(*p);
  REQUIRE_MESSAGE(s.is_ok(), s.status().to_string());
  return std::move(s).value();
}

// `objects` objects fit in a tier of this capacity, not one more.
std::string cap(std::size_t objects) { return std::to_string(objects * kImage + kImage / 2); }

struct Harness {
  std::unique_ptr<TierStack> stack;
  PluginPtr<Codec> codec{nullptr, {}};
  explicit Harness(const std::string& profile) : stack(open_stack(profile)) {
    codec = std::move(Registry::global().create_codec("identity", Json::object())).value();
  }
  static std::vector<std::byte> data_of(std::uint64_t n) {
    std::vector<std::byte> d(kPayload);
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = static_cast<std::byte>((n * 131 + i) & 0xff);
    return d;
  }
  Status save(const ObjectKey& k, std::uint64_t content) {
    auto d = data_of(content);
    Region r = host_region(d);
    Status out;
    REQUIRE(stack->save(std::span<const SaveItem>({SaveItem{k, RegionList(&r, 1)}}), *codec,
                        std::span(&out, 1)).is_ok());
    return out;
  }
  // Loads k; returns the tier that served it (-1 on a miss) and the bytes in `got`.
  LoadResult load(const ObjectKey& k, std::vector<std::byte>& got) {
    got.assign(kPayload, std::byte{0xEE});
    Region r = host_region(got);
    LoadResult out;
    REQUIRE(stack->load(std::span<const LoadItem>({LoadItem{k, RegionList(&r, 1)}}), *codec,
                        std::span(&out, 1)).is_ok());
    return out;
  }
  bool has(const ObjectKey& k) { return stack->locate(k).value_or(-1) >= 0; }
};

// The faulty backend registered, its controls reset: how each test of it starts.
tier::test::FaultControl& fresh_faults() {
  tier::test::register_faulty_backend();
  tier::test::FaultControl& fc = tier::test::fault_control();
  fc.reset();
  return fc;
}

}  // namespace

TEST_CASE("save then load round-trips and reports the tier") {
  Harness h(R"({"tiers":[{"name":"cpu","capacity":"1MiB","backend":"cpu"}]})");
  REQUIRE(h.save(key_of(1), 1).is_ok());
  std::vector<std::byte> got;
  LoadResult r = h.load(key_of(1), got);
  CHECK(r.status.is_ok());
  CHECK(r.tier == 0);
  CHECK(got == Harness::data_of(1));
  CHECK(h.load(key_of(2), got).status.code() == Code::kNotFound);
  CHECK(got == std::vector<std::byte>(kPayload, std::byte{0xEE}));  // a miss writes nothing
}

TEST_CASE("batches of thousands and single requests, in turn, each get their own completions") {
  // The stack's table of requests in flight grows for a large batch, gives its memory back when
  // it empties, and reuses slots: every item must still get the completion of its own request.
  Harness h(R"({"tiers":[{"name":"cpu","capacity":"64MiB","backend":"cpu"}]})");
  for (std::uint64_t round = 0; round < 3; ++round) {
    const std::size_t n = round == 1 ? 1 : 5000;
    std::vector<std::vector<std::byte>> data, got(n, std::vector<std::byte>(kPayload));
    std::vector<Region> src, dst;
    std::vector<SaveItem> saves;
    std::vector<LoadItem> loads;
    for (std::size_t i = 0; i < n; ++i) data.push_back(Harness::data_of(round * 10000 + i));
    for (std::size_t i = 0; i < n; ++i) {
      src.push_back(host_region(data[i]));
      dst.push_back(host_region(got[i]));
    }
    for (std::size_t i = 0; i < n; ++i) {
      const ObjectKey k = key_of(round * 10000 + i);
      saves.push_back(SaveItem{k, RegionList(&src[i], 1)});
      loads.push_back(LoadItem{k, RegionList(&dst[i], 1)});
    }
    std::vector<Status> saved(n);
    std::vector<LoadResult> loaded(n);
    REQUIRE(h.stack->save(saves, *h.codec, saved).is_ok());
    REQUIRE(h.stack->load(loads, *h.codec, loaded).is_ok());
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(saved[i].is_ok());
      CHECK(loaded[i].status.is_ok());
      CHECK(got[i] == data[i]);
    }
  }
}

TEST_CASE("LRU order: the least recently used object is evicted first") {
  Harness h(R"({"tiers":[{"name":"cpu","capacity":)" + cap(3) + R"(,"backend":"cpu"}]})");
  for (int i = 1; i <= 3; ++i) REQUIRE(h.save(key_of(i), i).is_ok());
  std::vector<std::byte> got;
  REQUIRE(h.load(key_of(1), got).status.is_ok());  // 1 becomes most recent; 2 is now oldest
  REQUIRE(h.save(key_of(4), 4).is_ok());
  CHECK(h.has(key_of(1)));
  CHECK_FALSE(h.has(key_of(2)));
  CHECK(h.has(key_of(3)));
  CHECK(h.has(key_of(4)));
  CHECK(h.save(key_of(3), 3).is_ok());  // put-if-absent of a stored key refreshes it
  REQUIRE(h.save(key_of(5), 5).is_ok());
  CHECK(h.has(key_of(3)));
  CHECK_FALSE(h.has(key_of(1)));
  CHECK(h.stack->tier(0).metrics().evictions.get() == 2);
  CHECK(h.stack->tier(0).usage().used_bytes <= 3 * kImage);
}

TEST_CASE("evicted objects are demoted to the next tier and promoted back on a hit") {
  Harness h(R"({"tiers":[{"name":"fast","capacity":)" + cap(2) + R"(,"backend":"cpu"},
                         {"name":"slow","capacity":"1MiB","backend":"cpu","write":false}]})");
  // Demotion needs a writable next tier: with "write": false below, evicted objects are dropped.
  for (int i = 1; i <= 3; ++i) REQUIRE(h.save(key_of(i), i).is_ok());
  CHECK_FALSE(h.has(key_of(1)));
  CHECK(h.stack->tier(1).usage().objects == 0);

  Harness d(R"({"tiers":[{"name":"fast","capacity":)" + cap(2) + R"(,"backend":"cpu"},
                         {"name":"slow","capacity":"1MiB","backend":"cpu"}]})");
  for (int i = 1; i <= 3; ++i) REQUIRE(d.save(key_of(i), i).is_ok());
  REQUIRE(d.stack->flush(std::chrono::seconds(5)).is_ok());
  CHECK(d.stack->tier(0).usage().objects == 2);
  CHECK(d.stack->tier(1).usage().objects == 3);  // written through, and 1 demoted (already there)
  std::vector<std::byte> got;
  LoadResult r = d.load(key_of(1), got);
  REQUIRE(r.status.is_ok());
  CHECK(r.tier == 1);
  CHECK(got == Harness::data_of(1));
  REQUIRE(d.stack->flush(std::chrono::seconds(5)).is_ok());
  CHECK(d.stack->tier(1).metrics().promotions.get() == 1);
  CHECK(d.load(key_of(1), got).tier == 0);  // promoted into the fast tier
}

TEST_CASE("demotion reaches a tier that is not written through") {
  Harness h(R"({"tiers":[{"name":"fast","capacity":)" + cap(2) + R"(,"backend":"cpu"},
                         {"name":"slow","capacity":"1MiB","backend":"mock"}],
               "stack":{"max_inflight_bytes":"64MiB"}})");
  for (int i = 1; i <= 3; ++i) REQUIRE(h.save(key_of(i), i).is_ok());
  REQUIRE(h.stack->flush(std::chrono::seconds(5)).is_ok());
  CHECK(h.stack->tier(0).metrics().demotions.get() == 1);
  std::vector<std::byte> got;
  CHECK(h.load(key_of(1), got).tier == 1);
}

TEST_CASE("on_evict drop discards evicted objects") {
  Harness h(R"({"tiers":[{"name":"fast","capacity":)" + cap(1) + R"(,"backend":"cpu","on_evict":"drop"},
                         {"name":"slow","capacity":"1MiB","backend":"mock","write":false}]})");
  REQUIRE(h.save(key_of(1), 1).is_ok());
  REQUIRE(h.save(key_of(2), 2).is_ok());
  CHECK(h.stack->tier(0).metrics().demotions.get() == 0);
  CHECK_FALSE(h.has(key_of(1)));
}

TEST_CASE("write-through beyond the in-flight bound is dropped and counted; the caller never stalls") {
  // The bound admits one background image at a time; the mock completes synchronously, so
  // consecutive saves fit, but a batch of several does not.
  Harness h(R"({"tiers":[{"name":"fast","capacity":"1MiB","backend":"cpu"},
                         {"name":"slow","capacity":"1MiB","backend":"mock"}],
               "stack":{"max_inflight_bytes":)" + std::to_string(kImage + 10) + "}}");
  std::vector<std::vector<std::byte>> data;
  std::vector<Region> regions(5);
  std::vector<SaveItem> items;
  for (int i = 0; i < 5; ++i) data.push_back(Harness::data_of(i));
  for (int i = 0; i < 5; ++i) {
    regions[i] = host_region(data[i]);
    items.push_back(SaveItem{key_of(100 + i), RegionList(&regions[i], 1)});
  }
  std::vector<Status> out(5);
  REQUIRE(h.stack->save(items, *h.codec, out).is_ok());
  for (const auto& s : out) CHECK(s.is_ok());  // the fast tier took them all
  REQUIRE(h.stack->flush(std::chrono::seconds(5)).is_ok());
  std::uint64_t dropped = h.stack->counters().writethrough_dropped.get();
  CHECK(dropped >= 1);
  CHECK(h.stack->tier(1).metrics().dropped_saves.get() == dropped);
  CHECK(h.stack->tier(1).usage().objects == 5 - dropped);
}

TEST_CASE("a failing lower tier does not fail the save; its failures are counted") {
  Harness h(R"({"plugins":["mock"],"tiers":[{"name":"fast","capacity":"1MiB","backend":"cpu"},
      {"name":"slow","capacity":"1MiB","backend":{"type":"mock","fail_every":1,"fail_op":"put"}}]})");
  CHECK(h.save(key_of(1), 1).is_ok());
  REQUIRE(h.stack->flush(std::chrono::seconds(5)).is_ok());
  CHECK(h.stack->tier(1).metrics().of(Op::kPut).errors.get() == 1);
  CHECK(h.stack->tier(1).metrics().dropped_saves.get() == 1);
}

TEST_CASE("namespaces never hit each other") {
  Harness h(R"({"tiers":[{"name":"cpu","capacity":"1MiB","backend":"cpu"}]})");
  Key128 ns_a = *namespace_id(Json{{"model", "a"}}), ns_b = *namespace_id(Json{{"model", "b"}});
  Key128 id{42, 42};
  REQUIRE(h.save(ObjectKey{ns_a, id, 0}, 1).is_ok());
  std::vector<std::byte> got;
  CHECK(h.load(ObjectKey{ns_b, id, 0}, got).status.code() == Code::kNotFound);
  CHECK(h.load(ObjectKey{ns_a, id, 1}, got).status.code() == Code::kNotFound);  // other rank
  CHECK(h.load(ObjectKey{ns_a, id, 0}, got).status.is_ok());
}

TEST_CASE("put-if-absent: a second save of a key keeps the first bytes") {
  Harness h(R"({"tiers":[{"name":"cpu","capacity":"1MiB","backend":"cpu"}]})");
  REQUIRE(h.save(key_of(9), 1).is_ok());
  CHECK(h.save(key_of(9), 2).is_ok());
  std::vector<std::byte> got;
  REQUIRE(h.load(key_of(9), got).status.is_ok());
  CHECK(got == Harness::data_of(1));
  CHECK(h.stack->tier(0).metrics().of(Op::kPut).misses.get() == 1);
}

TEST_CASE("a flipped byte in a stored object is a checksum failure, never returned") {
  Harness h(R"({"plugins":["mock"],"tiers":[
      {"name":"rot","capacity":"1MiB","backend":{"type":"mock","corrupt_stored":true}}]})");
  REQUIRE(h.save(key_of(3), 3).is_ok());
  std::vector<std::byte> got;
  LoadResult r = h.load(key_of(3), got);
  CHECK(r.status.code() == Code::kChecksumMismatch);
  CHECK(got == std::vector<std::byte>(kPayload, std::byte{0xEE}));  // nothing handed out
  CHECK(h.stack->tier(0).metrics().checksum_failures.get() == 1);
  REQUIRE(h.stack->flush(std::chrono::seconds(5)).is_ok());
  CHECK_FALSE(h.has(key_of(3)));  // the corrupt copy was removed so it can be stored again
}

TEST_CASE("a corrupt copy in a fast tier falls through to a good copy below") {
  Harness h(R"({"plugins":["mock"],"tiers":[
      {"name":"rot","capacity":"1MiB","backend":{"type":"mock","corrupt_stored":true}},
      {"name":"good","capacity":"1MiB","backend":"cpu"}]})");
  REQUIRE(h.save(key_of(4), 4).is_ok());
  REQUIRE(h.stack->flush(std::chrono::seconds(5)).is_ok());
  std::vector<std::byte> got;
  LoadResult r = h.load(key_of(4), got);
  CHECK(r.status.is_ok());
  CHECK(r.tier == 1);
  CHECK(got == Harness::data_of(4));
}

TEST_CASE("lookup_prefix stops at the first missing key; remove clears every tier") {
  Harness h(R"({"tiers":[{"name":"a","capacity":"1MiB","backend":"cpu"},
                         {"name":"b","capacity":"1MiB","backend":"cpu"}]})");
  for (int i : {0, 1, 2, 4}) REQUIRE(h.save(key_of(i), i).is_ok());
  REQUIRE(h.stack->flush(std::chrono::seconds(5)).is_ok());
  std::vector<ObjectKey> keys;
  for (int i = 0; i < 6; ++i) keys.push_back(key_of(i));
  CHECK(*h.stack->lookup_prefix(keys) == 3);
  CHECK(h.stack->remove(key_of(1)).is_ok());
  CHECK(*h.stack->lookup_prefix(keys) == 1);
  CHECK(h.stack->tier(1).usage().objects == 3);
  CHECK(h.stack->remove(key_of(77)).is_ok());  // absent everywhere: fine
}

TEST_CASE("remove of many keys: batched per tier, each key with its own outcome") {
  Harness h(R"({"tiers":[{"name":"a","capacity":"4MiB","backend":"cpu"},
                         {"name":"b","capacity":"4MiB","backend":"cpu"}]})");
  // 150 keys (more than one submit's batch): the even ones stored in both tiers, the odd ones
  // nowhere; one more key stored and not removed.
  std::vector<ObjectKey> keys;
  for (int i = 0; i < 150; ++i) keys.push_back(key_of(i));
  for (int i = 0; i < 150; i += 2) REQUIRE(h.save(key_of(i), i).is_ok());
  REQUIRE(h.save(key_of(500), 500).is_ok());
  REQUIRE(h.stack->flush(std::chrono::seconds(5)).is_ok());
  REQUIRE(h.stack->tier(1).usage().objects == 76);
  std::vector<Status> out(keys.size(), Status(Code::kBadState, "not set"));
  REQUIRE(h.stack->remove(keys, out).is_ok());
  for (std::size_t i = 0; i < out.size(); ++i) CHECK_MESSAGE(out[i].is_ok(), i);
  CHECK(h.stack->tier(0).usage().objects == 1);
  CHECK(h.stack->tier(1).usage().objects == 1);
  CHECK(h.has(key_of(500)));
  CHECK_FALSE(h.has(key_of(0)));
  CHECK(h.stack->remove(std::span<const ObjectKey>(), std::span<Status>()).is_ok());
  CHECK(h.stack->remove(keys, std::span(out).first(1)).code() == Code::kInvalidArgument);
}

TEST_CASE("location policy: a hit in a tier that is not readable is never served") {
  // Puts go to the first writable tier; finds and reads use only readable tiers (the reference's
  // store location vs retrieve locations: a CPU hit outside a disk-only policy is not served).
  Harness h(R"({"tiers":[{"name":"staging","capacity":"1MiB","backend":"cpu","read":false},
                         {"name":"slow","capacity":"1MiB","backend":"cpu","write":false}]})");
  REQUIRE(h.save(key_of(1), 1).is_ok());
  REQUIRE(h.stack->flush(std::chrono::seconds(5)).is_ok());
  CHECK(h.stack->tier(0).usage().objects == 1);
  CHECK(h.stack->tier(1).usage().objects == 0);
  std::vector<std::byte> got;
  CHECK(h.load(key_of(1), got).status.code() == Code::kNotFound);
  CHECK_FALSE(h.has(key_of(1)));
  const ObjectKey one = key_of(1);
  CHECK(*h.stack->lookup_prefix(std::span(&one, 1)) == 0);
  CHECK(h.stack->tier(0).metrics().of(Op::kGet).requests.get() == 0);
  // Written through to a readable tier, the same object is served from there.
  Harness d(R"({"tiers":[{"name":"staging","capacity":"1MiB","backend":"cpu","read":false},
                         {"name":"slow","capacity":"1MiB","backend":"cpu"}]})");
  REQUIRE(d.save(key_of(1), 1).is_ok());
  REQUIRE(d.stack->flush(std::chrono::seconds(5)).is_ok());
  LoadResult r = d.load(key_of(1), got);
  REQUIRE(r.status.is_ok());
  CHECK(r.tier == 1);
  CHECK(got == Harness::data_of(1));
}

TEST_CASE("a remove that fails in some tier is reported") {
  Harness h(R"({"plugins":["mock"],"tiers":[{"name":"a","capacity":"1MiB","backend":"cpu"},
      {"name":"b","capacity":"1MiB","backend":{"type":"mock","fail_every":1,"fail_op":"remove"}}]})");
  REQUIRE(h.save(key_of(1), 1).is_ok());
  CHECK(h.stack->remove(key_of(1)).code() == Code::kIoError);
  // In a batch, every key that tier b fails is reported, stored in a or not.
  REQUIRE(h.save(key_of(2), 2).is_ok());
  const std::vector<ObjectKey> keys{key_of(2), key_of(3)};
  std::vector<Status> out(2);
  REQUIRE(h.stack->remove(keys, out).is_ok());
  CHECK(out[0].code() == Code::kIoError);
  CHECK(out[1].code() == Code::kIoError);
  CHECK(h.stack->tier(0).usage().objects == 0);  // a removed what it held
}

TEST_CASE("a load with regions that do not match the stored size is refused, not truncated") {
  Harness h(R"({"tiers":[{"name":"cpu","capacity":"1MiB","backend":"cpu"}]})");
  REQUIRE(h.save(key_of(5), 5).is_ok());
  std::vector<std::byte> small(kPayload / 2);
  Region r = host_region(small);
  LoadResult out;
  REQUIRE(h.stack->load(std::span<const LoadItem>({LoadItem{key_of(5), RegionList(&r, 1)}}),
                        *h.codec, std::span(&out, 1)).is_ok());
  CHECK_FALSE(out.status.is_ok());
}

TEST_CASE("metrics are exported as JSON and Prometheus text") {
  Harness h(R"({"tiers":[{"name":"cpu","capacity":"1MiB","backend":"cpu"}]})");
  REQUIRE(h.save(key_of(1), 1).is_ok());
  std::vector<std::byte> got;
  h.load(key_of(1), got);
  h.load(key_of(2), got);
  Json j = h.stack->metrics_json();
  CHECK(j["tiers"]["cpu"]["get"]["ok"] == 1);
  CHECK(j["tiers"]["cpu"]["get"]["misses"] == 1);
  CHECK(j["tiers"]["cpu"]["put"]["bytes"] == kImage);
  CHECK(j["stack"]["saves"] == 1);
  std::string prom = h.stack->metrics_prometheus();
  CHECK(prom.find("# TYPE libtier_ops_total counter") != std::string::npos);
  CHECK(prom.find(R"(libtier_ops_total{tier="cpu",op="get",result="ok"} 1)") != std::string::npos);
  CHECK(prom.find(R"(libtier_ops_total{tier="cpu",op="get",result="miss"} 1)") != std::string::npos);
  CHECK(prom.find(R"(libtier_checksum_failures_total{tier="cpu"} 0)") != std::string::npos);
}

TEST_CASE("an optional tier whose backend cannot run here is left out; a required one fails") {
  const std::string tiers = R"({"name":"cpu","capacity":"1MiB","backend":"cpu"},
      {"name":"x","capacity":"1MiB","backend":{"type":"mock","unsupported":true})";
  Harness h(R"({"plugins":["mock"],"tiers":[)" + tiers + R"(,"optional":true}]})");
  CHECK(h.stack->tier_count() == 1);
  REQUIRE(h.stack->skipped_tiers().size() == 1);
  CHECK(h.stack->skipped_tiers()[0] ==
        R"(x: backend "mock" failed to start: this machine lacks what the mock needs)");
  CHECK(h.save(key_of(1), 1).is_ok());

  auto p = parse_profile(Json::parse(R"({"plugins":["mock"],"tiers":[)" + tiers + "}]}"),
                         Registry::global(), "<t>");
  REQUIRE(p.is_ok());
  auto required = TierStack::open(*p);
  CHECK(required.status().code() == Code::kNotSupported);
  CHECK(std::string(required.status().message()).rfind("/tiers/1/backend: ", 0) == 0);
}

TEST_CASE("a save from several regions into a gather tier stores exactly the identity image") {
  // One writable cpu tier (gather_puts): the stack puts a header and the caller's regions.
  Harness h(R"({"tiers":[{"name":"cpu","capacity":"1MiB","backend":"cpu"}]})");
  REQUIRE(h.stack->tier(0).capabilities().gather_puts);
  std::vector<std::byte> a = Harness::data_of(7), b(24, std::byte{0x5A}), none;
  const Region src[] = {host_region(a), host_region(none), host_region(b)};
  std::vector<SaveItem> items{{key_of(7), RegionList(src)}, {key_of(8), RegionList(src, 1)}};
  Status out[2];
  REQUIRE(h.stack->save(items, *h.codec, out).is_ok());
  CHECK(out[0].is_ok());
  CHECK(out[1].is_ok());
  // The stored image is the one the staged path builds: header + concatenated regions.
  std::vector<std::byte> payload(a);
  payload.insert(payload.end(), b.begin(), b.end());
  std::vector<std::byte> image(kObjectHeaderBytes + payload.size());
  std::memcpy(image.data() + kObjectHeaderBytes, payload.data(), payload.size());
  seal_object(image, kIdentityLayoutId, 0, key_of(7));
  std::vector<std::byte> stored(image.size());
  IoRequest get{Op::kGet, key_of(7), host_region(stored), 1};
  REQUIRE(h.stack->tier(0).submit(std::span(&get, 1)).value_or(0) == 1);
  Completion c;
  REQUIRE(h.stack->tier(0).poll(std::span(&c, 1), 1, std::chrono::seconds(1)).value_or(0) == 1);
  CHECK(c.status.is_ok());
  CHECK(stored == image);
  std::vector<std::byte> got(payload.size());
  Region dst = host_region(got);
  LoadResult r;
  REQUIRE(h.stack->load(std::span<const LoadItem>({LoadItem{key_of(7), RegionList(&dst, 1)}}),
                        *h.codec, std::span(&r, 1)).is_ok());
  CHECK(r.status.is_ok());
  CHECK(got == payload);
  CHECK(h.load(key_of(8), got).status.is_ok());
  CHECK(got == a);
  CHECK(h.stack->metrics_json()["tiers"]["cpu"]["put"]["bytes"] ==
        2 * kObjectHeaderBytes + payload.size() + a.size());
}

TEST_CASE("tail regions reach only tiers that declare gather_puts or scatter_gets") {
  Harness h(R"({"plugins":["mock"],"tiers":[{"name":"m","capacity":"1MiB","backend":"mock"},
                                            {"name":"cpu","capacity":"1MiB","backend":"cpu"}]})");
  std::vector<std::byte> payload = Harness::data_of(9);
  std::vector<std::byte> header(kObjectHeaderBytes);
  write_object_header(header, ObjectHeader{kIdentityLayoutId, 0, key_of(9), payload.size(),
                                           payload_checksum(payload)});
  const Region tail[] = {host_region(payload)};
  auto run = [&](std::size_t t, IoRequest req) {
    REQUIRE(h.stack->tier(t).submit(std::span(&req, 1)).value_or(0) == 1);
    Completion c;
    REQUIRE(h.stack->tier(t).poll(std::span(&c, 1), 1, std::chrono::seconds(1)).value_or(0) == 1);
    return c.status;
  };
  CHECK_FALSE(h.stack->tier(0).capabilities().gather_puts);
  CHECK(run(0, IoRequest{Op::kPut, key_of(9), host_region(header), 1, tail}).code() ==
        Code::kInvalidArgument);
  std::vector<std::byte> into(kObjectHeaderBytes);
  CHECK_FALSE(h.stack->tier(0).capabilities().scatter_gets);
  CHECK(run(0, IoRequest{Op::kGet, key_of(9), host_region(into), 2, tail}).code() ==
        Code::kInvalidArgument);
  // A header that declares more payload than the tail holds is refused before any copy.
  const Region short_tail[] = {host_region(std::span(payload).first(10))};
  CHECK(run(1, IoRequest{Op::kPut, key_of(9), host_region(header), 3, short_tail}).code() ==
        Code::kInvalidArgument);
  CHECK(run(1, IoRequest{Op::kPut, key_of(9), host_region(header), 4, tail}).is_ok());
  std::vector<std::byte> got;
  CHECK(h.load(key_of(9), got).tier == 1);
  CHECK(got == payload);
}

TEST_CASE("a load from a scatter tier fills several regions, and a miss or mismatch none") {
  Harness h(R"({"tiers":[{"name":"cpu","capacity":"1MiB","backend":"cpu"}]})");
  REQUIRE(h.stack->tier(0).capabilities().scatter_gets);
  REQUIRE(h.save(key_of(11), 11).is_ok());
  std::vector<std::byte> a(300, std::byte{0xEE}), b(kPayload - 300, std::byte{0xEE});
  const Region dst[] = {host_region(a), host_region(b)};
  LoadResult r[3];
  std::vector<LoadItem> items{{key_of(11), RegionList(dst)}, {key_of(12), RegionList(dst)},
                              {key_of(11), RegionList(dst, 1)}};
  REQUIRE(h.stack->load(std::span(items).first(1), *h.codec, std::span(r, 1)).is_ok());
  CHECK(r[0].status.is_ok());
  CHECK(r[0].tier == 0);
  std::vector<std::byte> got(a);
  got.insert(got.end(), b.begin(), b.end());
  CHECK(got == Harness::data_of(11));
  a.assign(a.size(), std::byte{0xEE});
  b.assign(b.size(), std::byte{0xEE});
  REQUIRE(h.stack->load(std::span(items).subspan(1), *h.codec, std::span(r + 1, 2)).is_ok());
  CHECK(r[1].status.code() == Code::kNotFound);
  CHECK(r[2].status.code() == Code::kInvalidArgument);  // 300 bytes for a 1000-byte payload
  CHECK(a == std::vector<std::byte>(a.size(), std::byte{0xEE}));
  CHECK(b == std::vector<std::byte>(b.size(), std::byte{0xEE}));
  Json j = h.stack->metrics_json();
  CHECK(j["stack"]["loaded_bytes"] == kPayload);
  CHECK(j["tiers"]["cpu"]["checksum_failures"] == 0);
}

// The scattered gets of one load reach the tier together (a pinned tier moves them in large
// transfers), still in item order, and a miss among them fails alone.
TEST_CASE("a load's scattered gets reach the tier in submits of many, in item order") {
  tier::test::FaultControl& fc = fresh_faults();
  Harness h(R"({"tiers":[{"name":"f","capacity":"1MiB","backend":"faulty"}]})");
  REQUIRE(h.stack->tier(0).capabilities().scatter_gets);
  constexpr std::uint64_t kCount = 40, kMissing = 17;
  for (std::uint64_t i = 0; i < kCount; ++i)
    if (i != kMissing) REQUIRE(h.save(key_of(2000 + i), i).is_ok());
  std::vector<std::vector<std::byte>> got(kCount, std::vector<std::byte>(kPayload, std::byte{0xEE}));
  std::vector<Region> dst;
  std::vector<LoadItem> items;
  for (std::uint64_t i = 0; i < kCount; ++i) dst.push_back(host_region(got[i]));
  for (std::uint64_t i = 0; i < kCount; ++i)
    items.push_back(LoadItem{key_of(2000 + i), RegionList(&dst[i], 1)});
  std::vector<std::size_t> submits;
  std::vector<ObjectKey> order;
  fc.observe_submit = [&](std::size_t n) { submits.push_back(n); };
  fc.observe = [&](Op op, const ObjectKey& k) {
    if (op == Op::kGet) order.push_back(k);
  };
  std::vector<LoadResult> out(kCount);
  REQUIRE(h.stack->load(items, *h.codec, out).is_ok());
  fc.reset();
  for (std::uint64_t i = 0; i < kCount; ++i) {
    CAPTURE(i);
    CHECK(order.at(i) == key_of(2000 + i));
    if (i == kMissing) {
      CHECK(out[i].status.code() == Code::kNotFound);
      CHECK(got[i] == std::vector<std::byte>(kPayload, std::byte{0xEE}));
    } else {
      CHECK(out[i].status.is_ok());
      CHECK(got[i] == Harness::data_of(i));
    }
  }
  // Windows of 16 (Backend::submit's): 16 + 16 + 8, not 40 submits of one.
  CHECK(submits == std::vector<std::size_t>{16, 16, 8});
}

// A codec that is `inner` under another layout id: its objects are refused by `inner`'s loads.
class Relabeled final : public tier::test::ForwardingCodec {
 public:
  Relabeled(const Codec& inner, std::uint32_t id) : ForwardingCodec(inner), id_(id) {}
  std::uint32_t format_id() const noexcept override { return id_; }

 private:
  std::uint32_t id_;
};

// An engine loads its PAGE chunks and their SLOT sidecar, two layouts, in one call: each item
// is checked against its own codec's layout, also when their gets go to the tier in one submit
// (direct, on a scatter tier) or through the stack's buffers (a tier that applies a stage).
TEST_CASE("a load of items with codecs of their own checks each against its own layout") {
  for (const char* profile :
       {R"({"tiers":[{"name":"cpu","capacity":"1MiB","backend":"cpu"}]})",
        R"({"tiers":[{"name":"cpu","capacity":"1MiB","backend":"cpu","stage":{"type":"zstd"}}]})"}) {
    CAPTURE(profile);
    Harness h(profile);
    const Relabeled other(*h.codec, h.codec->format_id() + 1);
    auto save = [&](std::uint64_t n, const Codec& c) {
      auto d = Harness::data_of(n);
      Region r = host_region(d);
      Status out;
      REQUIRE(h.stack->save(std::span<const SaveItem>({SaveItem{key_of(n), RegionList(&r, 1)}}),
                            c, std::span(&out, 1)).is_ok());
      REQUIRE(out.is_ok());
    };
    save(1, *h.codec);
    save(2, other);
    // Both layouts, each right, then each under the other's codec.
    std::vector<std::vector<std::byte>> got(4, std::vector<std::byte>(kPayload, std::byte{0xEE}));
    std::vector<Region> dst;
    for (auto& g : got) dst.push_back(host_region(g));
    const std::vector<LoadItem> items{{key_of(1), RegionList(&dst[0], 1)},
                                      {key_of(2), RegionList(&dst[1], 1), &other},
                                      {key_of(1), RegionList(&dst[2], 1), &other},
                                      {key_of(2), RegionList(&dst[3], 1)}};
    std::vector<LoadResult> out(items.size());
    REQUIRE(h.stack->load(items, *h.codec, out).is_ok());
    CHECK(out[0].status.is_ok());
    CHECK(got[0] == Harness::data_of(1));
    CHECK(out[1].status.is_ok());
    CHECK(got[1] == Harness::data_of(2));
    for (std::size_t i : {2, 3}) {
      CAPTURE(i);
      CHECK_FALSE(out[i].status.is_ok());
      CHECK(got[i] == std::vector<std::byte>(kPayload, std::byte{0xEE}));
    }
  }
}

// A load's scattered gets enter the stack's table when their batch is submitted: an item
// refused before any get (here the 66th, past a first batch of 64) is answered while the 65th
// still waits in the next batch, which is then served like the rest, not skipped as never sent.
TEST_CASE("an item refused between batched scattered gets leaves the queued ones to be served") {
  tier::test::FaultControl& fc = fresh_faults();
  Harness h(R"({"tiers":[{"name":"f","capacity":"1MiB","backend":"faulty"}]})");
  fc.reset();
  constexpr std::uint64_t kCount = 70, kRefused = 65;
  for (std::uint64_t i = 0; i < kCount; ++i) REQUIRE(h.save(key_of(4000 + i), i).is_ok());
  std::vector<std::vector<std::byte>> got(kCount, std::vector<std::byte>(kPayload, std::byte{0xEE}));
  std::vector<Region> dst;
  std::vector<LoadItem> items;
  for (std::uint64_t i = 0; i < kCount; ++i) dst.push_back(host_region(got[i]));
  dst[kRefused].size = kMaxPayloadBytes + 1;  // refused for its size; never read
  for (std::uint64_t i = 0; i < kCount; ++i)
    items.push_back(LoadItem{key_of(4000 + i), RegionList(&dst[i], 1)});
  std::vector<LoadResult> out(kCount);
  REQUIRE(h.stack->load(items, *h.codec, out).is_ok());
  for (std::uint64_t i = 0; i < kCount; ++i) {
    CAPTURE(i);
    if (i == kRefused) {
      CHECK(out[i].status.code() == Code::kInvalidArgument);
    } else {
      CHECK(out[i].status.is_ok());
      CHECK(got[i] == Harness::data_of(i));
    }
  }
  CHECK(h.stack->metrics_json()["stack"]["loaded_bytes"] == (kCount - 1) * kPayload);
}

// A save's gathered puts go to the tier in submits of many, in item order: to a tier that seals
// them, until their payloads hold 4 MiB; to one that does not, until they hold 256 KiB (the stack
// hashes each payload first: the first one hashed is then still in the core's cache when the tier
// copies it). Each carries the payload bytes of the whole save (IoRequest::batch_bytes); a put the
// tier fails fails its item alone.
TEST_CASE("a save's gathered puts reach the tier in submits of many, in item order") {
  for (bool sealed : {true, false}) {
    CAPTURE(sealed);
    tier::test::FaultControl& fc = fresh_faults();
    fc.unsealed = !sealed;  // read when the stack opens the tier
    Harness h(R"({"tiers":[{"name":"f","capacity":"16MiB","backend":"faulty"}]})");
    REQUIRE(h.stack->tier(0).capabilities().gather_puts);
    REQUIRE(h.stack->tier(0).capabilities().seals_puts == sealed);
    std::vector<std::size_t> rests;  // of each window: the requests of its submit after it
    auto run = [&](std::size_t count, std::size_t bytes, std::uint64_t key0) {
      rests.clear();
      std::vector<std::uint64_t> batch_bytes;
      std::vector<std::vector<std::byte>> data(count);
      std::vector<Region> src;
      std::vector<SaveItem> items;
      for (std::size_t i = 0; i < count; ++i) {
        data[i].assign(bytes, static_cast<std::byte>(i));
        src.push_back(host_region(data[i]));
      }
      for (std::size_t i = 0; i < count; ++i)
        items.push_back(SaveItem{key_of(key0 + i), RegionList(&src[i], 1)});
      std::vector<std::size_t> submits;
      std::vector<ObjectKey> order;
      fc.observe_submit = [&](std::size_t n) { submits.push_back(n); };
      fc.observe_rest = [&](std::size_t n) { rests.push_back(n); };
      fc.observe_batch_bytes = [&](std::uint64_t n) { batch_bytes.push_back(n); };
      fc.observe = [&](Op op, const ObjectKey& k) {
        if (op == Op::kPut) order.push_back(k);
      };
      fc.fail_put = [&](const ObjectKey& k) { return k == key_of(key0 + 5); };
      std::vector<Status> out(count);
      REQUIRE(h.stack->save(items, *h.codec, out).is_ok());
      fc.reset();
      CHECK(batch_bytes == std::vector<std::uint64_t>(count, count * bytes));
      for (std::size_t i = 0; i < count; ++i) {
        CAPTURE(i);
        CHECK(order.at(i) == key_of(key0 + i));
        CHECK(out[i].is_ok() == (i != 5));
        std::vector<std::byte> got(bytes, std::byte{0xEE});
        Region r = host_region(got);
        LoadResult loaded;
        REQUIRE(
            h.stack
                ->load(std::span<const LoadItem>({LoadItem{key_of(key0 + i), RegionList(&r, 1)}}),
                       *h.codec, std::span(&loaded, 1))
                .is_ok());
        CHECK(loaded.status.is_ok() == (i != 5));
        if (i != 5) CHECK(got == data[i]);
      }
      return submits;
    };
    // Small payloads: one batch of 40, in Backend::submit's windows of 16 (not 40 submits of one).
    CHECK(run(40, 100, 4000) == std::vector<std::size_t>{16, 16, 8});
    // Each window sees what its submit still brings (Backend::submit_rest).
    CHECK(rests == std::vector<std::size_t>{24, 8, 0});
    if (sealed) {
      // 1.5 MiB payloads: a submit once three hold 4 MiB or more; 100 KiB ones: all in one.
      CHECK(run(8, 1536 << 10, 5000) == std::vector<std::size_t>{3, 3, 2});
      CHECK(run(8, 100 << 10, 6000) == std::vector<std::size_t>{8});
    } else {
      // 100 KiB payloads: a submit once three hold 256 KiB or more.
      CHECK(run(8, 100 << 10, 5000) == std::vector<std::size_t>{3, 3, 2});
    }
  }
}

// Large payloads go to the tier as soon as the pending ones hold 4 MiB: the first transfer does
// not wait for the host's work on the load's later items (a DSV4 restore's 5.8 MiB chunks went
// one submit each; before, all of them in one, whose first DMA started 68-82 us late).
TEST_CASE("a load submits its scattered gets once they hold 4 MiB of payload") {
  tier::test::FaultControl& fc = fresh_faults();
  Harness h(R"({"tiers":[{"name":"f","capacity":"32MiB","backend":"faulty"}]})");
  constexpr std::size_t kCount = 8, kBytes = 1536 << 10;  // 1.5 MiB: a submit per 3 items
  std::vector<std::vector<std::byte>> data(kCount), got(kCount);
  std::vector<Region> src, dst;
  std::vector<SaveItem> saves;
  std::vector<LoadItem> loads;
  for (std::size_t i = 0; i < kCount; ++i) {
    data[i].resize(kBytes);
    for (std::size_t b = 0; b < kBytes; b += 4096) data[i][b] = static_cast<std::byte>(i + b);
    got[i].assign(kBytes, std::byte{0xEE});
  }
  for (std::size_t i = 0; i < kCount; ++i) {
    src.push_back(host_region(data[i]));
    dst.push_back(host_region(got[i]));
  }
  for (std::size_t i = 0; i < kCount; ++i) {
    saves.push_back(SaveItem{key_of(3000 + i), RegionList(&src[i], 1)});
    loads.push_back(LoadItem{key_of(3000 + i), RegionList(&dst[i], 1)});
  }
  std::vector<Status> saved(kCount);
  REQUIRE(h.stack->save(saves, *h.codec, saved).is_ok());
  for (const Status& st : saved) REQUIRE(st.is_ok());
  std::vector<std::size_t> submits;
  std::vector<std::uint64_t> batch_bytes;
  fc.observe_submit = [&](std::size_t n) { submits.push_back(n); };
  fc.observe_batch_bytes = [&](std::uint64_t n) { batch_bytes.push_back(n); };
  std::vector<LoadResult> out(kCount);
  REQUIRE(h.stack->load(loads, *h.codec, out).is_ok());
  fc.reset();
  CHECK(submits == std::vector<std::size_t>{3, 3, 2});
  // Every get carries the payload bytes of the whole load (IoRequest::batch_bytes).
  CHECK(batch_bytes == std::vector<std::uint64_t>(kCount, kCount * kBytes));
  for (std::size_t i = 0; i < kCount; ++i) {
    CAPTURE(i);
    CHECK(out[i].status.is_ok());
    CHECK(got[i] == data[i]);
  }
}

// A load serves the gets still out after its submits in item order, each as soon as it
// finished: the first item's image is decoded into its regions while a later get is still
// being read (a disk tier's reads finish over time). Here the second get is held until the first
// item was decoded: a load that waited for every get before decoding any would time out on it.
TEST_CASE("a load decodes each item as soon as its get finished, while later gets are out") {
  tier::test::FaultControl& fc = fresh_faults();
  Harness h(R"({"stack":{"op_timeout":"2s"},)"
            R"("tiers":[{"name":"f","capacity":"1MiB","backend":"faulty"}]})");
  // A codec of one region's bytes without a direct form (so the tier reads into the stack's
  // buffers and the codec decodes them), counting decodes.
  struct Copying final : Codec {
    mutable std::atomic<int> decoded{0};
    std::string_view name() const noexcept override { return "copying"; }
    std::uint32_t format_id() const noexcept override { return 0x7e57; }
    Result<std::size_t> encoded_size(RegionList src) const noexcept override { return src[0].size; }
    Result<std::size_t> encode(RegionList src, std::span<std::byte> out) const noexcept override {
      std::memcpy(out.data(), src[0].data, src[0].size);
      return src[0].size;
    }
    Status decode(std::span<const std::byte> payload, RegionList dst) const noexcept override {
      decoded.fetch_add(1);
      std::memcpy(dst[0].data, payload.data(), std::min(payload.size(), dst[0].size));
      return Status::ok();
    }
  } codec;
  const ObjectKey first = key_of(3000), second = key_of(3001);
  std::vector<std::byte> one = Harness::data_of(1), two = Harness::data_of(2);
  Region r1 = host_region(one), r2 = host_region(two);
  const std::vector<SaveItem> saves = {SaveItem{first, RegionList(&r1, 1)},
                                       SaveItem{second, RegionList(&r2, 1)}};
  std::vector<Status> saved(2);
  REQUIRE(h.stack->save(saves, codec, saved).is_ok());
  REQUIRE(saved[0].is_ok());
  REQUIRE(saved[1].is_ok());
  // The first get finishes 50 ms after the load starts (after its submits, which take
  // microseconds); the second only once something was decoded.
  const auto first_lands = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  fc.hold_get = [&](const ObjectKey& k) {
    if (k == first) return std::chrono::steady_clock::now() < first_lands;
    return k == second && codec.decoded.load() == 0;
  };
  std::vector<std::byte> a(kPayload, std::byte{0xEE}), b(kPayload, std::byte{0xEE});
  Region ra = host_region(a), rb = host_region(b);
  const std::vector<LoadItem> items = {LoadItem{first, RegionList(&ra, 1)},
                                       LoadItem{second, RegionList(&rb, 1)}};
  std::vector<LoadResult> out(2);
  REQUIRE(h.stack->load(items, codec, out).is_ok());
  fc.reset();
  CHECK(out[0].status.is_ok());
  CHECK_MESSAGE(out[1].status.is_ok(), out[1].status.to_string());
  CHECK(a == Harness::data_of(1));
  CHECK(b == Harness::data_of(2));
  CHECK(codec.decoded.load() == 2);
}

TEST_CASE("clear removes a namespace's objects from every tier, every rank's, and nothing else") {
  Harness h(R"({"tiers":[{"name":"fast","capacity":"1MiB","backend":"cpu"},)"
            R"({"name":"slow","capacity":"4MiB","backend":"cpu"}]})");
  const std::vector<ObjectKey> mine = {key_of(1, 7, 0), key_of(2, 7, 0), key_of(3, 7, 1)};
  const ObjectKey other = key_of(1, 8, 0);
  for (const ObjectKey& k : mine) REQUIRE(h.save(k, k.id.lo).is_ok());
  REQUIRE(h.save(other, 9).is_ok());
  REQUIRE(h.stack->flush(std::chrono::milliseconds(5000)).is_ok());  // written through to "slow"
  auto removed = h.stack->clear(mine[0].ns);
  REQUIRE_MESSAGE(removed.is_ok(), removed.status().to_string());
  CHECK(*removed == 6);  // three objects in two tiers
  std::vector<std::byte> got;
  for (const ObjectKey& k : mine) CHECK(h.load(k, got).status.code() == Code::kNotFound);
  CHECK(h.load(other, got).status.is_ok());
  CHECK(*h.stack->clear(mine[0].ns) == 0);  // nothing left: idempotent
}

TEST_CASE("clear reports a tier that cannot list its keys, after clearing the others") {
  Harness h(R"({"tiers":[{"name":"cpu","capacity":"1MiB","backend":"cpu"},)"
            R"({"name":"mock","capacity":"1MiB","backend":"mock"}]})");
  const ObjectKey k = key_of(4, 11, 0);
  REQUIRE(h.save(k, 4).is_ok());
  auto r = h.stack->clear(k.ns);
  REQUIRE_FALSE(r.is_ok());
  CHECK(r.status().code() == Code::kNotSupported);
  // The cpu tier was cleared all the same.
  CHECK(tier::test::run(h.stack->tier(0), Op::kContains, k).status.code() == Code::kNotFound);
}
