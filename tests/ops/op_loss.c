/* Softmax, the losses and the reductions on the target against the
 * reference. Softmax and log-softmax forward and backward (the backward fed
 * the target's y on both sides), f32 within the row's tol; sumsq within the
 * row's sumsq_tol relative; nonfinite finding one inf or NaN. The losses
 * (cross entropy with label smoothing 0 / 0.1 / 0.3, NLL, MSE) for f32 and
 * each 16-bit dtype of the row's loss16 as logits, int64 and int32
 * targets on the device (the reference gets the same classes as int64),
 * gradients scaled by 1 / 128 / 0.5 and stored in f32 (the row's tol: the
 * kernels sum in double) or in the logits' 16-bit dtype (loss16), the
 * loss itself f32 (the row's tol); and, where the backend has them, the
 * backwards that read the gradient scale from device memory (a loss scaler
 * at 1024). Outputs are filled with NaN before each op. */
#include "op_target.h"
#include "optim/optimizer_device.h"

/* A loss case; OP_DT16 stands for each 16-bit dtype of the row's loss16. */
#define OP_DT16 CT_DTYPE_COUNT
typedef struct loss_case {
  int64_t N, C;
  ct_dtype logits, grads, targets;
} loss_case;

static const loss_case loss_cases[] = {
    {5, 10, CT_F32, CT_F32, CT_I64},   {64, 1000, CT_F32, CT_F32, CT_I64},   {64, 1000, CT_F32, CT_F32, CT_I32},
    {5, 10, OP_DT16, OP_DT16, CT_I64}, {64, 1000, OP_DT16, OP_DT16, CT_I32}, {64, 1000, OP_DT16, CT_F32, CT_I64},
    {33, 17, OP_DT16, CT_F32, CT_I32},
};

static void softmax_reduce(op_env *e, int64_t N, int64_t C) {
  const ct_backend *B = e->be, *R = e->rb;
  const double tol = e->t->tol;
  obuf x = OB(e->dev, N, C), y = OB(e->dev, N, C), dy = OB(e->dev, N, C), dx = OB(e->dev, N, C);
  ob_rand(&x, &e->rng, 2.0, CT_F32), ob_rand(&dy, &e->rng, 1.0, CT_F32);
  ct_tensor xg = ob_dev(&x), dyg = ob_dev(&dy), xr = ob_ref(&x), yr = ob_ref(&y), dyr = ob_ref(&dy), dxr = ob_ref(&dx);
  for (int lg = 0; lg <= 1; lg++) {
    ct_tensor yg = ob_out(&y, CT_F32);
    CHECK_OK(B->softmax_fwd(e->dev, lg, &xg, &yg));
    CHECK_OK(R->softmax_fwd(e->ref, lg, &xr, &yr));
    CHECK_ERR(e, &y, tol, "softmax log%d %lldx%lld fwd", lg, (long long)N, (long long)C);
    ob_put(&y, CT_F32);
    ct_tensor dxg = ob_out(&dx, CT_F32);
    CHECK_OK(B->softmax_bwd(e->dev, lg, &yg, &dyg, &dxg));
    CHECK_OK(R->softmax_bwd(e->ref, lg, &yr, &dyr, &dxr));
    CHECK_ERR(e, &dx, tol, "softmax log%d %lldx%lld bwd", lg, (long long)N, (long long)C);
  }
  double sg = 0, sr = 0;
  CHECK_OK(B->sumsq(e->dev, &xg, &sg));
  CHECK_OK(R->sumsq(e->ref, &xr, &sr));
  CHECK_MSG(fabs(sg - sr) <= e->t->sumsq_tol * sr, "%s: %.17g, reference %.17g",
            op_case(e, "sumsq %lldx%lld", (long long)N, (long long)C), sg, sr);
  CHECK_MSG(sr > 0, "%s: the sum of random squares is 0", op_case(e, "sumsq %lldx%lld", (long long)N, (long long)C));
  const int64_t mid = N * C / 2;
  for (int k = 0; k < 3; k++) {
    float saved = x.f[mid];
    if (k == 1) x.f[mid] = INFINITY;
    if (k == 2) x.f[mid] = NAN;
    ob_put(&x, CT_F32);
    ct_tensor xr32 = ob_ref32(&x);
    int og = -1, orf = -1;
    CHECK_OK(B->nonfinite(e->dev, &xg, &og));
    CHECK_OK(R->nonfinite(e->ref, &xr32, &orf));
    CHECK_MSG(og == (k != 0) && og == orf, "%s: %d, reference %d", op_case(e, "nonfinite case %d", k), og, orf);
    x.f[mid] = saved;
  }
  ob_free(&x), ob_free(&y), ob_free(&dy), ob_free(&dx);
}

