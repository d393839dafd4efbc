/* Reference backend: every backward against central finite differences in
 * float64 (L = sum(r * y) with random r), and every forward in f32 against
 * f64 on the same (float-representable) random inputs. */
#include "test_ref_common.h"

#define F64 CT_F64
#define F32 CT_F32
#define DTYPE_TOL 1e-5

/* Runs a forward in f32 and f64 through run(ctx, dtype, out) and compares. */
typedef void (*fwd_fn)(void *ctx, ct_dtype dt, arr *y);
static void dtype_check(const char *what, fwd_fn run, void *ctx, const arr *shape) {
  arr y64 = arr_copy(shape), y32 = arr_copy(shape);
  run(ctx, F64, &y64);
  run(ctx, F32, &y32);
  double e = arr_max_rel(&y32, &y64, 1.0);
  CHECK_MSG(e < DTYPE_TOL, "%s: f32 and f64 forwards differ by %.3g", what, e);
  arr_free(&y64);
  arr_free(&y32);
}

/* Accumulating weight (and convolution input) gradients: run with beta=1
 * over a random start and subtract it; the beta=0 run over NaN must give
 * the same. */
static void check_overwrite(const char *what, const arr *acc_minus_start, const arr *fresh) {
  double e = arr_max_rel(fresh, acc_minus_start, 1.0);
  CHECK_MSG(e < 1e-12, "%s: beta=0 result differs from (beta=1 result - start) by %.3g", what, e);
}

/* ================= convolution ================= */

typedef struct {
  ct_conv2d_params p;
  arr x, w, b, r;
  int bias;
  ct_act act;
} conv_case;

static void conv_run(void *ctx, ct_dtype dt, arr *y) {
  conv_case *c = ctx;
  ct_tensor x = tin(&c->x, dt), w = tin(&c->w, dt), b = tin(&c->b, dt), ty = tnan(y, dt);
  CHECK_OK(B->conv2d_fwd(g_dev, &c->p, &x, &w, c->bias ? &b : NULL, c->act, &ty));
  tback(&ty, y);
  ct_tensor_free(&x);
  ct_tensor_free(&w);
  ct_tensor_free(&b);
}

static double conv_loss(void *ctx) {
  conv_case *c = ctx;
  arr y = arr_copy(&c->r);
  conv_run(c, F64, &y);
  double L = arr_dot(&y, &c->r);
  arr_free(&y);
  return L;
}

static void test_conv(const char *name, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t KH,
                      int64_t KW, ct_conv2d_params p, int bias) {
  int64_t OH = (H + 2 * p.pad_h - p.dil_h * (KH - 1) - 1) / p.stride_h + 1;
  int64_t OW = (W + 2 * p.pad_w - p.dil_w * (KW - 1) - 1) / p.stride_w + 1;
  conv_case c = {p, arr_randn(ARR(N, C, H, W), 1), arr_randn(ARR(O, C / p.groups, KH, KW), 0.5),
                 arr_randn(ARR(O), 1), arr_randn(ARR(N, O, OH, OW), 1), bias, CT_ACT_NONE};
  char what[128];

  ct_tensor r = tin(&c.r, F64), w = tin(&c.w, F64), x = tin(&c.x, F64);
  arr dx = arr_copy(&c.x);
  ct_tensor tdx = tnan(&dx, F64);
  CHECK_OK(B->conv2d_bwd_data(g_dev, &p, &r, &w, &tdx));
  tback(&tdx, &dx);
  /* The accumulating backward-data over a random start, minus the start. */
  arr dx0 = arr_randn(arr_copy(&c.x), 1), dxa = arr_copy(&dx0);
  ct_tensor tdxa = tin(&dx0, F64);
  CHECK_OK(B->conv2d_bwd_data_acc(g_dev, &p, &r, &w, &tdxa));
  tback(&tdxa, &dxa);
  for (int64_t i = 0; i < dxa.n; i++) dxa.v[i] -= dx0.v[i];
  snprintf(what, sizeof what, "conv %s dx accumulated", name);
  check_overwrite(what, &dxa, &dx);

  arr dw0 = arr_randn(arr_copy(&c.w), 1), db0 = arr_randn(arr_copy(&c.b), 1);
  arr dw = arr_copy(&dw0), db = arr_copy(&db0), dwf = arr_copy(&dw0), dbf = arr_copy(&db0);
  ct_tensor tdw = tin(&dw0, F64), tdb = tin(&db0, F64);
  CHECK_OK(B->conv2d_bwd_weights(g_dev, &p, &x, &r, &tdw, &tdb, 1.0f));
  tback(&tdw, &dw);
  tback(&tdb, &db);
  for (int64_t i = 0; i < dw.n; i++) dw.v[i] -= dw0.v[i];
  for (int64_t i = 0; i < db.n; i++) db.v[i] -= db0.v[i];
  tdw = tnan(&dw0, F64);
  tdb = tnan(&db0, F64);
  CHECK_OK(B->conv2d_bwd_weights(g_dev, &p, &x, &r, &tdw, &tdb, 0.0f));
  tback(&tdw, &dwf);
  tback(&tdb, &dbf);
  snprintf(what, sizeof what, "conv %s dw", name);
  check_overwrite(what, &dw, &dwf);
  check_overwrite(what, &db, &dbf);

  snprintf(what, sizeof what, "conv %s dx", name);
  fd_check(what, conv_loss, &c, c.x.v, c.x.n, dx.v, 150);
  snprintf(what, sizeof what, "conv %s dw", name);
  fd_check(what, conv_loss, &c, c.w.v, c.w.n, dw.v, 150);
  if (bias) {
    snprintf(what, sizeof what, "conv %s db", name);
    fd_check(what, conv_loss, &c, c.b.v, c.b.n, db.v, 150);
  }

  const ct_act acts[] = {CT_ACT_NONE, CT_ACT_RELU, CT_ACT_GELU, CT_ACT_TANH};
  for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
    c.act = acts[i];
    snprintf(what, sizeof what, "conv %s act %d f32/f64", name, (int)acts[i]);
    dtype_check(what, conv_run, &c, &c.r);
  }
  ct_tensor_free(&r);
  ct_tensor_free(&w);
  ct_tensor_free(&x);
  arr *all[] = {&c.x, &c.w, &c.b, &c.r, &dx, &dx0, &dxa, &dw0, &db0, &dw, &db, &dwf, &dbf};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) arr_free(all[i]);
}

