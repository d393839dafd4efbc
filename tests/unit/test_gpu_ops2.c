/* The cuda device against the reference, second part: what
 * test_gpu_ops_vs_ref.c leaves out.
 *  - Pooling (max, avg with and without count_include_pad, adaptive avg
 *    and max; forward and backward) with bf16 and f16 storage, plain NCHW
 *    and NHWC (CT_LAYOUT_NHWC, permuted on the host), against the ref
 *    device in f64 on the same rounded inputs. Max-pool forwards must be
 *    bit-exact (the output is one of the inputs); the rest within the
 *    16-bit rounding of the output: normwise 4e-3 for bf16 (unit roundoff
 *    2^-9 = 2e-3), 1e-3 for f16 (2^-11 = 4.9e-4).
 *  - Losses (cross entropy with label smoothing 0 / 0.1 / 0.3, NLL, MSE)
 *    with bf16 and f16 logits and int32 as well as int64 targets (the ref
 *    gets the same class indices as int64), gradients stored in the logits'
 *    dtype (16-bit tolerance) and in f32 (1e-5: the kernels sum in double),
 *    and the device-scale backwards (cross_entropy_bwd_dev, nll_bwd_dev)
 *    with int32 targets.
 *  - The row-major per-channel sum (cuda_channel_sum with inner == 1, the
 *    sliced column-sum kernels) through linear_bwd_weights' bias gradient
 *    and an NHWC conv2d_bwd_weights' bias gradient: >= 100000 rows (128
 *    slices), C = 37 and 1000 (not multiples of 32), beta 0 (outputs
 *    poisoned with NaN first) and 1, f32 and bf16 dy; with 16-bit x and
 *    dy (bf16, f16) the weight gradient beside it is the 16-bit result
 *    widened (its elements are 16-bit values), as PyTorch's autocast.
 * Outputs an op overwrites are filled with NaN before the op, so an
 * element it never writes fails. Skipped (77) without a GPU. */
#include <stdarg.h>

#include "optim/optimizer_device.h"
#include "test_gpu_common.h"

#define TOL32 1e-5
#define TOL_BF16 4e-3
#define TOL_F16 1e-3

static double tol16(ct_dtype dt) { return dt == CT_BF16 ? TOL_BF16 : dt == CT_F16 ? TOL_F16 : TOL32; }

/* Uploads t->f (logical NCHW order) as dt, in NHWC order when nhwc; the
 * ref views get the rounded values in NCHW order. */
static void put_as(gb *t, ct_dtype dt, int nhwc) {
  gb_put(t, dt); /* rounds f, fills d/rf, uploads plain */
  if (!nhwc) return;
  size_t n = (size_t)t->n;
  float *perm = malloc(n * 4);
  void *enc = malloc(n * 4 + 4);
  to_nhwc(t->f, perm, t->shape[0], t->shape[1], t->shape[2] * t->shape[3]);
  ct_convert(perm, CT_F32, enc, dt, n);
  if (ct_device_copy(g_gpu, t->dev, NULL, enc, n * ct_dtype_size(dt)) != CT_OK || ct_device_sync(g_gpu) != CT_OK) {
    fprintf(stderr, "put_as: %s\n", ct_last_error());
    exit(1);
  }
  free(perm), free(enc);
}

static void rand_as(gb *t, double scale, ct_dtype dt, int nhwc) {
  for (int64_t i = 0; i < t->n; i++) t->f[i] = (float)(ct_rng_normal(&g_rng) * scale);
  put_as(t, dt, nhwc);
}

/* The device tensor of t in dtype dt and layout nhwc, filled with NaN
 * (an output the op must overwrite completely). */
static ct_tensor out_as(gb *t, ct_dtype dt, int nhwc) {
  ct_tensor x = gb_out(t, dt);
  x.layout = nhwc ? CT_LAYOUT_NHWC : CT_LAYOUT_PLAIN;
  CHECK_OK(G_->fill(g_gpu, &x, NAN));
  return x;
}

