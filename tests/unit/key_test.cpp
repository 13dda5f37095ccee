// Keys are normative (docs/keys.md): these golden vectors must never change without a new
// domain tag, or every stored object becomes unreachable.
#include <doctest/doctest.h>
#include <xxhash.h>

#include <cctype>
#include <string>

#include "tier/key.hpp"

using namespace tier;

namespace {
const Json kV4 = Json::parse(
    R"({"model":"deepseek-v4-pro","layout_version":1,"kv_dtype":"fp8","block_size":256,)"
    R"("chunk_size":256,"tp_size":8})");
}

TEST_CASE("golden namespace ids") {
  CHECK(namespace_id(kV4)->hex() == "6fe91321d1cb766be97f553a73bcd7f3");
  CHECK(namespace_id(Json::object())->hex() == "10da6bf95efb7b90c0835b2d72965725");
  CHECK(namespace_id(Json::parse(R"({"b":[1,2.5,true,null],"a":"x"})"))->hex() ==
        "9bac68f499b2bc7c40365588a2ae7b3a");
}

TEST_CASE("golden chunk keys") {
  Key128 ns = *namespace_id(kV4);
  std::vector<std::uint32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  auto keys = chunk_keys(ns, tokens, 4);
  REQUIRE(keys.size() == 2);
  CHECK(keys[0].hex() == "91035bd943d14336f4aa8f1f7f8852c3");
  CHECK(keys[1].hex() == "9d2bcacea2eb4ce4329f22197e47b870");
  Key128 ns2 = *namespace_id(Json::parse(R"({"a":"x","b":[1,2.5,true,null]})"));
  std::vector<std::uint32_t> t2 = {4294967295u, 7};
  auto k2 = chunk_keys(ns2, t2, 1);
  CHECK(k2[0].hex() == "376cb7cbbf2058d7564f8bab0283642d");
  CHECK(k2[1].hex() == "c4144b52b5af6d54628c24a0b3d4cc47");
}

TEST_CASE("the chunk key is XXH3-128 of exactly the documented bytes") {
  Key128 ns{0x0102030405060708ull, 0x1112131415161718ull};
  Key128 parent{0x2122232425262728ull, 0x3132333435363738ull};
  std::vector<std::uint32_t> tokens = {0x01020304u, 5};
  std::vector<unsigned char> bytes;
  for (char c : std::string("libtier-chunk-v1")) bytes.push_back(static_cast<unsigned char>(c));
  bytes.push_back(0);
  auto le64 = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<unsigned char>(v >> (8 * i)));
  };
  le64(ns.lo), le64(ns.hi), le64(parent.lo), le64(parent.hi), le64(tokens.size());
  for (std::uint32_t t : tokens)
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<unsigned char>(t >> (8 * i)));
  XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  Key128 k = chunk_key(ns, parent, tokens);
  CHECK(k.lo == h.low64);
  CHECK(k.hi == h.high64);
}

TEST_CASE("an extra key changes every key of the chain; none keeps the keys of today") {
  Key128 ns = *namespace_id(kV4);
  std::vector<std::uint32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const auto plain = chunk_keys(ns, tokens, 4);
  CHECK(chunk_keys(ns, tokens, 4, false, "") == plain);  // empty: no extra key (golden above)
  CHECK(extra_key_root(ns, "").is_zero());
  const auto a = chunk_keys(ns, tokens, 4, false, "lora:adapter-a");
  const auto b = chunk_keys(ns, tokens, 4, false, "lora:adapter-b");
  const auto salt = chunk_keys(ns, tokens, 4, false, std::string("salt\0\x01", 6));
  REQUIRE(a.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK_FALSE(a[i] == plain[i]);
    CHECK_FALSE(a[i] == b[i]);
    CHECK_FALSE(salt[i] == a[i]);
  }
  // Mixed into the first chunk: its parent is the extra key's root, the rest chains as usual.
  CHECK(a[0] == chunk_key(ns, extra_key_root(ns, "lora:adapter-a"), std::span(tokens).first(4)));
  CHECK(a[1] == chunk_key(ns, a[0], std::span(tokens).subspan(4)));
  // The root is XXH3-128 of exactly the documented bytes.
  std::string buf("libtier-extra-v1", 16);
  buf.push_back('\0');
  for (std::uint64_t v : {ns.lo, ns.hi, std::uint64_t{14}})
    for (int i = 0; i < 8; ++i) buf.push_back(static_cast<char>(v >> (8 * i)));
  buf += "lora:adapter-a";
  XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
  CHECK(extra_key_root(ns, "lora:adapter-a") == Key128{h.low64, h.high64});
  // Golden: a change of the derivation is a change of every stored extra-keyed object's name.
  CHECK(a[0].hex() == "15777650889c860dcf6e03a608eaec08");
}