static void test_convs(void) {
  test_conv("3x3 pad1", 2, 3, 6, 5, 4, 3, 3, (ct_conv2d_params){1, 1, 1, 1, 1, 1, 1}, 1);
  test_conv("stride2 pad1 3x2", 2, 3, 8, 7, 4, 3, 2, (ct_conv2d_params){2, 2, 1, 1, 1, 1, 1}, 1);
  test_conv("dil2 pad2", 1, 2, 9, 8, 3, 3, 3, (ct_conv2d_params){1, 1, 2, 2, 2, 2, 1}, 1);
  test_conv("groups2 stride(2,1)", 2, 4, 7, 6, 6, 3, 3, (ct_conv2d_params){2, 1, 0, 1, 1, 1, 2}, 0);
  test_conv("depthwise", 2, 3, 6, 6, 3, 3, 3, (ct_conv2d_params){1, 1, 1, 1, 1, 1, 3}, 1);
  test_conv("depthwise x2 stride2", 1, 3, 7, 5, 6, 3, 3, (ct_conv2d_params){2, 2, 1, 1, 1, 1, 3}, 1);
  test_conv("1x1 nonsquare pad(0,2) dil(1,2)", 2, 3, 4, 6, 5, 2, 4, (ct_conv2d_params){1, 2, 0, 2, 1, 2, 1}, 1);
}

/* ================= linear and matmul ================= */

typedef struct {
  arr x, w, b, r;
  ct_act act;
} lin_case;

static void lin_run(void *ctx, ct_dtype dt, arr *y) {
  lin_case *c = ctx;
  ct_tensor x = tin(&c->x, dt), w = tin(&c->w, dt), b = tin(&c->b, dt), ty = tnan(y, dt);
  CHECK_OK(B->linear_fwd(g_dev, &x, &w, &b, c->act, &ty));
  tback(&ty, y);
  ct_tensor_free(&x);
  ct_tensor_free(&w);
  ct_tensor_free(&b);
}

static double lin_loss(void *ctx) {
  lin_case *c = ctx;
  arr y = arr_copy(&c->r);
  lin_run(c, F64, &y);
  double L = arr_dot(&y, &c->r);
  arr_free(&y);
  return L;
}

