// DSV4 resume points over a real TierStack: the fail-closed table's codec, store and bundle rows
// (each a miss, never a partial resume), and the corruption fence with a tier whose remove fails.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "dsv4/resume_store.hpp"
#include "support/fault_backend.hpp"
#include "support/test_util.hpp"
#include "tier/profile.hpp"
#include "tier/tier_stack.hpp"

using namespace tier;
using namespace tier::dsv4;
using tier::test::fault_control;

namespace {

const Key128 kNs{0x1111, 0x2222};

bool zstd_built() { return Registry::global().find(PluginKind::kStage, "zstd") != nullptr; }

Json one_tier(const char* backend, bool zstd = false) {
  Json tier = {{"name", "t0"}, {"capacity", "256MiB"}, {"backend", {{"type", backend}}}};
  if (zstd && zstd_built()) tier["stage"] = {{"type", "zstd"}, {"level", 1}};
  return {{"tiers", {tier}}};
}

// A small DSV4 engine (HCA + CSA + dense layer, fp8: two planes and one indexer), its codecs and
// a ResumeStore over the profile's stack.
struct Rig {
  Geometry g;
  std::vector<std::vector<std::byte>> mem;
  std::unique_ptr<PageCodec> page;
  std::unique_ptr<SlotCodec> slot;
  std::unique_ptr<TierStack> stack;
  std::unique_ptr<ResumeStore> store;

  explicit Rig(const Json& profile_json) {
    test::register_faulty_backend();
    fault_control().reset();
    auto c = ModelConfig::from_json({{"compress_ratios", {128, 4, 0}},
                                     {"block_size", 128},
                                     {"spec_steps", 1},
                                     {"num_blocks", 8},
                                     {"num_slots", 3}});
    REQUIRE(c.is_ok());
    auto geo = Geometry::compute(*c);
    REQUIRE(geo.is_ok());
    g = *geo;
    std::vector<Region> regions;
    std::uint64_t x = 0x12345;
    for (const auto& b : g.backings) {
      mem.emplace_back(b.bytes);
      for (auto& byte : mem.back()) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        byte = static_cast<std::byte>(x >> 56);
      }
      regions.push_back(host_region(mem.back()));
    }
    auto layout = bind_layout(g, regions);
    REQUIRE(layout.is_ok());
    auto p = PageCodec::create(layout->page, c->num_blocks);
    REQUIRE(p.is_ok());
    page = std::move(p).value();
    SlotIdentity id{slot_fingerprint(g, kNs, 1, 0), 1, 0};
    auto s = SlotCodec::create(layout->slot, c->num_slots, id);
    REQUIRE(s.is_ok());
    slot = std::move(s).value();
    auto profile = parse_profile(profile_json, Registry::global(), "<test>");
    REQUIRE_MESSAGE(profile.is_ok(), profile.status().to_string());
    auto st = TierStack::open(*profile);
    REQUIRE_MESSAGE(st.is_ok(), st.status().to_string());
    stack = std::move(st).value();
    store = std::make_unique<ResumeStore>(*stack, *page, *slot, kNs);
  }

  // The saved resume point: two chunks of two blocks, SLOT group 2, boundary at 4 blocks.
  ResumePoint saved() const {
    return {{test::key_of(1), test::key_of(2)}, {{5, 1}, {3, 6}}, {512, 0xabcdef}, 2};
  }
  // The same point loaded into other blocks and another (newly allocated) group.
  ResumePoint target() const {
    ResumePoint p = saved();
    p.page_blocks = {{0, 2}, {4, 7}};
    p.slot_group = 0;
    return p;
  }
  std::vector<std::byte> page_bytes(const ResumePoint& p) const {
    std::vector<std::byte> out;
    for (const auto& chunk : p.page_blocks)
      for (std::uint32_t id : chunk)
        for (const auto& r : page->regions())
          out.insert(out.end(), r.unit(id), r.unit(id) + r.unit_bytes);
    return out;
  }
  std::vector<std::byte> slot_bytes(std::uint32_t group) const {
    std::vector<std::byte> out;
    for (const auto& r : slot->regions())
      out.insert(out.end(), r.unit(group), r.unit(group) + r.unit_bytes);
    return out;
  }
  // Flips one payload byte of the images of `key` as the tier stores them. With `reseal` the
  // object header is rewritten so the store's checksum passes and only the codec can notice.
  void corrupt_puts_of(const ObjectKey& key, std::size_t payload_offset, bool reseal) {
    fault_control().mutate_put = [=](const ObjectKey& k, std::vector<std::byte>& img) {
      if (!(k == key)) return;
      img[kObjectHeaderBytes + payload_offset] ^= std::byte{0x40};
      if (reseal) {
        auto h = parse_object_header(img);
        REQUIRE(h.is_ok());
        seal_object(img, h->layout_id, h->stage_id, key);
      }
    };
  }
};

}  // namespace

