// libFuzzer target: the stored-object header decoder (tier::parse_object_header and
// tier::verify_object, libtier/include/tier/object.hpp).
// Invariants: verify_object succeeds only if the header parses, names the key it was verified
// against and declares exactly the bytes that follow it.
#include <cstdint>
#include <cstdlib>

#include "tier/object.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  auto h = tier::parse_object_header(in);
  tier::ObjectKey key = h.is_ok() ? h->key : tier::ObjectKey{};
  tier::Status s = tier::verify_object(in, key);
  if (s.is_ok()) {
    if (!h.is_ok()) std::abort();
    if (h->payload_bytes != size - tier::kObjectHeaderBytes) std::abort();
    if (tier::payload_checksum(in.subspan(tier::kObjectHeaderBytes), h->version) !=
        h->payload_checksum)
      std::abort();
  } else if (s.code() != tier::Code::kChecksumMismatch) {
    std::abort();
  }
  return 0;
}
