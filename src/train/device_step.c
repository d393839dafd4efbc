/* The device side of the step (see device_step.h): staging a batch into
 * the model's block, the loss and hits on the device, the loss backward
 * reading the device's scale, evaluation and prediction batches, and the
 * host bookkeeping of the lagged read-back. The step itself is
 * src/train/step.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "data/gpu_data.h"
#include "exec/device_state.h"
#include "nn/layer.h"
#include "nn/model_impl.h"
#include "optim/optimizer_device.h"
#include "optim/optimizer_impl.h"
#include "train/device_step.h"

ct_status ct_device_train_begin(ct_model *m, ct_device *dev, ct_optimizer *opt, const ct_grad_scaler *gs) {
  ct_step_stats *st = ct_model_step_stats(m);
  if (!st) return ct_error(CT_ERR_INVALID_ARG, "model '%s' is not resident on %s", ct_model_name(m), ct_device_name(dev));
  CT_TRY(ct_optimizer_to_device(opt, dev));
  ct_step_stats h;
  memset(&h, 0, sizeof h);
  ct_scaler_to_dev(gs, &h.scaler);
  /* The device counts taken steps from here (a resumed run's count). */
  h.opt_steps = ct_optimizer_steps(opt);
  return ct_device_copy(dev, st, NULL, &h, sizeof h);
}

_Static_assert(CT_GPU_DATA_SLOTS >= CT_STAGE_SLOTS, "a raw uint8 slot per staging slot");

/* Copies the batch into staging slot `slot` of the model's block and
 * returns device views of it (x shaped as the model takes it). The f32
 * batch, or the GPU data path's uint8 batch (into its raw slot of the same
 * number, src/data/gpu_data.c), goes on the copy stream (the compute
 * stream waits on its event), so it overlaps whatever is queued: the
 * caller guarantees no queued step still reads that slot
 * (ct_stage_wait_slot). */
ct_status ct_device_stage(ct_model *m, ct_device *dev, const ct_batch *b, int slot, ct_tensor *x, ct_tensor *y) {
  const ct_backend *be = ct_device_backend(dev);
  void *xd = ct_model_stage_x_at(m, slot);
  int64_t *yd = ct_model_stage_y_at(m, slot);
  if (!xd || !yd) return ct_error(CT_ERR_INTERNAL, "device step: no staging slot %d", slot);
  size_t xb = ct_tensor_nbytes(&b->x), yb = (size_t)b->n * sizeof(int64_t);
  ct_layout in_layout;
  ct_dtype in_dt = ct_model_input_dtype(m, &in_layout);
  if (b->device_data) {
    /* GPU data path (--gpu-transforms, --data-on-gpu): the batch is raw
     * uint8 or only indices; the transform runs on the device and writes
     * the input as the model takes it (ct_model_narrow_input). */
    CT_TRY(ct_gpu_data_stage(b->device_data, b, slot, xd, in_dt, in_layout, yd, x));
  } else if (in_dt != CT_F32 || in_layout != CT_LAYOUT_PLAIN) {
    return ct_error(CT_ERR_INVALID_ARG,
                    "device step: model '%s' takes its input as %s (narrowed for the GPU data path); batch %lld is "
                    "an f32 batch from the host",
                    ct_model_name(m), ct_dtype_name(in_dt), (long long)b->index);
  } else if (be->copy_h2d_async) {
    /* A shared x may still be read by a queued step: the copy goes after
     * it on the compute stream (ct_model_share_stage_x). */
    if (ct_model_stage_x_shared(m) && be->copy_async) CT_TRY(be->copy_async(dev, xd, 1, b->x.data, 0, xb));
    else if (ct_model_stage_x_shared(m)) CT_TRY(ct_device_copy(dev, xd, NULL, b->x.data, xb));
    else CT_TRY(be->copy_h2d_async(dev, xd, b->x.data, xb));
    CT_TRY(be->copy_h2d_async(dev, yd, b->y.data, yb));
  } else {
    CT_TRY(ct_device_copy(dev, xd, NULL, b->x.data, xb));
    CT_TRY(ct_device_copy(dev, yd, NULL, b->y.data, yb));
  }
  if (!b->device_data) {
    *x = b->x;
    x->data = xd;
  }
  x->device = dev;
  if (ct_model_input_ndim(m) == 1 && x->ndim > 2) {
    int64_t f = 1;
    for (int d = 1; d < x->ndim; d++) f *= x->shape[d];
    x->ndim = 2;
    x->shape[1] = f;
  }
  *y = ct_tensor_1d(yd, CT_I64, b->n);
  y->device = dev;
  return CT_OK;
}

