// The offload engine with the DSV4 layout (PAGE + SLOT, a stateful model), out of tree:
// pkg-config libtier_dsv4_layout only. A request saves its prompt (PAGE chunks and the SLOT at
// the prompt-end anchor); a second request with the same prompt loads both into other blocks and
// another state group, and the bytes are compared.
#include <cstring>

#include "tier/dsv4/kv_layout.hpp"
#include "engine_loop.hpp"

namespace {

using namespace tier;

void fill(const std::vector<Region>& regions, unsigned seed) {
  for (const Region& r : regions)
    for (std::size_t i = 0; i < r.size; ++i) r.data[i] = std::byte(seed + i * 13 + (i >> 9));
}

bool same(const std::vector<Region>& a, const std::vector<Region>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size != b[i].size || std::memcmp(a[i].data, b[i].data, a[i].size) != 0) return false;
  return true;
}

}  // namespace

int main() {
  // A small DSV4-Flash model: three layers (dense, CSA, HCA), 16 blocks, 4 state groups.
  auto model = demo::must(dsv4::ModelConfig::from_json(Json::parse(
                              R"({"preset": "v4-flash-fp8", "compress_ratios": [0, 4, 128],
                                  "num_blocks": 16, "num_slots": 4})")),
                          "model");
  auto geometry = demo::must(dsv4::Geometry::compute(model), "geometry");
  engine::EngineConfig config;
  config.page_namespace = Key128{0x647376340a, 2};  // one per model and KV layout
  auto layout = demo::must(dsv4::Dsv4Layout::create(geometry, config.page_namespace, 1, 0),
                           "dsv4::Dsv4Layout::create");
  config.block_tokens = layout->block_tokens();
  config.chunk_tokens = layout->block_tokens();
  config.checkpoint_interval_tokens = -1;  // one SLOT per prompt: the prompt-end anchor
  config.min_load_tokens = config.chunk_tokens;
  demo::Engine e = demo::make_engine(config, *layout);

  const std::uint64_t chunk = config.chunk_tokens;
  std::vector<std::uint32_t> prompt(3 * chunk + 10);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = 7 + std::uint32_t(i % 5000);
  std::vector<std::uint32_t> first{0, 1, 2, 3}, second{4, 5, 6, 7};
  fill(demo::must(layout->page_regions(first), "page_regions"), 1);
  fill(demo::must(layout->slot_regions(0), "slot_regions"), 2);
  demo::save_request(e, 1, prompt, first, 0);
  std::uint64_t resume = demo::load_request(e, 2, prompt, second, 1);
  if (resume != 3 * chunk) {
    std::fprintf(stderr, "FAIL: resumed at %llu, expected %llu\n", (unsigned long long)resume,
                 (unsigned long long)(3 * chunk));
    return 1;
  }
  std::span<const std::uint32_t> a(first.data(), 3), b(second.data(), 3);
  if (!same(demo::must(layout->page_regions(a), "page_regions"),
            demo::must(layout->page_regions(b), "page_regions")) ||
      !same(demo::must(layout->slot_regions(0), "slot_regions"),
            demo::must(layout->slot_regions(1), "slot_regions"))) {
    std::fprintf(stderr, "FAIL: the loaded PAGE or SLOT bytes differ from the saved ones\n");
    return 1;
  }
  std::printf(
      "dsv4 layout: saved %llu tokens (PAGE + SLOT), loaded them into other blocks and "
      "another state group, bytes equal\n",
      (unsigned long long)resume);
  return 0;
}
