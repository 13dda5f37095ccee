// DSV4 geometry: the reference figures, strict parsing, the fingerprint choice, binding.
#include <doctest/doctest.h>

#include <vector>

#include <fmt/format.h>

#include "tier/dsv4/blake2b.hpp"
#include "tier/dsv4/geometry.hpp"
#include "tier/dsv4/slot_codec.hpp"

using namespace tier::dsv4;

namespace {
Geometry geometry_of(const std::string& name) {
  auto c = preset(name);
  REQUIRE(c.is_ok());
  auto g = Geometry::compute(*c);
  REQUIRE(g.is_ok());
  return *g;
}
}  // namespace

TEST_CASE("V4-Pro fp8 reproduces the reference figures") {
  Geometry g = geometry_of("v4-pro-fp8");
  CHECK(g.n_csa == 30);
  CHECK(g.n_hca == 31);
  CHECK(g.n_dense == 1);
  CHECK(g.envelope_rows == 1982);
  CHECK(g.arena_rows == 31992);
  CHECK(g.entry_rows == 9855);
  CHECK(g.slot_rows == 41848);
  CHECK(g.page_bytes_per_block == 1521920);
  CHECK(g.slot_bytes == 26782720);
  REQUIRE(g.page_regions.size() == 2 + 30);
  CHECK(g.page_regions[0].unit_bytes == 1014784);
  CHECK(g.page_regions[1].unit_bytes == 253696);
  CHECK(g.page_regions[2].unit_bytes == 8448);
  for (const auto& r : g.page_regions) CHECK_FALSE(r.reverse_indexed);
  for (const auto& r : g.slot_regions) CHECK(r.reverse_indexed);
  // The planner puts HCA state in the NoPE plane and CSA state in the RoPE plane.
  for (const auto& f : g.fields) CHECK(f.plane == (f.name.rfind("hca", 0) == 0 ? 0u : 1u));
}

TEST_CASE("V4-Pro bf16 reproduces the reference figures") {
  Geometry g = geometry_of("v4-pro-bf16");
  CHECK(g.planes.size() == 1);
  CHECK(g.page_bytes_per_block == 2283008);
  CHECK(g.slot_bytes == 29237248);
  CHECK(g.page_regions.size() == 1 + 30);
}

TEST_CASE("V4-Pro fp8 without MTP matches the reference's 25,395,200-byte slot") {
  auto c = preset("v4-pro-fp8");
  REQUIRE(c.is_ok());
  c->spec_steps = 0;
  auto g = Geometry::compute(*c);
  REQUIRE(g.is_ok());
  CHECK(g->slot_bytes == 25395200);
}

TEST_CASE("V4-Flash presets: 21 CSA, 20 HCA, 5 dense, ring 131") {
  Geometry g = geometry_of("v4-flash-fp8");
  CHECK(g.n_csa == 21);
  CHECK(g.n_hca == 20);
  CHECK(g.n_dense == 5);
  CHECK(g.ring_slots == 131);
  CHECK(g.envelope_rows == 20 * 2 + 21 * 64);
  Geometry b = geometry_of("v4-flash-bf16");
  CHECK(b.page_bytes_per_block == b.envelope_rows * 1024 + 21 * 8448);
}

TEST_CASE("the fp4 indexer brings its scale pool into the region map") {
  auto c = ModelConfig::from_json({{"preset", "v4-pro-fp8"}, {"index_dtype", "fp4"}});
  REQUIRE(c.is_ok());
  auto g = Geometry::compute(*c);
  REQUIRE(g.is_ok());
  CHECK(g->page_regions.size() == 2 + 2 * 30);
  CHECK(g->page_regions[2].unit_bytes == 64 * 64);  // 128 fp4 values = 64 bytes per row
  CHECK(g->page_regions[3].role == "dsv4.csa_indexer_scale.layer_2");
  CHECK(g->page_regions[3].unit_bytes == 64 * 4);
}

