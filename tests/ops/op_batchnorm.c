/* Batch norm on the target against the reference, f32 within the row's
 * tol: the training forward (y, saved mean and inverse std, running
 * statistics), batchnorm_apply from the saved statistics, the backward
 * (dx; dgamma and dbeta overwritten and accumulated) and the eval forward,
 * for 2-D, 3-D and 4-D inputs, affine or not. The passes after the
 * training forward read the target's statistics on both sides, so each op
 * is compared on identical inputs. With OP_CAP_BN_APPLY_BITS,
 * batchnorm_apply must also repeat the training forward's output (and
 * act_fwd on it in place) to the bit, plain and in each of the row's
 * layouts, f32 and 16-bit (laid out only in the row's layout_dtypes): what
 * lets a recompute rebuild a dropped batch-norm output without changing
 * the step (test_recompute). Then SyncBatchNorm's per-channel stages. */
#include "op_target.h"

static void bn_one(op_env *e, int ndim, const int64_t *shape, int affine) {
  const ct_backend *B = e->be, *R = e->rb;
  const double tol = e->t->tol;
  const int64_t C = shape[1];
  obuf x = ob_make(e->dev, ndim, shape), y = ob_make(e->dev, ndim, shape), dy = ob_make(e->dev, ndim, shape);
  obuf dx = ob_make(e->dev, ndim, shape), y2 = ob_make(e->dev, ndim, shape);
  obuf g = OB(e->dev, C), b = OB(e->dev, C), rm = OB(e->dev, C), rv = OB(e->dev, C), sm = OB(e->dev, C);
  obuf si = OB(e->dev, C), dg = OB(e->dev, C), dbt = OB(e->dev, C);
  for (int64_t i = 0; i < x.n; i++)
    x.f[i] = (float)(ct_rng_normal(&e->rng) * 2.0) + 0.5f * (float)(i % 3); /* non-zero means */
  ob_put(&x, CT_F32);
  ob_rand(&dy, &e->rng, 1.0, CT_F32), ob_rand(&g, &e->rng, 1.0, CT_F32), ob_rand(&b, &e->rng, 1.0, CT_F32);
  ob_rand(&rm, &e->rng, 1.0, CT_F32);
  for (int64_t i = 0; i < C; i++) rv.f[i] = 0.5f + (float)i * 0.25f;
  ob_put(&rv, CT_F32);
  char nm[96], sh[48];
  snprintf(nm, sizeof nm, "batchnorm %s affine%d", ct_shape_str(ndim, shape, sh, sizeof sh), affine);
  ct_tensor xg = ob_dev(&x), yg = ob_out(&y, CT_F32), gg = ob_dev(&g), bg = ob_dev(&b), rmg = ob_dev(&rm);
  ct_tensor rvg = ob_dev(&rv), smg = ob_out(&sm, CT_F32), sig = ob_out(&si, CT_F32);
  ct_tensor xr = ob_ref(&x), yr = ob_ref(&y), gr = ob_ref(&g), br = ob_ref(&b), rmr = ob_ref(&rm), rvr = ob_ref(&rv);
  ct_tensor smr = ob_ref(&sm), sir = ob_ref(&si);
  const ct_tensor *ga = affine ? &gg : NULL, *ba = affine ? &bg : NULL, *gra = affine ? &gr : NULL;
  const ct_tensor *bra = affine ? &br : NULL;
  const float mom = 0.1f, eps = 1e-5f;
  CHECK_OK(B->batchnorm_fwd(e->dev, 1, &xg, ga, ba, &rmg, &rvg, mom, eps, &yg, &smg, &sig));
  CHECK_OK(R->batchnorm_fwd(e->ref, 1, &xr, gra, bra, &rmr, &rvr, mom, eps, &yr, &smr, &sir));
  CHECK_ERR(e, &y, tol, "%s train y", nm);
  CHECK_ERR(e, &sm, tol, "%s save_mean", nm);
  CHECK_ERR(e, &si, tol, "%s save_invstd", nm);
  CHECK_ERR(e, &rm, tol, "%s running_mean", nm);
  CHECK_ERR(e, &rv, tol, "%s running_var", nm);
  ob_put(&sm, CT_F32), ob_put(&si, CT_F32), ob_put(&rm, CT_F32), ob_put(&rv, CT_F32);

  ct_tensor y2g = ob_out(&y2, CT_F32), y2r = ob_ref(&y2);
  CHECK_OK(B->batchnorm_apply(e->dev, &xg, ga, ba, &smg, &sig, CT_ACT_NONE, 0.f, &y2g));
  CHECK_OK(R->batchnorm_apply(e->ref, &xr, gra, bra, &smr, &sir, CT_ACT_NONE, 0.f, &y2r));
  CHECK_ERR(e, &y2, tol, "%s apply y", nm);
  if (e->t->caps & OP_CAP_BN_APPLY_BITS)
    CHECK_MSG(memcmp(y2.f, y.f, (size_t)y.n * 4) == 0, "%s: not the training forward's bits",
              op_case(e, "%s apply", nm));

  for (int acc = 0; acc <= 1; acc++) {
    ob_rand(&dg, &e->rng, 1.0, CT_F32), ob_rand(&dbt, &e->rng, 1.0, CT_F32);
    ct_tensor dyg = ob_dev(&dy), dxg = ob_out(&dx, CT_F32), dgg = ob_dev(&dg), dbg = ob_dev(&dbt);
    ct_tensor dyr = ob_ref(&dy), dxr = ob_ref(&dx), dgr = ob_ref(&dg), dbr = ob_ref(&dbt);
    CHECK_OK(B->batchnorm_bwd(e->dev, &xg, &dyg, ga, &smg, &sig, &dxg, affine ? &dgg : NULL, affine ? &dbg : NULL,
                              (float)acc));
    CHECK_OK(R->batchnorm_bwd(e->ref, &xr, &dyr, gra, &smr, &sir, &dxr, affine ? &dgr : NULL, affine ? &dbr : NULL,
                              (float)acc));
    CHECK_ERR(e, &dx, tol, "%s bwd dx acc%d", nm, acc);
    if (affine) {
      CHECK_ERR(e, &dg, tol, "%s bwd dgamma acc%d", nm, acc);
      CHECK_ERR(e, &dbt, tol, "%s bwd dbeta acc%d", nm, acc);
    }
  }
  yg = ob_out(&y, CT_F32);
  CHECK_OK(B->batchnorm_fwd(e->dev, 0, &xg, ga, ba, &rmg, &rvg, mom, eps, &yg, NULL, NULL));
  CHECK_OK(R->batchnorm_fwd(e->ref, 0, &xr, gra, bra, &rmr, &rvr, mom, eps, &yr, NULL, NULL));
  CHECK_ERR(e, &y, tol, "%s eval y", nm);
  ob_free(&x), ob_free(&y), ob_free(&dy), ob_free(&dx), ob_free(&y2), ob_free(&g), ob_free(&b), ob_free(&rm);
  ob_free(&rv), ob_free(&sm), ob_free(&si), ob_free(&dg), ob_free(&dbt);
}

