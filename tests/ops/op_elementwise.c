/* The elementwise ops on the target against the reference: every
 * activation forward and backward (the backward fed the target's y on
 * both sides, so only the backward is compared; serial and parallel
 * sizes), add with and without ReLU, axpby with beta 1.3 and 0 (a stale
 * NaN must be overwritten), fill; f32 within the row's tol and each 16-bit
 * storage dtype of the row's elementwise16 (fill exact: the row's tol).
 * Dropout must give the reference's masks bit for bit (the same Philox
 * stream; whole batches and a rank's share of a global batch) and drop
 * about p of the elements. cast f32 -> bf16/f16 -> f32 must match the host
 * conversions bit for bit, and f32 -> f64 the reference's (OP_CAP_F64). */
#include "op_target.h"

static void act_all(op_env *e, int64_t n, ct_dtype dt, double tol) {
  const ct_backend *B = e->be, *R = e->rb;
  obuf x = OB(e->dev, 3, n), y = OB(e->dev, 3, n), dy = OB(e->dev, 3, n), dx = OB(e->dev, 3, n);
  ob_rand(&x, &e->rng, 3.0, dt), ob_rand(&dy, &e->rng, 1.0, dt);
  ct_tensor xg = ob_dev(&x), dyg = ob_dev(&dy), xr = ob_ref(&x), yr = ob_ref(&y), dyr = ob_ref(&dy), dxr = ob_ref(&dx);
  for (int a = 0; a < CT_ACT_COUNT; a++) {
    const float alpha = 0.13f;
    ct_tensor yg = ob_out(&y, dt);
    CHECK_OK(B->act_fwd(e->dev, (ct_act)a, alpha, &xg, &yg));
    CHECK_OK(R->act_fwd(e->ref, (ct_act)a, alpha, &xr, &yr));
    CHECK_ERR(e, &y, tol, "act %d fwd n=%lld %s", a, (long long)n, ct_dtype_name(dt));
    ob_put(&y, dt);
    /* pass only what the activation's backward is documented to read */
    int nx = CT_ACT_BWD_NEEDS_X(a), ny = CT_ACT_BWD_NEEDS_Y(a);
    ct_tensor dxg = ob_out(&dx, dt);
    CHECK_OK(B->act_bwd(e->dev, (ct_act)a, alpha, nx ? &xg : NULL, ny ? &yg : NULL, &dyg, &dxg));
    CHECK_OK(R->act_bwd(e->ref, (ct_act)a, alpha, nx ? &xr : NULL, ny ? &yr : NULL, &dyr, &dxr));
    CHECK_ERR(e, &dx, tol, "act %d bwd n=%lld %s", a, (long long)n, ct_dtype_name(dt));
  }
  ob_free(&x), ob_free(&y), ob_free(&dy), ob_free(&dx);
}

/* off, stride: the samples are numbers off + i x stride of a larger
 * batch (data parallel); 0, 0: the whole batch. */
