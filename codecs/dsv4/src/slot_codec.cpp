#include "tier/dsv4/slot_codec.hpp"

#include <xxhash.h>

#include <cstring>
#include <string>

#include <fmt/format.h>

#include "tier/dsv4/blake2b.hpp"
#include "tier/dsv4/region_set.hpp"

namespace tier::dsv4 {
namespace {

void put_le64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

Fingerprint slot_fingerprint(const Geometry& geometry, const Key128& page_namespace,
                             std::uint32_t tp_size, std::uint32_t tp_rank) {
  Json identity = {{"layout", geometry.slot_format_json()},
                   {"page_namespace", page_namespace.hex()},
                   {"tp_size", tp_size},
                   {"tp_rank", tp_rank}};
  std::string text("libtier-dsv4-slot-fingerprint-v1", 32);
  text.push_back('\0');
  text += canonical_json(identity);
  XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  std::string bytes;
  put_le64(bytes, h.low64);
  put_le64(bytes, h.high64);
  Fingerprint fp;
  std::memcpy(fp.data(), bytes.data(), 16);
  return fp;
}

std::string sidecar_canonical(std::uint64_t boundary_block_hash, const SlotIdentity& identity) {
  std::string fp;
  for (std::byte b : identity.fingerprint) fp += fmt::format("{:02x}", std::to_integer<unsigned>(b));
  return fmt::format("atom-slot-v1:{}:{}:{:016x}:{}", identity.tp_size, identity.tp_rank,
                     boundary_block_hash, fp);
}

std::uint64_t atom_storage_hash(std::string_view canonical) {
  auto digest = blake2b(std::as_bytes(std::span(canonical.data(), canonical.size())), 8);
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(digest[i]) << (8 * i);
  return v & 0x7fffffffffffffffull;
}

ObjectKey slot_key(const Key128& page_namespace, const Boundary& boundary,
                   const SlotIdentity& identity) {
  std::string text("libtier-dsv4-slot-key-v1", 24);
  text.push_back('\0');
  text += sidecar_canonical(boundary.block_hash, identity);
  XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  return ObjectKey{page_namespace, Key128{h.low64, h.high64}, identity.tp_rank};
}

std::uint64_t chained_block_hash(std::span<const std::uint32_t> tokens, std::size_t block_tokens) {
  if (block_tokens == 0) return 0;
  std::uint64_t h = 0;
  std::string buf;
  for (std::size_t b = 0; (b + 1) * block_tokens <= tokens.size(); ++b) {
    buf.clear();
    if (b > 0) put_le64(buf, h);
    for (std::size_t i = 0; i < block_tokens; ++i)
      put_le64(buf, static_cast<std::uint64_t>(static_cast<std::int64_t>(tokens[b * block_tokens + i])));
    h = XXH64(buf.data(), buf.size(), 0);
  }
  return h;
}

SlotCodec::SlotCodec(std::vector<BoundRegion> regions, std::uint64_t num_slots,
                     SlotIdentity identity, CopyExecutor* executor)
    : regions_(std::move(regions)), num_slots_(num_slots), identity_(identity),
      executor_(executor) {
  for (const auto& r : regions_) slot_bytes_ += r.unit_bytes;
}

Result<std::unique_ptr<SlotCodec>> SlotCodec::create(std::vector<BoundRegion> regions,
                                                     std::uint64_t num_slots,
                                                     SlotIdentity identity,
                                                     CopyExecutor* executor) {
  TIER_RETURN_IF_ERROR(check_region_set(regions, num_slots, true, "dsv4 SLOT"));
  if (num_slots > std::uint64_t{UINT32_MAX} + 1)
    return Status::invalid("dsv4 SLOT: slot groups are 32-bit");
  if (identity.tp_size == 0 || identity.tp_rank >= identity.tp_size)
    return Status::invalid(fmt::format("dsv4 SLOT: tp_rank {} is not below tp_size {}",
                                       identity.tp_rank, identity.tp_size));
  if (executor == nullptr) {
    if (regions[0].kind == MemoryKind::kDevice)
      return Status::invalid("dsv4 SLOT: device regions need a device copy executor");
    executor = &host_copy_executor();
  }
  return std::unique_ptr<SlotCodec>(
      new SlotCodec(std::move(regions), num_slots, identity, executor));
}

Result<std::vector<Region>> SlotCodec::describe(std::uint32_t group) const {
  if (group >= num_slots_)
    return Status::invalid(fmt::format("dsv4 SLOT: group {} is not in [0, {})", group, num_slots_));
  std::vector<Region> out;
  out.reserve(regions_.size());
  for (const BoundRegion& r : regions_)
    out.push_back(Region{r.unit(group), r.unit_bytes, r.kind, r.device});
  return out;
}

Result<SlotPlan> SlotCodec::plan(RegionList slot) const {
  if (slot.size() != regions_.size())
    return Status::invalid(fmt::format("dsv4 SLOT: {} spans for {} regions", slot.size(),
                                       regions_.size()));
  SlotPlan p;
  p.kind_ = regions_[0].kind;
  p.device_ = regions_[0].device;
  p.spans_.reserve(slot.size());
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < slot.size(); ++i) {
    TIER_ASSIGN_OR_RETURN(std::uint64_t g, unit_index(regions_[i], num_slots_, slot[i]));
    if (i == 0) p.group_ = static_cast<std::uint32_t>(g);
    else if (g != p.group_)
      return Status::invalid(fmt::format("dsv4 SLOT: span {} names group {}, span 0 group {}", i,
                                         g, p.group_));
    p.spans_.push_back(CopySpan{slot[i].data, offset, regions_[i].unit_bytes});
    offset += regions_[i].unit_bytes;
  }
  p.image_bytes_ = offset;
  return p;
}

SlotBoundaryCodec SlotCodec::at(const Boundary& boundary) const noexcept {
  return SlotBoundaryCodec(*this, boundary);
}

Aos1Expect SlotBoundaryCodec::expectations() const noexcept {
  const SlotIdentity& id = slot_->identity();
  return Aos1Expect{boundary_.tokens, boundary_.block_hash, slot_->slot_bytes(), id.fingerprint,
                    id.tp_size, id.tp_rank};
}

Result<std::size_t> SlotBoundaryCodec::encoded_size(RegionList src) const noexcept {
  if (src.size() != slot_->regions().size())
    return Status::invalid(fmt::format("dsv4 SLOT: {} spans for {} regions", src.size(),
                                       slot_->regions().size()));
  return static_cast<std::size_t>(kAos1HeaderBytes + slot_->slot_bytes());
}

Result<std::size_t> SlotBoundaryCodec::encode(RegionList src,
                                              std::span<std::byte> dst) const noexcept {
  try {
    if (boundary_.tokens == 0) return Status::invalid("dsv4 SLOT: boundary of 0 tokens");
    TIER_ASSIGN_OR_RETURN(SlotPlan p, slot_->plan(src));
    const CopyPlan cp = p.plan();
    const std::size_t total = kAos1HeaderBytes + cp.image_bytes;
    if (dst.size() < total)
      return Status::invalid(fmt::format("dsv4 SLOT: frame of {} bytes does not fit in {}", total,
                                         dst.size()));
    auto frame = dst.first(total);
    TIER_RETURN_IF_ERROR(slot_->executor().gather(cp, frame.subspan(kAos1HeaderBytes)));
    return seal(frame);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "dsv4 SLOT: out of memory building the plan");
  }
}

