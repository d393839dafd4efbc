/* The cuda device against the reference on the same random inputs:
 * convolution (cuDNN), linear and matmul (cuBLASLt): forward, backward data,
 * backward data overwriting and accumulating, backward weights with beta 0
 * and 1; the shapes of test_cpu_vs_ref.c. A linear layer with a 16-bit
 * output runs with an f32 bias and with one of its own dtype (the second
 * may take the cuBLASLt bias epilogue).
 * Precisions and tolerances (normwise relative error vs the f64
 * reference): f32 with FMA math (TF32 off: the default device) 1e-5 for
 * matmul/linear and the bias gradient (a double channel sum); f32
 * convolution 1e-4: under FMA math cuDNN may still pick Winograd
 * (F(4x4,3x3) and larger tiles round 10-100x worse than a direct sum,
 * a few 1e-6 to 1e-5 normwise) or FFT algorithms for the 3x3/5x5
 * stride-1 shapes, and 3e-5 left too little room; TF32 would give
 * ~5e-4..1e-3 (10-bit mantissa), so 1e-4 still tells it from f32, and a
 * wrong convolution is off by O(1). bf16 inputs with f32 or bf16 outputs
 * 1e-2, f16 inputs with f32 or f16 outputs 2e-3 (unit roundoff 2^-11 =
 * 4.9e-4; a 16-bit pair with an f32 weight gradient rounds that gradient
 * once to 16 bits, src/backend/cuda/cuda_conv.c), f32 on a device opened
 * with CTRAIN_CUDA_TF32=1 (TF32 tensor cores) 5e-3, and the same with TF32
 * switched on by ct_device_set_tf32 on the default device (the plans built
 * without it must not be reused: on the emulator, which rounds to TF32
 * wherever it is allowed, that mode's worst error must exceed 4x the f32
 * mode's; on a GPU TF32 is a permission cuDNN may not take). Each mode
 * prints its worst error, so the first GPU run
 * shows the real margins. Skipped (77) without a GPU. */
#include "test_gpu_common.h"

typedef struct mode {
  const char *name;
  ct_device *dev;
  ct_dtype in, out;
  double tol, conv_tol;
} mode;

static double worst[7];

#define CHECK_E(m, gbuf, tol, ...)                                        \
  do {                                                                    \
    double e_ = gb_err(gbuf);                                             \
    if (e_ > worst[(m)->idx]) worst[(m)->idx] = e_;                       \
    CHECK_MSG(e_ <= (tol), __VA_ARGS__);                                  \
  } while (0)

typedef struct mctx {
  const mode *m;
  int idx;
} mctx;

typedef struct conv_case {
  int64_t N, C, H, W, O, KH, KW;
  ct_conv2d_params p;
  int bias;
  ct_act act;
} conv_case;

static int64_t out_dim(int64_t in, int k, int s, int pad, int dil) { return (in + 2 * pad - dil * (k - 1) - 1) / s + 1; }