TEST_CASE("a resume point round-trips bit-exact into other blocks and another slot group") {
  for (bool zstd : {false, true}) {
    Rig rig(one_tier("cpu", zstd));
    ResumePoint src = rig.saved(), dst = rig.target();
    REQUIRE(rig.store->save(src).is_ok());
    auto want_page = rig.page_bytes(src);
    auto want_slot = rig.slot_bytes(src.slot_group);
    CHECK(rig.page_bytes(dst) != want_page);
    ResumeLoad r = rig.store->load(dst);
    REQUIRE_MESSAGE(r.status.is_ok(), r.status.to_string());
    CHECK(r.miss == ResumeMiss::kNone);
    CHECK(rig.page_bytes(dst) == want_page);
    CHECK(rig.slot_bytes(dst.slot_group) == want_slot);
    // Saving again is harmless (put-if-absent).
    CHECK(rig.store->save(src).is_ok());
  }
}

TEST_CASE("PAGE without a sidecar is a miss and the slot is untouched") {
  Rig rig(one_tier("cpu"));
  REQUIRE(rig.store->save(rig.saved()).is_ok());
  REQUIRE(rig.stack->remove(rig.store->sidecar_key(rig.saved().boundary)).is_ok());
  auto before = rig.slot_bytes(0);
  ResumeLoad r = rig.store->load(rig.target());
  CHECK(r.miss == ResumeMiss::kSidecarUnavailable);
  CHECK(r.status == Code::kNotFound);
  CHECK(rig.slot_bytes(0) == before);
  // A sidecar at another boundary does not make this one usable.
  ResumePoint other = rig.target();
  other.boundary.block_hash ^= 1;
  CHECK(rig.store->load(other).miss == ResumeMiss::kSidecarUnavailable);
}

TEST_CASE("a missing PAGE chunk is a miss before any byte is fetched") {
  Rig rig(one_tier("faulty"));
  REQUIRE(rig.store->save(rig.saved()).is_ok());
  REQUIRE(rig.stack->remove(test::key_of(2)).is_ok());
  auto page_before = rig.page_bytes(rig.target());
  auto slot_before = rig.slot_bytes(0);
  std::uint64_t gets = fault_control().count(Op::kGet);
  ResumeLoad r = rig.store->load(rig.target());
  CHECK(r.miss == ResumeMiss::kPageUnavailable);
  CHECK(r.status == Code::kNotFound);
  CHECK(fault_control().count(Op::kGet) == gets);  // neither PAGE nor SLOT was read
  CHECK(rig.page_bytes(rig.target()) == page_before);
  CHECK(rig.slot_bytes(0) == slot_before);
}

TEST_CASE("a corrupt AOS1 payload is a miss and the sidecar is removed from every tier") {
  Rig rig(one_tier("faulty"));
  ObjectKey skey = rig.store->sidecar_key(rig.saved().boundary);
  rig.corrupt_puts_of(skey, kAos1HeaderBytes + 3, /*reseal=*/true);
  REQUIRE(rig.store->save(rig.saved()).is_ok());
  fault_control().mutate_put = nullptr;
  auto slot_before = rig.slot_bytes(0);
  ResumeLoad r = rig.store->load(rig.target());
  CHECK(r.miss == ResumeMiss::kSidecarCorrupt);
  CHECK(r.status.message() == "aos1 crc_mismatch");
  REQUIRE(r.invalidated.size() == 1);
  CHECK(r.invalidated[0] == skey);
  CHECK(r.still_fenced.empty());
  CHECK(*rig.stack->locate(skey) == -1);
  CHECK(rig.slot_bytes(0) == slot_before);
  // The recomputed sidecar can be stored again and the point resumes.
  REQUIRE(rig.store->save(rig.saved()).is_ok());
  CHECK(rig.store->load(rig.target()).status.is_ok());
}

