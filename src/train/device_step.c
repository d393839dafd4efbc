/* Device-resident training and evaluation steps (see device_step.h).
 *
 * Why the read-back lags: the statistics copy of step k is queued behind
 * step k with an event; the host queues step k+1 before it waits on that
 * event, so the GPU always has a step in its queue and the host's wait
 * (loss, hits, skip decision) overlaps the next step's compute. What the
 * host must know before queuing a step but cannot yet (was the previous
 * step skipped?) is decided on the device: the loss backward reads the
 * scale from the device's scaler, and the optimizer's step-count dependent
 * scalars come from a table row the device picks with its own step count
 * (ct_step_args). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "data/gpu_data.h"
#include "nn/device_state.h"
#include "nn/layer.h"
#include "nn/model_impl.h"
#include "optim/optimizer_device.h"
#include "optim/optimizer_impl.h"
#include "train/device_step.h"

ct_status ct_device_train_begin(ct_model *m, ct_device *dev, ct_optimizer *opt, const ct_grad_scaler *gs) {
  ct_step_stats *st = ct_model_step_stats(m);
  if (!st) return ct_error(CT_ERR_INVALID_ARG, "model '%s' is not resident on %s", ct_model_name(m), ct_device_name(dev));
  size_t slab_floats = 0;
  float *slab = ct_model_optimizer_slab(m, &slab_floats);
  CT_TRY(ct_optimizer_to_device_at(opt, dev, slab, slab_floats));
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
static ct_status stage(ct_model *m, ct_device *dev, const ct_batch *b, int slot, ct_tensor *x, ct_tensor *y) {
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

/* Loss into stats->loss and top-1/top-5 into stats->top1/top5. */
static ct_status loss_and_hits(ct_device *dev, ct_loss_kind loss, float ls, const ct_tensor *out, const ct_tensor *y,
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

/* The loss backward with the scale read from the device's scaler: the
 * host's copy of the scale may be a step behind the device's. */
static ct_status loss_backward_dev(ct_device *dev, ct_loss_kind loss, const ct_tensor *out, const ct_tensor *y,
                                   float ls, const ct_step_stats *st, ct_tensor *dout) {
  const ct_backend *be = ct_device_backend(dev);
  if (loss == CT_LOSS_CROSS_ENTROPY && be->cross_entropy_bwd_dev)
    return be->cross_entropy_bwd_dev(dev, out, y, ls, st, dout);
  if (loss == CT_LOSS_NLL && be->nll_bwd_dev) return be->nll_bwd_dev(dev, y, st, dout);
  return ct_error(CT_ERR_UNSUPPORTED, "device step: %s has no loss backward reading the scale from the device",
                  ct_device_name(dev));
}

/* Forward, loss, backward and the fused optimizer for the staged batch:
 * everything a graph captures. The only per-step value here is the
 * dropout step; the pipeline makes the dropout kernels read it from
 * stats->dropout_step (with_dropout_step), ct_device_train_step passes it
 * as the key's kernel argument.
 * host_args: the optimizer's scalars travel as kernel arguments computed
 * from the host's counters (exact only when no step is in flight; the
 * path that also creates an SGD momentum buffer switched on late). */
static ct_micro_step whole_step(int64_t step) {
  ct_micro_step ms = {step, (uint32_t)step, 1, 1, 1.0f};
  return ms;
}

static ct_status step_body(ct_model *m, ct_device *dev, ct_optimizer *opt, const ct_tensor *x, const ct_tensor *y,
                           ct_loss_kind loss, float ls, const ct_micro_step *ms, int host_args, double clip) {
  ct_step_stats *st = ct_model_step_stats(m);
  const ct_tensor *out;
  ct_tensor dout;
  CT_TRY(ct_model_forward(m, x, 1, ms->key, &out));
  CT_TRY(loss_and_hits(dev, loss, ls, out, y, st));
  CT_TRY(ct_model_output_grad(m, &dout));
  /* The backward below writes every gradient with beta 0: no zero fill. */
  if (ms->first) ct_model_overwrite_grads(m);
  CT_TRY(loss_backward_dev(dev, loss, out, y, ls, st, &dout));
  /* The micro-batch's share of its group: the backward reads the scale
   * from device memory, so the share is a separate pass over the [N, C]
   * loss gradient (skipped without accumulation). */
  if (ms->factor != 1.0f) CT_TRY(ct_device_backend(dev)->axpby(dev, ms->factor, &dout, 0.0f, &dout));
  CT_TRY(ct_model_backward(m, &dout));
  if (!ms->last) return CT_OK;
  size_t np;
  float *params = ct_model_params(m, &np), *grads = ct_model_grads(m, NULL);
  if (host_args) CT_TRY(ct_optimizer_step_device(opt, dev, params, grads, st, clip));
  else CT_TRY(ct_optimizer_step_device_args(opt, dev, params, grads, st));
  /* O3 rounds the master weights through the low precision after every
   * update; rounding is idempotent, so it also runs after a skipped step
   * (the host does not know yet whether this one will be skipped). */
  return ct_model_round_params(m);
}

/* SGD momentum switched on after the state moved (a library caller's
 * schedule set up after ct_device_trainer_create; ct_fit's OneCycle sets
 * it before): the buffer does not exist yet, and only the host-argument
 * path creates it. */
static int needs_host_args(const ct_optimizer *o) {
  return o->cfg.kind == CT_OPTIM_SGD && o->cfg.momentum != 0 && !o->momentum_buffer;
}

/* Host side of a result: the counters that follow the skip decision (a
 * micro-batch that did not end its group made none: the statistics' skip
 * flag is still the previous step's). */
static void take_result(const ct_step_stats *h, ct_optimizer *opt, ct_grad_scaler *gs, ct_step_result *r) {
  r->skipped = r->micro ? 0 : ct_fused_skip(h);
  if (!r->micro) ct_optimizer_commit_step(opt, r->skipped);
  ct_scaler_from_dev(&h->scaler, gs);
  r->loss = h->loss;
  r->top1 = h->top1;
  r->top5 = h->top5;
}

ct_status ct_device_train_step(ct_model *m, ct_device *dev, ct_optimizer *opt, const ct_batch *b, ct_loss_kind loss,
                               float label_smoothing, double clip, uint32_t step, ct_grad_scaler *gs, double *lv,
                               int64_t *top1, int64_t *top5, int *skipped) {
  ct_step_stats *st = ct_model_step_stats(m);
  ct_tensor x, y;
  CT_TRY(stage(m, dev, b, 0, &x, &y));
  int host_args = needs_host_args(opt);
  if (!host_args) CT_TRY(ct_optimizer_write_step_args(opt, dev, st, clip));
  ct_micro_step ms = whole_step(step);
  CT_TRY(step_body(m, dev, opt, &x, &y, loss, label_smoothing, &ms, host_args, clip));
  /* The one read-back of the step (it also waits for the step). */
  ct_step_stats h;
  CT_TRY(ct_device_copy(NULL, &h, dev, st, CT_STEP_STATS_READBACK));
  ct_step_result r;
  memset(&r, 0, sizeof r);
  take_result(&h, opt, gs, &r);
  *skipped = r.skipped;
  *lv = r.loss;
  *top1 += r.top1;
  *top5 += r.top5;
  return CT_OK;
}

ct_status ct_device_forward_batch(ct_model *m, ct_device *dev, const ct_batch *b, const ct_tensor **out) {
  ct_tensor x, y;
  CT_TRY(stage(m, dev, b, 0, &x, &y));
  return ct_model_forward(m, &x, 0, 0, out);
}

ct_status ct_device_eval_batch(ct_model *m, ct_device *dev, const ct_batch *b, ct_loss_kind loss,
                               float label_smoothing, const ct_tensor **out, double *lv, int64_t *top1,
                               int64_t *top5) {
  ct_step_stats *st = ct_model_step_stats(m);
  ct_tensor x, y;
  CT_TRY(stage(m, dev, b, 0, &x, &y));
  CT_TRY(ct_model_forward(m, &x, 0, 0, out));
  CT_TRY(loss_and_hits(dev, loss, label_smoothing, *out, &y, st));
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

int ct_device_graph_audit(const ct_model *m, const ct_optimizer *opt, char *why, size_t cap) {
  if (cap) why[0] = 0;
  /* Dropout is fine: its step comes from stats->dropout_step (a backend
   * without dropout_step_from is refused by ct_device_trainer_create). */
  (void)m;
  if (opt && needs_host_args(opt)) {
    snprintf(why, cap, "SGD momentum was switched on after the optimizer state moved to the device");
    return 0;
  }
  return 1;
}

/* ---- the pipeline ---- */

int ct_model_has_dropout(const ct_model *m) {
  for (int i = 0; i < m->n_layers; i++) {
    const ct_layer *l = &m->layers[i];
    const char *k = l->cls->kind;
    if ((!strcmp(k, "dropout") || !strcmp(k, "dropout2d")) && l->fp[0] > 0) return 1;
  }
  return 0;
}

/* Why one graph per staging slot rather than one graph fed by a
 * device-to-device copy from the slot into a fixed input buffer: the copy
 * would need a third x/y buffer in the block (more memory in the plan, on
 * the largest models tens of MB) and a device copy of every batch inside
 * the graph, while a second graph costs one more capture and a few kB of
 * graph memory. The graphs differ only in the staging addresses. */
struct ct_device_trainer {
  ct_model *m;
  ct_device *dev;
  ct_optimizer *opt;
  ct_grad_scaler *gs;
  ct_loss_kind loss;
  float ls;
  double clip;
  ct_scheduler *sched;    /* per-step schedule, stepped at read-back (NULL: none) */
  int lag;
  ct_lag_ring ring;
  ct_step_stats *slots;   /* [CT_STEP_LAG_MAX + 1] pinned host copies of the statistics */
  int pinned;
  int dropout;            /* the model has dropout: write stats->dropout_step per step */
  int graph_want, warmup_left;
  int graph_asked;        /* --cuda-graph was given (graph_want may have been refused since) */
  int accumulate;         /* > 1: micro-batches, no graph */
  void *graph[CT_STAGE_SLOTS];    /* one per staging slot: it captured that slot's addresses */
  int64_t graph_n[CT_STAGE_SLOTS]; /* batch size each graph was captured with */
  char note[256];
};

int ct_device_trainer_lag(const ct_device_trainer *t) { return t->lag; }

int ct_device_trainer_graph_on(const ct_device_trainer *t, const char **note) {
  if (note) *note = t->note[0] ? t->note : NULL;
  for (int k = 0; k < CT_STAGE_SLOTS; k++)
    if (t->graph[k]) return 1;
  return 0;
}

ct_status ct_device_trainer_create(ct_model *m, ct_device *dev, ct_optimizer *opt, ct_grad_scaler *gs,
                                   ct_loss_kind loss, float label_smoothing, double clip, ct_scheduler *step_sched,
                                   const ct_device_train_opts *o, ct_device_trainer **out) {
  *out = NULL;
  const ct_backend *be = ct_device_backend(dev);
  if (!ct_model_step_stats(m))
    return ct_error(CT_ERR_INVALID_ARG, "model '%s' is not resident on %s", ct_model_name(m), ct_device_name(dev));
  if (o->cuda_graph && !be->graph_begin)
    return ct_error(CT_ERR_INVALID_ARG, "--cuda-graph: device %s cannot capture CUDA graphs (use --device cuda)",
                    ct_device_name(dev));
  ct_device_trainer *t = calloc(1, sizeof *t);
  if (!t) return ct_error(CT_ERR_OUT_OF_MEMORY, "device step: out of host memory");
  t->m = m, t->dev = dev, t->opt = opt, t->gs = gs, t->loss = loss, t->ls = label_smoothing, t->clip = clip;
  t->sched = step_sched;
  t->lag = ct_device_step_lag(o->lag);
  /* Without async copies and events nothing can run ahead. */
  if (!be->copy_async || !be->event_record || !be->event_wait) t->lag = 0;
  ct_lag_ring_init(&t->ring, t->lag);
  size_t bytes = sizeof(ct_step_stats) * (CT_STEP_LAG_MAX + 1);
  t->slots = be->host_alloc ? be->host_alloc(dev, bytes) : NULL;
  t->pinned = t->slots != NULL;
  if (!t->slots) t->slots = malloc(bytes);
  if (!t->slots) {
    free(t);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "device step: cannot allocate %zu bytes for the statistics read-back", bytes);
  }
  t->dropout = ct_model_has_dropout(m) && be->dropout_step_from != NULL;
  t->graph_want = t->graph_asked = o->cuda_graph;
  t->warmup_left = o->warmup > 0 ? o->warmup : 2;
  if (t->graph_want && !ct_device_graph_audit(m, opt, t->note, sizeof t->note)) t->graph_want = 0;
  if (t->graph_want && ct_model_has_dropout(m) && !be->dropout_step_from) {
    snprintf(t->note, sizeof t->note, "device %s reads the dropout step only as a kernel argument", ct_device_name(dev));
    t->graph_want = 0;
  }
  *out = t;
  return CT_OK;
}

void ct_device_trainer_set_accumulate(ct_device_trainer *t, int accumulate) {
  t->accumulate = accumulate > 1 ? accumulate : 1;
  /* A graph would need two step kinds (with and without the optimizer)
   * and a loss-gradient share that changes in an epoch's short last
   * group; accumulation trades step count for memory, where the launch
   * overhead a graph saves matters least. */
  if (t->accumulate > 1 && t->graph_asked) {
    snprintf(t->note, sizeof t->note, "--accumulate %d trains eagerly (the graph captures whole optimizer steps)",
             t->accumulate);
    t->graph_want = 0;
  }
}

void ct_device_trainer_destroy(ct_device_trainer *t) {
  if (!t) return;
  const ct_backend *be = ct_device_backend(t->dev);
  for (int k = 0; k < CT_STAGE_SLOTS; k++)
    if (t->graph[k]) be->graph_free(t->dev, t->graph[k]);
  if (t->pinned) be->host_free(t->dev, t->slots);
  else free(t->slots);
  free(t);
}

/* Batch norm's num_batches_tracked (host memory) for a training step the
 * host did not walk: a graph replay runs no layer code on the host. */
static void count_bn_batches(ct_model *m) {
  for (int i = 0; i < m->n_layers; i++)
    if (m->layers[i].counter) (*m->layers[i].counter)++;
}

/* Runs (or captures, between graph_begin and graph_end) the step body with
 * the dropout kernels reading the step from stats->dropout_step; the
 * pointer is switched off again whatever happens, so nothing outside the
 * pipeline (evaluation, ct_device_train_step) reads it. */
static ct_status body_dev_step(ct_device_trainer *t, const ct_tensor *x, const ct_tensor *y, const ct_micro_step *ms,
                               int host_args) {
  const ct_backend *be = ct_device_backend(t->dev);
  ct_step_stats *st = ct_model_step_stats(t->m);
  if (t->dropout) CT_TRY(be->dropout_step_from(t->dev, &st->dropout_step));
  ct_status s = step_body(t->m, t->dev, t->opt, x, y, t->loss, t->ls, ms, host_args, t->clip);
  if (t->dropout) {
    ct_status r = be->dropout_step_from(t->dev, NULL);
    if (s == CT_OK) s = r;
  }
  return s;
}

/* Captures the step on staging slot k into graph[k] and launches it; on
 * failure leaves the step to run eagerly (the capture executed nothing)
 * and notes why. */
static ct_status capture(ct_device_trainer *t, int k, const ct_tensor *x, const ct_tensor *y, int64_t step, int *ran) {
  const ct_backend *be = ct_device_backend(t->dev);
  *ran = 0;
  /* The capture walks the layers (counting batch norm batches) without
   * running the step; a failed capture is followed by an eager step. */
  int64_t *counters = t->m->n_counters ? malloc(t->m->n_counters * sizeof *counters) : NULL;
  if (t->m->n_counters && !counters) return ct_error(CT_ERR_OUT_OF_MEMORY, "cuda graph: out of host memory");
  if (counters) memcpy(counters, t->m->counters, t->m->n_counters * sizeof *counters);
  ct_status s = be->graph_begin(t->dev);
  if (s == CT_OK) {
    ct_micro_step ms = whole_step(step);
    ct_status bs = body_dev_step(t, x, y, &ms, 0);
    void *g = NULL;
    ct_status es = be->graph_end(t->dev, &g);
    s = bs != CT_OK ? bs : es;
    if (s == CT_OK) {
      t->graph[k] = g;
      t->graph_n[k] = x->shape[0];
    } else if (g) {
      be->graph_free(t->dev, g);
    }
  }
  if (s != CT_OK) {
    snprintf(t->note, sizeof t->note, "capture failed, running eagerly: %s", ct_last_error());
    t->graph_want = 0;
    if (counters) memcpy(t->m->counters, counters, t->m->n_counters * sizeof *counters);
    free(counters);
    return CT_OK;
  }
  free(counters);
  CT_TRY(be->graph_launch(t->dev, t->graph[k]));
  *ran = 1;
  return CT_OK;
}

/* The per-step scalars the device reads (the optimizer's argument table,
 * dropout's mask step), queued on the compute stream before the step, in
 * stream order, so a step still queued reads its own values. They travel
 * from the pinned statistics slot this step will be read back into: a
 * copy from pageable memory may make the driver wait for the stream
 * (CUDA's API synchronization notes), which would undo running ahead. A
 * slot's args and dropout_step are not part of the read-back, and the host
 * refills a slot only after the step that last used it has finished (it
 * waits for step k before queuing step k + lag + 1 <= k + 3). */
static ct_status upload_step_scalars(ct_device_trainer *t, ct_step_stats *st, uint32_t key, int host_args,
                                     int optim) {
  const ct_backend *be = ct_device_backend(t->dev);
  ct_step_stats *h = &t->slots[t->ring.pushed % (CT_STEP_LAG_MAX + 1)];
  int async = t->pinned && be->copy_async;
  if (!host_args && optim) {
    ct_optim_step_args(t->opt, t->sched, t->clip, &h->args);
    CT_TRY(async ? be->copy_async(t->dev, &st->args, 1, &h->args, 0, sizeof h->args)
                 : ct_device_copy(t->dev, &st->args, NULL, &h->args, sizeof h->args));
  }
  if (t->dropout) {
    h->dropout_step = key;
    CT_TRY(async ? be->copy_async(t->dev, &st->dropout_step, 1, &h->dropout_step, 0, sizeof h->dropout_step)
                 : ct_device_copy(t->dev, &st->dropout_step, NULL, &h->dropout_step, sizeof h->dropout_step));
  }
  return CT_OK;
}

/* Waits for the oldest step in flight and fills *done. */
static ct_status read_oldest(ct_device_trainer *t, ct_step_result *done, int *have) {
  *have = 0;
  int slot = ct_lag_ring_pop(&t->ring, done);
  if (slot < 0) return CT_OK;
  const ct_backend *be = ct_device_backend(t->dev);
  if (t->lag > 0) CT_TRY(be->event_wait(t->dev, slot));
  take_result(&t->slots[slot], t->opt, t->gs, done);
  *have = 1;
  /* The schedule follows the taken steps as the optimizer's counters do,
   * so the next argument table starts from both. */
  if (t->sched && !done->micro && !done->skipped) CT_TRY(ct_scheduler_step(t->sched, t->opt));
  return CT_OK;
}

ct_status ct_device_trainer_step(ct_device_trainer *t, ct_batch *b, int64_t step, ct_step_result *done, int *have) {
  ct_micro_step ms = whole_step(step);
  return ct_device_trainer_step_micro(t, b, &ms, done, have);
}

ct_status ct_device_trainer_step_micro(ct_device_trainer *t, ct_batch *b, const ct_micro_step *ms,
                                       ct_step_result *done, int *have) {
  const ct_backend *be = ct_device_backend(t->dev);
  ct_step_stats *st = ct_model_step_stats(t->m);
  int64_t step = ms->step;
  *have = 0;
  if (t->ring.count == CT_STEP_LAG_MAX + 1) CT_TRY(read_oldest(t, done, have));
  /* Only a step that runs the optimizer takes its scalars from the host. */
  int host_args = ms->last && needs_host_args(t->opt);
  if (host_args && t->ring.count > 0) {
    /* Its scalars come from the host's counters: nothing may be in flight. */
    if (*have || t->ring.count > 1)
      return ct_error(CT_ERR_INVALID_ARG, "device step: SGD momentum switched on with %d steps in flight", t->ring.count);
    CT_TRY(read_oldest(t, done, have));
  }
  /* The staging slot's previous user must be done before the copy
   * overwrites it (only possible with lag >= CT_STAGE_SLOTS). */
  int k = ct_stage_slot(&t->ring, CT_STAGE_SLOTS), wait = ct_stage_wait_slot(&t->ring, CT_STAGE_SLOTS);
  if (wait >= 0 && t->lag > 0) CT_TRY(be->event_wait(t->dev, wait));
  ct_tensor x, y;
  CT_TRY(stage(t->m, t->dev, b, k, &x, &y));
  CT_TRY(upload_step_scalars(t, st, ms->key, host_args, ms->last));
  int ran = 0;
  /* Graphs exist only without accumulation (ct_device_trainer_create). */
  if (!host_args && t->graph[k] && b->n == t->graph_n[k]) {
    ct_status s = be->graph_launch(t->dev, t->graph[k]);
    if (s == CT_OK) {
      ran = 1;
      count_bn_batches(t->m);
    } else {
      /* The scratch buffer moved (a larger evaluation batch): capture again. */
      be->graph_free(t->dev, t->graph[k]);
      t->graph[k] = NULL;
    }
  }
  if (!ran && !host_args && t->graph_want && !t->graph[k] && t->warmup_left <= 0 && b->n == t->m->max_batch)
    CT_TRY(capture(t, k, &x, &y, step, &ran));
  if (!ran) {
    CT_TRY(body_dev_step(t, &x, &y, ms, host_args));
    if (t->warmup_left > 0) t->warmup_left--;
  }
  int slot = ct_lag_ring_push(&t->ring, b, step, b->n);
  if (!ms->last) t->ring.e[(t->ring.head + t->ring.count - 1) % (CT_STEP_LAG_MAX + 1)].micro = 1;
  if (t->lag > 0) {
    CT_TRY(be->copy_async(t->dev, &t->slots[slot], 0, st, 1, CT_STEP_STATS_READBACK));
    CT_TRY(be->event_record(t->dev, slot));
  } else {
    CT_TRY(ct_device_copy(NULL, &t->slots[slot], t->dev, st, CT_STEP_STATS_READBACK));
  }
  if (!*have && ct_lag_ring_due(&t->ring)) CT_TRY(read_oldest(t, done, have));
  return CT_OK;
}

ct_status ct_device_trainer_drain(ct_device_trainer *t, ct_step_result *done, int *have) {
  return read_oldest(t, done, have);
}
