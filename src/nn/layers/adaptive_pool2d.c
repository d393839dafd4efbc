/* AdaptiveAvgPool2d and AdaptiveMaxPool2d: ip[0] = OH, ip[1] = OW. */
#include "nn/layer.h"

static ct_status setup(ct_layer *l) {
  if (l->ip[0] <= 0 || l->ip[1] <= 0) return ct_error(CT_ERR_INVALID_ARG, "output size must be positive");
  char got[96];
  if (l->in_ndim[0] != 3)
    return ct_error(CT_ERR_SHAPE, "expected input [N, C, H, W], got %s", ct_layer_input_str(l, 0, got, sizeof got));
  l->out_ndim = 3;
  l->out_shape[0] = l->in_shape[0][0];
  l->out_shape[1] = l->ip[0];
  l->out_shape[2] = l->ip[1];
  return CT_OK;
}

static size_t max_ws(ct_layer *l, ct_exec *e) { return (size_t)ct_tensor_numel(&l->y) * sizeof(int32_t); (void)e; }

static ct_status avg_fwd(ct_layer *l, ct_exec *e) { return e->be->adaptive_avgpool2d_fwd(e->dev, &l->x[0], &l->y); }

static ct_status avg_bwd(ct_layer *l, ct_exec *e) {
  return l->dx[0].data ? e->be->adaptive_avgpool2d_bwd(e->dev, &l->dy, &l->dx[0]) : CT_OK;
}

static ct_status max_fwd(ct_layer *l, ct_exec *e) {
  return e->be->adaptive_maxpool2d_fwd(e->dev, &l->x[0], &l->y, e->training ? l->ws : NULL);
}

static ct_status max_bwd(ct_layer *l, ct_exec *e) {
  return l->dx[0].data ? e->be->adaptive_maxpool2d_bwd(e->dev, &l->dy, l->ws, &l->dx[0]) : CT_OK;
}

const ct_layer_class ct_layer_adaptive_avgpool2d = {"adaptiveavgpool2d", "AdaptiveAvgPool2d", 0, setup, NULL, NULL,
                                                    avg_fwd, avg_bwd, NULL};
const ct_layer_class ct_layer_adaptive_maxpool2d = {"adaptivemaxpool2d", "AdaptiveMaxPool2d", 0, setup, NULL, max_ws,
                                                    max_fwd, max_bwd, NULL};