static void bn_apply_bits(op_env *e) {
  const op_target *t = e->t;
  const ct_dtype dts[] = {CT_F32, CT_BF16, CT_F16};
  const int64_t shape[4] = {3, 32, 5, 6}, C = shape[1];
  obuf x = ob_make(e->dev, 4, shape), y1 = ob_make(e->dev, 4, shape), y2 = ob_make(e->dev, 4, shape);
  obuf g = OB(e->dev, C), b = OB(e->dev, C), sm = OB(e->dev, C), si = OB(e->dev, C), rm = OB(e->dev, C);
  obuf rv = OB(e->dev, C);
  ob_rand(&g, &e->rng, 1.0, CT_F32), ob_rand(&b, &e->rng, 1.0, CT_F32);
  ct_tensor gt = ob_dev(&g), bt = ob_dev(&b);
  ct_layout lays[5] = {CT_LAYOUT_PLAIN};
  int nlays = 1;
  for (int i = 0; t->layouts[i]; i++) lays[nlays++] = t->layouts[i];
  for (int li = 0; li < nlays; li++)
    for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++)
      for (int act = 0; act <= 1; act++) {
        const ct_layout lay = lays[li];
        const ct_dtype dt = dts[di];
        if (lay != CT_LAYOUT_PLAIN && !(t->layout_dtypes & 1u << dt)) continue;
        x.lay = y1.lay = y2.lay = lay;
        for (int64_t i = 0; i < x.n; i++) x.f[i] = (float)(ct_rng_normal(&e->rng) * 2.0 + 0.3 * (double)(i % 5));
        ob_put(&x, dt);
        for (int64_t c = 0; c < C; c++) rm.f[c] = 0.f, rv.f[c] = 1.f;
        ob_put(&rm, CT_F32), ob_put(&rv, CT_F32);
        ct_tensor xt = ob_dev(&x), t1 = ob_out(&y1, dt), t2 = ob_out(&y2, dt), smt = ob_out(&sm, CT_F32);
        ct_tensor sit = ob_out(&si, CT_F32), rmt = ob_dev(&rm), rvt = ob_dev(&rv);
        const ct_act a = act ? CT_ACT_RELU : CT_ACT_NONE;
        CHECK_OK(e->be->batchnorm_fwd(e->dev, 1, &xt, &gt, &bt, &rmt, &rvt, 0.1f, 1e-5f, &t1, &smt, &sit));
        if (act) CHECK_OK(e->be->act_fwd(e->dev, a, 0.f, &t1, &t1));
        CHECK_OK(e->be->batchnorm_apply(e->dev, &xt, &gt, &bt, &smt, &sit, a, 0.f, &t2));
        ob_get(&y1), ob_get(&y2);
        CHECK_MSG(memcmp(y1.f, y2.f, (size_t)x.n * 4) == 0, "%s: not the training forward's bits",
                  op_case(e, "batchnorm_apply layout %d %s act %d", (int)lay, ct_dtype_name(dt), act));
      }
  ob_free(&x), ob_free(&y1), ob_free(&y2), ob_free(&g), ob_free(&b), ob_free(&sm), ob_free(&si), ob_free(&rm);
  ob_free(&rv);
}