static void dropout_one(op_env *e, int64_t N, int64_t C, int64_t HW, int by_channel, float p, uint32_t step,
                        uint64_t off, uint64_t stride) {
  obuf x = OB(e->dev, N, C, HW), y = OB(e->dev, N, C, HW), dx = OB(e->dev, N, C, HW);
  ob_rand(&x, &e->rng, 1.0, CT_F32);
  int64_t group = by_channel ? HW : 1;
  ct_dropout_key key = {0x1234567890abcdefull, 3, step, off, stride, C * HW / group};
  ct_tensor xg = ob_dev(&x), yg = ob_out(&y, CT_F32), dxg = ob_out(&dx, CT_F32);
  ct_tensor xr = ob_ref32(&x), yr = ob_ref32(&y), dxr = ob_ref32(&dx);
  char nm[96];
  snprintf(nm, sizeof nm, "dropout %lldx%lldx%lld group %lld p %g off %llu stride %llu", (long long)N, (long long)C,
           (long long)HW, (long long)group, p, (unsigned long long)off, (unsigned long long)stride);
  CHECK_OK(e->be->dropout_fwd(e->dev, p, group, key, &xg, &yg));
  CHECK_OK(e->rb->dropout_fwd(e->ref, p, group, key, &xr, &yr));
  int64_t bad = ob_diff_exact(&y), zeros = 0;
  for (int64_t i = 0; i < y.n; i++) zeros += y.f[i] == 0.f;
  CHECK_MSG(bad == 0, "%s: %lld elements differ", op_case(e, "%s fwd", nm), (long long)bad);
  /* the mask is not trivial: about p of the elements are dropped */
  CHECK_MSG(fabs((double)zeros / (double)y.n - p) < 0.1 + 2.0 / sqrt((double)(y.n / group)), "%s: drop fraction %g",
            op_case(e, "%s", nm), (double)zeros / (double)y.n);
  CHECK_OK(e->be->dropout_bwd(e->dev, p, group, key, &xg, &dxg));
  CHECK_OK(e->rb->dropout_bwd(e->ref, p, group, key, &xr, &dxr));
  bad = ob_diff_exact(&dx);
  CHECK_MSG(bad == 0, "%s: %lld elements differ", op_case(e, "%s bwd", nm), (long long)bad);
  ob_free(&x), ob_free(&y), ob_free(&dx);
}

/* f32 -> h -> f32 on the target against the host's conversions; a is
 * uploaded f32, y a scratch buffer of its size. */
static void cast16(op_env *e, obuf *a, obuf *y, ct_dtype h) {
  const int64_t n = a->n;
  obuf hb = OB(e->dev, n);
  ct_tensor ag = ob_dev(a), hg = ob_out(&hb, h);
  CHECK_OK(e->be->cast(e->dev, &ag, &hg));
  void *enc = malloc((size_t)n * 2);
  float *want = malloc((size_t)n * 4);
  if (!enc || !want) ob_die("cast16");
  ct_convert(a->f, CT_F32, enc, h, (size_t)n);
  ct_convert(enc, h, want, CT_F32, (size_t)n);
  ob_get(&hb);
  CHECK_MSG(memcmp(hb.f, want, (size_t)n * 4) == 0, "%s: differs from the host's conversion",
            op_case(e, "cast f32->%s n=%lld", ct_dtype_name(h), (long long)n));
  ct_tensor yg = ob_out(y, CT_F32);
  CHECK_OK(e->be->cast(e->dev, &hg, &yg));
  ob_get(y);
  CHECK_MSG(memcmp(y->f, want, (size_t)n * 4) == 0, "%s: differs from the host's conversion",
            op_case(e, "cast %s->f32 n=%lld", ct_dtype_name(h), (long long)n));
  free(enc), free(want);
  ob_free(&hb);
}

/* f32 -> f64 on the target against the reference's cast. */
static void cast64(op_env *e, obuf *a) {
  const size_t n = (size_t)a->n;
  void *dd = ct_device_alloc(e->dev, n * 8);
  double *got = malloc(n * 8), *want = malloc(n * 8);
  if (!dd || !got || !want) ob_die("cast64");
  ct_tensor ag = ob_dev(a), ar = ob_ref32(a), dg = ct_tensor_1d(dd, CT_F64, a->n),
            dr = ct_tensor_1d(want, CT_F64, a->n);
  dg.device = e->dev;
  CHECK_OK(e->be->cast(e->dev, &ag, &dg));
  CHECK_OK(e->rb->cast(e->ref, &ar, &dr));
  CHECK_OK(ct_device_sync(e->dev));
  CHECK_OK(ct_device_copy(NULL, got, e->dev, dd, n * 8));
  CHECK_MSG(memcmp(got, want, n * 8) == 0, "%s: differs from the reference", op_case(e, "cast f32->f64 n=%zu", n));
  ct_device_free(e->dev, dd);
  free(got), free(want);
}

