/* Space-to-depth convolutions on CUDA (cuda_conv.c, cuda_s2d.cu): a
 * strided convolution over a few input channels in channels-last runs as
 * a stride-1 convolution of the space-to-depth input. Checked here:
 * - forward (bias and fused ReLU) and weight gradient (beta 0 and 1, with
 *   the bias gradient) of shapes that take the path (AlexNet's and
 *   ResNet's stems in small, 3x3/2, one input channel, odd sizes, a
 *   rectangular kernel, a kernel that is not a multiple of the stride)
 *   against the f64 reference, in f32, bf16 and f16 with the f32 weight
 *   gradient autocast gives, 16-bit weight gradients, a 16-bit pair with
 *   an f32 output, x plain or NHWC; the same calls on a device with the
 *   path off (CTRAIN_CUDA_S2D=0) agree with it; backward-data (which
 *   stays direct) against the reference;
 * - which plans the backend's describe lists: space-to-depth forward and
 *   weight-gradient plans with CTRAIN_CUDA_S2D=1 for the shapes that fit,
 *   none for the controls (C a multiple of 8, stride 1, a kernel narrower
 *   than the stride, Cp past 64, more multiply-adds than the direct pass
 *   over 8 channels), for all-plain operands, or with it off; shapes that
 *   do not agree are refused as on the direct path; the planned
 *   workspaces hold S and W' (or dW') and both passes run inside them
 *   (no call in scratch);
 * - the default (auto) under cudnn_benchmark records a verdict with the
 *   three times, one per convolution even where two share S's shape
 *   (3 and 4 channels at stride 2); on the emulator (legacy API, NHWC algorithms) the direct
 *   pass wins at its uniform cudnnFind times and loses when
 *   CT_EMU_DNN_THIN_C_SLOW makes thin NHWC passes 10x slower, as an H100
 *   ran AlexNet's stem;
 * - CTRAIN_CUDA_S2D=2 is refused when the device opens.
 * Tolerances (normwise, against f64): f32 1e-4 (the op test's cuda
 * convolution tolerance), bf16 1e-2, f16 2e-3. Labelled gpu; exits 77
 * without a CUDA device. */
#include "test_gpu_common.h"

typedef struct scase {
  int64_t N, C, H, W, O, KH, KW;
  int s, ph, pw;
  int fits; /* 1: the shape takes space-to-depth */
} scase;

static const scase cases[] = {
    {2, 3, 31, 29, 8, 11, 11, 4, 2, 2, 1}, /* AlexNet's stem */
    {2, 3, 20, 22, 8, 7, 7, 2, 3, 3, 1},   /* ResNet's stem */
    {3, 3, 15, 15, 16, 3, 3, 2, 1, 1, 1},  /* 3x3/2: 2x2 over 16 */
    {2, 1, 17, 13, 8, 5, 5, 2, 2, 2, 1},   /* one channel: 3x3 over 8 */
    {2, 5, 9, 11, 6, 4, 4, 2, 0, 0, 1},    /* odd sizes, no padding: 2x2 over 24 */
    {2, 2, 14, 16, 4, 5, 3, 3, 1, 2, 1},   /* rectangular, 2x1 over 24, padding 1 and 2 */
    {2, 8, 12, 12, 8, 3, 3, 2, 1, 1, 0},   /* C a multiple of 8 */
    {2, 3, 12, 12, 8, 3, 3, 1, 1, 1, 0},   /* stride 1 */
    {2, 3, 16, 16, 8, 2, 2, 4, 0, 0, 0},   /* kernel narrower than the stride */
    {2, 5, 16, 16, 8, 4, 4, 4, 0, 0, 0},   /* Cp 80 > 64 */
    {2, 6, 13, 13, 8, 4, 4, 3, 1, 1, 0},   /* 2x2 over 56: 224 multiply-adds against 8*16 = 128 */
};
#define NCASES (sizeof cases / sizeof cases[0])

