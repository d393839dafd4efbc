/* Dropout and Dropout2d: fp[0] = p. Masks come from the counter-based RNG
 * keyed by (seed, layer, step) and each sample's number in the step's
 * whole batch, so backward regenerates them instead of storing them,
 * every device draws the same mask, and so does a batch split over ranks. */
#include "nn/layer.h"

static ct_status setup(ct_layer *l) {
  if (!(l->fp[0] >= 0.0f && l->fp[0] <= 1.0f))
    return ct_error(CT_ERR_INVALID_ARG, "dropout probability %g is outside [0, 1]", (double)l->fp[0]);
  l->out_ndim = l->in_ndim[0];
  for (int i = 0; i < 4; i++) l->out_shape[i] = l->in_shape[0][i];
  return CT_OK;
}

static ct_status setup2d(ct_layer *l) {
  char got[96];
  if (l->in_ndim[0] != 3)
    return ct_error(CT_ERR_SHAPE, "Dropout2d expects input [N, C, H, W], got %s", ct_layer_input_str(l, 0, got, sizeof got));
  return setup(l);
}

static int64_t group(const ct_layer *l) {
  return l->cls == &ct_layer_dropout2d ? l->in_shape[0][1] * l->in_shape[0][2] : 1;
}

static ct_dropout_key key(const ct_layer *l, const ct_exec *e) {
  int64_t per_sample = e->batch > 0 ? ct_tensor_numel(&l->x[0]) / e->batch : 0;
  ct_dropout_key k = {e->seed, (uint32_t)l->rng_index, e->step, (uint64_t)e->sample_offset, (uint64_t)e->sample_stride,
                      per_sample / group(l)};
  return k;
}

static ct_status forward(ct_layer *l, ct_exec *e) {
  if (!e->training || l->fp[0] == 0.0f) return e->be->axpby(e->dev, 1.0f, &l->x[0], 0.0f, &l->y);
  return e->be->dropout_fwd(e->dev, l->fp[0], group(l), key(l, e), &l->x[0], &l->y);
}

static ct_status backward(ct_layer *l, ct_exec *e) {
  if (!l->dx[0].data) return CT_OK;
  if (l->fp[0] == 0.0f) return e->be->axpby(e->dev, 1.0f, &l->dy, 0.0f, &l->dx[0]);
  return e->be->dropout_bwd(e->dev, l->fp[0], group(l), key(l, e), &l->dy, &l->dx[0]);
}

const ct_layer_class ct_layer_dropout = {"dropout", "Dropout", 0, setup, NULL, NULL, forward, backward, NULL};
const ct_layer_class ct_layer_dropout2d = {"dropout2d", "Dropout2d", 0, setup2d, NULL, NULL, forward, backward, NULL};
