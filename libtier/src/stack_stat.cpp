// TierStack::Impl::stat: where objects are stored and how large they are.
#include "tier/object.hpp"
#include "tier/tier_stack.hpp"
#include "tier_stack_impl.hpp"

namespace tier {

Status TierStack::Impl::stat(std::span<const ObjectKey> keys, std::span<ObjectStat> out) {
  if (out.size() != keys.size()) return Status::invalid("stat: out.size() != keys.size()");
  Call call_{*this};
  std::fill(out.begin(), out.end(), ObjectStat{});
  for (std::size_t t = 0; t < tiers_.size(); ++t) {
    if (!tiers_[t]->spec.read) continue;
    const int tier = static_cast<int>(t);
    std::vector<std::uint64_t> ids(keys.size(), 0);
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (out[i].tier < 0) {
        ids[i] = submit_one(tier, Op::kContains, keys[i], Region{}, Pending{}).value_or(0);
        reap(tier, 0, {});
      }
    wait_for(ids);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (ids[i] == 0) continue;
      const Completion c = take(ids[i]);
      if (!c.status.is_ok() || c.bytes < kObjectHeaderBytes) continue;
      out[i] = ObjectStat{tier, c.bytes - kObjectHeaderBytes, c.bytes};
    }
    if (!tiers_[t]->stage) continue;
    // The payload's size is the stage's to tell: read the image, then ask the stage.
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (out[i].tier != tier) continue;
      out[i].payload_bytes = 0;
      Image image = pool_.acquire(out[i].stored_bytes);
      Pending p;
      p.image = image;
      auto id = submit_one(tier, Op::kGet, keys[i], io_region(tier, *image), std::move(p));
      if (!id) continue;
      const std::uint64_t one[] = {*id};
      wait_for(one);
      const Completion c = take(*id);
      if (c.status.is_ok()) {
        const auto bytes = std::span<const std::byte>(image->data(), c.bytes);
        auto h = parse_object_header(bytes);
        auto n = h ? tiers_[t]->stage->decoded_size(
                         bytes.subspan(kObjectHeaderBytes, h->payload_bytes), h->format_id)
                   : Result<std::size_t>(h.status());
        if (n) out[i].payload_bytes = *n;
      }
      recycle(image);
    }
  }
  return Status::ok();
}

}  // namespace tier
