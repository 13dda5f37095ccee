#include "identity_codec.hpp"

#include <fmt/format.h>

#include <cstring>

#include "tier/checked.hpp"
#include "tier/plugin.hpp"

namespace tier {
namespace {

Status check_host(RegionList regions) {
  for (std::size_t i = 0; i < regions.size(); ++i) {
    if (!regions[i].host_accessible() || (regions[i].data == nullptr && regions[i].size != 0))
      return Status::invalid(fmt::format("identity codec: region {} is not host memory", i));
  }
  return Status::ok();
}

constexpr tier_plugin kIdentity = make_codec_plugin<IdentityCodec>(
    "identity", "payload = the regions' bytes, concatenated in order", "[]");

}  // namespace

Result<std::unique_ptr<IdentityCodec>> IdentityCodec::create(const Json&) {
  return std::make_unique<IdentityCodec>();
}

Result<std::size_t> IdentityCodec::encoded_size(RegionList src) const noexcept {
  TIER_RETURN_IF_ERROR(check_host(src));
  return checked_total(src);
}

Result<std::size_t> IdentityCodec::encode(RegionList src, std::span<std::byte> dst) const noexcept {
  TIER_RETURN_IF_ERROR(check_host(src));
  TIER_ASSIGN_OR_RETURN(std::size_t need, checked_total(src));
  if (dst.size() < need)
    return Status::invalid(fmt::format("identity codec: {} bytes do not fit in {}", need,
                                       dst.size()));
  std::size_t off = 0;
  for (const Region& r : src) {
    if (r.size) std::memcpy(dst.data() + off, r.data, r.size);
    off += r.size;
  }
  return off;
}

Status IdentityCodec::decode(std::span<const std::byte> payload, RegionList dst) const noexcept {
  TIER_RETURN_IF_ERROR(check_host(dst));
  TIER_ASSIGN_OR_RETURN(std::size_t need, checked_total(dst));
  if (payload.size() != need)
    return Status::invalid(
        fmt::format("identity codec: payload of {} bytes for regions of {}", payload.size(), need));
  std::size_t off = 0;
  for (const Region& r : dst) {
    if (r.size) std::memcpy(r.data, payload.data() + off, r.size);
    off += r.size;
  }
  return Status::ok();
}

Result<DirectPayload> IdentityCodec::direct(RegionList regions) const noexcept {
  TIER_RETURN_IF_ERROR(check_host(regions));
  return DirectPayload{};
}

const tier_plugin* identity_codec_plugin() { return &kIdentity; }

}  // namespace tier
