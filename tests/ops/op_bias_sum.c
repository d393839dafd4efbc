/* Bias gradients summed over >= 100000 rows (the cuda backend's sliced
 * column sums, cuda_channel_sum with inner == 1) through their two
 * callers: linear_bwd_weights, and conv2d_bwd_weights on NHWC x and dy
 * ([N*H*W][C] rows; OP_CAP_CONV_NHWC) with a plain dw. C = 37 and 1000
 * (not multiples of 32), beta 0 (outputs poisoned with NaN first) and 1,
 * f32 and 16-bit x and dy (those of the row's rounded16; NHWC only in its
 * layout_dtypes). The bias gradient: the row's long_sum_tol. The weight
 * gradient beside it is an f32 reduction over the same rows:
 * sequential f32 accumulation over n terms drifts by about u * sqrt(n/2)
 * relative (6e-8 * 224 = 1.3e-5 at n = 1e5), so dw gets 2e-4 (a wrong dw
 * is off by O(1)); a 16-bit convolution's dw is computed in its dtype
 * (rounded16), and with OP_CAP_DW16_WIDENED must be that 16-bit result
 * widened into the f32 gradient (every element a 16-bit value, as
 * PyTorch's CUDA autocast), not the f32 convolution of widened operands. */
#include "op_target.h"

#define TOL_LONG_F32 2e-4

/* big: 1e8 random inputs and f64 products on the reference side, for rows
 * with big */
typedef struct linear_bias_case {
  int64_t rows, K, M;
  ct_dtype dt;
  int big;
} linear_bias_case;

static const linear_bias_case linear_cases[] = {
    {100003, 3, 37, CT_F32, 0},
    {100000, 2, 1000, CT_F32, 1},
    {131071, 4, 37, CT_BF16, 0},
};

typedef struct conv_bias_case {
  int64_t N, C, H, W, O;
  int k;
  ct_dtype dt;
  int big;
} conv_bias_case;

static const conv_bias_case conv_cases[] = {
    {4, 3, 160, 160, 37, 3, CT_F32, 0},   /* 102400 rows */
    {2, 2, 224, 224, 1000, 1, CT_F32, 1}, /* 100352 rows */
    {4, 3, 160, 160, 37, 1, CT_BF16, 0},
    {2, 5, 24, 24, 19, 3, CT_F16, 0},
};

/* f32 weight and bias gradients on both sides for beta 0 (outputs the op
 * must overwrite; zero on the reference side) or 1 (random values both
 * accumulate into). */
static void grad_outputs(op_env *e, obuf *dw, obuf *db, int beta, ct_tensor *dwg, ct_tensor *dbg) {
  if (beta) {
    ob_rand(dw, &e->rng, 1.0, CT_F32), ob_rand(db, &e->rng, 1.0, CT_F32);
    *dwg = ob_dev(dw), *dbg = ob_dev(db);
  } else {
    *dwg = ob_out(dw, CT_F32), *dbg = ob_out(db, CT_F32);
    memset(dw->d, 0, (size_t)dw->n * 8), memset(db->d, 0, (size_t)db->n * 8);
  }
}

static void linear_bias(op_env *e, const linear_bias_case *c) {
  obuf x = OB(e->dev, c->rows, c->K), dy = OB(e->dev, c->rows, c->M), dw = OB(e->dev, c->M, c->K),
       db = OB(e->dev, c->M);
  ob_rand(&x, &e->rng, 1.0, c->dt), ob_rand(&dy, &e->rng, 1.0, c->dt);
  ct_tensor xg = ob_dev(&x), dyg = ob_dev(&dy), xr = ob_ref(&x), dyr = ob_ref(&dy);
  for (int beta = 0; beta <= 1; beta++) {
    ct_tensor dwg, dbg;
    grad_outputs(e, &dw, &db, beta, &dwg, &dbg);
    ct_tensor dwr = ob_ref(&dw), dbr = ob_ref(&db);
    CHECK_OK(e->be->linear_bwd_weights(e->dev, &xg, &dyg, &dwg, &dbg, (float)beta));
    CHECK_OK(e->rb->linear_bwd_weights(e->ref, &xr, &dyr, &dwr, &dbr, (float)beta));
    CHECK_ERR_NZ(e, &db, e->t->long_sum_tol, "linear bias grad rows %lld M %lld %s beta %d", (long long)c->rows,
                 (long long)c->M, ct_dtype_name(c->dt), beta);
    /* 16-bit inputs with an f32 dw: exact products, the same f32 accumulation */
    CHECK_ERR_NZ(e, &dw, TOL_LONG_F32, "linear weight grad rows %lld K %lld M %lld %s beta %d", (long long)c->rows,
                 (long long)c->K, (long long)c->M, ct_dtype_name(c->dt), beta);
  }
  ob_free(&x), ob_free(&dy), ob_free(&dw), ob_free(&db);
}

