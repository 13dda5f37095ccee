#pragma once
// The HIP (AMD, hipcc) mapping of gpu_runtime.hpp, which lists what a mapping defines. Written
// against HIP 5.2 (Debian 12's hipcc over clang 15) and what newer HIP still offers. Included
// only through gpu_runtime.hpp, by translation units hipcc compiles.

#include <hip/hip_runtime.h>

#include <cstring>
#include <optional>
#include <string>

namespace tier::gpu::rt {

using Error = hipError_t;
using StreamHandle = hipStream_t;
using EventHandle = hipEvent_t;
inline constexpr Error kSuccess = hipSuccess;
inline constexpr Error kNotReady = hipErrorNotReady;
inline constexpr const char* kApi = "hip";

inline const char* error_string(Error e) { return hipGetErrorString(e); }
inline Error clear_last_error() { return hipGetLastError(); }
inline Error get_device_count(int* n) { return hipGetDeviceCount(n); }
inline Error get_device(int* d) { return hipGetDevice(d); }
inline Error set_device(int d) { return hipSetDevice(d); }
inline Error multiprocessors(int* n, int d) {
  return hipDeviceGetAttribute(n, hipDeviceAttributeMultiprocessorCount, d);
}
inline Error device_name(char* out, int len, int d) { return hipDeviceGetName(out, len, d); }
inline Error mem_info(size_t* free_b, size_t* total_b) { return hipMemGetInfo(free_b, total_b); }
inline Error device_malloc(void** p, size_t n) { return hipMalloc(p, n); }
inline Error device_free(void* p) { return hipFree(p); }
// Page-locked, mapped into every device's address space, usable from any device.
inline Error host_alloc_mapped(void** p, size_t n) {
  return hipHostMalloc(p, n, hipHostMallocMapped | hipHostMallocPortable);
}
inline Error host_free(void* p) { return hipHostFree(p); }
inline Error host_register_mapped(void* p, size_t n) {
  return hipHostRegister(p, n, hipHostRegisterMapped | hipHostRegisterPortable);
}
inline Error host_unregister(void* p) { return hipHostUnregister(p); }
// The device address of mapped pinned host memory, or nullptr for pageable memory. HIP 5.2
// answers pageable memory with an error, which is cleared here.
inline void* mapped_device_pointer(const void* host) {
  void* dev = nullptr;
  if (hipHostGetDevicePointer(&dev, const_cast<void*>(host), 0) == hipSuccess) return dev;
  (void)hipGetLastError();
  return nullptr;
}
// The device whose memory `p` points into (device or managed memory), or -1 (host memory,
// unregistered memory, or no pointer the runtime knows). Clears the error it may raise.
inline int device_of_pointer(const void* p) {
  hipPointerAttribute_t attr{};
  if (hipPointerGetAttributes(&attr, p) != hipSuccess) {
    (void)hipGetLastError();
    return -1;
  }
  return attr.memoryType == hipMemoryTypeDevice || attr.isManaged ? attr.device : -1;
}
// The allocation [*base, *base + *size) holding device pointer `p` (hipMemGetAddressRange).
// False when the runtime cannot say. Needs `p`'s device current.
inline bool address_range(const void* p, void** base, size_t* size) {
  hipDeviceptr_t b = nullptr;
  if (hipMemGetAddressRange(&b, size, const_cast<void*>(p)) != hipSuccess) {
    (void)hipGetLastError();
    return false;
  }
  *base = b;
  return true;
}
inline Error memcpy_async(void* dst, const void* src, size_t n, StreamHandle s) {
  return hipMemcpyAsync(dst, src, n, hipMemcpyDefault, s);
}
inline Error stream_create(StreamHandle* s) {
  return hipStreamCreateWithFlags(s, hipStreamNonBlocking);
}
inline Error stream_destroy(StreamHandle s) { return hipStreamDestroy(s); }
inline Error stream_synchronize(StreamHandle s) { return hipStreamSynchronize(s); }
inline Error event_create(EventHandle* e) {
  return hipEventCreateWithFlags(e, hipEventDisableTiming);
}
inline Error event_destroy(EventHandle e) { return hipEventDestroy(e); }
inline Error event_record(EventHandle e, StreamHandle s) { return hipEventRecord(e, s); }
inline Error event_query(EventHandle e) { return hipEventQuery(e); }
inline Error event_synchronize(EventHandle e) { return hipEventSynchronize(e); }
inline Error stream_wait_event(StreamHandle s, EventHandle e) {
  return hipStreamWaitEvent(s, e, 0);
}
inline Error memset_async(void* p, int v, size_t n, StreamHandle s) {
  return hipMemsetAsync(p, v, n, s);
}
// Loads kernel `f` on the current device now (the runtime loads a module at its first launch).
inline Error load_kernel(const void* f) {
  hipFuncAttributes a;
  return hipFuncGetAttributes(&a, f);
}

// The wall clock: s_memrealtime, read by HIP's wall_clock64(), a counter at a constant rate
// whatever the shader clock does. HIP 5.2 declares wall_clock64() for the device compile only:
// the host pass, which parses device functions but never runs them, reads nothing.
inline constexpr const char* kWallCounter = "s_memrealtime (wall_clock64)";
__device__ inline unsigned long long wall_ticks() {
#if defined(__HIP_DEVICE_COMPILE__)
  return static_cast<unsigned long long>(wall_clock64());
#else
  return 0;
#endif
}

namespace detail {
// hipDeviceAttributeWallClockRate where the HIP headers have it (newer than 5.2), found without
// naming a version: the first overload exists only for an attribute enum with that member.
template <class Attr>
constexpr auto wall_clock_rate_attribute(int)
    -> std::optional<decltype(Attr::hipDeviceAttributeWallClockRate)> {
  return Attr::hipDeviceAttributeWallClockRate;
}
template <class Attr>
constexpr std::optional<Attr> wall_clock_rate_attribute(long) {
  return std::nullopt;
}

// Where HIP cannot tell the rate: the targets whose constant-rate counter runs at 100 MHz by
// AMD's figures (CDNA2 MI200: gfx90a; CDNA3 MI300: gfx940, gfx941, gfx942). Not measured here
// (no AMD GPU): docs/gpu.md.
struct KnownWallRate {
  const char* arch;
  unsigned long long khz;
};
inline constexpr KnownWallRate kKnownWallRates[] = {
    {"gfx90a", 100000}, {"gfx940", 100000}, {"gfx941", 100000}, {"gfx942", 100000}};
}  // namespace detail

// The rate of wall_ticks() on `device` in kHz, and in *from where it comes from; *khz == 0 (and
// *from says why) when neither the runtime nor the table above knows it.
inline Error wall_clock_rate(int device, unsigned long long* khz, std::string* from) {
  *khz = 0;
  constexpr auto attr = detail::wall_clock_rate_attribute<hipDeviceAttribute_t>(0);
  if constexpr (attr.has_value()) {
    int rate = 0;
    Error e = hipDeviceGetAttribute(&rate, *attr, device);
    if (e != hipSuccess) return e;
    if (rate > 0) {
      *khz = static_cast<unsigned long long>(rate);
      *from = "hipDeviceAttributeWallClockRate";
      return hipSuccess;
    }
  }
  hipDeviceProp_t prop{};
  Error e = hipGetDeviceProperties(&prop, device);
  if (e != hipSuccess) return e;
  std::string arch(prop.gcnArchName, strnlen(prop.gcnArchName, sizeof(prop.gcnArchName)));
  arch = arch.substr(0, arch.find(':'));  // "gfx90a:sramecc+:xnack-" -> "gfx90a"
  for (const detail::KnownWallRate& k : detail::kKnownWallRates) {
    if (arch == k.arch) {
      *khz = k.khz;
      *from = "libtier's table for " + arch + " (this HIP cannot tell the rate)";
      return hipSuccess;
    }
  }
  *from = "this HIP cannot tell the wall clock rate of " + arch +
          ", and libtier knows it for gfx90a and gfx940-gfx942 only";
  return hipSuccess;
}

}  // namespace tier::gpu::rt
