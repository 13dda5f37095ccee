#include "tier/dsv4/kv_layout.hpp"

#include "kv_memory.hpp"

namespace tier::dsv4 {
namespace {

// A snapshot gathered by the KV memory, framed by the boundary's codec once it landed.
class FramedSnapshot final : public engine::SlotSnapshot {
 public:
  FramedSnapshot(dsv4::SlotBoundaryCodec codec, std::unique_ptr<detail::PendingImage> image)
      : codec_(codec), image_(std::move(image)) {}
  std::uint32_t format_id() const noexcept override { return codec_.format_id(); }
  Result<std::span<const std::byte>> frame() override {
    TIER_ASSIGN_OR_RETURN(std::span<std::byte> f, image_->wait());
    TIER_ASSIGN_OR_RETURN(std::size_t n, codec_.seal(f));
    return std::span<const std::byte>(f.first(n));
  }

 private:
  dsv4::SlotBoundaryCodec codec_;
  std::unique_ptr<detail::PendingImage> image_;
};

}  // namespace

// The row a load writes a SLOT into (stage_slot), released on destruction.
class Dsv4Layout::StagedSlot final : public engine::SlotStaging {
 public:
  StagedSlot(Dsv4Layout& owner, dsv4::SlotBoundaryCodec codec, std::vector<Region> row,
             dsv4::SlotPlan group)
      : owner_(owner), codec_(codec), row_(std::move(row)), group_(std::move(group)) {}
  ~StagedSlot() override {
    std::lock_guard<std::mutex> lock(owner_.staging_mu_);
    owner_.staging_held_ = false;
  }
  RegionList regions() const noexcept override { return row_; }
  const Codec& codec() const noexcept override { return codec_; }
  // The row's regions lie back to back in slot image order: the row is the group's image.
  Status commit() override {
    const Region& first = row_.front();
    return owner_.memory_->commit_row(
        group_.plan(), Region{first.data, owner_.slot_->slot_bytes(), first.kind, first.device});
  }

