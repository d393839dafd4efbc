/* The one training step (see include/ctrain/step.h): its phases on a host
 * model and on a model resident on a device, the hooks strategies plug
 * into, and the device's lagged read-back and CUDA graph.
 *
 * Why the device's read-back lags: the statistics copy of step k is
 * queued behind step k with an event; the host queues step k+1 before it
 * waits on that event, so the GPU always has a step in its queue and the
 * host's wait (loss, hits, skip decision) overlaps the next step's
 * compute. What the host must know before queuing a step but cannot yet
 * (was the previous step skipped?) is decided on the device: the loss
 * backward reads the scale from the device's scaler, and the optimizer's
 * step-count dependent scalars come from a table row the device picks
 * with its own step count (ct_step_args).
 *
 * Why one graph per staging slot rather than one graph fed by a
 * device-to-device copy from the slot into a fixed input buffer: the copy
 * would need a third x/y buffer in the block and a device copy of every
 * batch inside the graph, while a second graph costs one more capture and
 * a few kB of graph memory. The graphs differ only in the staging
 * addresses. */
#include "ctrain/step.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "exec/device_state.h"
#include "exec/exec_impl.h"
#include "nn/model_impl.h"
#include "optim/optimizer_device.h"
#include "optim/optimizer_impl.h"
#include "train/device_step.h"
#include "train/metrics.h"

struct ct_step {
  ct_model *m;
  ct_device *dev;
  const ct_backend *be;
  ct_optimizer *opt;
  ct_step_config cfg;
  ct_grad_scaler own_gs, *gs; /* gs: own_gs, or the caller's (ct_device_trainer_create) */
  ct_step_hooks hooks;
  int on_device;

  /* The batch begun last and where it stands. */
  ct_batch *b;
  ct_step_pos pos;
  ct_tensor x, y;
  const ct_tensor *out;
  /* Host model: the batch's numbers and whether its gradients overflowed. */
  double lv;
  int64_t top1, top5;
  int found_inf;

  /* Device model: the read-back ring and its pinned statistics slots. */
  ct_step_stats *st;      /* the model block's statistics */
  int lag;
  ct_lag_ring ring;
  ct_step_stats *slots;   /* [CT_STEP_LAG_MAX + 1] */
  int pinned;
  int dropout;            /* dropout reads its step from stats->dropout_step */
  int host_args;          /* this step's optimizer scalars come from the host's counters */
  int stage_k;            /* the staging slot of the batch begun last */
  ct_step_result pending; /* a result read before the batch was queued (ring full) */
  int have_pending;
  int graph_want, warmup_left, graph_asked;
  void *graph[CT_STAGE_SLOTS];     /* one per staging slot: it captured that slot's addresses */
  int64_t graph_n[CT_STAGE_SLOTS]; /* batch size each graph was captured with */
  char note[256];
};

void ct_step_config_default(ct_step_config *c) {
  memset(c, 0, sizeof *c);
  c->loss = CT_LOSS_CROSS_ENTROPY;
  ct_grad_scaler_init(&c->scaler, 0, 0, 1.0);
}

ct_step_pos ct_step_pos_single(int64_t step) {
  ct_step_pos p = {step, (uint32_t)step, 1, 1, 1.0f, 0, 1};
  return p;
}

const ct_step_pos *ct_step_current(const ct_step *s) { return &s->pos; }

ct_model *ct_step_model(const ct_step *s) { return s->m; }
ct_device *ct_step_device(const ct_step *s) { return s->dev; }
ct_optimizer *ct_step_optimizer(const ct_step *s) { return s->opt; }
const ct_grad_scaler *ct_step_scaler(const ct_step *s) { return s->gs; }
int ct_step_on_device(const ct_step *s) { return s->on_device; }
int ct_step_lag(const ct_step *s) { return s->lag; }

int ct_step_graph_on(const ct_step *s, const char **note) {
  if (note) *note = s->note[0] ? s->note : NULL;
  for (int k = 0; k < CT_STAGE_SLOTS; k++)
    if (s->graph[k]) return 1;
  return 0;
}