/* SyncBatchNorm's per-channel arithmetic (batchnorm_sync_stats, _grads)
 * stage by stage, on the same inputs on both sides: between stages both
 * vals get the same "sums over the replicas" (this replica's values plus
 * another replica's, made up here), as the strategies' sums would give.
 * n = 0 (a replica without samples) must add nothing. */
static void vals_put(op_env *e, double *dv, const double *host, size_t n) {
  if (ct_device_copy(e->dev, dv, NULL, host, n * 8) != CT_OK || ct_device_sync(e->dev) != CT_OK) ob_die("vals_put");
}

static void vals_check(op_env *e, const double *dv, const double *ref, size_t n, const char *nm, const char *what) {
  double *got = malloc(n * 8);
  if (!got || ct_device_sync(e->dev) != CT_OK || ct_device_copy(NULL, got, e->dev, dv, n * 8) != CT_OK)
    ob_die("vals_check");
  double num = 0, mx = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs(got[i] - ref[i]);
    if (!(d <= num)) num = isnan(d) ? INFINITY : d;
    if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
  }
  double err = num / (mx > 0 ? mx : 1e-30);
  CHECK_MSG(err <= e->t->tol, "%s: err %.3g (tolerance %.3g)", op_case(e, "%s %s", nm, what), err, e->t->tol);
  free(got);
}

/* The target's f32 result against the reference's, which wrote rf. */
static void vec_check(op_env *e, obuf *t, const char *nm, const char *what) {
  for (int64_t i = 0; i < t->n; i++) t->d[i] = t->rf[i];
  CHECK_ERR(e, t, e->t->tol, "%s %s", nm, what);
}

/* vals[i] += another replica's value: positive where a count or a
 * squared deviation is summed. */
static void add_replica(ct_rng *rng, double *v, size_t n, size_t count_at, size_t positive_to) {
  for (size_t i = 0; i < n; i++)
    v[i] += i == count_at ? 7.0 : i < positive_to ? 7.0 * (1.0 + ct_rng_uniform(rng)) : 7.0 * ct_rng_normal(rng);
}

