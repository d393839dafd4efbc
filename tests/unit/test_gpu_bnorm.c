/* Batch norm on the cuda device (cuda_bnorm.c: cuDNN, and the own kernels
 * of cuda_reduce.cu it falls back to) against the ref device in f64 on the
 * same values: training forward (y, save_mean, save_invstd, running
 * stats), eval forward, backward (dx, dgamma, dbeta with beta_acc 0 and 1,
 * and with dx NULL), batchnorm_apply from the saved statistics (with and
 * without the ReLU), plain (NCHW) and channels-last (NHWC, built by
 * permuting on the host; the reference always runs on NCHW data), f32 /
 * bf16 / f16 activations, affine or not, 2-D, 3-D and 4-D inputs, channel
 * counts that are not multiples of 8, a 64x64x56x56 case, and bf16
 * parameters (which cuDNN does not take: the own kernels, NCHW and NHWC).
 * Plus the refusals: mixed layouts, NHWC that is not 4-D, the cpu's C16,
 * one value per channel in training. And batch norm with ReLU fused
 * (batchnorm_act_reserve/fwd/bwd: cuDNN's BN_ACTIVATION on NHWC 16-bit
 * data with C a multiple of 4, the unfused path elsewhere) against the
 * reference's batch norm and ReLU: y, statistics, dx, dgamma, dbeta; on
 * the emulator also which cases get a reserve (none under
 * CT_EMU_BN_NO_FUSED, emu_test_gpu_bnorm_no_fused) and that a reserve
 * cleared between the passes is noticed.
 *
 * Metric: max |gpu - ref| / max |ref| per tensor. Tolerances: f32 1e-5;
 * bf16 1e-2 and f16 5e-3 for tensors stored in those dtypes; statistics
 * and parameter gradients (f32) computed from 16-bit inputs 1e-3; bf16
 * parameters and statistics 1e-2. Labelled gpu; exits 77 without a CUDA
 * device. */
#include <stdarg.h>

#include "test_gpu_common.h"

#define TOL32 1e-5

static double tol_of(ct_dtype t) { return t == CT_F32 ? TOL32 : t == CT_BF16 ? 1e-2 : 5e-3; }

/* One tensor: plain-order values on the host (h, and the f64 copy ref the
 * reference reads and writes) and a device copy in dtype dt, NHWC-ordered
 * when nhwc. */
typedef struct tb {
  int ndim;
  int64_t shape[4];
  int64_t n;
  float *h;
  double *ref;
  float *tmp;
  void *stage;
  void *dev;
  ct_dtype dt;
  int nhwc;
} tb;

static tb tb_make(int ndim, const int64_t *shape, int nhwc) {
  tb t;
  memset(&t, 0, sizeof t);
  t.ndim = ndim;
  t.n = 1;
  for (int i = 0; i < ndim; i++) t.n *= t.shape[i] = shape[i];
  t.nhwc = nhwc && ndim == 4;
  size_t n = (size_t)t.n;
  t.h = calloc(n, 4);
  t.ref = calloc(n, 8);
  t.tmp = calloc(n, 4);
  t.stage = calloc(n, 4);
  t.dev = ct_device_alloc(g_gpu, n * 4);
  if (!t.h || !t.ref || !t.tmp || !t.stage || !t.dev) {
    fprintf(stderr, "tb_make: out of memory (%lld elements): %s\n", (long long)t.n, ct_last_error());
    exit(1);
  }
  t.dt = CT_F32;
  return t;
}
static tb tb_vec(int64_t c) { return tb_make(1, &c, 0); }

static void tb_free(tb *t) {
  free(t->h), free(t->ref), free(t->tmp), free(t->stage);
  ct_device_free(g_gpu, t->dev);
}

/* [N][C][HW] <-> [N][HW][C] */
static void perm(const float *src, float *dst, const int64_t *s, int to_nhwc) {
  const int64_t N = s[0], C = s[1], HW = s[2] * s[3];
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t p = 0; p < HW; p++) {
        int64_t a = (n * C + c) * HW + p, b = (n * HW + p) * C + c;
        if (to_nhwc) dst[b] = src[a];
        else dst[a] = src[b];
      }
}

