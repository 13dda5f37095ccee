// The C API's sizing calls (tier/tier.h, "Sizing"): libtier_sizing's trace curve.
#include <cmath>
#include <optional>

#include "capi_internal.hpp"
#include "tier/sizing/mrc.hpp"

using namespace tier;
using tier::capi::guarded;

struct tier_curve {
  sizing::CurveEstimate estimate;
  std::vector<sizing::HitCurve::Step> steps;
  std::optional<sizing::HitCurve::Step> knee;
};

extern "C" {

int tier_curve_from_trace(const char* trace_path, double sample_rate, uint64_t max_tracked,
                          tier_curve** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return Status::invalid("out is NULL");
    *out = nullptr;
    if (trace_path == nullptr) return Status::invalid("trace_path is NULL");
    if (!std::isfinite(sample_rate))
      return Status::invalid("sample_rate must be a number in (0, 1]");
    sizing::CurveOptions options;
    options.sample_rate = sample_rate;
    if (max_tracked != 0) options.max_tracked = max_tracked;
    TIER_ASSIGN_OR_RETURN(sizing::CurveEstimate e, sizing::trace_curve(trace_path, options));
    auto c = std::make_unique<tier_curve>(tier_curve{std::move(e), {}, std::nullopt});
    c->steps = c->estimate.curve.steps();
    c->knee = sizing::knee(c->estimate.curve);
    *out = c.release();
    return Status::ok();
  });
}

void tier_curve_free(tier_curve* curve) { delete curve; }
uint64_t tier_curve_requests(const tier_curve* c) { return c ? c->estimate.requests : 0; }
uint64_t tier_curve_blocks(const tier_curve* c) { return c ? c->estimate.blocks : 0; }
uint64_t tier_curve_tracked_blocks(const tier_curve* c) { return c ? c->estimate.tracked : 0; }
double tier_curve_sample_rate(const tier_curve* c) { return c ? c->estimate.sample_rate : 0; }
double tier_curve_hit_ratio(const tier_curve* c, uint64_t blocks) {
  return c ? c->estimate.curve.at(blocks) : 0;
}
double tier_curve_error(const tier_curve* c, uint64_t blocks) {
  return c ? c->estimate.error_at(blocks) : 0;
}
uint64_t tier_curve_saturation(const tier_curve* c) {
  return c ? c->estimate.curve.saturation() : 0;
}
int tier_curve_knee(const tier_curve* c, uint64_t* blocks, double* hit_ratio) {
  if (!c || !c->knee) return 0;
  if (blocks) *blocks = c->knee->blocks;
  if (hit_ratio) *hit_ratio = c->knee->hit_ratio;
  return 1;
}
int tier_curve_steps(const tier_curve* c, uint64_t* blocks, double* hit_ratios, size_t capacity,
                     size_t* count) {
  return guarded([&]() -> Status {
    if (!c || !count) return Status::invalid("curve or count is NULL");
    *count = c->steps.size();
    if (capacity == 0) return Status::ok();
    if (!blocks || !hit_ratios) return Status::invalid("blocks or hit_ratios is NULL");
    for (std::size_t i = 0; i < c->steps.size() && i < capacity; ++i) {
      blocks[i] = c->steps[i].blocks;
      hit_ratios[i] = c->steps[i].hit_ratio;
    }
    return Status::ok();
  });
}

}  // extern "C"
