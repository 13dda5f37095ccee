// The cpu tier's heap mode: where it places a stored image. Its payload starts on a 64-byte line
// whatever the image's size, also in storage reused from a removed image (the checksum of every
// get reads whole lines; heap_mode.cpp says why), and the bytes read back are the bytes stored.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>

#include "heap_mode.hpp"
#include "support/test_util.hpp"

using namespace tier;
using tier::test::key_of;
using tier::test::make_image;

TEST_CASE("heap mode: every stored payload starts on a 64-byte line; copies with either stores") {
  cpu::HeapMode mode(8u << 20);
  const cpu::CpuMode::EvictFn no_evictions = [](const ObjectKey&, std::span<const std::byte>,
                                                std::uint64_t) { FAIL("nothing is evicted"); };
  for (int round = 0; round < 2; ++round) {  // the second reuses the first's storage
    for (std::size_t payload : {1u, 63u, 100u, 4096u, 65536u, 65568u, 200'001u}) {
      CAPTURE(payload);
      const ObjectKey k = key_of(payload);
      const auto img = make_image(k, payload, round);
      // The first round's copies use cached stores, the second's non-temporal ones.
      const Stores stores = round == 0 ? Stores::kCached : Stores::kStreamed;
      REQUIRE(mode.put(k, img, stores, no_evictions).status.is_ok());
      auto o = mode.get_with(k, img.size(), [&](std::span<const cpu::Piece> pieces) {
        REQUIRE(pieces.size() == 1);
        CHECK(reinterpret_cast<std::uintptr_t>(pieces[0].data() + kObjectHeaderBytes) % 64 == 0);
        CHECK(std::equal(pieces[0].begin(), pieces[0].end(), img.begin(), img.end()));
        return Status::ok();
      });
      CHECK(o.status.is_ok());
      CHECK(o.bytes == img.size());
      std::vector<std::byte> out(img.size() + 1, std::byte{0x5a});
      REQUIRE(mode.get(k, out, stores).status.is_ok());
      CHECK(std::equal(img.begin(), img.end(), out.begin()));
      CHECK(out.back() == std::byte{0x5a});  // nothing past the image
    }
    for (std::size_t payload : {1u, 63u, 100u, 4096u, 65536u, 65568u, 200'001u})
      REQUIRE(mode.remove(key_of(payload)).is_ok());
  }
  CHECK(mode.usage().objects == 0);
}
