/* Helpers for the CPU-backend tests: each test buffer holds the same
 * random values three ways (f32 and bf16 for the cpu device, f64 for the
 * reference device), so every op runs on identical inputs on both devices.
 *
 * Metric: err = max_i |cpu_i - ref_i| / max_i |ref_i| over one tensor
 * (normwise relative error). The reference runs in f64 unless a case says
 * otherwise, so err measures the cpu kernel's own rounding; fp32 must stay
 * within 1e-5, bf16 within 1e-2. */
#ifndef CTRAIN_TEST_CPU_COMMON_H
#define CTRAIN_TEST_CPU_COMMON_H

#include <stdint.h>

#include "backend/backend.h"
#include "test_util.h"

static ct_device *g_cpu, *g_ref;
static const ct_backend *C_, *R_;
static ct_rng g_rng;

typedef struct tb {
  int ndim;
  int64_t shape[CT_MAX_DIMS];
  int64_t n;
  float *f;     /* cpu, f32 */
  uint16_t *h;  /* cpu, bf16 copy of f */
  double *d;    /* ref, f64 */
} tb;

static inline void cpu_test_setup(uint64_t seed) {
  if (ct_device_open("cpu", &g_cpu) != CT_OK || ct_device_open("ref", &g_ref) != CT_OK) {
    fprintf(stderr, "cannot open devices: %s\n", ct_last_error());
    exit(1);
  }
  C_ = ct_device_backend(g_cpu);
  R_ = ct_device_backend(g_ref);
  ct_rng_init(&g_rng, seed, CT_RNG_TEST, 0, 0);
}

static inline void cpu_test_teardown(void) {
  ct_device_close(g_cpu);
  ct_device_close(g_ref);
}

static inline tb tb_make(int ndim, const int64_t *shape) {
  tb t;
  memset(&t, 0, sizeof t);
  t.ndim = ndim;
  t.n = 1;
  for (int i = 0; i < ndim; i++) t.n *= t.shape[i] = shape[i];
  size_t n = (size_t)(t.n ? t.n : 1);
  t.f = calloc(n, 4);
  t.h = calloc(n, 2);
  t.d = calloc(n, 8);
  return t;
}
#define TB(...) tb_make((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

static inline void tb_free(tb *t) {
  free(t->f);
  free(t->h);
  free(t->d);
}

/* Copies f into the other two views. */
static inline void tb_sync(tb *t) {
  for (int64_t i = 0; i < t->n; i++) {
    t->h[i] = ct_f32_to_bf16(t->f[i]);
    t->d[i] = t->f[i];
  }
}

/* Normal random values (never all zero). */
static inline tb *tb_rand(tb *t, double scale) {
  for (int64_t i = 0; i < t->n; i++) t->f[i] = (float)(ct_rng_normal(&g_rng) * scale);
  tb_sync(t);
  return t;
}

/* Rounds the values to bf16 in every view, so a bf16 cpu run and the f64
 * reference see the same numbers. */
static inline void tb_round_bf16(tb *t) {
  for (int64_t i = 0; i < t->n; i++) t->f[i] = ct_bf16_to_f32(ct_f32_to_bf16(t->f[i]));
  tb_sync(t);
}

static inline ct_tensor tb_cpu(tb *t) { return ct_tensor_view(t->f, CT_F32, t->ndim, t->shape); }
static inline ct_tensor tb_cpu16(tb *t) { return ct_tensor_view(t->h, CT_BF16, t->ndim, t->shape); }
static inline ct_tensor tb_ref(tb *t) { return ct_tensor_view(t->d, CT_F64, t->ndim, t->shape); }

/* max|a-r| / max|r| between the cpu f32 view and the ref f64 view. */
static inline double tb_err(const tb *t) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < t->n; i++) {
    double e = fabs((double)t->f[i] - t->d[i]);
    if (!(e <= num)) num = isnan(e) ? INFINITY : e;
    if (fabs(t->d[i]) > den) den = fabs(t->d[i]);
  }
  return num / (den > 0 ? den : 1e-30);
}

/* Same, with the cpu result in the bf16 view. */
static inline double tb_err16(const tb *t) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < t->n; i++) {
    double e = fabs((double)ct_bf16_to_f32(t->h[i]) - t->d[i]);
    if (!(e <= num)) num = isnan(e) ? INFINITY : e;
    if (fabs(t->d[i]) > den) den = fabs(t->d[i]);
  }
  return num / (den > 0 ? den : 1e-30);
}

#endif
