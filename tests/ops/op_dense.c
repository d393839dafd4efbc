/* Convolution, linear and matmul on the target against the reference on
 * the same random inputs, in each of the row's dense modes (operand and
 * result dtypes, TF32): forward; backward data, overwriting and, where the
 * backend has conv2d_bwd_data_acc, accumulating onto a random dx; backward
 * weights with beta 0 and 1 onto random old values. A linear layer with a
 * 16-bit output runs again with a bias of its own dtype (autocast's weight
 * copy, which may take a fused bias epilogue; the f32 bias never does).
 * The first mode runs under each of the row's convolution paths, with
 * plain activations and/or laid out in each of the row's layouts (an
 * input whose channels do not fill a block, a first layer, stays plain as
 * the executor leaves it; the output takes the layout); the other modes
 * under the defaults, plain. Tolerances: the mode's conv_tol for the
 * convolutions' y, dx and dw, its tol for matmul, linear and the bias
 * gradients. Each mode prints its worst error; with
 * emu_worse_than_first, on the emulator, that worst must exceed the
 * first mode's by the factor given (the mode's TF32 rounding in effect:
 * plans built without it must not be reused). */
#include "op_target.h"

typedef struct conv_case {
  int64_t N, C, H, W, O, KH, KW;
  ct_conv2d_params p;
  int bias;
  ct_act act;
} conv_case;

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
    {2, 16, 1, 1, 8, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_RELU}, /* 1x1 map: the centre tap only */
    {3, 8, 2, 2, 16, 3, 3, {2, 2, 1, 1, 1, 1, 1}, 1, CT_ACT_NONE}, /* 2x2 map, stride 2: taps 1..2 */
    {2, 6, 3, 2, 4, 5, 5, {1, 1, 2, 2, 1, 1, 1}, 0, CT_ACT_NONE},  /* W cropped to taps 1..3, H not */
    {2, 8, 1, 3, 8, 3, 3, {1, 1, 1, 1, 1, 1, 2}, 1, CT_ACT_GELU},  /* groups 2, H cropped */
    {2, 4, 2, 2, 4, 3, 3, {1, 1, 2, 2, 2, 2, 1}, 0, CT_ACT_NONE},  /* dilation 2: one tap reads, kept whole */
    /* At most 4 output positions: the cpu's batched-GEMM path
     * (dnnl_conv_gemm.c), run in every activation layout, and with
     * oneDNN's path. */
    {4, 16, 2, 2, 32, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_RELU}, /* ResNet-18's layer3 at 32x32 */
    {3, 16, 4, 4, 16, 3, 3, {2, 2, 1, 1, 1, 1, 1}, 1, CT_ACT_NONE}, /* stride 2 onto 2x2 */
    {5, 32, 2, 2, 16, 3, 3, {2, 2, 1, 1, 1, 1, 1}, 0, CT_ACT_RELU}, /* onto 1x1, taps 1..2 */
    {2, 16, 2, 3, 16, 3, 2, {1, 1, 1, 0, 1, 1, 1}, 1, CT_ACT_NONE}, /* non-square kernel and map */
    {2, 16, 2, 2, 16, 1, 1, {1, 1, 0, 0, 1, 1, 1}, 1, CT_ACT_RELU}, /* 1x1 kernel */
    {3, 16, 1, 1, 16, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_NONE}, /* 1x1 map: the centre tap */
    {2, 16, 5, 5, 16, 3, 3, {2, 2, 0, 0, 1, 1, 1}, 1, CT_ACT_RELU}, /* 2x2 output, no padding */
    /* One input channel: the cpu's first-layer weight gradient
     * (dnnl_conv_thin.c), with the output gradient in every layout. */
    {3, 1, 11, 9, 16, 5, 3, {2, 1, 2, 1, 1, 1, 1}, 1, CT_ACT_RELU}, /* strides and padding differ */
    {2, 1, 8, 10, 8, 3, 3, {3, 3, 1, 0, 1, 1, 1}, 0, CT_ACT_NONE},  /* stride 3, last rows unread */
    {2, 1, 6, 7, 13, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_NONE},  /* 8 + 5 output channels */
    /* Up to 4 input channels and a kernel larger than 7x7: the cpu's
     * forward in dnnl_conv_thin.c (AlexNet's first layer). */
    {2, 3, 35, 31, 16, 11, 11, {4, 4, 2, 2, 1, 1, 1}, 1, CT_ACT_RELU}, /* AlexNet's conv1, smaller */
    {2, 2, 20, 17, 8, 8, 7, {2, 3, 3, 1, 1, 1, 1}, 0, CT_ACT_NONE},    /* non-square everything */
    {1, 4, 12, 12, 13, 9, 9, {1, 1, 4, 4, 1, 1, 1}, 1, CT_ACT_RELU},   /* 13 channels, wide padding */
    {2, 1, 30, 30, 8, 9, 9, {3, 3, 2, 2, 1, 1, 1}, 1, CT_ACT_NONE},    /* one channel: NHWC output too */
};

