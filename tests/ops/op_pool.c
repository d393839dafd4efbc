/* Pooling on the target against the reference: max pooling (forward with
 * its workspace, backward, and the forward again without a workspace, as
 * in inference), average pooling with and without count_include_pad,
 * adaptive average and max pooling. In f32 (the row's tol) and in each
 * 16-bit dtype of the row's rounded16 (within the output's rounding), plain
 * and, with OP_CAP_POOL_NHWC, NHWC (permuted on the host), against the ref
 * device in f64 on the same rounded inputs, every output filled with NaN
 * before the op. Max pooling's outputs must be exactly inputs. The row's
 * pool_widened dtypes again against the ref device run in that dtype (its
 * widening path): max pooling's output equal to the bit, its gradient
 * (overlapping windows summed in f32 before rounding, on either side) and
 * average pooling within the tolerance, ||dev - ref|| / ||ref||. */
#include "op_target.h"

static const pool_case pool_cases[] = {
    /* N C H W  {kh kw sh sw ph pw ceil cip} */
    {2, 3, 8, 8, {2, 2, 2, 2, 0, 0, 0, 1}},
    {2, 3, 9, 9, {3, 3, 2, 2, 1, 1, 1, 1}},    /* ceil adds a window; cip -> the cpu's reference fallback for avg */
    {1, 4, 7, 10, {3, 2, 2, 1, 1, 0, 0, 1}},   /* non-square */
    {4, 32, 26, 26, {2, 2, 2, 2, 0, 0, 0, 1}}, /* torchkeras pool */
    {2, 3, 11, 5, {3, 3, 3, 3, 1, 1, 1, 1}},
    {3, 2, 10, 10, {3, 3, 3, 3, 0, 0, 1, 1}}, /* ceil, no padding */
    {1, 5, 6, 7, {2, 3, 2, 2, 1, 1, 0, 1}},
    {2, 4, 13, 13, {3, 3, 1, 1, 1, 1, 0, 1}},  /* overlapping windows */
    {4, 37, 14, 14, {2, 2, 2, 2, 0, 0, 0, 1}}, /* C not a multiple of a warp: NHWC channel vectors */
    /* C a multiple of 8: max pooling's NHWC vector kernels (8 channels a thread) */
    {2, 16, 11, 11, {3, 3, 2, 2, 1, 1, 0, 1}},
    {2, 64, 13, 13, {3, 3, 2, 2, 0, 0, 1, 1}},
    {3, 8, 7, 9, {2, 3, 1, 2, 1, 0, 0, 1}},
    /* Max pooling's workspace: window offsets in one byte up to 254
     * elements (14x18, ceil_mode), in int32 from 255 (15x17); with 3
     * channels and with 8 or 16 (the NHWC vector kernels). */
    {2, 3, 16, 20, {14, 18, 2, 2, 0, 1, 1, 1}},
    {2, 8, 16, 20, {14, 18, 2, 2, 0, 1, 1, 1}},
    {2, 3, 20, 20, {15, 17, 5, 3, 1, 2, 0, 1}},
    {2, 16, 20, 20, {15, 17, 5, 3, 1, 2, 0, 1}},
};

typedef struct adaptive_case {
  int64_t N, C, H, W, OH, OW;
} adaptive_case;

static const adaptive_case adaptive_cases[] = {
    {2, 3, 7, 7, 1, 1},   /* global */
    {2, 3, 10, 9, 3, 4},  /* bins of unequal sizes */
    {1, 4, 13, 6, 6, 6},  /* overlapping bins */
    {1, 37, 13, 6, 6, 6}, /* the same over 37 channels */
    {2, 2, 5, 5, 7, 7},   /* output larger than input */
    {3, 5, 6, 6, 6, 6},   /* one pixel per bin: a copy */
};

#define NCASES(a) (sizeof a / sizeof a[0])

/* Elements of t (downloaded) that are not its f64 view rounded to f32:
 * none where the op only selects an input. */
static int64_t count_inexact(const obuf *t) {
  int64_t bad = 0;
  for (int64_t i = 0; i < t->n; i++) {
    float want = (float)t->d[i];
    bad += memcmp(&t->f[i], &want, 4) != 0;
  }
  return bad;
}

static const char *layout_name(ct_layout lay) { return lay == CT_LAYOUT_NHWC ? "NHWC" : "NCHW"; }