typedef struct mode {
  const char *name;
  ct_dtype in, out, dw; /* x and w; y; dw and db */
  double tol;
} mode;

static const mode modes[] = {
    {"f32", CT_F32, CT_F32, CT_F32, 1e-4},       {"bf16 (f32 dw)", CT_BF16, CT_BF16, CT_F32, 1e-2},
    {"f16 (f32 dw)", CT_F16, CT_F16, CT_F32, 2e-3}, {"bf16 (bf16 dw)", CT_BF16, CT_BF16, CT_BF16, 1e-2},
    {"f16 -> f32 y", CT_F16, CT_F32, CT_F32, 2e-3},
};
#define NMODES (sizeof modes / sizeof modes[0])

static int64_t out_dim(int64_t in, int64_t k, int s, int pad) { return (in + 2 * pad - k) / s + 1; }
#define OH_OF(c) out_dim((c)->H, (c)->KH, (c)->s, (c)->ph)
#define OW_OF(c) out_dim((c)->W, (c)->KW, (c)->s, (c)->pw)

/* A device tensor of dt from host values in plain order, stored NHWC
 * when nhwc (4-D); the host values are rounded to dt in place, so the
 * reference sees what the device holds. */
static ct_tensor up(ct_device *dev, float *h, int ndim, const int64_t *shape, ct_dtype dt, int nhwc) {
  ct_tensor t = ct_tensor_view(NULL, dt, ndim, shape);
  const int64_t n = ct_tensor_numel(&t);
  float *tmp = malloc((size_t)n * 4);
  void *raw = malloc((size_t)n * 4);
  ct_convert(h, CT_F32, raw, dt, (size_t)n);
  ct_convert(raw, dt, h, CT_F32, (size_t)n);
  if (nhwc) to_nhwc(h, tmp, shape[0], shape[1], shape[2] * shape[3]);
  else memcpy(tmp, h, (size_t)n * 4);
  ct_convert(tmp, CT_F32, raw, dt, (size_t)n);
  t.data = ct_device_alloc(dev, (size_t)n * 4);
  CHECK(t.data != NULL);
  CHECK_OK(ct_device_copy(dev, t.data, NULL, raw, (size_t)n * ct_dtype_size(dt)));
  CHECK_OK(ct_device_sync(dev));
  t.device = dev;
  t.layout = nhwc ? CT_LAYOUT_NHWC : CT_LAYOUT_PLAIN;
  free(tmp), free(raw);
  return t;
}

/* A zeroed device tensor of dt. */
static ct_tensor blank(ct_device *dev, int ndim, const int64_t *shape, ct_dtype dt, int nhwc) {
  ct_tensor t = ct_tensor_view(NULL, dt, ndim, shape);
  float *h = calloc((size_t)ct_tensor_numel(&t), 4);
  t = up(dev, h, ndim, shape, dt, nhwc);
  free(h);
  return t;
}

/* The device tensor's values as f32 in plain order (caller frees). */
static float *down(ct_device *dev, const ct_tensor *t) {
  const int64_t n = ct_tensor_numel(t);
  float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
  void *raw = malloc((size_t)n * 4);
  CHECK_OK(ct_device_sync(dev));
  CHECK_OK(ct_device_copy(NULL, raw, dev, t->data, (size_t)n * ct_dtype_size(t->dtype)));
  ct_convert(raw, t->dtype, a, CT_F32, (size_t)n);
  if (t->layout == CT_LAYOUT_NHWC) from_nhwc(a, b, t->shape[0], t->shape[1], t->shape[2] * t->shape[3]);
  else memcpy(b, a, (size_t)n * 4);
  free(a), free(raw);
  return b;
}

/* max |a - ref| / max |ref| */
static double nerr(const float *a, const double *ref, int64_t n) {
  double num = 0, den = 1e-30;
  for (int64_t i = 0; i < n; i++) {
    const double e = fabs((double)a[i] - ref[i]);
    if (!(e <= num)) num = isnan(e) ? INFINITY : e;
    if (fabs(ref[i]) > den) den = fabs(ref[i]);
  }
  return num / den;
}

