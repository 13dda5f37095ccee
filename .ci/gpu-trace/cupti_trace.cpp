// A CUPTI activity tracer for NVIDIA GPUs, loaded into any program by the CUDA driver through
// CUDA_INJECTION64_PATH (.ci/gpu-trace/run builds and loads it): it records every memcpy, kernel
// and runtime API call with the GPU's timestamps (ns) and writes them as CSV lines to $TRACE_OUT
// at exit:
//   M,start,end,stream,bytes,copy_kind,correlation   (copy_kind 1: host to device, 2: device to host)
//   K,start,end,stream,correlation,name
//   R,start,end,thread,callback_id,correlation
// A development tool (docs/engine.md "Restores from a pinned tier" cites its timelines); not part
// of the library. The record types are the newest the toolkit's header declares (run picks them).
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace {

FILE* out = nullptr;
std::mutex mu;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* s = "?";
  cuptiGetResultString(r, &s);
  std::fprintf(stderr, "cupti_trace: %s: %s\n", what, s);
}

void CUPTIAPI buffer_requested(uint8_t** buf, size_t* size, size_t* max_records) {
  *size = 8u << 20;
  *buf = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(mu);
  CUpti_Activity* rec = nullptr;
  while (out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const TRACE_MEMCPY*>(rec);
      std::fprintf(out, "M,%llu,%llu,%u,%llu,%u,%u\n", (unsigned long long)m->start,
                   (unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes,
                   unsigned(m->copyKind), m->correlationId);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const TRACE_KERNEL*>(rec);
      std::fprintf(out, "K,%llu,%llu,%u,%u,%s\n", (unsigned long long)k->start,
                   (unsigned long long)k->end, k->streamId, k->correlationId, k->name);
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
      std::fprintf(out, "R,%llu,%llu,%u,%u,%u\n", (unsigned long long)a->start,
                   (unsigned long long)a->end, a->threadId, a->cbid, a->correlationId);
    }
  }
  std::free(buf);
}

void finish() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(mu);
  if (out) std::fclose(out);
  out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection(void) {
  const char* path = std::getenv("TRACE_OUT");
  out = std::fopen(path ? path : "trace.csv", "w");
  if (!out) return 0;
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "callbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "memcpy");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "kernels");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "runtime");
  std::atexit(finish);
  return 1;
}