static ct_tensor in_as(gb *t, int nhwc) {
  ct_tensor x = gb_gpu(t);
  x.layout = nhwc ? CT_LAYOUT_NHWC : CT_LAYOUT_PLAIN;
  return x;
}

/* Downloads t into f in logical NCHW order. */
static void get_as(gb *t, int nhwc) {
  gb_get(t);
  if (!nhwc) return;
  float *tmp = malloc((size_t)t->n * 4);
  from_nhwc(t->f, tmp, t->shape[0], t->shape[1], t->shape[2] * t->shape[3]);
  memcpy(t->f, tmp, (size_t)t->n * 4);
  free(tmp);
}

/* max |gpu - ref| / max |ref| against the f64 view; a NaN (an unwritten
 * poisoned element) gives infinity, an all-zero reference a failure. */
static double err_as(gb *t, int nhwc) {
  get_as(t, nhwc);
  double num = 0, den = 0;
  for (int64_t i = 0; i < t->n; i++) {
    double e = fabs((double)t->f[i] - t->d[i]);
    if (!(e <= num)) num = isnan(e) ? INFINITY : e;
    if (fabs(t->d[i]) > den) den = fabs(t->d[i]);
  }
  CHECK_MSG(den > 0, "%s: the reference is all zero; the comparison is blind", g_case_name);
  return num / (den > 0 ? den : 1e-30);
}

#define CHECK_E(t, nhwc, tol, ...)                                            \
  do {                                                                        \
    const char *nm_ = case_name(__VA_ARGS__);                                 \
    double e_ = err_as(t, nhwc);                                              \
    CHECK_MSG(e_ <= (tol), "%s: err %.3g (tolerance %.3g)", nm_, e_, (double)(tol)); \
  } while (0)

/* Elements of t (already downloaded) that differ from the f64 view
 * rounded to f32 (exact where the op only selects an input). */
static int64_t count_inexact(const gb *t) {
  int64_t bad = 0;
  for (int64_t i = 0; i < t->n; i++) {
    float want = (float)t->d[i];
    bad += memcmp(&t->f[i], &want, 4) != 0;
  }
  return bad;
}

/* ---- pooling in bf16/f16, plain and NHWC ---- */

static const pool_case pool_cases[] = {
    {2, 3, 8, 8, {2, 2, 2, 2, 0, 0, 0, 1}},   {2, 3, 9, 9, {3, 3, 2, 2, 1, 1, 1, 1}},
    {3, 2, 10, 10, {3, 3, 3, 3, 0, 0, 1, 1}}, {2, 4, 13, 13, {3, 3, 1, 1, 1, 1, 0, 1}}, /* overlapping windows */
    {4, 37, 14, 14, {2, 2, 2, 2, 0, 0, 0, 1}}, /* C not a multiple of a warp: NHWC channel vectors */
    /* C a multiple of 8: max pooling's NHWC vector kernels (8 channels a thread) */
    {2, 16, 11, 11, {3, 3, 2, 2, 1, 1, 0, 1}}, {2, 64, 13, 13, {3, 3, 2, 2, 0, 0, 1, 1}},
    {3, 8, 7, 9, {2, 3, 1, 2, 1, 0, 0, 1}},
    /* the workspace's one-byte window offsets up to 254 elements, int32 from 255 */
    {2, 8, 16, 20, {14, 18, 2, 2, 0, 1, 1, 1}}, {2, 16, 20, 20, {15, 17, 5, 3, 1, 2, 0, 1}},
};

