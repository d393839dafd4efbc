/* Reference backend forwards against independent computations: naive loops
 * written here, PyTorch's published numbers for tiny known inputs, the
 * BatchNorm running-stat rule, the dropout mask definition; plus the table
 * being complete and bad targets being rejected. Gradients are checked in
 * test_ref_grad.c. */
#include "backend/backend_ops.h"
#include "backend/cpu/ref_ops.h"
#include "backend/device_impl.h"
#include "test_ref_common.h"

#define F64 CT_F64
#define F32 CT_F32

static void check_close(const char *what, const arr *got, const arr *want, double tol) {
  double e = arr_max_rel(got, want, 1.0);
  CHECK_MSG(e < tol, "%s: off by %.3g (tolerance %.1g)", what, e, tol);
}

static void test_table_complete(void) {
  const ct_backend *r = ct_ref_backend();
  CHECK(r == B);
  CHECK(!r->open && !r->close && !r->alloc && !r->free && !r->copy && !r->sync);
  /* Nothing fills the reference's own table: every required entry of
   * backend_ops.def is its own. */
  for (int i = 0; i < ct_backend_op_count; i++)
    if (ct_backend_ops[i].rule == CT_OP_REQUIRED)
      CHECK_MSG(ct_backend_has(r, &ct_backend_ops[i]), "ref table: required entry '%s' is NULL", ct_backend_ops[i].name);
  CHECK_MSG(ct_backend_check(r) == CT_OK, "%s", ct_last_error());
}

/* ---- convolution, linear, matmul against naive loops ---- */

static void test_conv_naive(void) {
  /* One channel, stride 2, padding 1 through an explicitly padded copy. */
  const int64_t H = 5, W = 6, K = 3, P = 1, S = 2;
  const int64_t OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
  arr x = arr_randn(ARR(1, 1, H, W), 1), w = arr_randn(ARR(1, 1, K, K), 1), b = arr_randn(ARR(1), 1);
  arr y = ARR(1, 1, OH, OW), want = ARR(1, 1, OH, OW);
  double xp[7][8] = {{0}};
  for (int64_t i = 0; i < H; i++)
    for (int64_t j = 0; j < W; j++) xp[i + P][j + P] = x.v[i * W + j];
  for (int64_t i = 0; i < OH; i++)
    for (int64_t j = 0; j < OW; j++) {
      double s = b.v[0];
      for (int64_t u = 0; u < K; u++)
        for (int64_t v = 0; v < K; v++) s += xp[i * S + u][j * S + v] * w.v[u * K + v];
      want.v[i * OW + j] = s;
    }
  ct_conv2d_params p = {S, S, P, P, 1, 1, 1};
  ct_tensor tx = tin(&x, F64), tw = tin(&w, F64), tb = tin(&b, F64), ty = tnan(&y, F64);
  CHECK_OK(B->conv2d_fwd(g_dev, &p, &tx, &tw, &tb, CT_ACT_NONE, &ty));
  tback(&ty, &y);
  check_close("conv 1-channel vs naive", &y, &want, 1e-12);

  /* Fused activation = conv, then the activation op. */
  arr yr = ARR(1, 1, OH, OW), ya = ARR(1, 1, OH, OW);
  for (int a = 1; a < CT_ACT_COUNT; a++) {
    ct_tensor t1 = tnan(&yr, F64), t2 = tnan(&ya, F64), t3 = tin(&y, F64);
    CHECK_OK(B->conv2d_fwd(g_dev, &p, &tx, &tw, &tb, (ct_act)a, &t1));
    CHECK_OK(B->act_fwd(g_dev, (ct_act)a, 0.01f, &t3, &t2));
    tback(&t1, &yr);
    tback(&t2, &ya);
    ct_tensor_free(&t3);
    CHECK_MSG(arr_max_rel(&yr, &ya, 1.0) < 1e-12, "conv fused act %d differs from conv + act", a);
  }
  ct_tensor_free(&tx);
  ct_tensor_free(&tw);
  ct_tensor_free(&tb);

  /* Groups: a grouped conv equals separate convs on each channel block. */
  const int64_t N = 2, C = 4, O = 6, G = 2, H2 = 5, W2 = 5;
  arr gx = arr_randn(ARR(N, C, H2, W2), 1), gw = arr_randn(ARR(O, C / G, 3, 3), 1), gb = arr_randn(ARR(O), 1);
  arr gy = ARR(N, O, 5, 5);
  ct_conv2d_params gp = {1, 1, 1, 1, 1, 1, (int)G};
  ct_tensor tgx = tin(&gx, F64), tgw = tin(&gw, F64), tgb = tin(&gb, F64), tgy = tnan(&gy, F64);
  CHECK_OK(B->conv2d_fwd(g_dev, &gp, &tgx, &tgw, &tgb, CT_ACT_NONE, &tgy));
  tback(&tgy, &gy);
  ct_conv2d_params sp = {1, 1, 1, 1, 1, 1, 1};
  for (int64_t g = 0; g < G; g++) {
    arr sx = ARR(N, C / G, H2, W2), sw = ARR(O / G, C / G, 3, 3), sb = ARR(O / G), sy = ARR(N, O / G, 5, 5);
    for (int64_t n = 0; n < N; n++)
      memcpy(sx.v + n * sx.n / N, gx.v + (n * C + g * (C / G)) * H2 * W2, (size_t)(sx.n / N) * sizeof(double));
    memcpy(sw.v, gw.v + g * sw.n, (size_t)sw.n * sizeof(double));
    memcpy(sb.v, gb.v + g * sb.n, (size_t)sb.n * sizeof(double));
    ct_tensor a1 = tin(&sx, F64), a2 = tin(&sw, F64), a3 = tin(&sb, F64), a4 = tnan(&sy, F64);
    CHECK_OK(B->conv2d_fwd(g_dev, &sp, &a1, &a2, &a3, CT_ACT_NONE, &a4));
    tback(&a4, &sy);
    double worst = 0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t i = 0; i < sy.n / N; i++)
        worst = fmax(worst, fabs(sy.v[n * (sy.n / N) + i] - gy.v[(n * O + g * (O / G)) * 25 + i]));
    CHECK_MSG(worst < 1e-12, "grouped conv block %lld differs from a separate conv by %g", (long long)g, worst);
    ct_tensor_free(&a1);
    ct_tensor_free(&a2);
    ct_tensor_free(&a3);
    arr_free(&sx);
    arr_free(&sw);
    arr_free(&sb);
    arr_free(&sy);
  }
  ct_tensor_free(&tgx);
  ct_tensor_free(&tgw);
  ct_tensor_free(&tgb);
  arr *all[] = {&x, &w, &b, &y, &want, &yr, &ya, &gx, &gw, &gb, &gy};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) arr_free(all[i]);
}