TEST_CASE("the description is parsed strictly, every error with its pointer") {
  auto r = ModelConfig::from_json({{"preset", "v4-pro-fp8"},
                                   {"kv_dtpye", "fp8"},
                                   {"compress_ratios", {4, 7, -2}},
                                   {"block_size", "256"}});
  REQUIRE_FALSE(r.is_ok());
  std::string m(r.status().message());
  CHECK(m.find("/kv_dtpye: unknown key; did you mean \"kv_dtype\"?") != std::string::npos);
  CHECK(m.find("/compress_ratios/1: expected 0 (dense), 4 (CSA), 128 (HCA) or -1 (field window), "
               "got 7") != std::string::npos);
  CHECK(m.find("/compress_ratios/2") != std::string::npos);
  CHECK(m.find("/block_size: expected an unsigned integer") != std::string::npos);
  CHECK_FALSE(preset("v4-ultra-fp8").is_ok());
  CHECK_FALSE(ModelConfig::from_json({{"num_blocks", 4}}).is_ok());  // no ratios
  auto odd = ModelConfig::from_json({{"preset", "v4-pro-fp8"}, {"block_size", 64}});
  REQUIRE(odd.is_ok());
  CHECK_FALSE(Geometry::compute(*odd).is_ok());
}

TEST_CASE("the slot fingerprint ignores num_slots and total_bytes but not the layout") {
  auto c = preset("v4-pro-fp8");
  REQUIRE(c.is_ok());
  auto a = Geometry::compute(*c);
  c->num_slots = 17;
  c->num_blocks = 999;
  auto b = Geometry::compute(*c);
  REQUIRE(a.is_ok());
  REQUIRE(b.is_ok());
  tier::Key128 ns{7, 8};
  CHECK(slot_fingerprint(*a, ns, 2, 1) == slot_fingerprint(*b, ns, 2, 1));
  std::string text = a->slot_format_json().dump();
  CHECK(text.find("num_slots") == std::string::npos);
  CHECK(text.find("total_bytes") == std::string::npos);
  CHECK(slot_fingerprint(*a, ns, 2, 1) != slot_fingerprint(*a, ns, 2, 0));
  CHECK(slot_fingerprint(*a, ns, 2, 1) != slot_fingerprint(*a, tier::Key128{7, 9}, 2, 1));
  c->spec_steps = 2;
  auto d = Geometry::compute(*c);
  REQUIRE(d.is_ok());
  CHECK(slot_fingerprint(*a, ns, 2, 1) != slot_fingerprint(*d, ns, 2, 1));
  c->spec_steps = 1;
  c->kv_dtype = KvDtype::kBf16;
  auto e = Geometry::compute(*c);
  REQUIRE(e.is_ok());
  CHECK(slot_fingerprint(*a, ns, 2, 1) != slot_fingerprint(*e, ns, 2, 1));
}

TEST_CASE("bind places SLOT spans above the PAGE area of the same plane, never overlapping") {
  auto c = ModelConfig::from_json(
      {{"compress_ratios", {128, 4, 0}}, {"num_blocks", 3}, {"num_slots", 2}, {"kv_dtype", "fp8"}});
  REQUIRE(c.is_ok());
  auto g = Geometry::compute(*c);
  REQUIRE(g.is_ok());
  std::vector<std::vector<std::byte>> mem;
  std::vector<tier::Region> regions;
  for (const auto& b : g->backings) mem.emplace_back(b.bytes);
  for (auto& m : mem) regions.push_back(tier::host_region(m));
  auto layout = bind_memory(*g, regions);
  REQUIRE(layout.is_ok());
  const BoundRegion& page = layout->page[0];
  const BoundRegion& slot = layout->slot[0];
  CHECK(page.base == mem[0].data());
  CHECK(slot.base == page.base + page.total_bytes);
  CHECK(slot.unit(0) + slot.unit_bytes == mem[0].data() + mem[0].size());  // group 0 is highest
  CHECK(slot.unit(1) == slot.base);
  // Too small an allocation, or two backings that alias, are refused.
  regions[0].size -= 1;
  CHECK_FALSE(bind_memory(*g, regions).is_ok());
  regions[0].size += 1;
  regions[1] = regions[0];
  CHECK_FALSE(bind_memory(*g, regions).is_ok());
}