static void pool16(const pool_case *c, ct_dtype dt, int nhwc) {
  ct_pool2d_params p = c->p;
  int64_t OH = pool_out(c->H, p.kernel_h, p.stride_h, p.pad_h, p.ceil_mode);
  int64_t OW = pool_out(c->W, p.kernel_w, p.stride_w, p.pad_w, p.ceil_mode);
  gb x = GB(c->N, c->C, c->H, c->W), y = GB(c->N, c->C, OH, OW), dy = GB(c->N, c->C, OH, OW);
  gb dx = GB(c->N, c->C, c->H, c->W);
  rand_as(&x, 1.0, dt, nhwc), rand_as(&dy, 1.0, dt, nhwc);
  const double tol = tol16(dt);
  char base[160];
  snprintf(base, sizeof base, "N%lld C%lld %lldx%lld k%dx%d s%d,%d p%d,%d ceil%d %s %s", (long long)c->N,
           (long long)c->C, (long long)c->H, (long long)c->W, p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h,
           p.pad_w, p.ceil_mode, ct_dtype_name(dt), nhwc ? "NHWC" : "NCHW");
  ct_tensor xg = in_as(&x, nhwc), dyg = in_as(&dy, nhwc);
  ct_tensor xr = gb_ref(&x), yr = gb_ref(&y), dyr = gb_ref(&dy), dxr = gb_ref(&dx);
  ct_tensor yg = out_as(&y, dt, nhwc);
  size_t wsg = G_->maxpool2d_workspace_bytes(g_gpu, &p, &xg, &yg);
  size_t wsr = R_->maxpool2d_workspace_bytes(g_ref, &p, &xr, &yr);
  void *wg = ct_device_alloc(g_gpu, wsg + 64), *wr = malloc(wsr + 64);
  CHECK_OK(G_->maxpool2d_fwd(g_gpu, &p, &xg, &yg, wg));
  CHECK_OK(R_->maxpool2d_fwd(g_ref, &p, &xr, &yr, wr));
  CHECK_E(&y, nhwc, tol, "maxpool fwd %s", base);
  int64_t bad = count_inexact(&y);
  CHECK_MSG(bad == 0, "maxpool fwd %s: %lld outputs are not exactly the reference's input", base, (long long)bad);
  ct_tensor dxg = out_as(&dx, dt, nhwc);
  CHECK_OK(G_->maxpool2d_bwd(g_gpu, &p, &dyg, wg, &dxg));
  CHECK_OK(R_->maxpool2d_bwd(g_ref, &p, &dyr, wr, &dxr));
  CHECK_E(&dx, nhwc, tol, "maxpool bwd %s", base);
  ct_device_free(g_gpu, wg);
  free(wr);
  for (int cip = 0; cip <= 1; cip++) {
    p.count_include_pad = cip;
    yg = out_as(&y, dt, nhwc);
    CHECK_OK(G_->avgpool2d_fwd(g_gpu, &p, &xg, &yg));
    CHECK_OK(R_->avgpool2d_fwd(g_ref, &p, &xr, &yr));
    CHECK_E(&y, nhwc, tol, "avgpool fwd cip%d %s", cip, base);
    dxg = out_as(&dx, dt, nhwc);
    CHECK_OK(G_->avgpool2d_bwd(g_gpu, &p, &dyg, &dxg));
    CHECK_OK(R_->avgpool2d_bwd(g_ref, &p, &dyr, &dxr));
    CHECK_E(&dx, nhwc, tol, "avgpool bwd cip%d %s", cip, base);
  }
  gb_free(&x), gb_free(&y), gb_free(&dy), gb_free(&dx);
}

