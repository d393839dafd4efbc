/* The fused update passes: one OpenMP parallel-for-simd loop over all n
 * elements per step. Each line mirrors one PyTorch 1.13 tensor op of
 * _single_tensor_sgd / _single_tensor_adam(w), with the same f32 rounding
 * points: PyTorch's CPU `add(x, y, alpha)` is a fused multiply-add
 * (vec::fmadd), hence the explicit fmaf; a separate `mul_` rounds on its
 * own. That keeps momentum buffers, which accumulate every rounding
 * difference, within an ulp or two of torch.optim. Scalars that
 * PyTorch computes in Python (bias corrections, step size) are computed in
 * double here and rounded to f32 where PyTorch passes them to a kernel. */
#include <math.h>

#include "optim/optimizer_impl.h"

/* Below this size thread start-up costs more than the pass itself. */
#define CT_OPTIM_PAR_MIN 32768

void ct_optim_sgd_pass(struct ct_optimizer *o, float *params, const float *grads) {
  const ct_optim_config *c = &o->cfg;
  const long long n = (long long)o->n;
  const float wd = (float)c->weight_decay;
  const float mom = (float)c->momentum;
  const float damp1 = (float)(1.0 - c->dampening);
  const float neg_lr = (float)(-c->lr);
  float *restrict p = params;
  const float *restrict gr = grads;
  float *restrict buf = o->momentum_buffer;

  if (c->momentum == 0) {
#pragma omp parallel for simd schedule(static) if (n >= CT_OPTIM_PAR_MIN)
    for (long long i = 0; i < n; i++) {
      float d = wd != 0 ? fmaf(p[i], wd, gr[i]) : gr[i];
      p[i] = fmaf(d, neg_lr, p[i]);
    }
    return;
  }
  /* PyTorch's first momentum step clones d_p into the buffer: no decay of
   * the (zero) buffer and no dampening. */
  const int first = !o->momentum_buffer_ready;
  const int nesterov = c->nesterov;
#pragma omp parallel for simd schedule(static) if (n >= CT_OPTIM_PAR_MIN)
  for (long long i = 0; i < n; i++) {
    float d = wd != 0 ? fmaf(p[i], wd, gr[i]) : gr[i];
    float decayed = buf[i] * mom; /* buf.mul_(momentum) rounds on its own */
    float b = first ? d : fmaf(d, damp1, decayed);
    buf[i] = b;
    float u = nesterov ? fmaf(b, mom, d) : b;
    p[i] = fmaf(u, neg_lr, p[i]);
  }
}

/* One Adam(W) element. Inlined into two loops, with and without amsgrad:
 * a conditional load from the max buffer inside one loop kept gcc from
 * vectorising it (scalar sqrt and two divisions per element, 99 ms per
 * step for AlexNet's 61M parameters instead of the ~35 ms its memory
 * traffic needs). vsqrtps/vdivps round exactly like the scalar forms, so
 * the results are bit-identical either way. */
typedef struct adam_consts {
  float neg_step_size, bc2_sqrt, b1, omb1, b2, omb2, eps, l2, decay;
  int apply_decay;
} adam_consts;

static inline __attribute__((always_inline)) float adam_elem(const adam_consts *k, float pi, float g, float *m, float *v,
                                                             float *vmax) {
  if (k->l2 != 0) g = fmaf(pi, k->l2, g);
  if (k->apply_decay) pi = pi * k->decay;
  float m_decayed = *m * k->b1, v_decayed = *v * k->b2;
  float mi = fmaf(g, k->omb1, m_decayed);
  /* addcmul's vector path contracts to an FMA in torch's AVX2 build;
   * this form matched torch.optim.Adam best on random data. */
  float vi = fmaf(k->omb2 * g, g, v_decayed);
  *m = mi;
  *v = vi;
  float vd = vi;
  if (vmax) {
    vd = *vmax > vi ? *vmax : vi;
    *vmax = vd;
  }
  float denom = sqrtf(vd) / k->bc2_sqrt + k->eps;
  return pi + k->neg_step_size * (mi / denom);
}

void ct_optim_adam_pass(struct ct_optimizer *o, float *params, const float *grads) {
  const ct_optim_config *c = &o->cfg;
  const long long n = (long long)o->n;
  const double step = (double)o->steps;
  const double bc1 = 1.0 - pow(c->beta1, step);
  const double bc2 = 1.0 - pow(c->beta2, step);
  const int decoupled = c->kind == CT_OPTIM_ADAMW;
  const adam_consts k = {
      .neg_step_size = (float)(-(c->lr / bc1)),
      .bc2_sqrt = (float)sqrt(bc2),
      .b1 = (float)c->beta1,
      .omb1 = (float)(1.0 - c->beta1),
      .b2 = (float)c->beta2,
      .omb2 = (float)(1.0 - c->beta2),
      .eps = (float)c->eps,
      /* Adam: L2 term added to the gradient; AdamW: param *= 1 - lr*wd first. */
      .l2 = decoupled ? 0.0f : (float)c->weight_decay,
      .decay = decoupled ? (float)(1.0 - c->lr * c->weight_decay) : 1.0f,
      .apply_decay = decoupled && c->weight_decay != 0,
  };
  float *restrict p = params;
  const float *restrict gr = grads;
  float *restrict m = o->exp_avg;
  float *restrict v = o->exp_avg_sq;
  float *restrict vmax = o->max_exp_avg_sq;

  if (c->amsgrad && vmax) {
#pragma omp parallel for simd schedule(static) if (n >= CT_OPTIM_PAR_MIN)
    for (long long i = 0; i < n; i++) p[i] = adam_elem(&k, p[i], gr[i], &m[i], &v[i], &vmax[i]);
  } else {
#pragma omp parallel for simd schedule(static) if (n >= CT_OPTIM_PAR_MIN)
    for (long long i = 0; i < n; i++) p[i] = adam_elem(&k, p[i], gr[i], &m[i], &v[i], NULL);
  }
}
