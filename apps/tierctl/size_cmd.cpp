// tierctl size: the LRU hit ratio of a trace at every capacity, counted as `tierbench replay`
// counts hits, in one pass (tier/sizing/mrc.hpp, docs/sizing.md): a table at round sizes with
// the knee, the ratio at one size (--at), the whole curve (--json) and a plot (--plot).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cli.hpp"
#include "mrc_plot.hpp"
#include "tier/json.hpp"
#include "tier/options.hpp"
#include "tier/sizing/mrc.hpp"
#include "tier/tier_stack.hpp"

namespace tier::cli {
namespace {

using sizing::CurveEstimate;
using sizing::CurveOptions;
using sizing::HitCurve;
using sizing::kMinSampleRate;
using sizing::trace_curve;

constexpr const char* kUsage =
    "size --trace FILE [--block-bytes B] [--sample R] [--at BLOCKS] [--json] "
    "[--plot FILE.svg|FILE.png] [--max-tracked N]";
constexpr std::uint64_t kMaxBlockBytes = std::uint64_t{1} << 40;

struct SizeArgs {
  std::string trace;
  std::uint64_t block_bytes = 0;
  CurveOptions curve;
  std::optional<std::uint64_t> at;
  std::optional<std::string> plot;
  bool json = false;
};

// A finite decimal number ("0.01", "1e-2"); nullopt for anything else ("nan", "0.5x").
std::optional<double> parse_rate(const std::string& s) {
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// The arguments, or the exit status of a usage error (2) after its message.
std::variant<SizeArgs, int> read_args(Args& args) {
  SizeArgs a;
  const auto trace = args.get("trace");
  a.block_bytes = args.size("block-bytes", 1, kMaxBlockBytes).value_or(64 * 1024);
  const auto sample = args.get("sample");
  a.at = args.uint("at");
  a.curve.max_tracked = args.uint("max-tracked", 1, 1ull << 32).value_or(a.curve.max_tracked);
  a.plot = args.get("plot");
  a.json = args.flag("json");
  args.finish();
  if (!trace) return fail(fmt::format("--trace is required\nusage: tierctl {}", kUsage), 2);
  a.trace = *trace;
  if (!args.positional().empty())
    return fail(fmt::format("unexpected argument \"{}\"", args.positional().front()), 2);
  if (sample) {
    const auto rate = parse_rate(*sample);
    if (!rate || !(*rate > 0 && *rate <= 1))
      return fail(fmt::format("--sample: expected a rate in (0, 1] like 0.01, got \"{}\"", *sample),
                  2);
    if (*rate < kMinSampleRate)
      return fail(
          fmt::format("--sample: {} is below the smallest rate, {}", *sample, kMinSampleRate), 2);
    a.curve.sample_rate = *rate;
  }
  return a;
}

std::uint64_t saturating_mul(std::uint64_t a, std::uint64_t b) {
  return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

// What the table, the JSON and the plot show.
struct Report {
  const CurveEstimate& est;
  std::uint64_t block_bytes, image_bytes;
  std::optional<HitCurve::Step> knee;
  std::vector<std::uint64_t> rows;  // capacities of the table, increasing
};

// Powers of two up to the first at or past saturation, with the knee and saturation.
std::vector<std::uint64_t> table_rows(const HitCurve& c,
                                      const std::optional<HitCurve::Step>& knee) {
  std::vector<std::uint64_t> rows;
  const std::uint64_t sat = c.saturation();
  for (std::uint64_t b = 1; b != 0; b <<= 1) {
    rows.push_back(b);
    if (b >= sat) break;
  }
  if (knee) rows.push_back(knee->blocks);
  if (sat > 0) rows.push_back(sat);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

Json point_json(const Report& r, std::uint64_t blocks) {
  Json p = {{"blocks", blocks},
            {"bytes", saturating_mul(blocks, r.image_bytes)},
            {"hit_ratio", r.est.curve.at(blocks)}};
  if (!r.est.exact()) p["error"] = r.est.error_at(blocks);
  return p;
}

double max_error(const Report& r) {
  double e = 0;
  for (std::uint64_t b : r.rows) e = std::max(e, r.est.error_at(b));
  return e;
}

Json report_json(const Report& r, const SizeArgs& a) {
  const CurveEstimate& e = r.est;
  Json blocks = Json::array(), ratios = Json::array();
  for (const HitCurve::Step& s : e.curve.steps()) {
    blocks.push_back(s.blocks);
    ratios.push_back(s.hit_ratio);
  }
  Json table = Json::array();
  for (std::uint64_t b : r.rows) table.push_back(point_json(r, b));
  Json out = {{"trace", a.trace},
              {"requests", e.requests},
              {"blocks", e.blocks},
              {"tracked_blocks", e.tracked},
              {"exact", e.exact()},
              {"sample_rate", e.sample_rate},
              {"block_bytes", r.block_bytes},
              {"image_bytes", r.image_bytes},
              {"max_hit_ratio", e.curve.max_ratio()},
              {"saturation", point_json(r, e.curve.saturation())},
              {"knee", r.knee ? point_json(r, r.knee->blocks) : Json()},
              {"table", table},
              {"curve", {{"blocks", blocks}, {"hit_ratio", ratios}}}};
  if (!e.exact()) out["max_error"] = max_error(r);
  if (a.at) out["at"] = point_json(r, *a.at);
  return out;
}

std::string percent(double ratio) { return fmt::format("{:.2f}%", 100 * ratio); }

void print_table(const Report& r, const SizeArgs& a) {
  const CurveEstimate& e = r.est;
  fmt::print(
      "trace {}: {} requests, {} blocks, {} distinct{}\n", a.trace, e.requests, e.blocks, e.tracked,
      e.exact() ? " (exact)"
                : fmt::format(" in a SHARDS sample of {:.4f}% of the blocks", 100 * e.sample_rate));
  fmt::print(
      "LRU hit ratio by capacity, hits counted as tierbench replay counts them (the leading run\n"
      "of each request's blocks present); blocks of {}, {} per stored image\n",
      format_size(r.block_bytes), format_size(r.image_bytes));
  if (!e.exact())
    fmt::print(
        "sampled: each ratio +/- the error shown (3 standard errors of {} disjoint sub-samples\n"
        "plus their bias; docs/sizing.md)\n",
        CurveEstimate::kGroups);
  fmt::print("{:>12} {:>12} {:>10} {:>11}{}\n", "blocks", "capacity", "hit ratio", "miss ratio",
             e.exact() ? "" : fmt::format(" {:>8}", "error"));
  for (std::uint64_t b : r.rows) {
    const double h = e.curve.at(b);
    std::string note;
    if (r.knee && b == r.knee->blocks) note = "  <- knee";
    if (b == e.curve.saturation()) note += "  <- every repeat hits";
    fmt::print("{:>12} {:>12} {:>10} {:>11}{}{}\n", b,
               format_size(saturating_mul(b, r.image_bytes)), percent(h), percent(1 - h),
               e.exact() ? "" : fmt::format(" {:>8.4f}", e.error_at(b)), note);
  }
  if (r.knee)
    fmt::print(
        "knee: {} blocks ({}), hit ratio {}; past it each block gains less than on "
        "average\n",
        r.knee->blocks, format_size(saturating_mul(r.knee->blocks, r.image_bytes)),
        percent(r.knee->hit_ratio));
  else
    fmt::print("no block is requested twice: the hit ratio is 0 at every capacity\n");
  if (!e.exact()) fmt::print("largest error stated above: +/- {:.4f}\n", max_error(r));
}

void print_at(const Report& r, std::uint64_t blocks) {
  const double h = r.est.curve.at(blocks);
  fmt::print("{} blocks ({}): hit ratio {:.6f} ({}){}\n", blocks,
             format_size(saturating_mul(blocks, r.image_bytes)), h, percent(h),
             r.est.exact() ? "" : fmt::format(" +/- {:.4f} (sampled)", r.est.error_at(blocks)));
}

PlotData plot_data(const Report& r, const SizeArgs& a) {
  const HitCurve& c = r.est.curve;
  PlotData d;
  d.title = fmt::format("LRU miss ratio of {}", a.trace.substr(a.trace.find_last_of('/') + 1));
  d.x_label = fmt::format("capacity in blocks (1 block = {} stored)", format_size(r.image_bytes));
  // The step function at 1000 capacities to a little past saturation (or --at).
  std::uint64_t right =
      std::max<std::uint64_t>({c.saturation() + c.saturation() / 20, 10, a.at ? *a.at : 0});
  constexpr std::uint64_t kPoints = 1000;
  for (std::uint64_t i = 0; i <= kPoints; ++i) {
    const auto b = static_cast<std::uint64_t>(static_cast<double>(right) * i / kPoints);
    if (!d.curve.empty() && d.curve.back().blocks == b) continue;
    d.curve.push_back({b, 1 - c.at(b)});
  }
  if (r.knee) d.knee = PlotPoint{r.knee->blocks, 1 - r.knee->hit_ratio};
  if (a.at) d.at = PlotPoint{*a.at, 1 - c.at(*a.at)};
  if (!r.est.exact()) d.error = max_error(r);
  return d;
}

int run_size(Args& args) {
  auto parsed = read_args(args);
  if (const int* rc = std::get_if<int>(&parsed)) return *rc;
  const SizeArgs& a = std::get<SizeArgs>(parsed);
  std::optional<Plotter> plotter;
  if (a.plot) {  // before the pass: a plot that cannot be drawn fails now, not after it
    auto p = find_plotter(*a.plot);
    if (!p)
      return fail(std::string(p.status().message()),
                  p.status().code() == Code::kInvalidArgument ? 2 : 1);
    plotter = *p;
  }
  auto est = trace_curve(a.trace, a.curve);
  if (!est)  // a trace that cannot be opened is a usage error; a malformed one is not
    return fail(std::string(est.status().message()),
                est.status().code() == Code::kNotFound ? 2 : 1);
  const HitCurve& c = est->curve;
  const auto knee = sizing::knee(c);
  const Report r{*est, a.block_bytes, TierStack::image_bytes(a.block_bytes), knee,
                 table_rows(c, knee)};
  if (a.json)
    fmt::print("{}\n", tier::json_text(report_json(r, a)));
  else if (a.at)
    print_at(r, *a.at);
  else
    print_table(r, a);
  if (a.plot) {
    if (Status st = write_plot(*a.plot, *plotter, plot_data(r, a)); !st.is_ok())
      return fail(std::string(st.message()));
    if (!a.json) fmt::print("plot: {}\n", *a.plot);
  }
  return 0;
}

}  // namespace
}  // namespace tier::cli

TIER_CLI_COMMAND(size, tier::cli::kUsage,
                 "LRU hit ratio of a Mooncake-format trace at every capacity, counted as "
                 "tierbench replay counts hits, in one pass (Mattson; --sample R: SHARDS with "
                 "its error): a table with the knee, --at one size, --json the whole curve, "
                 "--plot the miss-ratio curve (.svg, or .png through python3-matplotlib)",
                 tier::cli::run_size);