TEST_CASE("a malformed storage object is invalidated like a corrupt AOS1 frame") {
  Rig rig(one_tier("faulty"));
  ObjectKey skey = rig.store->sidecar_key(rig.saved().boundary);
  rig.corrupt_puts_of(skey, 7, /*reseal=*/false);  // the store's own checksum fails
  REQUIRE(rig.store->save(rig.saved()).is_ok());
  fault_control().mutate_put = nullptr;
  ResumeLoad r = rig.store->load(rig.target());
  CHECK(r.miss == ResumeMiss::kSidecarCorrupt);
  CHECK(r.status == Code::kChecksumMismatch);
  CHECK(r.invalidated.size() == 1);
  CHECK(*rig.stack->locate(skey) == -1);
}

TEST_CASE("a sidecar whose frame names another boundary is a miss and is invalidated") {
  Rig rig(one_tier("cpu"));
  REQUIRE(rig.store->save(rig.saved()).is_ok());
  ResumePoint p = rig.target();
  p.boundary.tokens = 384;  // same hash (same key), other token count
  auto before = rig.slot_bytes(0);
  ResumeLoad r = rig.store->load(p);
  CHECK(r.miss == ResumeMiss::kSidecarCorrupt);
  CHECK(r.status.message() == "aos1 boundary_tokens_mismatch");
  CHECK(rig.slot_bytes(0) == before);
  CHECK(*rig.stack->locate(rig.store->sidecar_key(p.boundary)) == -1);
}

TEST_CASE("a corrupt PAGE chunk is a miss, is invalidated, and the SLOT is never fetched") {
  Rig rig(one_tier("faulty"));
  rig.corrupt_puts_of(test::key_of(2), 11, /*reseal=*/false);
  REQUIRE(rig.store->save(rig.saved()).is_ok());
  fault_control().mutate_put = nullptr;
  auto slot_before = rig.slot_bytes(0);
  std::uint64_t gets = fault_control().count(Op::kGet);
  ResumeLoad r = rig.store->load(rig.target());
  CHECK(r.miss == ResumeMiss::kPageCorrupt);
  CHECK(fault_control().count(Op::kGet) == gets + 2);  // the two PAGE chunks only
  REQUIRE(r.invalidated.size() == 1);
  CHECK(r.invalidated[0] == test::key_of(2));
  CHECK(rig.slot_bytes(0) == slot_before);
}

TEST_CASE("a PAGE chunk stored with another layout is a miss and is invalidated") {
  Rig rig(one_tier("cpu"));
  REQUIRE(rig.store->save(rig.saved()).is_ok());
  REQUIRE(rig.stack->remove(test::key_of(1)).is_ok());
  auto identity = Registry::global().create_codec("identity", Json::array());
  REQUIRE(identity.is_ok());
  std::vector<std::byte> junk(rig.page->bytes_per_block() * 2, std::byte{1});
  Region jr = host_region(junk);
  SaveItem item{test::key_of(1), RegionList(&jr, 1)};
  Status st;
  REQUIRE(rig.stack->save(std::span(&item, 1), **identity, std::span(&st, 1)).is_ok());
  REQUIRE(st.is_ok());
  ResumeLoad r = rig.store->load(rig.target());
  CHECK(r.miss == ResumeMiss::kPageCorrupt);
  CHECK(r.invalidated.size() == 1);
}

TEST_CASE("malformed requests are refused before any tier is asked") {
  Rig rig(one_tier("faulty"));
  ResumePoint p = rig.saved();
  p.page_blocks = {{5, 1}, {1, 6}};  // block 1 in two chunks
  CHECK(rig.store->save(p).code() == Code::kInvalidArgument);
  CHECK(rig.store->load(p).miss == ResumeMiss::kInvalid);
  p = rig.saved();
  p.slot_group = 3;
  CHECK(rig.store->load(p).miss == ResumeMiss::kInvalid);
  p = rig.saved();
  p.boundary.tokens = 0;
  CHECK(rig.store->save(p).code() == Code::kInvalidArgument);
  p = rig.saved();
  p.page_keys.pop_back();
  CHECK(rig.store->load(p).miss == ResumeMiss::kInvalid);
  std::uint64_t total = 0;
  for (auto n : fault_control().ops) total += n;
  CHECK(total == 0);
}

