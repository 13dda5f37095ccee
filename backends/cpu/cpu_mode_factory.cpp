// make_cpu_mode(): the table of the CPU tier's modes. It is the only place that knows which
// modes this build has: the shm sources are built only with Boost.Interprocess (TIER_CPU_SHM),
// the pinned ones only with a GPU runtime (TIER_CPU_PINNED), and a mode missing from the table
// is NotSupported, with what the build lacks.
#include <algorithm>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>

#include "cpu_mode.hpp"
#include "heap_mode.hpp"
#if TIER_CPU_SHM
#include "shm/mode.hpp"
#endif
#if TIER_CPU_PINNED
#include "pinned_heap_mode.hpp"
#include "pinned_transfer.hpp"
#endif

namespace tier::cpu {

namespace {

struct ModeEntry {
  std::string_view mode;  // option "mode"
  bool pinned;            // option "pinned"
  Result<std::unique_ptr<CpuMode>> (*create)(const BackendContext&);
};

constexpr ModeEntry kModes[] = {
    {"heap", false, &HeapMode::create},
#if TIER_CPU_PINNED
    {"heap", true, &PinnedHeapMode::create},
#endif
#if TIER_CPU_SHM
    {"shm", false, [](const BackendContext& ctx) { return ShmMode::create(ctx); }},
#endif
#if TIER_CPU_SHM && TIER_CPU_PINNED
    {"shm", true,
     [](const BackendContext& ctx) -> Result<std::unique_ptr<CpuMode>> {
       // Before the segment is opened: no GPU means no client slot taken, nothing created.
       TIER_RETURN_IF_ERROR(PinnedTransfer::available());
       return ShmMode::create(ctx, &PinnedTransfer::register_mapping);
     }},
#endif
};

}  // namespace

Result<std::unique_ptr<CpuMode>> make_cpu_mode(const BackendContext& ctx) {
  const Json& o = ctx.options;
  const std::string mode = o.is_object() ? o.value("mode", "heap") : "heap";
  const bool pinned = o.is_object() && o.value("pinned", false);
  for (const ModeEntry& m : kModes)
    if (m.mode == mode && m.pinned == pinned) return m.create(ctx);
  if (pinned && std::none_of(std::begin(kModes), std::end(kModes),
                             [](const ModeEntry& m) { return m.pinned; }))
    return Status(Code::kNotSupported,
                  "pinned: true needs libtier built with a GPU runtime (meson -Dgpu=auto, cuda or "
                  "hip); this build has none");
  return Status(Code::kNotSupported,
                "mode \"shm\" needs libtier built with Boost.Interprocess (meson -Dshm=enabled)");
}

}  // namespace tier::cpu
