/* The cpu device against the reference on the same random inputs for the
 * remaining ops: pooling (padding, ceil_mode, count_include_pad; fp16
 * through the widening path too), batch
 * norm (2-D/3-D/4-D, affine or not, training/eval, accumulate; apply from
 * saved statistics, and its bits against the training forward's in every
 * layout and dtype), activations,
 * dropout (bit-identical masks), add/axpby/fill/cast, softmax, losses and
 * reductions. Metric: normwise relative error vs the f64 reference (see
 * test_cpu_common.h), fp32 tolerance 1e-5; dropout and cast must match the
 * f32 reference exactly. */
#include "op_util.h"
#include "test_cpu_common.h"

#define TOL32 1e-5

static double worst;
#define CHECK_T(t, ...)                                              \
  do {                                                               \
    double e_ = tb_err(t);                                           \
    if (e_ > worst) worst = e_;                                      \
    CHECK_MSG(e_ <= TOL32, "%s: err %.3g", cpu_case_name(__VA_ARGS__), e_); \
  } while (0)

static const pool_case pool_cases[] = {
    /* N C H W  {kh kw sh sw ph pw ceil cip} */
    {2, 3, 8, 8, {2, 2, 2, 2, 0, 0, 0, 1}},
    {2, 3, 9, 9, {3, 3, 2, 2, 1, 1, 1, 1}},  /* ceil adds a window; cip -> reference fallback for avg */
    {1, 4, 7, 10, {3, 2, 2, 1, 1, 0, 0, 1}}, /* non-square */
    {4, 32, 26, 26, {2, 2, 2, 2, 0, 0, 0, 1}},  /* torchkeras pool */
    {2, 3, 11, 5, {3, 3, 3, 3, 1, 1, 1, 1}},
    {3, 2, 10, 10, {3, 3, 3, 3, 0, 0, 1, 1}}, /* ceil, no padding */
    {1, 5, 6, 7, {2, 3, 2, 2, 1, 1, 0, 1}},
};

