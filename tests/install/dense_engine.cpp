// A KvLayout for a plain dense-attention model's paged KV (docs/engine.md, "Writing a KvLayout"),
// driven by the offload engine out of tree: pkg-config libtier_engine only.
#include <cstring>

#include "engine_loop.hpp"

namespace {

using namespace tier;
using namespace tier::engine;

// The KV pool: num_blocks blocks of block_tokens tokens, each token `layers x 2 (K, V) x heads x
// head_dim` fp16 values, one contiguous host array, block-major. A PAGE chunk is the blocks'
// bytes in order (the identity codec); there is no per-request state (stateful = false), so the
// SLOT calls are never made.
class DensePagedLayout final : public KvLayout {
 public:
  DensePagedLayout(std::uint32_t num_blocks, std::uint32_t block_tokens, std::size_t token_bytes)
      : block_tokens_(block_tokens),
        block_bytes_(block_tokens * token_bytes),
        pool_(num_blocks * block_bytes_),
        codec_(demo::must(Registry::global().create_codec("identity", Json::object()),
                          "identity codec")) {}

  const Codec& page_codec() const noexcept override { return *codec_; }
  Result<std::vector<Region>> page_regions(std::span<const std::uint32_t> ids) const override {
    std::vector<Region> out;
    for (std::uint32_t id : ids) {
      if (std::size_t(id) * block_bytes_ >= pool_.size())
        return Status(Code::kInvalidArgument, "block id out of the pool");
      out.push_back(Region{block(id), block_bytes_, MemoryKind::kHost, -1});
    }
    return out;
  }
  Result<std::vector<Region>> slot_regions(std::int32_t) const override {
    return Status(Code::kNotSupported, "a dense model has no SLOT state");
  }
  Result<std::unique_ptr<Codec>> slot_codec(const SlotIdentity&) const override {
    return Status(Code::kNotSupported, "a dense model has no SLOT state");
  }
  std::uint32_t block_tokens() const noexcept override { return block_tokens_; }

  std::byte* block(std::uint32_t id) const {
    return const_cast<std::byte*>(pool_.data()) + std::size_t(id) * block_bytes_;
  }
  std::size_t block_bytes() const { return block_bytes_; }

 private:
  std::uint32_t block_tokens_;
  std::size_t block_bytes_;
  std::vector<std::byte> pool_;
  PluginPtr<Codec> codec_;
};

}  // namespace

int main() {
  EngineConfig config;
  config.block_tokens = 16;
  config.chunk_tokens = 32;
  config.stateful = false;                // no SLOT: a PAGE prefix alone resumes
  config.checkpoint_interval_tokens = 0;  // no SLOT saves
  config.min_load_tokens = 32;
  config.page_namespace = Key128{0x64656e7365, 1};  // one per model and KV layout
  DensePagedLayout layout(16, config.block_tokens, /*layers 2 x K,V x 4 heads x 64 x fp16*/ 2048);
  demo::Engine e = demo::make_engine(config, layout);

  std::vector<std::uint32_t> prompt(100);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = 1000 + std::uint32_t(i);
  std::vector<std::uint32_t> first{0, 1, 2, 3, 4, 5, 6}, second{8, 9, 10, 11, 12, 13, 14};
  for (std::uint32_t b : first)
    for (std::size_t i = 0; i < layout.block_bytes(); ++i)
      layout.block(b)[i] = std::byte(b * 31 + i * 7);
  demo::save_request(e, 1, prompt, first, -1);
  std::uint64_t resume = demo::load_request(e, 2, prompt, second, -1);
  // 100 tokens: 3 full chunks (96 tokens) are saved and loaded back.
  if (resume != 96) {
    std::fprintf(stderr, "FAIL: resumed at %llu, expected 96\n", (unsigned long long)resume);
    return 1;
  }
  for (std::size_t b = 0; b < resume / config.block_tokens; ++b)
    if (std::memcmp(layout.block(first[b]), layout.block(second[b]), layout.block_bytes()) != 0) {
      std::fprintf(stderr, "FAIL: block %zu differs after the load\n", b);
      return 1;
    }
  std::printf("dense KvLayout: saved 96 tokens, loaded them into other blocks, bytes equal\n");
  return 0;
}
