/* Linear (nn.Linear): ip[0] in_features, ip[1] out_features, ip[2] bias;
 * act is an optional fused activation (set by the fusion pass). */
#include "nn/layer.h"

static ct_status setup(ct_layer *l) {
  /* in_features 0 = inferred from the input (like nn.LazyLinear), so zoo
   * models adapt their classifier to the input size. */
  if (l->ip[0] == 0 && l->in_ndim[0] == 1) l->ip[0] = (int)l->in_shape[0][0];
  int64_t in_f = l->ip[0], out_f = l->ip[1];
  if (in_f <= 0 || out_f <= 0) return ct_error(CT_ERR_INVALID_ARG, "in_features and out_features must be positive");
  if (l->in_ndim[0] != 1 || l->in_shape[0][0] != in_f)
    return ct_error(CT_ERR_SHAPE, "expected input [N, %lld] (in_features), got %s; add 'flatten' before it or fix in_features",
                    (long long)in_f, ct_layer_input_str(l, 0, (char[96]){0}, 96));
  if (in_f * out_f > CT_LAYER_MAX_PARAMS)
    return ct_error(CT_ERR_INVALID_ARG, "%lld x %lld weights is more than %lld parameters in one layer", (long long)out_f,
                    (long long)in_f, (long long)CT_LAYER_MAX_PARAMS);
  l->out_ndim = 1;
  l->out_shape[0] = out_f;
  int64_t ws[2] = {out_f, in_f};
  ct_layer_declare(l, "weight", 0, CT_F32, 2, ws);
  if (l->ip[2]) ct_layer_declare(l, "bias", 0, CT_F32, 1, &out_f);
  return CT_OK;
}

static void init(ct_layer *l, uint64_t seed, float **state, int64_t **counters) {
  (void)counters;
  ct_init_weight_bias(l, seed, state, l->ip[0], l->ip[1]);
}

static ct_status forward(ct_layer *l, ct_exec *e) {
  return e->be->linear_fwd(e->dev, &l->x[0], &l->w[0], l->ip[2] ? &l->w[1] : NULL, l->act, &l->y);
}

static ct_status backward(ct_layer *l, ct_exec *e) {
  if (l->act != CT_ACT_NONE) /* the fused activation's gradient, in place */
    CT_TRY(e->be->act_bwd(e->dev, l->act, 0.0f, NULL, &l->y, &l->dy, &l->dy));
  CT_TRY(e->be->linear_bwd_weights(e->dev, &l->x[0], &l->dy, &l->g[0], l->ip[2] ? &l->g[1] : NULL, l->grad_beta));
  if (l->dx[0].data) CT_TRY(e->be->linear_bwd_data(e->dev, &l->dy, &l->w[0], &l->dx[0]));
  return CT_OK;
}

const ct_layer_class ct_layer_linear = {"linear", "Linear", CT_LAYER_SAVES_INPUT, setup, init, NULL, forward, backward,
                                        NULL};