static void adaptive16(int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH, int64_t OW, ct_dtype dt, int nhwc) {
  gb x = GB(N, C, H, W), y = GB(N, C, OH, OW), dy = GB(N, C, OH, OW), dx = GB(N, C, H, W);
  rand_as(&x, 1.0, dt, nhwc), rand_as(&dy, 1.0, dt, nhwc);
  const double tol = tol16(dt);
  char base[128];
  snprintf(base, sizeof base, "N%lld C%lld %lldx%lld -> %lldx%lld %s %s", (long long)N, (long long)C, (long long)H,
           (long long)W, (long long)OH, (long long)OW, ct_dtype_name(dt), nhwc ? "NHWC" : "NCHW");
  ct_tensor xg = in_as(&x, nhwc), dyg = in_as(&dy, nhwc);
  ct_tensor xr = gb_ref(&x), yr = gb_ref(&y), dyr = gb_ref(&dy), dxr = gb_ref(&dx);
  ct_tensor yg = out_as(&y, dt, nhwc);
  CHECK_OK(G_->adaptive_avgpool2d_fwd(g_gpu, &xg, &yg));
  CHECK_OK(R_->adaptive_avgpool2d_fwd(g_ref, &xr, &yr));
  CHECK_E(&y, nhwc, tol, "adaptive avg fwd %s", base);
  ct_tensor dxg = out_as(&dx, dt, nhwc);
  CHECK_OK(G_->adaptive_avgpool2d_bwd(g_gpu, &dyg, &dxg));
  CHECK_OK(R_->adaptive_avgpool2d_bwd(g_ref, &dyr, &dxr));
  CHECK_E(&dx, nhwc, tol, "adaptive avg bwd %s", base);
  int32_t *ig = ct_device_alloc(g_gpu, (size_t)y.n * 4), *ir = malloc((size_t)y.n * 4);
  yg = out_as(&y, dt, nhwc);
  CHECK_OK(G_->adaptive_maxpool2d_fwd(g_gpu, &xg, &yg, ig));
  CHECK_OK(R_->adaptive_maxpool2d_fwd(g_ref, &xr, &yr, ir));
  CHECK_E(&y, nhwc, tol, "adaptive max fwd %s", base);
  int64_t bad = count_inexact(&y);
  CHECK_MSG(bad == 0, "adaptive max fwd %s: %lld outputs are not exactly the reference's input", base, (long long)bad);
  dxg = out_as(&dx, dt, nhwc);
  CHECK_OK(G_->adaptive_maxpool2d_bwd(g_gpu, &dyg, ig, &dxg));
  CHECK_OK(R_->adaptive_maxpool2d_bwd(g_ref, &dyr, ir, &dxr));
  CHECK_E(&dx, nhwc, tol, "adaptive max bwd %s", base);
  ct_device_free(g_gpu, ig);
  free(ir);
  gb_free(&x), gb_free(&y), gb_free(&dy), gb_free(&dx);
}

/* ---- losses with 16-bit logits and int32 targets ---- */

