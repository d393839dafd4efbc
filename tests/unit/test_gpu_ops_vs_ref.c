/* The cuda device against the reference on the same random inputs for the
 * ops besides conv/linear/matmul: pooling (padding, ceil_mode,
 * count_include_pad), adaptive pooling, batch norm (2-D/3-D/4-D, affine or
 * not, training/eval, accumulate), activations, dropout (bit-identical
 * masks from the same Philox stream), add/axpby/fill/cast, softmax, losses
 * (result in a device tensor) and the sumsq/nonfinite reductions; f32 with
 * tolerance 1e-5 (normwise relative error vs the f64 reference), plus
 * bf16- and f16-storage passes over the elementwise ops at 1e-2; sumsq 1e-10 relative
 * (double sums in another order). 16-bit pooling, NHWC pooling, 16-bit
 * logits and int32 targets: test_gpu_ops2.c. Skipped (77) without a GPU. */
#include <stdarg.h>

#include "test_gpu_common.h"

#define TOL32 1e-5
#define TOL16 1e-2

static double worst;
#define CHECK_T(t, tol, ...)                                                     \
  do {                                                                           \
    double e_ = gb_err(t);                                                       \
    if ((tol) <= TOL32 && e_ > worst) worst = e_;                                \
    CHECK_MSG(e_ <= (tol), "%s: err %.3g", case_name(__VA_ARGS__), e_);           \
  } while (0)




static const pool_case pool_cases[] = {
    {2, 3, 8, 8, {2, 2, 2, 2, 0, 0, 0, 1}},    {2, 3, 9, 9, {3, 3, 2, 2, 1, 1, 1, 1}},
    {1, 4, 7, 10, {3, 2, 2, 1, 1, 0, 0, 1}},   {4, 32, 26, 26, {2, 2, 2, 2, 0, 0, 0, 1}},
    {2, 3, 11, 5, {3, 3, 3, 3, 1, 1, 1, 1}},   {3, 2, 10, 10, {3, 3, 3, 3, 0, 0, 1, 1}},
    {1, 5, 6, 7, {2, 3, 2, 2, 1, 1, 0, 1}},    {2, 4, 13, 13, {3, 3, 1, 1, 1, 1, 0, 1}}, /* overlapping windows */
    /* Max pooling's workspace: window offsets in one byte up to 254
     * elements (14x18, ceil_mode), in int32 from 255 (15x17). */
    {2, 3, 16, 20, {14, 18, 2, 2, 0, 1, 1, 1}}, {2, 3, 20, 20, {15, 17, 5, 3, 1, 2, 0, 1}},
};

