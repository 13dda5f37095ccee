// Device KV memory in a build without the GPU part (gpu=disabled, or no GPU compiler found).
#include "kv_memory.hpp"

namespace tier::dsv4::detail {

Result<std::unique_ptr<KvMemory>> make_device_memory(const dsv4::Geometry&, int device) {
  if (device < 0) return Status::invalid("dsv4 layout: device must be >= 0");
  return Status(Code::kNotSupported,
                "dsv4 layout: device KV memory needs the GPU part, which this build lacks "
                "(meson -Dgpu=cuda|hip with nvcc or hipcc installed)");
}

}  // namespace tier::dsv4::detail