static void test_linear_matmul_naive(void) {
  const int64_t N = 3, K = 4, M = 5;
  arr x = arr_randn(ARR(N, K), 1), w = arr_randn(ARR(M, K), 1), b = arr_randn(ARR(M), 1);
  arr y = ARR(N, M), want = ARR(N, M);
  for (int64_t n = 0; n < N; n++)
    for (int64_t m = 0; m < M; m++) {
      double s = b.v[m];
      for (int64_t k = 0; k < K; k++) s += x.v[n * K + k] * w.v[m * K + k];
      want.v[n * M + m] = s;
    }
  ct_tensor tx = tin(&x, F64), tw = tin(&w, F64), tb = tin(&b, F64), ty = tnan(&y, F64);
  CHECK_OK(B->linear_fwd(g_dev, &tx, &tw, &tb, CT_ACT_NONE, &ty));
  tback(&ty, &y);
  check_close("linear vs naive", &y, &want, 1e-12);

  /* matmul(x, w^T) with alpha/beta over a random c. */
  arr c0 = arr_randn(ARR(N, M), 1), c = ARR(N, M);
  for (int64_t i = 0; i < want.n; i++) want.v[i] = 2.0 * (want.v[i] - b.v[i % M]) - 0.5 * c0.v[i];
  ct_tensor tc = tin(&c0, F64);
  CHECK_OK(B->matmul(g_dev, 0, 1, &tx, &tw, 2.0f, -0.5f, &tc));
  tback(&tc, &c);
  check_close("matmul(x, w^T, alpha=2, beta=-0.5) vs naive", &c, &want, 1e-12);
  ct_tensor_free(&tx);
  ct_tensor_free(&tw);
  ct_tensor_free(&tb);
  arr *all[] = {&x, &w, &b, &y, &want, &c0, &c};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) arr_free(all[i]);
}

/* ---- pooling ---- */

static void test_pool_sizes(void) {
  /* {in, k, s, pad, ceil result, floor result} from torch.nn.MaxPool2d. */
  static const int tab[][6] = {{5, 2, 2, 0, 3, 2}, {6, 3, 2, 1, 4, 3}, {5, 3, 3, 1, 2, 2}, {4, 2, 2, 1, 3, 3},
                               {7, 3, 2, 1, 4, 4}, {8, 3, 3, 1, 3, 3}, {10, 4, 3, 2, 4, 4}};
  for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
    const int *t = tab[i];
    int64_t c = ct_ref_pool_out_size(t[0], t[1], t[2], t[3], 1, 1);
    int64_t f = ct_ref_pool_out_size(t[0], t[1], t[2], t[3], 1, 0);
    CHECK_MSG(c == t[4] && f == t[5], "pool size in=%d k=%d s=%d p=%d: got ceil %lld floor %lld, want %d %d", t[0],
              t[1], t[2], t[3], (long long)c, (long long)f, t[4], t[5]);
  }
}