/* lt: logits dtype; gt: dtype of the gradient outputs; tt: targets dtype. */
static void losses(int64_t N, int64_t C, ct_dtype lt, ct_dtype gt, ct_dtype tt) {
  gb x = GB(N, C), dx = GB(N, C), loss = GB(1), tg = GB(N, C);
  gb_rand(&x, 2.0, lt), gb_rand(&tg, 1.0, lt);
  int64_t *t = malloc((size_t)N * 8);
  int32_t *t32 = malloc((size_t)N * 4);
  for (int64_t i = 0; i < N; i++) t32[i] = (int32_t)(t[i] = ct_rng_below(&g_rng, (uint32_t)C));
  size_t tb = (size_t)N * (tt == CT_I32 ? 4 : 8);
  void *tdev = ct_device_alloc(g_gpu, tb);
  CHECK_OK(ct_device_copy(g_gpu, tdev, NULL, tt == CT_I32 ? (void *)t32 : (void *)t, tb));
  CHECK_OK(ct_device_sync(g_gpu));
  ct_tensor tr = ct_tensor_1d(t, CT_I64, N), tgpu = ct_tensor_1d(tdev, tt, N);
  tgpu.device = g_gpu;
  ct_tensor xg = gb_gpu(&x), tgg = gb_gpu(&tg), xr = gb_ref(&x), dxr = gb_ref(&dx), lr = gb_ref(&loss),
            tgr = gb_ref(&tg);
  const double gtol = tol16(gt);
  char base[96];
  snprintf(base, sizeof base, "%lldx%lld logits %s grads %s targets %s", (long long)N, (long long)C,
           ct_dtype_name(lt), ct_dtype_name(gt), ct_dtype_name(tt));
  const float smooth[3] = {0.f, 0.1f, 0.3f}, scales[3] = {1.f, 128.f, 0.5f};
  for (int k = 0; k < 3; k++) {
    float ls = smooth[k], gs = scales[k];
    ct_tensor lg = out_as(&loss, CT_F32, 0);
    CHECK_OK(G_->cross_entropy_fwd(g_gpu, &xg, &tgpu, ls, &lg));
    CHECK_OK(R_->cross_entropy_fwd(g_ref, &xr, &tr, ls, &lr));
    CHECK_E(&loss, 0, TOL32, "cross_entropy fwd ls %g %s", ls, base);
    ct_tensor dxg = out_as(&dx, gt, 0);
    CHECK_OK(G_->cross_entropy_bwd(g_gpu, &xg, &tgpu, ls, gs, &dxg));
    CHECK_OK(R_->cross_entropy_bwd(g_ref, &xr, &tr, ls, gs, &dxr));
    CHECK_E(&dx, 0, gtol, "cross_entropy bwd ls %g scale %g %s", ls, gs, base);
    lg = out_as(&loss, CT_F32, 0);
    CHECK_OK(G_->nll_fwd(g_gpu, &xg, &tgpu, &lg));
    CHECK_OK(R_->nll_fwd(g_ref, &xr, &tr, &lr));
    CHECK_E(&loss, 0, TOL32, "nll fwd %s", base);
    dxg = out_as(&dx, gt, 0);
    CHECK_OK(G_->nll_bwd(g_gpu, &tgpu, gs, &dxg));
    CHECK_OK(R_->nll_bwd(g_ref, &tr, gs, &dxr));
    CHECK_E(&dx, 0, gtol, "nll bwd scale %g %s", gs, base);
    if (k == 0) {
      lg = out_as(&loss, CT_F32, 0);
      CHECK_OK(G_->mse_fwd(g_gpu, &xg, &tgg, &lg));
      CHECK_OK(R_->mse_fwd(g_ref, &xr, &tgr, &lr));
      CHECK_E(&loss, 0, TOL32, "mse fwd %s", base);
    }
    dxg = out_as(&dx, gt, 0);
    CHECK_OK(G_->mse_bwd(g_gpu, &xg, &tgg, gs, &dxg));
    CHECK_OK(R_->mse_bwd(g_ref, &xr, &tgr, gs, &dxr));
    CHECK_E(&dx, 0, gtol, "mse bwd scale %g %s", gs, base);
  }
  /* The device-scale backwards (the resident trainer's) read the targets
   * the same way: scaler on with scale 1024, so the ref gets 1024. */
  ct_grad_scaler sc;
  ct_grad_scaler_init(&sc, 1, 1, 1024.0);
  ct_step_stats hs;
  memset(&hs, 0, sizeof hs);
  ct_scaler_to_dev(&sc, &hs.scaler);
  ct_step_stats *st = ct_device_alloc(g_gpu, sizeof hs);
  CHECK_OK(ct_device_copy(g_gpu, st, NULL, &hs, sizeof hs));
  CHECK_OK(ct_device_sync(g_gpu));
  ct_tensor dxg = out_as(&dx, gt, 0);
  CHECK_OK(G_->cross_entropy_bwd_dev(g_gpu, &xg, &tgpu, 0.1f, st, &dxg));
  CHECK_OK(R_->cross_entropy_bwd(g_ref, &xr, &tr, 0.1f, 1024.f, &dxr));
  CHECK_E(&dx, 0, gtol, "cross_entropy bwd_dev ls 0.1 scaler 1024 %s", base);
  dxg = out_as(&dx, gt, 0);
  CHECK_OK(G_->nll_bwd_dev(g_gpu, &tgpu, st, &dxg));
  CHECK_OK(R_->nll_bwd(g_ref, &tr, 1024.f, &dxr));
  CHECK_E(&dx, 0, gtol, "nll bwd_dev scaler 1024 %s", base);
  ct_device_free(g_gpu, st);
  ct_device_free(g_gpu, tdev);
  free(t), free(t32);
  gb_free(&x), gb_free(&dx), gb_free(&loss), gb_free(&tg);
}