static double *widen(const float *f, int64_t n) {
  double *d = malloc((size_t)n * 8);
  for (int64_t i = 0; i < n; i++) d[i] = f[i];
  return d;
}

static float *rnd(int64_t n, double scale) {
  float *f = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) f[i] = (float)(ct_rng_normal(&g_rng) * scale);
  return f;
}

/* One case in one mode, x plain or NHWC, on dev; the results of y, dw
 * (beta 0 then 1) and db go to out[0..3] for the comparison between
 * devices (caller frees). */
static void run_case(ct_device *dev, const scase *c, const mode *m, int x_nhwc, float *out[4]) {
  const ct_backend *B = ct_device_backend(dev);
  const ct_conv2d_params p = {c->s, c->s, c->ph, c->pw, 1, 1, 1};
  const int64_t OH = OH_OF(c), OW = OW_OF(c);
  const int64_t xs[4] = {c->N, c->C, c->H, c->W}, wsh[4] = {c->O, c->C, c->KH, c->KW}, bs[1] = {c->O};
  const int64_t ys[4] = {c->N, c->O, OH, OW};
  const int64_t nx = c->N * c->C * c->H * c->W, nw = c->O * c->C * c->KH * c->KW, ny = c->N * c->O * OH * OW;
  char nm[200];
  snprintf(nm, sizeof nm, "N%lld C%lld %lldx%lld O%lld k%lldx%lld s%d p%d,%d %s x %s", (long long)c->N,
           (long long)c->C, (long long)c->H, (long long)c->W, (long long)c->O, (long long)c->KH, (long long)c->KW,
           c->s, c->ph, c->pw, m->name, x_nhwc ? "nhwc" : "plain");
  float *hx = rnd(nx, 1.0), *hw = rnd(nw, 0.3), *hb = rnd(c->O, 0.5), *hdy = rnd(ny, 1.0);
  float *hdw0 = rnd(nw, 1.0), *hdb0 = rnd(c->O, 1.0);
  ct_tensor x = up(dev, hx, 4, xs, m->in, x_nhwc), w = up(dev, hw, 4, wsh, m->in, 0);
  ct_tensor b = up(dev, hb, 1, bs, CT_F32, 0), dy = up(dev, hdy, 4, ys, m->out == CT_F32 ? m->in : m->out, 1);
  ct_tensor y = blank(dev, 4, ys, m->out, 1);
  /* the reference in f64 on the values the device holds */
  double *dx_ = widen(hx, nx), *dw_ = widen(hw, nw), *db_ = widen(hb, c->O), *ddy = widen(hdy, ny);
  double *ry = calloc((size_t)ny, 8), *rdw = calloc((size_t)nw, 8), *rdb = calloc((size_t)c->O, 8);
  double *rdx = calloc((size_t)nx, 8);
  ct_tensor rx = ct_tensor_view(dx_, CT_F64, 4, xs), rw = ct_tensor_view(dw_, CT_F64, 4, wsh);
  ct_tensor rb = ct_tensor_view(db_, CT_F64, 1, bs), rdy = ct_tensor_view(ddy, CT_F64, 4, ys);
  ct_tensor ryt = ct_tensor_view(ry, CT_F64, 4, ys), rdwt = ct_tensor_view(rdw, CT_F64, 4, wsh);
  ct_tensor rdbt = ct_tensor_view(rdb, CT_F64, 1, bs), rdxt = ct_tensor_view(rdx, CT_F64, 4, xs);
  CHECK_OK(R_->conv2d_fwd(g_ref, &p, &rx, &rw, &rb, CT_ACT_RELU, &ryt));
  CHECK_OK(B->conv2d_fwd(dev, &p, &x, &w, &b, CT_ACT_RELU, &y));
  out[0] = down(dev, &y);
  double e = nerr(out[0], ry, ny);
  CHECK_MSG(e <= m->tol, "%s fwd: error %.3g", nm, e);
  for (int beta = 0; beta <= 1; beta++) {
    float *h0 = malloc((size_t)nw * 4), *hb0 = malloc((size_t)c->O * 4);
    memcpy(h0, hdw0, (size_t)nw * 4), memcpy(hb0, hdb0, (size_t)c->O * 4);
    ct_tensor dw = up(dev, h0, 4, wsh, m->dw, 0), db = up(dev, hb0, 1, bs, m->dw, 0);
    for (int64_t i = 0; i < nw; i++) rdw[i] = h0[i];
    for (int64_t i = 0; i < c->O; i++) rdb[i] = hb0[i];
    CHECK_OK(R_->conv2d_bwd_weights(g_ref, &p, &rx, &rdy, &rdwt, &rdbt, (float)beta));
    CHECK_OK(B->conv2d_bwd_weights(dev, &p, &x, &dy, &dw, &db, (float)beta));
    float *gw = down(dev, &dw), *gb_ = down(dev, &db);
    e = nerr(gw, rdw, nw);
    CHECK_MSG(e <= m->tol, "%s bwd_weights beta %d dw: error %.3g", nm, beta, e);
    e = nerr(gb_, rdb, c->O);
    CHECK_MSG(e <= m->tol, "%s bwd_weights beta %d db: error %.3g", nm, beta, e);
    out[1 + beta] = gw;
    if (beta) out[3] = gb_;
    else free(gb_);
    ct_device_free(dev, dw.data), ct_device_free(dev, db.data);
    free(h0), free(hb0);
  }
  /* backward-data stays direct: still right next to the others */
  ct_tensor dx = blank(dev, 4, xs, m->out, x_nhwc);
  CHECK_OK(R_->conv2d_bwd_data(g_ref, &p, &rdy, &rw, &rdxt));
  CHECK_OK(B->conv2d_bwd_data(dev, &p, &dy, &w, &dx));
  float *gdx = down(dev, &dx);
  e = nerr(gdx, rdx, nx);
  CHECK_MSG(e <= m->tol, "%s bwd_data: error %.3g", nm, e);
  free(gdx);
  ct_device_free(dev, x.data), ct_device_free(dev, w.data), ct_device_free(dev, b.data);
  ct_device_free(dev, dy.data), ct_device_free(dev, y.data), ct_device_free(dev, dx.data);
  free(hx), free(hw), free(hb), free(hdy), free(hdw0), free(hdb0);
  free(dx_), free(dw_), free(db_), free(ddy), free(ry), free(rdw), free(rdb), free(rdx);
}