/* The 5x5 input below and every expected value are PyTorch's (torch 1.13,
 * printed for this exact input). */
static const double POOL_IN[25] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3};

static void run_pool(int kind, ct_pool2d_params p, int64_t OH, int64_t OW, arr *y, int32_t *idx) {
  arr x = ARR(1, 1, 5, 5);
  memcpy(x.v, POOL_IN, sizeof POOL_IN);
  *y = ARR(1, 1, OH, OW);
  ct_tensor tx = tin(&x, F32), ty = tnan(y, F32);
  switch (kind) {
    case 0: CHECK_OK(B->maxpool2d_fwd(g_dev, &p, &tx, &ty, idx)); break;
    case 1: CHECK_OK(B->avgpool2d_fwd(g_dev, &p, &tx, &ty)); break;
    case 2: CHECK_OK(B->adaptive_avgpool2d_fwd(g_dev, &tx, &ty)); break;
    default: CHECK_OK(B->adaptive_maxpool2d_fwd(g_dev, &tx, &ty, idx)); break;
  }
  tback(&ty, y);
  ct_tensor_free(&tx);
  arr_free(&x);
}

static void expect(const char *what, const arr *y, const double *want, double tol) {
  for (int64_t i = 0; i < y->n; i++)
    CHECK_MSG(fabs(y->v[i] - want[i]) <= tol, "%s: element %lld is %.6f, PyTorch gives %.6f", what, (long long)i,
              y->v[i], want[i]);
}

static void test_pool_known(void) {
  arr y;
  int32_t idx[9];
  run_pool(0, (ct_pool2d_params){2, 2, 2, 2, 0, 0, 1, 1}, 3, 3, &y, idx);
  expect("maxpool k2 s2 ceil", &y, (double[]){9, 6, 5, 8, 9, 9, 6, 6, 3}, 0);
  arr_free(&y);
  run_pool(0, (ct_pool2d_params){3, 3, 2, 2, 1, 1, 1, 1}, 3, 3, &y, idx);
  expect("maxpool k3 s2 p1 ceil", &y, (double[]){9, 6, 5, 9, 9, 9, 6, 8, 8}, 0);
  static const int32_t want_idx[9] = {5, 7, 4, 5, 12, 14, 20, 18, 18};
  for (int i = 0; i < 9; i++) CHECK_MSG(idx[i] == want_idx[i], "maxpool index %d: %d, PyTorch %d", i, idx[i], want_idx[i]);
  arr_free(&y);
  run_pool(1, (ct_pool2d_params){3, 3, 2, 2, 1, 1, 1, 1}, 3, 3, &y, NULL);
  expect("avgpool k3 s2 p1 ceil count_include_pad", &y,
         (double[]){15 / 9., 19 / 9., 14 / 9., 29 / 9., 50 / 9., 36 / 9., 13 / 9., 25 / 9., 19 / 9.}, 1e-5);
  arr_free(&y);
  run_pool(1, (ct_pool2d_params){3, 3, 2, 2, 1, 1, 1, 0}, 3, 3, &y, NULL);
  expect("avgpool k3 s2 p1 ceil exclude pad", &y,
         (double[]){15 / 4., 19 / 6., 14 / 4., 29 / 6., 50 / 9., 36 / 6., 13 / 4., 25 / 6., 19 / 4.}, 1e-5);
  arr_free(&y);
  run_pool(1, (ct_pool2d_params){2, 2, 2, 2, 0, 0, 1, 1}, 3, 3, &y, NULL);
  expect("avgpool k2 s2 ceil count_include_pad", &y, (double[]){3.75, 4, 4, 4.5, 6.75, 6.5, 4, 5, 3}, 1e-5);
  arr_free(&y);
  run_pool(2, (ct_pool2d_params){0}, 3, 2, &y, NULL);
  expect("adaptive avg 5x5->3x2", &y, (double[]){25 / 6., 4, 47 / 9., 6, 11 / 3., 14 / 3.}, 1e-5);
  arr_free(&y);
  run_pool(3, (ct_pool2d_params){0}, 3, 2, &y, idx);
  expect("adaptive max 5x5->3x2", &y, (double[]){9, 6, 9, 9, 6, 8}, 0);
  static const int32_t want_aidx[6] = {5, 7, 5, 12, 20, 18};
  for (int i = 0; i < 6; i++)
    CHECK_MSG(idx[i] == want_aidx[i], "adaptive max index %d: %d, PyTorch %d", i, idx[i], want_aidx[i]);
  arr_free(&y);

  /* Ties: the first maximum in row-major window order wins. */
  arr tx = ARR(1, 1, 2, 2), ty = ARR(1, 1, 1, 1);
  tx.v[0] = 1;
  tx.v[1] = 7;
  tx.v[2] = 7;
  tx.v[3] = 7;
  ct_tensor a = tin(&tx, F64), b = tnan(&ty, F64);
  int32_t k = -5;
  CHECK_OK(B->maxpool2d_fwd(g_dev, &(ct_pool2d_params){2, 2, 2, 2, 0, 0, 0, 1}, &a, &b, &k));
  CHECK(k == 1);
  ct_tensor_free(&a);
  ct_tensor_free(&b);
  arr_free(&tx);
  arr_free(&ty);
}