static void pool_one(const pool_case *c) {
  ct_pool2d_params p = c->p;
  int64_t OH = pool_out(c->H, p.kernel_h, p.stride_h, p.pad_h, p.ceil_mode);
  int64_t OW = pool_out(c->W, p.kernel_w, p.stride_w, p.pad_w, p.ceil_mode);
  tb x = TB(c->N, c->C, c->H, c->W), y = TB(c->N, c->C, OH, OW), dy = TB(c->N, c->C, OH, OW);
  tb dx = TB(c->N, c->C, c->H, c->W);
  tb_rand(&x, 1.0), tb_rand(&dy, 1.0);
  ct_tensor xc = tb_cpu(&x), yc = tb_cpu(&y), dyc = tb_cpu(&dy), dxc = tb_cpu(&dx);
  ct_tensor xr = tb_ref(&x), yr = tb_ref(&y), dyr = tb_ref(&dy), dxr = tb_ref(&dx);
  const char *fmt = "%s N%lld C%lld %lldx%lld k%dx%d s%d,%d p%d,%d ceil%d cip%d %s";
#define POOL_ARGS(kind, what)                                                                                     \
  fmt, kind, (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->W, p.kernel_h, p.kernel_w, p.stride_h, \
      p.stride_w, p.pad_h, p.pad_w, p.ceil_mode, p.count_include_pad, what

  /* max: each backend keeps its own workspace; compare y and dx */
  size_t wsc = C_->maxpool2d_workspace_bytes(g_cpu, &p, &xc, &yc);
  size_t wsr = R_->maxpool2d_workspace_bytes(g_ref, &p, &xr, &yr);
  CHECK(wsc > 0 && wsr > 0);
  void *wc = malloc(wsc + 64), *wr = malloc(wsr + 64);
  CHECK_OK(C_->maxpool2d_fwd(g_cpu, &p, &xc, &yc, wc));
  CHECK_OK(R_->maxpool2d_fwd(g_ref, &p, &xr, &yr, wr));
  CHECK_T(&y, POOL_ARGS("maxpool", "fwd"));
  CHECK_OK(C_->maxpool2d_bwd(g_cpu, &p, &dyc, wc, &dxc));
  CHECK_OK(R_->maxpool2d_bwd(g_ref, &p, &dyr, wr, &dxr));
  CHECK_T(&dx, POOL_ARGS("maxpool", "bwd"));
  /* inference (no workspace) gives the same y */
  tb_rand(&y, 1.0);
  CHECK_OK(C_->maxpool2d_fwd(g_cpu, &p, &xc, &yc, NULL));
  CHECK_OK(R_->maxpool2d_fwd(g_ref, &p, &xr, &yr, NULL));
  CHECK_T(&y, POOL_ARGS("maxpool", "fwd-inference"));
  free(wc), free(wr);

  for (int cip = 0; cip <= 1; cip++) {
    p.count_include_pad = cip;
    CHECK_OK(C_->avgpool2d_fwd(g_cpu, &p, &xc, &yc));
    CHECK_OK(R_->avgpool2d_fwd(g_ref, &p, &xr, &yr));
    CHECK_T(&y, POOL_ARGS("avgpool", "fwd"));
    CHECK_OK(C_->avgpool2d_bwd(g_cpu, &p, &dyc, &dxc));
    CHECK_OK(R_->avgpool2d_bwd(g_ref, &p, &dyr, &dxr));
    CHECK_T(&dx, POOL_ARGS("avgpool", "bwd"));
  }
  tb_free(&x), tb_free(&y), tb_free(&dy), tb_free(&dx);
}

/* n normal f16 values. */
static uint16_t *f16_rand(int64_t n) {
  uint16_t *h = malloc((size_t)n * 2);
  for (int64_t i = 0; i < n; i++) h[i] = ct_f32_to_f16((float)ct_rng_normal(&g_rng));
  return h;
}

/* ||a - b|| / ||b|| of two f16 arrays. */
static double f16_err(const uint16_t *a, const uint16_t *b, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = ct_f16_to_f32(a[i]), y = ct_f16_to_f32(b[i]);
    d += (x - y) * (x - y), r += y * y;
  }
  return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* fp16 pooling: the cpu device widens to f32 and pools with its own
 * kernels (the 2x2 tiles or oneDNN, with their workspace), the ref device
 * with the reference's; max pooling selects the same element (y equal to
 * the bit), the backward sums overlapping windows' gradients in f32 before
 * rounding (within an f16 ulp of each other), average pooling within
 * f16 rounding. */
static void pool_f16(const pool_case *c) {
  ct_pool2d_params p = c->p;
  int64_t OH = pool_out(c->H, p.kernel_h, p.stride_h, p.pad_h, p.ceil_mode);
  int64_t OW = pool_out(c->W, p.kernel_w, p.stride_w, p.pad_w, p.ceil_mode);
  int64_t nx = c->N * c->C * c->H * c->W, ny = c->N * c->C * OH * OW;
  uint16_t *x = f16_rand(nx), *dy = f16_rand(ny), *y[2], *dx[2];
  ct_tensor tx = ct_tensor_4d(x, CT_F16, c->N, c->C, c->H, c->W), tdy = ct_tensor_4d(dy, CT_F16, c->N, c->C, OH, OW);
  ct_device *dev[2] = {g_cpu, g_ref};
  const ct_backend *be[2] = {C_, R_};
  char nm[160];
  snprintf(nm, sizeof nm, "f16 pool N%lld C%lld %lldx%lld k%dx%d s%d,%d p%d,%d ceil%d", (long long)c->N,
           (long long)c->C, (long long)c->H, (long long)c->W, p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h,
           p.pad_w, p.ceil_mode);
  for (int k = 0; k < 2; k++) {
    y[k] = malloc((size_t)ny * 2), dx[k] = malloc((size_t)nx * 2);
    ct_tensor ty = ct_tensor_4d(y[k], CT_F16, c->N, c->C, OH, OW), tdx = ct_tensor_4d(dx[k], CT_F16, c->N, c->C, c->H, c->W);
    size_t ws = be[k]->maxpool2d_workspace_bytes(dev[k], &p, &tx, &ty);
    CHECK_MSG(ws > 0, "%s: no max-pool workspace", nm);
    void *w = malloc(ws + 64);
    CHECK_OK(be[k]->maxpool2d_fwd(dev[k], &p, &tx, &ty, w));
    CHECK_OK(be[k]->maxpool2d_bwd(dev[k], &p, &tdy, w, &tdx));
    free(w);
  }
  CHECK_MSG(memcmp(y[0], y[1], (size_t)ny * 2) == 0, "%s: max-pool output differs from the reference", nm);
  double e = f16_err(dx[0], dx[1], nx);
  CHECK_MSG(e <= 1e-3, "%s: max-pool dx err %.3g", nm, e);
  for (int cip = 0; cip <= 1; cip++) {
    p.count_include_pad = cip;
    for (int k = 0; k < 2; k++) {
      ct_tensor ty = ct_tensor_4d(y[k], CT_F16, c->N, c->C, OH, OW), tdx = ct_tensor_4d(dx[k], CT_F16, c->N, c->C, c->H, c->W);
      CHECK_OK(be[k]->avgpool2d_fwd(dev[k], &p, &tx, &ty));
      CHECK_OK(be[k]->avgpool2d_bwd(dev[k], &p, &tdy, &tdx));
    }
    double ey = f16_err(y[0], y[1], ny), ed = f16_err(dx[0], dx[1], nx);
    CHECK_MSG(ey <= 1e-3 && ed <= 1e-3, "%s cip%d: avg-pool err y %.3g dx %.3g", nm, cip, ey, ed);
  }
  for (int k = 0; k < 2; k++) free(y[k]), free(dx[k]);
  free(x), free(dy);
}