static void test_linear(void) {
  const int64_t N = 5, K = 7, M = 4;
  lin_case c = {arr_randn(ARR(N, K), 1), arr_randn(ARR(M, K), 0.5), arr_randn(ARR(M), 1), arr_randn(ARR(N, M), 1),
                CT_ACT_NONE};
  ct_tensor r = tin(&c.r, F64), w = tin(&c.w, F64), x = tin(&c.x, F64);
  arr dx = arr_copy(&c.x);
  ct_tensor tdx = tnan(&dx, F64);
  CHECK_OK(B->linear_bwd_data(g_dev, &r, &w, &tdx));
  tback(&tdx, &dx);
  arr dw0 = arr_randn(arr_copy(&c.w), 1), db0 = arr_randn(arr_copy(&c.b), 1);
  arr dw = arr_copy(&dw0), db = arr_copy(&db0), dwf = arr_copy(&dw0), dbf = arr_copy(&db0);
  ct_tensor tdw = tin(&dw0, F64), tdb = tin(&db0, F64);
  CHECK_OK(B->linear_bwd_weights(g_dev, &x, &r, &tdw, &tdb, 1.0f));
  tback(&tdw, &dw);
  tback(&tdb, &db);
  for (int64_t i = 0; i < dw.n; i++) dw.v[i] -= dw0.v[i];
  for (int64_t i = 0; i < db.n; i++) db.v[i] -= db0.v[i];
  tdw = tnan(&dw0, F64);
  tdb = tnan(&db0, F64);
  CHECK_OK(B->linear_bwd_weights(g_dev, &x, &r, &tdw, &tdb, 0.0f));
  tback(&tdw, &dwf);
  tback(&tdb, &dbf);
  check_overwrite("linear dw", &dw, &dwf);
  check_overwrite("linear db", &db, &dbf);
  fd_check("linear dx", lin_loss, &c, c.x.v, c.x.n, dx.v, 200);
  fd_check("linear dw", lin_loss, &c, c.w.v, c.w.n, dw.v, 200);
  fd_check("linear db", lin_loss, &c, c.b.v, c.b.n, db.v, 200);
  for (int a = 0; a < CT_ACT_COUNT; a++) {
    char what[64];
    c.act = (ct_act)a;
    snprintf(what, sizeof what, "linear act %d f32/f64", a);
    dtype_check(what, lin_run, &c, &c.r);
  }
  ct_tensor_free(&r);
  ct_tensor_free(&w);
  ct_tensor_free(&x);
  arr *all[] = {&c.x, &c.w, &c.b, &c.r, &dx, &dw0, &db0, &dw, &db, &dwf, &dbf};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) arr_free(all[i]);
}

typedef struct {
  int ta, tb;
  arr a, b, c0, r;
  float alpha, beta;
} mm_case;

static void mm_run(void *ctx, ct_dtype dt, arr *y) {
  mm_case *m = ctx;
  ct_tensor a = tin(&m->a, dt), b = tin(&m->b, dt), c = tin(&m->c0, dt);
  CHECK_OK(B->matmul(g_dev, m->ta, m->tb, &a, &b, m->alpha, m->beta, &c));
  tback(&c, y);
  ct_tensor_free(&a);
  ct_tensor_free(&b);
}

static double mm_loss(void *ctx) {
  mm_case *m = ctx;
  arr y = arr_copy(&m->r);
  mm_run(m, F64, &y);
  double L = arr_dot(&y, &m->r);
  arr_free(&y);
  return L;
}

/* The gradients of c = alpha op(a) op(b) + beta c0 are themselves matmuls
 * with transposes, so this checks every transpose combination twice. */
static void test_matmul(void) {
  const int64_t M = 4, N = 5, K = 3;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      mm_case m = {ta, tb, ta ? arr_randn(ARR(K, M), 1) : arr_randn(ARR(M, K), 1),
                   tb ? arr_randn(ARR(N, K), 1) : arr_randn(ARR(K, N), 1), arr_randn(ARR(M, N), 1),
                   arr_randn(ARR(M, N), 1), 1.5f, 0.5f};
      ct_tensor r = tin(&m.r, F64), a = tin(&m.a, F64), b = tin(&m.b, F64);
      arr da = arr_copy(&m.a), db = arr_copy(&m.b), dc = arr_copy(&m.r);
      ct_tensor tda = tnan(&da, F64), tdb = tnan(&db, F64);
      if (!ta)
        CHECK_OK(B->matmul(g_dev, 0, !tb, &r, &b, m.alpha, 0.0f, &tda));
      else
        CHECK_OK(B->matmul(g_dev, tb, 1, &b, &r, m.alpha, 0.0f, &tda));
      if (!tb)
        CHECK_OK(B->matmul(g_dev, !ta, 0, &a, &r, m.alpha, 0.0f, &tdb));
      else
        CHECK_OK(B->matmul(g_dev, 1, ta, &r, &a, m.alpha, 0.0f, &tdb));
      tback(&tda, &da);
      tback(&tdb, &db);
      for (int64_t i = 0; i < dc.n; i++) dc.v[i] = m.beta * m.r.v[i];
      char what[64];
      snprintf(what, sizeof what, "matmul ta=%d tb=%d da", ta, tb);
      fd_check(what, mm_loss, &m, m.a.v, m.a.n, da.v, 100);
      snprintf(what, sizeof what, "matmul ta=%d tb=%d db", ta, tb);
      fd_check(what, mm_loss, &m, m.b.v, m.b.n, db.v, 100);
      snprintf(what, sizeof what, "matmul ta=%d tb=%d dc (beta)", ta, tb);
      fd_check(what, mm_loss, &m, m.c0.v, m.c0.n, dc.v, 100);
      snprintf(what, sizeof what, "matmul ta=%d tb=%d f32/f64", ta, tb);
      dtype_check(what, mm_run, &m, &m.r);
      ct_tensor_free(&r);
      ct_tensor_free(&a);
      ct_tensor_free(&b);
      arr *all[] = {&m.a, &m.b, &m.c0, &m.r, &da, &db, &dc};
      for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) arr_free(all[i]);
    }
}

