/* The checks of the C API's tests (c_api_test.c, c_api_lifetime_test.c): CHECK counts a failure
 * in `failures` and goes on; REQUIRE_OK exits 1 when a call does not return TIER_OK. Both print
 * the calling thread's tier_last_error(). One translation unit per test includes it. */
#ifndef TIER_TESTS_C_CHECK_H_
#define TIER_TESTS_C_CHECK_H_

#include <stdio.h>
#include <stdlib.h>

#include "tier/tier.h"

static int failures = 0;
#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %s)\n", __FILE__, __LINE__, #cond, \
              tier_last_error());                                                              \
      ++failures;                                                                              \
    }                                                                                          \
  } while (0)
#define REQUIRE_OK(expr)                                                        \
  do {                                                                          \
    int rc_ = (expr);                                                           \
    if (rc_ != TIER_OK) {                                                       \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #expr, \
              tier_code_name(rc_), tier_last_error());                          \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

#endif
