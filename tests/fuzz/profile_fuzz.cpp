// libFuzzer target: the profile parser (tier::parse_profile, libtier/include/tier/profile.hpp).
// Inputs are JSON text. The "plugins" key is dropped first: it names shared objects to dlopen,
// which a fuzzer must not do. Invariants: parsing never throws, a rejection is InvalidArgument
// with at least one error, and an accepted profile can be explained (to_json).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tier/profile.hpp"
#include "tier/registry.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  tier::Json doc = tier::Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  if (doc.is_object()) doc.erase("plugins");
  tier::ConfigErrors errors;
  auto p = tier::parse_profile(doc, tier::Registry::global(), "<fuzz>", &errors);
  if (!p) {
    if (p.status().code() != tier::Code::kInvalidArgument || p.status().message().empty())
      std::abort();
    return 0;
  }
  if (!errors.empty()) std::abort();
  if (p->to_json()["tiers"].size() != p->tiers.size()) std::abort();
  return 0;
}
