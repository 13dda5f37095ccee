// main() of the GPU test programs: exits 77 (Meson: SKIP) on a machine without a GPU, else prints
// the device it runs on and runs the doctest cases.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "gpu.hpp"
#include "support/test_util.hpp"

int main(int argc, char** argv) {
  using namespace tier::gpu;
  const std::string api(api_name());
  if (device_count() == 0) {
    std::fprintf(stderr, "no %s GPU here: skipping\n", api.c_str());
    return tier::test::kSkip;
  }
  if (auto info = device_info(0))
    std::printf("GPU 0: %s, %d multiprocessors, %zu MiB (%s)\n", info->name.c_str(),
                info->multiprocessors, info->total_bytes >> 20, api.c_str());
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