/* ================= pooling ================= */

typedef struct {
  int kind; /* 0 max, 1 avg, 2 adaptive avg, 3 adaptive max */
  ct_pool2d_params p;
  arr x, r;
} pool_case;

/* Forward; idx (when not NULL) receives the argmax workspace. */
static void pool_fwd(pool_case *c, ct_dtype dt, arr *y, int32_t *idx) {
  ct_tensor x = tin(&c->x, dt), ty = tnan(y, dt);
  switch (c->kind) {
    case 0: CHECK_OK(B->maxpool2d_fwd(g_dev, &c->p, &x, &ty, idx)); break;
    case 1: CHECK_OK(B->avgpool2d_fwd(g_dev, &c->p, &x, &ty)); break;
    case 2: CHECK_OK(B->adaptive_avgpool2d_fwd(g_dev, &x, &ty)); break;
    default: CHECK_OK(B->adaptive_maxpool2d_fwd(g_dev, &x, &ty, idx)); break;
  }
  tback(&ty, y);
  ct_tensor_free(&x);
}
static void pool_run(void *ctx, ct_dtype dt, arr *y) { pool_fwd(ctx, dt, y, NULL); }

static double pool_loss(void *ctx) {
  pool_case *c = ctx;
  arr y = arr_copy(&c->r);
  pool_fwd(c, F64, &y, NULL);
  double L = arr_dot(&y, &c->r);
  arr_free(&y);
  return L;
}

static void test_pool(const char *name, int kind, ct_pool2d_params p, int64_t N, int64_t C, int64_t H, int64_t W,
                      int64_t OH, int64_t OW) {
  pool_case c = {kind, p, arr_randn(ARR(N, C, H, W), 1), arr_randn(ARR(N, C, OH, OW), 1)};
  arr y = arr_copy(&c.r), dx = arr_copy(&c.x);
  int32_t *idx = malloc((size_t)y.n * sizeof(int32_t));
  int32_t *idx32 = malloc((size_t)y.n * sizeof(int32_t));
  ct_tensor tr = tin(&c.r, F64), tdx = tnan(&dx, F64);
  if (kind == 0) {
    ct_tensor tx = tin(&c.x, F64);
    CHECK(B->maxpool2d_workspace_bytes(g_dev, &p, &tx, &tr) == (size_t)y.n * 4);
    ct_tensor_free(&tx);
  }
  pool_fwd(&c, F64, &y, idx);
  switch (kind) {
    case 0: CHECK_OK(B->maxpool2d_bwd(g_dev, &p, &tr, idx, &tdx)); break;
    case 1: CHECK_OK(B->avgpool2d_bwd(g_dev, &p, &tr, &tdx)); break;
    case 2: CHECK_OK(B->adaptive_avgpool2d_bwd(g_dev, &tr, &tdx)); break;
    default: CHECK_OK(B->adaptive_maxpool2d_bwd(g_dev, &tr, idx, &tdx)); break;
  }
  tback(&tdx, &dx);
  char what[128];
  snprintf(what, sizeof what, "%s dx", name);
  fd_check(what, pool_loss, &c, c.x.v, c.x.n, dx.v, 200);
  snprintf(what, sizeof what, "%s f32/f64", name);
  dtype_check(what, pool_run, &c, &c.r);
  if (kind == 0 || kind == 3) {
    arr y32 = arr_copy(&c.r);
    pool_fwd(&c, F32, &y32, idx32);
    CHECK_MSG(memcmp(idx, idx32, (size_t)y.n * sizeof(int32_t)) == 0, "%s: f32 and f64 argmax differ", name);
    arr_free(&y32);
  }
  ct_tensor_free(&tr);
  free(idx);
  free(idx32);
  arr *all[] = {&c.x, &c.r, &y, &dx};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) arr_free(all[i]);
}

