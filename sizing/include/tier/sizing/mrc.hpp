#pragma once
// Hit-ratio (miss-ratio) curves of an LRU cache of trace blocks, counted exactly as
// `tierbench replay` counts hits on one LRU tier (docs/sizing.md):
//  - a block is the chain of hash ids up to it (the replay's chained key), so equal ids after
//    different prefixes are different blocks;
//  - a request's hits are the leading run of its blocks present when it arrives;
//  - then every block of the request is touched in order (loads refresh the hits, saves refresh
//    or insert the rest), so LRU order is the order of the stream of every block of every request.
//
// One pass gives the curve at every capacity (Mattson et al. 1970): a block of stack distance d
// (1 + the distinct blocks touched since its last touch, counted when it is touched) is present
// in an LRU of C blocks iff d <= C. Block k of a request is in its leading run at C iff blocks
// 0..k were all present when it arrived, iff max(d_0..d_k) <= C: touching present blocks evicts
// nothing, and the first absent block has a distance past its depth before the request, > C.
// Along a request's chain the distances never decrease (block k is touched right after its
// parent k-1 every time, so either k-1's last touch came just before k's, and then d_k = d_k-1,
// or after it, and then all that counts for k-1, and k-1 itself, counts for k), so that maximum
// is d_k: the hits at C are the blocks with d <= C, a histogram of d summed up to C.
// tests/unit/mrc_test.cpp checks the curve against a brute-force simulation of the replay's
// rule at every capacity.
//
// With sampling (SHARDS, Waldspurger et al., FAST '15) only blocks whose key hashes below
// R * 2^24 (mod 2^24) are tracked, each with its stack distance among tracked blocks (scaled:
// HitCurve); the chain argument holds among tracked blocks too. The sample is split into
// kGroups disjoint hash ranges, each a SHARDS sample of rate R / kGroups with stacks of its
// own, and the spread of their curves gives the stated error (CurveEstimate::error_at).

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "tier/key.hpp"
#include "tier/status.hpp"

namespace tier::sizing {

// LRU stack distances of a stream of keys, O(log n) per access: a Fenwick tree over access times
// holds a 1 at each key's last access, so the distinct keys touched since a key's last access
// are the ones counted after it. Times are renumbered when the tree is full, so memory stays
// proportional to the distinct keys. Not thread-safe.
class StackDistances {
 public:
  // The stack distance of `key` (1 for the most recent key), or 0 on its first access; then
  // `key` is the most recent.
  std::uint64_t access(const Key128& key);
  std::uint64_t distinct() const { return last_.size(); }

 private:
  void compact();  // renumbers the live times 0..distinct-1, in order
  std::uint64_t count_upto(std::uint64_t slot) const;  // 1s in slots [0, slot]
  void add(std::uint64_t slot, std::int32_t delta);

  std::unordered_map<Key128, std::uint64_t> last_;  // key -> slot of its last access
  std::vector<std::uint32_t> tree_;                 // Fenwick tree over slots (1-based inside)
  std::uint64_t next_ = 0;                          // the next access's slot
};

// Modulus of the sampling hash, as in the SHARDS paper.
inline constexpr std::uint64_t kSampleModulus = 1u << 24;
// Memory per distinct block tracked (hash map node and bucket, stack slots, histogram): about 90
// bytes measured with 1.8 million blocks; twice that when sampled (the error groups keep stacks of
// their own).
inline constexpr std::uint64_t kTrackedBlockBytes = 96;

// The smallest sample rate: one hash value per error group.
inline constexpr double kMinSampleRate = 8.0 / kSampleModulus;

struct CurveOptions {
  // R in (0, 1]: the fraction of blocks tracked (rounded to a multiple of 2^-24); 1 = exact.
  double sample_rate = 1.0;
  // Refuse a trace that needs more distinct blocks tracked than this (bounded memory).
  std::uint64_t max_tracked = std::uint64_t{1} << 25;
  // Salt of the sampling hash (tests draw independent samples with it).
  std::uint64_t salt = 0;
};

// Hit ratios at every capacity, from a histogram of stack distances.
class HitCurve {
 public:
  // `cumulative[d]` = tracked blocks that are hits in an LRU of d tracked blocks (cumulative[0] =
  // 0); `refs` = tracked blocks requested, of `blocks` in all; the sample rate R is threshold /
  // kSampleModulus (1: exact).
  //
  // Sampled, a tracked distance d_s (itself + the tracked blocks touched since) estimates
  // 1 + (d_s - 1) / R blocks, so d_s = 1 stays 1 (the SHARDS paper's d_s / R could not be a hit
  // below 1 / R blocks). The ratio is SHARDS_adj's: the shortfall R * blocks - refs (a frequent
  // block left out of, or taken into, the sample) is added to the hits at the smallest distance,
  // over R * blocks references.
  HitCurve(std::vector<std::uint64_t> cumulative, std::uint64_t refs, std::uint64_t threshold,
           std::uint64_t blocks);