static void bn_one(int ndim, const int64_t *shape, int affine) {
  int64_t C = shape[1];
  tb x = tb_make(ndim, shape), y = tb_make(ndim, shape), dy = tb_make(ndim, shape), dx = tb_make(ndim, shape);
  tb g = TB(C), b = TB(C), rm = TB(C), rv = TB(C), sm = TB(C), si = TB(C), dg = TB(C), dbt = TB(C);
  tb_rand(&x, 2.0);
  for (int64_t i = 0; i < x.n; i++) x.f[i] += 0.5f * (float)(i % 3); /* non-zero means */
  tb_sync(&x);
  tb_rand(&dy, 1.0), tb_rand(&g, 1.0), tb_rand(&b, 1.0), tb_rand(&rm, 1.0);
  for (int64_t i = 0; i < C; i++) rv.f[i] = 0.5f + (float)i * 0.25f;
  tb_sync(&rv);
  char nm[96], sh[48];
  snprintf(nm, sizeof nm, "batchnorm %s affine%d", ct_shape_str(ndim, shape, sh, sizeof sh), affine);
  ct_tensor xc = tb_cpu(&x), yc = tb_cpu(&y), gc = tb_cpu(&g), bc = tb_cpu(&b), rmc = tb_cpu(&rm), rvc = tb_cpu(&rv);
  ct_tensor smc = tb_cpu(&sm), sic = tb_cpu(&si);
  ct_tensor xr = tb_ref(&x), yr = tb_ref(&y), gr = tb_ref(&g), br = tb_ref(&b), rmr = tb_ref(&rm), rvr = tb_ref(&rv);
  ct_tensor smr = tb_ref(&sm), sir = tb_ref(&si);
  const float mom = 0.1f, eps = 1e-5f;
  CHECK_OK(C_->batchnorm_fwd(g_cpu, 1, &xc, affine ? &gc : NULL, affine ? &bc : NULL, &rmc, &rvc, mom, eps, &yc, &smc,
                             &sic));
  CHECK_OK(R_->batchnorm_fwd(g_ref, 1, &xr, affine ? &gr : NULL, affine ? &br : NULL, &rmr, &rvr, mom, eps, &yr, &smr,
                             &sir));
  CHECK_T(&y, "%s train y", nm);
  CHECK_T(&sm, "%s save_mean", nm);
  CHECK_T(&si, "%s save_invstd", nm);
  CHECK_T(&rm, "%s running_mean", nm);
  CHECK_T(&rv, "%s running_var", nm);
  /* batchnorm_apply from the saved statistics: the training y again, to
   * the bit on the cpu, and within the tolerance of the reference's */
  {
    tb y2 = tb_make(ndim, shape);
    ct_tensor y2c = tb_cpu(&y2), y2r = tb_ref(&y2);
    CHECK_OK(C_->batchnorm_apply(g_cpu, &xc, affine ? &gc : NULL, affine ? &bc : NULL, &smc, &sic, CT_ACT_NONE, 0.f,
                                 &y2c));
    CHECK_MSG(memcmp(y2.f, y.f, (size_t)y.n * 4) == 0, "%s apply: not the training forward's bits", nm);
    CHECK_OK(R_->batchnorm_apply(g_ref, &xr, affine ? &gr : NULL, affine ? &br : NULL, &smr, &sir, CT_ACT_NONE, 0.f,
                                 &y2r));
    CHECK_T(&y2, "%s apply y", nm);
    tb_free(&y2);
  }
  for (int acc = 0; acc <= 1; acc++) {
    tb_rand(&dg, 1.0), tb_rand(&dbt, 1.0);
    ct_tensor dyc = tb_cpu(&dy), dxc = tb_cpu(&dx), dgc = tb_cpu(&dg), dbc = tb_cpu(&dbt);
    ct_tensor dyr = tb_ref(&dy), dxr = tb_ref(&dx), dgr = tb_ref(&dg), dbr = tb_ref(&dbt);
    CHECK_OK(C_->batchnorm_bwd(g_cpu, &xc, &dyc, affine ? &gc : NULL, &smc, &sic, &dxc, affine ? &dgc : NULL,
                               affine ? &dbc : NULL, (float)acc));
    CHECK_OK(R_->batchnorm_bwd(g_ref, &xr, &dyr, affine ? &gr : NULL, &smr, &sir, &dxr, affine ? &dgr : NULL,
                               affine ? &dbr : NULL, (float)acc));
    CHECK_T(&dx, "%s bwd dx acc%d", nm, acc);
    if (affine) {
      CHECK_T(&dg, "%s bwd dgamma acc%d", nm, acc);
      CHECK_T(&dbt, "%s bwd dbeta acc%d", nm, acc);
    }
  }
  /* eval with the (updated) running statistics */
  CHECK_OK(C_->batchnorm_fwd(g_cpu, 0, &xc, affine ? &gc : NULL, affine ? &bc : NULL, &rmc, &rvc, mom, eps, &yc, NULL,
                             NULL));
  CHECK_OK(R_->batchnorm_fwd(g_ref, 0, &xr, affine ? &gr : NULL, affine ? &br : NULL, &rmr, &rvr, mom, eps, &yr, NULL,
                             NULL));
  CHECK_T(&y, "%s eval y", nm);
  tb_free(&x), tb_free(&y), tb_free(&dy), tb_free(&dx), tb_free(&g), tb_free(&b), tb_free(&rm), tb_free(&rv);
  tb_free(&sm), tb_free(&si), tb_free(&dg), tb_free(&dbt);
}