static void conv_one(const mctx *mc, const conv_case *c) {
  const mode *m = mc->m;
  const mctx *M = mc;
  const ct_backend *B = ct_device_backend(m->dev);
  const ct_conv2d_params *p = &c->p;
  int G = p->groups;
  int64_t OH = out_dim(c->H, (int)c->KH, p->stride_h, p->pad_h, p->dil_h);
  int64_t OW = out_dim(c->W, (int)c->KW, p->stride_w, p->pad_w, p->dil_w);
  gb x = GB(c->N, c->C, c->H, c->W), w = GB(c->O, c->C / G, c->KH, c->KW), b = GB(c->O);
  gb y = GB(c->N, c->O, OH, OW), dy = GB(c->N, c->O, OH, OW), dx = GB(c->N, c->C, c->H, c->W);
  gb dw = GB(c->O, c->C / G, c->KH, c->KW), db = GB(c->O);
  gb_rand(&x, 1.0, m->in), gb_rand(&w, 0.5, m->in), gb_rand(&b, 0.5, CT_F32), gb_rand(&dy, 1.0, m->in);
  char nm[160];
  snprintf(nm, sizeof nm, "conv N%lld C%lld %lldx%lld O%lld k%lldx%lld s%d p%d d%d g%d bias%d act%d %s",
           (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->W, (long long)c->O, (long long)c->KH,
           (long long)c->KW, p->stride_h, p->pad_h, p->dil_h, G, c->bias, (int)c->act, m->name);
  ct_tensor xg = gb_gpu(&x), wg = gb_gpu(&w), bg = gb_gpu(&b), dyg = gb_gpu(&dy);
  ct_tensor xr = gb_ref(&x), wr = gb_ref(&w), br = gb_ref(&b), dyr = gb_ref(&dy);
  ct_tensor yg = gb_out(&y, m->out), yr = gb_ref(&y);
  CHECK_OK(B->conv2d_fwd(m->dev, p, &xg, &wg, c->bias ? &bg : NULL, c->act, &yg));
  CHECK_OK(R_->conv2d_fwd(g_ref, p, &xr, &wr, c->bias ? &br : NULL, c->act, &yr));
  CHECK_E(M, &y, m->conv_tol, "%s fwd", nm);
  ct_tensor dxg = gb_out(&dx, m->out), dxr = gb_ref(&dx);
  CHECK_OK(B->conv2d_bwd_data(m->dev, p, &dyg, &wg, &dxg));
  CHECK_OK(R_->conv2d_bwd_data(g_ref, p, &dyr, &wr, &dxr));
  CHECK_E(M, &dx, m->conv_tol, "%s bwd_data", nm);
  /* The accumulating variant onto a random dx (cuDNN's beta = 1). */
  gb_rand(&dx, 1.0, m->out);
  dxg = gb_gpu(&dx), dxr = gb_ref(&dx);
  CHECK_OK(B->conv2d_bwd_data_acc(m->dev, p, &dyg, &wg, &dxg));
  CHECK_OK(R_->conv2d_bwd_data_acc(g_ref, p, &dyr, &wr, &dxr));
  CHECK_E(M, &dx, m->conv_tol, "%s bwd_data_acc", nm);
  for (int beta = 0; beta <= 1; beta++) {
    gb_rand(&dw, 1.0, m->out), gb_rand(&db, 1.0, m->out);
    ct_tensor dwg = gb_gpu(&dw), dbg = gb_gpu(&db), dwr = gb_ref(&dw), dbr = gb_ref(&db);
    CHECK_OK(B->conv2d_bwd_weights(m->dev, p, &xg, &dyg, &dwg, c->bias ? &dbg : NULL, (float)beta));
    CHECK_OK(R_->conv2d_bwd_weights(g_ref, p, &xr, &dyr, &dwr, c->bias ? &dbr : NULL, (float)beta));
    CHECK_E(M, &dw, m->conv_tol, "%s bwd_weights beta %d dw", nm, beta);
    if (c->bias) CHECK_E(M, &db, m->tol, "%s bwd_weights beta %d db", nm, beta);
  }
  gb_free(&x), gb_free(&w), gb_free(&b), gb_free(&y), gb_free(&dy), gb_free(&dx), gb_free(&dw), gb_free(&db);
}

static const conv_case conv_cases[] = {
    {2, 3, 9, 9, 4, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_NONE},
    {2, 3, 9, 9, 4, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_RELU},
    {3, 4, 10, 10, 8, 3, 3, {2, 2, 1, 1, 1, 1, 1}, 1, CT_ACT_LEAKY_RELU},
    {2, 5, 11, 13, 6, 3, 3, {1, 1, 2, 2, 2, 2, 1}, 0, CT_ACT_GELU},
    {2, 8, 9, 9, 12, 3, 3, {1, 1, 1, 1, 1, 1, 4}, 1, CT_ACT_SILU},
    {2, 16, 12, 12, 16, 3, 3, {1, 1, 1, 1, 1, 1, 16}, 1, CT_ACT_SIGMOID},
    {3, 6, 7, 11, 5, 3, 5, {2, 1, 1, 2, 1, 1, 1}, 1, CT_ACT_TANH},
    {1, 3, 13, 7, 7, 5, 2, {3, 2, 0, 1, 1, 2, 1}, 1, CT_ACT_NONE},
    {1, 1, 28, 28, 32, 3, 3, {1, 1, 0, 0, 1, 1, 1}, 1, CT_ACT_RELU},
    {4, 32, 13, 13, 64, 5, 5, {1, 1, 0, 0, 1, 1, 1}, 1, CT_ACT_RELU},
    {2, 17, 8, 8, 33, 1, 1, {1, 1, 0, 0, 1, 1, 1}, 1, CT_ACT_NONE},
    {2, 24, 10, 10, 24, 3, 3, {2, 2, 1, 1, 1, 1, 24}, 0, CT_ACT_RELU},
    {8, 64, 28, 28, 64, 3, 3, {1, 1, 1, 1, 1, 1, 1}, 1, CT_ACT_RELU}, /* big enough for Winograd/implicit GEMM */
};

typedef struct lin_case {
  int64_t N, K, M;
  int bias;
  ct_act act;
} lin_case;

static const lin_case lin_cases[] = {
    {4, 7, 5, 1, CT_ACT_NONE},     {1, 13, 3, 1, CT_ACT_RELU},  {33, 64, 17, 1, CT_ACT_GELU},
    {16, 100, 10, 0, CT_ACT_TANH}, {7, 9, 11, 1, CT_ACT_SILU},  {128, 256, 64, 1, CT_ACT_SIGMOID},
    {5, 6, 7, 1, CT_ACT_LEAKY_RELU}, {64, 128, 96, 1, CT_ACT_RELU}, {3, 8, 8, 0, CT_ACT_RELU},
};

static void linear_one(const mctx *M, const lin_case *c) {
  const mode *m = M->m;
  const ct_backend *B = ct_device_backend(m->dev);
  gb x = GB(c->N, c->K), w = GB(c->M, c->K), b = GB(c->M), y = GB(c->N, c->M), dy = GB(c->N, c->M);
  gb dx = GB(c->N, c->K), dw = GB(c->M, c->K), db = GB(c->M);
  gb_rand(&x, 1.0, m->in), gb_rand(&w, 0.3, m->in), gb_rand(&b, 0.5, CT_F32), gb_rand(&dy, 1.0, m->in);
  char nm[128];
  snprintf(nm, sizeof nm, "linear N%lld K%lld M%lld bias%d act%d %s", (long long)c->N, (long long)c->K,
           (long long)c->M, c->bias, (int)c->act, m->name);
  ct_tensor xg = gb_gpu(&x), wg = gb_gpu(&w), bg = gb_gpu(&b), dyg = gb_gpu(&dy);
  ct_tensor xr = gb_ref(&x), wr = gb_ref(&w), br = gb_ref(&b), dyr = gb_ref(&dy);
  ct_tensor yg = gb_out(&y, m->out), yr = gb_ref(&y);
  CHECK_OK(B->linear_fwd(m->dev, &xg, &wg, c->bias ? &bg : NULL, c->act, &yg));
  CHECK_OK(R_->linear_fwd(g_ref, &xr, &wr, c->bias ? &br : NULL, c->act, &yr));
  CHECK_E(M, &y, m->tol, "%s fwd", nm);
  if (c->bias && m->out != CT_F32) {
    /* A bias of the output's dtype (autocast's 16-bit weight copy) may
     * take the cuBLASLt epilogue; the f32 one above never does. */
    gb_put(&b, m->out);
    bg = gb_gpu(&b), br = gb_ref(&b);
    CHECK_OK(B->linear_fwd(m->dev, &xg, &wg, &bg, c->act, &yg));
    CHECK_OK(R_->linear_fwd(g_ref, &xr, &wr, &br, c->act, &yr));
    CHECK_E(M, &y, m->tol, "%s fwd, %s bias", nm, ct_dtype_name(m->out));
  }
  ct_tensor dxg = gb_out(&dx, m->out), dxr = gb_ref(&dx);
  CHECK_OK(B->linear_bwd_data(m->dev, &dyg, &wg, &dxg));
  CHECK_OK(R_->linear_bwd_data(g_ref, &dyr, &wr, &dxr));
  CHECK_E(M, &dx, m->tol, "%s bwd_data", nm);
  for (int beta = 0; beta <= 1; beta++) {
    gb_rand(&dw, 1.0, m->out), gb_rand(&db, 1.0, m->out);
    ct_tensor dwg = gb_gpu(&dw), dbg = gb_gpu(&db), dwr = gb_ref(&dw), dbr = gb_ref(&db);
    CHECK_OK(B->linear_bwd_weights(m->dev, &xg, &dyg, &dwg, c->bias ? &dbg : NULL, (float)beta));
    CHECK_OK(R_->linear_bwd_weights(g_ref, &xr, &dyr, &dwr, c->bias ? &dbr : NULL, (float)beta));
    CHECK_E(M, &dw, m->tol, "%s bwd_weights beta %d dw", nm, beta);
    if (c->bias) CHECK_E(M, &db, m->tol, "%s bwd_weights beta %d db", nm, beta);
  }
  gb_free(&x), gb_free(&w), gb_free(&b), gb_free(&y), gb_free(&dy), gb_free(&dx), gb_free(&dw), gb_free(&db);
}

static void matmul_one(const mctx *M, int ta, int tb_, int64_t Mm, int64_t K, int64_t N, float alpha, float beta) {
  const mode *m = M->m;
  const ct_backend *B = ct_device_backend(m->dev);
  gb a = ta ? GB(K, Mm) : GB(Mm, K), b = tb_ ? GB(N, K) : GB(K, N), c = GB(Mm, N);
  gb_rand(&a, 1.0, m->in), gb_rand(&b, 1.0, m->in), gb_rand(&c, 1.0, m->out);
  ct_tensor ag = gb_gpu(&a), bg = gb_gpu(&b), cg = gb_gpu(&c), ar = gb_ref(&a), br = gb_ref(&b), cr = gb_ref(&c);
  CHECK_OK(B->matmul(m->dev, ta, tb_, &ag, &bg, alpha, beta, &cg));
  CHECK_OK(R_->matmul(g_ref, ta, tb_, &ar, &br, alpha, beta, &cr));
  CHECK_E(M, &c, m->tol, "matmul ta%d tb%d %lldx%lldx%lld alpha %g beta %g %s", ta, tb_, (long long)Mm, (long long)K,
          (long long)N, alpha, beta, m->name);
  gb_free(&a), gb_free(&b), gb_free(&c);
}

static void run_mode(const mode *m, int idx) {
  mctx M = {m, idx};
  g_work = m->dev;
  for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) conv_one(&M, &conv_cases[i]);
  for (size_t i = 0; i < sizeof lin_cases / sizeof lin_cases[0]; i++) linear_one(&M, &lin_cases[i]);
  for (int ta = 0; ta <= 1; ta++)
    for (int tb_ = 0; tb_ <= 1; tb_++) {
      matmul_one(&M, ta, tb_, 7, 5, 9, 1.f, 0.f);
      matmul_one(&M, ta, tb_, 33, 70, 18, 0.5f, 1.f);
      matmul_one(&M, ta, tb_, 1, 64, 1, 2.f, 0.25f);
      matmul_one(&M, ta, tb_, 40, 50, 60, 1.f, 1.f);
    }
  printf("%-12s worst normwise relative error %.3g\n", m->name, worst[idx]);
}