  // The hit ratio in an LRU of `capacity` blocks (0 when no block was requested).
  double at(std::uint64_t capacity) const;
  // The smallest capacity with the largest hit ratio (every repeat a hit).
  std::uint64_t saturation() const { return capacity_of(cumulative_.size() - 1); }
  double max_ratio() const { return at(saturation()); }

  struct Step {
    std::uint64_t blocks;  // from this capacity on (to the next step) ...
    double hit_ratio;      // ... the hit ratio is this
  };
  // Every capacity where the ratio rises, in increasing order (the whole curve).
  std::vector<Step> steps() const;

 private:
  std::uint64_t tracked_capacity(std::uint64_t capacity) const;  // 1 + floor((capacity - 1) R)
  std::uint64_t capacity_of(std::uint64_t tracked) const;        // its inverse (smallest)
  double ratio(std::uint64_t tracked) const;  // in an LRU of `tracked` tracked blocks

  std::vector<std::uint64_t> cumulative_;
  std::uint64_t threshold_;
  double expected_refs_;  // R * blocks
  double adjustment_;     // R * blocks - refs
};

// A trace's curve, with its sampling error when sampled.
struct CurveEstimate {
  static constexpr int kGroups = 8;  // disjoint sub-samples for the error estimate
  static_assert(kMinSampleRate * kSampleModulus == kGroups);

  std::uint64_t requests = 0;
  std::uint64_t blocks = 0;      // every block requested
  std::uint64_t tracked = 0;     // distinct blocks tracked
  double sample_rate = 1.0;      // the rate used (a multiple of 2^-24)
  HitCurve curve;                // the estimate (exact when sample_rate == 1)
  std::vector<HitCurve> groups;  // sampled only: kGroups curves of rate sample_rate / kGroups

  bool exact() const { return groups.empty(); }
  // Sampled: the error bound stated at `capacity`, 3 standard errors of the random-group estimate
  // (the groups' spread / sqrt(kGroups)) plus the distance of the groups' mean from the
  // estimate (a bias bound when the bias shrinks with the sample); 0 when exact.
  double error_at(std::uint64_t capacity) const;
};

// Builds a curve request by request, in one pass. Not thread-safe.
class CurveBuilder {
 public:
  // Errors: InvalidArgument (sample_rate outside (0, 1], or below kMinSampleRate).
  static Result<CurveBuilder> create(const CurveOptions& options);

  // Adds one request (its hash ids in order). Errors: NoSpace when more than
  // max_tracked distinct blocks are tracked.
  Status add(std::span<const std::uint32_t> hash_ids);
  CurveEstimate finish() &&;

 private:
  struct Sample {  // the blocks whose hash falls in [lo, hi)
    std::uint64_t lo, hi;
    StackDistances stack;
    std::vector<std::uint64_t> histogram;  // [d] = blocks of stack distance d
    std::uint64_t refs = 0;
    void touch(const Key128& key);
    HitCurve curve(std::uint64_t blocks) const;
  };
  explicit CurveBuilder(const CurveOptions& options, std::uint64_t threshold);

  CurveOptions options_;
  std::uint64_t threshold_;
  Key128 ns_;
  std::uint64_t requests_ = 0, blocks_ = 0;
  std::vector<Sample> samples_;  // [0]: the whole sample; then the groups when sampled
};

// The knee (Satopaa et al.'s Kneedle on the normalized curve): the capacity where the curve is
// furthest above the line from (0, 0) to (saturation, max ratio); past it, each block gains
// less than the curve's average. nullopt when no block is requested twice.
std::optional<HitCurve::Step> knee(const HitCurve& curve);

// The curve of a Mooncake-format trace (tier/sizing/trace.hpp), read in one pass in bounded memory.
// Errors: the trace reader's, and CurveBuilder's.
Result<CurveEstimate> trace_curve(const std::string& path, const CurveOptions& options);

}  // namespace tier::sizing