/* lt: logits dtype; gt: dtype of the gradient outputs; tt: targets dtype. */
static void losses(op_env *e, int64_t N, int64_t C, ct_dtype lt, ct_dtype gt, ct_dtype tt) {
  const ct_backend *B = e->be, *R = e->rb;
  const double tol = e->t->tol, gtol = gt == CT_F32 ? tol : op_tol16_of(&e->t->loss16, gt);
  obuf x = OB(e->dev, N, C), dx = OB(e->dev, N, C), loss = OB(e->dev, 1), tg = OB(e->dev, N, C);
  ob_rand(&x, &e->rng, 2.0, lt), ob_rand(&tg, &e->rng, 1.0, lt);
  int64_t *t = malloc((size_t)N * 8);
  int32_t *t32 = malloc((size_t)N * 4);
  if (!t || !t32) ob_die("losses");
  for (int64_t i = 0; i < N; i++) t32[i] = (int32_t)(t[i] = ct_rng_below(&e->rng, (uint32_t)C));
  const size_t tbytes = (size_t)N * (tt == CT_I32 ? 4 : 8);
  void *tdev = ct_device_alloc(e->dev, tbytes);
  CHECK_OK(ct_device_copy(e->dev, tdev, NULL, tt == CT_I32 ? (void *)t32 : (void *)t, tbytes));
  CHECK_OK(ct_device_sync(e->dev));
  ct_tensor tr = ct_tensor_1d(t, CT_I64, N), tgd = ct_tensor_1d(tdev, tt, N);
  tgd.device = e->dev;
  ct_tensor xg = ob_dev(&x), tgg = ob_dev(&tg), xr = ob_ref(&x), dxr = ob_ref(&dx), lr = ob_ref(&loss);
  ct_tensor tgr = ob_ref(&tg);
  char base[96];
  snprintf(base, sizeof base, "%lldx%lld logits %s grads %s targets %s", (long long)N, (long long)C, ct_dtype_name(lt),
           ct_dtype_name(gt), ct_dtype_name(tt));
  const float smooth[3] = {0.f, 0.1f, 0.3f}, scales[3] = {1.f, 128.f, 0.5f};
  for (int k = 0; k < 3; k++) {
    const float ls = smooth[k], gs = scales[k];
    ct_tensor lg = ob_out(&loss, CT_F32);
    CHECK_OK(B->cross_entropy_fwd(e->dev, &xg, &tgd, ls, &lg));
    CHECK_OK(R->cross_entropy_fwd(e->ref, &xr, &tr, ls, &lr));
    CHECK_ERR_NZ(e, &loss, tol, "cross_entropy fwd ls %g %s", ls, base);
    ct_tensor dxg = ob_out(&dx, gt);
    CHECK_OK(B->cross_entropy_bwd(e->dev, &xg, &tgd, ls, gs, &dxg));
    CHECK_OK(R->cross_entropy_bwd(e->ref, &xr, &tr, ls, gs, &dxr));
    CHECK_ERR_NZ(e, &dx, gtol, "cross_entropy bwd ls %g scale %g %s", ls, gs, base);
    lg = ob_out(&loss, CT_F32);
    CHECK_OK(B->nll_fwd(e->dev, &xg, &tgd, &lg));
    CHECK_OK(R->nll_fwd(e->ref, &xr, &tr, &lr));
    CHECK_ERR_NZ(e, &loss, tol, "nll fwd %s", base);
    dxg = ob_out(&dx, gt);
    CHECK_OK(B->nll_bwd(e->dev, &tgd, gs, &dxg));
    CHECK_OK(R->nll_bwd(e->ref, &tr, gs, &dxr));
    CHECK_ERR_NZ(e, &dx, gtol, "nll bwd scale %g %s", gs, base);
    if (k == 0) {
      lg = ob_out(&loss, CT_F32);
      CHECK_OK(B->mse_fwd(e->dev, &xg, &tgg, &lg));
      CHECK_OK(R->mse_fwd(e->ref, &xr, &tgr, &lr));
      CHECK_ERR_NZ(e, &loss, tol, "mse fwd %s", base);
    }
    dxg = ob_out(&dx, gt);
    CHECK_OK(B->mse_bwd(e->dev, &xg, &tgg, gs, &dxg));
    CHECK_OK(R->mse_bwd(e->ref, &xr, &tgr, gs, &dxr));
    CHECK_ERR_NZ(e, &dx, gtol, "mse bwd scale %g %s", gs, base);
  }
  if (B->cross_entropy_bwd_dev && B->nll_bwd_dev) {
    /* The device-scale backwards (the resident trainer's) read the targets
     * the same way: scaler on with scale 1024, so the ref gets 1024. */
    ct_grad_scaler sc;
    ct_grad_scaler_init(&sc, 1, 1, 1024.0);
    ct_step_stats hs;
    memset(&hs, 0, sizeof hs);
    ct_scaler_to_dev(&sc, &hs.scaler);
    ct_step_stats *st = ct_device_alloc(e->dev, sizeof hs);
    CHECK_OK(ct_device_copy(e->dev, st, NULL, &hs, sizeof hs));
    CHECK_OK(ct_device_sync(e->dev));
    ct_tensor dxg = ob_out(&dx, gt);
    CHECK_OK(B->cross_entropy_bwd_dev(e->dev, &xg, &tgd, 0.1f, st, &dxg));
    CHECK_OK(R->cross_entropy_bwd(e->ref, &xr, &tr, 0.1f, 1024.f, &dxr));
    CHECK_ERR_NZ(e, &dx, gtol, "cross_entropy bwd_dev ls 0.1 scaler 1024 %s", base);
    dxg = ob_out(&dx, gt);
    CHECK_OK(B->nll_bwd_dev(e->dev, &tgd, st, &dxg));
    CHECK_OK(R->nll_bwd(e->ref, &tr, 1024.f, &dxr));
    CHECK_ERR_NZ(e, &dx, gtol, "nll bwd_dev scaler 1024 %s", base);
    ct_device_free(e->dev, st);
  }
  ct_device_free(e->dev, tdev);
  free(t), free(t32);
  ob_free(&x), ob_free(&dx), ob_free(&loss), ob_free(&tg);
}

void op_loss(op_env *e) {
  softmax_reduce(e, 5, 10);
  softmax_reduce(e, 64, 1000);
  const ct_dtype h16[2] = {CT_BF16, CT_F16};
  for (size_t i = 0; i < sizeof loss_cases / sizeof loss_cases[0]; i++) {
    const loss_case *c = &loss_cases[i];
    if (c->logits != OP_DT16) {
      losses(e, c->N, c->C, c->logits, c->grads, c->targets);
      continue;
    }
    for (int k = 0; k < 2; k++)
      if (op_tol16_of(&e->t->loss16, h16[k]) > 0)
        losses(e, c->N, c->C, h16[k], c->grads == OP_DT16 ? h16[k] : c->grads, c->targets);
  }
}