void ct_step_set_hooks(ct_step *s, const ct_step_hooks *h) {
  if (h) s->hooks = *h;
  else memset(&s->hooks, 0, sizeof s->hooks);
  /* A replayed graph runs no host code: hooks that are not only device
   * work would be skipped silently (PyTorch's static-graph no_sync trap). */
  int hooked = s->hooks.grads_ready || s->hooks.grads_needed || s->hooks.sync || s->hooks.reduce || s->hooks.updated;
  if (hooked && !s->hooks.graph_safe && s->graph_asked) {
    snprintf(s->note, sizeof s->note, "the step's hooks are host code a replayed graph would skip: running eagerly");
    s->graph_want = 0;
    for (int k = 0; k < CT_STAGE_SLOTS; k++)
      if (s->graph[k]) s->be->graph_free(s->dev, s->graph[k]), s->graph[k] = NULL;
  }
}

/* SGD momentum switched on after the state moved (a library caller's
 * schedule set up after the step was created; ct_fit's OneCycle sets it
 * before): the buffer does not exist yet, and only the host-argument
 * path creates it. */
static int needs_host_args(const ct_optimizer *o) {
  return o->cfg.kind == CT_OPTIM_SGD && o->cfg.momentum != 0 && !o->momentum_buffer;
}

int ct_device_graph_audit(const ct_model *m, const ct_optimizer *opt, char *why, size_t cap) {
  if (cap) why[0] = 0;
  /* Dropout is fine: its step comes from stats->dropout_step (a backend
   * without dropout_step_from is refused when the step is created). */
  (void)m;
  if (opt && needs_host_args(opt)) {
    snprintf(why, cap, "SGD momentum was switched on after the optimizer state moved to the device");
    return 0;
  }
  return 1;
}

/* The step's object; begin = 1 also moves the optimizer's and the
 * scaler's state to a device model's block (ct_device_train_begin). */
static ct_status step_new(ct_model *m, ct_device *dev, ct_optimizer *opt, const ct_step_config *c, ct_grad_scaler *gs,
                          int begin, ct_step **out) {
  *out = NULL;
  if (c->loss != CT_LOSS_CROSS_ENTROPY && c->loss != CT_LOSS_NLL)
    return ct_error(CT_ERR_UNSUPPORTED, "step: the step trains classifiers (cross_entropy or nll)");
  const ct_backend *be = ct_device_backend(dev);
  int on_device = ct_model_step_stats(m) != NULL;
  if (c->cuda_graph && !on_device)
    return ct_error(CT_ERR_INVALID_ARG, "--cuda-graph needs a model resident on a CUDA device (--device cuda), not %s",
                    ct_device_name(dev));
  if (c->cuda_graph && !be->graph_begin)
    return ct_error(CT_ERR_INVALID_ARG, "--cuda-graph: device %s cannot capture CUDA graphs (use --device cuda)",
                    ct_device_name(dev));
  size_t np;
  ct_model_params(m, &np);
  if (c->shard_hi && (c->shard_lo >= c->shard_hi || c->shard_hi > np ||
                      (opt && ct_optimizer_size(opt) != c->shard_hi - c->shard_lo)))
    return ct_error(CT_ERR_INVALID_ARG, "step: shard [%zu, %zu) of %zu parameters for an optimizer of %zu on %s",
                    c->shard_lo, c->shard_hi, np, opt ? ct_optimizer_size(opt) : 0, ct_device_name(dev));
  if (np && !ct_model_grads(m, NULL) && !c->shard_grads)
    return ct_error(CT_ERR_INVALID_ARG, "step: the model's gradients were left to a strategy (ZeRO-2 on %s) that "
                    "holds them no longer; prepare the model again", ct_device_name(dev));
  ct_step *s = calloc(1, sizeof *s);
  if (!s) return ct_error(CT_ERR_OUT_OF_MEMORY, "step: out of host memory");
  s->m = m, s->dev = dev, s->be = be, s->opt = opt, s->cfg = *c, s->on_device = on_device;
  s->own_gs = c->scaler;
  if (!s->own_gs.enabled) ct_grad_scaler_init(&s->own_gs, 0, 0, 1.0);
  s->gs = gs ? gs : &s->own_gs;
  if (!on_device) {
    *out = s;
    return CT_OK;
  }
  ct_status st = begin ? ct_device_train_begin(m, dev, opt, s->gs) : CT_OK;
  s->st = ct_model_step_stats(m);
  int32_t guard = !c->apply_nonfinite;
  if (st == CT_OK && begin) st = ct_device_copy(dev, &s->st->scaler.guard, NULL, &guard, sizeof guard);
  s->lag = ct_device_step_lag(c->lag);
  /* Without async copies and events nothing can run ahead. */
  if (!be->copy_async || !be->event_record || !be->event_wait) s->lag = 0;
  ct_lag_ring_init(&s->ring, s->lag);
  size_t bytes = sizeof(ct_step_stats) * (CT_STEP_LAG_MAX + 1);
  /* Pinned slots only where a copy runs ahead of the host. */
  s->slots = s->lag > 0 && be->host_alloc ? be->host_alloc(dev, bytes) : NULL;
  s->pinned = s->slots != NULL;
  if (!s->slots) s->slots = malloc(bytes);
  if (st == CT_OK && !s->slots)
    st = ct_error(CT_ERR_OUT_OF_MEMORY, "device step: cannot allocate %zu bytes for the statistics read-back", bytes);
  if (st != CT_OK) {
    ct_step_destroy(s);
    return st;
  }
  s->dropout = ct_model_has_dropout(m) && be->dropout_step_from != NULL;
  s->graph_want = s->graph_asked = c->cuda_graph;
  s->warmup_left = 2;
  if (s->graph_want && !ct_device_graph_audit(m, opt, s->note, sizeof s->note)) s->graph_want = 0;
  if (s->graph_want && ct_model_has_dropout(m) && !be->dropout_step_from) {
    snprintf(s->note, sizeof s->note, "device %s reads the dropout step only as a kernel argument", ct_device_name(dev));
    s->graph_want = 0;
  }
  /* A graph would need two step kinds (with and without the optimizer)
   * and a loss-gradient share that changes in an epoch's short last
   * group; accumulation trades step count for memory, where the launch
   * overhead a graph saves matters least. */
  if (c->accumulate > 1 && s->graph_asked) {
    snprintf(s->note, sizeof s->note, "--accumulate %d trains eagerly (the graph captures whole optimizer steps)",
             c->accumulate);
    s->graph_want = 0;
  }
  *out = s;
  return CT_OK;
}

