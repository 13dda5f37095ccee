#include <doctest/doctest.h>

#include <cstring>

#include "support/test_util.hpp"
#include "tier/object.hpp"

using namespace tier;
using tier::test::key_of;
using tier::test::make_image;

TEST_CASE("a sealed image verifies and parses back") {
  auto k = key_of(3, 9, 2);
  auto img = make_image(k, 1000);
  CHECK(verify_object(img, k).is_ok());
  auto h = parse_object_header(img);
  REQUIRE(h.is_ok());
  CHECK(h->key == k);
  CHECK(h->payload_bytes == 1000);
  CHECK(h->layout_id == 1);
  CHECK(h->stage_id == 0);
}

TEST_CASE("every flipped byte is detected") {
  auto k = key_of(4);
  auto good = make_image(k, 300);
  for (std::size_t i = 0; i < good.size(); ++i) {
    auto bad = good;
    bad[i] ^= std::byte{0x01};
    Status s = verify_object(bad, k);
    CHECK_MESSAGE(s.code() == Code::kChecksumMismatch, "byte " << i);
  }
}

TEST_CASE("wrong key, truncation and extra bytes are mismatches") {
  auto k = key_of(5);
  auto img = make_image(k, 256);
  CHECK(verify_object(img, key_of(6)).code() == Code::kChecksumMismatch);
  CHECK(verify_object(img, key_of(5, 1, 1)).code() == Code::kChecksumMismatch);  // other rank
  CHECK(verify_object(std::span(img).first(img.size() - 1), k).code() == Code::kChecksumMismatch);
  auto longer = img;
  longer.push_back(std::byte{0});
  CHECK(verify_object(longer, k).code() == Code::kChecksumMismatch);
  CHECK(verify_object(std::span(img).first(40), k).code() == Code::kChecksumMismatch);
}

TEST_CASE("copy_verified copies good images and never hands out bad ones") {
  for (std::size_t size : {10ul, 70'000ul, 600'000ul}) {
    auto k = key_of(size);
    auto img = make_image(k, size);
    std::vector<std::byte> dst(img.size() + 64);
    REQUIRE(copy_verified(dst, img, k).is_ok());
    CHECK(std::memcmp(dst.data(), img.data(), img.size()) == 0);

    auto bad = img;
    bad[kObjectHeaderBytes + size / 2] ^= std::byte{0x80};
    std::vector<std::byte> out(img.size());
    CHECK(copy_verified(out, bad, k).code() == Code::kChecksumMismatch);
    CHECK_FALSE(parse_object_header(out).is_ok());  // no valid header left behind
    std::vector<std::byte> small(img.size() - 1);
    CHECK(copy_verified(small, img, k).code() == Code::kInvalidArgument);
    CHECK(copy_verified(out, img, key_of(size + 1)).code() == Code::kChecksumMismatch);
  }
}

TEST_CASE("scrub makes an image unparseable") {
  auto k = key_of(8);
  auto img = make_image(k, 64);
  scrub_object(img);
  CHECK(parse_object_header(img).status().code() == Code::kChecksumMismatch);
}
