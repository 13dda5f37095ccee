#include "tier/dsv4/kv_layout.hpp"

#include "kv_memory.hpp"

namespace tier::dsv4 {
namespace {

// The per-boundary SLOT codec, owning the SlotBoundaryCodec that refers to the layout's SlotCodec.
class BoundSlotCodec final : public Codec {
 public:
  explicit BoundSlotCodec(dsv4::SlotBoundaryCodec inner) : inner_(inner) {}
  std::string_view name() const noexcept override { return inner_.name(); }
  std::uint32_t format_id() const noexcept override { return inner_.format_id(); }
  Result<std::size_t> encoded_size(RegionList src) const noexcept override {
    return inner_.encoded_size(src);
  }
  Result<std::size_t> encode(RegionList src, std::span<std::byte> dst) const noexcept override {
    return inner_.encode(src, dst);
  }
  Status decode(std::span<const std::byte> payload, RegionList dst) const noexcept override {
    return inner_.decode(payload, dst);
  }
  Result<DirectPayload> direct(RegionList regions) const noexcept override {
    return inner_.direct(regions);
  }

 private:
  dsv4::SlotBoundaryCodec inner_;
};

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

Result<std::unique_ptr<Codec>> Dsv4Layout::slot_codec(const engine::SlotIdentity& id) const {
  const auto& own = slot_->identity();
  if (id.tp_size != own.tp_size || id.tp_rank != own.tp_rank)
    return Status::invalid("dsv4 layout: SLOT identity of another rank");
  return std::unique_ptr<Codec>(
      new BoundSlotCodec(slot_->at(dsv4::Boundary{id.boundary_tokens, id.boundary_hash})));
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
  const auto& own = slot_->identity();
  if (id.tp_size != own.tp_size || id.tp_rank != own.tp_rank)
    return Status::invalid("dsv4 layout: SLOT identity of another rank");
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