/* batchnorm_apply from a training forward's saved statistics gives that
 * forward's output (and its act_fwd in place) to the bit, in every
 * layout and dtype the cpu keeps between layers and through the
 * reference's widening path: what lets a recompute rebuild a dropped
 * batch-norm output without changing the step (test_recompute). */
static void bn_apply_bits(void) {
  const ct_layout lays[] = {CT_LAYOUT_PLAIN, CT_LAYOUT_C16, CT_LAYOUT_C8, CT_LAYOUT_NHWC};
  const ct_dtype dts[] = {CT_F32, CT_BF16, CT_F16};
  const int64_t shape[4] = {3, 32, 5, 6}, C = shape[1], n = 3 * 32 * 5 * 6;
  float *g = malloc(C * 4), *b = malloc(C * 4), *st = malloc(6 * C * 4);
  void *x = malloc(n * 4), *y1 = malloc(n * 4), *y2 = malloc(n * 4);
  CHECK(g && b && st && x && y1 && y2);
  for (int64_t c = 0; c < C; c++) g[c] = (float)ct_rng_normal(&g_rng), b[c] = (float)ct_rng_normal(&g_rng);
  for (size_t li = 0; li < sizeof lays / sizeof lays[0]; li++)
    for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++)
      for (int act = 0; act <= 1; act++) {
        const ct_dtype dt = dts[di];
        if (dt == CT_F16 && lays[li] != CT_LAYOUT_PLAIN) continue; /* the cpu keeps f16 plain only */
        for (int64_t i = 0; i < n; i++) {
          float v = (float)(ct_rng_normal(&g_rng) * 2.0 + 0.3 * (double)(i % 5));
          if (dt == CT_F32) ((float *)x)[i] = v;
          else ((uint16_t *)x)[i] = dt == CT_BF16 ? ct_f32_to_bf16(v) : ct_f32_to_f16(v);
        }
        for (int64_t c = 0; c < C; c++) st[2 * C + c] = 0.f, st[3 * C + c] = 1.f;
        ct_tensor xt = ct_tensor_view(x, dt, 4, shape), t1 = ct_tensor_view(y1, dt, 4, shape);
        ct_tensor t2 = ct_tensor_view(y2, dt, 4, shape), gt = ct_tensor_1d(g, CT_F32, C), bt = ct_tensor_1d(b, CT_F32, C);
        ct_tensor sm = ct_tensor_1d(st, CT_F32, C), si = ct_tensor_1d(st + C, CT_F32, C);
        ct_tensor rm = ct_tensor_1d(st + 2 * C, CT_F32, C), rv = ct_tensor_1d(st + 3 * C, CT_F32, C);
        xt.layout = t1.layout = t2.layout = lays[li];
        const ct_act a = act ? CT_ACT_RELU : CT_ACT_NONE;
        CHECK_OK(C_->batchnorm_fwd(g_cpu, 1, &xt, &gt, &bt, &rm, &rv, 0.1f, 1e-5f, &t1, &sm, &si));
        if (act) CHECK_OK(C_->act_fwd(g_cpu, a, 0.f, &t1, &t1));
        CHECK_OK(C_->batchnorm_apply(g_cpu, &xt, &gt, &bt, &sm, &si, a, 0.f, &t2));
        CHECK_MSG(memcmp(y1, y2, (size_t)n * ct_dtype_size(dt)) == 0,
                  "batchnorm_apply layout %d %s act %d: not the training forward's bits", (int)lays[li],
                  ct_dtype_name(dt), act);
      }
  free(g), free(b), free(st), free(x), free(y1), free(y2);
}