/* Rounds h to dt (both sides then hold the same numbers), uploads it in
 * the tensor's order and refreshes ref. */
static void tb_put(tb *t, ct_dtype dt) {
  size_t n = (size_t)t->n;
  ct_convert(t->h, CT_F32, t->stage, dt, n);
  ct_convert(t->stage, dt, t->h, CT_F32, n);
  if (t->nhwc) {
    perm(t->h, t->tmp, t->shape, 1);
    ct_convert(t->tmp, CT_F32, t->stage, dt, n);
  }
  if (ct_device_copy(g_gpu, t->dev, NULL, t->stage, n * ct_dtype_size(dt)) != CT_OK ||
      ct_device_sync(g_gpu) != CT_OK) {
    fprintf(stderr, "tb_put: %s\n", ct_last_error());
    exit(1);
  }
  t->dt = dt;
  for (int64_t i = 0; i < t->n; i++) t->ref[i] = t->h[i];
}

static void tb_rand(tb *t, double scale, ct_dtype dt) {
  for (int64_t i = 0; i < t->n; i++) t->h[i] = (float)(ct_rng_normal(&g_rng) * scale);
  tb_put(t, dt);
}

/* Downloads the device copy into h (plain order). */
static void tb_get(tb *t) {
  size_t n = (size_t)t->n;
  if (ct_device_sync(g_gpu) != CT_OK || ct_device_copy(NULL, t->stage, g_gpu, t->dev, n * ct_dtype_size(t->dt)) != CT_OK) {
    fprintf(stderr, "tb_get: %s\n", ct_last_error());
    exit(1);
  }
  if (t->nhwc) {
    ct_convert(t->stage, t->dt, t->tmp, CT_F32, n);
    perm(t->tmp, t->h, t->shape, 0);
  } else {
    ct_convert(t->stage, t->dt, t->h, CT_F32, n);
  }
}

/* The device tensor; an output takes dtype dt first. */
static ct_tensor tb_gpu(tb *t) {
  ct_tensor x = ct_tensor_view(t->dev, t->dt, t->ndim, t->shape);
  x.device = g_gpu;
  x.layout = t->nhwc ? CT_LAYOUT_NHWC : CT_LAYOUT_PLAIN;
  return x;
}
static ct_tensor tb_out(tb *t, ct_dtype dt) {
  t->dt = dt;
  return tb_gpu(t);
}
static ct_tensor tb_ref(tb *t) { return ct_tensor_view(t->ref, CT_F64, t->ndim, t->shape); }

/* Downloads and returns max |gpu - ref| / max |ref|. */
static double tb_err(tb *t) {
  tb_get(t);
  double num = 0, den = 0;
  for (int64_t i = 0; i < t->n; i++) {
    double e = fabs((double)t->h[i] - t->ref[i]);
    if (!(e <= num)) num = isnan(e) ? INFINITY : e;
    if (fabs(t->ref[i]) > den) den = fabs(t->ref[i]);
  }
  return num / (den > 0 ? den : 1e-30);
}

/* The reference reads what the GPU holds (saved statistics). */
static void tb_adopt(tb *t) {
  tb_get(t);
  for (int64_t i = 0; i < t->n; i++) t->ref[i] = t->h[i];
}

static char g_case[160];
#define CHECK_E(t, tol, what)                                                            \
  do {                                                                                   \
    double e_ = tb_err(t);                                                               \
    CHECK_MSG(e_ <= (tol), "%s %s: err %.3g (tol %.1g)", g_case, what, e_, (double)(tol)); \
  } while (0)

typedef struct bn_case {
  int ndim;
  int64_t shape[4];
  ct_dtype dt;  /* activations */
  ct_dtype pdt; /* parameters and statistics (bf16: the own kernels) */
  int nhwc, affine;
  float eps;
} bn_case;