/* ---- the row-major channel sum (inner == 1) through its two callers ----
 * The bias gradient sums >= 100000 rows in double, so it is held to 1e-5.
 * The weight gradient beside it is a cuBLASLt/cuDNN f32 reduction over
 * the same rows: sequential f32 accumulation over n terms drifts by about
 * u * sqrt(n/2) relative (6e-8 * 224 = 1.3e-5 at n = 1e5), so dw gets 2e-4
 * here (a wrong dw is off by O(1)). */
#define TOL_LONG_F32 2e-4

/* f32 weight and bias gradients on both sides for beta 0 (fresh outputs,
 * zero on the reference side) or 1 (random values both accumulate into). */
static void grad_outputs(gb *dw, gb *db, int beta, ct_tensor *dwg, ct_tensor *dbg) {
  if (beta) {
    gb_rand(dw, 1.0, CT_F32), gb_rand(db, 1.0, CT_F32);
    *dwg = gb_gpu(dw), *dbg = gb_gpu(db);
  } else {
    *dwg = out_as(dw, CT_F32, 0), *dbg = out_as(db, CT_F32, 0);
    memset(dw->d, 0, (size_t)dw->n * 8), memset(db->d, 0, (size_t)db->n * 8);
  }
}

static void linear_bias(int64_t rows, int64_t K, int64_t M, ct_dtype dt) {
  gb x = GB(rows, K), dy = GB(rows, M), dw = GB(M, K), db = GB(M);
  gb_rand(&x, 1.0, dt), gb_rand(&dy, 1.0, dt);
  ct_tensor xg = gb_gpu(&x), dyg = gb_gpu(&dy), xr = gb_ref(&x), dyr = gb_ref(&dy);
  /* bf16 inputs with an f32 dw: exact products, the same f32 accumulation */
  const double dwtol = TOL_LONG_F32;
  for (int beta = 0; beta <= 1; beta++) {
    ct_tensor dwg, dbg;
    grad_outputs(&dw, &db, beta, &dwg, &dbg);
    ct_tensor dwr = gb_ref(&dw), dbr = gb_ref(&db);
    CHECK_OK(G_->linear_bwd_weights(g_gpu, &xg, &dyg, &dwg, &dbg, (float)beta));
    CHECK_OK(R_->linear_bwd_weights(g_ref, &xr, &dyr, &dwr, &dbr, (float)beta));
    CHECK_E(&db, 0, TOL32, "linear bias grad rows %lld M %lld %s beta %d", (long long)rows, (long long)M,
            ct_dtype_name(dt), beta);
    CHECK_E(&dw, 0, dwtol, "linear weight grad rows %lld K %lld M %lld %s beta %d", (long long)rows, (long long)K,
            (long long)M, ct_dtype_name(dt), beta);
  }
  gb_free(&x), gb_free(&dy), gb_free(&dw), gb_free(&db);
}