static void act_all(int64_t n) {
  tb x = TB(3, n), y = TB(3, n), dy = TB(3, n), dx = TB(3, n);
  tb_rand(&x, 3.0), tb_rand(&dy, 1.0);
  for (int a = 0; a < CT_ACT_COUNT; a++) {
    float alpha = 0.13f;
    ct_tensor xc = tb_cpu(&x), yc = tb_cpu(&y), dyc = tb_cpu(&dy), dxc = tb_cpu(&dx);
    ct_tensor xr = tb_ref(&x), yr = tb_ref(&y), dyr = tb_ref(&dy), dxr = tb_ref(&dx);
    CHECK_OK(C_->act_fwd(g_cpu, (ct_act)a, alpha, &xc, &yc));
    CHECK_OK(R_->act_fwd(g_ref, (ct_act)a, alpha, &xr, &yr));
    CHECK_T(&y, "act %d fwd n=%lld", a, (long long)n);
    /* pass only what the activation's backward is documented to read */
    int nx = CT_ACT_BWD_NEEDS_X(a), ny = CT_ACT_BWD_NEEDS_Y(a);
    CHECK_OK(C_->act_bwd(g_cpu, (ct_act)a, alpha, nx ? &xc : NULL, ny ? &yc : NULL, &dyc, &dxc));
    CHECK_OK(R_->act_bwd(g_ref, (ct_act)a, alpha, nx ? &xr : NULL, ny ? &yr : NULL, &dyr, &dxr));
    CHECK_T(&dx, "act %d bwd n=%lld", a, (long long)n);
  }
  tb_free(&x), tb_free(&y), tb_free(&dy), tb_free(&dx);
}

/* off, stride: the samples are numbers off + i x stride of a larger
 * batch (data parallel); 0, 0: the whole batch. */
