#include "tier/engine/dsv4_layout.hpp"

#include <xxhash.h>

#include <cstring>

namespace tier::engine {
namespace {

// The per-boundary SLOT codec, owning the SlotBoundaryCodec that refers to the layout's SlotCodec.
class BoundSlotCodec final : public Codec {
 public:
  explicit BoundSlotCodec(dsv4::SlotBoundaryCodec inner) : inner_(inner) {}
  std::string_view name() const noexcept override { return inner_.name(); }
  std::uint32_t layout_id() const noexcept override { return inner_.layout_id(); }
  Result<std::size_t> encoded_size(RegionList src) const noexcept override {
    return inner_.encoded_size(src);
  }
  Result<std::size_t> encode(RegionList src, std::span<std::byte> dst) const noexcept override {
    return inner_.encode(src, dst);
  }
  Status decode(std::span<const std::byte> payload, RegionList dst) const noexcept override {
    return inner_.decode(payload, dst);
  }

 private:
  dsv4::SlotBoundaryCodec inner_;
};

void fill(std::span<std::byte> out, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  std::size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, 8);
  }
  for (; i < out.size(); ++i) out[i] = static_cast<std::byte>(x >> (8 * (i % 8)));
}

}  // namespace

Result<std::unique_ptr<Dsv4Layout>> Dsv4Layout::create(const dsv4::Geometry& geometry,
                                                       const Key128& page_namespace,
                                                       std::uint32_t tp_size,
                                                       std::uint32_t tp_rank) {
  std::unique_ptr<Dsv4Layout> l(new Dsv4Layout());
  l->geometry_ = geometry;
  std::vector<Region> regions;
  try {
    for (const auto& b : geometry.backings) {
      l->backings_.emplace_back(b.bytes);
      regions.push_back(host_region(l->backings_.back()));
    }
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "dsv4 layout: cannot allocate the KV memory");
  }
  TIER_ASSIGN_OR_RETURN(auto bound, dsv4::bind_layout(geometry, regions));
  TIER_ASSIGN_OR_RETURN(l->page_, dsv4::PageCodec::create(bound.page, geometry.config.num_blocks));
  dsv4::SlotIdentity id{dsv4::slot_fingerprint(geometry, page_namespace, tp_size, tp_rank), tp_size,
                        tp_rank};
  TIER_ASSIGN_OR_RETURN(l->slot_,
                        dsv4::SlotCodec::create(bound.slot, geometry.config.num_slots, id));
  return l;
}

Result<std::vector<Region>> Dsv4Layout::page_regions(
    std::span<const std::uint32_t> block_ids) const {
  return page_->describe(block_ids);
}

Result<std::vector<Region>> Dsv4Layout::slot_regions(std::int32_t group) const {
  if (group < 0) return Status::invalid("dsv4 layout: no state group");
  return slot_->describe(static_cast<std::uint32_t>(group));
}

Result<std::unique_ptr<Codec>> Dsv4Layout::slot_codec(const SlotIdentity& id) const {
  const auto& own = slot_->identity();
  if (id.tp_size != own.tp_size || id.tp_rank != own.tp_rank)
    return Status::invalid("dsv4 layout: SLOT identity of another rank");
  return std::unique_ptr<Codec>(
      new BoundSlotCodec(slot_->at(dsv4::Boundary{id.boundary_tokens, id.boundary_hash})));
}

void Dsv4Layout::fill_block(std::uint32_t block, std::uint64_t seed) {
  auto r = page_->describe(std::span(&block, 1));
  if (!r) return;
  std::uint64_t i = 0;
  for (const Region& x : *r) fill(x.bytes(), seed * 1315423911ull + i++);
}

void Dsv4Layout::fill_slot(std::int32_t group, std::uint64_t seed) {
  auto r = slot_regions(group);
  if (!r) return;
  std::uint64_t i = 0;
  for (const Region& x : *r) fill(x.bytes(), seed * 2654435761ull + i++);
}

void Dsv4Layout::zero_block(std::uint32_t block) {
  auto r = page_->describe(std::span(&block, 1));
  if (!r) return;
  for (const Region& x : *r) std::memset(x.data, 0, x.size);
}

void Dsv4Layout::zero_slot(std::int32_t group) {
  auto r = slot_regions(group);
  if (!r) return;
  for (const Region& x : *r) std::memset(x.data, 0, x.size);
}

std::uint64_t Dsv4Layout::digest_block(std::uint32_t block) const {
  auto r = page_->describe(std::span(&block, 1));
  if (!r) return 0;
  std::uint64_t h = 0;
  for (const Region& x : *r) h = XXH3_64bits_withSeed(x.data, x.size, h);
  return h;
}

std::uint64_t Dsv4Layout::digest_slot(std::int32_t group) const {
  auto r = slot_regions(group);
  if (!r) return 0;
  std::uint64_t h = 0;
  for (const Region& x : *r) h = XXH3_64bits_withSeed(x.data, x.size, h);
  return h;
}

}  // namespace tier::engine
