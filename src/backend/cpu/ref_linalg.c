/* Reference matmul and linear layer (f32 and f64 from ref_linalg.inc). */
#include <stdlib.h>

#include "backend/cpu/ref_ops.h"
#include "backend/cpu/ref_util.h"

#define REAL float
#define FN(name) ref_##name##_f32
#include "backend/cpu/ref_linalg.inc"
#undef REAL
#undef FN
#define REAL double
#define FN(name) ref_##name##_f64
#include "backend/cpu/ref_linalg.inc"
#undef REAL
#undef FN

ct_status ct_ref_matmul(ct_device *d, int trans_a, int trans_b, const ct_tensor *a, const ct_tensor *b, float alpha,
                        float beta, ct_tensor *c) {
  (void)d;
  REF_CHECK("matmul", a, b, c);
  int64_t K = trans_a ? a->shape[0] : a->shape[1];
  int64_t Kb = trans_b ? b->shape[1] : b->shape[0];
  if (a->ndim != 2 || b->ndim != 2 || c->ndim != 2 || K != Kb)
    return ct_error(CT_ERR_SHAPE, "ref matmul: inner dimensions differ (op(a) has K=%lld, op(b) has K=%lld)",
                    (long long)K, (long long)Kb);
  REF_DISPATCH(a, ref_matmul, trans_a, trans_b, a, b, alpha, beta, c);
}

ct_status ct_ref_linear_fwd(ct_device *d, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, ct_act act,
                            ct_tensor *y) {
  (void)d;
  REF_CHECK("linear_fwd", x, w, b, y);
  REF_DISPATCH(x, ref_linear_fwd, x, w, b, act, y);
}

ct_status ct_ref_linear_bwd_data(ct_device *d, const ct_tensor *dy, const ct_tensor *w, ct_tensor *dx) {
  (void)d;
  REF_CHECK("linear_bwd_data", dy, w, dx);
  REF_DISPATCH(dy, ref_linear_bwd_data, dy, w, dx);
}

ct_status ct_ref_linear_bwd_weights(ct_device *d, const ct_tensor *x, const ct_tensor *dy, ct_tensor *dw,
                                    ct_tensor *db, float beta) {
  (void)d;
  REF_CHECK("linear_bwd_weights", x, dy, dw, db);
  REF_DISPATCH(x, ref_linear_bwd_weights, x, dy, dw, db, beta);
}