static void bn_run(const bn_case *k) {
  const int64_t C = k->shape[1];
  int64_t S = 1;
  for (int i = 2; i < k->ndim; i++) S *= k->shape[i];
  const double ta = tol_of(k->dt);
  const double tp = k->pdt != CT_F32 ? tol_of(k->pdt) : k->dt == CT_F32 ? TOL32 : 1e-3;
  char sh[64];
  snprintf(g_case, sizeof g_case, "batchnorm %s %s %s params %s affine%d eps %g",
           ct_shape_str(k->ndim, k->shape, sh, sizeof sh), ct_dtype_name(k->dt), k->nhwc ? "NHWC" : "NCHW",
           ct_dtype_name(k->pdt), k->affine, (double)k->eps);
  tb x = tb_make(k->ndim, k->shape, k->nhwc), y = tb_make(k->ndim, k->shape, k->nhwc);
  tb dy = tb_make(k->ndim, k->shape, k->nhwc), dx = tb_make(k->ndim, k->shape, k->nhwc);
  tb g = tb_vec(C), b = tb_vec(C), rm = tb_vec(C), rv = tb_vec(C), sm = tb_vec(C), si = tb_vec(C);
  tb dg = tb_vec(C), db = tb_vec(C);
  /* per-channel offsets and scales, so a channel mix-up shows */
  for (int64_t i = 0; i < x.n; i++) {
    int64_t c = (i / S) % C;
    x.h[i] = (float)(ct_rng_normal(&g_rng) * (1.0 + 0.5 * (double)(c % 4))) + 0.5f * (float)(c % 3);
  }
  tb_put(&x, k->dt);
  tb_rand(&dy, 1.0, k->dt);
  tb_rand(&g, 1.0, k->pdt), tb_rand(&b, 1.0, k->pdt), tb_rand(&rm, 1.0, k->pdt);
  for (int64_t c = 0; c < C; c++) rv.h[c] = 0.5f + 0.25f * (float)(c % 7);
  tb_put(&rv, k->pdt);
  const float mom = 0.1f;
  const int aff = k->affine;

  /* training forward */
  ct_tensor xg = tb_gpu(&x), yg = tb_out(&y, k->dt), gg = tb_gpu(&g), bg = tb_gpu(&b), rmg = tb_gpu(&rm);
  ct_tensor rvg = tb_gpu(&rv), smg = tb_out(&sm, k->pdt), sig = tb_out(&si, k->pdt);
  ct_tensor xr = tb_ref(&x), yr = tb_ref(&y), gr = tb_ref(&g), br = tb_ref(&b), rmr = tb_ref(&rm), rvr = tb_ref(&rv);
  ct_tensor smr = tb_ref(&sm), sir = tb_ref(&si);
  CHECK_OK(G_->batchnorm_fwd(g_gpu, 1, &xg, aff ? &gg : NULL, aff ? &bg : NULL, &rmg, &rvg, mom, k->eps, &yg, &smg,
                             &sig));
  CHECK_OK(R_->batchnorm_fwd(g_ref, 1, &xr, aff ? &gr : NULL, aff ? &br : NULL, &rmr, &rvr, mom, k->eps, &yr, &smr,
                             &sir));
  CHECK_E(&y, ta, "train y");
  CHECK_E(&sm, tp, "save_mean");
  CHECK_E(&si, tp, "save_invstd");
  CHECK_E(&rm, tp, "running_mean");
  CHECK_E(&rv, tp, "running_var");

  /* backward, from the statistics the GPU saved */
  tb_adopt(&sm), tb_adopt(&si);
  /* batchnorm_apply from them: the training y again (the recompute of a
   * dropped output); y is not read again before the eval forward */
  yg = tb_out(&y, k->dt);
  CHECK_OK(G_->batchnorm_apply(g_gpu, &xg, aff ? &gg : NULL, aff ? &bg : NULL, &smg, &sig, CT_ACT_NONE, 0.f, &yg));
  CHECK_OK(R_->batchnorm_apply(g_ref, &xr, aff ? &gr : NULL, aff ? &br : NULL, &smr, &sir, CT_ACT_NONE, 0.f, &yr));
  CHECK_E(&y, ta, "apply y");
  ct_tensor dyg = tb_gpu(&dy), dyr = tb_ref(&dy), dxr = tb_ref(&dx);
  for (int acc = 0; acc <= 1; acc++) {
    tb_rand(&dg, 1.0, k->pdt), tb_rand(&db, 1.0, k->pdt);
    ct_tensor dxg = tb_out(&dx, k->dt), dgg = tb_gpu(&dg), dbg = tb_gpu(&db), dgr = tb_ref(&dg), dbr = tb_ref(&db);
    CHECK_OK(G_->batchnorm_bwd(g_gpu, &xg, &dyg, aff ? &gg : NULL, &smg, &sig, &dxg, aff ? &dgg : NULL,
                               aff ? &dbg : NULL, (float)acc));
    CHECK_OK(R_->batchnorm_bwd(g_ref, &xr, &dyr, aff ? &gr : NULL, &smr, &sir, &dxr, aff ? &dgr : NULL,
                               aff ? &dbr : NULL, (float)acc));
    CHECK_E(&dx, ta, acc ? "bwd dx (acc 1)" : "bwd dx (acc 0)");
    if (aff) {
      CHECK_E(&dg, tp, acc ? "bwd dgamma acc 1" : "bwd dgamma acc 0");
      CHECK_E(&db, tp, acc ? "bwd dbeta acc 1" : "bwd dbeta acc 0");
    }
  }
  if (aff) {
    /* dx NULL: the parameter gradients alone (cuDNN gets a stand-in dx) */
    tb_rand(&dg, 1.0, k->pdt), tb_rand(&db, 1.0, k->pdt);
    ct_tensor dgg = tb_gpu(&dg), dbg = tb_gpu(&db), dgr = tb_ref(&dg), dbr = tb_ref(&db);
    CHECK_OK(G_->batchnorm_bwd(g_gpu, &xg, &dyg, &gg, &smg, &sig, NULL, &dgg, &dbg, 1.f));
    CHECK_OK(R_->batchnorm_bwd(g_ref, &xr, &dyr, &gr, &smr, &sir, NULL, &dgr, &dbr, 1.f));
    CHECK_E(&dg, tp, "bwd dx NULL dgamma");
    CHECK_E(&db, tp, "bwd dx NULL dbeta");
  }

  /* eval forward from fresh running statistics */
  tb_rand(&rm, 1.0, k->pdt);
  for (int64_t c = 0; c < C; c++) rv.h[c] = 0.3f + 0.2f * (float)((c * 5) % 11);
  tb_put(&rv, k->pdt);
  yg = tb_out(&y, k->dt);
  CHECK_OK(G_->batchnorm_fwd(g_gpu, 0, &xg, aff ? &gg : NULL, aff ? &bg : NULL, &rmg, &rvg, mom, k->eps, &yg, NULL,
                             NULL));
  CHECK_OK(R_->batchnorm_fwd(g_ref, 0, &xr, aff ? &gr : NULL, aff ? &br : NULL, &rmr, &rvr, mom, k->eps, &yr, NULL,
                             NULL));
  CHECK_E(&y, ta, "eval y");

  /* optional outputs: no running stats, only save_mean (cuDNN gets a
   * stand-in for save_invstd) */
  tb_rand(&sm, 1.0, k->pdt);
  smg = tb_gpu(&sm);
  yg = tb_out(&y, k->dt);
  CHECK_OK(G_->batchnorm_fwd(g_gpu, 1, &xg, aff ? &gg : NULL, aff ? &bg : NULL, NULL, NULL, mom, k->eps, &yg, &smg,
                             NULL));
  CHECK_OK(R_->batchnorm_fwd(g_ref, 1, &xr, aff ? &gr : NULL, aff ? &br : NULL, NULL, NULL, mom, k->eps, &yr, &smr,
                             NULL));
  CHECK_E(&y, ta, "train y (no running stats, no save_invstd)");
  CHECK_E(&sm, tp, "save_mean (alone)");

  tb_free(&x), tb_free(&y), tb_free(&dy), tb_free(&dx), tb_free(&g), tb_free(&b), tb_free(&rm), tb_free(&rv);
  tb_free(&sm), tb_free(&si), tb_free(&dg), tb_free(&db);
}

