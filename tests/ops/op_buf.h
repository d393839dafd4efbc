/* A test tensor on any device, held four ways: the host values f in plain
 * (NCHW) order, which are what the device got or what it returned; the
 * reference device's f64 (d) and f32 (rf) views of the same values; and
 * the device's copy, in a dtype and layout of the test's choosing (the
 * cpu's device memory is host memory, so one code path serves every
 * backend). ob_put rounds f to the device dtype before uploading, so the
 * device and the reference compute on identical numbers.
 *
 * Metric: ob_err is max_i |dev_i - ref_i| / max_i |ref_i| against the f64
 * view (normwise relative error); a NaN gives infinity. A buffer that
 * cannot be made or moved ends the test (exit 1): no result then. */
#ifndef CTRAIN_TEST_OP_BUF_H
#define CTRAIN_TEST_OP_BUF_H

#include <stdint.h>

#include "backend/backend.h"
#include "op_util.h"
#include "test_util.h"

typedef struct obuf {
  int ndim;
  int64_t shape[CT_MAX_DIMS];
  int64_t n;
  float *f;
  double *d;
  float *rf;
  ct_device *dev;
  void *data;    /* on dev, 4 bytes an element so any float dtype fits */
  ct_dtype dt;   /* of data */
  ct_layout lay; /* of data; set it before ob_put (plain by default) */
} obuf;

static inline void ob_die(const char *what) {
  fprintf(stderr, "%s: %s\n", what, ct_last_error());
  exit(1);
}

static inline obuf ob_make(ct_device *dev, int ndim, const int64_t *shape) {
  obuf t;
  memset(&t, 0, sizeof t);
  t.ndim = ndim;
  t.n = 1;
  for (int i = 0; i < ndim; i++) t.n *= t.shape[i] = shape[i];
  size_t n = (size_t)(t.n ? t.n : 1);
  t.f = calloc(n, 4);
  t.d = calloc(n, 8);
  t.rf = calloc(n, 4);
  t.dev = dev;
  t.data = ct_device_alloc(dev, n * 4);
  if (!t.f || !t.d || !t.rf || !t.data) ob_die("ob_make");
  t.dt = CT_F32;
  return t;
}
#define OB(dev, ...) ob_make(dev, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

static inline void ob_free(obuf *t) {
  free(t->f);
  free(t->d);
  free(t->rf);
  ct_device_free(t->dev, t->data);
}

/* Positions per sample and channel: H*W of an [N, C, H, W] tensor. */
static inline int64_t ob_hw(const obuf *t) { return t->n / (t->shape[0] * t->shape[1]); }

/* Uploads f as dtype dt in layout t->lay (rounding f to dt first) and
 * refreshes the reference views. */
static inline void ob_put(obuf *t, ct_dtype dt) {
  size_t n = (size_t)t->n;
  void *enc = malloc(n * 4 + 4);
  if (!enc) ob_die("ob_put");
  ct_convert(t->f, CT_F32, enc, dt, n);
  ct_convert(enc, dt, t->f, CT_F32, n);
  if (t->lay != CT_LAYOUT_PLAIN) {
    float *perm = malloc(n * 4);
    if (!perm) ob_die("ob_put");
    to_layout(t->f, perm, t->lay, t->shape[0], t->shape[1], ob_hw(t));
    ct_convert(perm, CT_F32, enc, dt, n);
    free(perm);
  }
  if (ct_device_copy(t->dev, t->data, NULL, enc, n * ct_dtype_size(dt)) != CT_OK || ct_device_sync(t->dev) != CT_OK)
    ob_die("ob_put");
  free(enc);
  t->dt = dt;
  for (int64_t i = 0; i < t->n; i++) {
    t->d[i] = t->f[i];
    t->rf[i] = t->f[i];
  }
}

/* Normal random values (never all zero), uploaded as dt: a stream of
 * their own, seeded from rng, through the bulk generator (the long sums'
 * 1e8 values are seconds one at a time). */
static inline void ob_rand(obuf *t, ct_rng *rng, double scale, ct_dtype dt) {
  uint64_t seed = (uint64_t)ct_rng_u32(rng) << 32 | ct_rng_u32(rng);
  ct_rng_fill_normal(t->f, t->n, scale, seed, CT_RNG_TEST, 0, 0);
  ob_put(t, dt);
}

/* Downloads the device's copy (dtype t->dt, layout t->lay) into f, after
 * the device's queued work. */
static inline void ob_get(obuf *t) {
  size_t n = (size_t)t->n;
  void *tmp = malloc(n * 4 + 4);
  if (!tmp || ct_device_sync(t->dev) != CT_OK ||
      ct_device_copy(NULL, tmp, t->dev, t->data, n * ct_dtype_size(t->dt)) != CT_OK)
    ob_die("ob_get");
  if (t->lay == CT_LAYOUT_PLAIN) {
    ct_convert(tmp, t->dt, t->f, CT_F32, n);
  } else {
    float *wide = malloc(n * 4);
    if (!wide) ob_die("ob_get");
    ct_convert(tmp, t->dt, wide, CT_F32, n);
    from_layout(wide, t->f, t->lay, t->shape[0], t->shape[1], ob_hw(t));
    free(wide);
  }
  free(tmp);
}

/* The device tensor: its current dtype and layout. */
static inline ct_tensor ob_dev(obuf *t) {
  ct_tensor x = ct_tensor_view(t->data, t->dt, t->ndim, t->shape);
  x.device = t->dev;
  x.layout = t->lay;
  return x;
}

/* An output of dtype dt the op must overwrite: filled with NaN first, so
 * an element it never writes fails the comparison. The reference views
 * keep their values (a reference op overwrites them). */
static inline ct_tensor ob_out(obuf *t, ct_dtype dt) {
  size_t n = (size_t)t->n;
  float *nan = malloc(n * 4 + 4);
  void *enc = malloc(n * 4 + 4);
  if (!nan || !enc) ob_die("ob_out");
  for (size_t i = 0; i < n; i++) nan[i] = NAN;
  ct_convert(nan, CT_F32, enc, dt, n);
  if (ct_device_copy(t->dev, t->data, NULL, enc, n * ct_dtype_size(dt)) != CT_OK) ob_die("ob_out");
  free(nan);
  free(enc);
  t->dt = dt;
  return ob_dev(t);
}

static inline ct_tensor ob_ref(obuf *t) { return ct_tensor_view(t->d, CT_F64, t->ndim, t->shape); }
static inline ct_tensor ob_ref32(obuf *t) { return ct_tensor_view(t->rf, CT_F32, t->ndim, t->shape); }

/* Downloads t and returns its normwise error against the f64 view; *den
 * (if given) gets max |ref|, 0 when the comparison would be blind. */
static inline double ob_err(obuf *t, double *den) {
  ob_get(t);
  double num = 0, mx = 0;
  for (int64_t i = 0; i < t->n; i++) {
    double e = fabs((double)t->f[i] - t->d[i]);
    if (!(e <= num)) num = isnan(e) ? INFINITY : e;
    if (fabs(t->d[i]) > mx) mx = fabs(t->d[i]);
  }
  if (den) *den = mx;
  return num / (mx > 0 ? mx : 1e-30);
}

/* Downloads t and counts the elements that differ bitwise from the f32
 * view (ops that must agree exactly). */
static inline int64_t ob_diff_exact(obuf *t) {
  ob_get(t);
  int64_t bad = 0;
  for (int64_t i = 0; i < t->n; i++) bad += memcmp(&t->f[i], &t->rf[i], 4) != 0;
  return bad;
}

#endif