static void dropout_one(int64_t N, int64_t C, int64_t HW, int by_channel, float p, uint32_t step, uint64_t off,
                        uint64_t stride) {
  tb x = TB(N, C, HW), y = TB(N, C, HW), dx = TB(N, C, HW);
  tb_rand(&x, 1.0);
  int64_t group = by_channel ? HW : 1;
  ct_dropout_key key = {0x1234567890abcdefull, 3, step, off, stride, C * HW / group};
  ct_tensor xc = tb_cpu(&x), yc = tb_cpu(&y), dxc = tb_cpu(&dx);
  ct_tensor xr = tb_ref32(&x), yr = tb_ref32(&y), dxr = tb_ref32(&dx);
  CHECK_OK(C_->dropout_fwd(g_cpu, p, group, key, &xc, &yc));
  CHECK_OK(R_->dropout_fwd(g_ref, p, group, key, &xr, &yr));
  int64_t bad = tb_diff_exact(&y), zeros = 0;
  for (int64_t i = 0; i < y.n; i++) zeros += y.f[i] == 0.f;
  CHECK_MSG(bad == 0, "dropout fwd %lldx%lldx%lld group %lld p %g: %lld elements differ", (long long)N, (long long)C,
            (long long)HW, (long long)group, p, (long long)bad);
  /* the mask is not trivial: about p of the elements are dropped */
  CHECK_MSG(fabs((double)zeros / (double)y.n - p) < 0.1 + 2.0 / sqrt((double)(y.n / group)),
            "dropout drop fraction %g for p %g", (double)zeros / (double)y.n, p);
  CHECK_OK(C_->dropout_bwd(g_cpu, p, group, key, &xc, &dxc));
  CHECK_OK(R_->dropout_bwd(g_ref, p, group, key, &xr, &dxr));
  bad = tb_diff_exact(&dx);
  CHECK_MSG(bad == 0, "dropout bwd: %lld elements differ", (long long)bad);
  tb_free(&x), tb_free(&y), tb_free(&dx);
}

static void misc_elementwise(int64_t n) {
  tb a = TB(n), b = TB(n), y = TB(n);
  tb_rand(&a, 1.0), tb_rand(&b, 1.0), tb_rand(&y, 1.0);
  ct_tensor ac = tb_cpu(&a), bc = tb_cpu(&b), yc = tb_cpu(&y), ar = tb_ref(&a), br = tb_ref(&b), yr = tb_ref(&y);
  CHECK_OK(C_->add(g_cpu, &ac, &bc, CT_ACT_NONE, &yc));
  CHECK_OK(R_->add(g_ref, &ar, &br, CT_ACT_NONE, &yr));
  CHECK_T(&y, "add n=%lld", (long long)n);
  CHECK_OK(C_->add(g_cpu, &ac, &bc, CT_ACT_RELU, &yc));
  CHECK_OK(R_->add(g_ref, &ar, &br, CT_ACT_RELU, &yr));
  CHECK_T(&y, "add + ReLU n=%lld", (long long)n);
  CHECK_OK(C_->axpby(g_cpu, 0.7f, &ac, 1.3f, &yc));
  CHECK_OK(R_->axpby(g_ref, 0.7f, &ar, 1.3f, &yr));
  CHECK_T(&y, "axpby beta 1.3 n=%lld", (long long)n);
  y.f[0] = NAN; /* beta 0 must overwrite, not multiply, stale values */
  y.d[0] = NAN;
  CHECK_OK(C_->axpby(g_cpu, -2.f, &ac, 0.f, &yc));
  CHECK_OK(R_->axpby(g_ref, -2.f, &ar, 0.f, &yr));
  CHECK_T(&y, "axpby beta 0 n=%lld", (long long)n);
  CHECK_OK(C_->fill(g_cpu, &yc, 0.375f));
  CHECK_OK(R_->fill(g_ref, &yr, 0.375f));
  CHECK_T(&y, "fill n=%lld", (long long)n);
  /* cast f32 -> bf16 -> f32 against the scalar conversion, and f32 -> f64
   * against the reference */
  uint16_t *h = malloc((size_t)n * 2);
  ct_tensor hc = ct_tensor_1d(h, CT_BF16, n);
  CHECK_OK(C_->cast(g_cpu, &ac, &hc));
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += h[i] != ct_f32_to_bf16(a.f[i]);
  CHECK_MSG(bad == 0, "cast f32->bf16: %lld differ", (long long)bad);
  CHECK_OK(C_->cast(g_cpu, &hc, &yc));
  bad = 0;
  for (int64_t i = 0; i < n; i++) bad += y.f[i] != ct_bf16_to_f32(h[i]);
  CHECK_MSG(bad == 0, "cast bf16->f32: %lld differ", (long long)bad);
  double *dd = malloc((size_t)n * 8), *dr = malloc((size_t)n * 8);
  ct_tensor ddc = ct_tensor_1d(dd, CT_F64, n), ddr = ct_tensor_1d(dr, CT_F64, n), ar32 = tb_ref32(&a);
  CHECK_OK(C_->cast(g_cpu, &ac, &ddc));
  CHECK_OK(R_->cast(g_ref, &ar32, &ddr));
  CHECK(memcmp(dd, dr, (size_t)n * 8) == 0);
  free(h), free(dd), free(dr);
  tb_free(&a), tb_free(&b), tb_free(&y);
}