/* ---- batch norm ---- */

static void test_bn_stats(void) {
  const int64_t N = 4, C = 3, L = 5;
  const double mom = 0.1, eps = 1e-5;
  arr x = arr_randn(ARR(N, C, L), 2), g = arr_randn(ARR(C), 1), b = arr_randn(ARR(C), 1);
  arr rm = arr_randn(ARR(C), 1), rv = arr_randn(ARR(C), 1);
  for (int64_t c = 0; c < C; c++) rv.v[c] = (float)(fabs(rv.v[c]) + 0.5);
  arr y = ARR(N, C, L), sm = ARR(C), si = ARR(C), rm2 = ARR(C), rv2 = ARR(C);
  ct_tensor tx = tin(&x, F64), tg = tin(&g, F64), tb = tin(&b, F64), trm = tin(&rm, F64), trv = tin(&rv, F64);
  ct_tensor ty = tnan(&y, F64), tsm = tnan(&sm, F64), tsi = tnan(&si, F64);
  CHECK_OK(B->batchnorm_fwd(g_dev, 1, &tx, &tg, &tb, &trm, &trv, (float)mom, (float)eps, &ty, &tsm, &tsi));
  tback(&ty, &y);
  tback(&tsm, &sm);
  tback(&tsi, &si);
  tback(&trm, &rm2);
  tback(&trv, &rv2);
  const double n = (double)(N * L);
  double worst = 0;
  for (int64_t c = 0; c < C; c++) {
    double s = 0, ss = 0;
    for (int64_t i = 0; i < N; i++)
      for (int64_t l = 0; l < L; l++) s += x.v[(i * C + c) * L + l];
    double mean = s / n;
    for (int64_t i = 0; i < N; i++)
      for (int64_t l = 0; l < L; l++) ss += pow(x.v[(i * C + c) * L + l] - mean, 2);
    double var_b = ss / n, var_u = ss / (n - 1);
    worst = fmax(worst, fabs(sm.v[c] - mean));
    worst = fmax(worst, fabs(si.v[c] - 1 / sqrt(var_b + eps)));
    worst = fmax(worst, fabs(rm2.v[c] - (0.9 * rm.v[c] + 0.1 * mean)));
    worst = fmax(worst, fabs(rv2.v[c] - (0.9 * rv.v[c] + 0.1 * var_u)));
    for (int64_t i = 0; i < N; i++)
      for (int64_t l = 0; l < L; l++) {
        int64_t k = (i * C + c) * L + l;
        worst = fmax(worst, fabs(y.v[k] - ((x.v[k] - mean) / sqrt(var_b + eps) * g.v[c] + b.v[c])));
      }
  }
  CHECK_MSG(worst < 1e-7, "batchnorm training stats / running update off by %g", worst);

  /* Eval uses the running statistics. Momentum 0.1 is a float, hence 1e-7. */
  ct_tensor tx2 = tin(&x, F64), trm2 = tin(&rm, F64), trv2 = tin(&rv, F64), ty2 = tnan(&y, F64);
  CHECK_OK(B->batchnorm_fwd(g_dev, 0, &tx2, &tg, &tb, &trm2, &trv2, (float)mom, (float)eps, &ty2, NULL, NULL));
  tback(&ty2, &y);
  worst = 0;
  for (int64_t k = 0; k < x.n; k++) {
    int64_t c = (k / L) % C;
    worst = fmax(worst, fabs(y.v[k] - ((x.v[k] - rm.v[c]) / sqrt(rv.v[c] + eps) * g.v[c] + b.v[c])));
  }
  CHECK_MSG(worst < 1e-7, "batchnorm eval off by %g", worst);
  double *rmv = trm2.data;
  CHECK_MSG(rmv[0] == rm.v[0], "batchnorm eval changed the running mean");

  /* One value per channel cannot be normalised in training. */
  arr one = ARR(1, C);
  ct_tensor t1 = tin(&one, F64), t1y = tnan(&one, F64);
  CHECK(B->batchnorm_fwd(g_dev, 1, &t1, NULL, NULL, NULL, NULL, 0.1f, 1e-5f, &t1y, NULL, NULL) == CT_ERR_INVALID_ARG);
  ct_tensor *tt[] = {&tx, &tg, &tb, &tx2, &trm2, &trv2, &t1, &t1y};
  for (size_t i = 0; i < sizeof tt / sizeof tt[0]; i++) ct_tensor_free(tt[i]);
  arr *all[] = {&x, &g, &b, &rm, &rv, &y, &sm, &si, &rm2, &rv2, &one};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) arr_free(all[i]);
}

