#include "tier/dsv4/page_codec.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "tier/dsv4/region_set.hpp"

namespace tier::dsv4 {

PageCodec::PageCodec(std::vector<BoundRegion> regions, std::uint64_t num_blocks,
                     CopyExecutor* executor)
    : regions_(std::move(regions)), num_blocks_(num_blocks), executor_(executor) {
  for (const auto& r : regions_) bytes_per_block_ += r.unit_bytes;
}

Result<std::unique_ptr<PageCodec>> PageCodec::create(std::vector<BoundRegion> regions,
                                                     std::uint64_t num_blocks,
                                                     CopyExecutor* executor) {
  TIER_RETURN_IF_ERROR(check_region_set(regions, num_blocks, false, "dsv4 PAGE"));
  if (num_blocks > std::uint64_t{UINT32_MAX} + 1)
    return Status::invalid("dsv4 PAGE: block ids are 32-bit");
  if (executor == nullptr) {
    if (regions[0].kind == MemoryKind::kDevice)
      return Status::invalid("dsv4 PAGE: device regions need a device copy executor");
    executor = &host_copy_executor();
  }
  return std::unique_ptr<PageCodec>(new PageCodec(std::move(regions), num_blocks, executor));
}

Result<std::vector<std::vector<Region>>> PageCodec::describe_groups(
    std::span<const std::vector<std::uint32_t>> groups) const {
  std::vector<std::uint32_t> all;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty()) return Status::invalid(fmt::format("dsv4 PAGE: group {} is empty", g));
    for (std::uint32_t id : groups[g]) {
      if (id >= num_blocks_)
        return Status::invalid(fmt::format("dsv4 PAGE: block id {} (group {}) is not in [0, {})",
                                           id, g, num_blocks_));
      all.push_back(id);
    }
  }
  std::sort(all.begin(), all.end());
  auto dup = std::adjacent_find(all.begin(), all.end());
  if (dup != all.end())
    return Status::invalid(fmt::format("dsv4 PAGE: block id {} appears twice", *dup));
  std::vector<std::vector<Region>> out(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    out[g].reserve(groups[g].size() * regions_.size());
    for (std::uint32_t id : groups[g])
      for (const BoundRegion& r : regions_)
        out[g].push_back(Region{r.unit(id), r.unit_bytes, r.kind, r.device});
  }
  return out;
}

Result<std::vector<Region>> PageCodec::describe(std::span<const std::uint32_t> block_ids) const {
  std::vector<std::uint32_t> group(block_ids.begin(), block_ids.end());
  TIER_ASSIGN_OR_RETURN(auto groups, describe_groups(std::span(&group, 1)));
  return std::move(groups[0]);
}

Result<PagePlan> PageCodec::plan(RegionList blocks) const {
  const std::size_t nr = regions_.size();
  if (blocks.empty() || blocks.size() % nr != 0)
    return Status::invalid(fmt::format(
        "dsv4 PAGE: {} spans do not describe whole blocks of {} regions", blocks.size(), nr));
  PagePlan p;
  p.kind_ = regions_[0].kind;
  p.device_ = regions_[0].device;
  p.spans_.reserve(blocks.size());
  p.blocks_.reserve(blocks.size() / nr);
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const BoundRegion& region = regions_[i % nr];
    TIER_ASSIGN_OR_RETURN(std::uint64_t id, unit_index(region, num_blocks_, blocks[i]));
    if (i % nr == 0) {
      p.blocks_.push_back(static_cast<std::uint32_t>(id));
    } else if (id != p.blocks_.back()) {
      return Status::invalid(fmt::format(
          "dsv4 PAGE: span {} names block {} inside the group of block {}", i, id,
          p.blocks_.back()));
    }
    p.spans_.push_back(CopySpan{blocks[i].data, offset, region.unit_bytes});
    offset += region.unit_bytes;
  }
  std::vector<std::uint32_t> sorted = p.blocks_;
  std::sort(sorted.begin(), sorted.end());
  auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end())
    return Status::invalid(fmt::format("dsv4 PAGE: block id {} appears twice", *dup));
  p.image_bytes_ = offset;
  return p;
}

Result<std::size_t> PageCodec::encoded_size(RegionList src) const noexcept {
  const std::size_t nr = regions_.size();
  if (src.empty() || src.size() % nr != 0)
    return Status::invalid(fmt::format(
        "dsv4 PAGE: {} spans do not describe whole blocks of {} regions", src.size(), nr));
  return src.size() / nr * bytes_per_block_;
}

Result<std::size_t> PageCodec::encode(RegionList src, std::span<std::byte> dst) const noexcept {
  try {
    TIER_ASSIGN_OR_RETURN(PagePlan p, plan(src));
    const CopyPlan cp = p.plan();
    if (dst.size() < cp.image_bytes)
      return Status::invalid(fmt::format("dsv4 PAGE: image of {} bytes does not fit in {}",
                                         cp.image_bytes, dst.size()));
    TIER_RETURN_IF_ERROR(executor_->gather(cp, dst));
    return static_cast<std::size_t>(cp.image_bytes);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "dsv4 PAGE: out of memory building the plan");
  }
}

Status PageCodec::decode(std::span<const std::byte> payload, RegionList dst) const noexcept {
  try {
    TIER_ASSIGN_OR_RETURN(PagePlan p, plan(dst));
    const CopyPlan cp = p.plan();
    if (payload.size() != cp.image_bytes)
      return Status(Code::kChecksumMismatch,
                    fmt::format("dsv4 PAGE: payload of {} bytes, the {} blocks take {}",
                                payload.size(), p.blocks().size(), cp.image_bytes));
    return executor_->scatter(cp, payload);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "dsv4 PAGE: out of memory building the plan");
  }
}

Result<DirectPayload> PageCodec::direct(RegionList regions) const noexcept {
  try {
    TIER_ASSIGN_OR_RETURN(PagePlan p, plan(regions));
    // A tier writes device regions on its own stream: it must follow this executor's order.
    if (p.plan().engine_kind == MemoryKind::kDevice) TIER_RETURN_IF_ERROR(executor_->share_order());
    return DirectPayload{};
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "dsv4 PAGE: out of memory building the plan");
  }
}

}  // namespace tier::dsv4
