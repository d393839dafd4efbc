/* The reference backend's ops, one C function per entry of struct
 * ct_backend (see backend/backend.h for each op's contract). Internal: the
 * rest of ctrain reaches them through ct_ref_backend() or through
 * ct_backend_fill_defaults(). Each accepts CT_F32 and CT_F64 tensors (all
 * float tensors of one call share a dtype; targets are CT_I64) and returns
 * CT_ERR_UNSUPPORTED for any other dtype. */
#ifndef CTRAIN_REF_OPS_H
#define CTRAIN_REF_OPS_H

#include "backend/backend.h"

/* PyTorch's pooling output size for one spatial dim:
 * floor_or_ceil((in + 2*pad - dil*(k-1) - 1) / stride) + 1, and with
 * ceil_mode the last window is dropped when it would start at or beyond
 * in + pad (it must start inside the input or the left padding). Returns
 * <= 0 when the window does not fit. */
int64_t ct_ref_pool_out_size(int64_t in, int k, int stride, int pad, int dil, int ceil_mode);

ct_status ct_ref_matmul(ct_device *d, int trans_a, int trans_b, const ct_tensor *a, const ct_tensor *b, float alpha,
                        float beta, ct_tensor *c);
ct_status ct_ref_linear_fwd(ct_device *d, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, ct_act act,
                            ct_tensor *y);
ct_status ct_ref_linear_bwd_data(ct_device *d, const ct_tensor *dy, const ct_tensor *w, ct_tensor *dx);
ct_status ct_ref_linear_bwd_weights(ct_device *d, const ct_tensor *x, const ct_tensor *dy, ct_tensor *dw,
                                    ct_tensor *db, float beta);

ct_status ct_ref_conv2d_fwd(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w,
                            const ct_tensor *b, ct_act act, ct_tensor *y);
ct_status ct_ref_conv2d_bwd_data(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy, const ct_tensor *w,
                                 ct_tensor *dx);
ct_status ct_ref_conv2d_bwd_data_acc(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy,
                                     const ct_tensor *w, ct_tensor *dx);
ct_status ct_ref_conv2d_bwd_weights(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x,
                                    const ct_tensor *dy, ct_tensor *dw, ct_tensor *db, float beta);

size_t ct_ref_maxpool2d_workspace_bytes(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x,
                                        const ct_tensor *y);
ct_status ct_ref_maxpool2d_fwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y, void *ws);
ct_status ct_ref_maxpool2d_bwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *dy, const void *ws,
                               ct_tensor *dx);
ct_status ct_ref_avgpool2d_fwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y);
ct_status ct_ref_avgpool2d_bwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *dy, ct_tensor *dx);
ct_status ct_ref_adaptive_avgpool2d_fwd(ct_device *d, const ct_tensor *x, ct_tensor *y);
ct_status ct_ref_adaptive_avgpool2d_bwd(ct_device *d, const ct_tensor *dy, ct_tensor *dx);
ct_status ct_ref_adaptive_maxpool2d_fwd(ct_device *d, const ct_tensor *x, ct_tensor *y, int32_t *idx);
ct_status ct_ref_adaptive_maxpool2d_bwd(ct_device *d, const ct_tensor *dy, const int32_t *idx, ct_tensor *dx);

ct_status ct_ref_batchnorm_fwd(ct_device *d, int training, const ct_tensor *x, const ct_tensor *gamma,
                               const ct_tensor *beta, ct_tensor *running_mean, ct_tensor *running_var,
                               float momentum, float eps, ct_tensor *y, ct_tensor *save_mean,
                               ct_tensor *save_invstd);
ct_status ct_ref_batchnorm_bwd(ct_device *d, const ct_tensor *x, const ct_tensor *dy, const ct_tensor *gamma,
                               const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_tensor *dx,
                               ct_tensor *dgamma, ct_tensor *dbeta, float beta_acc);
ct_status ct_ref_batchnorm_apply(ct_device *d, const ct_tensor *x, const ct_tensor *gamma, const ct_tensor *beta,
                                 const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_act act, float alpha,
                                 ct_tensor *y);

ct_status ct_ref_act_fwd(ct_device *d, ct_act act, float alpha, const ct_tensor *x, ct_tensor *y);
ct_status ct_ref_act_bwd(ct_device *d, ct_act act, float alpha, const ct_tensor *x, const ct_tensor *y,
                         const ct_tensor *dy, ct_tensor *dx);
ct_status ct_ref_dropout_fwd(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *x,
                             ct_tensor *y);
ct_status ct_ref_dropout_bwd(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *dy,
                             ct_tensor *dx);
ct_status ct_ref_add(ct_device *d, const ct_tensor *a, const ct_tensor *b, ct_act act, ct_tensor *y);
ct_status ct_ref_axpby(ct_device *d, float alpha, const ct_tensor *x, float beta, ct_tensor *y);
ct_status ct_ref_fill(ct_device *d, ct_tensor *x, float value);
ct_status ct_ref_cast(ct_device *d, const ct_tensor *x, ct_tensor *y);

ct_status ct_ref_softmax_fwd(ct_device *d, int log, const ct_tensor *x, ct_tensor *y);
ct_status ct_ref_softmax_bwd(ct_device *d, int log, const ct_tensor *y, const ct_tensor *dy, ct_tensor *dx);

ct_status ct_ref_cross_entropy_fwd(ct_device *d, const ct_tensor *logits, const ct_tensor *targets,
                                   float label_smoothing, ct_tensor *loss);