static char text[1 << 16];

/* The backend's describe text into `text`. */
static const char *describe(ct_device *dev) {
  ct_device_backend(dev)->describe(dev, text, sizeof text);
  return text;
}

/* 1 when a line of text starting with prefix (any line if "") names a
 * space-to-depth plan. */
static int s2d_line(const char *prefix) {
  for (const char *ln = text; *ln;) {
    const char *end = strchr(ln, '\n');
    const size_t len = end ? (size_t)(end - ln) : strlen(ln);
    const char *hit = strstr(ln, "space-to-depth");
    if (hit && hit < ln + len && !strncmp(ln, prefix, strlen(prefix))) return 1;
    ln += len + (end != NULL);
  }
  return 0;
}

/* Opens "cuda" with CTRAIN_CUDA_S2D set to v (NULL: unset). */
static ct_device *open_with(const char *v) {
  if (v) setenv("CTRAIN_CUDA_S2D", v, 1);
  else unsetenv("CTRAIN_CUDA_S2D");
  ct_device *d = NULL;
  CHECK_OK(ct_device_open("cuda", &d));
  unsetenv("CTRAIN_CUDA_S2D");
  return d;
}

/* Every case and mode on a device with the path forced on (a fresh one
 * per case, whose describe then lists a space-to-depth plan exactly when
 * the case fits, never for backward-data) and one with it off: both
 * right, and alike. Seeds are reset per device so both see the same
 * inputs. */
