// Registration of the cpu backend (built in).
#include "cpu_backend.hpp"
#include "tier/plugin.hpp"

namespace {
constexpr const char kCpuOptions[] = R"JSON([
  {"name": "mode", "type": "enum", "choices": ["heap", "shm"], "default": "heap",
   "doc": "where objects live: heap = this process's memory (exact LRU, capacity in exact image bytes); shm = a named shared-memory segment that every process opening the same segment shares and that survives restarts (docs/shm.md)"},
  {"name": "segment", "type": "string", "default": "libtier-cpu",
   "doc": "shm mode: name of the segment (/dev/shm/<segment>; 1-200 of [A-Za-z0-9._-]); processes that name the same segment share one pool"},
  {"name": "block_size", "type": "size", "default": "16KiB", "min": 4096, "max": 67108864,
   "doc": "shm mode: allocation unit, a power of two; an object takes ceil(image / block_size) blocks, and capacity is rounded down to whole blocks"},
  {"name": "max_objects", "type": "uint", "default": 0, "max": 4294967294,
   "doc": "shm mode: index entries (objects the segment can hold at once); 0 = one per block"},
  {"name": "segment_mode", "type": "enum", "choices": ["0600", "0660", "0666"], "default": "0600",
   "doc": "shm mode: permission bits of a segment this tier creates: 0600 = this user only (default); 0660 = the user's group too; 0666 = every local user. A segment owned by another user is refused unless this is not 0600 and the segment has exactly these bits (sharing between users is deliberate on both sides); one of this user with wider bits than asked is refused (docs/shm.md)"},
  {"name": "prefault", "type": "bool", "default": false,
   "doc": "shm mode: map every page of the segment into this process when it opens it (about 0.3-0.6 s per GiB on the 2-core build machine), so no put or get pays for mapping pages later; without it each 2 MiB of the segment is mapped on its first use in this process (the segment's memory is always reserved in /dev/shm when it is created; docs/shm.md \"Performance\")"},
  {"name": "pinned", "type": "bool", "default": false,
   "doc": "both modes: keep the tier's storage in page-locked host memory from the GPU runtime (heap: one pinned arena of exactly the capacity, allocated at creation; shm: this process's mapping of the segment is registered) and accept device-memory buffers for put and get, moved by GPU DMA and verified like every get; needs libtier built with a GPU runtime and a GPU (NotSupported otherwise, so an optional tier is skipped)"}
])JSON";
constexpr tier_plugin kCpu = tier::make_backend_plugin<tier::cpu::CpuBackend>(
    "cpu", "host-memory tier with LRU eviction, in the heap or in shared memory, optionally pinned for GPU DMA", kCpuOptions);
}  // namespace

TIER_REGISTER_PLUGIN(cpu, kCpu)