static void conv_nhwc_bias(op_env *e, const conv_bias_case *c) {
  const ct_conv2d_params p = {1, 1, c->k / 2, c->k / 2, 1, 1, 1};
  const ct_dtype dt = c->dt;
  obuf x = OB(e->dev, c->N, c->C, c->H, c->W), dy = OB(e->dev, c->N, c->O, c->H, c->W);
  obuf dw = OB(e->dev, c->O, c->C, c->k, c->k), db = OB(e->dev, c->O);
  x.lay = dy.lay = CT_LAYOUT_NHWC;
  ob_rand(&x, &e->rng, 1.0, dt), ob_rand(&dy, &e->rng, 1.0, dt);
  ct_tensor xg = ob_dev(&x), dyg = ob_dev(&dy), xr = ob_ref(&x), dyr = ob_ref(&dy);
  const long long rows = (long long)(c->N * c->H * c->W);
  const double dwtol = dt == CT_F32 ? TOL_LONG_F32 : op_tol16_of(&e->t->rounded16, dt);
  for (int beta = 0; beta <= 1; beta++) {
    ct_tensor dwg, dbg;
    grad_outputs(e, &dw, &db, beta, &dwg, &dbg);
    ct_tensor dwr = ob_ref(&dw), dbr = ob_ref(&db);
    CHECK_OK(e->be->conv2d_bwd_weights(e->dev, &p, &xg, &dyg, &dwg, &dbg, (float)beta));
    CHECK_OK(e->rb->conv2d_bwd_weights(e->ref, &p, &xr, &dyr, &dwr, &dbr, (float)beta));
    CHECK_ERR_NZ(e, &db, e->t->long_sum_tol, "NHWC conv bias grad rows %lld O %lld %s beta %d", rows, (long long)c->O,
                 ct_dtype_name(dt), beta);
    CHECK_ERR_NZ(e, &dw, dwtol, "NHWC conv weight grad rows %lld C %lld O %lld k%d %s beta %d", rows, (long long)c->C,
                 (long long)c->O, c->k, ct_dtype_name(dt), beta);
    /* with beta 0, dw.f holds the target's values as computed */
    if (dt != CT_F32 && beta == 0 && (e->t->caps & OP_CAP_DW16_WIDENED)) {
      int64_t off = 0;
      for (int64_t i = 0; i < dw.n; i++) {
        uint16_t h;
        float back;
        ct_convert(&dw.f[i], CT_F32, &h, dt, 1);
        ct_convert(&h, dt, &back, CT_F32, 1);
        off += back != dw.f[i];
      }
      CHECK_MSG(off == 0, "%s: %lld of %lld elements are not %s values",
                op_case(e, "NHWC conv weight grad %s", ct_dtype_name(dt)), (long long)off, (long long)dw.n,
                ct_dtype_name(dt));
    }
  }
  ob_free(&x), ob_free(&dy), ob_free(&dw), ob_free(&db);
}

/* Whether the row takes a case of dtype dt and size big. */
static int admitted(const op_env *e, ct_dtype dt, int big) {
  return (dt == CT_F32 || op_tol16_of(&e->t->rounded16, dt) > 0) && (!big || e->t->big);
}

void op_bias_sum(op_env *e) {
  for (size_t i = 0; i < sizeof linear_cases / sizeof linear_cases[0]; i++)
    if (admitted(e, linear_cases[i].dt, linear_cases[i].big)) linear_bias(e, &linear_cases[i]);
  if (!(e->t->caps & OP_CAP_CONV_NHWC)) return;
  for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) {
    const conv_bias_case *c = &conv_cases[i];
    if (admitted(e, c->dt, c->big) && (e->t->layout_dtypes & 1u << c->dt)) conv_nhwc_bias(e, c);
  }
}
