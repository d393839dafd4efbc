/* Reference 2-D convolution (f32 and f64 from ref_conv.inc). */
#include <stdlib.h>

#include "backend/cpu/ref_ops.h"
#include "backend/cpu/ref_util.h"

/* The outputs o in [0, n_out) whose input index o * stride - pad + k * dil
 * lies in [0, n_in): [*lo, *hi). */
static void conv_valid(int64_t n_out, int64_t n_in, int stride, int pad, int dil, int64_t k, int64_t *lo, int64_t *hi) {
  const int64_t off = k * dil - pad; /* input index = o * stride + off */
  int64_t a = off >= 0 ? 0 : (-off + stride - 1) / stride;
  int64_t b = n_in - off <= 0 ? 0 : (n_in - off + stride - 1) / stride;
  if (b > n_out) b = n_out;
  *lo = a;
  *hi = b > a ? b : a;
}

#define REAL float
#define FN(name) ref_##name##_f32
#include "backend/cpu/ref_conv.inc"
#undef REAL
#undef FN
#define REAL double
#define FN(name) ref_##name##_f64
#include "backend/cpu/ref_conv.inc"
#undef REAL
#undef FN

/* The loops index with these, so a zero or mismatched one would divide by
 * zero or read out of bounds; caught here rather than trusted. */
static ct_status check_params(const char *op, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w) {
  if (x->ndim != 4 || w->ndim != 4)
    return ct_error(CT_ERR_SHAPE, "ref %s: expected 4-D input and weight (NCHW, OIHW)", op);
  if (p->groups < 1 || p->stride_h < 1 || p->stride_w < 1 || p->dil_h < 1 || p->dil_w < 1 || p->pad_h < 0 ||
      p->pad_w < 0)
    return ct_error(CT_ERR_INVALID_ARG,
                    "ref %s: groups=%d stride=(%d,%d) dilation=(%d,%d) padding=(%d,%d); groups, stride and dilation "
                    "must be >= 1 and padding >= 0",
                    op, p->groups, p->stride_h, p->stride_w, p->dil_h, p->dil_w, p->pad_h, p->pad_w);
  if (w->shape[0] % p->groups || x->shape[1] != w->shape[1] * p->groups)
    return ct_error(CT_ERR_SHAPE, "ref %s: %lld input channels, weight [%lld, %lld, ...] and groups=%d do not agree", op,
                    (long long)x->shape[1], (long long)w->shape[0], (long long)w->shape[1], p->groups);
  return CT_OK;
}

ct_status ct_ref_conv2d_fwd(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w,
                            const ct_tensor *b, ct_act act, ct_tensor *y) {
  (void)d;
  REF_CHECK("conv2d_fwd", x, w, b, y);
  CT_TRY(check_params("conv2d_fwd", p, x, w));
  REF_DISPATCH(x, ref_conv2d_fwd, p, x, w, b, act, y);
}

ct_status ct_ref_conv2d_bwd_data(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy, const ct_tensor *w,
                                 ct_tensor *dx) {
  (void)d;
  REF_CHECK("conv2d_bwd_data", dy, w, dx);
  CT_TRY(check_params("conv2d_bwd_data", p, dx, w));
  REF_DISPATCH(dy, ref_conv2d_bwd_data, p, dy, w, dx, 0.0);
}

ct_status ct_ref_conv2d_bwd_data_acc(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy,
                                     const ct_tensor *w, ct_tensor *dx) {
  (void)d;
  REF_CHECK("conv2d_bwd_data_acc", dy, w, dx);
  CT_TRY(check_params("conv2d_bwd_data_acc", p, dx, w));
  REF_DISPATCH(dy, ref_conv2d_bwd_data, p, dy, w, dx, 1.0);
}

ct_status ct_ref_conv2d_bwd_weights(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x,
                                    const ct_tensor *dy, ct_tensor *dw, ct_tensor *db, float beta) {
  (void)d;
  REF_CHECK("conv2d_bwd_weights", x, dy, dw, db);
  CT_TRY(check_params("conv2d_bwd_weights", p, x, dw));
  REF_DISPATCH(x, ref_conv2d_bwd_weights, p, x, dy, dw, db, beta);
}
