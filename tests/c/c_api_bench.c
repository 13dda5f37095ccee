/* The C API's blocking save and load of N objects of SIZE bytes from host memory, one batch
 * each, R rounds (the keys removed between rounds): the best round's GB/s per operation as JSON
 * lines like tierbench micro's ({"op": "put"|"get", "gb_per_s": x}). The same path as
 * libtier.Store.save/load without Python (python/bench/bench_store.py compares them). Every
 * object's buffer starts on a 64-byte line, as tierbench micro's and bench_store's do (and torch's
 * CPU allocator's): checksums and copies run at different speeds on lines split in two. With
 * TURN_IN and TURN_OUT (descriptors, as tierbench micro's --turns) each round waits for a byte on
 * TURN_IN and writes one to TURN_OUT after it: a driver interleaves the rounds of the processes it
 * compares.
 *   c_api_bench PROFILE OBJECTS SIZE ROUNDS [TURN_IN TURN_OUT] */
#define _POSIX_C_SOURCE 200112L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "tier/tier.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One byte read from (write to) `fd`, -1 for none; 0 when done, -1 on EOF or error. */
static int turn(int fd, int write_it) {
  if (fd < 0) return 0;
  char c = '.';
  ssize_t n;
  while ((n = write_it ? write(fd, &c, 1) : read(fd, &c, 1)) < 0 && errno == EINTR) {
  }
  return n == 1 ? 0 : -1;
}

int main(int argc, char** argv) {
  if (argc != 5 && argc != 7) {
    fprintf(stderr, "usage: c_api_bench PROFILE OBJECTS SIZE ROUNDS [TURN_IN TURN_OUT]\n");
    return 2;
  }
  const size_t n = strtoull(argv[2], NULL, 10), size = strtoull(argv[3], NULL, 10);
  const int rounds = atoi(argv[4]);
  const int turn_in = argc == 7 ? atoi(argv[5]) : -1, turn_out = argc == 7 ? atoi(argv[6]) : -1;
  tier_store* s = NULL;
  if (tier_store_open(argv[1], NULL, 0, &s) != TIER_OK) {
    fprintf(stderr, "open: %s\n", tier_last_error());
    return 1;
  }
  const size_t stride = (size + 63) / 64 * 64;
  void *src_mem = NULL, *dst_mem = NULL;
  if (posix_memalign(&src_mem, 64, n * stride) != 0 ||
      posix_memalign(&dst_mem, 64, n * stride) != 0) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  uint8_t* src = src_mem;
  uint8_t* dst = dst_mem;
  tier_region* sr = malloc(n * sizeof *sr);
  tier_region* dr = malloc(n * sizeof *dr);
  tier_item* saves = malloc(n * sizeof *saves);
  tier_item* loads = malloc(n * sizeof *loads);
  tier_key* keys = malloc(n * sizeof *keys);
  int32_t* codes = malloc(n * sizeof *codes);
  for (size_t i = 0; i < n * stride; ++i) src[i] = (uint8_t)(i * 131u >> 3);
  for (size_t i = 0; i < n; ++i) {
    char name[32];
    int len = snprintf(name, sizeof name, "bench-%zu", i);
    tier_external_key(name, (size_t)len, &keys[i]);
    sr[i] = (tier_region){src + i * stride, size, TIER_MEMORY_HOST, -1};
    dr[i] = (tier_region){dst + i * stride, size, TIER_MEMORY_HOST, -1};
    saves[i] = (tier_item){keys[i], &sr[i], 1};
    loads[i] = (tier_item){keys[i], &dr[i], 1};
  }
  double put = 0, get = 0;
  for (int r = 0; r < rounds; ++r) {
    if (turn(turn_in, 0) != 0) {
      fprintf(stderr, "the driver ended the run\n");
      return 1;
    }
    tier_store_remove(s, keys, n, codes);
    const double t0 = now();
    int rc = tier_store_save(s, saves, n, codes);
    const double t1 = now();
    rc |= tier_store_load(s, loads, n, codes, NULL);
    const double t2 = now();
    if (rc != TIER_OK) {
      fprintf(stderr, "batch: %s\n", tier_last_error());
      return 1;
    }
    const double bytes = (double)(n * size);
    if (bytes / (t1 - t0) / 1e9 > put) put = bytes / (t1 - t0) / 1e9;
    if (bytes / (t2 - t1) / 1e9 > get) get = bytes / (t2 - t1) / 1e9;
    if (turn(turn_out, 1) != 0) {
      fprintf(stderr, "the driver ended the run\n");
      return 1;
    }
  }
  printf("{\"op\": \"put\", \"gb_per_s\": %.6f}\n{\"op\": \"get\", \"gb_per_s\": %.6f}\n", put, get);
  tier_store_close(s);
  return 0;
}
