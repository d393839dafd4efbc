/* The device side of the one step (src/train/step.c, include/ctrain/step.h)
 * for a model resident on a device (CUDA): staging batches host->device,
 * the loss and accuracy on the device, the loss backward reading the scale
 * from the device's loss scaler, and the host bookkeeping of the lagged
 * read-back. Also the older internal entry points, now thin calls of the
 * one step, that tests and benchmarks use. Internal. */
#ifndef CTRAIN_TRAIN_DEVICE_STEP_H
#define CTRAIN_TRAIN_DEVICE_STEP_H

#include <stddef.h>

#include "ctrain/amp.h"
#include "ctrain/data.h"
#include "ctrain/loss.h"
#include "ctrain/model.h"
#include "ctrain/optim.h"
#include "ctrain/step.h"
#include "math/fused_step.h"

/* Before the first step (after any checkpoint restore): moves the
 * optimizer's state into the model's block (or its own allocation when
 * none was reserved) and writes the scaler state and the optimizer's step
 * count to the device. */
ct_status ct_device_train_begin(ct_model *m, ct_device *dev, ct_optimizer *opt, const ct_grad_scaler *gs);

/* One synchronous training step on batch b (the read-back waits for it).
 * Adds the batch's correct predictions to *top1 and *top5, sets *loss,
 * *skipped (the scaler found inf/NaN: weights, optimizer step count
 * unchanged) and brings gs's scale, growth tracker and skip count up to
 * the device's. */
ct_status ct_device_train_step(ct_model *m, ct_device *dev, ct_optimizer *opt, const ct_batch *b, ct_loss_kind loss,
                               float label_smoothing, double clip, uint32_t step, ct_grad_scaler *gs, double *lv,
                               int64_t *top1, int64_t *top5, int *skipped);

/* Copies batch b (f32, or raw uint8 / indices through its ct_gpu_data)
 * into staging slot `slot` of the model's block and returns device views
 * of it (x shaped as the model takes it). The copy goes on the copy
 * stream (the compute stream waits on its event), so it overlaps whatever
 * is queued: the caller guarantees no queued step still reads that slot
 * (ct_stage_wait_slot). */
ct_status ct_device_stage(ct_model *m, ct_device *dev, const ct_batch *b, int slot, ct_tensor *x, ct_tensor *y);
/* Loss into stats->loss and top-1/top-5 into stats->top1/top5. */
ct_status ct_device_loss_and_hits(ct_device *dev, ct_loss_kind loss, float ls, const ct_tensor *out, const ct_tensor *y,
                                  ct_step_stats *st);
/* The loss backward with the scale read from the device's scaler: the
 * host's copy of the scale may be a step behind the device's. */
ct_status ct_device_loss_backward(ct_device *dev, ct_loss_kind loss, const ct_tensor *out, const ct_tensor *y, float ls,
                                  const ct_step_stats *st, ct_tensor *dout);

/* Stages batch b (f32, or raw uint8 / indices through its ct_gpu_data)
 * into the model's first staging slot and runs the forward in eval mode;
 * *out is the device output, valid until the next forward. Nothing is read
 * back; the labels are staged but nothing reads them (predict). */
ct_status ct_device_forward_batch(ct_model *m, ct_device *dev, const ct_batch *b, const ct_tensor **out);

/* Forward in eval mode, loss and top-1/top-5 on the device, one read-back. */
ct_status ct_device_eval_batch(ct_model *m, ct_device *dev, const ct_batch *b, ct_loss_kind loss,
                               float label_smoothing, const ct_tensor **out, double *lv, int64_t *top1,
                               int64_t *top5);

/* ---- the lagged pipeline ---- */

/* Host bookkeeping of the steps in flight: a FIFO of at most
 * CT_STEP_LAG_MAX + 1 entries, each with the slot (pinned statistics copy
 * and event) its read-back uses. Pure host logic, tested on the CPU. */
typedef struct ct_lag_ring {
  int depth;        /* steps left in flight after a push (0 = synchronous) */
  int head, count;  /* oldest entry, entries in flight */
  int64_t pushed;   /* entries ever pushed: slot = pushed % slots */
  struct {
    ct_batch *batch;
    int64_t step, n;
    int slot;
    int micro;      /* see ct_step_result.micro; 0 from push */
  } e[CT_STEP_LAG_MAX + 1];
} ct_lag_ring;

/* depth is clamped to [0, CT_STEP_LAG_MAX]. */
void ct_lag_ring_init(ct_lag_ring *r, int depth);
/* Appends a step; returns its slot (0..CT_STEP_LAG_MAX), or -1 when the
 * ring is full (the caller must pop first). Slots rotate, so a slot is
 * reused only after the entry that had it was popped. */