static void cases_both_ways(ct_device *off) {
  for (size_t i = 0; i < NCASES; i++) {
    ct_device *on = open_with("1");
    for (size_t k = 0; k < NMODES; k++)
      for (int xn = 0; xn <= 1; xn++) {
        float *a[4], *b[4];
        const uint64_t seed = 1000 + 10 * i + 2 * k + (uint64_t)xn;
        ct_rng_init(&g_rng, seed, CT_RNG_TEST, 0, 0);
        run_case(on, &cases[i], &modes[k], xn, a);
        ct_rng_init(&g_rng, seed, CT_RNG_TEST, 0, 0);
        run_case(off, &cases[i], &modes[k], xn, b);
        const scase *c = &cases[i];
        const int64_t OH = OH_OF(c), OW = OW_OF(c);
        const int64_t n[4] = {c->N * c->O * OH * OW, c->O * c->C * c->KH * c->KW, c->O * c->C * c->KH * c->KW, c->O};
        for (int j = 0; j < 4; j++) {
          double *ref = widen(b[j], n[j]);
          const double e = nerr(a[j], ref, n[j]);
          CHECK_MSG(e <= modes[k].tol, "case %zu %s x %s: output %d, space-to-depth against direct: %.3g", i,
                    modes[k].name, xn ? "nhwc" : "plain", j, e);
          free(ref), free(a[j]), free(b[j]);
        }
      }
    describe(on);
    CHECK_MSG(s2d_line("conv2d_fwd") == cases[i].fits && s2d_line("conv2d_bwd_weights") == cases[i].fits,
              "case %zu: describe with CTRAIN_CUDA_S2D=1 %s space-to-depth forward and weight-gradient plans:\n%s", i,
              cases[i].fits ? "lacks" : "lists", text);
    CHECK_MSG(!s2d_line("conv2d_bwd_data"), "case %zu: a backward-data pass ran space-to-depth:\n%s", i, text);
    ct_device_close(on);
  }
}

/* The planned workspaces of an NHWC forward and weight gradient (f32
 * dw, as autocast's) of case c in f16, each pass run inside its own:
 * bytes[0] forward, bytes[1] weight gradient. */
static void planned_workspace(ct_device *dev, const scase *c, size_t bytes[2]) {
  const ct_backend *B = ct_device_backend(dev);
  const ct_conv2d_params p = {c->s, c->s, c->ph, c->pw, 1, 1, 1};
  const int64_t xs[4] = {c->N, c->C, c->H, c->W}, wsh[4] = {c->O, c->C, c->KH, c->KW};
  const int64_t ys[4] = {c->N, c->O, OH_OF(c), OW_OF(c)};
  float *hx = rnd(c->N * c->C * c->H * c->W, 1.0), *hw = rnd(c->O * c->C * c->KH * c->KW, 0.3);
  float *hdy = rnd(ys[0] * ys[1] * ys[2] * ys[3], 1.0);
  ct_tensor x = up(dev, hx, 4, xs, CT_F16, 1), w = up(dev, hw, 4, wsh, CT_F16, 0);
  ct_tensor y = blank(dev, 4, ys, CT_F16, 1), dy = up(dev, hdy, 4, ys, CT_F16, 1);
  ct_tensor dw = blank(dev, 4, wsh, CT_F32, 0);
  for (int pass = 0; pass < 2; pass++) {
    bytes[pass] = pass ? B->conv2d_workspace_bytes(dev, 2, &p, &x, &dy, &dw)
                       : B->conv2d_workspace_bytes(dev, 0, &p, &x, &w, &y);
    void *ws = bytes[pass] ? ct_device_alloc(dev, bytes[pass]) : NULL;
    B->set_workspace(dev, ws, bytes[pass]);
    if (pass) CHECK_OK(B->conv2d_bwd_weights(dev, &p, &x, &dy, &dw, NULL, 0.f));
    else CHECK_OK(B->conv2d_fwd(dev, &p, &x, &w, NULL, CT_ACT_NONE, &y));
    CHECK_OK(ct_device_sync(dev));
    B->set_workspace(dev, NULL, 0);
    ct_device_free(dev, ws);
  }
  ct_device_free(dev, x.data), ct_device_free(dev, w.data), ct_device_free(dev, y.data);
  ct_device_free(dev, dy.data), ct_device_free(dev, dw.data);
  free(hx), free(hw), free(hdy);
}