Result<std::size_t> SlotBoundaryCodec::seal(std::span<std::byte> frame) const noexcept {
  try {
    if (boundary_.tokens == 0) return Status::invalid("dsv4 SLOT: boundary of 0 tokens");
    if (frame.size() != kAos1HeaderBytes + slot_->slot_bytes())
      return Status::invalid(fmt::format("dsv4 SLOT: a frame of {} bytes, not {}", frame.size(),
                                         kAos1HeaderBytes + slot_->slot_bytes()));
    Aos1Header h;
    h.boundary_tokens = boundary_.tokens;
    h.boundary_block_hash = boundary_.block_hash;
    h.fingerprint = slot_->identity().fingerprint;
    h.tp_size = slot_->identity().tp_size;
    h.tp_rank = slot_->identity().tp_rank;
    Aos1Error e = finalize_aos1(frame, h);
    if (e != Aos1Error::kNone) return aos1_status(e);
    return frame.size();
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "dsv4 SLOT: out of memory");
  }
}

Status SlotBoundaryCodec::decode(std::span<const std::byte> payload,
                                 RegionList dst) const noexcept {
  try {
    TIER_ASSIGN_OR_RETURN(SlotPlan p, slot_->plan(dst));
    Aos1Decoded d = decode_aos1(payload, expectations());
    if (d.error != Aos1Error::kNone) return aos1_status(d.error);
    return slot_->executor().scatter(p.plan(), d.payload);
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "dsv4 SLOT: out of memory building the plan");
  }
}

Result<DirectPayload> SlotBoundaryCodec::direct(RegionList regions) const noexcept {
  try {
    TIER_ASSIGN_OR_RETURN(SlotPlan p, slot_->plan(regions));
    // A tier writes device regions on its own stream: it must follow this executor's order.
    if (p.plan().engine_kind == MemoryKind::kDevice)
      TIER_RETURN_IF_ERROR(slot_->executor().share_order());
    return DirectPayload{kAos1HeaderBytes, this};
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoSpace, "dsv4 SLOT: out of memory building the plan");
  }
}

namespace {

// aos1_status() for the noexcept checks: a refusal whose message cannot be built is still one.
Status refused(Aos1Error e) noexcept {
  try {
    return aos1_status(e);
  } catch (...) {
    return Status(Code::kChecksumMismatch, "aos1 frame refused");
  }
}

}  // namespace

Result<std::optional<CrcClaim>> SlotBoundaryCodec::check_head(
    std::span<const std::span<std::byte>> frame) const noexcept {
  Aos1Header h;
  const Aos1Error e = check_aos1_fields(frame, expectations(), h);
  if (e != Aos1Error::kNone) return refused(e);
  return std::optional<CrcClaim>(CrcClaim{kAos1HeaderBytes, h.payload_crc32});
}

Status SlotBoundaryCodec::check(std::span<const std::span<std::byte>> frame) const noexcept {
  Aos1Header h;
  const Aos1Error e = check_aos1(frame, expectations(), h);
  return e == Aos1Error::kNone ? Status::ok() : refused(e);
}

}  // namespace tier::dsv4