/* Whether the emulator offers the fused kernels for this case
 * (emu_cudnn.cpp); -1 on a GPU, where cuDNN decides. */
static int emu_fuses(const bn_case *k) {
  if (!getenv("CTRAIN_TEST_EMU")) return -1;
  const char *no = getenv("CT_EMU_BN_NO_FUSED"), *off = getenv("CTRAIN_CUDA_BN_FUSE");
  if ((no && *no && strcmp(no, "0") != 0) || (off && off[0] == '0')) return 0;
  return k->nhwc && k->dt != CT_F32 && k->shape[1] % 4 == 0;
}

/* batchnorm_act_fwd/bwd with ReLU against ref batchnorm + act. */
static void bn_act_run(const bn_case *k) {
  const int64_t C = k->shape[1];
  const double ta = tol_of(k->dt), tp = k->dt == CT_F32 ? TOL32 : 1e-3;
  const int aff = k->affine;
  char sh[64];
  snprintf(g_case, sizeof g_case, "batchnorm+relu %s %s %s affine%d", ct_shape_str(k->ndim, k->shape, sh, sizeof sh),
           ct_dtype_name(k->dt), k->nhwc ? "NHWC" : "NCHW", aff);
  tb x = tb_make(k->ndim, k->shape, k->nhwc), y = tb_make(k->ndim, k->shape, k->nhwc);
  tb dy = tb_make(k->ndim, k->shape, k->nhwc), dx = tb_make(k->ndim, k->shape, k->nhwc);
  tb g = tb_vec(C), b = tb_vec(C), rm = tb_vec(C), rv = tb_vec(C), sm = tb_vec(C), si = tb_vec(C);
  tb dg = tb_vec(C), db = tb_vec(C);
  tb_rand(&x, 1.5, k->dt), tb_rand(&dy, 1.0, k->dt);
  tb_rand(&g, 1.0, CT_F32), tb_rand(&b, 0.5, CT_F32), tb_rand(&rm, 1.0, CT_F32);
  for (int64_t c = 0; c < C; c++) rv.h[c] = 0.5f + 0.25f * (float)(c % 7);
  tb_put(&rv, CT_F32);
  ct_tensor xg = tb_gpu(&x), yg = tb_out(&y, k->dt), gg = tb_gpu(&g), bg = tb_gpu(&b), rmg = tb_gpu(&rm);
  ct_tensor rvg = tb_gpu(&rv), smg = tb_out(&sm, CT_F32), sig = tb_out(&si, CT_F32);
  ct_tensor xr = tb_ref(&x), yr = tb_ref(&y), gr = tb_ref(&g), br = tb_ref(&b), rmr = tb_ref(&rm), rvr = tb_ref(&rv);
  ct_tensor smr = tb_ref(&sm), sir = tb_ref(&si);

  const size_t rb = G_->batchnorm_act_reserve(g_gpu, CT_ACT_RELU, &xg);
  const int want = emu_fuses(k);
  if (want >= 0)
    CHECK_MSG((rb > 0) == want, "%s: reserve %zu bytes, emulator %s", g_case, rb, want ? "fuses" : "does not");
  void *res = rb ? ct_device_alloc(g_gpu, rb) : NULL;
  CHECK(!rb || res);

  CHECK_OK(G_->batchnorm_act_fwd(g_gpu, CT_ACT_RELU, &xg, aff ? &gg : NULL, aff ? &bg : NULL, &rmg, &rvg, 0.1f, 1e-5f,
                                 &yg, &smg, &sig, res, rb));
  CHECK_OK(R_->batchnorm_fwd(g_ref, 1, &xr, aff ? &gr : NULL, aff ? &br : NULL, &rmr, &rvr, 0.1f, 1e-5f, &yr, &smr,
                             &sir));
  CHECK_OK(R_->act_fwd(g_ref, CT_ACT_RELU, 0.f, &yr, &yr));
  CHECK_E(&y, ta, "train y");
  CHECK_E(&sm, tp, "save_mean");
  CHECK_E(&si, tp, "save_invstd");
  CHECK_E(&rm, tp, "running_mean");
  CHECK_E(&rv, tp, "running_var");
  int64_t zeros = 0;
  for (int64_t i = 0; i < y.n; i++) zeros += y.h[i] == 0.f;
  CHECK_MSG(zeros > y.n / 5 && zeros < y.n - y.n / 5, "%s: %lld of %lld outputs zero; the ReLU check is blind", g_case,
            (long long)zeros, (long long)y.n);

  /* backward from what the GPU saved; dy may be overwritten: fresh each time */
  tb_adopt(&sm), tb_adopt(&si);
  ct_tensor dyr = tb_ref(&dy), dxr = tb_ref(&dx);
  for (int acc = 0; acc <= 1; acc++) {
    tb_put(&dy, k->dt);
    tb_rand(&dg, 1.0, CT_F32), tb_rand(&db, 1.0, CT_F32);
    ct_tensor dyg = tb_gpu(&dy), dxg = tb_out(&dx, k->dt), dgg = tb_gpu(&dg), dbg = tb_gpu(&db);
    ct_tensor dgr = tb_ref(&dg), dbr = tb_ref(&db);
    CHECK_OK(G_->batchnorm_act_bwd(g_gpu, CT_ACT_RELU, &xg, &yg, &dyg, aff ? &gg : NULL, aff ? &bg : NULL, 1e-5f, &smg,
                                   &sig, res, rb, &dxg, aff ? &dgg : NULL, aff ? &dbg : NULL, (float)acc));
    CHECK_OK(R_->act_bwd(g_ref, CT_ACT_RELU, 0.f, NULL, &yr, &dyr, &dyr));
    CHECK_OK(R_->batchnorm_bwd(g_ref, &xr, &dyr, aff ? &gr : NULL, &smr, &sir, &dxr, aff ? &dgr : NULL,
                               aff ? &dbr : NULL, (float)acc));
    CHECK_E(&dx, ta, acc ? "bwd dx (acc 1)" : "bwd dx (acc 0)");
    if (aff) {
      CHECK_E(&dg, tp, acc ? "bwd dgamma acc 1" : "bwd dgamma acc 0");
      CHECK_E(&db, tp, acc ? "bwd dbeta acc 1" : "bwd dbeta acc 0");
    }
  }
  /* The emulator gates dy with the reserve's bits: cleared, dx must come
   * out wrong, or the checks above would not see a lost reserve. */
  if (rb && want == 1) {
    void *z = calloc(1, rb);
    CHECK(z != NULL);
    CHECK_OK(ct_device_copy(g_gpu, res, NULL, z, rb));
    free(z);
    tb_put(&dy, k->dt);
    for (int64_t i = 0; i < dy.n; i++) dy.ref[i] = y.ref[i] > 0 ? dy.ref[i] : 0;
    ct_tensor dyg = tb_gpu(&dy), dxg = tb_out(&dx, k->dt);
    CHECK_OK(G_->batchnorm_act_bwd(g_gpu, CT_ACT_RELU, &xg, &yg, &dyg, aff ? &gg : NULL, aff ? &bg : NULL, 1e-5f, &smg,
                                   &sig, res, rb, &dxg, NULL, NULL, 0.f));
    CHECK_OK(R_->batchnorm_bwd(g_ref, &xr, &dyr, aff ? &gr : NULL, &smr, &sir, &dxr, NULL, NULL, 0.f));
    double e = tb_err(&dx);
    CHECK_MSG(e > 10 * ta, "%s: a cleared reserve went unnoticed (dx err %.3g)", g_case, e);
  }
  /* batchnorm_apply with the ReLU from the saved statistics: the forward's
   * y again (it leaves the reserve alone: the backward of a recompute
   * reads the first forward's) */
  yg = tb_out(&y, k->dt);
  CHECK_OK(G_->batchnorm_apply(g_gpu, &xg, aff ? &gg : NULL, aff ? &bg : NULL, &smg, &sig, CT_ACT_RELU, 0.f, &yg));
  CHECK_OK(R_->batchnorm_apply(g_ref, &xr, aff ? &gr : NULL, aff ? &br : NULL, &smr, &sir, CT_ACT_RELU, 0.f, &yr));
  CHECK_E(&y, ta, "apply+relu y");
  if (res) ct_device_free(g_gpu, res);
  tb_free(&x), tb_free(&y), tb_free(&dy), tb_free(&dx), tb_free(&g), tb_free(&b), tb_free(&rm), tb_free(&rv);
  tb_free(&sm), tb_free(&si), tb_free(&dg), tb_free(&db);
}