/* ---- activations, dropout, softmax, elementwise ---- */

static void test_act_values(void) {
  arr x = ARR(4), y = ARR(4);
  const double xs[4] = {1.0, -0.5, 2.5, -3.0};
  memcpy(x.v, xs, sizeof xs);
  /* torch.nn.functional.gelu / silu in float64 at these points. */
  static const double gelu[4] = {0.841344746068543, -0.15426876936299344, 2.4844758366855597, -0.00404969409489031};
  static const double silu[4] = {0.7310585786300049, -0.1887703343990727, 2.3103545499468914, -0.14227761953270035};
  const double relu[4] = {1, 0, 2.5, 0}, leaky[4] = {1, -0.1, 2.5, -0.6};
  double sig[4], th[4];
  for (int i = 0; i < 4; i++) {
    sig[i] = 1 / (1 + exp(-xs[i]));
    th[i] = tanh(xs[i]);
  }
  struct {
    ct_act a;
    const double *want;
  } cases[] = {{CT_ACT_GELU, gelu}, {CT_ACT_SILU, silu}, {CT_ACT_RELU, relu}, {CT_ACT_LEAKY_RELU, leaky},
               {CT_ACT_SIGMOID, sig}, {CT_ACT_TANH, th}, {CT_ACT_NONE, xs}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    ct_tensor tx = tin(&x, F64), ty = tnan(&y, F64);
    CHECK_OK(B->act_fwd(g_dev, cases[c].a, 0.2f, &tx, &ty));
    tback(&ty, &y);
    ct_tensor_free(&tx);
    for (int i = 0; i < 4; i++)
      CHECK_MSG(fabs(y.v[i] - cases[c].want[i]) < 1e-7, "act %d at %g: %.15g, expected %.15g", (int)cases[c].a,
                xs[i], y.v[i], cases[c].want[i]);
  }
  arr_free(&x);
  arr_free(&y);
}

static void test_dropout(void) {
  const int64_t N = 20000, group = 4;
  const float p = 0.3f;
  ct_dropout_key key = {987654321ull, 5, 11, 0, 0, 0};
  arr x = arr_randn(ARR(N), 1), y = ARR(N), dx = ARR(N);
  for (int64_t i = 0; i < N; i++)
    if (x.v[i] == 0) x.v[i] = 1;
  ct_tensor tx = tin(&x, F64), ty = tnan(&y, F64), tdx = tnan(&dx, F64);
  CHECK_OK(B->dropout_fwd(g_dev, p, group, key, &tx, &ty));
  CHECK_OK(B->dropout_bwd(g_dev, p, group, key, &tx, &tdx));
  tback(&ty, &y);
  tback(&tdx, &dx);
  int64_t bad = 0, dropped = 0;
  for (int64_t i = 0; i < N; i++) {
    int drop = ct_rng_uniform_at(key.seed, CT_RNG_DROPOUT, key.layer, key.step, (uint64_t)(i / group)) < p;
    double want = drop ? 0.0 : x.v[i] / (1.0 - p);
    if (fabs(y.v[i] - want) > 1e-12 || y.v[i] != dx.v[i]) bad++;
    dropped += drop;
  }
  CHECK_MSG(bad == 0, "dropout: %lld elements disagree with the mask definition or between fwd and bwd", (long long)bad);
  double frac = (double)dropped / N;
  CHECK_MSG(fabs(frac - p) < 0.02, "dropout: dropped fraction %.3f, expected about %.2f", frac, (double)p);
  /* Whole groups share one decision. */
  int64_t split = 0;
  for (int64_t i = 0; i < N; i += group)
    for (int64_t j = 1; j < group; j++) split += (y.v[i] == 0) != (y.v[i + j] == 0);
  CHECK_MSG(split == 0, "dropout: %lld groups are partly dropped", (long long)split);
  /* p = 0 copies, p = 1 zeros. */
  ty = tnan(&y, F64);
  CHECK_OK(B->dropout_fwd(g_dev, 0.0f, 1, key, &tx, &ty));
  tback(&ty, &y);
  CHECK(memcmp(y.v, x.v, (size_t)N * sizeof(double)) == 0);
  ty = tnan(&y, F64);
  CHECK_OK(B->dropout_fwd(g_dev, 1.0f, 1, key, &tx, &ty));
  tback(&ty, &y);
  int nz = 0;
  for (int64_t i = 0; i < N; i++) nz += y.v[i] != 0;
  CHECK(nz == 0);
  ct_tensor_free(&tx);
  arr_free(&x);
  arr_free(&y);
  arr_free(&dx);
}

