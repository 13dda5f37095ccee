#pragma once
// The CUDA (NVIDIA, nvcc) mapping of gpu_runtime.hpp, which lists what a mapping defines.
// Included only through gpu_runtime.hpp, by translation units nvcc compiles.

#include <cuda_runtime.h>

#include <string>

namespace tier::gpu::rt {

using Error = cudaError_t;
using StreamHandle = cudaStream_t;
using EventHandle = cudaEvent_t;
inline constexpr Error kSuccess = cudaSuccess;
inline constexpr Error kNotReady = cudaErrorNotReady;
inline constexpr const char* kApi = "cuda";

inline const char* error_string(Error e) { return cudaGetErrorString(e); }
inline Error clear_last_error() { return cudaGetLastError(); }
inline Error get_device_count(int* n) { return cudaGetDeviceCount(n); }
inline Error get_device(int* d) { return cudaGetDevice(d); }
inline Error set_device(int d) { return cudaSetDevice(d); }
inline Error multiprocessors(int* n, int d) {
  return cudaDeviceGetAttribute(n, cudaDevAttrMultiProcessorCount, d);
}
inline Error device_name(char* out, int len, int d) {
  cudaDeviceProp prop{};
  Error e = cudaGetDeviceProperties(&prop, d);
  if (e != cudaSuccess) return e;
  int i = 0;
  for (; i + 1 < len && prop.name[i] != '\0'; ++i) out[i] = prop.name[i];
  if (len > 0) out[i] = '\0';
  return e;
}
inline Error mem_info(size_t* free_b, size_t* total_b) { return cudaMemGetInfo(free_b, total_b); }
inline Error device_malloc(void** p, size_t n) { return cudaMalloc(p, n); }
inline Error device_free(void* p) { return cudaFree(p); }
inline Error host_alloc_mapped(void** p, size_t n) {
  return cudaHostAlloc(p, n, cudaHostAllocMapped | cudaHostAllocPortable);
}
inline Error host_free(void* p) { return cudaFreeHost(p); }
inline Error host_register_mapped(void* p, size_t n) {
  return cudaHostRegister(p, n, cudaHostRegisterMapped | cudaHostRegisterPortable);
}
inline Error host_unregister(void* p) { return cudaHostUnregister(p); }
// The device address of mapped pinned host memory, or nullptr for pageable memory (which CUDA
// reports as cudaMemoryTypeUnregistered, without an error).
inline void* mapped_device_pointer(const void* host) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, host) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return attr.type == cudaMemoryTypeHost ? attr.devicePointer : nullptr;
}
// The device whose memory `p` points into (device or managed memory), or -1 (host memory,
// unregistered memory, or no pointer the runtime knows). Clears the error it may raise.
inline int device_of_pointer(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? attr.device : -1;
}
// The allocation [*base, *base + *size) holding device pointer `p`: the driver's
// cuMemGetAddressRange, reached through the runtime (no link to the driver library). False when
// the driver cannot say. Needs `p`'s device current.
inline bool address_range(const void* p, void** base, size_t* size) {
  using Fn = int (*)(unsigned long long*, size_t*, unsigned long long);  // CUresult, CUdeviceptr
  static const Fn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t e = cudaGetDriverEntryPoint("cuMemGetAddressRange", &f, cudaEnableDefault, &found);
#endif
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return Fn{nullptr};
    }
    return reinterpret_cast<Fn>(f);
  }();
  unsigned long long b = 0;
  if (fn == nullptr || fn(&b, size, reinterpret_cast<unsigned long long>(p)) != 0) return false;
  *base = reinterpret_cast<void*>(b);
  return true;
}
inline Error memcpy_async(void* dst, const void* src, size_t n, StreamHandle s) {
  return cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
}
inline Error stream_create(StreamHandle* s) {
  return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking);
}
inline Error stream_destroy(StreamHandle s) { return cudaStreamDestroy(s); }
inline Error stream_synchronize(StreamHandle s) { return cudaStreamSynchronize(s); }
inline Error event_create(EventHandle* e) {
  return cudaEventCreateWithFlags(e, cudaEventDisableTiming);
}
inline Error event_destroy(EventHandle e) { return cudaEventDestroy(e); }
inline Error event_record(EventHandle e, StreamHandle s) { return cudaEventRecord(e, s); }
inline Error event_query(EventHandle e) { return cudaEventQuery(e); }
inline Error event_synchronize(EventHandle e) { return cudaEventSynchronize(e); }
inline Error stream_wait_event(StreamHandle s, EventHandle e) {
  return cudaStreamWaitEvent(s, e, 0);
}
inline Error memset_async(void* p, int v, size_t n, StreamHandle s) {
  return cudaMemsetAsync(p, v, n, s);
}
// Loads kernel `f` on the current device now (the runtime loads a module at its first launch).
inline Error load_kernel(const void* f) {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, f);
}

// The wall clock: %globaltimer, the PTX ISA's global nanosecond timer, whatever the SM clock does.
inline constexpr const char* kWallCounter = "%globaltimer";
__device__ inline unsigned long long wall_ticks() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Nanoseconds, on every device (the ISA defines the unit).
inline Error wall_clock_rate(int, unsigned long long* khz, std::string* from) {
  *khz = 1000000;
  *from = "the PTX ISA (nanoseconds)";
  return cudaSuccess;
}

}  // namespace tier::gpu::rt