/* x and dx [N, C, H, W], y and dy at the case's output size. */
static void pool_bufs(op_env *e, const pool_case *c, obuf *x, obuf *y, obuf *dy, obuf *dx) {
  const ct_pool2d_params *p = &c->p;
  int64_t OH = pool_out(c->H, p->kernel_h, p->stride_h, p->pad_h, p->ceil_mode);
  int64_t OW = pool_out(c->W, p->kernel_w, p->stride_w, p->pad_w, p->ceil_mode);
  *x = OB(e->dev, c->N, c->C, c->H, c->W), *dx = OB(e->dev, c->N, c->C, c->H, c->W);
  *y = OB(e->dev, c->N, c->C, OH, OW), *dy = OB(e->dev, c->N, c->C, OH, OW);
}

static void pool_pass(op_env *e, const pool_case *c, ct_dtype dt, ct_layout lay, double tol) {
  const ct_backend *B = e->be, *R = e->rb;
  ct_pool2d_params p = c->p;
  obuf x, y, dy, dx;
  pool_bufs(e, c, &x, &y, &dy, &dx);
  x.lay = y.lay = dy.lay = dx.lay = lay;
  ob_rand(&x, &e->rng, 1.0, dt), ob_rand(&dy, &e->rng, 1.0, dt);
  char base[160];
  snprintf(base, sizeof base, "N%lld C%lld %lldx%lld k%dx%d s%d,%d p%d,%d ceil%d %s %s", (long long)c->N,
           (long long)c->C, (long long)c->H, (long long)c->W, p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h,
           p.pad_w, p.ceil_mode, ct_dtype_name(dt), layout_name(lay));
  ct_tensor xg = ob_dev(&x), dyg = ob_dev(&dy), yg = ob_out(&y, dt);
  ct_tensor xr = ob_ref(&x), yr = ob_ref(&y), dyr = ob_ref(&dy), dxr = ob_ref(&dx);

  /* max: each backend keeps its own workspace; compare y and dx */
  size_t wsg = B->maxpool2d_workspace_bytes(e->dev, &p, &xg, &yg);
  size_t wsr = R->maxpool2d_workspace_bytes(e->ref, &p, &xr, &yr);
  CHECK_MSG(wsg > 0 && wsr > 0, "%s: max-pool workspace %zu bytes, reference %zu", op_case(e, "maxpool %s", base), wsg,
            wsr);
  void *wg = ct_device_alloc(e->dev, wsg + 64), *wr = malloc(wsr + 64);
  CHECK_OK(B->maxpool2d_fwd(e->dev, &p, &xg, &yg, wg));
  CHECK_OK(R->maxpool2d_fwd(e->ref, &p, &xr, &yr, wr));
  CHECK_ERR_NZ(e, &y, tol, "maxpool fwd %s", base);
  int64_t bad = count_inexact(&y);
  CHECK_MSG(bad == 0, "%s: %lld outputs are not exactly an input", op_case(e, "maxpool fwd %s", base), (long long)bad);
  ct_tensor dxg = ob_out(&dx, dt);
  CHECK_OK(B->maxpool2d_bwd(e->dev, &p, &dyg, wg, &dxg));
  CHECK_OK(R->maxpool2d_bwd(e->ref, &p, &dyr, wr, &dxr));
  CHECK_ERR_NZ(e, &dx, tol, "maxpool bwd %s", base);
  yg = ob_out(&y, dt);
  CHECK_OK(B->maxpool2d_fwd(e->dev, &p, &xg, &yg, NULL));
  CHECK_OK(R->maxpool2d_fwd(e->ref, &p, &xr, &yr, NULL));
  CHECK_ERR_NZ(e, &y, tol, "maxpool fwd-inference %s", base);
  ct_device_free(e->dev, wg);
  free(wr);

  for (int cip = 0; cip <= 1; cip++) {
    p.count_include_pad = cip;
    yg = ob_out(&y, dt);
    CHECK_OK(B->avgpool2d_fwd(e->dev, &p, &xg, &yg));
    CHECK_OK(R->avgpool2d_fwd(e->ref, &p, &xr, &yr));
    CHECK_ERR_NZ(e, &y, tol, "avgpool fwd cip%d %s", cip, base);
    dxg = ob_out(&dx, dt);
    CHECK_OK(B->avgpool2d_bwd(e->dev, &p, &dyg, &dxg));
    CHECK_OK(R->avgpool2d_bwd(e->ref, &p, &dyr, &dxr));
    CHECK_ERR_NZ(e, &dx, tol, "avgpool bwd cip%d %s", cip, base);
  }
  ob_free(&x), ob_free(&y), ob_free(&dy), ob_free(&dx);
}