/* Layouts and shapes cuda batch norm must refuse, each with a message. */
static void refusals(void) {
  tb x = tb_make(4, (int64_t[]){2, 3, 4, 5}, 1), yp = tb_make(4, (int64_t[]){2, 3, 4, 5}, 0);
  tb y = tb_make(4, (int64_t[]){2, 3, 4, 5}, 1);
  tb v = tb_make(2, (int64_t[]){6, 3}, 0), one = tb_make(4, (int64_t[]){1, 3, 1, 1}, 0);
  tb m = tb_vec(3), s = tb_vec(3);
  tb_rand(&x, 1.0, CT_F32), tb_rand(&yp, 1.0, CT_F32), tb_rand(&v, 1.0, CT_F32), tb_rand(&one, 1.0, CT_F32);
  ct_tensor xg = tb_gpu(&x), ypg = tb_gpu(&yp), yg = tb_gpu(&y), mg = tb_gpu(&m), sg = tb_gpu(&s);
  ct_status st = G_->batchnorm_fwd(g_gpu, 1, &xg, NULL, NULL, NULL, NULL, 0.1f, 1e-5f, &ypg, &mg, &sg);
  CHECK_MSG(st == CT_ERR_UNSUPPORTED && strstr(ct_last_error(), "layout"), "NHWC x, plain y: %s: %s",
            ct_status_name(st), ct_last_error());
  st = G_->batchnorm_bwd(g_gpu, &ypg, &ypg, NULL, &mg, &sg, &yg, NULL, NULL, 0.f);
  CHECK_MSG(st == CT_ERR_UNSUPPORTED && strstr(ct_last_error(), "dx"), "plain x/dy, NHWC dx: %s: %s",
            ct_status_name(st), ct_last_error());
  ct_tensor vg = tb_gpu(&v);
  vg.layout = CT_LAYOUT_NHWC;
  st = G_->batchnorm_fwd(g_gpu, 1, &vg, NULL, NULL, NULL, NULL, 0.1f, 1e-5f, &vg, &mg, &sg);
  CHECK_MSG(st == CT_ERR_UNSUPPORTED && strstr(ct_last_error(), "4-D"), "NHWC 2-D: %s: %s", ct_status_name(st),
            ct_last_error());
  ct_tensor c16 = tb_gpu(&yp), c16y = tb_gpu(&yp);
  c16.layout = c16y.layout = CT_LAYOUT_C16;
  st = G_->batchnorm_fwd(g_gpu, 1, &c16, NULL, NULL, NULL, NULL, 0.1f, 1e-5f, &c16y, &mg, &sg);
  CHECK_MSG(st == CT_ERR_UNSUPPORTED, "C16: %s: %s", ct_status_name(st), ct_last_error());
  st = G_->batchnorm_apply(g_gpu, &xg, NULL, NULL, &mg, &sg, CT_ACT_NONE, 0.f, &ypg);
  CHECK_MSG(st == CT_ERR_UNSUPPORTED && strstr(ct_last_error(), "layout"), "apply, NHWC x, plain y: %s: %s",
            ct_status_name(st), ct_last_error());
  st = G_->batchnorm_apply(g_gpu, &xg, NULL, NULL, NULL, &sg, CT_ACT_NONE, 0.f, &yg);
  CHECK_MSG(st == CT_ERR_INVALID_ARG && strstr(ct_last_error(), "save_mean"), "apply without save_mean: %s: %s",
            ct_status_name(st), ct_last_error());
  ct_tensor og = tb_gpu(&one);
  st = G_->batchnorm_fwd(g_gpu, 1, &og, NULL, NULL, NULL, NULL, 0.1f, 1e-5f, &og, &mg, &sg);
  CHECK_MSG(st == CT_ERR_INVALID_ARG, "one value per channel in training: %s: %s", ct_status_name(st),
            ct_last_error());
  tb_free(&x), tb_free(&yp), tb_free(&y), tb_free(&v), tb_free(&one), tb_free(&m), tb_free(&s);
}

