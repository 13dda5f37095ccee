// libFuzzer target: the AOS1 sidecar decoder (tier/dsv4/aos1.hpp).
// Each input is decoded twice: against fixed expectations (the seed corpus' identity) and
// against expectations mirrored from its own header, so mutations reach the length and CRC
// checks. Invariants: a successful decode returns exactly the expected payload, whose CRC
// matches, and re-finalizing it reproduces the input byte for byte.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tier/dsv4/aos1.hpp"

using namespace tier::dsv4;

namespace {

void check(std::span<const std::byte> in, const Aos1Expect& x) {
  Aos1Decoded d = decode_aos1(in, x);
  if (d.error != Aos1Error::kNone) {
    if (!d.payload.empty()) std::abort();
    return;
  }
  if (d.payload.size() != x.payload_bytes || in.size() != kAos1HeaderBytes + x.payload_bytes)
    std::abort();
  if (crc32_of(d.payload) != d.header.payload_crc32) std::abort();
  std::vector<std::byte> again(in.begin(), in.end());
  Aos1Header h = d.header;
  if (finalize_aos1(again, h) != Aos1Error::kNone) std::abort();
  if (std::memcmp(again.data(), in.data(), in.size()) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  Aos1Expect fixed{4096, 0x0123456789abcdefull, 64, {}, 2, 1};
  for (std::size_t i = 0; i < 16; ++i) fixed.fingerprint[i] = static_cast<std::byte>(i);
  check(in, fixed);
  if (size >= kAos1HeaderBytes) {
    Aos1Header h = read_aos1_header(in.first<kAos1HeaderBytes>());
    Aos1Expect mirrored{h.boundary_tokens, h.boundary_block_hash, size - kAos1HeaderBytes,
                        h.fingerprint, h.tp_size, h.tp_rank};
    check(in, mirrored);
  }
  return 0;
}
