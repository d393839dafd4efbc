/* Helpers for the GPU tests (test_gpu_*.c, labelled "gpu"): open "cuda" or
 * exit 77 (ctest: skipped) with the reason, and buffers that hold the same
 * random values on the host (f32 and f64) and on the GPU (f32, bf16 or
 * f16), so an op runs on identical inputs on the cuda and ref devices.
 *
 * Metric: err = max_i |gpu_i - ref_i| / max_i |ref_i| (normwise relative
 * error against the f64 reference), as in test_cpu_common.h. */
#ifndef CTRAIN_TEST_GPU_COMMON_H
#define CTRAIN_TEST_GPU_COMMON_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "op_util.h"
#include "test_util.h"

static ct_device *g_gpu, *g_ref;
/* The device whose queued ops produce what gb_get reads (another device on
 * the same GPU in the TF32 test): synchronised before each download. */
static ct_device *g_work;
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
  g_work = g_gpu;
  G_ = ct_device_backend(g_gpu);
  R_ = ct_device_backend(g_ref);
  ct_rng_init(&g_rng, seed, CT_RNG_TEST, 0, 0);
}

static inline void gpu_test_teardown(void) {
  ct_device_close(g_gpu);
  ct_device_close(g_ref);
}

typedef struct gb {
  int ndim;
  int64_t shape[CT_MAX_DIMS];
  int64_t n;
  float *f;     /* host values (what the GPU got, or what it returned) */
  double *d;    /* ref, f64 */
  float *rf;    /* ref, f32 */
  void *dev;    /* device copy, f32-sized so any float dtype fits */
  ct_dtype dt;  /* dtype of the device copy */
} gb;

static inline gb gb_make(int ndim, const int64_t *shape) {
  gb t;
  memset(&t, 0, sizeof t);
  t.ndim = ndim;
  t.n = 1;
  for (int i = 0; i < ndim; i++) t.n *= t.shape[i] = shape[i];
  size_t n = (size_t)(t.n ? t.n : 1);
  t.f = calloc(n, 4);
  t.d = calloc(n, 8);
  t.rf = calloc(n, 4);
  t.dev = ct_device_alloc(g_gpu, n * 4);
  if (!t.f || !t.d || !t.rf || !t.dev) {
    fprintf(stderr, "gb_make: %s\n", ct_last_error());
    exit(1);
  }
  t.dt = CT_F32;
  return t;
}
#define GB(...) gb_make((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

static inline void gb_free(gb *t) {
  free(t->f);
  free(t->d);
  free(t->rf);
  ct_device_free(g_gpu, t->dev);
}

/* Uploads f as dtype dt (rounding f to dt first, so host and GPU hold the
 * same numbers) and refreshes the reference views. */
static inline void gb_put(gb *t, ct_dtype dt) {
  size_t n = (size_t)t->n;
  void *tmp = malloc(n * 4 + 4);
  ct_convert(t->f, CT_F32, tmp, dt, n);
  ct_convert(tmp, dt, t->f, CT_F32, n);
  if (ct_device_copy(g_gpu, t->dev, NULL, tmp, n * ct_dtype_size(dt)) != CT_OK) {
    fprintf(stderr, "gb_put: %s\n", ct_last_error());
    exit(1);
  }
  free(tmp);
  /* uploads run on g_gpu's stream; ops may run on g_work's */
  if (ct_device_sync(g_gpu) != CT_OK) {
    fprintf(stderr, "gb_put: %s\n", ct_last_error());
    exit(1);
  }
  t->dt = dt;
  for (int64_t i = 0; i < t->n; i++) {
    t->d[i] = t->f[i];
    t->rf[i] = t->f[i];
  }
}

/* Normal random values (never all zero), uploaded as dt. */
static inline gb *gb_rand(gb *t, double scale, ct_dtype dt) {
  for (int64_t i = 0; i < t->n; i++) t->f[i] = (float)(ct_rng_normal(&g_rng) * scale);
  gb_put(t, dt);
  return t;
}

/* Downloads the device copy (dtype t->dt) into f. */
static inline void gb_get(gb *t) {
  size_t n = (size_t)t->n;
  void *tmp = malloc(n * 4 + 4);
  if (ct_device_sync(g_work) != CT_OK || ct_device_copy(NULL, tmp, g_gpu, t->dev, n * ct_dtype_size(t->dt)) != CT_OK) {
    fprintf(stderr, "gb_get: %s\n", ct_last_error());
    exit(1);
  }
  ct_convert(tmp, t->dt, t->f, CT_F32, n);
  free(tmp);
}

/* Device tensor of the current dtype / of dtype dt (output buffers). */
static inline ct_tensor gb_gpu(gb *t) {
  ct_tensor x = ct_tensor_view(t->dev, t->dt, t->ndim, t->shape);
  x.device = g_gpu;
  return x;
}
static inline ct_tensor gb_out(gb *t, ct_dtype dt) {
  t->dt = dt;
  return gb_gpu(t);
}
static inline ct_tensor gb_ref(gb *t) { return ct_tensor_view(t->d, CT_F64, t->ndim, t->shape); }
static inline ct_tensor gb_ref32(gb *t) { return ct_tensor_view(t->rf, CT_F32, t->ndim, t->shape); }

/* Downloads and returns max|gpu - ref| / max|ref| (ref in the f64 view). */
static inline double gb_err(gb *t) {
  gb_get(t);
  double num = 0, den = 0;
  for (int64_t i = 0; i < t->n; i++) {
    double e = fabs((double)t->f[i] - t->d[i]);
    if (!(e <= num)) num = isnan(e) ? INFINITY : e;
    if (fabs(t->d[i]) > den) den = fabs(t->d[i]);
  }
  return num / (den > 0 ? den : 1e-30);
}

/* Downloads and counts elements that differ bitwise from the f32 ref view. */
static inline int64_t gb_diff_exact(gb *t) {
  gb_get(t);
  int64_t bad = 0;
  for (int64_t i = 0; i < t->n; i++) bad += memcmp(&t->f[i], &t->rf[i], 4) != 0;
  return bad;
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