static void pool_one(const pool_case *c) {
  ct_pool2d_params p = c->p;
  int64_t OH = pool_out(c->H, p.kernel_h, p.stride_h, p.pad_h, p.ceil_mode);
  int64_t OW = pool_out(c->W, p.kernel_w, p.stride_w, p.pad_w, p.ceil_mode);
  gb x = GB(c->N, c->C, c->H, c->W), y = GB(c->N, c->C, OH, OW), dy = GB(c->N, c->C, OH, OW);
  gb dx = GB(c->N, c->C, c->H, c->W);
  gb_rand(&x, 1.0, CT_F32), gb_rand(&dy, 1.0, CT_F32);
  ct_tensor xg = gb_gpu(&x), yg = gb_gpu(&y), dyg = gb_gpu(&dy), dxg = gb_gpu(&dx);
  ct_tensor xr = gb_ref(&x), yr = gb_ref(&y), dyr = gb_ref(&dy), dxr = gb_ref(&dx);
  const char *fmt = "%s N%lld C%lld %lldx%lld k%dx%d s%d,%d p%d,%d ceil%d %s";
#define PA(kind, what)                                                                                           \
  fmt, kind, (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->W, p.kernel_h, p.kernel_w, p.stride_h, \
      p.stride_w, p.pad_h, p.pad_w, p.ceil_mode, what
  size_t wsg = G_->maxpool2d_workspace_bytes(g_gpu, &p, &xg, &yg);
  size_t wsr = R_->maxpool2d_workspace_bytes(g_ref, &p, &xr, &yr);
  void *wg = ct_device_alloc(g_gpu, wsg + 64), *wr = malloc(wsr + 64);
  CHECK_OK(G_->maxpool2d_fwd(g_gpu, &p, &xg, &yg, wg));
  CHECK_OK(R_->maxpool2d_fwd(g_ref, &p, &xr, &yr, wr));
  CHECK_T(&y, TOL32, PA("maxpool", "fwd"));
  CHECK_OK(G_->maxpool2d_bwd(g_gpu, &p, &dyg, wg, &dxg));
  CHECK_OK(R_->maxpool2d_bwd(g_ref, &p, &dyr, wr, &dxr));
  CHECK_T(&dx, TOL32, PA("maxpool", "bwd"));
  CHECK_OK(G_->fill(g_gpu, &yg, 7.f));
  CHECK_OK(G_->maxpool2d_fwd(g_gpu, &p, &xg, &yg, NULL));
  CHECK_T(&y, TOL32, PA("maxpool", "fwd-inference"));
  ct_device_free(g_gpu, wg);
  free(wr);
  for (int cip = 0; cip <= 1; cip++) {
    p.count_include_pad = cip;
    CHECK_OK(G_->avgpool2d_fwd(g_gpu, &p, &xg, &yg));
    CHECK_OK(R_->avgpool2d_fwd(g_ref, &p, &xr, &yr));
    CHECK_T(&y, TOL32, PA("avgpool", cip ? "fwd cip" : "fwd"));
    CHECK_OK(G_->avgpool2d_bwd(g_gpu, &p, &dyg, &dxg));
    CHECK_OK(R_->avgpool2d_bwd(g_ref, &p, &dyr, &dxr));
    CHECK_T(&dx, TOL32, PA("avgpool", cip ? "bwd cip" : "bwd"));
  }
  gb_free(&x), gb_free(&y), gb_free(&dy), gb_free(&dx);
}

static void adaptive_one(int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  gb x = GB(N, C, H, W), y = GB(N, C, OH, OW), dy = GB(N, C, OH, OW), dx = GB(N, C, H, W);
  gb_rand(&x, 1.0, CT_F32), gb_rand(&dy, 1.0, CT_F32);
  ct_tensor xg = gb_gpu(&x), yg = gb_gpu(&y), dyg = gb_gpu(&dy), dxg = gb_gpu(&dx);
  ct_tensor xr = gb_ref(&x), yr = gb_ref(&y), dyr = gb_ref(&dy), dxr = gb_ref(&dx);
  CHECK_OK(G_->adaptive_avgpool2d_fwd(g_gpu, &xg, &yg));
  CHECK_OK(R_->adaptive_avgpool2d_fwd(g_ref, &xr, &yr));
  CHECK_T(&y, TOL32, "adaptive avg %lldx%lld -> %lldx%lld fwd", (long long)H, (long long)W, (long long)OH, (long long)OW);
  CHECK_OK(G_->adaptive_avgpool2d_bwd(g_gpu, &dyg, &dxg));
  CHECK_OK(R_->adaptive_avgpool2d_bwd(g_ref, &dyr, &dxr));
  CHECK_T(&dx, TOL32, "adaptive avg %lldx%lld -> %lldx%lld bwd", (long long)H, (long long)W, (long long)OH, (long long)OW);
  int32_t *ig = ct_device_alloc(g_gpu, (size_t)y.n * 4), *ir = malloc((size_t)y.n * 4);
  CHECK_OK(G_->adaptive_maxpool2d_fwd(g_gpu, &xg, &yg, ig));
  CHECK_OK(R_->adaptive_maxpool2d_fwd(g_ref, &xr, &yr, ir));
  CHECK_T(&y, TOL32, "adaptive max %lldx%lld -> %lldx%lld fwd", (long long)H, (long long)W, (long long)OH, (long long)OW);
  CHECK_OK(G_->adaptive_maxpool2d_bwd(g_gpu, &dyg, ig, &dxg));
  CHECK_OK(R_->adaptive_maxpool2d_bwd(g_ref, &dyr, ir, &dxr));
  CHECK_T(&dx, TOL32, "adaptive max %lldx%lld -> %lldx%lld bwd", (long long)H, (long long)W, (long long)OH, (long long)OW);
  ct_device_free(g_gpu, ig);
  free(ir);
  gb_free(&x), gb_free(&y), gb_free(&dy), gb_free(&dx);
}

static void bn_one(int ndim, const int64_t *shape, int affine) {
  int64_t C = shape[1];
  gb x = gb_make(ndim, shape), y = gb_make(ndim, shape), dy = gb_make(ndim, shape), dx = gb_make(ndim, shape);
  gb g = GB(C), b = GB(C), rm = GB(C), rv = GB(C), sm = GB(C), si = GB(C), dg = GB(C), dbt = GB(C);
  for (int64_t i = 0; i < x.n; i++) x.f[i] = (float)(ct_rng_normal(&g_rng) * 2.0) + 0.5f * (float)(i % 3);
  gb_put(&x, CT_F32);
  gb_rand(&dy, 1.0, CT_F32), gb_rand(&g, 1.0, CT_F32), gb_rand(&b, 1.0, CT_F32), gb_rand(&rm, 1.0, CT_F32);
  for (int64_t i = 0; i < C; i++) rv.f[i] = 0.5f + (float)i * 0.25f;
  gb_put(&rv, CT_F32);
  char nm[96], sh[48];
  snprintf(nm, sizeof nm, "batchnorm %s affine%d", ct_shape_str(ndim, shape, sh, sizeof sh), affine);
  ct_tensor xg = gb_gpu(&x), yg = gb_gpu(&y), gg = gb_gpu(&g), bg = gb_gpu(&b), rmg = gb_gpu(&rm), rvg = gb_gpu(&rv);
  ct_tensor smg = gb_gpu(&sm), sig = gb_gpu(&si);
  ct_tensor xr = gb_ref(&x), yr = gb_ref(&y), gr = gb_ref(&g), br = gb_ref(&b), rmr = gb_ref(&rm), rvr = gb_ref(&rv);
  ct_tensor smr = gb_ref(&sm), sir = gb_ref(&si);
  const float mom = 0.1f, eps = 1e-5f;
  CHECK_OK(G_->batchnorm_fwd(g_gpu, 1, &xg, affine ? &gg : NULL, affine ? &bg : NULL, &rmg, &rvg, mom, eps, &yg, &smg,
                             &sig));
  CHECK_OK(R_->batchnorm_fwd(g_ref, 1, &xr, affine ? &gr : NULL, affine ? &br : NULL, &rmr, &rvr, mom, eps, &yr, &smr,
                             &sir));
  CHECK_T(&y, TOL32, "%s train y", nm);
  CHECK_T(&sm, TOL32, "%s save_mean", nm);
  CHECK_T(&si, TOL32, "%s save_invstd", nm);
  CHECK_T(&rm, TOL32, "%s running_mean", nm);
  CHECK_T(&rv, TOL32, "%s running_var", nm);
  /* the backward reads the saved stats: give both sides the same values */
  gb_put(&sm, CT_F32), gb_put(&si, CT_F32), gb_put(&rm, CT_F32), gb_put(&rv, CT_F32);
  for (int acc = 0; acc <= 1; acc++) {
    gb_rand(&dg, 1.0, CT_F32), gb_rand(&dbt, 1.0, CT_F32);
    ct_tensor dyg = gb_gpu(&dy), dxg = gb_gpu(&dx), dgg = gb_gpu(&dg), dbg = gb_gpu(&dbt);
    ct_tensor dyr = gb_ref(&dy), dxr = gb_ref(&dx), dgr = gb_ref(&dg), dbr = gb_ref(&dbt);
    CHECK_OK(G_->batchnorm_bwd(g_gpu, &xg, &dyg, affine ? &gg : NULL, &smg, &sig, &dxg, affine ? &dgg : NULL,
                               affine ? &dbg : NULL, (float)acc));
    CHECK_OK(R_->batchnorm_bwd(g_ref, &xr, &dyr, affine ? &gr : NULL, &smr, &sir, &dxr, affine ? &dgr : NULL,
                               affine ? &dbr : NULL, (float)acc));
    CHECK_T(&dx, TOL32, "%s bwd dx acc%d", nm, acc);
    if (affine) {
      CHECK_T(&dg, TOL32, "%s bwd dgamma acc%d", nm, acc);
      CHECK_T(&dbt, TOL32, "%s bwd dbeta acc%d", nm, acc);
    }
  }
  CHECK_OK(G_->batchnorm_fwd(g_gpu, 0, &xg, affine ? &gg : NULL, affine ? &bg : NULL, &rmg, &rvg, mom, eps, &yg, NULL,
                             NULL));
  CHECK_OK(R_->batchnorm_fwd(g_ref, 0, &xr, affine ? &gr : NULL, affine ? &br : NULL, &rmr, &rvr, mom, eps, &yr, NULL,
                             NULL));
  CHECK_T(&y, TOL32, "%s eval y", nm);
  gb_free(&x), gb_free(&y), gb_free(&dy), gb_free(&dx), gb_free(&g), gb_free(&b), gb_free(&rm), gb_free(&rv);
  gb_free(&sm), gb_free(&si), gb_free(&dg), gb_free(&dbt);
}

/* dt: storage of inputs and outputs on the GPU. */
static void act_all(int64_t n, ct_dtype dt) {
  double tol = dt == CT_F32 ? TOL32 : TOL16;
  gb x = GB(3, n), y = GB(3, n), dy = GB(3, n), dx = GB(3, n);
  gb_rand(&x, 3.0, dt), gb_rand(&dy, 1.0, dt);
  for (int a = 0; a < CT_ACT_COUNT; a++) {
    float alpha = 0.13f;
    ct_tensor xg = gb_gpu(&x), yg = gb_out(&y, dt), dyg = gb_gpu(&dy), dxg = gb_out(&dx, dt);
    ct_tensor xr = gb_ref(&x), yr = gb_ref(&y), dyr = gb_ref(&dy), dxr = gb_ref(&dx);
    CHECK_OK(G_->act_fwd(g_gpu, (ct_act)a, alpha, &xg, &yg));
    CHECK_OK(R_->act_fwd(g_ref, (ct_act)a, alpha, &xr, &yr));
    CHECK_T(&y, tol, "act %d fwd n=%lld %s", a, (long long)n, ct_dtype_name(dt));
    /* both backwards read the GPU's y, so only the backward is compared */
    gb_put(&y, dt);
    int nx = CT_ACT_BWD_NEEDS_X(a), ny = CT_ACT_BWD_NEEDS_Y(a);
    yg = gb_gpu(&y);
    CHECK_OK(G_->act_bwd(g_gpu, (ct_act)a, alpha, nx ? &xg : NULL, ny ? &yg : NULL, &dyg, &dxg));
    CHECK_OK(R_->act_bwd(g_ref, (ct_act)a, alpha, nx ? &xr : NULL, ny ? &yr : NULL, &dyr, &dxr));
    CHECK_T(&dx, tol, "act %d bwd n=%lld %s", a, (long long)n, ct_dtype_name(dt));
  }
  gb_free(&x), gb_free(&y), gb_free(&dy), gb_free(&dx);
}

/* off, stride: the samples are numbers off + i x stride of a larger
 * batch (data parallel); 0, 0: the whole batch. */
static void dropout_one(int64_t N, int64_t C, int64_t HW, int by_channel, float p, uint32_t step, uint64_t off,
                        uint64_t stride) {
  gb x = GB(N, C, HW), y = GB(N, C, HW), dx = GB(N, C, HW);
  gb_rand(&x, 1.0, CT_F32);
  int64_t group = by_channel ? HW : 1;
  ct_dropout_key key = {0x1234567890abcdefull, 3, step, off, stride, C * HW / group};
  ct_tensor xg = gb_gpu(&x), yg = gb_gpu(&y), dxg = gb_gpu(&dx);
  ct_tensor xr = gb_ref32(&x), yr = gb_ref32(&y), dxr = gb_ref32(&dx);
  CHECK_OK(G_->dropout_fwd(g_gpu, p, group, key, &xg, &yg));
  CHECK_OK(R_->dropout_fwd(g_ref, p, group, key, &xr, &yr));
  int64_t bad = gb_diff_exact(&y), zeros = 0;
  for (int64_t i = 0; i < y.n; i++) zeros += y.f[i] == 0.f;
  CHECK_MSG(bad == 0, "dropout fwd %lldx%lldx%lld group %lld p %g: %lld elements differ", (long long)N, (long long)C,
            (long long)HW, (long long)group, p, (long long)bad);
  CHECK_MSG(fabs((double)zeros / (double)y.n - p) < 0.1 + 2.0 / sqrt((double)(y.n / group)),
            "dropout drop fraction %g for p %g", (double)zeros / (double)y.n, p);
  CHECK_OK(G_->dropout_bwd(g_gpu, p, group, key, &xg, &dxg));
  CHECK_OK(R_->dropout_bwd(g_ref, p, group, key, &xr, &dxr));
  bad = gb_diff_exact(&dx);
  CHECK_MSG(bad == 0, "dropout bwd: %lld elements differ", (long long)bad);
  gb_free(&x), gb_free(&y), gb_free(&dx);
}

static void misc_elementwise(int64_t n, ct_dtype dt) {
  double tol = dt == CT_F32 ? TOL32 : TOL16;
  gb a = GB(n), b = GB(n), y = GB(n);
  gb_rand(&a, 1.0, dt), gb_rand(&b, 1.0, dt), gb_rand(&y, 1.0, dt);
  ct_tensor ag = gb_gpu(&a), bg = gb_gpu(&b), yg = gb_gpu(&y), ar = gb_ref(&a), br = gb_ref(&b), yr = gb_ref(&y);
  CHECK_OK(G_->add(g_gpu, &ag, &bg, CT_ACT_NONE, &yg));
  CHECK_OK(R_->add(g_ref, &ar, &br, CT_ACT_NONE, &yr));
  CHECK_T(&y, tol, "add n=%lld %s", (long long)n, ct_dtype_name(dt));
  CHECK_OK(G_->add(g_gpu, &ag, &bg, CT_ACT_RELU, &yg));
  CHECK_OK(R_->add(g_ref, &ar, &br, CT_ACT_RELU, &yr));
  CHECK_T(&y, tol, "add + ReLU n=%lld %s", (long long)n, ct_dtype_name(dt));
  gb_put(&y, dt);
  CHECK_OK(G_->axpby(g_gpu, 0.7f, &ag, 1.3f, &yg));
  CHECK_OK(R_->axpby(g_ref, 0.7f, &ar, 1.3f, &yr));
  CHECK_T(&y, tol, "axpby beta 1.3 n=%lld %s", (long long)n, ct_dtype_name(dt));
  y.f[0] = NAN; /* beta 0 must overwrite stale values */
  gb_put(&y, dt);
  CHECK_OK(G_->axpby(g_gpu, -2.f, &ag, 0.f, &yg));
  CHECK_OK(R_->axpby(g_ref, -2.f, &ar, 0.f, &yr));
  CHECK_T(&y, tol, "axpby beta 0 n=%lld %s", (long long)n, ct_dtype_name(dt));
  CHECK_OK(G_->fill(g_gpu, &yg, 0.375f));
  CHECK_OK(R_->fill(g_ref, &yr, 0.375f));
  CHECK_T(&y, TOL32, "fill n=%lld %s", (long long)n, ct_dtype_name(dt));
  if (dt != CT_F32) {
    gb_free(&a), gb_free(&b), gb_free(&y);
    return;
  }
  /* cast f32 -> bf16 / f16 -> f32 bit for bit against the host conversions */
  ct_dtype hs[2] = {CT_BF16, CT_F16};
  for (int k = 0; k < 2; k++) {
    gb h = GB(n);
    ct_tensor hg = gb_out(&h, hs[k]);
    CHECK_OK(G_->cast(g_gpu, &ag, &hg));
    uint16_t *got = malloc((size_t)n * 2), *want = malloc((size_t)n * 2);
    CHECK_OK(ct_device_sync(g_gpu));
    CHECK_OK(ct_device_copy(NULL, got, g_gpu, h.dev, (size_t)n * 2));
    ct_convert(a.f, CT_F32, want, hs[k], (size_t)n);
    CHECK_MSG(memcmp(got, want, (size_t)n * 2) == 0, "cast f32->%s differs from the host", ct_dtype_name(hs[k]));
    ct_tensor yo = gb_out(&y, CT_F32);
    CHECK_OK(G_->cast(g_gpu, &hg, &yo));
    gb_get(&y);
    float *wf = malloc((size_t)n * 4);
    ct_convert(want, hs[k], wf, CT_F32, (size_t)n);
    CHECK_MSG(memcmp(y.f, wf, (size_t)n * 4) == 0, "cast %s->f32 differs from the host", ct_dtype_name(hs[k]));
    free(got), free(want), free(wf);
    gb_free(&h);
  }
  gb_free(&a), gb_free(&b), gb_free(&y);
}

static void softmax_loss(int64_t N, int64_t C) {
  gb x = GB(N, C), y = GB(N, C), dy = GB(N, C), dx = GB(N, C), loss = GB(1), tg = GB(N, C);
  gb_rand(&x, 2.0, CT_F32), gb_rand(&dy, 1.0, CT_F32), gb_rand(&tg, 1.0, CT_F32);
  int64_t *t = malloc((size_t)N * 8);
  for (int64_t i = 0; i < N; i++) t[i] = ct_rng_below(&g_rng, (uint32_t)C);
  void *tdev = ct_device_alloc(g_gpu, (size_t)N * 8);
  CHECK_OK(ct_device_copy(g_gpu, tdev, NULL, t, (size_t)N * 8));
  CHECK_OK(ct_device_sync(g_gpu));
  ct_tensor tt = ct_tensor_1d(t, CT_I64, N), ttg = ct_tensor_1d(tdev, CT_I64, N);
  ct_tensor xg = gb_gpu(&x), yg = gb_gpu(&y), dyg = gb_gpu(&dy), dxg = gb_gpu(&dx), lg_ = gb_gpu(&loss), tgg = gb_gpu(&tg);
  ct_tensor xr = gb_ref(&x), yr = gb_ref(&y), dyr = gb_ref(&dy), dxr = gb_ref(&dx), lr = gb_ref(&loss), tgr = gb_ref(&tg);
  for (int lg = 0; lg <= 1; lg++) {
    CHECK_OK(G_->softmax_fwd(g_gpu, lg, &xg, &yg));
    CHECK_OK(R_->softmax_fwd(g_ref, lg, &xr, &yr));
    CHECK_T(&y, TOL32, "softmax log%d %lldx%lld fwd", lg, (long long)N, (long long)C);
    gb_put(&y, CT_F32);
    CHECK_OK(G_->softmax_bwd(g_gpu, lg, &yg, &dyg, &dxg));
    CHECK_OK(R_->softmax_bwd(g_ref, lg, &yr, &dyr, &dxr));
    CHECK_T(&dx, TOL32, "softmax log%d %lldx%lld bwd", lg, (long long)N, (long long)C);
  }
  for (int k = 0; k < 2; k++) {
    float ls = k ? 0.1f : 0.f, gs = k ? 128.f : 1.f;
    CHECK_OK(G_->cross_entropy_fwd(g_gpu, &xg, &ttg, ls, &lg_));
    CHECK_OK(R_->cross_entropy_fwd(g_ref, &xr, &tt, ls, &lr));
    CHECK_T(&loss, TOL32, "cross_entropy ls %g %lldx%lld fwd", ls, (long long)N, (long long)C);
    CHECK_OK(G_->cross_entropy_bwd(g_gpu, &xg, &ttg, ls, gs, &dxg));
    CHECK_OK(R_->cross_entropy_bwd(g_ref, &xr, &tt, ls, gs, &dxr));
    CHECK_T(&dx, TOL32, "cross_entropy ls %g scale %g %lldx%lld bwd", ls, gs, (long long)N, (long long)C);
    CHECK_OK(G_->nll_fwd(g_gpu, &xg, &ttg, &lg_));
    CHECK_OK(R_->nll_fwd(g_ref, &xr, &tt, &lr));
    CHECK_T(&loss, TOL32, "nll %lldx%lld fwd", (long long)N, (long long)C);
    CHECK_OK(G_->nll_bwd(g_gpu, &ttg, gs, &dxg));
    CHECK_OK(R_->nll_bwd(g_ref, &tt, gs, &dxr));
    CHECK_T(&dx, TOL32, "nll scale %g bwd", gs);
    CHECK_OK(G_->mse_fwd(g_gpu, &xg, &tgg, &lg_));
    CHECK_OK(R_->mse_fwd(g_ref, &xr, &tgr, &lr));
    CHECK_T(&loss, TOL32, "mse %lldx%lld fwd", (long long)N, (long long)C);
    CHECK_OK(G_->mse_bwd(g_gpu, &xg, &tgg, gs, &dxg));
    CHECK_OK(R_->mse_bwd(g_ref, &xr, &tgr, gs, &dxr));
    CHECK_T(&dx, TOL32, "mse scale %g bwd", gs);
  }
  double sg = 0, sr = 0;
  CHECK_OK(G_->sumsq(g_gpu, &xg, &sg));
  CHECK_OK(R_->sumsq(g_ref, &xr, &sr));
  /* Both sum the exact squares in double, in different orders (the GPU
   * per-block partials and a tree, the reference in index order): the
   * recursive sum of n positive terms is off by at most (n-1)*2^-53
   * relative, 7e-12 for the 64000 values here, so 1e-12 could fail a
   * correct kernel; 1e-10 cannot, and a wrong sum is off by far more. */
  CHECK_MSG(fabs(sg - sr) <= 1e-10 * sr, "sumsq %.17g vs %.17g", sg, sr);
  CHECK_MSG(sr > 0, "sumsq of random values is 0");
  for (int k = 0; k < 3; k++) {
    float saved = x.f[N * C / 2];
    if (k == 1) x.f[N * C / 2] = INFINITY;
    if (k == 2) x.f[N * C / 2] = NAN;
    gb_put(&x, CT_F32);
    ct_tensor xr32 = gb_ref32(&x);
    int og = -1, orf = -1;
    CHECK_OK(G_->nonfinite(g_gpu, &xg, &og));
    CHECK_OK(R_->nonfinite(g_ref, &xr32, &orf));
    CHECK_MSG(og == (k != 0) && og == orf, "nonfinite case %d: cuda %d ref %d", k, og, orf);
    x.f[N * C / 2] = saved;
  }
  ct_device_free(g_gpu, tdev);
  free(t);
  gb_free(&x), gb_free(&y), gb_free(&dy), gb_free(&dx), gb_free(&loss), gb_free(&tg);
}

int main(void) {
  gpu_test_setup(7);
  for (size_t i = 0; i < sizeof pool_cases / sizeof pool_cases[0]; i++) pool_one(&pool_cases[i]);
  adaptive_one(2, 3, 7, 7, 1, 1);
  adaptive_one(2, 3, 10, 9, 3, 4);
  adaptive_one(1, 4, 13, 6, 6, 6); /* overlapping bins */
  adaptive_one(2, 2, 5, 5, 7, 7);  /* output larger than input */
  adaptive_one(3, 5, 6, 6, 6, 6);  /* one pixel per bin: a copy */
  const int64_t s2[] = {8, 5}, s3[] = {4, 3, 7}, s4[] = {3, 4, 5, 6}, s4b[] = {1, 2, 3, 3}, s4c[] = {16, 32, 13, 13};
  for (int affine = 0; affine <= 1; affine++) {
    bn_one(2, s2, affine);
    bn_one(3, s3, affine);
    bn_one(4, s4, affine);
    bn_one(4, s4b, affine);
    bn_one(4, s4c, affine);
  }
  act_all(101, CT_F32);
  act_all(40000, CT_F32);
  act_all(1001, CT_BF16);
  act_all(1001, CT_F16);
  dropout_one(2, 3, 49, 0, 0.3f, 1, 0, 0);
  dropout_one(2, 3, 49, 1, 0.5f, 2, 0, 0);
  dropout_one(3, 101, 333, 0, 0.2f, 7, 0, 0);
  dropout_one(4, 64, 169, 1, 0.25f, 9, 0, 0);
  /* A rank's share of a global batch: masks by sample number. */
  dropout_one(3, 101, 333, 0, 0.2f, 7, 1, 2);
  dropout_one(4, 64, 169, 1, 0.25f, 9, 5, 3);
  misc_elementwise(7, CT_F32);
  misc_elementwise(100003, CT_F32);
  misc_elementwise(1003, CT_BF16);
  misc_elementwise(1003, CT_F16);
  softmax_loss(5, 10);
  softmax_loss(64, 1000);
  printf("worst normwise relative error (f32): %.3g\n", worst);
  gpu_test_teardown();
  return test_summary("test_gpu_ops_vs_ref");
}