static void test_pools(void) {
  /* Output sizes as PyTorch computes them (see test_ref_ops.c for the
   * formula check). */
  ct_pool2d_params p331 = {3, 3, 2, 2, 1, 1, 0, 1};
  test_pool("maxpool k3 s2 p1", 0, p331, 2, 2, 7, 7, 4, 4);
  p331.ceil_mode = 1;
  test_pool("maxpool k3 s2 p1 ceil", 0, p331, 2, 2, 6, 6, 4, 4);
  test_pool("maxpool k2 s2 ceil", 0, (ct_pool2d_params){2, 2, 2, 2, 0, 0, 1, 1}, 1, 3, 5, 6, 3, 3);
  test_pool("maxpool k(3,2) s(2,1) p(1,0)", 0, (ct_pool2d_params){3, 2, 2, 1, 1, 0, 0, 1}, 2, 1, 6, 5, 3, 4);
  for (int cip = 0; cip < 2; cip++) {
    char name[96];
    snprintf(name, sizeof name, "avgpool k3 s2 p1 ceil cip=%d", cip);
    test_pool(name, 1, (ct_pool2d_params){3, 3, 2, 2, 1, 1, 1, cip}, 2, 2, 6, 6, 4, 4);
    snprintf(name, sizeof name, "avgpool k3 s2 p1 cip=%d", cip);
    test_pool(name, 1, (ct_pool2d_params){3, 3, 2, 2, 1, 1, 0, cip}, 1, 2, 7, 7, 4, 4);
    snprintf(name, sizeof name, "avgpool k2 s2 ceil cip=%d", cip);
    test_pool(name, 1, (ct_pool2d_params){2, 2, 2, 2, 0, 0, 1, cip}, 1, 2, 5, 5, 3, 3);
    snprintf(name, sizeof name, "avgpool k(3,2) s(1,2) p(1,1) ceil cip=%d", cip);
    test_pool(name, 1, (ct_pool2d_params){3, 2, 1, 2, 1, 1, 1, cip}, 2, 1, 5, 6, 5, 4);
  }
  test_pool("adaptive avg 5x7->3x2", 2, (ct_pool2d_params){0}, 2, 2, 5, 7, 3, 2);
  test_pool("adaptive avg 7x5->2x3", 2, (ct_pool2d_params){0}, 1, 3, 7, 5, 2, 3);
  test_pool("adaptive avg 3x4->5x6", 2, (ct_pool2d_params){0}, 1, 2, 3, 4, 5, 6);
  test_pool("adaptive max 5x7->3x2", 3, (ct_pool2d_params){0}, 2, 2, 5, 7, 3, 2);
  test_pool("adaptive max 7x5->2x3", 3, (ct_pool2d_params){0}, 1, 3, 7, 5, 2, 3);
  test_pool("adaptive max 6x6->1x1", 3, (ct_pool2d_params){0}, 2, 2, 6, 6, 1, 1);
}

/* ================= batch norm ================= */

typedef struct {
  arr x, g, b, r, rm, rv;
  int affine;
} bn_case;