static void test_softmax(void) {
  const int64_t N = 4, C = 6;
  arr x = arr_randn(ARR(N, C), 3), xs = arr_copy(&x), y = ARR(N, C), ys = ARR(N, C), ly = ARR(N, C);
  for (int64_t i = 0; i < xs.n; i++) xs.v[i] += 1000; /* would overflow exp without the max shift */
  ct_tensor tx = tin(&x, F64), txs = tin(&xs, F64), ty = tnan(&y, F64), tys = tnan(&ys, F64), tly = tnan(&ly, F64);
  CHECK_OK(B->softmax_fwd(g_dev, 0, &tx, &ty));
  CHECK_OK(B->softmax_fwd(g_dev, 0, &txs, &tys));
  CHECK_OK(B->softmax_fwd(g_dev, 1, &txs, &tly));
  tback(&ty, &y);
  tback(&tys, &ys);
  tback(&tly, &ly);
  check_close("softmax shift invariance", &ys, &y, 1e-9);
  double worst = 0;
  for (int64_t r = 0; r < N; r++) {
    double s = 0, m = -INFINITY, e = 0;
    for (int64_t c = 0; c < C; c++) {
      s += y.v[r * C + c];
      m = fmax(m, x.v[r * C + c]);
    }
    for (int64_t c = 0; c < C; c++) e += exp(x.v[r * C + c] - m);
    worst = fmax(worst, fabs(s - 1));
    for (int64_t c = 0; c < C; c++) {
      worst = fmax(worst, fabs(y.v[r * C + c] - exp(x.v[r * C + c] - m) / e));
      worst = fmax(worst, fabs(ly.v[r * C + c] - (x.v[r * C + c] - m - log(e))));
    }
  }
  CHECK_MSG(worst < 1e-9, "softmax / log_softmax off by %g", worst);
  ct_tensor_free(&tx);
  ct_tensor_free(&txs);
  arr *all[] = {&x, &xs, &y, &ys, &ly};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) arr_free(all[i]);
}

static void test_elementwise_misc(void) {
  const int64_t n = 37;
  arr a = arr_randn(ARR(n), 1), b = arr_randn(ARR(n), 1), y = ARR(n);
  ct_tensor ta = tin(&a, F64), tb = tin(&b, F64), ty = tnan(&y, F64);
  CHECK_OK(B->add(g_dev, &ta, &tb, CT_ACT_NONE, &ty));
  tback(&ty, &y);
  double worst = 0;
  for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(y.v[i] - (a.v[i] + b.v[i])));
  CHECK_MSG(worst < 1e-15, "add off by %g", worst);
  /* The folded residual ReLU: y = max(a + b, 0), some sums negative. */
  ty = tnan(&y, F64);
  CHECK_OK(B->add(g_dev, &ta, &tb, CT_ACT_RELU, &ty));
  tback(&ty, &y);
  worst = 0;
  int neg = 0;
  for (int64_t i = 0; i < n; i++) {
    neg += a.v[i] + b.v[i] < 0;
    worst = fmax(worst, fabs(y.v[i] - fmax(a.v[i] + b.v[i], 0.0)));
  }
  CHECK_MSG(worst < 1e-15 && neg > 0, "add + ReLU off by %g (%d negative sums)", worst, neg);
  /* axpby with beta 0 overwrites even NaN; beta 1 accumulates. */
  ty = tnan(&y, F64);
  CHECK_OK(B->axpby(g_dev, 2.5f, &ta, 0.0f, &ty));
  CHECK_OK(B->axpby(g_dev, -1.0f, &tb, 1.0f, &ty));
  tback(&ty, &y);
  worst = 0;
  for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(y.v[i] - (2.5 * a.v[i] - b.v[i])));
  CHECK_MSG(worst < 1e-15, "axpby off by %g", worst);
  /* fill in several dtypes. */
  float f[5];
  double dv[5];
  int64_t iv[5];
  ct_tensor tf = ct_tensor_1d(f, F32, 5), td = ct_tensor_1d(dv, F64, 5), ti = ct_tensor_1d(iv, CT_I64, 5);
  CHECK_OK(B->fill(g_dev, &tf, 1.25f));
  CHECK_OK(B->fill(g_dev, &td, -3.5f));
  CHECK_OK(B->fill(g_dev, &ti, 7.0f));
  for (int i = 0; i < 5; i++) CHECK(f[i] == 1.25f && dv[i] == -3.5 && iv[i] == 7);
  /* cast f64 -> f32 -> bf16 -> f64. */
  float f32s[3];
  uint16_t bf[3];
  double src[3] = {1.0 / 3.0, -2.75, 1e3 + 0.3}, back[3];
  ct_tensor s64 = ct_tensor_1d(src, F64, 3), s32 = ct_tensor_1d(f32s, F32, 3), sbf = ct_tensor_1d(bf, CT_BF16, 3),
            sb = ct_tensor_1d(back, F64, 3);
  CHECK_OK(B->cast(g_dev, &s64, &s32));
  CHECK_OK(B->cast(g_dev, &s32, &sbf));
  CHECK_OK(B->cast(g_dev, &sbf, &sb));
  for (int i = 0; i < 3; i++) {
    CHECK(f32s[i] == (float)src[i]);
    CHECK_MSG(fabs(back[i] - src[i]) <= fabs(src[i]) / 256, "bf16 cast of %g gave %g", src[i], back[i]);
  }
  /* sumsq (double accumulate) and nonfinite. */
  double ss = 0, got = -1;
  for (int64_t i = 0; i < n; i++) ss += a.v[i] * a.v[i];
  CHECK_OK(B->sumsq(g_dev, &ta, &got));
  CHECK_MSG(fabs(got - ss) < 1e-12 * ss, "sumsq %g vs %g", got, ss);
  ct_tensor ta32 = tin(&a, F32);
  CHECK_OK(B->sumsq(g_dev, &ta32, &got));
  CHECK_MSG(fabs(got - ss) < 1e-12 * ss, "sumsq f32 %g vs %g", got, ss);
  int nf = -1;
  CHECK_OK(B->nonfinite(g_dev, &ta32, &nf));
  CHECK(nf == 0);
  ((float *)ta32.data)[n - 1] = INFINITY;
  CHECK_OK(B->nonfinite(g_dev, &ta32, &nf));
  CHECK(nf == 1);
  ((double *)ta.data)[3] = NAN;
  CHECK_OK(B->nonfinite(g_dev, &ta, &nf));
  CHECK(nf == 1);
  ct_tensor_free(&ta);
  ct_tensor_free(&tb);
  ct_tensor_free(&ta32);
  arr_free(&a);
  arr_free(&b);
  arr_free(&y);
}

