// What splitting one host-to-device transfer into DMAs costs on an NVIDIA GPU: 118 MiB from
// page-locked memory (cudaMallocHost, and pageable memory registered with cudaHostRegister) as
// one DMA, then in DMAs of 1, 4, 5.81 (a 16k-token restore's PAGE chunk), 8 and 16 MiB, back to
// back on one stream or spread round robin over 2 and 3 streams; the median of 10 transfers
// timed by events, twice over. A development probe (docs/engine.md "Restores from a pinned
// tier"):
//   nvcc -O2 -o /tmp/dma_sizes .ci/gpu-trace/dma_sizes.cu && /tmp/dma_sizes
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                             \
  do {                                                                       \
    cudaError_t e_ = (x);                                                    \
    if (e_ != cudaSuccess) {                                                 \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_));                   \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

int main() {
  int engines = 0;
  CHECK(cudaDeviceGetAttribute(&engines, cudaDevAttrAsyncEngineCount, 0));
  std::printf("copy engines: %d\n", engines);
  const size_t n = size_t{118} << 20;
  char *pinned, *dev;
  CHECK(cudaMallocHost(&pinned, n));
  CHECK(cudaMalloc(&dev, n));
  char* registered = static_cast<char*>(std::aligned_alloc(4096, n));
  for (size_t i = 0; i < n; i += 4096) registered[i] = 1;
  CHECK(cudaHostRegister(registered, n, cudaHostRegisterDefault));
  std::vector<cudaStream_t> streams(3);
  for (auto& s : streams) CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t begin, end;
  CHECK(cudaEventCreate(&begin));
  CHECK(cudaEventCreate(&end));
  std::vector<cudaEvent_t> joined(streams.size());
  for (auto& e : joined) CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  auto run = [&](const char* what, const char* src, size_t piece, size_t lanes) {
    std::vector<float> ms;
    for (int it = 0; it < 12; ++it) {
      CHECK(cudaEventRecord(begin, streams[0]));
      for (size_t l = 1; l < lanes; ++l) CHECK(cudaStreamWaitEvent(streams[l], begin, 0));
      size_t k = 0;
      for (size_t off = 0; off < n; off += piece, ++k)
        CHECK(cudaMemcpyAsync(dev + off, src + off, std::min(piece, n - off),
                              cudaMemcpyHostToDevice, streams[k % lanes]));
      for (size_t l = 1; l < lanes; ++l) {
        CHECK(cudaEventRecord(joined[l], streams[l]));
        CHECK(cudaStreamWaitEvent(streams[0], joined[l], 0));
      }
      CHECK(cudaEventRecord(end, streams[0]));
      CHECK(cudaEventSynchronize(end));
      float t = 0;
      CHECK(cudaEventElapsedTime(&t, begin, end));
      if (it >= 2) ms.push_back(t);  // two warm-ups
    }
    std::sort(ms.begin(), ms.end());
    const float med = ms[ms.size() / 2];
    std::printf("%-10s DMAs of %6.2f MiB on %zu stream(s): %.3f ms (%.2f GB/s; min %.3f, max %.3f)\n",
                what, piece / 1048576.0, lanes, med, n / (med * 1e6), ms.front(), ms.back());
  };
  for (int rep = 0; rep < 2; ++rep) {
    for (const char* src : {static_cast<const char*>(pinned), static_cast<const char*>(registered)}) {
      const char* what = src == pinned ? "mallochost" : "registered";
      run(what, src, n, 1);
      for (size_t piece : {size_t{1} << 20, size_t{4} << 20, size_t{6087776}, size_t{8} << 20,
                           size_t{16} << 20})
        for (size_t lanes = 1; lanes <= streams.size(); ++lanes) run(what, src, piece, lanes);
    }
  }
  return 0;
}
