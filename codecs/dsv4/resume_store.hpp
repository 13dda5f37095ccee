#pragma once
// ResumeStore: DSV4 resume points (PAGE chunks + the SLOT at the boundary) saved and loaded as
// one unit over a TierStack, with the corruption fence.
//
// A resume point of a hybrid model is usable only when every PAGE chunk up to the boundary and
// the SLOT at the boundary are present and valid; this is the only load operation offered, so no
// caller can resume from PAGE alone.
//
// load() order (each step a miss on failure, never a partial resume):
//   1. validate the request (block ids in range and unique across chunks, slot group in range);
//   2. presence: every PAGE chunk in a readable tier (else kPageUnavailable; the SLOT is not
//      fetched), then the sidecar (else kSidecarUnavailable);
//   3. load and decode every PAGE chunk into the destination blocks;
//   4. load, verify (AOS1, fail-closed) and scatter the SLOT into the destination group, only
//      after every PAGE chunk was valid.
// On a miss the destination blocks may hold partial bytes and the caller recomputes them (as the
// reference does); the SLOT destination is written only on success.
//
// Corruption fence (put-if-absent trap): tiers never overwrite a key, so a corrupt object would
// block its recomputed replacement forever. A key whose object failed to verify or decode is
// fenced, then removed from every tier; the fence lifts only once no tier holds the key. save()
// first retries the removal of a fenced key and refuses (Rejected) the whole resume point while
// any of its keys stays fenced; the SLOT is published only after every PAGE chunk is stored.
//
// Threads: like TierStack, one owner thread.

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "page_codec.hpp"
#include "slot_codec.hpp"
#include "tier/tier_stack.hpp"

namespace tier::dsv4 {

struct ResumePoint {
  std::vector<ObjectKey> page_keys;                     // chunk keys in token order
  std::vector<std::vector<std::uint32_t>> page_blocks;  // block ids of each chunk
  Boundary boundary;
  std::uint32_t slot_group = 0;  // save: the live slot; load: the newly allocated destination
};

enum class ResumeMiss : std::uint8_t {
  kNone = 0,            // a hit: everything restored
  kInvalid,             // the request itself is malformed
  kPageUnavailable,     // a PAGE chunk is absent
  kSidecarUnavailable,  // the SLOT sidecar is absent
  kPageCorrupt,         // a PAGE chunk failed verification or decode (invalidated)
  kSidecarCorrupt,      // the sidecar failed verification or AOS1 decode (invalidated)
  kIoError,             // a tier failed or timed out
};
std::string_view resume_miss_name(ResumeMiss m) noexcept;

struct ResumeLoad {
  Status status;  // Ok only on a full hit
  ResumeMiss miss = ResumeMiss::kNone;
  std::vector<ObjectKey> invalidated;   // corrupt keys now removed from every tier
  std::vector<ObjectKey> still_fenced;  // corrupt keys whose removal failed (puts refused)
};

class ResumeStore {
 public:
  // Refers to `stack` and the codecs, which must outlive the store. `page_namespace` keys the
  // sidecars (the PAGE chunk keys are the caller's).
  ResumeStore(TierStack& stack, const PageCodec& page, const SlotCodec& slot,
              const Key128& page_namespace) noexcept
      : stack_(stack), page_(page), slot_(slot), ns_(page_namespace) {}

  ObjectKey sidecar_key(const Boundary& boundary) const;

  // Stores every PAGE chunk, then the SLOT. Returns Ok when all are stored (or present already).
  // Errors: InvalidArgument (request), Rejected (a key is fenced and still cannot be removed; no
  // put was made), or the first tier's error (the SLOT is not published).
  Status save(const ResumePoint& point);
  // Checks and loads the resume point as a unit (see above).
  ResumeLoad load(const ResumePoint& point);

  // Fences `key` and removes it from every tier. Ok (and unfenced) when no tier holds it any
  // more; otherwise the tier's error, and the key stays fenced.
  Status invalidate(const ObjectKey& key);
  bool fenced(const ObjectKey& key) const { return fenced_.count(key) != 0; }
  std::size_t fenced_count() const noexcept { return fenced_.size(); }

 private:
  // Retries the removal of fenced keys among `keys`. Rejected if one stays fenced.
  Status clear_fences(std::span<const ObjectKey> keys);
  void on_corrupt(const ObjectKey& key, ResumeLoad& out);

  TierStack& stack_;
  const PageCodec& page_;
  const SlotCodec& slot_;
  Key128 ns_;
  std::unordered_set<ObjectKey> fenced_;
};

}  // namespace tier::dsv4