ct_status ct_step_create(ct_model *m, ct_device *dev, ct_optimizer *opt, const ct_step_config *c, ct_step **out) {
  return step_new(m, dev, opt, c, NULL, 1, out);
}

void ct_step_destroy(ct_step *s) {
  if (!s) return;
  ct_model_set_grad_hooks(s->m, NULL, NULL, NULL);
  for (int k = 0; k < CT_STAGE_SLOTS; k++)
    if (s->graph[k]) s->be->graph_free(s->dev, s->graph[k]);
  if (s->pinned) s->be->host_free(s->dev, s->slots);
  else free(s->slots);
  free(s);
}

/* ---- the phases ---- */

/* Loaders yield [B, C, H, W]; a vector model (linreg, an mlp from a
 * model file with `input F`) takes [B, F], so hand it a flat view. */
static ct_tensor model_input(const ct_model *m, const ct_tensor *x) {
  ct_tensor v = *x;
  if (ct_model_input_ndim(m) == 1 && x->ndim > 2) {
    int64_t f = 1;
    for (int d = 1; d < x->ndim; d++) f *= x->shape[d];
    v.ndim = 2;
    v.shape[1] = f;
  }
  return v;
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
static ct_status upload_step_scalars(ct_step *s) {
  ct_step_stats *h = &s->slots[s->ring.pushed % (CT_STEP_LAG_MAX + 1)];
  int async = s->pinned && s->be->copy_async;
  if (!s->host_args && s->pos.last) {
    ct_optim_step_args(s->opt, s->cfg.step_sched, s->cfg.clip_grad_norm, &h->args);
    CT_TRY(async ? s->be->copy_async(s->dev, &s->st->args, 1, &h->args, 0, sizeof h->args)
                 : ct_device_copy(s->dev, &s->st->args, NULL, &h->args, sizeof h->args));
  }
  if (s->dropout) {
    h->dropout_step = s->pos.key;
    CT_TRY(async ? s->be->copy_async(s->dev, &s->st->dropout_step, 1, &h->dropout_step, 0, sizeof h->dropout_step)
                 : ct_device_copy(s->dev, &s->st->dropout_step, NULL, &h->dropout_step, sizeof h->dropout_step));
  }
  return CT_OK;
}

/* Host side of a device result: the counters that follow the skip
 * decision (a micro-batch that did not end its group made none: the
 * statistics' skip flag is still the previous step's). */
static void take_result(ct_step *s, const ct_step_stats *h, ct_step_result *r) {
  r->skipped = r->micro ? 0 : ct_fused_skip(h);
  if (!r->micro) ct_optimizer_commit_step(s->opt, r->skipped);
  ct_scaler_from_dev(&h->scaler, s->gs);
  r->loss = h->loss;
  r->top1 = h->top1;
  r->top5 = h->top5;
}

/* Waits for the oldest step in flight and fills *done. */
static ct_status read_oldest(ct_step *s, ct_step_result *done, int *have) {
  *have = 0;
  int slot = ct_lag_ring_pop(&s->ring, done);
  if (slot < 0) return CT_OK;
  if (s->lag > 0) CT_TRY(s->be->event_wait(s->dev, slot));
  take_result(s, &s->slots[slot], done);
  *have = 1;
  /* The schedule follows the taken steps as the optimizer's counters do,
   * so the next argument table starts from both. */
  if (s->cfg.step_sched && !done->micro && !done->skipped) CT_TRY(ct_scheduler_step(s->cfg.step_sched, s->opt));
  return CT_OK;
}

ct_status ct_step_begin(ct_step *s, ct_batch *b, const ct_step_pos *pos) {
  s->b = b;
  s->pos = *pos;
  ct_model_set_sample_span(s->m, pos->sample_offset, pos->sample_stride);
  s->out = NULL;
  s->lv = 0, s->top1 = s->top5 = 0, s->found_inf = 0;
  if (!s->on_device) {
    s->x = model_input(s->m, &b->x);
    s->y = b->y;
    return CT_OK;
  }
  s->have_pending = 0;
  if (s->ring.count == CT_STEP_LAG_MAX + 1) CT_TRY(read_oldest(s, &s->pending, &s->have_pending));
  /* Only a step that runs the optimizer takes its scalars from the host. */
  s->host_args = pos->last && needs_host_args(s->opt);
  if (s->host_args && s->ring.count > 0) {
    /* Its scalars come from the host's counters: nothing may be in flight. */
    if (s->have_pending || s->ring.count > 1)
      return ct_error(CT_ERR_INVALID_ARG, "device step: SGD momentum switched on with %d steps in flight", s->ring.count);
    CT_TRY(read_oldest(s, &s->pending, &s->have_pending));
  }
  /* The staging slot's previous user must be done before the copy
   * overwrites it (only possible with lag >= CT_STAGE_SLOTS). */
  int k = ct_stage_slot(&s->ring, CT_STAGE_SLOTS), wait = ct_stage_wait_slot(&s->ring, CT_STAGE_SLOTS);
  if (wait >= 0 && s->lag > 0) CT_TRY(s->be->event_wait(s->dev, wait));
  s->stage_k = k;
  CT_TRY(ct_device_stage(s->m, s->dev, b, k, &s->x, &s->y));
  return upload_step_scalars(s);
}

/* Dropout kernels read the mask step from stats->dropout_step while a
 * device step's passes run (a replayed graph then draws the current
 * step's masks); switched off after, so nothing else (evaluation) reads it. */
static ct_status dropout_from_stats(ct_step *s, int on) {
  return s->dropout ? s->be->dropout_step_from(s->dev, on ? &s->st->dropout_step : NULL) : CT_OK;
}

ct_status ct_step_forward(ct_step *s, const ct_tensor **out) {
  if (!s->b) return ct_error(CT_ERR_INVALID_ARG, "step: ct_step_forward needs a batch from ct_step_begin");
  CT_TRY(dropout_from_stats(s, 1));
  ct_status st = ct_model_forward(s->m, &s->x, 1, s->pos.key, &s->out);
  ct_status r = dropout_from_stats(s, 0);
  if (st == CT_OK) st = r;
  if (out) *out = s->out;
  return st;
}

ct_status ct_step_loss(ct_step *s) {
  if (!s->out || !s->b) return ct_error(CT_ERR_INVALID_ARG, "step: ct_step_loss needs ct_step_forward first");
  if (s->on_device) return ct_device_loss_and_hits(s->dev, s->cfg.loss, s->cfg.label_smoothing, s->out, &s->y, s->st);
  CT_TRY(ct_loss_forward(s->dev, s->cfg.loss, s->out, &s->y, s->cfg.label_smoothing, &s->lv));
  ct_batch_correct(s->out->data, s->y.data, s->b->n, ct_model_output_size(s->m), &s->top1, &s->top5);
  return CT_OK;
}

static ct_status grads_ready(void *ctx, int layer, size_t first, size_t count) {
  ct_step *s = ctx;
  return s->hooks.grads_ready(s->hooks.ctx, s, layer, first, count);
}

static ct_status grads_needed(void *ctx, int layer, size_t first, size_t count) {
  ct_step *s = ctx;
  return s->hooks.grads_needed(s->hooks.ctx, s, layer, first, count);
}

ct_status ct_step_backward(ct_step *s) {
  ct_model *m = s->m;
  ct_tensor dout;
  CT_TRY(ct_model_output_grad(m, &dout));
  /* A group's first backward writes every gradient with beta 0: no zero
   * fill (bench/results/2026-11-28-cpu-ab-step-overheads.md). */
  if (s->pos.first) ct_model_overwrite_grads(m);
  if (s->on_device) {
    /* The scale is read from the device's scaler; the micro-batch's share
     * of its group is a separate pass over the [N, C] loss gradient. */
    CT_TRY(ct_device_loss_backward(s->dev, s->cfg.loss, s->out, &s->y, s->cfg.label_smoothing, s->st, &dout));
    if (s->pos.factor != 1.0f) CT_TRY(s->be->axpby(s->dev, s->pos.factor, &dout, 0.0f, &dout));
  } else {
    /* The share rides on the loss gradient with the scale (factor is
     * exactly 1 without accumulation: the scale alone). */
    float g = s->pos.factor == 1.0f ? s->gs->scale : (float)((double)s->gs->scale * s->pos.factor);
    CT_TRY(ct_loss_backward(s->dev, s->cfg.loss, s->out, &s->y, s->cfg.label_smoothing, g, &dout));
  }
  int hook = s->pos.last && (s->hooks.grads_ready || s->hooks.grads_needed);
  if (hook)
    ct_model_set_grad_hooks(m, s->hooks.grads_needed ? grads_needed : NULL, s->hooks.grads_ready ? grads_ready : NULL, s);
  CT_TRY(dropout_from_stats(s, 1));
  ct_status st = ct_model_backward(m, &dout);
  ct_status r = dropout_from_stats(s, 0);
  if (hook) ct_model_set_grad_hooks(m, NULL, NULL, NULL);
  return st != CT_OK ? st : r;
}

ct_status ct_step_sync(ct_step *s) {
  return s->pos.last && s->hooks.sync ? s->hooks.sync(s->hooks.ctx, s) : CT_OK;
}

/* The reduce hook on one value of the step's statistics. */
static ct_status reduce(ct_step *s, ct_step_reduce what, void *p, ct_dtype dt, ct_device *where) {
  int64_t one = 1;
  ct_tensor t = ct_tensor_view(p, dt, 1, &one);
  t.device = where;
  return s->hooks.reduce(s->hooks.ctx, s, what, &t);
}

/* The gradients the optimizer reads: a sharded step checks, measures,
 * clips and applies its shard alone. */
static float *step_grads(ct_step *s, size_t *n) {
  float *g = ct_model_grads(s->m, n);
  if (!s->cfg.shard_hi) return g;
  *n = s->cfg.shard_hi - s->cfg.shard_lo;
  return s->cfg.shard_grads ? s->cfg.shard_grads : g + s->cfg.shard_lo;
}

ct_status ct_step_unscale_check_clip(ct_step *s) {
  if (!s->pos.last) return CT_OK;
  size_t np;
  float *grads = step_grads(s, &np);
  if (s->on_device) {
    /* The statistics pass; unscaling and clipping happen inside the fused
     * update, which reads the (reduced) statistics. */
    CT_TRY(ct_optimizer_grad_stats_device(s->opt, s->dev, grads, s->st));
    if (!s->hooks.reduce) return CT_OK;
    CT_TRY(reduce(s, CT_STEP_REDUCE_NONFINITE, &s->st->nonfinite, CT_I32, s->dev));
    return reduce(s, CT_STEP_REDUCE_SUMSQ, &s->st->sumsq, CT_F64, s->dev);
  }
  /* GradScaler's order: unscale (and check) before clipping. Without a
   * scaler the guard checks alone (apply_nonfinite 0). */
  CT_TRY(ct_grad_scaler_unscale(s->gs, s->dev, grads, np, &s->found_inf));
  if (!s->gs->enabled && !s->cfg.apply_nonfinite && np) {
    int64_t len = (int64_t)np;
    ct_tensor g = ct_tensor_view(grads, CT_F32, 1, &len);
    g.device = s->dev;
    CT_TRY(s->be->nonfinite(s->dev, &g, &s->found_inf));
  }
  if (s->hooks.reduce && (s->gs->enabled || !s->cfg.apply_nonfinite)) {
    /* Any replica's overflow skips the step on all of them (its own
     * gradients were left scaled, the others' unscaled: unused either way). */
    int32_t n = s->found_inf;
    CT_TRY(reduce(s, CT_STEP_REDUCE_NONFINITE, &n, CT_I32, NULL));
    s->found_inf = n != 0;
  }
  if (s->found_inf || s->cfg.clip_grad_norm <= 0) return CT_OK;
  if (!s->hooks.reduce) {
    ct_clip_grad_norm(grads, np, s->cfg.clip_grad_norm);
    return CT_OK;
  }
  double sumsq = ct_grad_sumsq(grads, np);
  CT_TRY(reduce(s, CT_STEP_REDUCE_SUMSQ, &sumsq, CT_F64, NULL));
  ct_clip_grad_to_norm(grads, np, sqrt(sumsq), s->cfg.clip_grad_norm);
  return CT_OK;
}

ct_status ct_step_update(ct_step *s) {
  if (!s->pos.last) return CT_OK;
  ct_model *m = s->m;
  size_t np;
  float *params = ct_model_params(m, NULL), *grads = step_grads(s, &np);
  size_t lo = s->cfg.shard_hi ? s->cfg.shard_lo : 0;
  if (s->on_device) {
    CT_TRY(ct_optimizer_update_device(s->opt, s->dev, params + lo, grads, s->st, s->host_args,
                                      s->cfg.clip_grad_norm));
    if (s->hooks.updated) CT_TRY(s->hooks.updated(s->hooks.ctx, s));
    /* O3 rounds the master weights through the low precision after every
     * update; rounding is idempotent, so it also runs after a skipped step
     * (the host does not know yet whether this one will be skipped). */
    return ct_model_round_params(m);
  }
  /* A step with inf/NaN gradients moves neither the weights nor the schedule. */
  if (!s->found_inf) {
    CT_TRY(ct_optimizer_step(s->opt, params + lo, grads));
    if (s->cfg.step_sched) CT_TRY(ct_scheduler_step(s->cfg.step_sched, s->opt));
  }
  if (s->hooks.updated) CT_TRY(s->hooks.updated(s->hooks.ctx, s));
  if (!s->found_inf) CT_TRY(ct_model_round_params(m));
  ct_grad_scaler_update(s->gs, s->found_inf);
  return CT_OK;
}

/* The reduce hook on a result's loss and hits. */
static ct_status reduce_metrics(ct_step *s, ct_step_result *r) {
  if (!s->hooks.reduce) return CT_OK;
  double v[4] = {r->loss * (double)r->n, (double)r->top1, (double)r->top5, (double)r->n};
  int64_t four = 4;
  ct_tensor t = ct_tensor_view(v, CT_F64, 1, &four);
  CT_TRY(s->hooks.reduce(s->hooks.ctx, s, CT_STEP_REDUCE_METRICS, &t));
  r->loss = v[3] > 0 ? v[0] / v[3] : NAN;
  r->top1 = (int64_t)v[1], r->top5 = (int64_t)v[2], r->n = (int64_t)v[3];
  return CT_OK;
}

/* Queues the read-back of the batch begun last and pops a result when
 * one is due (or was read before the batch was queued). */
static ct_status device_end(ct_step *s, ct_step_result *done, int *have) {
  int slot = ct_lag_ring_push(&s->ring, s->b, s->pos.step, s->b->n);
  if (!s->pos.last) s->ring.e[(s->ring.head + s->ring.count - 1) % (CT_STEP_LAG_MAX + 1)].micro = 1;
  if (s->lag > 0) {
    CT_TRY(s->be->copy_async(s->dev, &s->slots[slot], 0, s->st, 1, CT_STEP_STATS_READBACK));
    CT_TRY(s->be->event_record(s->dev, slot));
  } else {
    CT_TRY(ct_device_copy(NULL, &s->slots[slot], s->dev, s->st, CT_STEP_STATS_READBACK));
  }
  *have = s->have_pending;
  if (*have) *done = s->pending;
  s->have_pending = 0;
  if (!*have && ct_lag_ring_due(&s->ring)) CT_TRY(read_oldest(s, done, have));
  return CT_OK;
}

ct_status ct_step_end(ct_step *s, ct_step_result *done, int *have) {
  *have = 0;
  if (!s->b) return ct_error(CT_ERR_INVALID_ARG, "step: ct_step_end without a batch from ct_step_begin");
  if (s->on_device) CT_TRY(device_end(s, done, have));
  else {
    memset(done, 0, sizeof *done);
    done->batch = s->b, done->step = s->pos.step, done->n = s->b->n;
    done->loss = s->lv, done->top1 = s->top1, done->top5 = s->top5;
    done->skipped = s->pos.last && s->found_inf;
    done->micro = !s->pos.last;
    *have = 1;
  }
  s->b = NULL, s->out = NULL;
  return *have ? reduce_metrics(s, done) : CT_OK;
}

ct_status ct_step_drain(ct_step *s, ct_step_result *done, int *have) {
  *have = 0;
  if (!s->on_device) return CT_OK;
  CT_TRY(read_oldest(s, done, have));
  return *have ? reduce_metrics(s, done) : CT_OK;
}

/* Forward to update: what a CUDA graph captures. */
static ct_status phases(ct_step *s) {
  CT_TRY(ct_step_forward(s, NULL));
  CT_TRY(ct_step_loss(s));
  CT_TRY(ct_step_backward(s));
  CT_TRY(ct_step_sync(s));
  CT_TRY(ct_step_unscale_check_clip(s));
  return ct_step_update(s);
}

/* Batch norm's num_batches_tracked (host memory) for a training step the
 * host did not walk: a graph replay runs no layer code on the host. */
static void count_bn_batches(ct_model *m) {
  for (int i = 0; i < m->n_layers; i++)
    if (m->layers[i].counter) (*m->layers[i].counter)++;
}

/* Captures the phases on staging slot k into graph[k] and launches it; on
 * failure leaves the step to run eagerly (the capture executed nothing)
 * and notes why. */
static ct_status capture(ct_step *s, int k, int *ran) {
  ct_model *m = s->m;
  *ran = 0;
  /* The capture walks the layers (counting batch norm batches) without
   * running the step; a failed capture is followed by an eager step. */
  int64_t *counters = m->n_counters ? malloc(m->n_counters * sizeof *counters) : NULL;
  if (m->n_counters && !counters) return ct_error(CT_ERR_OUT_OF_MEMORY, "cuda graph: out of host memory");
  if (counters) memcpy(counters, m->counters, m->n_counters * sizeof *counters);
  ct_status st = s->be->graph_begin(s->dev);
  if (st == CT_OK) {
    ct_status bs = phases(s);
    void *g = NULL;
    ct_status es = s->be->graph_end(s->dev, &g);
    st = bs != CT_OK ? bs : es;
    if (st == CT_OK) {
      s->graph[k] = g;
      s->graph_n[k] = s->x.shape[0];
    } else if (g) {
      s->be->graph_free(s->dev, g);
    }
  }
  if (st != CT_OK) {
    snprintf(s->note, sizeof s->note, "capture failed, running eagerly: %s", ct_last_error());
    s->graph_want = 0;
    if (counters) memcpy(m->counters, counters, m->n_counters * sizeof *counters);
    free(counters);
    return CT_OK;
  }
  free(counters);
  CT_TRY(s->be->graph_launch(s->dev, s->graph[k]));
  *ran = 1;
  return s->hooks.replayed ? s->hooks.replayed(s->hooks.ctx, s) : CT_OK;
}

/* Replays slot k's graph, or captures it once the warm-up steps ran;
 * *ran = 0 when the phases must run eagerly. */
static ct_status graph_step(ct_step *s, int *ran) {
  *ran = 0;
  int k = s->stage_k;
  if (s->host_args || !s->pos.first || !s->pos.last) return CT_OK;
  if (s->graph[k] && s->b->n == s->graph_n[k]) {
    if (s->be->graph_launch(s->dev, s->graph[k]) == CT_OK) {
      *ran = 1;
      count_bn_batches(s->m);
      return s->hooks.replayed ? s->hooks.replayed(s->hooks.ctx, s) : CT_OK;
    }
    /* The scratch buffer moved (a larger evaluation batch): capture again. */
    s->be->graph_free(s->dev, s->graph[k]);
    s->graph[k] = NULL;
  }
  if (s->graph_want && !s->graph[k] && s->warmup_left <= 0 && s->b->n == s->m->max_batch) CT_TRY(capture(s, k, ran));
  return CT_OK;
}

ct_status ct_step_train(ct_step *s, ct_batch *b, const ct_step_pos *pos, ct_step_result *done, int *have) {
  *have = 0;
  CT_TRY(ct_step_begin(s, b, pos));
  int ran = 0;
  if (s->on_device && (s->graph_want || s->graph[0] || s->graph[1])) CT_TRY(graph_step(s, &ran));
  if (!ran) {
    CT_TRY(phases(s));
    if (s->on_device && s->warmup_left > 0) s->warmup_left--;
  }
  return ct_step_end(s, done, have);
}

/* ---- evaluation and prediction ---- */

ct_status ct_step_eval_batch(ct_model *m, ct_device *dev, const ct_batch *b, ct_loss_kind loss, float label_smoothing,
                             double *loss_sum, int64_t *top1, int64_t *top5, const ct_tensor **out) {
  const ct_tensor *o;
  double lv = 0;
  if (ct_model_step_stats(m)) {
    /* Resident on a device: loss and hits computed there, one read-back;
     * raw or index batches are transformed there first. */
    CT_TRY(ct_device_eval_batch(m, dev, b, loss, label_smoothing, &o, &lv, top1, top5));
  } else {
    ct_tensor x = model_input(m, &b->x);
    CT_TRY(ct_model_forward(m, &x, 0, 0, &o));
    CT_TRY(ct_loss_forward(dev, loss, o, &b->y, label_smoothing, &lv));
    ct_batch_correct(o->data, b->y.data, b->n, ct_model_output_size(m), top1, top5);
  }
  *loss_sum += lv * (double)b->n;
  if (out) *out = o;
  return CT_OK;
}

ct_status ct_step_predict_batch(ct_model *m, ct_device *dev, const ct_batch *b, float *probs) {
  const ct_tensor *o;
  const ct_backend *be = ct_device_backend(dev);
  size_t bytes = (size_t)(b->n * ct_model_output_size(m)) * sizeof(float);
  if (ct_model_step_stats(m)) {
    /* Staged into the model's block (and transformed there in the GPU
     * data modes); softmax in place over the output, then one copy. */
    CT_TRY(ct_device_forward_batch(m, dev, b, &o));
    ct_tensor p = *o;
    CT_TRY(be->softmax_fwd(dev, 0, o, &p));
    return ct_device_copy(NULL, probs, dev, p.data, bytes);
  }
  ct_tensor x = model_input(m, &b->x);
  CT_TRY(ct_model_forward(m, &x, 0, 0, &o));
  ct_tensor p = ct_tensor_2d(probs, CT_F32, b->n, ct_model_output_size(m));
  return be->softmax_fwd(dev, 0, o, &p);
}

/* ---- the internal entry points of device_step.h, on the one step ---- */

ct_status ct_device_trainer_create(ct_model *m, ct_device *dev, ct_optimizer *opt, ct_grad_scaler *gs,
                                   ct_loss_kind loss, float label_smoothing, double clip, ct_scheduler *step_sched,
                                   const ct_device_train_opts *o, ct_device_trainer **out) {
  *out = NULL;
  if (!ct_model_step_stats(m))
    return ct_error(CT_ERR_INVALID_ARG, "model '%s' is not resident on %s", ct_model_name(m), ct_device_name(dev));
  ct_step_config c;
  ct_step_config_default(&c);
  c.loss = loss, c.label_smoothing = label_smoothing, c.clip_grad_norm = clip, c.step_sched = step_sched;
  c.lag = o->lag, c.cuda_graph = o->cuda_graph;
  CT_TRY(step_new(m, dev, opt, &c, gs, 0, out));
  if (o->warmup > 0) (*out)->warmup_left = o->warmup;
  return CT_OK;
}

ct_status ct_device_train_step(ct_model *m, ct_device *dev, ct_optimizer *opt, const ct_batch *b, ct_loss_kind loss,
                               float label_smoothing, double clip, uint32_t step, ct_grad_scaler *gs, double *lv,
                               int64_t *top1, int64_t *top5, int *skipped) {
  ct_device_train_opts o = {0, 0, 0};
  ct_step *s;
  CT_TRY(ct_device_trainer_create(m, dev, opt, gs, loss, label_smoothing, clip, NULL, &o, &s));
  ct_step_pos pos = ct_step_pos_single(step);
  ct_step_result r;
  int have = 0;
  ct_status st = ct_step_train(s, (ct_batch *)b, &pos, &r, &have);
  ct_step_destroy(s);
  if (st != CT_OK) return st;
  if (!have) return ct_error(CT_ERR_INTERNAL, "device step: no result from a synchronous step");
  *skipped = r.skipped;
  *lv = r.loss;
  *top1 += r.top1;
  *top5 += r.top5;
  return CT_OK;
}