/* What must stay direct with the path forced on: a convolution whose
 * operands are all plain (NCHW models), and shapes that do not agree,
 * which the direct pass refuses (x's channels against w's, y's size
 * against the parameters') instead of running S and W' made to agree. */
static void stays_direct(void) {
  ct_device *dev = open_with("1");
  const ct_backend *B = ct_device_backend(dev);
  const scase *c = &cases[1];
  const ct_conv2d_params p = {c->s, c->s, c->ph, c->pw, 1, 1, 1};
  const int64_t xs[4] = {c->N, c->C, c->H, c->W}, wsh[4] = {c->O, c->C, c->KH, c->KW};
  const int64_t ys[4] = {c->N, c->O, OH_OF(c), OW_OF(c)};
  const int64_t w4[4] = {c->O, c->C + 1, c->KH, c->KW}, y1[4] = {c->N, c->O, OH_OF(c) + 1, OW_OF(c)};
  float *hx = rnd(c->N * c->C * c->H * c->W, 1.0), *hw = rnd(c->O * (c->C + 1) * c->KH * c->KW, 0.3);
  ct_tensor x = up(dev, hx, 4, xs, CT_F32, 0), w = up(dev, hw, 4, wsh, CT_F32, 0);
  ct_tensor y = blank(dev, 4, ys, CT_F32, 0);
  CHECK_OK(B->conv2d_fwd(dev, &p, &x, &w, NULL, CT_ACT_NONE, &y));
  CHECK_OK(ct_device_sync(dev));
  describe(dev);
  CHECK_MSG(!s2d_line(""), "a convolution with every operand plain ran space-to-depth:\n%s", text);
  ct_tensor xn = up(dev, hx, 4, xs, CT_F32, 1), yn = blank(dev, 4, ys, CT_F32, 1);
  ct_tensor wbad = up(dev, hw, 4, w4, CT_F32, 0), ybad = blank(dev, 4, y1, CT_F32, 1);
  CHECK(B->conv2d_fwd(dev, &p, &xn, &wbad, NULL, CT_ACT_NONE, &yn) != CT_OK);
  CHECK(B->conv2d_fwd(dev, &p, &xn, &w, NULL, CT_ACT_NONE, &ybad) == CT_ERR_SHAPE);
  CHECK(B->conv2d_bwd_weights(dev, &p, &xn, &yn, &wbad, NULL, 0.f) != CT_OK);
  ct_tensor *all[] = {&x, &w, &y, &xn, &yn, &wbad, &ybad};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_device_free(dev, all[i]->data);
  free(hx), free(hw);
  ct_device_close(dev);
}

