#include "resume_store.hpp"

#include <fmt/format.h>

namespace tier::dsv4 {
namespace {

bool is_corrupt(const Status& s) {
  // Requests are validated before any tier is asked, so InvalidArgument from a load means the
  // stored object does not fit its key (wrong layout or size), like a failed checksum.
  return s == Code::kChecksumMismatch || s == Code::kInvalidArgument;
}

}  // namespace

std::string_view resume_miss_name(ResumeMiss m) noexcept {
  switch (m) {
    case ResumeMiss::kNone: return "hit";
    case ResumeMiss::kInvalid: return "invalid";
    case ResumeMiss::kPageUnavailable: return "page_unavailable";
    case ResumeMiss::kSidecarUnavailable: return "sidecar_unavailable";
    case ResumeMiss::kPageCorrupt: return "page_corrupt";
    case ResumeMiss::kSidecarCorrupt: return "sidecar_corrupt";
    case ResumeMiss::kIoError: return "io_error";
  }
  return "unknown";
}

ObjectKey ResumeStore::sidecar_key(const Boundary& boundary) const {
  return slot_key(ns_, boundary, slot_.identity());
}

Status ResumeStore::invalidate(const ObjectKey& key) {
  fenced_.insert(key);  // fence first: no put of this key until removal is confirmed
  Status s = stack_.remove(key);
  if (s.is_ok()) fenced_.erase(key);
  return s;
}

Status ResumeStore::clear_fences(std::span<const ObjectKey> keys) {
  for (const ObjectKey& k : keys) {
    if (!fenced(k)) continue;
    Status s = invalidate(k);
    if (!s.is_ok())
      return Status(Code::kRejected,
                    fmt::format("key {} is fenced: its corrupt copy could not be removed ({})",
                                k.to_string(), s.to_string()));
  }
  return Status::ok();
}

Status ResumeStore::save(const ResumePoint& point) {
  if (point.page_keys.size() != point.page_blocks.size())
    return Status::invalid("resume point: one block list per PAGE key");
  if (point.boundary.tokens == 0) return Status::invalid("resume point: boundary of 0 tokens");
  TIER_ASSIGN_OR_RETURN(auto page_regions, page_.describe_groups(point.page_blocks));
  TIER_ASSIGN_OR_RETURN(auto slot_regions, slot_.describe(point.slot_group));
  const ObjectKey skey = sidecar_key(point.boundary);
  std::vector<ObjectKey> all = point.page_keys;
  all.push_back(skey);
  TIER_RETURN_IF_ERROR(clear_fences(all));

  std::vector<SaveItem> items;
  for (std::size_t i = 0; i < point.page_keys.size(); ++i)
    items.push_back(SaveItem{point.page_keys[i], page_regions[i]});
  std::vector<Status> out(items.size());
  if (!items.empty()) TIER_RETURN_IF_ERROR(stack_.save(items, page_, out));
  for (std::size_t i = 0; i < out.size(); ++i)
    if (!out[i].is_ok())
      return Status(out[i].code(), fmt::format("PAGE chunk {} not stored, sidecar withheld: {}", i,
                                               out[i].message()));
  const SlotBoundaryCodec codec = slot_.at(point.boundary);
  SaveItem sitem{skey, slot_regions};
  Status sout;
  TIER_RETURN_IF_ERROR(stack_.save(std::span(&sitem, 1), codec, std::span(&sout, 1)));
  return sout;
}

void ResumeStore::on_corrupt(const ObjectKey& key, ResumeLoad& out) {
  if (invalidate(key).is_ok()) out.invalidated.push_back(key);
  else out.still_fenced.push_back(key);
}

ResumeLoad ResumeStore::load(const ResumePoint& point) {
  ResumeLoad out;
  auto miss = [&](ResumeMiss m, Status s) {
    out.miss = m;
    out.status = std::move(s);
    return std::move(out);
  };
  if (point.page_keys.size() != point.page_blocks.size())
    return miss(ResumeMiss::kInvalid, Status::invalid("resume point: one block list per PAGE key"));
  if (point.boundary.tokens == 0)
    return miss(ResumeMiss::kInvalid, Status::invalid("resume point: boundary of 0 tokens"));
  auto page_regions = page_.describe_groups(point.page_blocks);
  if (!page_regions) return miss(ResumeMiss::kInvalid, page_regions.status());
  auto slot_regions = slot_.describe(point.slot_group);
  if (!slot_regions) return miss(ResumeMiss::kInvalid, slot_regions.status());
  const ObjectKey skey = sidecar_key(point.boundary);

  // Presence of the whole unit before any byte moves.
  auto present = stack_.lookup_prefix(point.page_keys);
  if (!present) return miss(ResumeMiss::kIoError, present.status());
  if (*present < point.page_keys.size())
    return miss(ResumeMiss::kPageUnavailable,
                Status::not_found(fmt::format("PAGE chunk {} of {} is absent", *present,
                                              point.page_keys.size())));
  auto where = stack_.locate(skey);
  if (!where) return miss(ResumeMiss::kIoError, where.status());
  if (*where < 0)
    return miss(ResumeMiss::kSidecarUnavailable, Status::not_found("no sidecar at the boundary"));

  std::vector<LoadItem> items;
  for (std::size_t i = 0; i < point.page_keys.size(); ++i)
    items.push_back(LoadItem{point.page_keys[i], (*page_regions)[i]});
  std::vector<LoadResult> results(items.size());
  if (!items.empty()) {
    Status s = stack_.load(items, page_, results);
    if (!s) return miss(ResumeMiss::kIoError, s);
  }
  ResumeMiss page_miss = ResumeMiss::kNone;
  Status first_error;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Status& s = results[i].status;
    if (s.is_ok()) continue;
    ResumeMiss m = is_corrupt(s)                ? ResumeMiss::kPageCorrupt
                   : s == Code::kNotFound        ? ResumeMiss::kPageUnavailable
                                                 : ResumeMiss::kIoError;
    if (m == ResumeMiss::kPageCorrupt) on_corrupt(point.page_keys[i], out);
    if (page_miss == ResumeMiss::kNone) {
      page_miss = m;
      first_error = Status(s.code(), fmt::format("PAGE chunk {}: {}", i, s.message()));
    }
  }
  if (page_miss != ResumeMiss::kNone) return miss(page_miss, first_error);

  const SlotBoundaryCodec codec = slot_.at(point.boundary);
  LoadItem sitem{skey, *slot_regions};
  LoadResult sres;
  Status s = stack_.load(std::span(&sitem, 1), codec, std::span(&sres, 1));
  if (!s) return miss(ResumeMiss::kIoError, s);
  if (!sres.status.is_ok()) {
    if (is_corrupt(sres.status)) {
      on_corrupt(skey, out);
      return miss(ResumeMiss::kSidecarCorrupt, sres.status);
    }
    return miss(sres.status == Code::kNotFound ? ResumeMiss::kSidecarUnavailable
                                               : ResumeMiss::kIoError,
                sres.status);
  }
  return out;
}

}  // namespace tier::dsv4
