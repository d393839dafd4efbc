/* Reference activations, dropout, add/axpby/fill/cast and softmax (f32 and
 * f64 from ref_elementwise.inc; fill and cast take any dtype). */
#include <string.h>

#include "backend/cpu/ref_ops.h"
#include "backend/cpu/ref_util.h"
#include "ctrain/rng.h"

#define REAL float
#define FN(name) ref_##name##_f32
#include "backend/cpu/ref_elementwise.inc"
#undef REAL
#undef FN
#define REAL double
#define FN(name) ref_##name##_f64
#include "backend/cpu/ref_elementwise.inc"
#undef REAL
#undef FN

static ct_status same_numel(const char *op, const ct_tensor *a, const ct_tensor *b) {
  if (a && b && ct_tensor_numel(a) != ct_tensor_numel(b))
    return ct_error(CT_ERR_SHAPE, "ref %s: tensors have %lld and %lld elements, expected equal", op,
                    (long long)ct_tensor_numel(a), (long long)ct_tensor_numel(b));
  return CT_OK;
}

ct_status ct_ref_act_fwd(ct_device *d, ct_act act, float alpha, const ct_tensor *x, ct_tensor *y) {
  (void)d;
  REF_CHECK("act_fwd", x, y);
  CT_TRY(same_numel("act_fwd", x, y));
  if ((unsigned)act >= CT_ACT_COUNT) return ct_error(CT_ERR_INVALID_ARG, "ref act_fwd: unknown activation %d", (int)act);
  REF_DISPATCH(x, ref_act_fwd, act, alpha, x, y);
}

ct_status ct_ref_act_bwd(ct_device *d, ct_act act, float alpha, const ct_tensor *x, const ct_tensor *y,
                         const ct_tensor *dy, ct_tensor *dx) {
  (void)d;
  REF_CHECK("act_bwd", dy, x, y, dx);
  CT_TRY(same_numel("act_bwd", dy, dx));
  if ((unsigned)act >= CT_ACT_COUNT) return ct_error(CT_ERR_INVALID_ARG, "ref act_bwd: unknown activation %d", (int)act);
  if (CT_ACT_BWD_NEEDS_X(act) && !x)
    return ct_error(CT_ERR_INVALID_ARG, "ref act_bwd: activation %d needs the input x, got NULL", (int)act);
  if (CT_ACT_BWD_NEEDS_Y(act) && !y)
    return ct_error(CT_ERR_INVALID_ARG, "ref act_bwd: activation %d needs the output y, got NULL", (int)act);
  CT_TRY(same_numel("act_bwd", dy, x));
  CT_TRY(same_numel("act_bwd", dy, y));
  REF_DISPATCH(dy, ref_act_bwd, act, alpha, x, y, dy, dx);
}

static ct_status check_dropout(const char *op, float p, int64_t group) {
  if (!(p >= 0 && p <= 1)) return ct_error(CT_ERR_INVALID_ARG, "ref %s: p = %g, expected 0 <= p <= 1", op, (double)p);
  if (group < 1) return ct_error(CT_ERR_INVALID_ARG, "ref %s: group = %lld, expected >= 1", op, (long long)group);
  return CT_OK;
}

ct_status ct_ref_dropout_fwd(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *x,
                             ct_tensor *y) {
  (void)d;
  REF_CHECK("dropout_fwd", x, y);
  CT_TRY(same_numel("dropout_fwd", x, y));
  CT_TRY(check_dropout("dropout_fwd", p, group));
  REF_DISPATCH(x, ref_dropout_apply, p, group, key, x, y);
}

ct_status ct_ref_dropout_bwd(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *dy,
                             ct_tensor *dx) {
  (void)d;
  REF_CHECK("dropout_bwd", dy, dx);
  CT_TRY(same_numel("dropout_bwd", dy, dx));
  CT_TRY(check_dropout("dropout_bwd", p, group));
  REF_DISPATCH(dy, ref_dropout_apply, p, group, key, dy, dx);
}

ct_status ct_ref_add(ct_device *d, const ct_tensor *a, const ct_tensor *b, ct_act act, ct_tensor *y) {
  (void)d;
  REF_CHECK("add", a, b, y);
  CT_TRY(same_numel("add", a, y));
  CT_TRY(same_numel("add", b, y));
  if ((unsigned)act >= CT_ACT_COUNT) return ct_error(CT_ERR_INVALID_ARG, "ref add: unknown activation %d", (int)act);
  REF_DISPATCH(a, ref_add, a, b, act, y);
}

ct_status ct_ref_axpby(ct_device *d, float alpha, const ct_tensor *x, float beta, ct_tensor *y) {
  (void)d;
  REF_CHECK("axpby", x, y);
  CT_TRY(same_numel("axpby", x, y));
  REF_DISPATCH(x, ref_axpby, alpha, x, beta, y);
}

ct_status ct_ref_fill(ct_device *d, ct_tensor *x, float value) {
  (void)d;
  size_t es = ct_dtype_size(x->dtype);
  if (!es) return ct_error(CT_ERR_INVALID_ARG, "ref fill: invalid dtype %d", (int)x->dtype);
  unsigned char one[16];
  ct_convert(&value, CT_F32, one, x->dtype, 1);
  const int64_t n = ct_tensor_numel(x);
  unsigned char *p = x->data;
  for (int64_t i = 0; i < n; i++) memcpy(p + (size_t)i * es, one, es);
  return CT_OK;
}

ct_status ct_ref_cast(ct_device *d, const ct_tensor *x, ct_tensor *y) {
  (void)d;
  CT_TRY(same_numel("cast", x, y));
  if (x->layout != y->layout)
    return ct_error(CT_ERR_UNSUPPORTED, "ref cast: layout %d into %d; the reference keeps the layout", (int)x->layout,
                    (int)y->layout);
  if (!ct_dtype_size(x->dtype) || !ct_dtype_size(y->dtype))
    return ct_error(CT_ERR_INVALID_ARG, "ref cast: invalid dtype (%d -> %d)", (int)x->dtype, (int)y->dtype);
  ct_convert(x->data, x->dtype, y->data, y->dtype, (size_t)ct_tensor_numel(x));
  return CT_OK;
}

ct_status ct_ref_softmax_fwd(ct_device *d, int log, const ct_tensor *x, ct_tensor *y) {
  (void)d;
  REF_CHECK("softmax_fwd", x, y);
  CT_TRY(same_numel("softmax_fwd", x, y));
  if (x->ndim < 1) return ct_error(CT_ERR_SHAPE, "ref softmax_fwd: input must be at least 1-D");
  REF_DISPATCH(x, ref_softmax_fwd, log, x, y);
}

ct_status ct_ref_softmax_bwd(ct_device *d, int log, const ct_tensor *y, const ct_tensor *dy, ct_tensor *dx) {
  (void)d;
  REF_CHECK("softmax_bwd", y, dy, dx);
  CT_TRY(same_numel("softmax_bwd", y, dy));
  CT_TRY(same_numel("softmax_bwd", y, dx));
  if (y->ndim < 1) return ct_error(CT_ERR_SHAPE, "ref softmax_bwd: input must be at least 1-D");
  REF_DISPATCH(y, ref_softmax_bwd, log, y, dy, dx);
}
