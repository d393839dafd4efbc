/* Fused full-batch linear regression (see include/ctrain/linreg.h).
 *
 * Each thread sums over one static, contiguous slice of the points into its
 * own cache-line-padded slot; the slots are then added in thread order. An
 * OpenMP reduction clause would do the same work but combine partial sums
 * in whatever order threads finish, and the last bits of the loss would
 * change from run to run. Features 1 and 2 (the common small cases) get
 * loops with scalar accumulators the compiler vectorises; other widths use
 * a generic loop over the columns. */
#include "ctrain/linreg.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "optim/optimizer_device.h"
#include "train/linreg_device.h"

/* Below this many points starting threads costs more than the pass. */
#define CT_LINREG_PAR_MIN 16384
/* Slot stride in doubles: a multiple of 8 (64 bytes) so threads never
 * write the same cache line. */
#define CT_LINREG_PAD 8

typedef struct linreg_ws {
  double *w;    /* [features + 1] params widened to double */
  double *acc;  /* [threads, stride]: loss, grad[0..features], per thread */
  size_t stride;
  int threads;
} linreg_ws;

static ct_status check_data(const ct_linreg_data *d) {
  if (!d) return ct_error(CT_ERR_INVALID_ARG, "linreg: data is NULL");
  if (!d->x) return ct_error(CT_ERR_INVALID_ARG, "linreg: data.x is NULL");
  if (!d->y) return ct_error(CT_ERR_INVALID_ARG, "linreg: data.y is NULL");
  if (d->n <= 0) return ct_error(CT_ERR_INVALID_ARG, "linreg: data.n is %lld, expected > 0", (long long)d->n);
  if (d->features <= 0)
    return ct_error(CT_ERR_INVALID_ARG, "linreg: data.features is %lld, expected > 0", (long long)d->features);
  return CT_OK;
}

static ct_status ws_init(linreg_ws *ws, int64_t features) {
  ws->threads = omp_get_max_threads();
  size_t need = (size_t)features + 2; /* loss, features weights, bias */
  ws->stride = (need + CT_LINREG_PAD - 1) / CT_LINREG_PAD * CT_LINREG_PAD;
  ws->w = malloc(sizeof(double) * ((size_t)features + 1));
  ws->acc = malloc(sizeof(double) * ws->stride * (size_t)ws->threads);
  if (!ws->w || !ws->acc) {
    free(ws->w), free(ws->acc);
    ws->w = NULL, ws->acc = NULL;
    return ct_error(CT_ERR_OUT_OF_MEMORY, "linreg: cannot allocate the workspace for %lld features and %d threads",
                    (long long)features, ws->threads);
  }
  return CT_OK;
}

static void ws_free(linreg_ws *ws) { free(ws->w), free(ws->acc); }

/* Sums over points [lo, hi) into a = {sum r^2, sum r x_0, .., sum r x_{F-1}, sum r}. */
static void slice_sums(const ct_linreg_data *d, const double *w, int64_t lo, int64_t hi, double *a) {
  const int64_t F = d->features;
  const float *restrict x = d->x, *restrict y = d->y;
  if (F == 1) {
    const double w0 = w[0], b = w[1];
    double l = 0, g0 = 0, gb = 0;
#pragma omp simd reduction(+ : l, g0, gb)
    for (int64_t i = lo; i < hi; i++) {
      double x0 = x[i];
      double r = x0 * w0 + b - (double)y[i];
      l += r * r, g0 += r * x0, gb += r;
    }
    a[0] = l, a[1] = g0, a[2] = gb;
    return;
  }
  if (F == 2) {
    const double w0 = w[0], w1 = w[1], b = w[2];
    double l = 0, g0 = 0, g1 = 0, gb = 0;
#pragma omp simd reduction(+ : l, g0, g1, gb)
    for (int64_t i = lo; i < hi; i++) {
      double x0 = x[2 * i], x1 = x[2 * i + 1];
      double r = x0 * w0 + x1 * w1 + b - (double)y[i];
      l += r * r, g0 += r * x0, g1 += r * x1, gb += r;
    }
    a[0] = l, a[1] = g0, a[2] = g1, a[3] = gb;
    return;
  }
  for (int64_t j = 0; j < F + 2; j++) a[j] = 0;
  for (int64_t i = lo; i < hi; i++) {
    const float *xi = x + i * F;
    double r = w[F] - (double)y[i];
    for (int64_t j = 0; j < F; j++) r += (double)xi[j] * w[j];
    a[0] += r * r;
    for (int64_t j = 0; j < F; j++) a[1 + j] += r * (double)xi[j];
    a[F + 1] += r;
  }
}

static void fused_pass(const ct_linreg_data *d, const float *params, linreg_ws *ws, double *loss, double *grad) {
  const int64_t n = d->n, F = d->features;
  for (int64_t j = 0; j <= F; j++) ws->w[j] = params[j];
  int used = 1;
#pragma omp parallel num_threads(ws->threads) if (n >= CT_LINREG_PAR_MIN)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    slice_sums(d, ws->w, lo, hi, ws->acc + (size_t)t * ws->stride);
#pragma omp single nowait
    used = nt;
  }
  double *sum = ws->acc; /* thread 0's slot collects the others, in order */
  for (int t = 1; t < used; t++)
    for (int64_t j = 0; j < F + 2; j++) sum[j] += ws->acc[(size_t)t * ws->stride + (size_t)j];
  const double inv_n = 1.0 / (double)n;
  if (loss) *loss = sum[0] * inv_n;
  if (grad)
    for (int64_t j = 0; j <= F; j++) grad[j] = 2.0 * inv_n * sum[1 + j];
}