TEST_CASE("canonical JSON sorts keys, strips space and normalizes integral floats") {
  CHECK(canonical_json(Json::parse(R"({ "b" : 1, "a" : { "d" : 2.0, "c" : [ 3, "x" ] } })")) ==
        R"({"a":{"c":[3,"x"],"d":2},"b":1})");
  CHECK(canonical_json(Json::parse(R"({"pi":3.25,"neg":-1,"u":"é"})")) ==
        R"({"neg":-1,"pi":3.25,"u":"\u00e9"})");
  CHECK(namespace_id(Json::parse(R"({"x":2.0})"))->hex() ==
        namespace_id(Json::parse(R"({"x":2})"))->hex());
}

TEST_CASE("every identity field changes the namespace; key order does not") {
  Key128 base = *namespace_id(kV4);
  for (auto [field, value] : std::vector<std::pair<std::string, Json>>{
           {"model", "deepseek-v4-flash"}, {"layout_version", 2}, {"kv_dtype", "bf16"},
           {"block_size", 128}, {"chunk_size", 4096}, {"tp_size", 4},
           {"speculative", Json{{"num_speculative_tokens", 1}}}}) {
    Json changed = kV4;
    changed[field] = value;
    CHECK_MESSAGE(!(*namespace_id(changed) == base), field);
  }
  Json reordered = Json::parse(
      R"({"tp_size":8,"chunk_size":256,"block_size":256,"kv_dtype":"fp8","layout_version":1,)"
      R"("model":"deepseek-v4-pro"})");
  CHECK(*namespace_id(reordered) == base);
}

TEST_CASE("keys chain: a chunk's key depends on every token before it") {
  Key128 ns = *namespace_id(kV4);
  std::vector<std::uint32_t> a = {1, 2, 3, 4, 5, 6}, b = {1, 2, 9, 4, 5, 6};
  auto ka = chunk_keys(ns, a, 2), kb = chunk_keys(ns, b, 2);
  CHECK(ka[0] == kb[0]);
  CHECK_FALSE(ka[1] == kb[1]);
  CHECK_FALSE(ka[2] == kb[2]);  // same tokens, different history
  CHECK(chunk_keys(ns, std::vector<std::uint32_t>{1, 2, 3}, 2).size() == 1);
  CHECK(chunk_keys(ns, std::vector<std::uint32_t>{1, 2, 3}, 2, true).size() == 2);
}

TEST_CASE("non-finite numbers cannot name a namespace") {
  CHECK(namespace_id(Json{{"x", std::nan("")}}).status().code() == Code::kInvalidArgument);
}

TEST_CASE("hex round trip and object key text") {
  Key128 k{0x0123456789abcdefull, 0xfedcba9876543210ull};
  CHECK(k.hex() == "fedcba98765432100123456789abcdef");
  CHECK(*Key128::from_hex(k.hex()) == k);
  CHECK_FALSE(Key128::from_hex("xyz").is_ok());
  CHECK(*Key128::from_hex("FEDCBA98765432100123456789ABCDEF") == k);
  // Every position is checked, whatever byte it holds, and the error names the first bad one.
  for (std::size_t at : {0u, 15u, 16u, 31u})
    for (char bad : {'g', 'G', ' ', '\0', '/', ':', '@', '`', static_cast<char>(0xe9)}) {
      std::string text = k.hex();
      text[at] = bad;
      auto r = Key128::from_hex(text);
      REQUIRE_FALSE(r.is_ok());
      CHECK(r.status().code() == Code::kInvalidArgument);
      CHECK(r.status().message().find(std::string("'") + bad + "'") != std::string::npos);
    }
  // Every byte value at every position of a word: exactly 0-9, a-f and A-F are digits, each with
  // its value.
  for (std::size_t at : {0u, 7u, 8u, 23u, 31u})
    for (int c = 0; c < 256; ++c) {
      std::string text(32, '0');
      text[at] = static_cast<char>(c);
      const int want = c >= '0' && c <= '9'   ? c - '0'
                       : c >= 'a' && c <= 'f' ? c - 'a' + 10
                       : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                              : -1;
      auto r = Key128::from_hex(text);
      REQUIRE(r.is_ok() == (want >= 0));
      if (want < 0) continue;
      const unsigned shift = 4 * (15 - at % 16);
      CHECK((at < 16 ? r->hi : r->lo) == std::uint64_t(want) << shift);
      CHECK((at < 16 ? r->lo : r->hi) == 0);
    }
  // Random keys round trip, in lower and upper case.
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 1000; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const Key128 r{x, x * 0xff51afd7ed558ccdull};
    std::string text = r.hex();
    CHECK(*Key128::from_hex(text) == r);
    for (char& ch : text) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    CHECK(*Key128::from_hex(text) == r);
  }
  ObjectKey ok{k, k, 3};
  CHECK(ok.to_string() == k.hex() + "-" + k.hex() + "-r3");
}