static void softmax_loss(int64_t N, int64_t C) {
  tb x = TB(N, C), y = TB(N, C), dy = TB(N, C), dx = TB(N, C), loss = TB(1), tg = TB(N, C);
  tb_rand(&x, 2.0), tb_rand(&dy, 1.0), tb_rand(&tg, 1.0);
  int64_t *t = malloc((size_t)N * 8);
  for (int64_t i = 0; i < N; i++) t[i] = ct_rng_below(&g_rng, (uint32_t)C);
  ct_tensor tt = ct_tensor_1d(t, CT_I64, N);
  ct_tensor xc = tb_cpu(&x), yc = tb_cpu(&y), dyc = tb_cpu(&dy), dxc = tb_cpu(&dx), lc = tb_cpu(&loss), tgc = tb_cpu(&tg);
  ct_tensor xr = tb_ref(&x), yr = tb_ref(&y), dyr = tb_ref(&dy), dxr = tb_ref(&dx), lr = tb_ref(&loss), tgr = tb_ref(&tg);
  for (int lg = 0; lg <= 1; lg++) {
    CHECK_OK(C_->softmax_fwd(g_cpu, lg, &xc, &yc));
    CHECK_OK(R_->softmax_fwd(g_ref, lg, &xr, &yr));
    CHECK_T(&y, "softmax log%d %lldx%lld fwd", lg, (long long)N, (long long)C);
    /* feed the same y to both backwards so only the backward is compared */
    memcpy(y.rf, y.f, (size_t)y.n * 4);
    for (int64_t i = 0; i < y.n; i++) y.d[i] = y.f[i];
    CHECK_OK(C_->softmax_bwd(g_cpu, lg, &yc, &dyc, &dxc));
    CHECK_OK(R_->softmax_bwd(g_ref, lg, &yr, &dyr, &dxr));
    CHECK_T(&dx, "softmax log%d %lldx%lld bwd", lg, (long long)N, (long long)C);
  }
  for (int k = 0; k < 2; k++) {
    float ls = k ? 0.1f : 0.f, gs = k ? 128.f : 1.f;
    CHECK_OK(C_->cross_entropy_fwd(g_cpu, &xc, &tt, ls, &lc));
    CHECK_OK(R_->cross_entropy_fwd(g_ref, &xr, &tt, ls, &lr));
    CHECK_T(&loss, "cross_entropy ls %g %lldx%lld fwd", ls, (long long)N, (long long)C);
    CHECK_OK(C_->cross_entropy_bwd(g_cpu, &xc, &tt, ls, gs, &dxc));
    CHECK_OK(R_->cross_entropy_bwd(g_ref, &xr, &tt, ls, gs, &dxr));
    CHECK_T(&dx, "cross_entropy ls %g scale %g %lldx%lld bwd", ls, gs, (long long)N, (long long)C);
    CHECK_OK(C_->nll_fwd(g_cpu, &xc, &tt, &lc));
    CHECK_OK(R_->nll_fwd(g_ref, &xr, &tt, &lr));
    CHECK_T(&loss, "nll %lldx%lld fwd", (long long)N, (long long)C);
    CHECK_OK(C_->nll_bwd(g_cpu, &tt, gs, &dxc));
    CHECK_OK(R_->nll_bwd(g_ref, &tt, gs, &dxr));
    CHECK_T(&dx, "nll scale %g bwd", gs);
    CHECK_OK(C_->mse_fwd(g_cpu, &xc, &tgc, &lc));
    CHECK_OK(R_->mse_fwd(g_ref, &xr, &tgr, &lr));
    CHECK_T(&loss, "mse %lldx%lld fwd", (long long)N, (long long)C);
    CHECK_OK(C_->mse_bwd(g_cpu, &xc, &tgc, gs, &dxc));
    CHECK_OK(R_->mse_bwd(g_ref, &xr, &tgr, gs, &dxr));
    CHECK_T(&dx, "mse scale %g bwd", gs);
  }
  double sc = 0, sr = 0;
  CHECK_OK(C_->sumsq(g_cpu, &xc, &sc));
  CHECK_OK(R_->sumsq(g_ref, &xr, &sr));
  CHECK_MSG(fabs(sc - sr) <= 1e-12 * sr, "sumsq %.17g vs %.17g", sc, sr);
  for (int k = 0; k < 3; k++) {
    float saved = x.f[N * C / 2];
    if (k == 1) x.f[N * C / 2] = INFINITY;
    if (k == 2) x.f[N * C / 2] = NAN;
    memcpy(x.rf, x.f, (size_t)x.n * 4);
    ct_tensor xr32 = tb_ref32(&x);
    int oc = -1, orf = -1;
    CHECK_OK(C_->nonfinite(g_cpu, &xc, &oc));
    CHECK_OK(R_->nonfinite(g_ref, &xr32, &orf));
    CHECK_MSG(oc == (k != 0) && oc == orf, "nonfinite case %d: cpu %d ref %d", k, oc, orf);
    x.f[N * C / 2] = saved;
  }
  free(t);
  tb_free(&x), tb_free(&y), tb_free(&dy), tb_free(&dx), tb_free(&loss), tb_free(&tg);
}