static void misc_elementwise(op_env *e, int64_t n, ct_dtype dt, double tol) {
  const ct_backend *B = e->be, *R = e->rb;
  obuf a = OB(e->dev, n), b = OB(e->dev, n), y = OB(e->dev, n);
  ob_rand(&a, &e->rng, 1.0, dt), ob_rand(&b, &e->rng, 1.0, dt);
  const char *dn = ct_dtype_name(dt);
  ct_tensor ag = ob_dev(&a), bg = ob_dev(&b), yg = ob_out(&y, dt), ar = ob_ref(&a), br = ob_ref(&b), yr = ob_ref(&y);
  CHECK_OK(B->add(e->dev, &ag, &bg, CT_ACT_NONE, &yg));
  CHECK_OK(R->add(e->ref, &ar, &br, CT_ACT_NONE, &yr));
  CHECK_ERR(e, &y, tol, "add n=%lld %s", (long long)n, dn);
  yg = ob_out(&y, dt);
  CHECK_OK(B->add(e->dev, &ag, &bg, CT_ACT_RELU, &yg));
  CHECK_OK(R->add(e->ref, &ar, &br, CT_ACT_RELU, &yr));
  CHECK_ERR(e, &y, tol, "add + ReLU n=%lld %s", (long long)n, dn);
  ob_put(&y, dt);
  CHECK_OK(B->axpby(e->dev, 0.7f, &ag, 1.3f, &yg));
  CHECK_OK(R->axpby(e->ref, 0.7f, &ar, 1.3f, &yr));
  CHECK_ERR(e, &y, tol, "axpby beta 1.3 n=%lld %s", (long long)n, dn);
  y.f[0] = NAN; /* beta 0 must overwrite, not multiply, stale values */
  ob_put(&y, dt);
  CHECK_OK(B->axpby(e->dev, -2.f, &ag, 0.f, &yg));
  CHECK_OK(R->axpby(e->ref, -2.f, &ar, 0.f, &yr));
  CHECK_ERR(e, &y, tol, "axpby beta 0 n=%lld %s", (long long)n, dn);
  yg = ob_out(&y, dt);
  CHECK_OK(B->fill(e->dev, &yg, 0.375f));
  CHECK_OK(R->fill(e->ref, &yr, 0.375f));
  CHECK_ERR(e, &y, e->t->tol, "fill n=%lld %s", (long long)n, dn);
  if (dt == CT_F32) {
    cast16(e, &a, &y, CT_BF16);
    cast16(e, &a, &y, CT_F16);
    if (e->t->caps & OP_CAP_F64) cast64(e, &a);
  }
  ob_free(&a), ob_free(&b), ob_free(&y);
}

void op_elementwise(op_env *e) {
  const op_target *t = e->t;
  act_all(e, 101, CT_F32, t->tol);
  act_all(e, 40000, CT_F32, t->tol); /* the parallel paths */
  dropout_one(e, 2, 3, 49, 0, 0.3f, 1, 0, 0);
  dropout_one(e, 2, 3, 49, 1, 0.5f, 2, 0, 0);
  dropout_one(e, 3, 101, 333, 0, 0.2f, 7, 0, 0); /* 100899 elements: parallel, not a multiple of 4 */
  dropout_one(e, 4, 64, 169, 1, 0.25f, 9, 0, 0);
  /* A rank's share of a global batch: masks by sample number. */
  dropout_one(e, 3, 101, 333, 0, 0.2f, 7, 1, 2);
  dropout_one(e, 4, 64, 169, 1, 0.25f, 9, 5, 3);
  misc_elementwise(e, 7, CT_F32, t->tol);
  misc_elementwise(e, 100003, CT_F32, t->tol);
  const ct_dtype h16[2] = {CT_BF16, CT_F16};
  for (int k = 0; k < 2; k++) {
    double tol = op_tol16_of(&t->elementwise16, h16[k]);
    if (tol <= 0) continue;
    act_all(e, 1001, h16[k], tol);
    misc_elementwise(e, 1003, h16[k], tol);
  }
}
