#pragma once
// The few GPU runtime calls libtier makes, for HIP (AMD, hipcc) and CUDA (NVIDIA, nvcc).
//
// Included only by the translation units in hip/ that the GPU compiler builds; never by a public
// header. The build defines TIER_GPU_HIP for hipcc; nvcc builds the CUDA side. Names are thin
// inline wrappers in tier::gpu::rt (no #define of one vendor's names to the other's), so each
// call site reads the same for both. rt_status() turns a runtime error into a Status
// (kDeviceError, with the runtime's own message and the call site), the only error path out.

#include <string>

#if defined(TIER_GPU_HIP)
#include <hip/hip_runtime.h>
#else
#include <cuda_runtime.h>
#endif

#include "tier/status.hpp"

namespace tier::gpu::rt {

#if defined(TIER_GPU_HIP)
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
inline Error memcpy_async(void* dst, const void* src, size_t n, StreamHandle s) {
  return hipMemcpyAsync(dst, src, n, hipMemcpyDefault, s);
}
inline Error stream_create(StreamHandle* s) { return hipStreamCreateWithFlags(s, hipStreamNonBlocking); }
inline Error stream_destroy(StreamHandle s) { return hipStreamDestroy(s); }
inline Error stream_synchronize(StreamHandle s) { return hipStreamSynchronize(s); }
inline Error event_create(EventHandle* e) {
  return hipEventCreateWithFlags(e, hipEventDisableTiming);
}
inline Error event_destroy(EventHandle e) { return hipEventDestroy(e); }
inline Error event_record(EventHandle e, StreamHandle s) { return hipEventRecord(e, s); }
inline Error event_query(EventHandle e) { return hipEventQuery(e); }
inline Error event_synchronize(EventHandle e) { return hipEventSynchronize(e); }
inline Error stream_wait_event(StreamHandle s, EventHandle e) { return hipStreamWaitEvent(s, e, 0); }
inline Error memset_async(void* p, int v, size_t n, StreamHandle s) {
  return hipMemsetAsync(p, v, n, s);
}
#else
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
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? attr.device
                                                                                 : -1;
}
inline Error memcpy_async(void* dst, const void* src, size_t n, StreamHandle s) {
  return cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
}
inline Error stream_create(StreamHandle* s) { return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking); }
inline Error stream_destroy(StreamHandle s) { return cudaStreamDestroy(s); }
inline Error stream_synchronize(StreamHandle s) { return cudaStreamSynchronize(s); }
inline Error event_create(EventHandle* e) {
  return cudaEventCreateWithFlags(e, cudaEventDisableTiming);
}
inline Error event_destroy(EventHandle e) { return cudaEventDestroy(e); }
inline Error event_record(EventHandle e, StreamHandle s) { return cudaEventRecord(e, s); }
inline Error event_query(EventHandle e) { return cudaEventQuery(e); }
inline Error event_synchronize(EventHandle e) { return cudaEventSynchronize(e); }
inline Error stream_wait_event(StreamHandle s, EventHandle e) { return cudaStreamWaitEvent(s, e, 0); }
inline Error memset_async(void* p, int v, size_t n, StreamHandle s) {
  return cudaMemsetAsync(p, v, n, s);
}
#endif

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