ct_status ct_device_loss_and_hits(ct_device *dev, ct_loss_kind loss, float ls, const ct_tensor *out, const ct_tensor *y,
                               ct_step_stats *st) {
  const ct_backend *be = ct_device_backend(dev);
  if (out->dtype != CT_F32 || out->ndim != 2)
    return ct_error(CT_ERR_INVALID_ARG, "device step: the loss reads f32 [N, C] logits");
  int64_t one = 1;
  ct_tensor l = ct_tensor_view(&st->loss, CT_F32, 1, &one);
  l.device = dev;
  if (loss == CT_LOSS_CROSS_ENTROPY) CT_TRY(be->cross_entropy_fwd(dev, out, y, ls, &l));
  else if (loss == CT_LOSS_NLL) CT_TRY(be->nll_fwd(dev, out, y, &l));
  else return ct_error(CT_ERR_UNSUPPORTED, "device step: the trainer trains classifiers (cross_entropy or nll)");
  return be->count_correct(dev, out, y, st);
}

ct_status ct_device_loss_backward(ct_device *dev, ct_loss_kind loss, const ct_tensor *out, const ct_tensor *y,
                                   float ls, const ct_step_stats *st, ct_tensor *dout) {
  const ct_backend *be = ct_device_backend(dev);
  if (loss == CT_LOSS_CROSS_ENTROPY && be->cross_entropy_bwd_dev)
    return be->cross_entropy_bwd_dev(dev, out, y, ls, st, dout);
  if (loss == CT_LOSS_NLL && be->nll_bwd_dev) return be->nll_bwd_dev(dev, y, st, dout);
  return ct_error(CT_ERR_UNSUPPORTED, "device step: %s has no loss backward reading the scale from the device",
                  ct_device_name(dev));
}

ct_status ct_device_forward_batch(ct_model *m, ct_device *dev, const ct_batch *b, const ct_tensor **out) {
  ct_tensor x, y;
  CT_TRY(ct_device_stage(m, dev, b, 0, &x, &y));
  return ct_model_forward(m, &x, 0, 0, out);
}

ct_status ct_device_eval_batch(ct_model *m, ct_device *dev, const ct_batch *b, ct_loss_kind loss,
                               float label_smoothing, const ct_tensor **out, double *lv, int64_t *top1,
                               int64_t *top5) {
  ct_step_stats *st = ct_model_step_stats(m);
  ct_tensor x, y;
  CT_TRY(ct_device_stage(m, dev, b, 0, &x, &y));
  CT_TRY(ct_model_forward(m, &x, 0, 0, out));
  CT_TRY(ct_device_loss_and_hits(dev, loss, label_smoothing, *out, &y, st));
  ct_step_stats h;
  CT_TRY(ct_device_copy(NULL, &h, dev, st, CT_STEP_STATS_READBACK));
  *lv = h.loss;
  *top1 += h.top1;
  *top5 += h.top5;
  return CT_OK;
}

/* ---- lag bookkeeping (pure host logic) ---- */

void ct_lag_ring_init(ct_lag_ring *r, int depth) {
  memset(r, 0, sizeof *r);
  r->depth = depth < 0 ? 0 : depth > CT_STEP_LAG_MAX ? CT_STEP_LAG_MAX : depth;
}

