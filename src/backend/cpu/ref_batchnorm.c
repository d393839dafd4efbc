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