static void adaptive_pass(op_env *e, const adaptive_case *c, ct_dtype dt, ct_layout lay, double tol) {
  const ct_backend *B = e->be, *R = e->rb;
  obuf x = OB(e->dev, c->N, c->C, c->H, c->W), y = OB(e->dev, c->N, c->C, c->OH, c->OW);
  obuf dy = OB(e->dev, c->N, c->C, c->OH, c->OW), dx = OB(e->dev, c->N, c->C, c->H, c->W);
  x.lay = y.lay = dy.lay = dx.lay = lay;
  ob_rand(&x, &e->rng, 1.0, dt), ob_rand(&dy, &e->rng, 1.0, dt);
  char base[128];
  snprintf(base, sizeof base, "N%lld C%lld %lldx%lld -> %lldx%lld %s %s", (long long)c->N, (long long)c->C,
           (long long)c->H, (long long)c->W, (long long)c->OH, (long long)c->OW, ct_dtype_name(dt), layout_name(lay));
  ct_tensor xg = ob_dev(&x), dyg = ob_dev(&dy);
  ct_tensor xr = ob_ref(&x), yr = ob_ref(&y), dyr = ob_ref(&dy), dxr = ob_ref(&dx);
  ct_tensor yg = ob_out(&y, dt);
  CHECK_OK(B->adaptive_avgpool2d_fwd(e->dev, &xg, &yg));
  CHECK_OK(R->adaptive_avgpool2d_fwd(e->ref, &xr, &yr));
  CHECK_ERR_NZ(e, &y, tol, "adaptive avg fwd %s", base);
  ct_tensor dxg = ob_out(&dx, dt);
  CHECK_OK(B->adaptive_avgpool2d_bwd(e->dev, &dyg, &dxg));
  CHECK_OK(R->adaptive_avgpool2d_bwd(e->ref, &dyr, &dxr));
  CHECK_ERR_NZ(e, &dx, tol, "adaptive avg bwd %s", base);
  int32_t *ig = ct_device_alloc(e->dev, (size_t)y.n * 4), *ir = malloc((size_t)y.n * 4);
  yg = ob_out(&y, dt);
  CHECK_OK(B->adaptive_maxpool2d_fwd(e->dev, &xg, &yg, ig));
  CHECK_OK(R->adaptive_maxpool2d_fwd(e->ref, &xr, &yr, ir));
  CHECK_ERR_NZ(e, &y, tol, "adaptive max fwd %s", base);
  int64_t bad = count_inexact(&y);
  CHECK_MSG(bad == 0, "%s: %lld outputs are not exactly an input", op_case(e, "adaptive max fwd %s", base),
            (long long)bad);
  dxg = ob_out(&dx, dt);
  CHECK_OK(B->adaptive_maxpool2d_bwd(e->dev, &dyg, ig, &dxg));
  CHECK_OK(R->adaptive_maxpool2d_bwd(e->ref, &dyr, ir, &dxr));
  CHECK_ERR_NZ(e, &dx, tol, "adaptive max bwd %s", base);
  ct_device_free(e->dev, ig);
  free(ir);
  ob_free(&x), ob_free(&y), ob_free(&dy), ob_free(&dx);
}