int ct_lag_ring_push(ct_lag_ring *r, ct_batch *b, int64_t step, int64_t n) {
  const int slots = CT_STEP_LAG_MAX + 1;
  if (r->count == slots) return -1;
  int i = (r->head + r->count) % slots;
  r->e[i].batch = b;
  r->e[i].step = step;
  r->e[i].n = n;
  r->e[i].slot = (int)(r->pushed % slots);
  r->e[i].micro = 0;
  r->pushed++;
  r->count++;
  return r->e[i].slot;
}

int ct_lag_ring_due(const ct_lag_ring *r) { return r->count > r->depth; }

int ct_lag_ring_pop(ct_lag_ring *r, ct_step_result *out) {
  if (!r->count) return -1;
  const int slots = CT_STEP_LAG_MAX + 1;
  int i = r->head;
  memset(out, 0, sizeof *out);
  out->batch = r->e[i].batch;
  out->step = r->e[i].step;
  out->n = r->e[i].n;
  out->micro = r->e[i].micro;
  r->head = (r->head + 1) % slots;
  r->count--;
  return r->e[i].slot;
}

int ct_stage_slot(const ct_lag_ring *r, int stage_slots) {
  return stage_slots > 0 ? (int)(r->pushed % stage_slots) : 0;
}

int ct_stage_wait_slot(const ct_lag_ring *r, int stage_slots) {
  /* The next step is number r->pushed; it reuses the staging slot of step
   * pushed - stage_slots, which is still in flight iff at least
   * stage_slots entries are. Steps finish in order on one stream, so
   * waiting for that one is enough. */
  if (stage_slots < 1 || r->count < stage_slots) return -1;
  const int slots = CT_STEP_LAG_MAX + 1;
  return r->e[(r->head + r->count - stage_slots) % slots].slot;
}

int ct_device_step_lag(int wanted) { return wanted < 0 ? 0 : wanted > CT_STEP_LAG_MAX ? CT_STEP_LAG_MAX : wanted; }

/* ---- the CUDA graph audit ---- */

static const ct_graph_arg graph_args[] = {
    {"batch x, y", "one of two staging slots in the model's block (one graph per slot), filled on the copy stream before the launch", 1},
    {"loss scale (backward, unscale, skip)", "stats->scaler in device memory, updated by the scaler kernel", 1},
    {"learning rate, weight decay, momentum, betas, eps", "stats->args, copied from the host before each launch", 1},
    {"Adam bias corrections (step count)", "stats->args row picked with the device's stats->opt_steps", 1},
    {"SGD first momentum step", "stats->args row picked with the device's stats->opt_steps", 1},
    {"clip threshold", "stats->args (constant per run)", 1},
    {"label smoothing, loss kind", "constant per run", 1},
    {"cuDNN/cuBLASLt workspaces, reduction partials", "the device's scratch buffer; a launch after it moved is refused and the step captured again", 1},
    {"activations, gradients, optimizer state", "fixed offsets in the model's block", 1},
    {"dropout mask step", "stats->dropout_step, copied from the host before each launch; the dropout kernels read it through a pointer", 1},
    {"dropout seed, layer index, p", "constant per run (kernel arguments)", 1},
    {"batch norm num_batches_tracked", "host memory; the host counts each replayed training step", 1},
    {"SGD momentum buffer switched on after the move", "allocated by the host on first use", 0},
};

const ct_graph_arg *ct_device_graph_args(size_t *count) {
  *count = sizeof graph_args / sizeof graph_args[0];
  return graph_args;
}

int ct_model_has_dropout(const ct_model *m) {
  for (int i = 0; i < m->n_layers; i++) {
    const ct_layer *l = &m->layers[i];
    const char *k = l->cls->kind;
    if ((!strcmp(k, "dropout") || !strcmp(k, "dropout2d")) && l->fp[0] > 0) return 1;
  }
  return 0;
}
