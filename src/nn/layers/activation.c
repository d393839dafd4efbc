/* Elementwise activations (ReLU, LeakyReLU, GELU, SiLU, Sigmoid, Tanh):
 * act selects which, fp[0] is LeakyReLU's negative_slope. */
#include "nn/layer.h"

static ct_status setup(ct_layer *l) {
  l->out_ndim = l->in_ndim[0];
  for (int i = 0; i < 4; i++) l->out_shape[i] = l->in_shape[0][i];
  return CT_OK;
}

static ct_status forward(ct_layer *l, ct_exec *e) { return e->be->act_fwd(e->dev, l->act, l->fp[0], &l->x[0], &l->y); }

static ct_status backward(ct_layer *l, ct_exec *e) {
  if (!l->dx[0].data) return CT_OK;
  return e->be->act_bwd(e->dev, l->act, l->fp[0], CT_ACT_BWD_NEEDS_X(l->act) ? &l->x[0] : NULL,
                        CT_ACT_BWD_NEEDS_Y(l->act) ? &l->y : NULL, &l->dy, &l->dx[0]);
}

/* Which of x/y backward reads depends on the activation (see the planner). */
const ct_layer_class ct_layer_activation = {"activation", "Activation", 0, setup, NULL, NULL, forward, backward, NULL};

static ct_status copy_fwd(ct_layer *l, ct_exec *e) { return e->be->axpby(e->dev, 1.0f, &l->x[0], 0.0f, &l->y); }
static ct_status copy_bwd(ct_layer *l, ct_exec *e) {
  return l->dx[0].data ? e->be->axpby(e->dev, 1.0f, &l->dy, 0.0f, &l->dx[0]) : CT_OK;
}

const ct_layer_class ct_layer_identity = {"identity", "Identity", 0, setup, NULL, NULL, copy_fwd, copy_bwd, NULL};
