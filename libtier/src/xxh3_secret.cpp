// xxh3::default_secret(): XXH3's default secret as libxxhash's header defines it (host code:
// built into the core, and by the host compiler into libtier_gpu, a hidden copy in each).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstring>

#include "xxh3.hpp"

namespace tier::xxh3 {

static_assert(sizeof(XXH3_kSecret) == kSecretBytes, "XXH3's default secret is 192 bytes");

Secret default_secret() noexcept {
  Secret s;
  std::memcpy(s.bytes, XXH3_kSecret, kSecretBytes);
  return s;
}

}  // namespace tier::xxh3
