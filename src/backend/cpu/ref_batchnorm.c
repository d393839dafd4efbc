/* Reference batch norm (f32 and f64 from ref_batchnorm.inc). */
#include "backend/cpu/ref_ops.h"
#include "backend/cpu/ref_util.h"

#define REAL float
#define FN(name) ref_##name##_f32
#include "backend/cpu/ref_batchnorm.inc"
#undef REAL
#undef FN
#define REAL double
#define FN(name) ref_##name##_f64
#include "backend/cpu/ref_batchnorm.inc"
#undef REAL
#undef FN

ct_status ct_ref_batchnorm_fwd(ct_device *d, int training, const ct_tensor *x, const ct_tensor *gamma,
                               const ct_tensor *beta, ct_tensor *running_mean, ct_tensor *running_var,
                               float momentum, float eps, ct_tensor *y, ct_tensor *save_mean,
                               ct_tensor *save_invstd) {
  (void)d;
  REF_CHECK("batchnorm_fwd", x, gamma, beta, running_mean, running_var, y, save_mean, save_invstd);
  if (x->ndim < 2) return ct_error(CT_ERR_SHAPE, "ref batchnorm_fwd: input must be [N,C], [N,C,L] or [N,C,H,W]");
  int64_t per_channel = x->shape[1] ? ct_tensor_numel(x) / x->shape[1] : 0;
  if (training && per_channel < 2)
    return ct_error(CT_ERR_INVALID_ARG,
                    "ref batchnorm_fwd: expected more than 1 value per channel when training (input has %lld); use "
                    "a larger batch or eval mode",
                    (long long)per_channel);
  if (!training && (!running_mean || !running_var))
    return ct_error(CT_ERR_INVALID_ARG, "ref batchnorm_fwd: eval mode needs running_mean and running_var");
  REF_DISPATCH(x, ref_batchnorm_fwd, training, x, gamma, beta, running_mean, running_var, momentum, eps, y, save_mean,
               save_invstd);
}

ct_status ct_ref_batchnorm_bwd(ct_device *d, const ct_tensor *x, const ct_tensor *dy, const ct_tensor *gamma,
                               const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_tensor *dx,
                               ct_tensor *dgamma, ct_tensor *dbeta, float beta_acc) {
  (void)d;
  REF_CHECK("batchnorm_bwd", x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
  if (x->ndim < 2) return ct_error(CT_ERR_SHAPE, "ref batchnorm_bwd: input must be [N,C], [N,C,L] or [N,C,H,W]");
  if (!save_mean || !save_invstd)
    return ct_error(CT_ERR_INVALID_ARG, "ref batchnorm_bwd: save_mean and save_invstd from the training forward are required");
  REF_DISPATCH(x, ref_batchnorm_bwd, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, beta_acc);
}

static ct_status ref_apply(const ct_tensor *x, const ct_tensor *gamma, const ct_tensor *beta, const ct_tensor *save_mean,
                           const ct_tensor *save_invstd, ct_tensor *y) {
  REF_DISPATCH(x, ref_batchnorm_apply, x, gamma, beta, save_mean, save_invstd, y);
}

ct_status ct_ref_batchnorm_apply(ct_device *d, const ct_tensor *x, const ct_tensor *gamma, const ct_tensor *beta,
                                 const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_act act, float alpha,
                                 ct_tensor *y) {
  REF_CHECK("batchnorm_apply", x, gamma, beta, save_mean, save_invstd, y);
  if (x->ndim < 2) return ct_error(CT_ERR_SHAPE, "ref batchnorm_apply: input must be [N,C], [N,C,L] or [N,C,H,W]");
  if (!save_mean || !save_invstd)
    return ct_error(CT_ERR_INVALID_ARG, "ref batchnorm_apply: save_mean and save_invstd from the training forward are required");
  CT_TRY(ref_apply(x, gamma, beta, save_mean, save_invstd, y));
  return act == CT_ACT_NONE ? CT_OK : ct_ref_act_fwd(d, act, alpha, y, y);
}

ct_status ct_ref_batchnorm_sync_stats(ct_device *d, int stage, double n, float momentum, float eps, ct_tensor *mean,
                                      ct_tensor *invstd, ct_tensor *running_mean, ct_tensor *running_var,
                                      double *v) {
  (void)d;
  CT_TRY(ct_bn_sync_stats_args("ref", mean, invstd, running_mean, running_var));
  const int64_t C = ct_tensor_numel(mean);
  float *m = mean->data, *is = invstd->data;
  float *rm = running_mean ? running_mean->data : NULL, *rv = running_var ? running_var->data : NULL;
  const double N = stage ? v[C] : 0;
  for (int64_t c = 0; c < C; c++) {
    if (stage == 0) {
      v[c] = n * m[c];
    } else if (stage == 1) {
      double var = 1.0 / ((double)is[c] * is[c]) - eps, dev = m[c] - v[c] / N;
      v[C + 1 + c] = v[c] / N;
      v[c] = n * ((var > 0 ? var : 0) + dev * dev);
    } else {
      double M = v[C + 1 + c], V = v[c] / N;
      m[c] = (float)M;
      is[c] = (float)(1.0 / sqrt(V + eps));
      if (rm) rm[c] = (float)((1 - (double)momentum) * rm[c] + momentum * M);
      if (rv) rv[c] = (float)((1 - (double)momentum) * rv[c] + momentum * V * (N > 1 ? N / (N - 1) : 1));
    }
  }
  if (stage == 0) v[C] = n;
  return CT_OK;
}

ct_status ct_ref_batchnorm_sync_grads(ct_device *d, int stage, double n, const ct_tensor *gamma,
                                      const ct_tensor *invstd, const ct_tensor *dgamma, const ct_tensor *dbeta,
                                      ct_tensor *a, ct_tensor *b, double *v) {
  (void)d;
  CT_TRY(ct_bn_sync_grads_args("ref", stage, gamma, invstd, dgamma, dbeta, a, b));
  const int64_t C = ct_tensor_numel(invstd);
  const float *g = gamma ? gamma->data : NULL, *is = invstd->data, *dg = dgamma->data, *db = dbeta->data;
  const double w = n > 0 ? 1.0 : 0.0, N = stage ? v[2 * C] : 0;
  for (int64_t c = 0; c < C; c++) {
    if (stage == 0) {
      v[c] = w * db[c], v[C + c] = w * dg[c];
    } else {
      double k = (g ? g[c] : 1.0) * is[c];
      ((float *)a->data)[c] = (float)(k * (db[c] / n - v[c] / N));
      ((float *)b->data)[c] = (float)(k * (dg[c] / n - v[C + c] / N));
    }
  }
  if (stage == 0) v[2 * C] = n;
  return CT_OK;
}