static void bn_fwd(bn_case *c, ct_dtype dt, arr *y, arr *sm, arr *si, int track) {
  ct_tensor x = tin(&c->x, dt), g = tin(&c->g, dt), b = tin(&c->b, dt), ty = tnan(y, dt);
  ct_tensor rm = tin(&c->rm, dt), rv = tin(&c->rv, dt), tsm = tnan(&c->g, dt), tsi = tnan(&c->g, dt);
  CHECK_OK(B->batchnorm_fwd(g_dev, 1, &x, c->affine ? &g : NULL, c->affine ? &b : NULL, track ? &rm : NULL,
                            track ? &rv : NULL, 0.1f, 1e-5f, &ty, &tsm, &tsi));
  tback(&ty, y);
  if (sm) tback(&tsm, sm); else ct_tensor_free(&tsm);
  if (si) tback(&tsi, si); else ct_tensor_free(&tsi);
  ct_tensor *all[] = {&x, &g, &b, &rm, &rv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_free(all[i]);
}

static void bn_run(void *ctx, ct_dtype dt, arr *y) { bn_fwd(ctx, dt, y, NULL, NULL, 1); }

static double bn_loss(void *ctx) {
  bn_case *c = ctx;
  arr y = arr_copy(&c->r);
  bn_fwd(c, F64, &y, NULL, NULL, 0);
  double L = arr_dot(&y, &c->r);
  arr_free(&y);
  return L;
}

static void test_bn(const char *name, int ndim, const int64_t *shape, int affine) {
  int64_t C = shape[1];
  arr x = arr_randn(arr_make(ndim, shape), 1.5);
  for (int64_t i = 0; i < x.n; i++) x.v[i] = (float)(x.v[i] + 0.7); /* non-zero mean */
  bn_case c = {x, arr_randn(ARR(C), 1), arr_randn(ARR(C), 1), arr_randn(arr_make(ndim, shape), 1),
               arr_randn(ARR(C), 1), arr_randn(ARR(C), 1), affine};
  for (int64_t i = 0; i < C; i++) c.rv.v[i] = (float)(fabs(c.rv.v[i]) + 0.5);
  arr y = arr_copy(&c.r), sm = arr_copy(&c.g), si = arr_copy(&c.g);
  bn_fwd(&c, F64, &y, &sm, &si, 0);
  arr dx = arr_copy(&c.x), dg0 = arr_randn(arr_copy(&c.g), 1), db0 = arr_randn(arr_copy(&c.g), 1);
  arr dg = arr_copy(&dg0), db = arr_copy(&db0);
  ct_tensor x_ = tin(&c.x, F64), r = tin(&c.r, F64), g = tin(&c.g, F64), tsm = tin(&sm, F64), tsi = tin(&si, F64);
  ct_tensor tdx = tnan(&dx, F64), tdg = tin(&dg0, F64), tdb = tin(&db0, F64);
  CHECK_OK(B->batchnorm_bwd(g_dev, &x_, &r, affine ? &g : NULL, &tsm, &tsi, &tdx, &tdg, &tdb, 1.0f));
  tback(&tdx, &dx);
  tback(&tdg, &dg);
  tback(&tdb, &db);
  for (int64_t i = 0; i < C; i++) {
    dg.v[i] -= dg0.v[i];
    db.v[i] -= db0.v[i];
  }
  char what[128];
  snprintf(what, sizeof what, "batchnorm %s dx", name);
  fd_check(what, bn_loss, &c, c.x.v, c.x.n, dx.v, 200);
  if (affine) {
    snprintf(what, sizeof what, "batchnorm %s dgamma", name);
    fd_check(what, bn_loss, &c, c.g.v, c.g.n, dg.v, 200);
    snprintf(what, sizeof what, "batchnorm %s dbeta", name);
    fd_check(what, bn_loss, &c, c.b.v, c.b.n, db.v, 200);
  } else {
    /* Without affine, dgamma/dbeta are what they would be with gamma=1. */
    double s = 0;
    for (int64_t i = 0; i < c.r.n; i++) s += c.r.v[i];
    double t = 0;
    for (int64_t i = 0; i < C; i++) t += db.v[i];
    CHECK_MSG(fabs(s - t) < 1e-9 * fmax(1, fabs(s)), "batchnorm %s: dbeta sums to %g, expected sum(dy) = %g", name,
              t, s);
  }
  snprintf(what, sizeof what, "batchnorm %s f32/f64", name);
  dtype_check(what, bn_run, &c, &c.r);
  ct_tensor *tt[] = {&x_, &r, &g, &tsm, &tsi};
  for (size_t i = 0; i < sizeof tt / sizeof tt[0]; i++) ct_tensor_free(tt[i]);
  arr *all[] = {&c.x, &c.g, &c.b, &c.r, &c.rm, &c.rv, &y, &sm, &si, &dx, &dg0, &db0, &dg, &db};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) arr_free(all[i]);
}

static void test_bns(void) {
  test_bn("[N,C]", 2, (int64_t[]){6, 3}, 1);
  test_bn("[N,C,L]", 3, (int64_t[]){3, 2, 5}, 1);
  test_bn("[N,C,H,W]", 4, (int64_t[]){2, 3, 3, 4}, 1);
  test_bn("[N,C,H,W] no affine", 4, (int64_t[]){2, 2, 3, 3}, 0);
}

/* ================= elementwise ================= */

typedef struct {
  int kind; /* 0 act, 1 dropout, 2 softmax, 3 add */
  ct_act act;
  float alpha;
  float p;
  int64_t group;
  ct_dropout_key key;
  int log;
  arr x, x2, r;
} ew_case;

