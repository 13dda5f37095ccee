// libFuzzer target: the offload engine's wire decoders (tier::engine::wire::decode_plan and
// decode_reports, engine/include/tier/engine/wire.hpp), what a rank process and a scheduler
// process run on every message they receive.
// Each input is decoded as it is by both decoders, then again "resealed": its header's body
// length and checksum made to fit, so that mutations get past the checksum into the sections and
// records. Invariants: a decoded message re-encodes, the re-encoded message decodes, and encoding
// is canonical (a second round gives the same bytes); a failure is a Status, never a crash, and
// allocations stay within libFuzzer's limits whatever the counts in the message say.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tier/engine/wire.hpp"
#include "tier/object.hpp"

using namespace tier::engine;

namespace {

template <class Decode, class Encode>
void round_trip(std::span<const std::byte> in, Decode decode, Encode encode) {
  auto first = decode(in);
  if (!first.is_ok()) return;
  auto bytes = encode(*first);
  if (!bytes.is_ok()) std::abort();
  auto second = decode(std::span<const std::byte>(*bytes));
  if (!second.is_ok()) std::abort();
  auto again = encode(*second);
  if (!again.is_ok() || *again != *bytes) std::abort();
}

void check(std::span<const std::byte> in) {
  round_trip(
      in, [](std::span<const std::byte> m) { return wire::decode_plan(m); },
      [](const StepPlan& p) { return wire::encode_plan(p); });
  round_trip(
      in, [](std::span<const std::byte> m) { return wire::decode_reports(m); },
      [](const std::vector<OpReport>& r) { return wire::encode_reports(r); });
}

void put_le(std::byte* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  check(in);
  if (size >= wire::kHeaderBytes) {
    std::vector<std::byte> sealed(in.begin(), in.end());
    const auto body = std::span<const std::byte>(sealed).subspan(wire::kHeaderBytes);
    put_le(sealed.data() + 8, body.size(), 4);
    put_le(sealed.data() + 16, tier::payload_checksum(body, tier::kObjectVersionWholePayload), 8);
    check(sealed);
  }
  return 0;
}