static void bn_sync(op_env *e, int64_t C, int affine, double n) {
  const ct_backend *B = e->be, *R = e->rb;
  obuf m = OB(e->dev, C), is = OB(e->dev, C), rm = OB(e->dev, C), rv = OB(e->dev, C), g = OB(e->dev, C);
  obuf dg = OB(e->dev, C), db = OB(e->dev, C), a = OB(e->dev, C), b = OB(e->dev, C);
  ob_rand(&m, &e->rng, 2.0, CT_F32), ob_rand(&rm, &e->rng, 1.0, CT_F32), ob_rand(&g, &e->rng, 1.0, CT_F32);
  ob_rand(&dg, &e->rng, 3.0, CT_F32), ob_rand(&db, &e->rng, 3.0, CT_F32);
  for (int64_t c = 0; c < C; c++) is.f[c] = 0.5f + 0.1f * (float)c, rv.f[c] = 1.0f + 0.25f * (float)c;
  ob_put(&is, CT_F32), ob_put(&rv, CT_F32);
  size_t nv = (size_t)(3 * C + 1);
  double *dv = ct_device_alloc(e->dev, nv * 8), *hv = calloc(nv, 8);
  if (!dv || !hv) ob_die("bn_sync");
  char nm[64];
  snprintf(nm, sizeof nm, "batchnorm_sync C %lld n %g affine%d", (long long)C, n, affine);
  ct_tensor mt = ob_dev(&m), ist = ob_dev(&is), rmt = ob_dev(&rm), rvt = ob_dev(&rv);
  ct_tensor mr = ob_ref32(&m), isr = ob_ref32(&is), rmr = ob_ref32(&rm), rvr = ob_ref32(&rv);
  const float mom = 0.1f, eps = 1e-5f;
  for (int stage = 0; stage < 3; stage++) {
    CHECK_OK(B->batchnorm_sync_stats(e->dev, stage, n, mom, eps, &mt, &ist, &rmt, &rvt, dv));
    CHECK_OK(R->batchnorm_sync_stats(e->ref, stage, n, mom, eps, &mr, &isr, &rmr, &rvr, hv));
    vals_check(e, dv, hv, stage == 0 ? (size_t)C + 1 : nv, nm, stage == 0 ? "stats 0" : stage == 1 ? "stats 1" : "stats 2");
    if (stage == 0 && n == 0)
      for (size_t i = 0; i <= (size_t)C; i++) CHECK_MSG(hv[i] == 0, "%s: n = 0 adds to the sums", nm);
    if (stage < 2) {
      add_replica(&e->rng, hv, stage == 0 ? (size_t)C + 1 : (size_t)C, stage == 0 ? (size_t)C : nv,
                  stage == 0 ? 0 : (size_t)C);
      vals_put(e, dv, hv, nv);
    }
  }
  vec_check(e, &m, nm, "mean");
  vec_check(e, &is, nm, "invstd");
  vec_check(e, &rm, nm, "running_mean");
  vec_check(e, &rv, nm, "running_var");

  ct_tensor gt = ob_dev(&g), dgt = ob_dev(&dg), dbt = ob_dev(&db), at = ob_out(&a, CT_F32), bt = ob_out(&b, CT_F32);
  ct_tensor gr = ob_ref32(&g), dgr = ob_ref32(&dg), dbr = ob_ref32(&db), ar = ob_ref32(&a), br = ob_ref32(&b);
  ist = ob_dev(&is), isr = ob_ref32(&is);
  for (int stage = 0; stage < 2 && (stage == 0 || n > 0); stage++) {
    CHECK_OK(B->batchnorm_sync_grads(e->dev, stage, n, affine ? &gt : NULL, &ist, &dgt, &dbt, &at, &bt, dv));
    CHECK_OK(R->batchnorm_sync_grads(e->ref, stage, n, affine ? &gr : NULL, &isr, &dgr, &dbr, &ar, &br, hv));
    if (stage == 0) {
      vals_check(e, dv, hv, (size_t)(2 * C + 1), nm, "grads 0");
      add_replica(&e->rng, hv, (size_t)(2 * C + 1), (size_t)(2 * C), 0);
      vals_put(e, dv, hv, nv);
    }
  }
  if (n > 0) {
    vec_check(e, &a, nm, "a");
    vec_check(e, &b, nm, "b");
  }
  ct_device_free(e->dev, dv);
  free(hv);
  ob_free(&m), ob_free(&is), ob_free(&rm), ob_free(&rv), ob_free(&g), ob_free(&dg), ob_free(&db), ob_free(&a);
  ob_free(&b);
}

void op_batchnorm(op_env *e) {
  const int64_t s2[] = {8, 5}, s3[] = {4, 3, 7}, s4[] = {3, 4, 5, 6}, s4b[] = {1, 2, 3, 3}, s4c[] = {16, 32, 13, 13};
  for (int affine = 0; affine <= 1; affine++) {
    bn_one(e, 2, s2, affine);
    bn_one(e, 3, s3, affine);
    bn_one(e, 4, s4, affine);
    bn_one(e, 4, s4b, affine);
    bn_one(e, 4, s4c, affine);
  }
  if (e->t->caps & OP_CAP_BN_APPLY_BITS) bn_apply_bits(e);
  for (int affine = 0; affine <= 1; affine++) {
    bn_sync(e, 5, affine, 12.0);
    bn_sync(e, 300, affine, 1.0);
  }
  bn_sync(e, 7, 1, 0.0);
}
