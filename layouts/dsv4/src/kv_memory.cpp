#include "kv_memory.hpp"

namespace tier::dsv4::detail {
namespace {

// A snapshot copied when it was taken.
struct Ready final : PendingImage {
  explicit Ready(std::size_t n) : bytes(n) {}
  Result<std::span<std::byte>> wait() override { return std::span(bytes); }
  std::vector<std::byte> bytes;
};

class HostMemory final : public KvMemory {
 public:
  explicit HostMemory(const dsv4::Geometry& g) {
    for (const auto& b : g.backings) {
      owned_.emplace_back(b.bytes);
      regions_.push_back(host_region(owned_.back()));
    }
  }
  const std::vector<Region>& backings() const noexcept override { return regions_; }
  CopyExecutor* executor() noexcept override { return nullptr; }
  Status order_after(void*, void*) override {
    return Status(Code::kNotSupported, "dsv4 layout: host KV memory has no device work to order");
  }
  Result<std::unique_ptr<PendingImage>> snapshot(const CopyPlan& plan, std::size_t header_bytes,
                                                 void*) override {
    try {
      auto image = std::make_unique<Ready>(header_bytes + plan.image_bytes);
      TIER_RETURN_IF_ERROR(
          host_copy_executor().gather(plan, std::span(image->bytes).subspan(header_bytes)));
      return std::unique_ptr<PendingImage>(std::move(image));
    } catch (const std::bad_alloc&) {
      return Status(Code::kNoSpace, "dsv4 layout: cannot allocate the snapshot");
    }
  }
  // A load into host memory is a copy on the caller's thread: a row would only add one.
  Result<Region> staging_row(std::size_t) override {
    return Status(Code::kNotSupported, "dsv4 layout: host KV memory stages no rows");
  }
  Status commit_row(const CopyPlan&, Region) override {
    return Status(Code::kNotSupported, "dsv4 layout: host KV memory stages no rows");
  }
  Status visit(RegionList regions, Access, const std::function<void(RegionList)>& fn) override {
    for (const Region& r : regions)
      if (!r.host_accessible()) return Status::invalid("host KV memory: a device region");
    fn(regions);
    return Status::ok();
  }

 private:
  std::vector<std::vector<std::byte>> owned_;
  std::vector<Region> regions_;
};

}  // namespace

Result<std::unique_ptr<KvMemory>> make_host_memory(const dsv4::Geometry& geometry) {
  try {
    return std::unique_ptr<KvMemory>(new HostMemory(geometry));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "dsv4 layout: cannot allocate the KV memory");
  }
}

}  // namespace tier::dsv4::detail