// ATOM allocates each plane with room to move the PAGE/SLOT split: blocks from row 0 up, slots
// from the last row down (physical_slot(g) = slot_positions - 1 - g), free rows between
// (../shared/reference/dsv4-page-slot.md, section 1.3). A SLOT written by ATOM at the top of such a
// plane must be found there, not right after the PAGE area.
TEST_CASE("bind finds SLOT rows at the top of an ATOM-shaped plane, past the gap") {
  auto c = ModelConfig::from_json(
      {{"compress_ratios", {128, 4, 0}}, {"num_blocks", 3}, {"num_slots", 2}, {"kv_dtype", "fp8"}});
  REQUIRE(c.is_ok());
  auto g = Geometry::compute(*c);
  REQUIRE(g.is_ok());
  REQUIRE(g->planes.size() == 2);
  // Each plane gets 5 spare rows of gap (and the RoPE plane a stray partial row at its end).
  const std::uint64_t gap_rows = 5;
  std::vector<std::vector<std::byte>> mem;
  std::vector<tier::Region> regions;
  for (std::size_t i = 0; i < g->backings.size(); ++i) {
    std::uint64_t bytes = g->backings[i].bytes;
    if (i < g->planes.size()) bytes += gap_rows * g->planes[i].row_bytes + (i == 1 ? 7 : 0);
    mem.emplace_back(bytes);
  }
  for (auto& m : mem) regions.push_back(tier::host_region(m));
  auto layout = bind_memory(*g, regions);
  REQUIRE(layout.is_ok());
  for (std::size_t p = 0; p < g->planes.size(); ++p) {
    const std::uint64_t row = g->planes[p].row_bytes;
    const std::uint64_t rows = mem[p].size() / row;  // the plane's whole rows
    const BoundRegion& page = layout->page[p];
    const BoundRegion& slot = layout->slot[p];
    CAPTURE(p);
    CHECK(page.base == mem[p].data());
    // ATOM's slot rows: group g starts at row (slot_positions - 1 - g) * slot_rows from the top.
    for (std::uint32_t grp = 0; grp < c->num_slots; ++grp)
      CHECK(slot.unit(grp) == mem[p].data() + (rows - (grp + 1) * g->slot_rows) * row);
    // The gap lies between the PAGE area and the lowest slot.
    CHECK(slot.base == page.base + page.total_bytes + gap_rows * row);
  }
  // A SLOT image written by ATOM into group 1 at the top is what the bound group 1 reads.
  const BoundRegion& nope = layout->slot[0];
  const std::uint64_t rows0 = mem[0].size() / g->planes[0].row_bytes;
  std::byte* atom_group1 = mem[0].data() + (rows0 - 2 * g->slot_rows) * g->planes[0].row_bytes;
  for (std::uint64_t i = 0; i < nope.unit_bytes; ++i) atom_group1[i] = static_cast<std::byte>(i * 7 + 3);
  for (std::uint64_t i = 0; i < nope.unit_bytes; ++i)
    REQUIRE(nope.unit(1)[i] == static_cast<std::byte>(i * 7 + 3));
  // The PAGE blocks never reach into it: the last block ends below the gap.
  const BoundRegion& page0 = layout->page[0];
  CHECK(page0.base + page0.total_bytes <= nope.base);
}