/* ---- losses ---- */

static double loss_of(int kind, const arr *x, const arr *t2, int64_t *targets, float eps, ct_dtype dt) {
  ct_tensor tx = tin(x, dt), tt = tin(t2, dt), tg = targets_tensor(targets, x->shape[0]);
  arr one = ARR(1);
  ct_tensor l = tnan(&one, dt);
  if (kind == 0) CHECK_OK(B->cross_entropy_fwd(g_dev, &tx, &tg, eps, &l));
  if (kind == 1) CHECK_OK(B->nll_fwd(g_dev, &tx, &tg, &l));
  if (kind == 2) CHECK_OK(B->mse_fwd(g_dev, &tx, &tt, &l));
  tback(&l, &one);
  double v = one.v[0];
  arr_free(&one);
  ct_tensor_free(&tx);
  ct_tensor_free(&tt);
  return v;
}

static void test_losses_naive(void) {
  const int64_t N = 5, C = 4;
  int64_t tg[5];
  for (int i = 0; i < N; i++) tg[i] = ct_rng_below(&g_rng, C);
  arr x = arr_randn(ARR(N, C), 2), t2 = arr_randn(ARR(N, C), 1);
  const float eps = 0.2f;
  double ce0 = 0, ces = 0, nll = 0, mse = 0;
  for (int64_t r = 0; r < N; r++) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; c++) m = fmax(m, x.v[r * C + c]);
    for (int64_t c = 0; c < C; c++) s += exp(x.v[r * C + c] - m);
    double lse = m + log(s), mean_nlp = 0;
    for (int64_t c = 0; c < C; c++) mean_nlp += (lse - x.v[r * C + c]) / C;
    ce0 += (lse - x.v[r * C + tg[r]]) / N;
    ces += ((1 - (double)eps) * (lse - x.v[r * C + tg[r]]) + (double)eps * mean_nlp) / N;
    nll += -x.v[r * C + tg[r]] / N;
    for (int64_t c = 0; c < C; c++) mse += pow(x.v[r * C + c] - t2.v[r * C + c], 2) / (N * C);
  }
  double v;
  v = loss_of(0, &x, &t2, tg, 0.0f, F64);
  CHECK_MSG(fabs(v - ce0) < 1e-12, "cross_entropy %.15g vs naive %.15g", v, ce0);
  v = loss_of(0, &x, &t2, tg, eps, F64);
  CHECK_MSG(fabs(v - ces) < 1e-7, "cross_entropy ls=0.2 %.15g vs naive %.15g", v, ces);
  v = loss_of(1, &x, &t2, tg, 0, F64);
  CHECK_MSG(fabs(v - nll) < 1e-12, "nll %.15g vs naive %.15g", v, nll);
  v = loss_of(2, &x, &t2, tg, 0, F64);
  CHECK_MSG(fabs(v - mse) < 1e-12, "mse %.15g vs naive %.15g", v, mse);
  v = loss_of(0, &x, &t2, tg, eps, F32);
  CHECK_MSG(fabs(v - ces) < 1e-5 * fabs(ces), "cross_entropy f32 loss %.9g vs %.9g", v, ces);

  /* The loss gradient is linear in grad_scale. */
  arr d1 = arr_copy(&x), d2 = arr_copy(&x);
  ct_tensor tx = tin(&x, F64), tt = targets_tensor(tg, N), td1 = tnan(&d1, F64), td2 = tnan(&d2, F64);
  CHECK_OK(B->cross_entropy_bwd(g_dev, &tx, &tt, eps, 1.0f, &td1));
  CHECK_OK(B->cross_entropy_bwd(g_dev, &tx, &tt, eps, 1024.0f, &td2));
  tback(&td1, &d1);
  tback(&td2, &d2);
  for (int64_t i = 0; i < d1.n; i++) d1.v[i] *= 1024;
  check_close("cross_entropy_bwd grad_scale", &d2, &d1, 1e-12);
  ct_tensor_free(&tx);
  arr_free(&x);
  arr_free(&t2);
  arr_free(&d1);
  arr_free(&d2);
}

