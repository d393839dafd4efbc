/* The cpu device (oneDNN) against the reference device on the same random
 * inputs: convolution, linear and matmul (forward, backward data, backward
 * weights with beta 0 and 1), fp32 and bf16; f32 convolutions also with
 * C16, C8 and NHWC activations (a one-channel input stays plain, as the
 * executor leaves it), with the small-map GEMM path (dnnl_conv_gemm.c)
 * and the first-layer paths (dnnl_conv_thin.c) on and off. (In a build without oneDNN
 * both sides are the reference kernels.) Metric and tolerances: see
 * test_cpu_common.h (normwise relative error vs the f64 reference; fp32
 * 1e-5, bf16 1e-2). */
#include "backend/cpu/cpu_conv.h"
#include "test_cpu_common.h"

#define TOL32 1e-5
#define TOL16 1e-2

/* Worst error seen per precision, printed at the end for the record. */
static double worst32, worst16;
#define CHECK_TOL(e, tol, ...)                                      \
  do {                                                              \
    double *w_ = (tol) > TOL32 ? &worst16 : &worst32;               \
    if ((e) > *w_) *w_ = (e);                                       \
    CHECK_MSG((e) <= (tol), __VA_ARGS__);                           \
  } while (0)

typedef struct conv_case {
  int64_t N, C, H, W, O, KH, KW;
  ct_conv2d_params p;
  int bias;
  ct_act act;
} conv_case;

static int64_t out_dim(int64_t in, int k, int s, int pad, int dil) { return (in + 2 * pad - dil * (k - 1) - 1) / s + 1; }

static const char *act_name(ct_act a) {
  static const char *n[] = {"none", "relu", "leaky", "gelu", "silu", "sigmoid", "tanh"};
  return n[a];
}

/* The offset of (n, c, h, w) of a [N, C, H, W] tensor in layout lay. */
static int64_t at(const ct_tensor *t, int64_t n, int64_t c, int64_t h, int64_t w) {
  int64_t C = t->shape[1], H = t->shape[2], W = t->shape[3], b = t->layout == CT_LAYOUT_C16 ? 16 : 8;
  switch (t->layout) {
    case CT_LAYOUT_C16:
    case CT_LAYOUT_C8: return (((n * (C / b) + c / b) * H + h) * W + w) * b + c % b;
    case CT_LAYOUT_NHWC: return ((n * H + h) * W + w) * C + c;
    default: return ((n * C + c) * H + h) * W + w;
  }
}

/* A copy of the plain f32 tensor t in layout lay (t itself when plain),
 * and the way back: lay_back copies a laid-out result into its plain
 * buffer and frees the copy. */
static ct_tensor lay_copy(ct_tensor t, ct_layout lay) {
  if (lay == CT_LAYOUT_PLAIN) return t;
  ct_tensor o = t;
  o.layout = lay;
  o.data = malloc((size_t)ct_tensor_numel(&t) * sizeof(float));
  for (int64_t n = 0; n < t.shape[0]; n++)
    for (int64_t c = 0; c < t.shape[1]; c++)
      for (int64_t h = 0; h < t.shape[2]; h++)
        for (int64_t w = 0; w < t.shape[3]; w++) ((float *)o.data)[at(&o, n, c, h, w)] = ((float *)t.data)[at(&t, n, c, h, w)];
  return o;
}
static void lay_free(ct_tensor o) {
  if (o.layout != CT_LAYOUT_PLAIN) free(o.data);
}
static void lay_back(ct_tensor o, ct_tensor plain) {
  if (o.layout == CT_LAYOUT_PLAIN) return;
  for (int64_t n = 0; n < o.shape[0]; n++)
    for (int64_t c = 0; c < o.shape[1]; c++)
      for (int64_t h = 0; h < o.shape[2]; h++)
        for (int64_t w = 0; w < o.shape[3]; w++)
          ((float *)plain.data)[at(&plain, n, c, h, w)] = ((float *)o.data)[at(&o, n, c, h, w)];
  lay_free(o);
}

static const char *layout_name(ct_layout l) {
  return l == CT_LAYOUT_C16 ? "C16" : l == CT_LAYOUT_C8 ? "C8" : l == CT_LAYOUT_NHWC ? "NHWC" : "NCHW";
}