TEST_CASE("the reference's chained block hash chains xxh64 over i64 tokens") {
  std::vector<std::uint32_t> tokens(10);
  for (std::uint32_t i = 0; i < 10; ++i) tokens[i] = i + 1;
  std::uint64_t h4 = chained_block_hash(std::span(tokens).first(4), 4);
  std::uint64_t h8 = chained_block_hash(std::span(tokens).first(8), 4);
  CHECK(h4 != 0);
  CHECK(h8 != h4);
  CHECK(chained_block_hash(tokens, 4) == h8);  // the partial block does not count
  CHECK(chained_block_hash(std::span(tokens).first(3), 4) == 0);
}

TEST_CASE("the reference's sidecar key test vector (§3.2)") {
  SlotIdentity id;
  for (std::size_t i = 0; i < 16; ++i) id.fingerprint[i] = static_cast<std::byte>(i * 0x11);
  id.tp_size = 4;
  id.tp_rank = 1;
  std::string canonical = sidecar_canonical(0x123, id);
  CHECK(canonical == "atom-slot-v1:4:1:0000000000000123:00112233445566778899aabbccddeeff");
  CHECK(atom_storage_hash(canonical) == 10062454250606645ull);
  // The libtier key follows the same identity: rank-local, boundary- and fingerprint-bound.
  tier::ObjectKey k = slot_key(tier::Key128{1, 2}, Boundary{64, 0x123}, id);
  CHECK(k.rank == 1);
  CHECK(k == slot_key(tier::Key128{1, 2}, Boundary{128, 0x123}, id));  // tokens are not keyed
  CHECK_FALSE(k == slot_key(tier::Key128{1, 2}, Boundary{64, 0x124}, id));
  id.tp_rank = 2;
  CHECK_FALSE(k == slot_key(tier::Key128{1, 2}, Boundary{64, 0x123}, id));
}

TEST_CASE("the sidecar key changes across hash, fingerprint and tp geometry") {
  SlotIdentity id;
  for (std::size_t i = 0; i < 16; ++i) id.fingerprint[i] = static_cast<std::byte>(i);
  id.tp_size = 4;
  id.tp_rank = 1;
  const tier::Key128 ns{1, 2};
  const Boundary b{64, 0x123};
  const tier::ObjectKey base = slot_key(ns, b, id);
  const std::string canonical = sidecar_canonical(b.block_hash, id);
  CHECK(base == slot_key(ns, b, id));  // deterministic
  CHECK(canonical == sidecar_canonical(b.block_hash, id));
  auto differs = [&](const Boundary& b2, const SlotIdentity& id2) {
    CHECK_FALSE(slot_key(ns, b2, id2) == base);
    CHECK(sidecar_canonical(b2.block_hash, id2) != canonical);
  };
  differs({64, 0x124}, id);
  SlotIdentity fp = id;
  fp.fingerprint[15] ^= std::byte{1};
  differs(b, fp);
  SlotIdentity size = id;
  size.tp_size = 8;
  differs(b, size);
  SlotIdentity rank = id;
  rank.tp_rank = 2;
  differs(b, rank);
  CHECK_FALSE(slot_key(tier::Key128{1, 3}, b, id) == base);  // another PAGE namespace
}

TEST_CASE("BLAKE2b matches RFC 7693 and long inputs") {
  auto hex = [](const std::vector<std::uint8_t>& d) {
    std::string s;
    for (auto b : d) s += fmt::format("{:02x}", b);
    return s;
  };
  const char abc[] = "abc";
  CHECK(hex(blake2b(std::as_bytes(std::span(abc, 3)), 64)) ==
        "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1"
        "7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923");
  CHECK(hex(blake2b({}, 8)) == "e4a6a0577479b2b4");
  std::vector<std::byte> big(300);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>(i);
  CHECK(hex(blake2b(big, 16)) == "15f53a13900056879b859fc1bcea544d");
  CHECK(hex(blake2b(std::span(big).first(128), 16)) == "a74787004ef589e31149183900d0294a");
  CHECK(hex(blake2b(std::span(big).first(256), 16)) == "c2472c0ac37a8dbdb25f05ada0d82643");
  CHECK(blake2b(big, 0).empty());
}