static void ew_run(void *ctx, ct_dtype dt, arr *y) {
  ew_case *c = ctx;
  ct_tensor x = tin(&c->x, dt), x2 = tin(&c->x2, dt), ty = tnan(y, dt);
  switch (c->kind) {
    case 0: CHECK_OK(B->act_fwd(g_dev, c->act, c->alpha, &x, &ty)); break;
    case 1: CHECK_OK(B->dropout_fwd(g_dev, c->p, c->group, c->key, &x, &ty)); break;
    case 2: CHECK_OK(B->softmax_fwd(g_dev, c->log, &x, &ty)); break;
    default: CHECK_OK(B->add(g_dev, &x, &x2, CT_ACT_NONE, &ty)); break;
  }
  tback(&ty, y);
  ct_tensor_free(&x);
  ct_tensor_free(&x2);
}

static double ew_loss(void *ctx) {
  ew_case *c = ctx;
  arr y = arr_copy(&c->r);
  ew_run(c, F64, &y);
  double L = arr_dot(&y, &c->r);
  arr_free(&y);
  return L;
}

static void ew_check(const char *name, ew_case *c) {
  arr y = arr_copy(&c->r), dx = arr_copy(&c->x);
  ew_run(c, F64, &y);
  ct_tensor x = tin(&c->x, F64), ty = tin(&y, F64), r = tin(&c->r, F64), tdx = tnan(&dx, F64);
  switch (c->kind) {
    case 0:
      /* Pass only what the activation's backward declares it reads. */
      CHECK_OK(B->act_bwd(g_dev, c->act, c->alpha, CT_ACT_BWD_NEEDS_X(c->act) ? &x : NULL,
                          CT_ACT_BWD_NEEDS_Y(c->act) ? &ty : NULL, &r, &tdx));
      break;
    case 1: CHECK_OK(B->dropout_bwd(g_dev, c->p, c->group, c->key, &r, &tdx)); break;
    case 2: CHECK_OK(B->softmax_bwd(g_dev, c->log, &ty, &r, &tdx)); break;
    default: memcpy(tdx.data, r.data, (size_t)dx.n * sizeof(double)); break; /* d(a+b)/da = identity */
  }
  tback(&tdx, &dx);
  char what[128];
  snprintf(what, sizeof what, "%s dx", name);
  fd_check(what, ew_loss, c, c->x.v, c->x.n, dx.v, 200);
  if (c->kind == 3) {
    snprintf(what, sizeof what, "%s db", name);
    fd_check(what, ew_loss, c, c->x2.v, c->x2.n, dx.v, 200);
  }
  snprintf(what, sizeof what, "%s f32/f64", name);
  dtype_check(what, ew_run, c, &c->r);
  ct_tensor_free(&x);
  ct_tensor_free(&ty);
  ct_tensor_free(&r);
  arr_free(&y);
  arr_free(&dx);
}

static void test_elementwise(void) {
  static const char *names[] = {"none", "relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh"};
  for (int a = 0; a < CT_ACT_COUNT; a++) {
    ew_case c = {0, (ct_act)a, 0.2f, 0, 1, {0}, 0, arr_randn(ARR(4, 9), 1.5), arr_randn(ARR(4, 9), 1),
                 arr_randn(ARR(4, 9), 1)};
    char name[64];
    snprintf(name, sizeof name, "act %s", names[a]);
    ew_check(name, &c);
    arr_free(&c.x);
    arr_free(&c.x2);
    arr_free(&c.r);
  }
  const int64_t groups[] = {1, 5};
  for (int gi = 0; gi < 2; gi++) {
    ew_case c = {1, CT_ACT_NONE, 0, 0.3f, groups[gi], {42, 3, 7, 0, 0, 0}, 0, arr_randn(ARR(4, 2, 5), 1),
                 arr_randn(ARR(4, 2, 5), 1), arr_randn(ARR(4, 2, 5), 1)};
    char name[64];
    snprintf(name, sizeof name, "dropout group=%lld", (long long)groups[gi]);
    ew_check(name, &c);
    arr_free(&c.x);
    arr_free(&c.x2);
    arr_free(&c.r);
  }
  for (int lg = 0; lg < 2; lg++) {
    ew_case c = {2, CT_ACT_NONE, 0, 0, 1, {0}, lg, arr_randn(ARR(5, 6), 2), arr_randn(ARR(5, 6), 1),
                 arr_randn(ARR(5, 6), 1)};
    ew_check(lg ? "log_softmax" : "softmax", &c);
    arr_free(&c.x);
    arr_free(&c.x2);
    arr_free(&c.r);
  }
  ew_case c = {3, CT_ACT_NONE, 0, 0, 1, {0}, 0, arr_randn(ARR(3, 7), 1), arr_randn(ARR(3, 7), 1),
               arr_randn(ARR(3, 7), 1)};
  ew_check("add", &c);
  arr_free(&c.x);
  arr_free(&c.x2);
  arr_free(&c.r);
}

