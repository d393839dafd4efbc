/* Global gradient-norm clipping over one flat gradient buffer. */
#include <math.h>

#include "ctrain/optim.h"

#define CT_CLIP_PAR_MIN 32768

double ct_grad_sumsq(const float *grads, size_t n) {
  const long long len = (long long)n;
  double acc = 0;
  /* float64 accumulation: an f32 sum of millions of squares loses digits
   * that decide whether clipping triggers. */
#pragma omp parallel for simd reduction(+ : acc) schedule(static) if (len >= CT_CLIP_PAR_MIN)
  for (long long i = 0; i < len; i++) {
    double g = grads[i];
    acc += g * g;
  }
  return acc;
}

double ct_grad_norm(const float *grads, size_t n) { return sqrt(ct_grad_sumsq(grads, n)); }

void ct_clip_grad_to_norm(float *grads, size_t n, double norm, double max_norm) {
  if (!grads || !isfinite(norm)) return;
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    const float cf = (float)coef;
    const long long len = (long long)n;
#pragma omp parallel for simd schedule(static) if (len >= CT_CLIP_PAR_MIN)
    for (long long i = 0; i < len; i++) grads[i] *= cf;
  }
}

double ct_clip_grad_norm(float *grads, size_t n, double max_norm) {
  if (!grads || n == 0) return 0.0;
  double norm = ct_grad_norm(grads, n);
  ct_clip_grad_to_norm(grads, n, norm, max_norm);
  return norm;
}