/* NHWC x and dy ([N*H*W][C] rows for the bias sum), plain dw. */
static void conv_nhwc_bias(int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int k, ct_dtype dt) {
  ct_conv2d_params p = {1, 1, k / 2, k / 2, 1, 1, 1};
  gb x = GB(N, C, H, W), dy = GB(N, O, H, W), dw = GB(O, C, k, k), db = GB(O);
  rand_as(&x, 1.0, dt, 1), rand_as(&dy, 1.0, dt, 1);
  ct_tensor xg = in_as(&x, 1), dyg = in_as(&dy, 1), xr = gb_ref(&x), dyr = gb_ref(&dy);
  /* 16-bit inputs: dw is computed in their dtype and widened into the f32
   * gradient (PyTorch's CUDA autocast), one rounding on top of the sum. */
  const double dwtol = dt == CT_F32 ? TOL_LONG_F32 : tol16(dt);
  for (int beta = 0; beta <= 1; beta++) {
    ct_tensor dwg, dbg;
    grad_outputs(&dw, &db, beta, &dwg, &dbg);
    ct_tensor dwr = gb_ref(&dw), dbr = gb_ref(&db);
    CHECK_OK(G_->conv2d_bwd_weights(g_gpu, &p, &xg, &dyg, &dwg, &dbg, (float)beta));
    CHECK_OK(R_->conv2d_bwd_weights(g_ref, &p, &xr, &dyr, &dwr, &dbr, (float)beta));
    CHECK_E(&db, 0, TOL32, "NHWC conv bias grad rows %lld O %lld %s beta %d", (long long)(N * H * W), (long long)O,
            ct_dtype_name(dt), beta);
    CHECK_E(&dw, 0, dwtol, "NHWC conv weight grad rows %lld C %lld O %lld k%d %s beta %d", (long long)(N * H * W),
            (long long)C, (long long)O, k, ct_dtype_name(dt), beta);
    /* ... and not the f32 convolution of widened operands, which runs off
     * the 16-bit tensor-core path: with beta 0 every element is a value
     * of the 16-bit dtype (gb_err left the GPU's values in dw.f). */
    if (dt != CT_F32 && beta == 0) {
      int64_t off = 0;
      for (int64_t i = 0; i < dw.n; i++) {
        uint16_t h;
        float back;
        ct_convert(&dw.f[i], CT_F32, &h, dt, 1);
        ct_convert(&h, dt, &back, CT_F32, 1);
        off += back != dw.f[i];
      }
      CHECK_MSG(off == 0, "NHWC conv weight grad %s: %lld of %lld elements are not %s values", ct_dtype_name(dt),
                (long long)off, (long long)dw.n, ct_dtype_name(dt));
    }
  }
  gb_free(&x), gb_free(&dy), gb_free(&dw), gb_free(&db);
}

int main(void) {
  unsetenv("CTRAIN_CUDA_TF32"); /* the f32 tolerances assume FMA math (TF32 off) */
  gpu_test_setup(2025);
  const ct_dtype h16[2] = {CT_BF16, CT_F16};
  for (int k = 0; k < 2; k++)
    for (int nhwc = 0; nhwc <= 1; nhwc++) {
      for (size_t i = 0; i < sizeof pool_cases / sizeof pool_cases[0]; i++) pool16(&pool_cases[i], h16[k], nhwc);
      adaptive16(2, 3, 7, 7, 1, 1, h16[k], nhwc);
      adaptive16(1, 37, 13, 6, 6, 6, h16[k], nhwc); /* overlapping bins */
      adaptive16(2, 2, 5, 5, 7, 7, h16[k], nhwc);   /* output larger than input */
    }
  for (int k = 0; k < 2; k++) {
    losses(5, 10, h16[k], h16[k], CT_I64);
    losses(64, 1000, h16[k], h16[k], CT_I32);
    losses(64, 1000, h16[k], CT_F32, CT_I64);
    losses(33, 17, h16[k], CT_F32, CT_I32);
  }
  losses(64, 1000, CT_F32, CT_F32, CT_I32);
  linear_bias(100003, 3, 37, CT_F32);
  linear_bias(100000, 2, 1000, CT_F32);
  linear_bias(131071, 4, 37, CT_BF16);
  conv_nhwc_bias(4, 3, 160, 160, 37, 3, CT_F32);  /* 102400 rows */
  conv_nhwc_bias(2, 2, 224, 224, 1000, 1, CT_F32); /* 100352 rows */
  conv_nhwc_bias(4, 3, 160, 160, 37, 1, CT_BF16);
  conv_nhwc_bias(2, 5, 24, 24, 19, 3, CT_F16);
  gpu_test_teardown();
  return test_summary("test_gpu_ops2");
}