 private:
  Dsv4Layout& owner_;
  dsv4::SlotBoundaryCodec codec_;
  std::vector<Region> row_;
  dsv4::SlotPlan group_;
};

std::string_view kv_memory_name(KvMemoryKind k) noexcept {
  return k == KvMemoryKind::kDevice ? "device" : "host";
}

std::span<const OptionSpec> Dsv4LayoutOptions::options() {
  static const std::vector<OptionSpec> specs = {
      {"memory",
       OptionType::kEnum,
       Json("host"),
       "where the rank's KV memory lives: host memory, or GPU memory moved by the GPU copy "
       "executor (NotSupported without a GPU)",
       std::nullopt,
       std::nullopt,
       {"host", "device"}},
      {"device",
       OptionType::kUInt,
       Json(0),
       "GPU ordinal of the KV memory when memory is \"device\"",
       0.0,
       1024.0,
       {}},
  };
  return specs;
}

Result<Dsv4LayoutOptions> Dsv4LayoutOptions::from_json(const Json& j, const std::string& path) {
  ConfigErrors errors;
  Json r = resolve_options(j, options(), path, errors);
  if (!errors.empty()) return errors.to_status();
  Dsv4LayoutOptions o;
  o.memory =
      r.at("memory").get<std::string>() == "device" ? KvMemoryKind::kDevice : KvMemoryKind::kHost;
  o.device = r.at("device").get<int>();
  return o;
}

Json Dsv4LayoutOptions::to_json() const {
  return {{"memory", std::string(kv_memory_name(memory))}, {"device", device}};
}

Dsv4Layout::Dsv4Layout() = default;
Dsv4Layout::~Dsv4Layout() = default;

Result<std::unique_ptr<Dsv4Layout>> Dsv4Layout::create(const dsv4::Geometry& geometry,
                                                       const Key128& page_namespace,
                                                       std::uint32_t tp_size, std::uint32_t tp_rank,
                                                       const Dsv4LayoutOptions& options) {
  std::unique_ptr<Dsv4Layout> l(new Dsv4Layout());
  l->geometry_ = geometry;
  l->page_namespace_ = page_namespace;
  l->tp_size_ = tp_size;
  l->options_ = options;
  if (options.memory == KvMemoryKind::kDevice) {
    TIER_ASSIGN_OR_RETURN(l->memory_, detail::make_device_memory(geometry, options.device));
  } else {
    TIER_ASSIGN_OR_RETURN(l->memory_, detail::make_host_memory(geometry));
  }
  CopyExecutor* exec = l->memory_->executor();
  TIER_ASSIGN_OR_RETURN(auto bound, dsv4::bind_memory(geometry, l->memory_->backings()));
  TIER_ASSIGN_OR_RETURN(l->page_,
                        dsv4::PageCodec::create(bound.page, geometry.config.num_blocks, exec));
  dsv4::SlotIdentity id{dsv4::slot_fingerprint(geometry, page_namespace, tp_size, tp_rank), tp_size,
                        tp_rank};
  TIER_ASSIGN_OR_RETURN(l->slot_,
                        dsv4::SlotCodec::create(bound.slot, geometry.config.num_slots, id, exec));
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

Status Dsv4Layout::same_rank(const engine::SlotIdentity& id) const {
  const auto& own = slot_->identity();
  if (id.tp_size != own.tp_size || id.tp_rank != own.tp_rank)
    return Status::invalid("dsv4 layout: SLOT identity of another rank");
  return Status::ok();
}

Result<std::unique_ptr<Codec>> Dsv4Layout::slot_codec(const engine::SlotIdentity& id) const {
  TIER_RETURN_IF_ERROR(same_rank(id));
  return std::unique_ptr<Codec>(
      new dsv4::SlotBoundaryCodec(slot_->at(dsv4::Boundary{id.boundary_tokens, id.boundary_hash})));
}

Result<std::unique_ptr<engine::SlotStaging>> Dsv4Layout::stage_slot(
    const engine::SlotIdentity& id, std::int32_t group) {
  if (options_.memory != KvMemoryKind::kDevice)
    return Status(Code::kNotSupported, "dsv4 layout: host KV memory stages no SLOT rows");
  TIER_RETURN_IF_ERROR(same_rank(id));
  TIER_ASSIGN_OR_RETURN(auto dst, slot_regions(group));
  TIER_ASSIGN_OR_RETURN(dsv4::SlotPlan plan, slot_->plan(dst));
  std::lock_guard<std::mutex> lock(staging_mu_);
  if (staging_held_) return Status(Code::kRejected, "dsv4 layout: the SLOT staging row is in use");
  try {
    if (!staging_) {
      TIER_ASSIGN_OR_RETURN(Region row, memory_->staging_row(slot_->slot_bytes()));
      // One group per region, back to back in the order of the slot image.
      std::vector<dsv4::BoundRegion> rows = slot_->regions();
      std::uint64_t offset = 0;
      for (dsv4::BoundRegion& r : rows) {
        r.base = row.data + offset;
        r.total_bytes = r.unit_bytes;
        r.kind = row.kind;
        r.device = row.device;
        offset += r.unit_bytes;
      }
      TIER_ASSIGN_OR_RETURN(staging_,
                            dsv4::SlotCodec::create(std::move(rows), 1, slot_->identity(),
                                                    memory_->executor()));
    }
    TIER_ASSIGN_OR_RETURN(auto row, staging_->describe(0));
    auto staged = std::make_unique<StagedSlot>(
        *this, staging_->at(dsv4::Boundary{id.boundary_tokens, id.boundary_hash}), std::move(row),
        std::move(plan));
    staging_held_ = true;
    return std::unique_ptr<engine::SlotStaging>(std::move(staged));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "dsv4 layout: out of memory");
  }
}

std::uint32_t Dsv4Layout::block_tokens() const noexcept {
  return geometry_.config.block_size * geometry_.config.dcp_size;
}

std::array<std::byte, 16> Dsv4Layout::slot_fingerprint(std::uint32_t tp_rank) const {
  return dsv4::slot_fingerprint(geometry_, page_namespace_, tp_size_, tp_rank);
}

Status Dsv4Layout::order_after(const engine::DeviceOrder& after) {
  if (after.empty()) return Status::ok();
  return memory_->order_after(after.stream, after.event);
}

Result<std::unique_ptr<engine::SlotSnapshot>> Dsv4Layout::snapshot_slot(
    const engine::SlotIdentity& id, std::int32_t group, const engine::DeviceOrder& after) {
  TIER_RETURN_IF_ERROR(same_rank(id));
  if (id.boundary_tokens == 0) return Status::invalid("dsv4 SLOT: boundary of 0 tokens");
  TIER_ASSIGN_OR_RETURN(auto regions, slot_regions(group));
  TIER_ASSIGN_OR_RETURN(dsv4::SlotPlan plan, slot_->plan(regions));
  TIER_ASSIGN_OR_RETURN(auto image, memory_->snapshot(plan.plan(), kAos1HeaderBytes, after.stream));
  try {
    return std::unique_ptr<engine::SlotSnapshot>(new FramedSnapshot(
        slot_->at(dsv4::Boundary{id.boundary_tokens, id.boundary_hash}), std::move(image)));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "dsv4 layout: out of memory");
  }
}

Status Dsv4Layout::visit_host(RegionList regions, HostAccess access,
                              const std::function<void(RegionList views)>& fn) {
  using Access = detail::KvMemory::Access;
  return memory_->visit(regions, access == HostAccess::kRead ? Access::kRead : Access::kWrite, fn);
}

}  // namespace tier::dsv4