int main(void) {
  unsetenv("CTRAIN_CUDA_TF32"); /* f32 tolerances assume FMA math */
  gpu_test_setup(7);
  /* a bad value is refused when the device opens */
  setenv("CTRAIN_CUDA_S2D", "2", 1);
  ct_device *bad = NULL;
  CHECK(ct_device_open("cuda", &bad) == CT_ERR_INVALID_ARG);
  CHECK(strstr(ct_last_error(), "CTRAIN_CUDA_S2D=2") != NULL);
  if (bad) ct_device_close(bad);
  unsetenv("CTRAIN_CUDA_S2D");

  ct_device *off = open_with("0");
  cases_both_ways(off);
  describe(off);
  CHECK_MSG(!s2d_line(""), "describe with CTRAIN_CUDA_S2D=0 lists a space-to-depth plan:\n%s", text);

  stays_direct();

  /* the planned workspaces cover S and W' or dW' (f16: AlexNet's small
   * stem, S [2, 48, 9, 8], W' [8, 48, 3, 3]), and nothing runs in scratch */
  size_t ws_on[2] = {0, 0}, ws_off[2] = {0, 0};
  ct_device *fresh = open_with("1");
  planned_workspace(fresh, &cases[0], ws_on);
  describe(fresh);
  CHECK_MSG(s2d_line("conv2d_fwd") && s2d_line("conv2d_bwd_weights") && strstr(text, "(0 in scratch)") &&
                !strstr(text, "(1 in scratch)"),
            "the planned workspaces did not hold the space-to-depth passes:\n%s", text);
  ct_device_close(fresh);
  fresh = open_with("0");
  planned_workspace(fresh, &cases[0], ws_off);
  ct_device_close(fresh);
  const size_t s_bytes = 2 * 48 * 9 * 8 * 2, w_bytes = 8 * 48 * 3 * 3 * 2;
  for (int pass = 0; pass < 2; pass++)
    CHECK_MSG(ws_on[pass] >= s_bytes + w_bytes, "pass %d: planned workspace %zu bytes, S and W' need %zu", pass,
              ws_on[pass], s_bytes + w_bytes);
  printf("planned workspaces of AlexNet's small stem (forward, weight gradient): %zu, %zu bytes with "
         "space-to-depth, %zu, %zu without\n",
         ws_on[0], ws_on[1], ws_off[0], ws_off[1]);

  /* auto under cudnn_benchmark: a verdict with its times, right results.
   * The emulator's verdict is known where its legacy NHWC algorithms
   * decide (CTRAIN_CUDA_CONV_API=legacy, not under CT_EMU_DNN_NO_NHWC):
   * the slow-down knob leaves the graph API's times, the default, alone. */
  const char *api = getenv("CTRAIN_CUDA_CONV_API");
  const int emulated = getenv("CTRAIN_TEST_EMU") && !getenv("CT_EMU_DNN_NO_NHWC") && api && !strcmp(api, "legacy");
  for (int slow = 0; slow <= emulated; slow++) {
    if (slow) setenv("CT_EMU_DNN_THIN_C_SLOW", "10", 1);
    ct_device *au = open_with(NULL);
    CHECK_OK(ct_device_backend(au)->set_option(au, "cudnn_benchmark", 1));
    /* ResNet's small stem over 3 and over 4 channels: S [2, 16, 13, 14]
     * for both, but each its own verdict (forward and weight gradient) */
    scase four = cases[1];
    four.C = 4;
    const scase *both[2] = {&cases[1], &four};
    for (int k = 0; k < 2; k++) {
      float *a[4];
      ct_rng_init(&g_rng, 99, CT_RNG_TEST, 0, 0);
      run_case(au, both[k], &modes[2], 1, a);
      for (int j = 0; j < 4; j++) free(a[j]);
    }
    describe(au);
    int verdicts = 0;
    for (const char *v = text; (v = strstr(v, "taken: ")) != NULL; v++) verdicts++;
    CHECK_MSG(verdicts == 4 && strstr(text, "space-to-depth 2 of 3x") && strstr(text, "space-to-depth 2 of 4x"),
              "%d space-to-depth verdicts under cudnn_benchmark, 4 expected (two stems, two passes):\n%s", verdicts,
              text);
    printf("auto under cudnn_benchmark%s:\n%s", slow ? " with CT_EMU_DNN_THIN_C_SLOW=10" : "", text);
    if (emulated) {
      const int taken = strstr(text, " taken: ") != NULL && strstr(text, "not taken: ") == NULL;
      CHECK_MSG(taken == slow, "the emulator's %s times should make space-to-depth %s", slow ? "slowed" : "uniform",
                slow ? "win" : "lose");
    }
    ct_device_close(au);
    unsetenv("CT_EMU_DNN_THIN_C_SLOW");
  }
  ct_device_close(off);
  gpu_test_teardown();
  return test_summary("test_gpu_s2d");
}