ct_status ct_ref_cross_entropy_bwd(ct_device *d, const ct_tensor *logits, const ct_tensor *targets,
                                   float label_smoothing, float grad_scale, ct_tensor *dlogits);
ct_status ct_ref_nll_fwd(ct_device *d, const ct_tensor *logp, const ct_tensor *targets, ct_tensor *loss);
ct_status ct_ref_nll_bwd(ct_device *d, const ct_tensor *targets, float grad_scale, ct_tensor *dlogp);
ct_status ct_ref_mse_fwd(ct_device *d, const ct_tensor *pred, const ct_tensor *target, ct_tensor *loss);
ct_status ct_ref_mse_bwd(ct_device *d, const ct_tensor *pred, const ct_tensor *target, float grad_scale,
                         ct_tensor *dpred);

ct_status ct_ref_sumsq(ct_device *d, const ct_tensor *x, double *out);
ct_status ct_ref_nonfinite(ct_device *d, const ct_tensor *x, int *out);

/* bf16/f16 through f32 temporaries (ref_half.c): the same signatures as the
 * ops above; calls without 16-bit tensors go straight to them. */
ct_status ct_ref_half_matmul(ct_device *d, int trans_a, int trans_b, const ct_tensor *a, const ct_tensor *b, float alpha,
                        float beta, ct_tensor *c);
ct_status ct_ref_half_linear_fwd(ct_device *d, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, ct_act act,
                            ct_tensor *y);
ct_status ct_ref_half_linear_bwd_data(ct_device *d, const ct_tensor *dy, const ct_tensor *w, ct_tensor *dx);
ct_status ct_ref_half_linear_bwd_weights(ct_device *d, const ct_tensor *x, const ct_tensor *dy, ct_tensor *dw,
                                    ct_tensor *db, float beta);
ct_status ct_ref_half_conv2d_fwd(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w,
                            const ct_tensor *b, ct_act act, ct_tensor *y);
ct_status ct_ref_half_conv2d_bwd_data(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy, const ct_tensor *w,
                                 ct_tensor *dx);
ct_status ct_ref_half_conv2d_bwd_data_acc(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy,
                                          const ct_tensor *w, ct_tensor *dx);
ct_status ct_ref_half_conv2d_bwd_weights(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x,
                                    const ct_tensor *dy, ct_tensor *dw, ct_tensor *db, float beta);
size_t ct_ref_half_maxpool2d_workspace_bytes(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x,
                                             const ct_tensor *y);
ct_status ct_ref_half_maxpool2d_fwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y, void *ws);
ct_status ct_ref_half_maxpool2d_bwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *dy, const void *ws,
                               ct_tensor *dx);
ct_status ct_ref_half_avgpool2d_fwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y);
ct_status ct_ref_half_avgpool2d_bwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *dy, ct_tensor *dx);
ct_status ct_ref_half_adaptive_avgpool2d_fwd(ct_device *d, const ct_tensor *x, ct_tensor *y);
ct_status ct_ref_half_adaptive_avgpool2d_bwd(ct_device *d, const ct_tensor *dy, ct_tensor *dx);
ct_status ct_ref_half_adaptive_maxpool2d_fwd(ct_device *d, const ct_tensor *x, ct_tensor *y, int32_t *idx);
ct_status ct_ref_half_adaptive_maxpool2d_bwd(ct_device *d, const ct_tensor *dy, const int32_t *idx, ct_tensor *dx);
ct_status ct_ref_half_batchnorm_fwd(ct_device *d, int training, const ct_tensor *x, const ct_tensor *gamma,
                               const ct_tensor *beta, ct_tensor *running_mean, ct_tensor *running_var,
                               float momentum, float eps, ct_tensor *y, ct_tensor *save_mean,
                               ct_tensor *save_invstd);
ct_status ct_ref_half_batchnorm_bwd(ct_device *d, const ct_tensor *x, const ct_tensor *dy, const ct_tensor *gamma,
                               const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_tensor *dx,
                               ct_tensor *dgamma, ct_tensor *dbeta, float beta_acc);
ct_status ct_ref_half_batchnorm_apply(ct_device *d, const ct_tensor *x, const ct_tensor *gamma, const ct_tensor *beta,
                                      const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_act act,
                                      float alpha, ct_tensor *y);
ct_status ct_ref_half_act_fwd(ct_device *d, ct_act act, float alpha, const ct_tensor *x, ct_tensor *y);
ct_status ct_ref_half_act_bwd(ct_device *d, ct_act act, float alpha, const ct_tensor *x, const ct_tensor *y,
                         const ct_tensor *dy, ct_tensor *dx);
ct_status ct_ref_half_dropout_fwd(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *x,
                             ct_tensor *y);
ct_status ct_ref_half_dropout_bwd(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *dy,
                             ct_tensor *dx);
ct_status ct_ref_half_add(ct_device *d, const ct_tensor *a, const ct_tensor *b, ct_act act, ct_tensor *y);
ct_status ct_ref_half_axpby(ct_device *d, float alpha, const ct_tensor *x, float beta, ct_tensor *y);
ct_status ct_ref_half_softmax_fwd(ct_device *d, int log, const ct_tensor *x, ct_tensor *y);
ct_status ct_ref_half_softmax_bwd(ct_device *d, int log, const ct_tensor *y, const ct_tensor *dy, ct_tensor *dx);

#endif
