/* Softmax and LogSoftmax over the features of [N, C] (dim=1). */
#include "nn/layer.h"

static ct_status setup(ct_layer *l) {
  if (l->in_ndim[0] != 1)
    return ct_error(CT_ERR_SHAPE, "softmax expects input [N, C], got %s; flatten first",
                    ct_layer_input_str(l, 0, (char[96]){0}, 96));
  l->out_ndim = 1;
  l->out_shape[0] = l->in_shape[0][0];
  return CT_OK;
}

static int is_log(const ct_layer *l) { return l->cls == &ct_layer_log_softmax; }

static ct_status forward(ct_layer *l, ct_exec *e) { return e->be->softmax_fwd(e->dev, is_log(l), &l->x[0], &l->y); }

static ct_status backward(ct_layer *l, ct_exec *e) {
  return l->dx[0].data ? e->be->softmax_bwd(e->dev, is_log(l), &l->y, &l->dy, &l->dx[0]) : CT_OK;
}

const ct_layer_class ct_layer_softmax = {"softmax", "Softmax", CT_LAYER_SAVES_OUTPUT, setup, NULL, NULL, forward,
                                         backward, NULL};
const ct_layer_class ct_layer_log_softmax = {"logsoftmax", "LogSoftmax", CT_LAYER_SAVES_OUTPUT, setup, NULL, NULL,
                                             forward, backward, NULL};
