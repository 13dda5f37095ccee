#pragma once
// DSV4 (DeepSeek-V4) KV-cache geometry: from a model description to the PAGE and SLOT region
// tables, reproducing the reference's unified row space (docs/codecs.md, "Geometry").
//
//  - A row is one token's KV at one layer. Every plane (NoPE, and RoPE for fp8 KV) materializes
//    the same row indices, each at its own row width.
//  - PAGE: each paged block holds the "envelope" of every compressed layer (HCA then CSA), plus
//    one CSA indexer tensor per CSA layer outside the row space. Blocks grow up from row 0.
//  - SLOT: one request's live state = the compressor-state arena followed by every sliding-window
//    ring ("entry"), rounded up to an even row count. Slots sit at the top of each plane and are
//    reverse indexed: group g lives at base + total - (g + 1) * unit.
//
// Everything here is pure arithmetic on the description; binding to engine memory is separate
// (bind_memory()), so `tierctl geometry` and the codecs share one source of truth.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tier/json.hpp"
#include "tier/region.hpp"
#include "tier/status.hpp"

namespace tier::dsv4 {

enum class KvDtype { kFp8, kBf16 };
enum class IndexDtype { kFp8, kFp4 };

// The JSON description (all keys optional over a preset; unknown keys are errors):
//   {"preset": "v4-pro-fp8", "model": "deepseek-v4-pro", "compress_ratios": [128, 128, 4, ...],
//    "kv_dtype": "fp8", "index_dtype": "fp8", "kv_head_dim": 512, "rope_head_dim": 64,
//    "index_head_dim": 128, "block_size": 256, "sliding_window": 128, "spec_steps": 1,
//    "dcp_size": 1, "num_blocks": 64, "num_slots": 4}
struct ModelConfig {
  std::string model = "deepseek-v4";
  // Per layer: 0 dense (SWA only), 4 CSA, 128 HCA, -1 field window (the layer's window is a
  // state field, `field_window`, in the slot's arena: no PAGE rows, no ring).
  std::vector<int> compress_ratios;
  KvDtype kv_dtype = KvDtype::kFp8;
  IndexDtype index_dtype = IndexDtype::kFp8;
  std::uint32_t kv_head_dim = 512;
  std::uint32_t rope_head_dim = 64;
  std::uint32_t index_head_dim = 128;
  std::uint32_t block_size = 256;      // tokens per rank-local block
  std::uint32_t sliding_window = 128;
  std::uint32_t spec_steps = 0;        // speculative (MTP) steps; widens every ring
  std::uint32_t dcp_size = 1;          // decode context parallel: tokens per id = block * dcp
  std::uint64_t num_blocks = 1;
  std::uint64_t num_slots = 1;

  // Strict parse. Errors: InvalidArgument listing every problem with its JSON pointer.
  static Result<ModelConfig> from_json(const Json& description);
  Json to_json() const;
};

// "v4-pro-fp8", "v4-pro-bf16", "v4-flash-fp8", "v4-flash-bf16". Errors: NotFound (with the names).
Result<ModelConfig> preset(std::string_view name);
std::vector<std::string> preset_names();

// One PAGE or SLOT region, located by backing name and byte offset (no pointers yet).
struct RegionSpec {
  std::string role;     // stable semantic role, unique within its PAGE or SLOT set
  std::string backing;  // which allocation: a plane role or an indexer tensor role
  std::uint64_t offset = 0;  // byte offset of the region base inside the backing
  std::uint64_t unit_bytes = 0;   // per block (PAGE) or per slot (SLOT)
  std::uint64_t total_bytes = 0;  // count * unit
  bool reverse_indexed = false;   // PAGE: never; SLOT: always
};

struct Backing {
  std::string name;
  std::uint64_t bytes = 0;
};

// A compressor-state field placed in the arena.
struct FieldPlacement {
  std::string name;
  std::uint32_t plane = 0;
  std::uint64_t offset = 0;  // bytes from the slot start in that plane (256-byte aligned)
  std::uint64_t bytes = 0;
};

struct Plane {
  std::string role;  // "dsv4.main_kv.nope" / "dsv4.main_kv.rope"
  std::uint32_t row_bytes = 0;
};

struct Geometry {
  ModelConfig config;
  std::uint32_t n_csa = 0, n_hca = 0, n_dense = 0, n_field = 0;
  std::uint32_t ring_slots = 0;      // sliding_window + spec_steps
  std::uint64_t envelope_rows = 0;   // rows of one block, all compressed layers
  std::uint64_t arena_rows = 0, entry_rows = 0, slot_rows = 0;
  std::uint64_t plane_rows = 0;      // num_blocks * envelope_rows + num_slots * slot_rows
  std::vector<Plane> planes;
  std::vector<FieldPlacement> fields;
  std::vector<RegionSpec> page_regions;  // forward indexed, reference order
  std::vector<RegionSpec> slot_regions;  // reverse indexed, one per plane
  std::vector<Backing> backings;         // planes first, then indexer tensors
  std::uint64_t page_bytes_per_block = 0;
  std::uint64_t slot_bytes = 0;

  // Errors: InvalidArgument (unsupported ratio, dims that do not divide, overflow).
  static Result<Geometry> compute(const ModelConfig& config);
  // The full table (tierctl geometry --json).
  Json to_json() const;
  // The slot layout that identifies a SLOT payload: everything that changes its bytes, but not
  // num_slots or total_bytes (resizing the state pool must not orphan stored sidecars).
  Json slot_format_json() const;
};

// A region bound to engine memory: what the PAGE and SLOT codecs validate and move.
struct BoundRegion {
  std::string role;
  std::byte* base = nullptr;
  std::uint64_t total_bytes = 0;
  std::uint64_t unit_bytes = 0;
  bool reverse_indexed = false;
  MemoryKind kind = MemoryKind::kHost;
  std::int32_t device = -1;

  // Address of unit `i` (block id or slot group). The caller checks `i` against the count.
  std::byte* unit(std::uint64_t i) const noexcept {
    return reverse_indexed ? base + total_bytes - (i + 1) * unit_bytes : base + i * unit_bytes;
  }
};

struct BoundMemory {
  std::vector<BoundRegion> page;
  std::vector<BoundRegion> slot;
};

// Binds the geometry to engine allocations, one Region per entry of geometry.backings (same
// order). An allocation may be larger than the geometry needs: PAGE blocks are bound from its
// first row up and SLOT slots from its last whole row down (group 0 highest), with the free rows
// between them, as ATOM allocates a plane. Checks each allocation is large enough and that no two
// regions (PAGE or SLOT) overlap, so a PAGE scatter can never touch a SLOT span even when they
// share a plane.
// Errors: InvalidArgument.
Result<BoundMemory> bind_memory(const Geometry& geometry, std::span<const Region> backings);

}  // namespace tier::dsv4