/* bf16: 0 = f32 run; 1 = bf16 inputs, f32 outputs; 2 = bf16 inputs and
 * outputs. lay: the activations' layout on the cpu side (f32 only). */
static void conv_one(const conv_case *c, int bf16, ct_layout lay, const char *mode) {
  const ct_conv2d_params *p = &c->p;
  int G = p->groups;
  int64_t OH = out_dim(c->H, (int)c->KH, p->stride_h, p->pad_h, p->dil_h);
  int64_t OW = out_dim(c->W, (int)c->KW, p->stride_w, p->pad_w, p->dil_w);
  tb x = TB(c->N, c->C, c->H, c->W), w = TB(c->O, c->C / G, c->KH, c->KW), b = TB(c->O);
  tb y = TB(c->N, c->O, OH, OW), dy = TB(c->N, c->O, OH, OW), dx = TB(c->N, c->C, c->H, c->W);
  tb dw = TB(c->O, c->C / G, c->KH, c->KW), db = TB(c->O);
  tb_rand(&x, 1.0);
  tb_rand(&w, 0.5);
  tb_rand(&b, 0.5);
  tb_rand(&dy, 1.0);
  if (bf16) {
    tb_round_bf16(&x);
    tb_round_bf16(&w);
    tb_round_bf16(&dy);
  }
  double tol = bf16 ? TOL16 : TOL32;
  char nm[200];
  snprintf(nm, sizeof nm, "conv N%lld C%lld %lldx%lld O%lld k%lldx%lld s%d,%d p%d,%d d%d,%d g%d bias%d %s %s %s %s",
           (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->W, (long long)c->O, (long long)c->KH,
           (long long)c->KW, p->stride_h, p->stride_w, p->pad_h, p->pad_w, p->dil_h, p->dil_w, G, c->bias,
           act_name(c->act), bf16 == 0 ? "f32" : bf16 == 1 ? "bf16->f32" : "bf16->bf16", mode, layout_name(lay));

  /* The executor's choice: an input whose channels do not fill a block
   * (a first layer) stays plain; the output takes the layout. */
  int64_t blk = lay == CT_LAYOUT_C16 ? 16 : lay == CT_LAYOUT_C8 ? 8 : 1;
  ct_layout xlay = c->C % blk ? CT_LAYOUT_PLAIN : lay;
  ct_tensor xc = bf16 ? tb_cpu16(&x) : lay_copy(tb_cpu(&x), xlay), wc = bf16 ? tb_cpu16(&w) : tb_cpu(&w);
  ct_tensor dyc = bf16 ? tb_cpu16(&dy) : lay_copy(tb_cpu(&dy), lay);
  ct_tensor bc = tb_cpu(&b), xr = tb_ref(&x), wr = tb_ref(&w), br = tb_ref(&b), dyr = tb_ref(&dy);
  int out16 = bf16 == 2;

  /* forward */
  ct_tensor yc = out16 ? tb_cpu16(&y) : lay_copy(tb_cpu(&y), lay), yr = tb_ref(&y);
  CHECK_OK(C_->conv2d_fwd(g_cpu, p, &xc, &wc, c->bias ? &bc : NULL, c->act, &yc));
  if (!bf16) lay_back(yc, tb_cpu(&y));
  CHECK_OK(R_->conv2d_fwd(g_ref, p, &xr, &wr, c->bias ? &br : NULL, c->act, &yr));
  double e = out16 ? tb_err16(&y) : tb_err(&y);
  CHECK_TOL(e, tol, "%s fwd: err %.3g", nm, e);

  /* backward data */
  ct_tensor dxc = out16 ? tb_cpu16(&dx) : lay_copy(tb_cpu(&dx), xlay), dxr = tb_ref(&dx);
  CHECK_OK(C_->conv2d_bwd_data(g_cpu, p, &dyc, &wc, &dxc));
  if (!bf16) lay_back(dxc, tb_cpu(&dx));
  CHECK_OK(R_->conv2d_bwd_data(g_ref, p, &dyr, &wr, &dxr));
  e = out16 ? tb_err16(&dx) : tb_err(&dx);
  CHECK_TOL(e, tol, "%s bwd_data: err %.3g", nm, e);

  /* backward weights, overwrite then accumulate onto random old values */
  for (int beta = 0; beta <= 1; beta++) {
    tb_rand(&dw, 1.0);
    tb_rand(&db, 1.0);
    if (out16) {
      tb_round_bf16(&dw);
      tb_round_bf16(&db);
    }
    ct_tensor dwc = out16 ? tb_cpu16(&dw) : tb_cpu(&dw), dbc = out16 ? tb_cpu16(&db) : tb_cpu(&db);
    ct_tensor dwr = tb_ref(&dw), dbr = tb_ref(&db);
    CHECK_OK(C_->conv2d_bwd_weights(g_cpu, p, &xc, &dyc, &dwc, c->bias ? &dbc : NULL, (float)beta));
    CHECK_OK(R_->conv2d_bwd_weights(g_ref, p, &xr, &dyr, &dwr, c->bias ? &dbr : NULL, (float)beta));
    e = out16 ? tb_err16(&dw) : tb_err(&dw);
    CHECK_TOL(e, tol, "%s bwd_weights beta=%d dw: err %.3g", nm, beta, e);
    if (c->bias) {
      e = out16 ? tb_err16(&db) : tb_err(&db);
      CHECK_TOL(e, tol, "%s bwd_weights beta=%d db: err %.3g", nm, beta, e);
    }
  }
  if (!bf16) lay_free(xc), lay_free(dyc);
  tb_free(&x), tb_free(&w), tb_free(&b), tb_free(&y), tb_free(&dy), tb_free(&dx), tb_free(&dw), tb_free(&db);
}

static const conv_case conv_cases[] = {
    /* N  C  H   W   O  KH KW  {sh sw ph pw dh dw g}  bias act */
    {2, 3, 9, 9, 4, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_NONE},
    {2, 3, 9, 9, 4, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_RELU},
    {3, 4, 10, 10, 8, 3, 3, {2, 2, 1, 1, 1, 1, 1}, 1, CT_ACT_LEAKY_RELU},
    {2, 5, 11, 13, 6, 3, 3, {1, 1, 2, 2, 2, 2, 1}, 0, CT_ACT_GELU},
    {2, 8, 9, 9, 12, 3, 3, {1, 1, 1, 1, 1, 1, 4}, 1, CT_ACT_SILU},
    {2, 16, 12, 12, 16, 3, 3, {1, 1, 1, 1, 1, 1, 16}, 1, CT_ACT_SIGMOID}, /* depthwise */
    {3, 6, 7, 11, 5, 3, 5, {2, 1, 1, 2, 1, 1, 1}, 1, CT_ACT_TANH},        /* non-square */
    {1, 3, 13, 7, 7, 5, 2, {3, 2, 0, 1, 1, 2, 1}, 1, CT_ACT_NONE},        /* odd sizes, batch 1 */
    {1, 1, 28, 28, 32, 3, 3, {1, 1, 0, 0, 1, 1, 1}, 1, CT_ACT_RELU},      /* torchkeras conv1 */
    {4, 32, 13, 13, 64, 5, 5, {1, 1, 0, 0, 1, 1, 1}, 1, CT_ACT_RELU},     /* torchkeras conv2 */
    {2, 17, 8, 8, 33, 1, 1, {1, 1, 0, 0, 1, 1, 1}, 1, CT_ACT_NONE},       /* 1x1, odd channels */
    {2, 24, 10, 10, 24, 3, 3, {2, 2, 1, 1, 1, 1, 24}, 0, CT_ACT_RELU},    /* depthwise stride 2 */
    /* Maps small enough that some taps read only padding: the cpu device
     * crops them (dnnl_conv.c, used_taps); dw keeps beta * old there. */
    {2, 16, 1, 1, 8, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_RELU},        /* 1x1 map: the centre tap only */
    {3, 8, 2, 2, 16, 3, 3, {2, 2, 1, 1, 1, 1, 1}, 1, CT_ACT_NONE},        /* 2x2 map, stride 2: taps 1..2 */
    {2, 6, 3, 2, 4, 5, 5, {1, 1, 2, 2, 1, 1, 1}, 0, CT_ACT_NONE},         /* W cropped to taps 1..3, H not */
    {2, 8, 1, 3, 8, 3, 3, {1, 1, 1, 1, 1, 1, 2}, 1, CT_ACT_GELU},         /* groups 2, H cropped */
    {2, 4, 2, 2, 4, 3, 3, {1, 1, 2, 2, 2, 2, 1}, 0, CT_ACT_NONE},         /* dilation 2: one tap reads, kept whole */
    /* At most 4 output positions: the batched-GEMM path (dnnl_conv_gemm.c),
     * run in every activation layout below, and with oneDNN's path. */
    {4, 16, 2, 2, 32, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_RELU},       /* ResNet-18's layer3 at 32x32 */
    {3, 16, 4, 4, 16, 3, 3, {2, 2, 1, 1, 1, 1, 1}, 1, CT_ACT_NONE},       /* stride 2 onto 2x2 */
    {5, 32, 2, 2, 16, 3, 3, {2, 2, 1, 1, 1, 1, 1}, 0, CT_ACT_RELU},       /* onto 1x1, taps 1..2 */
    {2, 16, 2, 3, 16, 3, 2, {1, 1, 1, 0, 1, 1, 1}, 1, CT_ACT_NONE},       /* non-square kernel and map */
    {2, 16, 2, 2, 16, 1, 1, {1, 1, 0, 0, 1, 1, 1}, 1, CT_ACT_RELU},       /* 1x1 kernel */
    {3, 16, 1, 1, 16, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_NONE},       /* 1x1 map: the centre tap */
    {2, 16, 5, 5, 16, 3, 3, {2, 2, 0, 0, 1, 1, 1}, 1, CT_ACT_RELU},       /* 2x2 output, no padding */
    /* One input channel: the first-layer weight gradient (dnnl_conv_thin.c),
     * with the output gradient in every layout. */
    {3, 1, 11, 9, 16, 5, 3, {2, 1, 2, 1, 1, 1, 1}, 1, CT_ACT_RELU},       /* strides and padding differ */
    {2, 1, 8, 10, 8, 3, 3, {3, 3, 1, 0, 1, 1, 1}, 0, CT_ACT_NONE},        /* stride 3, last rows unread */
    {2, 1, 6, 7, 13, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_NONE},        /* 8 + 5 output channels */
    /* Up to 4 input channels and a kernel larger than 7x7: the forward in
     * dnnl_conv_thin.c (AlexNet's first layer). */
    {2, 3, 35, 31, 16, 11, 11, {4, 4, 2, 2, 1, 1, 1}, 1, CT_ACT_RELU},    /* AlexNet's conv1, smaller */
    {2, 2, 20, 17, 8, 8, 7, {2, 3, 3, 1, 1, 1, 1}, 0, CT_ACT_NONE},       /* non-square everything */
    {1, 4, 12, 12, 13, 9, 9, {1, 1, 4, 4, 1, 1, 1}, 1, CT_ACT_RELU},      /* 13 channels, wide padding */
    {2, 1, 30, 30, 8, 9, 9, {3, 3, 2, 2, 1, 1, 1}, 1, CT_ACT_NONE},       /* one channel: NHWC output too */
};

typedef struct lin_case {
  int64_t N, K, M;
  int bias;
  ct_act act;
} lin_case;

static void linear_one(const lin_case *c, int bf16) {
  tb x = TB(c->N, c->K), w = TB(c->M, c->K), b = TB(c->M), y = TB(c->N, c->M), dy = TB(c->N, c->M);
  tb dx = TB(c->N, c->K), dw = TB(c->M, c->K), db = TB(c->M);
  tb_rand(&x, 1.0), tb_rand(&w, 0.3), tb_rand(&b, 0.5), tb_rand(&dy, 1.0);
  if (bf16) tb_round_bf16(&x), tb_round_bf16(&w), tb_round_bf16(&dy);
  double tol = bf16 ? TOL16 : TOL32;
  int out16 = bf16 == 2;
  char nm[128];
  snprintf(nm, sizeof nm, "linear N%lld K%lld M%lld bias%d %s %s", (long long)c->N, (long long)c->K, (long long)c->M,
           c->bias, act_name(c->act), bf16 == 0 ? "f32" : bf16 == 1 ? "bf16->f32" : "bf16->bf16");
  ct_tensor xc = bf16 ? tb_cpu16(&x) : tb_cpu(&x), wc = bf16 ? tb_cpu16(&w) : tb_cpu(&w);
  ct_tensor dyc = bf16 ? tb_cpu16(&dy) : tb_cpu(&dy), bc = tb_cpu(&b);
  ct_tensor xr = tb_ref(&x), wr = tb_ref(&w), br = tb_ref(&b), dyr = tb_ref(&dy);
  ct_tensor yc = out16 ? tb_cpu16(&y) : tb_cpu(&y), yr = tb_ref(&y);
  CHECK_OK(C_->linear_fwd(g_cpu, &xc, &wc, c->bias ? &bc : NULL, c->act, &yc));
  CHECK_OK(R_->linear_fwd(g_ref, &xr, &wr, c->bias ? &br : NULL, c->act, &yr));
  double e = out16 ? tb_err16(&y) : tb_err(&y);
  CHECK_TOL(e, tol, "%s fwd: err %.3g", nm, e);
  ct_tensor dxc = out16 ? tb_cpu16(&dx) : tb_cpu(&dx), dxr = tb_ref(&dx);
  CHECK_OK(C_->linear_bwd_data(g_cpu, &dyc, &wc, &dxc));
  CHECK_OK(R_->linear_bwd_data(g_ref, &dyr, &wr, &dxr));
  e = out16 ? tb_err16(&dx) : tb_err(&dx);
  CHECK_TOL(e, tol, "%s bwd_data: err %.3g", nm, e);
  for (int beta = 0; beta <= 1; beta++) {
    tb_rand(&dw, 1.0), tb_rand(&db, 1.0);
    if (out16) tb_round_bf16(&dw), tb_round_bf16(&db);
    ct_tensor dwc = out16 ? tb_cpu16(&dw) : tb_cpu(&dw), dbc = out16 ? tb_cpu16(&db) : tb_cpu(&db);
    ct_tensor dwr = tb_ref(&dw), dbr = tb_ref(&db);
    CHECK_OK(C_->linear_bwd_weights(g_cpu, &xc, &dyc, &dwc, c->bias ? &dbc : NULL, (float)beta));
    CHECK_OK(R_->linear_bwd_weights(g_ref, &xr, &dyr, &dwr, c->bias ? &dbr : NULL, (float)beta));
    e = out16 ? tb_err16(&dw) : tb_err(&dw);
    CHECK_TOL(e, tol, "%s bwd_weights beta=%d dw: err %.3g", nm, beta, e);
    if (c->bias) {
      e = out16 ? tb_err16(&db) : tb_err(&db);
      CHECK_TOL(e, tol, "%s bwd_weights beta=%d db: err %.3g", nm, beta, e);
    }
  }
  if (!bf16) lay_free(xc), lay_free(dyc);
  tb_free(&x), tb_free(&w), tb_free(&b), tb_free(&y), tb_free(&dy), tb_free(&dx), tb_free(&dw), tb_free(&db);
}

static const lin_case lin_cases[] = {
    {4, 7, 5, 1, CT_ACT_NONE},    {1, 13, 3, 1, CT_ACT_RELU},   {33, 64, 17, 1, CT_ACT_GELU},
    {16, 100, 10, 0, CT_ACT_TANH}, {7, 9, 11, 1, CT_ACT_SILU},  {128, 256, 64, 1, CT_ACT_SIGMOID},
    {5, 6, 7, 1, CT_ACT_LEAKY_RELU},
};

static void matmul_one(int ta, int tb_, int64_t M, int64_t K, int64_t N, float alpha, float beta, int bf16) {
  tb a = ta ? TB(K, M) : TB(M, K), b = tb_ ? TB(N, K) : TB(K, N), c = TB(M, N);
  tb_rand(&a, 1.0), tb_rand(&b, 1.0), tb_rand(&c, 1.0);
  if (bf16) tb_round_bf16(&a), tb_round_bf16(&b);
  int out16 = bf16 == 2;
  if (out16) tb_round_bf16(&c);
  ct_tensor ac = bf16 ? tb_cpu16(&a) : tb_cpu(&a), bc = bf16 ? tb_cpu16(&b) : tb_cpu(&b);
  ct_tensor cc = out16 ? tb_cpu16(&c) : tb_cpu(&c);
  ct_tensor ar = tb_ref(&a), br = tb_ref(&b), cr = tb_ref(&c);
  CHECK_OK(C_->matmul(g_cpu, ta, tb_, &ac, &bc, alpha, beta, &cc));
  CHECK_OK(R_->matmul(g_ref, ta, tb_, &ar, &br, alpha, beta, &cr));
  double e = out16 ? tb_err16(&c) : tb_err(&c);
  CHECK_TOL(e, (bf16 ? TOL16 : TOL32), "matmul ta%d tb%d %lldx%lldx%lld alpha %g beta %g bf16 %d: err %.3g", ta, tb_,
            (long long)M, (long long)K, (long long)N, alpha, beta, bf16, e);
  tb_free(&a), tb_free(&b), tb_free(&c);
}

int main(void) {
  cpu_test_setup(42);
  if (!R_->conv2d_fwd || !R_->linear_fwd || !R_->matmul) {
    fprintf(stderr, "reference backend incomplete: skipping\n");
    return 77;
  }
  size_t nconv = sizeof conv_cases / sizeof conv_cases[0];
#if CTRAIN_HAVE_DNNL
  for (int blocked = 1; blocked >= 0; blocked--) {
    cpu_conv_set_blocked(blocked);
    for (size_t i = 0; i < nconv; i++) conv_one(&conv_cases[i], 0, CT_LAYOUT_PLAIN, blocked ? "blocked" : "plain");
  }
  cpu_conv_set_blocked(1);
  /* Activations in the executor's layouts, through the GEMM path where it
   * applies and through oneDNN's primitives. */
  const ct_layout lays[] = {CT_LAYOUT_C16, CT_LAYOUT_C8, CT_LAYOUT_NHWC};
  for (int gemm = 1; gemm >= 0; gemm--) {
    cpu_conv_set_gemm(gemm);
    cpu_conv_set_thin(gemm);
    for (size_t l = 0; l < 3; l++)
      for (size_t i = 0; i < nconv; i++) {
        const conv_case *c = &conv_cases[i];
        int64_t b = lays[l] == CT_LAYOUT_C16 ? 16 : lays[l] == CT_LAYOUT_C8 ? 8 : 1;
        if (c->O % b == 0 && c->p.groups == 1) conv_one(c, 0, lays[l], gemm ? "gemm+thin" : "oneDNN");
      }
    if (!gemm)
      for (size_t i = 0; i < nconv; i++) conv_one(&conv_cases[i], 0, CT_LAYOUT_PLAIN, "oneDNN");
  }
  cpu_conv_set_gemm(1);
  cpu_conv_set_thin(-1);
#else
  /* Built without oneDNN the cpu device's conv is the reference's (through
   * the table's defaults), so there is one path; this still checks that
   * the cpu table routes every conv, linear and matmul entry to it. */
  for (size_t i = 0; i < nconv; i++) conv_one(&conv_cases[i], 0, CT_LAYOUT_PLAIN, "plain");
#endif
  for (size_t i = 0; i < nconv; i++) {
    conv_one(&conv_cases[i], 1, CT_LAYOUT_PLAIN, "blocked");
    conv_one(&conv_cases[i], 2, CT_LAYOUT_PLAIN, "blocked");
  }
  for (size_t i = 0; i < sizeof lin_cases / sizeof lin_cases[0]; i++)
    for (int bf = 0; bf <= 2; bf++) linear_one(&lin_cases[i], bf);
  for (int ta = 0; ta <= 1; ta++)
    for (int tb_ = 0; tb_ <= 1; tb_++) {
      matmul_one(ta, tb_, 7, 5, 9, 1.f, 0.f, 0);
      matmul_one(ta, tb_, 33, 70, 18, 0.5f, 1.f, 0);
      matmul_one(ta, tb_, 1, 64, 1, 2.f, 0.25f, 0);
      matmul_one(ta, tb_, 40, 50, 60, 1.f, 0.f, 1);
      matmul_one(ta, tb_, 40, 50, 60, 1.f, 1.f, 2);
    }
  printf("worst normwise relative error: f32 %.3g, bf16 %.3g\n", worst32, worst16);
  cpu_test_teardown();
  return test_summary("test_cpu_vs_ref");
}
