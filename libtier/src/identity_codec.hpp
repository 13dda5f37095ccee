#pragma once
// The identity codec, built into the core: payload = the host regions' bytes in order.
#include "tier/codec.hpp"
#include "tier/json.hpp"
#include "tier/plugin.h"
#include <memory>

namespace tier {

class IdentityCodec final : public Codec {
 public:
  static Result<std::unique_ptr<IdentityCodec>> create(const Json& options);
  std::string_view name() const noexcept override { return "identity"; }
  std::uint32_t format_id() const noexcept override { return kIdentityLayoutId; }
  Result<std::size_t> encoded_size(RegionList src) const noexcept override;
  Result<std::size_t> encode(RegionList src, std::span<std::byte> dst) const noexcept override;
  Status decode(std::span<const std::byte> payload, RegionList dst) const noexcept override;
  Result<DirectPayload> direct(RegionList regions) const noexcept override;
};

const tier_plugin* identity_codec_plugin();

}  // namespace tier