/* ||a - b|| / ||b||, b the reference's values. */
static double l2_err(const float *a, const float *b, int64_t n) {
  double d = 0, r = 0;
  for (int64_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
  return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* The reference device's result in dt (a 16-bit buffer), widened. */
static float *ref16_widened(const void *h, ct_dtype dt, int64_t n) {
  float *w = malloc((size_t)n * 4);
  if (!w) ob_die("ref16_widened");
  ct_convert(h, dt, w, CT_F32, (size_t)n);
  return w;
}

static void pool_widened(op_env *e, const pool_case *c, ct_dtype dt, double tol) {
  const ct_backend *B = e->be, *R = e->rb;
  ct_pool2d_params p = c->p;
  obuf x, y, dy, dx;
  pool_bufs(e, c, &x, &y, &dy, &dx);
  ob_rand(&x, &e->rng, 1.0, dt), ob_rand(&dy, &e->rng, 1.0, dt);
  /* the reference's own 16-bit buffers, holding the same values */
  uint16_t *xh = malloc((size_t)x.n * 2), *dyh = malloc((size_t)y.n * 2), *yh = malloc((size_t)y.n * 2);
  uint16_t *dxh = malloc((size_t)x.n * 2);
  if (!xh || !dyh || !yh || !dxh) ob_die("pool_widened");
  ct_convert(x.f, CT_F32, xh, dt, (size_t)x.n);
  ct_convert(dy.f, CT_F32, dyh, dt, (size_t)dy.n);
  const int64_t OH = y.shape[2], OW = y.shape[3];
  ct_tensor xr = ct_tensor_4d(xh, dt, c->N, c->C, c->H, c->W), dyr = ct_tensor_4d(dyh, dt, c->N, c->C, OH, OW);
  ct_tensor yr = ct_tensor_4d(yh, dt, c->N, c->C, OH, OW), dxr = ct_tensor_4d(dxh, dt, c->N, c->C, c->H, c->W);
  ct_tensor xg = ob_dev(&x), dyg = ob_dev(&dy), yg = ob_out(&y, dt), dxg = ob_out(&dx, dt);
  char nm[160];
  snprintf(nm, sizeof nm, "%s pool (the reference's %s path) N%lld C%lld %lldx%lld k%dx%d s%d,%d p%d,%d ceil%d",
           ct_dtype_name(dt), ct_dtype_name(dt), (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->W,
           p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.ceil_mode);
  size_t wsg = B->maxpool2d_workspace_bytes(e->dev, &p, &xg, &yg);
  size_t wsr = R->maxpool2d_workspace_bytes(e->ref, &p, &xr, &yr);
  CHECK_MSG(wsg > 0 && wsr > 0, "%s: max-pool workspace %zu bytes, reference %zu", op_case(e, "%s", nm), wsg, wsr);
  void *wg = ct_device_alloc(e->dev, wsg + 64), *wr = malloc(wsr + 64);
  CHECK_OK(B->maxpool2d_fwd(e->dev, &p, &xg, &yg, wg));
  CHECK_OK(B->maxpool2d_bwd(e->dev, &p, &dyg, wg, &dxg));
  CHECK_OK(R->maxpool2d_fwd(e->ref, &p, &xr, &yr, wr));
  CHECK_OK(R->maxpool2d_bwd(e->ref, &p, &dyr, wr, &dxr));
  ct_device_free(e->dev, wg);
  free(wr);
  ob_get(&y), ob_get(&dx);
  float *yw = ref16_widened(yh, dt, y.n), *dxw = ref16_widened(dxh, dt, dx.n);
  CHECK_MSG(memcmp(y.f, yw, (size_t)y.n * 4) == 0, "%s: max-pool output differs from the reference",
            op_case(e, "%s", nm));
  double ed = l2_err(dx.f, dxw, dx.n);
  CHECK_MSG(ed <= tol, "%s: max-pool dx err %.3g", op_case(e, "%s", nm), ed);
  free(yw), free(dxw);
  for (int cip = 0; cip <= 1; cip++) {
    p.count_include_pad = cip;
    yg = ob_out(&y, dt), dxg = ob_out(&dx, dt);
    CHECK_OK(B->avgpool2d_fwd(e->dev, &p, &xg, &yg));
    CHECK_OK(B->avgpool2d_bwd(e->dev, &p, &dyg, &dxg));
    CHECK_OK(R->avgpool2d_fwd(e->ref, &p, &xr, &yr));
    CHECK_OK(R->avgpool2d_bwd(e->ref, &p, &dyr, &dxr));
    ob_get(&y), ob_get(&dx);
    yw = ref16_widened(yh, dt, y.n), dxw = ref16_widened(dxh, dt, dx.n);
    double ey = l2_err(y.f, yw, y.n);
    ed = l2_err(dx.f, dxw, dx.n);
    CHECK_MSG(ey <= tol && ed <= tol, "%s cip%d: avg-pool err y %.3g dx %.3g", op_case(e, "%s", nm), cip, ey, ed);
    free(yw), free(dxw);
  }
  free(xh), free(dyh), free(yh), free(dxh);
  ob_free(&x), ob_free(&y), ob_free(&dy), ob_free(&dx);
}

void op_pool(op_env *e) {
  const op_target *t = e->t;
  const ct_dtype dts[3] = {CT_F32, CT_BF16, CT_F16};
  for (int k = 0; k < 3; k++) {
    double tol = dts[k] == CT_F32 ? t->tol : op_tol16_of(&t->rounded16, dts[k]);
    if (tol <= 0) continue;
    for (int nhwc = 0; nhwc <= (t->caps & OP_CAP_POOL_NHWC ? 1 : 0); nhwc++) {
      ct_layout lay = nhwc ? CT_LAYOUT_NHWC : CT_LAYOUT_PLAIN;
      for (size_t i = 0; i < NCASES(pool_cases); i++) pool_pass(e, &pool_cases[i], dts[k], lay, tol);
      for (size_t i = 0; i < NCASES(adaptive_cases); i++) adaptive_pass(e, &adaptive_cases[i], dts[k], lay, tol);
    }
  }
  for (int k = 1; k < 3; k++) {
    double tol = op_tol16_of(&t->pool_widened, dts[k]);
    if (tol > 0)
      for (size_t i = 0; i < NCASES(pool_cases); i++) pool_widened(e, &pool_cases[i], dts[k], tol);
  }
}
