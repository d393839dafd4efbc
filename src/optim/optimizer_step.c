/* The CPU update passes: one OpenMP parallel-for-simd loop over all n
 * elements per step, running the per-element functions of fused_step.h —
 * the same source the CUDA kernels compile, so the two devices cannot
 * drift. Each line there mirrors one PyTorch 1.13 tensor op of
 * _single_tensor_sgd / _single_tensor_adam(w), with the same f32 rounding
 * points (PyTorch's CPU `add(x, y, alpha)` is a fused multiply-add, hence
 * the explicit fmaf); scalars PyTorch computes in Python (bias
 * corrections, step size) are computed in double by ct_optim_fused_args
 * and rounded to f32 where PyTorch passes them to a kernel. */
#include "math/fused_step.h"
#include "optim/optimizer_device.h"
#include "optim/optimizer_impl.h"

/* Below this size thread start-up costs more than the pass itself. */
#define CT_OPTIM_PAR_MIN 32768

/* The loops are written once per variant with the variant's flags known
 * at compile time: a conditional load from the amsgrad buffer left inside
 * one loop kept gcc from vectorising it (scalar sqrt and two divisions per
 * element, several times slower). */

/* The element functions with the variant's flags fixed: a local copy the
 * compiler sees whole, so the untaken branch disappears from the loop. */
static inline void sgd_elem(const ct_fused_optim_args *a0, int momentum, float *p, float g, float *buf) {
  ct_fused_optim_args a = *a0;
  a.momentum_on = momentum;
  ct_fused_sgd_elem(&a, p, g, buf);
}

static inline void adam_elem(const ct_fused_optim_args *a0, int amsgrad, float *p, float g, float *m, float *v,
                             float *vmax) {
  ct_fused_optim_args a = *a0;
  a.amsgrad = amsgrad;
  ct_fused_adam_elem(&a, p, g, m, v, vmax);
}

void ct_optim_sgd_pass(struct ct_optimizer *o, float *params, const float *grads) {
  ct_fused_optim_args a;
  ct_optim_fused_args(o, 0.0, &a);
  const long long n = (long long)o->n;
  float *restrict p = params;
  const float *restrict gr = grads;
  float *restrict buf = o->momentum_buffer;
  if (!a.momentum_on) {
#pragma omp parallel for simd schedule(static) if (n >= CT_OPTIM_PAR_MIN)
    for (long long i = 0; i < n; i++) sgd_elem(&a, 0, &p[i], gr[i], NULL);
    return;
  }
#pragma omp parallel for simd schedule(static) if (n >= CT_OPTIM_PAR_MIN)
  for (long long i = 0; i < n; i++) sgd_elem(&a, 1, &p[i], gr[i], &buf[i]);
}

void ct_optim_adam_pass(struct ct_optimizer *o, float *params, const float *grads) {
  ct_fused_optim_args a;
  ct_optim_fused_args(o, 0.0, &a);
  const long long n = (long long)o->n;
  float *restrict p = params;
  const float *restrict gr = grads;
  float *restrict m = o->exp_avg;
  float *restrict v = o->exp_avg_sq;
  float *restrict vmax = o->max_exp_avg_sq;
  if (a.amsgrad) {
#pragma omp parallel for simd schedule(static) if (n >= CT_OPTIM_PAR_MIN)
    for (long long i = 0; i < n; i++) adam_elem(&a, 1, &p[i], gr[i], &m[i], &v[i], &vmax[i]);
  } else {
#pragma omp parallel for simd schedule(static) if (n >= CT_OPTIM_PAR_MIN)
    for (long long i = 0; i < n; i++) adam_elem(&a, 0, &p[i], gr[i], &m[i], &v[i], NULL);
  }
}
