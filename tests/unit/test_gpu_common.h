/* Helpers for the GPU tests (test_gpu_*.c, labelled "gpu"): open "cuda" or
 * exit 77 (ctest: skipped) with the reason, and the ref device beside it.
 * Buffers holding the same values on the GPU and for the reference are
 * tests/ops/op_buf.h's. */
#ifndef CTRAIN_TEST_GPU_COMMON_H
#define CTRAIN_TEST_GPU_COMMON_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "op_util.h"
#include "test_util.h"

static ct_device *g_gpu, *g_ref;
static const ct_backend *G_, *R_;
static ct_rng g_rng;

/* Exits 77 when no CUDA device can be opened (no build support, driver
 * or GPU), printing why. */
static inline void gpu_test_setup(uint64_t seed) {
  if (ct_device_open("cuda", &g_gpu) != CT_OK) {
    printf("skipped: %s\n", ct_last_error());
    exit(77);
  }
  if (ct_device_open("ref", &g_ref) != CT_OK) {
    fprintf(stderr, "cannot open ref: %s\n", ct_last_error());
    exit(1);
  }
  G_ = ct_device_backend(g_gpu);
  R_ = ct_device_backend(g_ref);
  ct_rng_init(&g_rng, seed, CT_RNG_TEST, 0, 0);
}

static inline void gpu_test_teardown(void) {
  ct_device_close(g_gpu);
  ct_device_close(g_ref);
}

/* The name of the case being checked, for failure messages (one buffer:
 * valid until the next call). */
static char g_case_name[256];
static const char *case_name(const char *fmt, ...) __attribute__((format(printf, 1, 2), unused));
static const char *case_name(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_case_name, sizeof g_case_name, fmt, ap);
  va_end(ap);
  return g_case_name;
}

#endif
