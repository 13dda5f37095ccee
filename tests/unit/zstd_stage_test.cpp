// zstd stage codec: bit-exact round trips, the inner layout guard, corrupt input, options.
#include <doctest/doctest.h>

#include <vector>

#include "tier/registry.hpp"
#include "zstd_stage.hpp"

using namespace tier;

namespace {
std::vector<std::byte> sample(std::size_t n) {
  std::vector<std::byte> v(n);
  std::uint64_t x = 7;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1;
    v[i] = static_cast<std::byte>((i % 3 == 0) ? (x >> 60) : (i & 0x3f));
  }
  return v;
}
PluginPtr<StageCodec> make(int level) {
  auto s = Registry::global().create_stage("zstd", Json{{"level", level}, {"max_raw_bytes", 1u << 30}});
  REQUIRE(s.is_ok());
  return std::move(s).value();
}
}  // namespace

TEST_CASE("round trips are bit-exact at several levels and sizes") {
  for (int level : {-3, 1, 3, 9}) {
    auto z = make(level);
    CHECK(z->stage_id() == zstd::kZstdStageId);
    CHECK(z->stage_id() != 0);
    for (std::size_t n : {std::size_t{1}, std::size_t{193}, std::size_t{1} << 20}) {
      auto raw = sample(n);
      std::vector<std::byte> enc(z->max_encoded_size(n));
      auto m = z->encode(42, raw, enc);
      REQUIRE(m.is_ok());
      enc.resize(*m);
      auto size = z->decoded_size(enc, 42);
      REQUIRE(size.is_ok());
      CHECK(*size == n);
      std::vector<std::byte> back(n);
      auto k = z->decode(enc, 42, back);
      REQUIRE(k.is_ok());
      CHECK(back == raw);
    }
  }
}

TEST_CASE("the header records the inner layout, so decode cannot mix codecs up") {
  auto z = make(3);
  auto raw = sample(4096);
  std::vector<std::byte> enc(z->max_encoded_size(raw.size()));
  auto m = z->encode(7, raw, enc);
  REQUIRE(m.is_ok());
  enc.resize(*m);
  CHECK(enc.size() < raw.size());
  CHECK(z->decoded_size(enc, 8).status() == Code::kChecksumMismatch);
  std::vector<std::byte> back(raw.size());
  CHECK(z->decode(enc, 8, back).status() == Code::kChecksumMismatch);
}

TEST_CASE("corrupt or truncated input is ChecksumMismatch, never a short success") {
  auto z = make(3);
  auto raw = sample(8192);
  std::vector<std::byte> enc(z->max_encoded_size(raw.size()));
  enc.resize(*z->encode(1, raw, enc));
  std::vector<std::byte> back(raw.size());
  auto bad = enc;
  bad[0] ^= std::byte{1};  // magic
  CHECK(z->decode(bad, 1, back).status() == Code::kChecksumMismatch);
  bad = enc;
  bad[8] ^= std::byte{1};  // raw size disagrees with the frame
  CHECK(z->decoded_size(bad, 1).status() == Code::kChecksumMismatch);
  bad = enc;
  bad.resize(bad.size() - 5);
  CHECK(z->decode(bad, 1, back).status() == Code::kChecksumMismatch);
  bad = enc;
  bad[15] = std::byte{0xff};
  bad[14] = std::byte{0xff};  // a size beyond max_raw_bytes
  CHECK(z->decoded_size(bad, 1).status() == Code::kChecksumMismatch);
  CHECK(z->decoded_size(std::span(enc).first(10), 1).status() == Code::kChecksumMismatch);
}

TEST_CASE("options are strict") {
  auto* info = Registry::global().find(PluginKind::kStage, "zstd");
  REQUIRE(info != nullptr);
  for (const auto& o : info->options) CHECK_FALSE(o.doc.empty());
  ConfigErrors errors;
  resolve_options(Json{{"level", 99}}, info->options, "/tiers/0/stage", errors);
  resolve_options(Json{{"levle", 3}}, info->options, "/tiers/0/stage", errors);
  REQUIRE(errors.list().size() == 2);
  CHECK(errors.list()[0].rfind("/tiers/0/stage/level", 0) == 0);
  CHECK(errors.list()[1].find("did you mean \"level\"") != std::string::npos);
}
