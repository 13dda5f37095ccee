// tierctl geometry --preset NAME | --config JSON [--blocks N] [--slots N] [--json]
#include <fmt/format.h>

#include "cli.hpp"
#include "tier/dsv4/geometry.hpp"
#include "tier/options.hpp"

namespace {

int run_geometry(tier::cli::Args& args) {
  auto preset = args.get("preset");
  auto config = args.get("config");
  auto blocks = args.uint("blocks", 1, 1ull << 32);
  auto slots = args.uint("slots", 1, 1ull << 32);
  bool json = args.flag("json");
  args.finish();
  if (preset.has_value() == config.has_value())
    return tier::cli::fail(
        fmt::format("usage: tierctl geometry --preset NAME | --config JSON [--json]; presets: {}",
                    fmt::join(tier::dsv4::preset_names(), ", ")),
        2);
  tier::Json description = tier::Json::object();
  if (config) {
    auto parsed = tier::parse_json(*config, "--config");
    if (!parsed) return tier::cli::fail(parsed.status().message(), 2);
    description = std::move(parsed).value();
  } else {
    description["preset"] = *preset;
  }
  if (blocks) description["num_blocks"] = *blocks;
  if (slots) description["num_slots"] = *slots;
  auto c = tier::dsv4::ModelConfig::from_json(description);
  if (!c) return tier::cli::fail(c.status().to_string(), 2);
  auto g = tier::dsv4::Geometry::compute(*c);
  if (!g) return tier::cli::fail(g.status().to_string());
  if (json) {
    fmt::print("{}\n", tier::json_text(g->to_json(), 2));
    return 0;
  }
  fmt::print("model {}  kv {}  layers: {} CSA, {} HCA, {} dense  block {} tokens (x dcp {})\n",
             c->model, c->to_json()["kv_dtype"].get<std::string>(),
             g->n_csa, g->n_hca, g->n_dense, c->block_size, c->dcp_size);
  fmt::print("rows: envelope {}  arena {}  entry {}  slot {}  (ring {})\n", g->envelope_rows,
             g->arena_rows, g->entry_rows, g->slot_rows, g->ring_slots);
  fmt::print("\n{:<6} {:<36} {:<36} {:>14} {:>14} {:>16} {}\n", "kind", "role", "backing",
             "offset", "unit_bytes", "total_bytes", "index");
  auto rows = [&](const char* kind, const std::vector<tier::dsv4::RegionSpec>& rs) {
    for (const auto& r : rs)
      fmt::print("{:<6} {:<36} {:<36} {:>14} {:>14} {:>16} {}\n", kind, r.role,
                 r.backing,
                 r.offset, r.unit_bytes, r.total_bytes, r.reverse_indexed ? "reverse" : "forward");
  };
  rows("PAGE", g->page_regions);
  rows("SLOT", g->slot_regions);
  fmt::print("\npage_bytes_per_block {} ({})\nslot_bytes {} ({})\n", g->page_bytes_per_block,
             tier::format_size(g->page_bytes_per_block), g->slot_bytes,
             tier::format_size(g->slot_bytes));
  return 0;
}

}  // namespace

TIER_CLI_COMMAND(geometry, "geometry --preset NAME | --config JSON [--blocks N] [--slots N] [--json]",
                 "print the DSV4 PAGE/SLOT region table (docs/codecs.md)", run_geometry);
