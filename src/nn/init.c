/* Parameter initialisation with PyTorch's distributions. Values are drawn
 * from a counter-based stream per parameter tensor, so they depend only on
 * the seed and the layer, not on the order models are built in. */
#include <math.h>

#include "ctrain/rng.h"
#include "nn/layer.h"

void ct_init_uniform(float *p, int64_t n, float bound, uint64_t seed, uint32_t stream) {
  ct_rng_fill_uniform(p, n, seed, CT_RNG_INIT, stream, 0);
  for (int64_t i = 0; i < n; i++) p[i] = (2.0f * p[i] - 1.0f) * bound;
}

void ct_init_normal(float *p, int64_t n, float std, uint64_t seed, uint32_t stream) {
  ct_rng_fill_normal(p, n, std, seed, CT_RNG_INIT, stream, 0);
}

void ct_init_weight_bias(ct_layer *l, uint64_t seed, float **state, int64_t fan_in, int64_t fan_out) {
  int64_t nw = ct_shape_numel(l->state[0].ndim, l->state[0].shape);
  /* kaiming_uniform_(a=sqrt(5)): gain sqrt(2/(1+5)), bound gain*sqrt(3/fan_in) = 1/sqrt(fan_in) */
  float bound = fan_in > 0 ? 1.0f / sqrtf((float)fan_in) : 0.0f;
  switch (l->init_kind) {
    case CT_INIT_KAIMING_NORMAL_FAN_OUT:
      ct_init_normal(state[0], nw, sqrtf(2.0f / (float)fan_out), seed, 0);
      break;
    case CT_INIT_NORMAL_001:
      ct_init_normal(state[0], nw, 0.01f, seed, 0);
      break;
    default:
      ct_init_uniform(state[0], nw, bound, seed, 0);
  }
  if (l->n_state > 1 && !l->state[1].is_buffer) {
    int64_t nb = ct_shape_numel(l->state[1].ndim, l->state[1].shape);
    if (l->init_kind == CT_INIT_DEFAULT)
      ct_init_uniform(state[1], nb, bound, seed, 1);
    else
      for (int64_t i = 0; i < nb; i++) state[1][i] = 0.0f;
  }
}
