#include "kv_memory.hpp"

namespace tier::dsv4::detail {
namespace {

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