int main(void) {
  gpu_test_setup(20240611);
  const ct_dtype F = CT_F32, B = CT_BF16, H = CT_F16;
  const bn_case cases[] = {
      /* f32: cuDNN SPATIAL, NCHW and NHWC */
      {4, {4, 5, 7, 9}, F, F, 0, 1, 1e-5f},
      {4, {4, 5, 7, 9}, F, F, 1, 1, 1e-5f},
      {4, {3, 6, 5, 5}, F, F, 0, 0, 1e-3f},
      {4, {3, 6, 5, 5}, F, F, 1, 0, 1e-3f},
      {2, {16, 37}, F, F, 0, 1, 1e-5f},
      {2, {16, 37}, F, F, 0, 0, 1e-5f},
      {3, {8, 12, 10}, F, F, 0, 1, 1e-5f},
      /* 16-bit activations, f32 parameters: NHWC training in PERSISTENT mode */
      {4, {8, 24, 14, 14}, B, F, 1, 1, 1e-5f},
      {4, {8, 24, 14, 14}, B, F, 0, 1, 1e-5f},
      {4, {8, 24, 14, 14}, H, F, 1, 1, 1e-5f},
      {4, {8, 24, 14, 14}, H, F, 0, 0, 1e-5f},
      {4, {4, 13, 6, 6}, H, F, 1, 1, 1e-5f},
      {4, {4, 13, 6, 6}, B, F, 1, 0, 1e-3f},
      {2, {32, 20}, B, F, 0, 1, 1e-5f},
      /* bf16 parameters: the own kernels, both layouts */
      {4, {4, 5, 7, 9}, F, B, 0, 1, 1e-5f},
      {4, {4, 5, 7, 9}, F, B, 1, 1, 1e-5f},
      {4, {4, 10, 3, 3}, B, B, 1, 0, 1e-5f},
      /* large N*H*W */
      {4, {64, 64, 56, 56}, F, F, 0, 1, 1e-5f},
      {4, {64, 64, 56, 56}, F, F, 1, 1, 1e-5f},
      {4, {64, 64, 56, 56}, B, F, 1, 1, 1e-5f},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) bn_run(&cases[i]);
  const bn_case fused[] = {
      /* cuDNN's fused kernels */
      {4, {8, 24, 14, 14}, B, F, 1, 1, 1e-5f},
      {4, {8, 24, 14, 14}, H, F, 1, 0, 1e-5f},
      {4, {16, 64, 7, 7}, B, F, 1, 1, 1e-5f},
      /* the unfused path: C not a multiple of 4, NCHW, f32 */
      {4, {4, 13, 6, 6}, H, F, 1, 1, 1e-5f},
      {4, {8, 24, 14, 14}, B, F, 0, 1, 1e-5f},
      {4, {4, 8, 7, 9}, F, F, 1, 1, 1e-5f},
  };
  for (size_t i = 0; i < sizeof fused / sizeof fused[0]; i++) bn_act_run(&fused[i]);
  refusals();
  gpu_test_teardown();
  return test_summary("test_gpu_bnorm");
}