/* ================= losses ================= */

typedef struct {
  int kind; /* 0 cross entropy, 1 nll, 2 mse */
  float eps;
  arr x, t2;       /* scores (or pred) and mse target */
  int64_t *targets; /* class indices */
} loss_case;

static double loss_value(loss_case *c, ct_dtype dt) {
  ct_tensor x = tin(&c->x, dt), t2 = tin(&c->t2, dt), tg = targets_tensor(c->targets, c->x.shape[0]);
  arr one = ARR(1);
  ct_tensor l = tnan(&one, dt);
  switch (c->kind) {
    case 0: CHECK_OK(B->cross_entropy_fwd(g_dev, &x, &tg, c->eps, &l)); break;
    case 1: CHECK_OK(B->nll_fwd(g_dev, &x, &tg, &l)); break;
    default: CHECK_OK(B->mse_fwd(g_dev, &x, &t2, &l)); break;
  }
  tback(&l, &one);
  double v = one.v[0];
  arr_free(&one);
  ct_tensor_free(&x);
  ct_tensor_free(&t2);
  return v;
}

static double loss_loss(void *ctx) { return loss_value(ctx, F64); }

static void loss_check(const char *name, loss_case *c) {
  const float scale = 1.75f;
  arr dx = arr_copy(&c->x);
  ct_tensor x = tin(&c->x, F64), t2 = tin(&c->t2, F64), tg = targets_tensor(c->targets, c->x.shape[0]);
  ct_tensor tdx = tnan(&dx, F64);
  switch (c->kind) {
    case 0: CHECK_OK(B->cross_entropy_bwd(g_dev, &x, &tg, c->eps, scale, &tdx)); break;
    case 1: CHECK_OK(B->nll_bwd(g_dev, &tg, scale, &tdx)); break;
    default: CHECK_OK(B->mse_bwd(g_dev, &x, &t2, scale, &tdx)); break;
  }
  tback(&tdx, &dx);
  for (int64_t i = 0; i < dx.n; i++) dx.v[i] /= scale;
  char what[128];
  snprintf(what, sizeof what, "%s dx", name);
  fd_check(what, loss_loss, c, c->x.v, c->x.n, dx.v, 200);
  double l64 = loss_value(c, F64), l32 = loss_value(c, F32);
  CHECK_MSG(fabs(l64 - l32) <= DTYPE_TOL * fmax(1, fabs(l64)), "%s: f32 loss %.9g vs f64 %.9g", name, l32, l64);
  ct_tensor_free(&x);
  ct_tensor_free(&t2);
  arr_free(&dx);
}

static void test_losses(void) {
  const int64_t N = 6, C = 5;
  int64_t targets[6];
  for (int i = 0; i < N; i++) targets[i] = ct_rng_below(&g_rng, (uint32_t)C);
  const float eps[] = {0.0f, 0.1f, 0.35f};
  for (int e = 0; e < 3; e++) {
    loss_case c = {0, eps[e], arr_randn(ARR(N, C), 2), arr_randn(ARR(N, C), 1), targets};
    char name[64];
    snprintf(name, sizeof name, "cross_entropy ls=%.2f", (double)eps[e]);
    loss_check(name, &c);
    arr_free(&c.x);
    arr_free(&c.t2);
  }
  loss_case n = {1, 0, arr_randn(ARR(N, C), 1), arr_randn(ARR(N, C), 1), targets};
  loss_check("nll", &n);
  arr_free(&n.x);
  arr_free(&n.t2);
  loss_case m = {2, 0, arr_randn(ARR(3, 4, 2), 1), arr_randn(ARR(3, 4, 2), 1), targets};
  loss_check("mse", &m);
  arr_free(&m.x);
  arr_free(&m.t2);
}

int main(void) {
  ref_setup(20240601);
  test_convs();
  test_linear();
  test_matmul();
  test_pools();
  test_bns();
  test_elementwise();
  test_losses();
  ct_device_close(g_dev);
  return test_summary("test_ref_grad");
}
