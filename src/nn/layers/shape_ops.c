/* Flatten (a view: the output shares the input's memory) and the residual
 * add of two equally shaped inputs. */
#include "nn/layer.h"

static ct_status flatten_setup(ct_layer *l) {
  l->out_ndim = 1;
  l->out_shape[0] = ct_shape_numel(l->in_ndim[0], l->in_shape[0]);
  return CT_OK;
}

static ct_status flatten_fwd(ct_layer *l, ct_exec *e) {
  (void)l, (void)e; /* y aliases x */
  return CT_OK;
}

static ct_status flatten_bwd(ct_layer *l, ct_exec *e) {
  return l->dx[0].data ? e->be->axpby(e->dev, 1.0f, &l->dy, 0.0f, &l->dx[0]) : CT_OK;
}

const ct_layer_class ct_layer_flatten = {"flatten", "Flatten", CT_LAYER_ALIAS, flatten_setup, NULL, NULL, flatten_fwd,
                                         flatten_bwd, NULL};

static ct_status add_setup(ct_layer *l) {
  if (l->in_ndim[0] != l->in_ndim[1] || ct_shape_numel(l->in_ndim[0], l->in_shape[0]) != ct_shape_numel(l->in_ndim[1], l->in_shape[1]))
    return ct_error(CT_ERR_SHAPE, "residual add of different shapes (%lld vs %lld elements per sample); add a shortcut that matches",
                    (long long)ct_shape_numel(l->in_ndim[0], l->in_shape[0]),
                    (long long)ct_shape_numel(l->in_ndim[1], l->in_shape[1]));
  for (int i = 0; i < l->in_ndim[0]; i++)
    if (l->in_shape[0][i] != l->in_shape[1][i])
      return ct_error(CT_ERR_SHAPE, "residual add of different shapes (dim %d: %lld vs %lld)", i + 1,
                      (long long)l->in_shape[0][i], (long long)l->in_shape[1][i]);
  l->out_ndim = l->in_ndim[0];
  for (int i = 0; i < 4; i++) l->out_shape[i] = l->in_shape[0][i];
  return CT_OK;
}

static ct_status add_fwd(ct_layer *l, ct_exec *e) {
  return e->be->add(e->dev, &l->x[0], &l->x[1], l->act, &l->y); /* a folded ReLU in the same pass */
}

/* Both inputs' gradient is dy. An input whose gradient the planner made
 * this layer's own dy buffer (exec_plan.c) needs no copy. */
static ct_status add_bwd(ct_layer *l, ct_exec *e) {
  if (l->act != CT_ACT_NONE) CT_TRY(e->be->act_bwd(e->dev, l->act, 0.0f, NULL, &l->y, &l->dy, &l->dy));
  for (int j = 0; j < 2; j++)
    if (l->dx[j].data && l->dx[j].data != l->dy.data) CT_TRY(e->be->axpby(e->dev, 1.0f, &l->dy, 0.0f, &l->dx[j]));
  return CT_OK;
}

const ct_layer_class ct_layer_add = {"add", "Add", 0, add_setup, NULL, NULL, add_fwd, add_bwd, NULL};
