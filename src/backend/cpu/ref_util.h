/* Shared helpers of the reference kernels: dtype dispatch, dtype checks,
 * activation math and scalar loss output. Internal to src/backend/cpu/ref_*.
 *
 * Every reference kernel exists twice, for float and double storage, made
 * from one `ref_*.inc` template included with REAL/FN defined. Arithmetic
 * inside the kernels accumulates in double for both, so the f32 kernels are
 * the f64 kernels with rounded storage: that keeps the reference a
 * reference (the fast backends are compared with it at ~1e-5). */
#ifndef CTRAIN_REF_UTIL_H
#define CTRAIN_REF_UTIL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "ctrain/dtype.h"
#include "ctrain/status.h"
#include "ctrain/tensor.h"

/* Fused activations of linear_fwd/conv2d_fwd have no alpha argument; they
 * use PyTorch's default negative slope. */
#define CT_REF_FUSED_LEAKY_ALPHA ((double)0.01f) /* = act_fwd(alpha = 0.01f) */

/* Checks that x is CT_F32 or CT_F64 and that every non-NULL tensor in
 * others[0..n) has x's dtype. Returns CT_ERR_UNSUPPORTED / CT_ERR_INVALID_ARG
 * with a message naming op and the offending tensor position otherwise. */
ct_status ct_ref_check_dtypes(const char *op, const ct_tensor *x, const ct_tensor *const *others, size_t n);

/* Writes a scalar into a 1-element floating tensor of any float dtype. */
ct_status ct_ref_store_scalar(const char *op, ct_tensor *t, double v);

/* Checks targets are CT_I64 with n entries, each in [0, c). The message
 * names op and the first bad index and value. */
ct_status ct_ref_check_targets(const char *op, const ct_tensor *targets, int64_t n, int64_t c);

/* Checks x and every non-NULL tensor in others[] share x's float dtype. */
#define REF_CHECK(op, x, ...)                                                                   \
  CT_TRY(ct_ref_check_dtypes(op, x, (const ct_tensor *const[]){__VA_ARGS__},                   \
                             sizeof((const ct_tensor *const[]){__VA_ARGS__}) / sizeof(const ct_tensor *)))

/* Calls fn_f32 or fn_f64 by t's dtype (already validated by REF_CHECK). */
#define REF_DISPATCH(t, fn, ...)                            \
  return (t)->dtype == CT_F64 ? fn##_f64(__VA_ARGS__) : fn##_f32(__VA_ARGS__)

/* Activation value, double in and out. */
static inline double ct_ref_act(ct_act a, double alpha, double x) {
  switch (a) {
    case CT_ACT_RELU: return x < 0 ? 0.0 : x; /* NaN propagates as in torch.relu */
    case CT_ACT_LEAKY_RELU: return x > 0 ? x : alpha * x;
    case CT_ACT_GELU: return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
    case CT_ACT_SILU: return x / (1.0 + exp(-x));
    case CT_ACT_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case CT_ACT_TANH: return tanh(x);
    default: return x;
  }
}

/* d act / d x from x or y (whichever CT_ACT_BWD_NEEDS_* names). */
static inline double ct_ref_act_grad(ct_act a, double alpha, double x, double y) {
  switch (a) {
    case CT_ACT_RELU: return y <= 0 ? 0.0 : 1.0; /* torch's threshold_backward: a NaN y passes dy */
    case CT_ACT_LEAKY_RELU: return x > 0 ? 1.0 : alpha;
    case CT_ACT_GELU: {
      double cdf = 0.5 * (1.0 + erf(x * 0.70710678118654752440));
      double pdf = exp(-0.5 * x * x) * 0.39894228040143267794; /* 1/sqrt(2 pi) */
      return cdf + x * pdf;
    }
    case CT_ACT_SILU: {
      double s = 1.0 / (1.0 + exp(-x));
      return s * (1.0 + x * (1.0 - s));
    }
    case CT_ACT_SIGMOID: return y * (1.0 - y);
    case CT_ACT_TANH: return 1.0 - y * y;
    default: return 1.0;
  }
}

static inline int64_t ct_ref_imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t ct_ref_imax(int64_t a, int64_t b) { return a > b ? a : b; }

/* PyTorch's adaptive pooling bins: [floor(i*n/out), ceil((i+1)*n/out)). */
static inline int64_t ct_ref_bin_start(int64_t i, int64_t n, int64_t out) { return (i * n) / out; }
static inline int64_t ct_ref_bin_end(int64_t i, int64_t n, int64_t out) { return ((i + 1) * n + out - 1) / out; }

#endif
