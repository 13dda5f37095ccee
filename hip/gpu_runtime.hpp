#pragma once
// The GPU runtime as libtier uses it: the one header the translation units in hip/ include for
// it, never a public header. It picks the runtime's mapping file, chosen by the build (Meson
// option `gpu`, hip/meson.build):
//   TIER_GPU_HIP   runtime_hip.hpp   HIP (AMD, hipcc), 5.2 and newer
//   TIER_GPU_CUDA  runtime_cuda.hpp  CUDA (NVIDIA, nvcc)
// and adds what is the same for all: rt_status() and TIER_GPU_TRY. A mapping file is the only
// place that names its runtime's functions and device intrinsics (no #define of one vendor's
// names to another's); a further runtime is one more such file, a line here and its compiler's
// arguments in hip/meson.build.
//
// Every mapping file defines, in namespace tier::gpu::rt:
//   types      Error, StreamHandle, EventHandle; constants kSuccess, kNotReady, kApi ("hip"...)
//   host       error_string, clear_last_error, get_device_count, get_device, set_device,
//              multiprocessors, device_name, mem_info, device_malloc, device_free,
//              host_alloc_mapped, host_free, host_register_mapped, host_unregister,
//              mapped_device_pointer, device_of_pointer, memcpy_async, memset_async,
//              stream_create, stream_destroy, stream_synchronize, event_create, event_destroy,
//              event_record, event_query, event_synchronize, stream_wait_event
//   wall clock wall_ticks() (__device__: a counter at a constant rate, whatever the shader clock
//              does) and wall_clock(device, &WallClock) (its name and rate in kHz, and where
//              the rate comes from); both for spin_async (gpu.hpp).
// Each call returns the runtime's Error (kSuccess, or a code error_string() describes) unless
// its comment says otherwise.

#include <string>

#if defined(TIER_GPU_HIP)
#include "runtime_hip.hpp"
#elif defined(TIER_GPU_CUDA)
#include "runtime_cuda.hpp"
#else
#error "hip/gpu_runtime.hpp: the build defines no GPU runtime (TIER_GPU_HIP or TIER_GPU_CUDA)"
#endif

#include "tier/status.hpp"

namespace tier::gpu::rt {

// kDeviceError "<call>: <runtime message> at <file>:<line>", or OK.
inline Status rt_status(Error e, const char* call, const char* file, int line) {
  if (e == kSuccess) return Status::ok();
  return Status(Code::kDeviceError, std::string(call) + ": " + error_string(e) + " at " + file +
                                        ":" + std::to_string(line));
}

}  // namespace tier::gpu::rt

// Returns kDeviceError from the enclosing function when the runtime call fails.
#define TIER_GPU_TRY(call) \
  TIER_RETURN_IF_ERROR(::tier::gpu::rt::rt_status((call), #call, __FILE__, __LINE__))