ct_status ct_linreg_loss_grad(const ct_linreg_data *data, const float *params, double *loss, double *grad) {
  CT_TRY(check_data(data));
  if (!params) return ct_error(CT_ERR_INVALID_ARG, "linreg: params is NULL");
  linreg_ws ws;
  CT_TRY(ws_init(&ws, data->features));
  fused_pass(data, params, &ws, loss, grad);
  ws_free(&ws);
  return CT_OK;
}

ct_status ct_linreg_fit(const ct_linreg_data *data, const ct_optim_config *optim, int64_t steps, float *params,
                        double *loss_history) {
  CT_TRY(check_data(data));
  if (!params) return ct_error(CT_ERR_INVALID_ARG, "linreg: params is NULL");
  if (!optim) return ct_error(CT_ERR_INVALID_ARG, "linreg: optim is NULL");
  if (steps < 0) return ct_error(CT_ERR_INVALID_ARG, "linreg: steps is %lld, expected >= 0", (long long)steps);
  const size_t np = (size_t)data->features + 1;
  ct_optimizer *opt = NULL;
  ct_status s = ct_optimizer_create(optim, np, &opt);
  if (s != CT_OK) return ct_error_wrap(s, "linreg: ");
  linreg_ws ws;
  s = ws_init(&ws, data->features);
  double *g64 = malloc(sizeof(double) * np);
  float *g32 = malloc(sizeof(float) * np);
  if (s == CT_OK && (!g64 || !g32))
    s = ct_error(CT_ERR_OUT_OF_MEMORY, "linreg: cannot allocate gradients for %zu parameters", np);
  for (int64_t k = 0; s == CT_OK && k < steps; k++) {
    double l;
    fused_pass(data, params, &ws, &l, g64);
    if (loss_history) loss_history[k] = l;
    for (size_t j = 0; j < np; j++) g32[j] = (float)g64[j];
    s = ct_optimizer_step(opt, params, g32);
  }
  if (ws.w) ws_free(&ws);
  free(g64), free(g32);
  ct_optimizer_destroy(opt);
  return s;
}

ct_status ct_linreg_fit_device(ct_device *dev, const ct_linreg_data *data, const ct_optim_config *optim,
                               int64_t steps, float *params, double *loss_history) {
  CT_TRY(check_data(data));
  if (!params) return ct_error(CT_ERR_INVALID_ARG, "linreg: params is NULL");
  if (!optim) return ct_error(CT_ERR_INVALID_ARG, "linreg: optim is NULL");
  if (steps < 0) return ct_error(CT_ERR_INVALID_ARG, "linreg: steps is %lld, expected >= 0", (long long)steps);
  const ct_backend *be = ct_device_backend(dev);
  if (!be->linreg_fit)
    return ct_error(CT_ERR_UNSUPPORTED, "linreg: device %s has no fused linear regression kernel (use ct_linreg_fit)",
                    ct_device_name(dev));
  if (data->features > CT_LINREG_MAX_FEATURES)
    return ct_error(CT_ERR_UNSUPPORTED, "linreg: data.features is %lld; the device kernel takes at most %d",
                    (long long)data->features, CT_LINREG_MAX_FEATURES);
  if (steps == 0) return CT_OK;
  const size_t np = (size_t)data->features + 1;
  ct_optimizer *opt = NULL;
  ct_status s = ct_optimizer_create(optim, np, &opt);
  if (s != CT_OK) return ct_error_wrap(s, "linreg: ");
  /* Every step's scalars up front (no step is ever skipped here), rounded
   * as ct_optimizer_step rounds them. */
  ct_fused_optim_args *args = malloc(sizeof *args * (size_t)steps);
  float *zeros = calloc(3 * np, sizeof(float));
  if (!args || !zeros) s = ct_error(CT_ERR_OUT_OF_MEMORY, "linreg: out of host memory for %lld steps", (long long)steps);
  for (int64_t k = 0; s == CT_OK && k < steps; k++) {
    ct_optim_fused_args(opt, 0.0, &args[k]);
    ct_optimizer_commit_step(opt, 0);
  }
  ct_fused_optim_args *dargs = NULL;
  float *dp = NULL, *dstate = NULL;
  double *dloss = NULL;
  if (s == CT_OK) {
    dargs = ct_device_alloc(dev, sizeof *args * (size_t)steps);
    dp = ct_device_alloc(dev, np * sizeof(float));
    dstate = ct_device_alloc(dev, 3 * np * sizeof(float));
    dloss = ct_device_alloc(dev, sizeof(double) * (size_t)steps);
    if (!dargs || !dp || !dstate || !dloss)
      s = ct_error_wrap(CT_ERR_OUT_OF_MEMORY, "linreg: device memory for %lld steps on %s", (long long)steps,
                        ct_device_name(dev));
  }
  if (s == CT_OK) s = ct_device_copy(dev, dargs, NULL, args, sizeof *args * (size_t)steps);
  if (s == CT_OK) s = ct_device_copy(dev, dp, NULL, params, np * sizeof(float));
  if (s == CT_OK) s = ct_device_copy(dev, dstate, NULL, zeros, 3 * np * sizeof(float));
  if (s == CT_OK)
    s = be->linreg_fit(dev, data->x, data->y, data->n, (int)data->features, dargs, steps, dp, dstate, dloss);
  if (s == CT_OK) s = ct_device_copy(NULL, params, dev, dp, np * sizeof(float));
  if (s == CT_OK && loss_history) s = ct_device_copy(NULL, loss_history, dev, dloss, sizeof(double) * (size_t)steps);
  if (dargs) ct_device_free(dev, dargs);
  if (dp) ct_device_free(dev, dp);
  if (dstate) ct_device_free(dev, dstate);
  if (dloss) ct_device_free(dev, dloss);
  free(args), free(zeros);
  ct_optimizer_destroy(opt);
  return s;
}
