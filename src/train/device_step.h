/* The training step on a device that keeps the model resident (CUDA):
 * batches staged host->device, loss and accuracy computed on the device,
 * the loss backward reading the scale from the device's loss scaler, the
 * fused optimizer and the scaler deciding on the device, and the step's
 * statistics read back with a lag so the host never waits for the GPU
 * inside an epoch; optionally the whole step captured once as a CUDA graph
 * and replayed. The trainer (trainer.c) takes this path when
 * ct_model_step_stats() is non-NULL; the host path is unchanged. Internal. */
#ifndef CTRAIN_TRAIN_DEVICE_STEP_H
#define CTRAIN_TRAIN_DEVICE_STEP_H

#include <stddef.h>

#include "ctrain/amp.h"
#include "ctrain/data.h"
#include "ctrain/loss.h"
#include "ctrain/model.h"
#include "ctrain/optim.h"
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

/* What the host learns about one step when its statistics arrive. */
typedef struct ct_step_result {
  ct_batch *batch;   /* the step's batch, held until now: release it to its loader */
  int64_t step;      /* the trainer's step index passed when it was queued */
  int64_t n;         /* samples in the batch */
  double loss;
  int64_t top1, top5;
  int skipped;       /* the loss scaler skipped the update */
  int micro;         /* a micro-batch that did not end its accumulation group: no optimizer step */
} ct_step_result;

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

/* Double-buffered batch staging (the slots of nn/device_state.h): the
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

typedef struct ct_device_trainer ct_device_trainer;

typedef struct ct_device_train_opts {
  int lag;         /* read-back lag (ct_device_step_lag decides the effective one) */
  int cuda_graph;  /* 1: capture the step once warm and replay it */
  int warmup;      /* eager steps before the capture (default 2 when 0) */
} ct_device_train_opts;

/* Creates the pipeline for m (resident on dev) after ct_device_train_begin;
 * gs is the host's copy of the scaler, brought up to the device's as
 * results arrive. step_sched: a schedule stepped once per optimizer step
 * (OneCycleLR and the per-iteration ones), or NULL; the trainer then
 * steps it itself, when a step's result arrives and that step was not
 * skipped (GradScaler's rule: a skipped step moves neither the weights
 * nor the schedule), and the steps queued meanwhile take their learning
 * rate from the row of ct_step_args that matches how many of the steps in
 * flight were taken. The caller must not step it during the run. */
ct_status ct_device_trainer_create(ct_model *m, ct_device *dev, ct_optimizer *opt, ct_grad_scaler *gs,
                                   ct_loss_kind loss, float label_smoothing, double clip, ct_scheduler *step_sched,
                                   const ct_device_train_opts *o, ct_device_trainer **out);
/* Queues one step on b (held until its result arrives) with dropout step
 * `step`. When the oldest step in flight is due, waits for it and fills
 * *done (*have = 1): the optimizer's host counters and gs follow its skip
 * decision. Batches of another size than the captured one run eagerly. */
ct_status ct_device_trainer_step(ct_device_trainer *t, ct_batch *b, int64_t step, ct_step_result *done, int *have);

/* Declares gradient accumulation (accumulate > 1 micro-batches per
 * optimizer step) before the first step: the CUDA graph is then not used
 * (steps run eagerly; ct_device_trainer_graph_on's note says why).
 * accumulate <= 1 changes nothing. */
void ct_device_trainer_set_accumulate(ct_device_trainer *t, int accumulate);

/* One micro-batch of a gradient accumulation group (ct_train_config's
 * accumulate; src/train/accumulate.h says where a batch stands). */
typedef struct ct_micro_step {
  int64_t step;    /* the optimizer step the group is (results carry it) */
  uint32_t key;    /* dropout mask key: step * accumulate + position in the group */
  int first;       /* zero the gradients before the backward */
  int last;        /* then unscale/check, clip, the fused optimizer and the scaler: the group's step */
  float factor;    /* samples of the batch / of the group: multiplies the loss gradient (1: untouched) */
} ct_micro_step;

/* As ct_device_trainer_step for one micro-batch: forward, loss and a
 * backward that adds into the gradients (zeroing them first when
 * ms->first); only ms->last runs the optimizer, and only its result has
 * micro = 0 (commits the optimizer's host counters, carries the skip
 * decision). The device's loss scale is the same for the whole group (it
 * changes only in the fused step), and the fused step's inf/NaN check and
 * clipping norm read the accumulated gradient, so they cover the group.
 * ct_device_trainer_step(t, b, s, ...) is this with {s, s, 1, 1, 1}. */
ct_status ct_device_trainer_step_micro(ct_device_trainer *t, ct_batch *b, const ct_micro_step *ms,
                                       ct_step_result *done, int *have);
/* Reads back the oldest step still in flight (*have = 0 when none). Call
 * until *have is 0 before anything reads the model or the optimizer on the
 * host side (evaluation, checkpoints, the end of an epoch). */
ct_status ct_device_trainer_drain(ct_device_trainer *t, ct_step_result *done, int *have);
/* The effective lag and, once decided, whether the graph is in use; *note
 * gets a one-line reason when --cuda-graph was asked for and is not used
 * (NULL otherwise). */
int ct_device_trainer_lag(const ct_device_trainer *t);
int ct_device_trainer_graph_on(const ct_device_trainer *t, const char **note);
/* Frees the graph and the pinned slots; batches still in flight are not
 * released (drain first). */
void ct_device_trainer_destroy(ct_device_trainer *t);

#endif