TEST_CASE("corruption fence: a key whose removal fails refuses puts until removal succeeds") {
  Rig rig(one_tier("faulty"));
  ObjectKey skey = rig.store->sidecar_key(rig.saved().boundary);
  rig.corrupt_puts_of(skey, kAos1HeaderBytes + 1, /*reseal=*/true);
  REQUIRE(rig.store->save(rig.saved()).is_ok());
  fault_control().mutate_put = nullptr;
  fault_control().fail_remove = true;

  ResumeLoad r = rig.store->load(rig.target());
  CHECK(r.miss == ResumeMiss::kSidecarCorrupt);
  CHECK(r.invalidated.empty());
  REQUIRE(r.still_fenced.size() == 1);
  CHECK(rig.store->fenced(skey));
  CHECK(*rig.stack->locate(skey) == 0);  // the corrupt copy is still there

  // The republication is refused: the removal is retried, no put is made.
  std::uint64_t puts = fault_control().count(Op::kPut);
  std::uint64_t removes = fault_control().count(Op::kRemove);
  CHECK(rig.store->save(rig.saved()).code() == Code::kRejected);
  CHECK(fault_control().count(Op::kPut) == puts);
  CHECK(fault_control().count(Op::kRemove) > removes);
  CHECK(rig.store->fenced(skey));
  CHECK(rig.store->load(rig.target()).miss == ResumeMiss::kSidecarCorrupt);

  // Once the tier removes again, the next save lifts the fence and republishes.
  fault_control().fail_remove = false;
  REQUIRE(rig.store->save(rig.saved()).is_ok());
  CHECK_FALSE(rig.store->fenced(skey));
  CHECK(fault_control().count(Op::kPut) > puts);
  ResumeLoad ok = rig.store->load(rig.target());
  CHECK(ok.status.is_ok());
  CHECK(rig.slot_bytes(0) == rig.slot_bytes(rig.saved().slot_group));
}

TEST_CASE("a failed PAGE put withholds the sidecar, so the boundary never resumes") {
  Rig rig(one_tier("faulty"));
  fault_control().fail_put = [](const ObjectKey& k) { return k == test::key_of(2); };
  Status s = rig.store->save(rig.saved());
  CHECK(s.code() == Code::kIoError);
  CHECK(*rig.stack->locate(rig.store->sidecar_key(rig.saved().boundary)) == -1);
  CHECK(*rig.stack->locate(test::key_of(1)) == 0);  // a harmless uncommitted PAGE chunk
  CHECK(rig.store->load(rig.target()).miss == ResumeMiss::kPageUnavailable);
  fault_control().fail_put = nullptr;
  REQUIRE(rig.store->save(rig.saved()).is_ok());
  CHECK(rig.store->load(rig.target()).status.is_ok());
}

TEST_CASE("invalidating a key no tier holds (evicted meanwhile) succeeds and lifts the fence") {
  Rig rig(one_tier("faulty"));
  ObjectKey k = test::key_of(77);
  CHECK(rig.store->invalidate(k).is_ok());
  CHECK_FALSE(rig.store->fenced(k));
  CHECK(rig.store->fenced_count() == 0);
}

TEST_CASE("a corrupt copy in a fast tier falls back to a valid copy below and is replaced") {
  Json profile = {{"tiers",
                   {{{"name", "fast"}, {"capacity", "64MiB"}, {"backend", {{"type", "faulty"}}}},
                    {{"name", "slow"}, {"capacity", "64MiB"}, {"backend", {{"type", "cpu"}}}}}}};
  if (zstd_built()) profile["tiers"][1]["stage"] = {{"type", "zstd"}, {"level", 1}};
  Rig rig(profile);
  ObjectKey skey = rig.store->sidecar_key(rig.saved().boundary);
  rig.corrupt_puts_of(skey, kAos1HeaderBytes + 9, /*reseal=*/true);
  REQUIRE(rig.store->save(rig.saved()).is_ok());
  REQUIRE(rig.stack->flush(std::chrono::seconds(10)).is_ok());
  fault_control().mutate_put = nullptr;
  ResumeLoad r = rig.store->load(rig.target());
  REQUIRE_MESSAGE(r.status.is_ok(), r.status.to_string());
  CHECK(rig.slot_bytes(0) == rig.slot_bytes(2));
  // The stack dropped the corrupt fast copy and promoted the valid one in its place.
  REQUIRE(rig.stack->flush(std::chrono::seconds(10)).is_ok());
  CHECK(*rig.stack->locate(skey) == 0);
  std::uint64_t decode_failures = rig.stack->counters().decode_failures.get();
  CHECK(rig.store->load(rig.target()).status.is_ok());
  CHECK(rig.stack->counters().decode_failures.get() == decode_failures);
}