int main(void) {
  unsetenv("CTRAIN_CUDA_TF32"); /* the f32 tolerances assume FMA math (TF32 off) */
  gpu_test_setup(42);
  mode modes[7] = {
      {"f32", g_gpu, CT_F32, CT_F32, 1e-5, 1e-4},
      {"bf16->f32", g_gpu, CT_BF16, CT_F32, 1e-2, 1e-2},
      {"bf16->bf16", g_gpu, CT_BF16, CT_BF16, 1e-2, 1e-2},
      {"f16->f32", g_gpu, CT_F16, CT_F32, 2e-3, 2e-3},
      {"f16->f16", g_gpu, CT_F16, CT_F16, 2e-3, 2e-3},
      {"tf32", NULL, CT_F32, CT_F32, 5e-3, 5e-3},
      {"tf32 (API)", NULL, CT_F32, CT_F32, 5e-3, 5e-3},
  };
  for (int i = 0; i < 5; i++) run_mode(&modes[i], i);
  /* TF32 is chosen when the device is opened. Buffers come from g_gpu;
   * both devices are the same GPU, so they are valid on either. */
  setenv("CTRAIN_CUDA_TF32", "1", 1);
  ct_device *tf = NULL;
  CHECK_OK(ct_device_open("cuda", &tf));
  unsetenv("CTRAIN_CUDA_TF32");
  if (tf) {
    modes[5].dev = tf;
    run_mode(&modes[5], 5);
    g_work = g_gpu;
    ct_device_close(tf);
  }
  /* The switch on the device the strict modes ran on, whose plan caches
   * hold FMA-math plans for the same shapes. */
  CHECK(ct_device_set_tf32(g_gpu, 1) == CT_OK);
  modes[6].dev = g_gpu;
  run_mode(&modes[6], 6);
  CHECK(ct_device_set_tf32(g_gpu, 0) == CT_OK);
  if (getenv("CTRAIN_TEST_EMU"))
    CHECK_MSG(worst[6] > 4 * worst[0], "ct_device_set_tf32: worst error %.3g, strict f32 %.3g: TF32 not in effect",
              worst[6], worst[0]);
  gpu_test_teardown();
  return test_summary("test_gpu_vs_ref");
}