/* For rows with big: big enough for cuDNN's Winograd and implicit GEMM. */
static const conv_case big_conv_cases[] = {
    {8, 64, 28, 28, 64, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_RELU},
};

typedef struct lin_case {
  int64_t N, K, M;
  int bias;
  ct_act act;
} lin_case;

static const lin_case lin_cases[] = {
    {4, 7, 5, 1, CT_ACT_NONE},       {1, 13, 3, 1, CT_ACT_RELU},    {33, 64, 17, 1, CT_ACT_GELU},
    {16, 100, 10, 0, CT_ACT_TANH},   {7, 9, 11, 1, CT_ACT_SILU},    {128, 256, 64, 1, CT_ACT_SIGMOID},
    {5, 6, 7, 1, CT_ACT_LEAKY_RELU}, {64, 128, 96, 1, CT_ACT_RELU}, {3, 8, 8, 0, CT_ACT_RELU},
};

typedef struct mm_case {
  int64_t M, K, N;
  float alpha, beta;
} mm_case;

static const mm_case mm_cases[] = {
    {7, 5, 9, 1.f, 0.f},    {33, 70, 18, 0.5f, 1.f}, {1, 64, 1, 2.f, 0.25f},
    {40, 50, 60, 1.f, 0.f}, {40, 50, 60, 1.f, 1.f},
};

#define NCASES(a) (sizeof a / sizeof a[0])

/* One mode on its device. */
typedef struct dense_run {
  const op_dense_mode *m;
  ct_device *dev;
  const ct_backend *be;
} dense_run;

static int64_t conv_out(int64_t in, int64_t k, int s, int pad, int dil) {
  return (in + 2 * pad - dil * (k - 1) - 1) / s + 1;
}

static const char *act_name(ct_act a) {
  static const char *n[] = {"none", "relu", "leaky", "gelu", "silu", "sigmoid", "tanh"};
  return n[a];
}

static const char *layout_name(ct_layout l) {
  return l == CT_LAYOUT_C16 ? "C16" : l == CT_LAYOUT_C8 ? "C8" : l == CT_LAYOUT_NHWC ? "NHWC" : "NCHW";
}

static int64_t layout_block(ct_layout l) { return l == CT_LAYOUT_C16 ? 16 : l == CT_LAYOUT_C8 ? 8 : 1; }

/* A case's inputs are drawn from a stream of its own (section, index), so
 * every mode, path and layout sees the same values: the modes' errors
 * compare like with like. */
enum { SECTION_CONV = 1, SECTION_LINEAR, SECTION_MATMUL };
static void case_stream(op_env *e, uint32_t section, size_t index) {
  ct_rng_init(&e->rng, e->seed, CT_RNG_TEST, section, (uint32_t)index);
}