static void test_bad_targets(void) {
  const int64_t N = 3, C = 5;
  arr x = arr_randn(ARR(N, C), 1), d = ARR(N, C), one = ARR(1);
  const int64_t bads[2] = {C, -1};
  for (int k = 0; k < 2; k++) {
    int64_t tg[3] = {0, 4, bads[k]};
    ct_tensor tx = tin(&x, F64), tt = targets_tensor(tg, N), td = tnan(&d, F64), tl = tnan(&one, F64);
    char want[64];
    snprintf(want, sizeof want, "targets[2] = %lld", (long long)bads[k]);
    ct_status s;
    s = B->cross_entropy_fwd(g_dev, &tx, &tt, 0.1f, &tl);
    CHECK_MSG(s == CT_ERR_INVALID_ARG && strstr(ct_last_error(), want), "cross_entropy_fwd: %s: %s", ct_status_name(s),
              ct_last_error());
    s = B->cross_entropy_bwd(g_dev, &tx, &tt, 0.0f, 1.0f, &td);
    CHECK_MSG(s == CT_ERR_INVALID_ARG && strstr(ct_last_error(), want), "cross_entropy_bwd: %s: %s", ct_status_name(s),
              ct_last_error());
    s = B->nll_fwd(g_dev, &tx, &tt, &tl);
    CHECK_MSG(s == CT_ERR_INVALID_ARG && strstr(ct_last_error(), want), "nll_fwd: %s: %s", ct_status_name(s),
              ct_last_error());
    s = B->nll_bwd(g_dev, &tt, 1.0f, &td);
    CHECK_MSG(s == CT_ERR_INVALID_ARG && strstr(ct_last_error(), want), "nll_bwd: %s: %s", ct_status_name(s),
              ct_last_error());
    ct_tensor_free(&tx);
    ct_tensor_free(&td);
    ct_tensor_free(&tl);
  }
  /* bf16 goes through the widening path (exact for ReLU); mixed dtypes
   * are refused. */
  ct_tensor x64 = tin(&x, F64), x32 = tin(&x, F32), y64 = tnan(&d, F64);
  uint16_t hb[15], hy[15];
  for (int i = 0; i < 15; i++) hb[i] = ct_f32_to_bf16((float)(i - 7) * 0.37f);
  ct_tensor xbf = ct_tensor_2d(hb, CT_BF16, N, C), ybf = ct_tensor_2d(hy, CT_BF16, N, C);
  CHECK(N * C == 15);
  CHECK_OK(B->act_fwd(g_dev, CT_ACT_RELU, 0, &xbf, &ybf));
  for (int i = 0; i < 15; i++) {
    float v = ct_bf16_to_f32(hb[i]);
    CHECK(ct_bf16_to_f32(hy[i]) == (v > 0 ? v : 0.0f));
  }
  CHECK(B->add(g_dev, &x64, &x32, CT_ACT_NONE, &y64) == CT_ERR_INVALID_ARG);
  CHECK(strlen(ct_last_error()) > 0);
  ct_tensor_free(&x64);
  ct_tensor_free(&x32);
  ct_tensor_free(&y64);
  arr_free(&x);
  arr_free(&d);
  arr_free(&one);
}

int main(void) {
  ref_setup(777);
  test_table_complete();
  test_conv_naive();
  test_linear_matmul_naive();
  test_pool_sizes();
  test_pool_known();
  test_bn_stats();
  test_act_values();
  test_dropout();
  test_softmax();
  test_elementwise_misc();
  test_losses_naive();
  test_bad_targets();
  ct_device_close(g_dev);
  return test_summary("test_ref_ops");
}