int main(void) {
  cpu_test_setup(7);
  if (!R_->maxpool2d_fwd || !R_->batchnorm_fwd || !R_->dropout_fwd || !R_->softmax_fwd) {
    fprintf(stderr, "reference backend incomplete: skipping\n");
    return 77;
  }
  for (size_t i = 0; i < sizeof pool_cases / sizeof pool_cases[0]; i++) pool_one(&pool_cases[i]), pool_f16(&pool_cases[i]);
  const int64_t s2[] = {8, 5}, s3[] = {4, 3, 7}, s4[] = {3, 4, 5, 6}, s4b[] = {1, 2, 3, 3}, s4c[] = {16, 32, 13, 13};
  for (int affine = 0; affine <= 1; affine++) {
    bn_one(2, s2, affine);
    bn_one(3, s3, affine);
    bn_one(4, s4, affine);
    bn_one(4, s4b, affine);
    bn_one(4, s4c, affine);
  }
  bn_apply_bits();
  act_all(101);
  act_all(40000); /* takes the parallel path */
  dropout_one(2, 3, 49, 0, 0.3f, 1, 0, 0);
  dropout_one(2, 3, 49, 1, 0.5f, 2, 0, 0);
  dropout_one(3, 101, 333, 0, 0.2f, 7, 0, 0); /* 100899 elements: parallel, not a multiple of 4 */
  dropout_one(4, 64, 169, 1, 0.25f, 9, 0, 0);
  /* A rank's share of a global batch: masks by sample number. */
  dropout_one(3, 101, 333, 0, 0.2f, 7, 1, 2);
  dropout_one(4, 64, 169, 1, 0.25f, 9, 5, 3);
  misc_elementwise(7);
  misc_elementwise(100003);
  softmax_loss(5, 10);
  softmax_loss(64, 1000);
  printf("worst normwise relative error: %.3g\n", worst);
  cpu_test_teardown();
  return test_summary("test_cpu_ops_vs_ref");
}