static void conv_one(op_env *e, const dense_run *r, const conv_case *c, size_t index, ct_layout lay, const char *path) {
  const op_dense_mode *m = r->m;
  const ct_backend *B = r->be, *R = e->rb;
  const ct_conv2d_params *p = &c->p;
  const int G = p->groups;
  const int64_t OH = conv_out(c->H, c->KH, p->stride_h, p->pad_h, p->dil_h);
  const int64_t OW = conv_out(c->W, c->KW, p->stride_w, p->pad_w, p->dil_w);
  obuf x = OB(r->dev, c->N, c->C, c->H, c->W), w = OB(r->dev, c->O, c->C / G, c->KH, c->KW), b = OB(r->dev, c->O);
  obuf y = OB(r->dev, c->N, c->O, OH, OW), dy = OB(r->dev, c->N, c->O, OH, OW), dx = OB(r->dev, c->N, c->C, c->H, c->W);
  obuf dw = OB(r->dev, c->O, c->C / G, c->KH, c->KW), db = OB(r->dev, c->O);
  x.lay = dx.lay = c->C % layout_block(lay) ? CT_LAYOUT_PLAIN : lay;
  y.lay = dy.lay = lay;
  case_stream(e, SECTION_CONV, index);
  ob_rand(&x, &e->rng, 1.0, m->in), ob_rand(&w, &e->rng, 0.5, m->in), ob_rand(&b, &e->rng, 0.5, CT_F32);
  ob_rand(&dy, &e->rng, 1.0, m->in);
  char nm[200];
  snprintf(nm, sizeof nm, "conv N%lld C%lld %lldx%lld O%lld k%lldx%lld s%d,%d p%d,%d d%d,%d g%d bias%d %s %s %s %s",
           (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->W, (long long)c->O, (long long)c->KH,
           (long long)c->KW, p->stride_h, p->stride_w, p->pad_h, p->pad_w, p->dil_h, p->dil_w, G, c->bias,
           act_name(c->act), m->name, path, layout_name(lay));
  ct_tensor xg = ob_dev(&x), wg = ob_dev(&w), bg = ob_dev(&b), dyg = ob_dev(&dy);
  ct_tensor xr = ob_ref(&x), wr = ob_ref(&w), br = ob_ref(&b), dyr = ob_ref(&dy), yr = ob_ref(&y), dxr = ob_ref(&dx);
  ct_tensor yg = ob_out(&y, m->out);
  CHECK_OK(B->conv2d_fwd(r->dev, p, &xg, &wg, c->bias ? &bg : NULL, c->act, &yg));
  CHECK_OK(R->conv2d_fwd(e->ref, p, &xr, &wr, c->bias ? &br : NULL, c->act, &yr));
  CHECK_ERR(e, &y, m->conv_tol, "%s fwd", nm);
  ct_tensor dxg = ob_out(&dx, m->out);
  CHECK_OK(B->conv2d_bwd_data(r->dev, p, &dyg, &wg, &dxg));
  CHECK_OK(R->conv2d_bwd_data(e->ref, p, &dyr, &wr, &dxr));
  CHECK_ERR(e, &dx, m->conv_tol, "%s bwd_data", nm);
  if (B->conv2d_bwd_data_acc) {
    /* onto a random dx (cuDNN's beta = 1) */
    ob_rand(&dx, &e->rng, 1.0, m->out);
    CHECK_OK(B->conv2d_bwd_data_acc(r->dev, p, &dyg, &wg, &dxg));
    CHECK_OK(R->conv2d_bwd_data_acc(e->ref, p, &dyr, &wr, &dxr));
    CHECK_ERR(e, &dx, m->conv_tol, "%s bwd_data_acc", nm);
  }
  for (int beta = 0; beta <= 1; beta++) {
    ob_rand(&dw, &e->rng, 1.0, m->out), ob_rand(&db, &e->rng, 1.0, m->out);
    ct_tensor dwg = ob_dev(&dw), dbg = ob_dev(&db), dwr = ob_ref(&dw), dbr = ob_ref(&db);
    CHECK_OK(B->conv2d_bwd_weights(r->dev, p, &xg, &dyg, &dwg, c->bias ? &dbg : NULL, (float)beta));
    CHECK_OK(R->conv2d_bwd_weights(e->ref, p, &xr, &dyr, &dwr, c->bias ? &dbr : NULL, (float)beta));
    CHECK_ERR(e, &dw, m->conv_tol, "%s bwd_weights beta %d dw", nm, beta);
    if (c->bias) CHECK_ERR(e, &db, m->tol, "%s bwd_weights beta %d db", nm, beta);
  }
  ob_free(&x), ob_free(&w), ob_free(&b), ob_free(&y), ob_free(&dy), ob_free(&dx), ob_free(&dw), ob_free(&db);
}

static void linear_one(op_env *e, const dense_run *r, const lin_case *c, size_t index) {
  const op_dense_mode *m = r->m;
  const ct_backend *B = r->be, *R = e->rb;
  obuf x = OB(r->dev, c->N, c->K), w = OB(r->dev, c->M, c->K), b = OB(r->dev, c->M), y = OB(r->dev, c->N, c->M);
  obuf dy = OB(r->dev, c->N, c->M), dx = OB(r->dev, c->N, c->K), dw = OB(r->dev, c->M, c->K), db = OB(r->dev, c->M);
  case_stream(e, SECTION_LINEAR, index);
  ob_rand(&x, &e->rng, 1.0, m->in), ob_rand(&w, &e->rng, 0.3, m->in), ob_rand(&b, &e->rng, 0.5, CT_F32);
  ob_rand(&dy, &e->rng, 1.0, m->in);
  char nm[128];
  snprintf(nm, sizeof nm, "linear N%lld K%lld M%lld bias%d %s %s", (long long)c->N, (long long)c->K, (long long)c->M,
           c->bias, act_name(c->act), m->name);
  ct_tensor xg = ob_dev(&x), wg = ob_dev(&w), bg = ob_dev(&b), dyg = ob_dev(&dy);
  ct_tensor xr = ob_ref(&x), wr = ob_ref(&w), br = ob_ref(&b), dyr = ob_ref(&dy), yr = ob_ref(&y), dxr = ob_ref(&dx);
  ct_tensor yg = ob_out(&y, m->out);
  CHECK_OK(B->linear_fwd(r->dev, &xg, &wg, c->bias ? &bg : NULL, c->act, &yg));
  CHECK_OK(R->linear_fwd(e->ref, &xr, &wr, c->bias ? &br : NULL, c->act, &yr));
  CHECK_ERR(e, &y, m->tol, "%s fwd", nm);
  if (c->bias && m->out != CT_F32) {
    ob_put(&b, m->out);
    bg = ob_dev(&b), br = ob_ref(&b), yg = ob_out(&y, m->out);
    CHECK_OK(B->linear_fwd(r->dev, &xg, &wg, &bg, c->act, &yg));
    CHECK_OK(R->linear_fwd(e->ref, &xr, &wr, &br, c->act, &yr));
    CHECK_ERR(e, &y, m->tol, "%s fwd, %s bias", nm, ct_dtype_name(m->out));
  }
  ct_tensor dxg = ob_out(&dx, m->out);
  CHECK_OK(B->linear_bwd_data(r->dev, &dyg, &wg, &dxg));
  CHECK_OK(R->linear_bwd_data(e->ref, &dyr, &wr, &dxr));
  CHECK_ERR(e, &dx, m->tol, "%s bwd_data", nm);
  for (int beta = 0; beta <= 1; beta++) {
    ob_rand(&dw, &e->rng, 1.0, m->out), ob_rand(&db, &e->rng, 1.0, m->out);
    ct_tensor dwg = ob_dev(&dw), dbg = ob_dev(&db), dwr = ob_ref(&dw), dbr = ob_ref(&db);
    CHECK_OK(B->linear_bwd_weights(r->dev, &xg, &dyg, &dwg, c->bias ? &dbg : NULL, (float)beta));
    CHECK_OK(R->linear_bwd_weights(e->ref, &xr, &dyr, &dwr, c->bias ? &dbr : NULL, (float)beta));
    CHECK_ERR(e, &dw, m->tol, "%s bwd_weights beta %d dw", nm, beta);
    if (c->bias) CHECK_ERR(e, &db, m->tol, "%s bwd_weights beta %d db", nm, beta);
  }
  ob_free(&x), ob_free(&w), ob_free(&b), ob_free(&y), ob_free(&dy), ob_free(&dx), ob_free(&dw), ob_free(&db);
}

static void matmul_one(op_env *e, const dense_run *r, int ta, int tb, const mm_case *c, size_t index) {
  const op_dense_mode *m = r->m;
  obuf a = ta ? OB(r->dev, c->K, c->M) : OB(r->dev, c->M, c->K),
       b = tb ? OB(r->dev, c->N, c->K) : OB(r->dev, c->K, c->N);
  obuf y = OB(r->dev, c->M, c->N);
  case_stream(e, SECTION_MATMUL, index);
  ob_rand(&a, &e->rng, 1.0, m->in), ob_rand(&b, &e->rng, 1.0, m->in), ob_rand(&y, &e->rng, 1.0, m->out);
  ct_tensor ag = ob_dev(&a), bg = ob_dev(&b), yg = ob_dev(&y), ar = ob_ref(&a), br = ob_ref(&b), yr = ob_ref(&y);
  CHECK_OK(r->be->matmul(r->dev, ta, tb, &ag, &bg, c->alpha, c->beta, &yg));
  CHECK_OK(e->rb->matmul(e->ref, ta, tb, &ar, &br, c->alpha, c->beta, &yr));
  CHECK_ERR(e, &y, m->tol, "matmul ta%d tb%d %lldx%lldx%lld alpha %g beta %g %s", ta, tb, (long long)c->M,
            (long long)c->K, (long long)c->N, c->alpha, c->beta, m->name);
  ob_free(&a), ob_free(&b), ob_free(&y);
}

/* Every convolution case the row admits in layout lay (laid out: those
 * whose output channels fill the blocks, groups 1). */
static void conv_all(op_env *e, const dense_run *r, ct_layout lay, const char *path) {
  const size_t n = NCASES(conv_cases), nbig = e->t->big ? NCASES(big_conv_cases) : 0;
  for (size_t i = 0; i < n + nbig; i++) {
    const conv_case *c = i < n ? &conv_cases[i] : &big_conv_cases[i - n];
    if (lay == CT_LAYOUT_PLAIN || (c->O % layout_block(lay) == 0 && c->p.groups == 1)) conv_one(e, r, c, i, lay, path);
  }
}

/* The first mode's convolutions under each of the row's paths. */
static void conv_paths(op_env *e, const dense_run *r) {
  const op_target *t = e->t;
  for (int i = 0; i < t->npaths; i++) {
    const op_conv_path *p = &t->paths[i];
    if (p->enter) p->enter();
    if (p->runs & OP_PATH_LAID_OUT)
      for (int l = 0; t->layouts[l]; l++) conv_all(e, r, t->layouts[l], p->name);
    if (p->runs & OP_PATH_PLAIN) conv_all(e, r, CT_LAYOUT_PLAIN, p->name);
    if (t->paths_reset) t->paths_reset();
  }
}

void op_dense(op_env *e) {
  const op_target *t = e->t;
  double *worst = calloc((size_t)t->nmodes, sizeof *worst);
  if (!worst) ob_die("op_dense");
  for (int i = 0; i < t->nmodes; i++) {
    const op_dense_mode *m = &t->modes[i];
    dense_run r = {m, e->dev, e->be};
    ct_device *tf = NULL;
    if (m->tf32 == OP_TF32_AT_OPEN) {
      /* TF32 is chosen when the device is opened */
      setenv("CTRAIN_CUDA_TF32", "1", 1);
      CHECK_OK(ct_device_open(t->spec, &tf));
      unsetenv("CTRAIN_CUDA_TF32");
      if (!tf) continue;
      r.dev = tf, r.be = ct_device_backend(tf);
    } else if (m->tf32 == OP_TF32_SWITCH) {
      /* on the device the strict modes ran on, whose plan caches hold
       * FMA-math plans for the same shapes */
      CHECK(ct_device_set_tf32(e->dev, 1) == CT_OK);
    }
    e->mode_worst = &worst[i];
    if (i == 0 && t->npaths)
      conv_paths(e, &r);
    else
      conv_all(e, &r, CT_LAYOUT_PLAIN, t->npaths ? t->paths[0].name : "default");
    for (size_t k = 0; k < NCASES(lin_cases); k++) linear_one(e, &r, &lin_cases[k], k);
    for (int ta = 0; ta <= 1; ta++)
      for (int tb = 0; tb <= 1; tb++)
        for (size_t k = 0; k < NCASES(mm_cases); k++) matmul_one(e, &r, ta, tb, &mm_cases[k], k);
    e->mode_worst = NULL;
    if (tf) ct_device_close(tf);
    if (m->tf32 == OP_TF32_SWITCH) CHECK(ct_device_set_tf32(e->dev, 0) == CT_OK);
    printf("%s: %-12s worst normwise relative error %.3g\n", t->name, m->name, worst[i]);
  }
  if (getenv("CTRAIN_TEST_EMU"))
    for (int i = 1; i < t->nmodes; i++) {
      const double k = t->modes[i].emu_worse_than_first;
      if (k > 0)
        CHECK_MSG(worst[i] > k * worst[0], "%s: worst error %.3g, %s %.3g: TF32 not in effect",
                  op_case(e, "dense mode %s", t->modes[i].name), worst[i], t->modes[0].name, worst[0]);
    }
  free(worst);
}
