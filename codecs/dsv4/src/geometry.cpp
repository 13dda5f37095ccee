#include "tier/dsv4/geometry.hpp"

#include <algorithm>
#include <limits>
#include <span>

#include <fmt/format.h>

#include "tier/options.hpp"

namespace tier::dsv4 {
namespace {

constexpr int kCsaRatio = 4;
constexpr int kHcaRatio = 128;
constexpr int kFieldWindowRatio = -1;  // the layer's window lives in a state field (DSpark)
// A field window is unquantized: bf16, whatever the KV dtype (docs/codecs.md).
constexpr std::uint64_t kFieldWindowElemBytes = 2;
constexpr std::uint64_t kFieldAlign = 256;  // arena field offsets
constexpr std::uint64_t kSlotAlignRows = 2;
constexpr std::uint32_t kIndexScaleBytes = 4;  // fp32 scale per fp8 indexer row
constexpr std::uint32_t kFp4GroupSize = 32;    // e8m0 scale per 32 fp4 values

const std::vector<std::string> kConfigKeys = {
    "preset",      "model",          "compress_ratios", "kv_dtype",   "index_dtype",
    "kv_head_dim", "rope_head_dim",  "index_head_dim",  "block_size", "sliding_window",
    "spec_steps",  "dcp_size",       "num_blocks",      "num_slots"};

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
std::uint64_t ceil_div(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a; }

std::vector<int> pro_ratios() {
  std::vector<int> r = {128, 128};
  for (int i = 0; i < 29; ++i) r.insert(r.end(), {4, 128});
  r.insert(r.end(), {4, 0});
  return r;
}
std::vector<int> flash_ratios() {
  std::vector<int> r = {0, 0};
  for (int i = 0; i < 20; ++i) r.insert(r.end(), {4, 128});
  r.insert(r.end(), {4, 0, 0, 0});
  return r;
}

std::string_view kv_name(KvDtype d) { return d == KvDtype::kFp8 ? "fp8" : "bf16"; }
std::string_view index_name(IndexDtype d) { return d == IndexDtype::kFp8 ? "fp8" : "fp4"; }

template <class T>
void read_uint(const Json& j, const char* key, T& out, std::uint64_t lo, ConfigErrors& errors) {
  if (!j.contains(key)) return;
  const Json& v = j.at(key);
  const bool non_negative =
      v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
  if (!non_negative || v.get<std::uint64_t>() < lo ||
      v.get<std::uint64_t>() > std::numeric_limits<T>::max()) {
    errors.add(fmt::format("/{}", key),
               fmt::format("expected an unsigned integer >= {}, got {}", lo, describe_json(v)));
    return;
  }
  out = static_cast<T>(v.get<std::uint64_t>());
}

// Entry rows of one ring class: `n` layers whose rings interleave in runs of `stride`.
std::uint64_t class_entry_rows(std::uint64_t n, std::uint64_t stride, std::uint64_t ring_slots) {
  if (n == 0) return 0;
  auto ring_offset = [&](std::uint64_t q) { return (q / stride) * (n * stride) + q % stride; };
  return (n - 1) * stride + ring_offset(ring_slots - 1) + 1;
}

struct FieldSize {
  const char* name;
  std::uint64_t bytes;
};

// Compressor-state fields (fp32), in wire order. CSA windows hold two compression periods plus
// the speculative steps; HCA windows one period plus the steps. Then the field windows (every
// field-window layer's ring of kv_head_dim, bf16), last as in the reference's list. `g` gives
// the layer counts and the ring length.
std::vector<FieldSize> compressor_fields(const ModelConfig& c, const Geometry& g) {
  const std::uint64_t csa_win = 2 * kCsaRatio + c.spec_steps, hca_win = kHcaRatio + c.spec_steps;
  return {
      {"csa_main_kv", g.n_csa * csa_win * 2 * c.kv_head_dim * 4},
      {"csa_main_score", g.n_csa * csa_win * 2 * c.kv_head_dim * 4},
      {"csa_idx_kv", g.n_csa * csa_win * 2 * c.index_head_dim * 4},
      {"csa_idx_score", g.n_csa * csa_win * 2 * c.index_head_dim * 4},
      {"hca_main_kv", g.n_hca * hca_win * c.kv_head_dim * 4},
      {"hca_main_score", g.n_hca * hca_win * c.kv_head_dim * 4},
      {"field_window", g.n_field * g.ring_slots * c.kv_head_dim * kFieldWindowElemBytes},
  };
}

struct Arena {
  std::uint64_t rows = 0;
  std::vector<FieldPlacement> fields;  // the non-empty ones
};

// The arena when field f goes to plane assign[f], each field aligned after the previous one of
// its plane.
Arena arrange(std::span<const FieldSize> fields, std::span<const std::uint32_t> assign,
              std::span<const Plane> planes) {
  Arena arena;
  std::vector<std::uint64_t> used(planes.size(), 0);
  for (std::size_t f = 0; f < fields.size(); ++f) {
    if (!fields[f].bytes) continue;
    std::uint64_t off = align_up(used[assign[f]], kFieldAlign);
    arena.fields.push_back({fields[f].name, assign[f], off, fields[f].bytes});
    used[assign[f]] = off + fields[f].bytes;
  }
  for (std::size_t p = 0; p < planes.size(); ++p)
    arena.rows = std::max(arena.rows, ceil_div(used[p], planes[p].row_bytes));
  return arena;
}

// Tries every field -> plane assignment (the first field varies slowest) and keeps the first
// with the fewest arena rows.
Arena place_fields(std::span<const FieldSize> fields, std::span<const Plane> planes) {
  const std::size_t np = planes.size(), nf = fields.size();
  std::uint64_t combos = 1;
  for (std::size_t i = 0; i < nf; ++i) combos *= np;
  Arena best{.rows = std::numeric_limits<std::uint64_t>::max()};
  std::vector<std::uint32_t> assign(nf);
  for (std::uint64_t code = 0; code < combos; ++code) {
    std::uint64_t rest = code;
    for (std::size_t f = nf; f-- > 0;) {
      assign[f] = static_cast<std::uint32_t>(rest % np);
      rest /= np;
    }
    Arena arena = arrange(fields, assign, planes);
    if (arena.rows < best.rows) best = std::move(arena);
  }
  return best;
}

// The PAGE regions of the CSA layers' indexer tensors, each in a backing of its own named like
// the region: fp8 rows with their fp32 scale, or packed fp4 (E2M1) data plus its e8m0 scale pool.
std::vector<RegionSpec> indexer_regions(const ModelConfig& c) {
  const std::uint64_t csa_rows = c.block_size / kCsaRatio;
  std::vector<RegionSpec> regions;
  auto add = [&](std::string role, std::uint64_t unit) {
    regions.push_back({role, role, 0, unit, c.num_blocks * unit, false});
  };
  for (std::size_t layer = 0; layer < c.compress_ratios.size(); ++layer) {
    if (c.compress_ratios[layer] != kCsaRatio) continue;
    std::string role = fmt::format("dsv4.csa_indexer.layer_{}", layer);
    if (c.index_dtype == IndexDtype::kFp8) {
      add(role, csa_rows * (c.index_head_dim + kIndexScaleBytes));
    } else {
      add(role, csa_rows * c.index_head_dim / 2);
      add(fmt::format("dsv4.csa_indexer_scale.layer_{}", layer),
          csa_rows * c.index_head_dim / kFp4GroupSize);
    }
  }
  return regions;
}

}  // namespace

Result<ModelConfig> ModelConfig::from_json(const Json& j) {
  ConfigErrors errors;
  if (!j.is_object()) return Status::invalid("geometry: expected a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find(kConfigKeys.begin(), kConfigKeys.end(), it.key()) != kConfigKeys.end())
      continue;
    std::string hint = did_you_mean(it.key(), kConfigKeys);
    errors.add("/" + it.key(), hint.empty() ? std::string("unknown key")
                                            : fmt::format("unknown key; did you mean \"{}\"?", hint));
  }
  ModelConfig c;
  if (j.contains("preset")) {
    if (!j["preset"].is_string()) {
      errors.add("/preset", "expected a preset name, got " + describe_json(j["preset"]));
    } else {
      auto p = preset(j["preset"].get<std::string>());
      if (!p) errors.add("/preset", std::string(p.status().message()));
      else c = *p;
    }
  }
  if (j.contains("model")) {
    if (j["model"].is_string()) c.model = j["model"].get<std::string>();
    else errors.add("/model", "expected a string, got " + describe_json(j["model"]));
  }
  if (j.contains("compress_ratios")) {
    const Json& r = j["compress_ratios"];
    if (!r.is_array() || r.empty()) {
      errors.add("/compress_ratios",
                 "expected a non-empty array of 0, 4, 128 or -1, got " + describe_json(r));
    } else {
      c.compress_ratios.clear();
      for (std::size_t i = 0; i < r.size(); ++i) {
        if (!r[i].is_number_integer() ||
            (r[i].get<int>() != 0 && r[i].get<int>() != kCsaRatio && r[i].get<int>() != kHcaRatio &&
             r[i].get<int>() != kFieldWindowRatio)) {
          errors.add(fmt::format("/compress_ratios/{}", i),
                     fmt::format("expected 0 (dense), 4 (CSA), 128 (HCA) or -1 (field window), "
                                 "got {}",
                                 describe_json(r[i])));
          continue;
        }
        c.compress_ratios.push_back(r[i].get<int>());
      }
    }
  }
  auto read_enum = [&](const char* key, auto& out, auto a, auto b, const char* an,
                       const char* bn) {
    if (!j.contains(key)) return;
    if (j[key] == an) out = a;
    else if (j[key] == bn) out = b;
    else
      errors.add(fmt::format("/{}", key),
                 fmt::format("expected \"{}\" or \"{}\", got {}", an, bn, describe_json(j[key])));
  };
  read_enum("kv_dtype", c.kv_dtype, KvDtype::kFp8, KvDtype::kBf16, "fp8", "bf16");
  read_enum("index_dtype", c.index_dtype, IndexDtype::kFp8, IndexDtype::kFp4, "fp8", "fp4");
  read_uint(j, "kv_head_dim", c.kv_head_dim, 1, errors);
  read_uint(j, "rope_head_dim", c.rope_head_dim, 1, errors);
  read_uint(j, "index_head_dim", c.index_head_dim, 1, errors);
  read_uint(j, "block_size", c.block_size, 1, errors);
  read_uint(j, "sliding_window", c.sliding_window, 1, errors);
  read_uint(j, "spec_steps", c.spec_steps, 0, errors);
  read_uint(j, "dcp_size", c.dcp_size, 1, errors);
  read_uint(j, "num_blocks", c.num_blocks, 1, errors);
  read_uint(j, "num_slots", c.num_slots, 1, errors);
  if (c.compress_ratios.empty() && !j.contains("compress_ratios"))
    errors.add("/compress_ratios", "required (or give a preset)");
  if (!errors.empty()) return errors.to_status();
  return c;
}

Json ModelConfig::to_json() const {
  return {{"model", model},
          {"compress_ratios", compress_ratios},
          {"kv_dtype", kv_name(kv_dtype)},
          {"index_dtype", index_name(index_dtype)},
          {"kv_head_dim", kv_head_dim},
          {"rope_head_dim", rope_head_dim},
          {"index_head_dim", index_head_dim},
          {"block_size", block_size},
          {"sliding_window", sliding_window},
          {"spec_steps", spec_steps},
          {"dcp_size", dcp_size},
          {"num_blocks", num_blocks},
          {"num_slots", num_slots}};
}

std::vector<std::string> preset_names() {
  return {"v4-pro-fp8", "v4-pro-bf16", "v4-flash-fp8", "v4-flash-bf16"};
}

Result<ModelConfig> preset(std::string_view name) {
  ModelConfig c;
  c.num_blocks = 64;
  c.num_slots = 4;
  if (name.starts_with("v4-pro-")) {
    c.model = "deepseek-v4-pro";
    c.compress_ratios = pro_ratios();
    c.spec_steps = 1;  // one MTP step
    name.remove_prefix(7);
  } else if (name.starts_with("v4-flash-")) {
    c.model = "deepseek-v4-flash";
    c.compress_ratios = flash_ratios();
    c.spec_steps = 3;  // window 131 = 128 + 3 draft steps
    name.remove_prefix(9);
  } else {
    name = "";
  }
  if (name == "fp8") c.kv_dtype = KvDtype::kFp8;
  else if (name == "bf16") c.kv_dtype = KvDtype::kBf16;
  else
    return Status(Code::kNotFound, fmt::format("unknown preset; presets: {}",
                                               fmt::join(preset_names(), ", ")));
  return c;
}

Result<Geometry> Geometry::compute(const ModelConfig& c) {
  Geometry g;
  g.config = c;
  if (c.block_size % kHcaRatio != 0)
    return Status::invalid(fmt::format("block_size {} is not a multiple of {} (lcm of the ratios)",
                                       c.block_size, kHcaRatio));
  if (c.index_dtype == IndexDtype::kFp4 && c.index_head_dim % kFp4GroupSize != 0)
    return Status::invalid(fmt::format("index_head_dim {} is not a multiple of {} (fp4 groups)",
                                       c.index_head_dim, kFp4GroupSize));
  for (int r : c.compress_ratios) {
    if (r == kCsaRatio) ++g.n_csa;
    else if (r == kHcaRatio) ++g.n_hca;
    else if (r == 0) ++g.n_dense;
    else if (r == kFieldWindowRatio)
      ++g.n_field;
    else
      return Status::invalid(fmt::format("compress ratio {} is not 0, 4, 128 or -1", r));
  }
  const std::uint64_t bs = c.block_size;
  const std::uint64_t csa_rows = bs / kCsaRatio, hca_rows = bs / kHcaRatio;
  g.ring_slots = c.sliding_window + c.spec_steps;
  g.envelope_rows = g.n_hca * hca_rows + g.n_csa * csa_rows;
  // Entry order: dense, HCA, CSA. Dense rings interleave in runs of the whole ring. A
  // field-window layer has no ring and no PAGE rows: its window is the field_window state field.
  g.entry_rows = class_entry_rows(g.n_dense, g.ring_slots, g.ring_slots) +
                 class_entry_rows(g.n_hca, hca_rows, g.ring_slots) +
                 class_entry_rows(g.n_csa, csa_rows, g.ring_slots);

  if (c.kv_dtype == KvDtype::kFp8) {
    g.planes = {{"dsv4.main_kv.nope", c.kv_head_dim}, {"dsv4.main_kv.rope", c.rope_head_dim * 2}};
  } else {
    g.planes = {{"dsv4.main_kv.nope", c.kv_head_dim * 2}};
  }

  Arena arena = place_fields(compressor_fields(c, g), g.planes);
  g.arena_rows = arena.rows;
  g.fields = std::move(arena.fields);
  g.slot_rows = align_up(g.arena_rows + g.entry_rows, kSlotAlignRows);
  if (g.envelope_rows == 0) return Status::invalid("no compressed layer: a PAGE block would be empty");
  const long double plane_rows_ld = static_cast<long double>(c.num_blocks) * g.envelope_rows +
                                    static_cast<long double>(c.num_slots) * g.slot_rows;
  if (plane_rows_ld * g.planes[0].row_bytes > static_cast<long double>(1ull << 62))
    return Status::invalid("geometry too large (num_blocks/num_slots overflow)");
  g.plane_rows = c.num_blocks * g.envelope_rows + c.num_slots * g.slot_rows;

  for (const Plane& p : g.planes) {
    g.backings.push_back({p.role, g.plane_rows * p.row_bytes});
    std::uint64_t unit = g.envelope_rows * p.row_bytes;
    g.page_regions.push_back({p.role, p.role, 0, unit, c.num_blocks * unit, false});
  }
  for (RegionSpec& r : indexer_regions(c)) {
    g.backings.push_back({r.backing, r.total_bytes});
    g.page_regions.push_back(std::move(r));
  }
  for (const Plane& p : g.planes) {
    std::uint64_t unit = g.slot_rows * p.row_bytes;
    g.slot_regions.push_back({p.role, p.role, c.num_blocks * g.envelope_rows * p.row_bytes, unit,
                              c.num_slots * unit, true});
  }
  for (const auto& r : g.page_regions) g.page_bytes_per_block += r.unit_bytes;
  for (const auto& r : g.slot_regions) g.slot_bytes += r.unit_bytes;
  return g;
}

Json Geometry::to_json() const {
  auto regions = [](const std::vector<RegionSpec>& rs) {
    Json a = Json::array();
    for (const auto& r : rs)
      a.push_back({{"role", r.role},
                   {"backing", r.backing},
                   {"offset", r.offset},
                   {"unit_bytes", r.unit_bytes},
                   {"total_bytes", r.total_bytes},
                   {"reverse_indexed", r.reverse_indexed}});
    return a;
  };
  Json planes_j = Json::array();
  for (const auto& p : planes) planes_j.push_back({{"role", p.role}, {"row_bytes", p.row_bytes}});
  Json fields_j = Json::array();
  for (const auto& f : fields)
    fields_j.push_back({{"name", f.name}, {"plane", planes[f.plane].role}, {"offset", f.offset},
                        {"bytes", f.bytes}});
  Json backings_j = Json::array();
  for (const auto& b : backings) backings_j.push_back({{"name", b.name}, {"bytes", b.bytes}});
  return {{"config", config.to_json()},
          {"layers", {{"csa", n_csa}, {"hca", n_hca}, {"dense", n_dense}, {"field", n_field}}},
          {"ring_slots", ring_slots},
          {"virtual_block_tokens", static_cast<std::uint64_t>(config.block_size) * config.dcp_size},
          {"envelope_rows", envelope_rows},
          {"arena_rows", arena_rows},
          {"entry_rows", entry_rows},
          {"slot_rows", slot_rows},
          {"plane_rows", plane_rows},
          {"planes", planes_j},
          {"arena_fields", fields_j},
          {"page_regions", regions(page_regions)},
          {"slot_regions", regions(slot_regions)},
          {"backings", backings_j},
          {"page_bytes_per_block", page_bytes_per_block},
          {"slot_bytes", slot_bytes}};
}

Json Geometry::slot_format_json() const {
  Json regions = Json::array();
  for (const auto& r : slot_regions)
    regions.push_back({{"role", r.role}, {"unit_bytes", r.unit_bytes},
                       {"reverse_indexed", r.reverse_indexed}});
  Json fields_j = Json::array();
  for (const auto& f : fields)
    fields_j.push_back({{"name", f.name}, {"plane", f.plane}, {"offset", f.offset}, {"bytes", f.bytes}});
  return {{"schema", "libtier-dsv4-slot-v1"},
          {"layout_schema", "dsv4-semantic-region-order-v1"},
          {"model", config.model},
          {"kv_dtype", kv_name(config.kv_dtype)},
          {"index_dtype", index_name(config.index_dtype)},
          {"compress_ratios", config.compress_ratios},
          {"block_size", config.block_size},
          {"kv_head_dim", config.kv_head_dim},
          {"rope_head_dim", config.rope_head_dim},
          {"index_head_dim", config.index_head_dim},
          {"ring_slots", ring_slots},
          {"arena_fields", fields_j},
          {"slot_rows", slot_rows},
          {"slot_regions", regions}};
}

Result<BoundMemory> bind_memory(const Geometry& g, std::span<const Region> backings) {
  if (backings.size() != g.backings.size())
    return Status::invalid(fmt::format("dsv4 bind: {} allocations given, the geometry has {}",
                                       backings.size(), g.backings.size()));
  for (std::size_t i = 0; i < backings.size(); ++i) {
    if (backings[i].data == nullptr || backings[i].size < g.backings[i].bytes)
      return Status::invalid(fmt::format("dsv4 bind: allocation {} ({}) has {} bytes, needs {}", i,
                                         g.backings[i].name, backings[i].size,
                                         g.backings[i].bytes));
  }
  auto bind_set = [&](const std::vector<RegionSpec>& specs, std::vector<BoundRegion>& out) {
    for (const auto& s : specs) {
      std::size_t b = 0;
      while (g.backings[b].name != s.backing) ++b;
      const Region& r = backings[b];
      std::uint64_t offset = s.offset;
      if (s.reverse_indexed) {
        // SLOT rows sit at the top of the plane as the caller allocated it (ATOM: blocks grow up
        // from row 0, slots down from the last row, free rows between): the top slot ends at the
        // plane's last whole row. A plane of exactly the geometry's size has no gap.
        const std::uint64_t row_bytes = s.unit_bytes / g.slot_rows;
        offset = r.size / row_bytes * row_bytes - s.total_bytes;
      }
      out.push_back({s.role, r.data + offset, s.total_bytes, s.unit_bytes, s.reverse_indexed,
                     r.kind, r.device});
    }
  };
  BoundMemory layout;
  bind_set(g.page_regions, layout.page);
  bind_set(g.slot_regions, layout.slot);
  // No two regions may overlap (different allocations could still alias if the caller passed
  // overlapping ones).
  std::vector<const BoundRegion*> all;
  for (const auto& r : layout.page) all.push_back(&r);
  for (const auto& r : layout.slot) all.push_back(&r);
  for (std::size_t i = 0; i < all.size(); ++i)
    for (std::size_t j = i + 1; j < all.size(); ++j) {
      auto a0 = reinterpret_cast<std::uintptr_t>(all[i]->base), a1 = a0 + all[i]->total_bytes;
      auto b0 = reinterpret_cast<std::uintptr_t>(all[j]->base), b1 = b0 + all[j]->total_bytes;
      if (a0 < b1 && b0 < a1 && all[i]->kind == all[j]->kind && all[i]->device == all[j]->device)
        return Status::invalid(fmt::format("dsv4 bind: regions {} and {} overlap", all[i]->role,
                                           all[j]->role));
    }
  return layout;
}

}  // namespace tier::dsv4
