#include "tier/sizing/mrc.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "tier/sizing/trace.hpp"

namespace tier::sizing {

std::uint64_t StackDistances::count_upto(std::uint64_t slot) const {
  std::uint64_t n = 0;
  for (std::uint64_t i = slot + 1; i > 0; i -= i & (~i + 1)) n += tree_[i - 1];
  return n;
}

void StackDistances::add(std::uint64_t slot, std::int32_t delta) {
  for (std::uint64_t i = slot + 1; i <= tree_.size(); i += i & (~i + 1))
    tree_[i - 1] = static_cast<std::uint32_t>(static_cast<std::int64_t>(tree_[i - 1]) + delta);
}

void StackDistances::compact() {
  // Each live slot's rank among the live slots (each key holds one): two sequential passes.
  std::vector<std::uint32_t> rank(next_, 0);
  for (const auto& [key, slot] : last_) rank[slot] = 1;
  std::uint32_t live = 0;
  for (std::uint32_t& r : rank) {
    const std::uint32_t mark = r;
    r = live;
    live += mark;
  }
  for (auto& [key, slot] : last_) slot = rank[slot];
  next_ = live;
  // Room for 3 x live accesses before the next renumbering: O(1) amortized per access.
  tree_.assign(std::max<std::size_t>(1024, 4 * std::size_t{live}), 0);
  // Slots [0, next_) hold a 1 each: the O(n) Fenwick build.
  for (std::uint64_t i = 1; i <= tree_.size(); ++i) {
    if (i <= next_) tree_[i - 1] += 1;
    const std::uint64_t up = i + (i & (~i + 1));
    if (up <= tree_.size()) tree_[up - 1] += tree_[i - 1];
  }
}

std::uint64_t StackDistances::access(const Key128& key) {
  if (next_ == tree_.size()) compact();
  auto [it, fresh] = last_.try_emplace(key, next_);
  std::uint64_t distance = 0;
  if (!fresh) {
    // Keys last touched after this one, each counted once, plus itself.
    const std::uint64_t live_before = last_.size();
    distance = live_before - count_upto(it->second) + 1;
    add(it->second, -1);
    it->second = next_;
  }
  add(next_++, 1);
  return distance;
}

HitCurve::HitCurve(std::vector<std::uint64_t> cumulative, std::uint64_t refs,
                   std::uint64_t threshold, std::uint64_t blocks)
    : cumulative_(std::move(cumulative)), threshold_(threshold) {
  if (cumulative_.empty()) cumulative_.push_back(0);
  expected_refs_ = static_cast<double>(blocks) * static_cast<double>(threshold) /
                   static_cast<double>(kSampleModulus);
  adjustment_ = expected_refs_ - static_cast<double>(refs);
}

// Both sides split n = q * m + r so that no product overflows: r * (m or kSampleModulus) < 2^48.
std::uint64_t HitCurve::tracked_capacity(std::uint64_t capacity) const {
  if (capacity == 0) return 0;
  const std::uint64_t n = capacity - 1;  // 1 + floor(n * T / P)
  return 1 + (n / kSampleModulus) * threshold_ + (n % kSampleModulus) * threshold_ / kSampleModulus;
}

std::uint64_t HitCurve::capacity_of(std::uint64_t tracked) const {
  if (tracked == 0) return 0;
  const std::uint64_t n = tracked - 1;  // 1 + ceil(n * P / T)
  return 1 + (n / threshold_) * kSampleModulus +
         ((n % threshold_) * kSampleModulus + threshold_ - 1) / threshold_;
}

double HitCurve::ratio(std::uint64_t tracked) const {
  if (expected_refs_ <= 0 || tracked == 0) return 0;
  const double hits = static_cast<double>(cumulative_[std::min(tracked, cumulative_.size() - 1)]);
  return std::clamp((hits + adjustment_) / expected_refs_, 0.0, 1.0);
}

double HitCurve::at(std::uint64_t capacity) const { return ratio(tracked_capacity(capacity)); }

std::vector<HitCurve::Step> HitCurve::steps() const {
  std::vector<Step> out;
  for (std::uint64_t d = 1; d < cumulative_.size(); ++d)
    if (cumulative_[d] != cumulative_[d - 1]) out.push_back({capacity_of(d), ratio(d)});
  return out;
}

double CurveEstimate::error_at(std::uint64_t capacity) const {
  if (exact()) return 0;
  const double estimate = curve.at(capacity);
  double sum = 0, sum2 = 0;
  for (const HitCurve& g : groups) {
    const double r = g.at(capacity);
    sum += r;
    sum2 += r * r;
  }
  const double n = static_cast<double>(groups.size());
  const double mean = sum / n;
  const double variance = std::max(0.0, (sum2 - n * mean * mean) / (n - 1));
  return 3 * std::sqrt(variance / n) + std::abs(mean - estimate);
}

void CurveBuilder::Sample::touch(const Key128& key) {
  ++refs;
  const std::uint64_t d = stack.access(key);
  if (d == 0) return;  // a first touch misses at every capacity
  if (histogram.size() <= d) histogram.resize(d + 1, 0);
  ++histogram[d];
}

HitCurve CurveBuilder::Sample::curve(std::uint64_t blocks) const {
  std::vector<std::uint64_t> cumulative(histogram.size(), 0);
  for (std::size_t d = 1; d < histogram.size(); ++d)
    cumulative[d] = cumulative[d - 1] + histogram[d];
  return HitCurve(std::move(cumulative), refs, hi - lo, blocks);
}

Result<CurveBuilder> CurveBuilder::create(const CurveOptions& options) {
  const double r = options.sample_rate;
  if (!(r > 0 && r <= 1))
    return Status::invalid(fmt::format("sample rate must be in (0, 1], got {}", r));
  if (r < kMinSampleRate)
    return Status::invalid(
        fmt::format("sample rate {} is below the smallest, {}", r, kMinSampleRate));
  const auto threshold = static_cast<std::uint64_t>(std::llround(r * kSampleModulus));
  return CurveBuilder(options, threshold);
}

CurveBuilder::CurveBuilder(const CurveOptions& options, std::uint64_t threshold)
    : options_(options), threshold_(threshold) {
  ns_ = *namespace_id(Json{{"workload", "tierctl-size"}});
  samples_.push_back(Sample{0, threshold, {}, {}, 0});
  if (threshold < kSampleModulus)
    for (std::uint64_t g = 0; g < CurveEstimate::kGroups; ++g)
      samples_.push_back(Sample{g * threshold / CurveEstimate::kGroups,
                                (g + 1) * threshold / CurveEstimate::kGroups,
                                {},
                                {},
                                0});
}

Status CurveBuilder::add(std::span<const std::uint32_t> hash_ids) {
  ++requests_;
  blocks_ += hash_ids.size();
  Key128 key;  // the replay's chained key: a block is its whole prefix
  for (std::uint32_t id : hash_ids) {
    key = chunk_key(ns_, key, std::span(&id, 1));
    if (threshold_ == kSampleModulus) {
      samples_[0].touch(key);
    } else {
      // XXH3's low half is already uniform; the salt's mix draws another sample.
      std::uint64_t h = key.lo ^ options_.salt;
      if (options_.salt != 0) h = (h ^ (h >> 31)) * 0x9E3779B97F4A7C15ull;
      h %= kSampleModulus;
      for (Sample& s : samples_)
        if (h >= s.lo && h < s.hi) s.touch(key);
    }
    if (samples_[0].stack.distinct() > options_.max_tracked)
      return Status(Code::kNoSpace,
                    fmt::format("more than {} distinct blocks to track (--max-tracked; about {} "
                                "bytes each, twice that sampled): sample them (--sample, e.g. "
                                "0.01) or raise --max-tracked",
                                options_.max_tracked, kTrackedBlockBytes));
  }
  return Status::ok();
}

CurveEstimate CurveBuilder::finish() && {
  CurveEstimate e{requests_,
                  blocks_,
                  samples_[0].stack.distinct(),
                  static_cast<double>(threshold_) / kSampleModulus,
                  samples_[0].curve(blocks_),
                  {}};
  for (std::size_t g = 1; g < samples_.size(); ++g) e.groups.push_back(samples_[g].curve(blocks_));
  return e;
}

Result<CurveEstimate> trace_curve(const std::string& path, const CurveOptions& options) {
  TIER_ASSIGN_OR_RETURN(CurveBuilder builder, CurveBuilder::create(options));
  TIER_ASSIGN_OR_RETURN(TraceReader reader, TraceReader::open(path));
  Request r;
  for (;;) {
    TIER_ASSIGN_OR_RETURN(bool more, reader.next(r));
    if (!more) break;
    if (Status st = builder.add(r.blocks); !st.is_ok())
      return Status(st.code(), fmt::format("{}:{}: {}", path, reader.line(), st.message()));
  }
  return std::move(builder).finish();
}

std::optional<HitCurve::Step> knee(const HitCurve& c) {
  const double top = c.max_ratio(), right = static_cast<double>(c.saturation());
  if (top <= 0 || right <= 0) return std::nullopt;
  std::optional<HitCurve::Step> best;
  double best_gap = -1;
  for (const HitCurve::Step& s : c.steps()) {
    const double gap = s.hit_ratio / top - static_cast<double>(s.blocks) / right;
    if (gap > best_gap) best_gap = gap, best = s;
  }
  return best;
}


}  // namespace tier::sizing