int ct_lag_ring_push(ct_lag_ring *r, ct_batch *b, int64_t step, int64_t n);
/* 1 when more than depth steps are in flight: the oldest must be read. */
int ct_lag_ring_due(const ct_lag_ring *r);
/* Removes the oldest entry into *out (batch, step, n; the statistics are
 * the caller's) and returns its slot; -1 when empty. */
int ct_lag_ring_pop(ct_lag_ring *r, ct_step_result *out);

/* Double-buffered batch staging (the slots of exec/device_state.h): the
 * staging slot the next pushed step uses (steps take slots in turn), and
 * the read-back slot (event) the host must wait on before copying that
 * step's batch, because the step that last used the staging slot is still
 * in flight; -1 when nothing is. With lag <= 1 and two staging slots the
 * host never waits here (the read-back already did); with lag 2 it waits
 * for step k-1 before copying batch k+1, so step k stays queued. Pure host
 * logic, tested on the CPU. */
int ct_stage_slot(const ct_lag_ring *r, int stage_slots);
int ct_stage_wait_slot(const ct_lag_ring *r, int stage_slots);

/* Whether a model has an active dropout layer (p > 0): its masks need the
 * step from device memory under a CUDA graph. */
int ct_model_has_dropout(const ct_model *m);

/* How far behind the read-back may run: `wanted`, clamped to
 * [0, CT_STEP_LAG_MAX]. The host queues a step before it knows whether
 * the loss scaler skipped the ones in flight, so everything that depends
 * on that (Adam's and SGD's step-count scalars, and the learning rate and
 * momentum of a per-step schedule) comes from the device-picked row of
 * ct_step_args. */
int ct_device_step_lag(int wanted);

/* Whether m's step can be captured as a CUDA graph and replayed: every
 * argument that changes per step must reach the kernels through device
 * memory. Returns 1, or 0 with a one-line reason in why (the first
 * argument that would be replayed stale: today only an SGD momentum
 * buffer not yet allocated; dropout's step is read from device memory and
 * batch norm's counter is counted on the host per replay). */
int ct_device_graph_audit(const ct_model *m, const ct_optimizer *opt, char *why, size_t cap);

/* The per-step inputs of a captured step and where a replay takes each
 * from, for docs/GPU.md and the audit test: name, source, and whether a
 * graph replays it correctly. */
typedef struct ct_graph_arg {
  const char *name;
  const char *source;
  int replay_ok;
} ct_graph_arg;
const ct_graph_arg *ct_device_graph_args(size_t *count);

/* The step object under its older name (ct_device_trainer_*: the step of
 * step.h with the caller's loss scaler, updated as results arrive). */
typedef ct_step ct_device_trainer;

typedef struct ct_device_train_opts {
  int lag;         /* read-back lag (ct_device_step_lag decides the effective one) */
  int cuda_graph;  /* 1: capture the step once warm and replay it */
  int warmup;      /* eager steps before the capture (default 2 when 0) */
} ct_device_train_opts;

/* A step on m (resident on dev) after ct_device_train_begin; gs is the
 * host's copy of the scaler, brought up to the device's as results
 * arrive; step_sched as ct_step_config's. */
ct_status ct_device_trainer_create(ct_model *m, ct_device *dev, ct_optimizer *opt, ct_grad_scaler *gs,
                                   ct_loss_kind loss, float label_smoothing, double clip, ct_scheduler *step_sched,
                                   const ct_device_train_opts *o, ct_device_trainer **out);
/* One micro-batch's place in its group: ct_step_pos. */
typedef ct_step_pos ct_micro_step;
static inline ct_status ct_device_trainer_step(ct_device_trainer *t, ct_batch *b, int64_t step, ct_step_result *done,
                                               int *have) {
  ct_step_pos p = ct_step_pos_single(step);
  return ct_step_train(t, b, &p, done, have);
}
static inline ct_status ct_device_trainer_step_micro(ct_device_trainer *t, ct_batch *b, const ct_micro_step *ms,
                                                     ct_step_result *done, int *have) {
  return ct_step_train(t, b, ms, done, have);
}
static inline ct_status ct_device_trainer_drain(ct_device_trainer *t, ct_step_result *done, int *have) {
  return ct_step_drain(t, done, have);
}
static inline int ct_device_trainer_lag(const ct_device_trainer *t) { return ct_step_lag(t); }
static inline int ct_device_trainer_graph_on(const ct_device_trainer *t, const char **note) {
  return ct_step_graph_on(t, note);
}
static inline void ct_device_trainer_destroy(ct_device_trainer *t) { ct_step_destroy(t); }

#endif
