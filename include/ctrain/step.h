/* One training step, the seam every strategy plugs into.
 *
 * A ct_step drives one model (or one replica or stage of it) on one
 * device through the phases of a training step, in this order:
 *
 *   ct_step_begin      the batch staged where the model lives (a device
 *                      model: copied into its staging slot) and its place
 *                      in the accumulation group
 *   ct_step_forward    the model's forward pass in training mode
 *   ct_step_loss       loss and top-1/top-5 hits of the batch
 *   ct_step_backward   the loss gradient (times the loss scale and the
 *                      micro-batch's share of its group) and the model's
 *                      backward; on the group's last micro-batch the
 *                      grads_ready hook fires per layer, in reverse order
 *   ct_step_sync       the sync hook: after the backward, before anything
 *                      reads the gradients
 *   ct_step_unscale_check_clip  the loss scaler's unscale and inf/NaN
 *                      check and the gradient norm (each reduced through
 *                      the reduce hook), then clipping
 *   ct_step_update     the optimizer, a per-step schedule and the loss
 *                      scaler's update; skipped (weights and schedule
 *                      unchanged) when any gradient was inf/NaN
 *   ct_step_end        the step's statistics: at once on a host model,
 *                      one or more steps later on a device model, whose
 *                      read-back lags so the host never waits for it
 *
 * The last three run only on the last micro-batch of an accumulation
 * group and are no-ops otherwise. ct_step_train runs all of them (on a
 * CUDA model, once warm, as one captured graph when asked for), and is
 * what ct_fit calls; a caller writing their own loop may call the phases
 * one by one instead. The same phases run on a host model (cpu, ref,
 * cpu:N) and on a model resident on a CUDA device, where the phases
 * queue kernels and the step's numbers come back with ct_step_end.
 *
 * Hooks are how strategies (data parallel, sharded optimizers) take part
 * without a copy of the step; a step without hooks calls none and pays
 * for none.
 */
#ifndef CTRAIN_STEP_H
#define CTRAIN_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/amp.h"
#include "ctrain/data.h"
#include "ctrain/loss.h"
#include "ctrain/model.h"
#include "ctrain/optim.h"
#include "ctrain/sched.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_step ct_step;

typedef struct ct_step_config {
  ct_loss_kind loss;           /* cross entropy or nll (the step trains classifiers) */
  float label_smoothing;
  double clip_grad_norm;       /* > 0: clip the global gradient norm to this */
  int accumulate;              /* micro-batches per optimizer step (0 or 1: off) */
  ct_grad_scaler scaler;       /* the loss scaler's starting state (enabled 0: none) */
  /* A schedule stepped once per taken optimizer step (OneCycleLR and
   * the per-iteration ones), or NULL; the step then owns its stepping. */
  ct_scheduler *step_sched;
  int lag;                     /* device models: steps the read-back may lag (0..2; fit uses 1) */
  int cuda_graph;              /* device models: capture the whole step once warm and replay it */
  /* 0 (default): without a loss scaler too, a step whose gradients hold
   * NaN or inf is not applied (ct_step_result.skipped, as the scaler's
   * skips); on a host model that is one more pass over the gradients.
   * 1: applied anyway (the weights then hold NaN). */
  int apply_nonfinite;
  /* A sharded optimizer state (ZeRO-1): the optimizer was
   * created for the shard_hi - shard_lo parameters [shard_lo, shard_hi)
   * of the flat buffer and updates only those; the gradient check, norm
   * and clipping run on that range (the reduce hook sums them over the
   * shards), and the updated hook then gathers the parameters. 0 and 0:
   * the whole buffer. */
  size_t shard_lo, shard_hi;
  /* Sharded gradients (ZeRO-2 on a device): the shard's reduced
   * gradients are these shard_hi - shard_lo values (in the model's
   * memory) rather than that range of ct_model_grads; NULL: there. */
  float *shard_grads;
} ct_step_config;

/* Defaults: cross entropy, no clipping, no accumulation, no scaler, lag 0. */
void ct_step_config_default(ct_step_config *c);

/* What the host learns about one step (or micro-batch) when its
 * statistics arrive. */
typedef struct ct_step_result {
  ct_batch *batch;   /* the batch given to ct_step_begin: release it to its loader now */
  int64_t step;      /* the optimizer step the batch belongs to */
  int64_t n;         /* samples in the batch */
  double loss;       /* the batch's mean loss */
  int64_t top1, top5;
  int skipped;       /* inf/NaN gradients: the update was skipped (by the scaler, or the guard without one) */
  int micro;         /* not the last micro-batch of its group: no optimizer step */
} ct_step_result;

/* What the reduce hook is asked to sum over all replicas. */
typedef enum ct_step_reduce {
  CT_STEP_REDUCE_NONFINITE = 0, /* one i32: non-zero when a gradient is inf/NaN */
  CT_STEP_REDUCE_SUMSQ,         /* one f64: the squared gradient norm (of the unscaled gradients) */
  CT_STEP_REDUCE_METRICS        /* four f64 (host): loss x n, top-1, top-5, n of a result; the
                                   * result then holds the sums (n too) */
} ct_step_reduce;

/* Hooks of a strategy; NULL members are not called. ctx is theirs. */
typedef struct ct_step_hooks {
  void *ctx;
  /* During the backward of the group's last micro-batch, in reverse
   * layer order, once per layer with parameters: the gradients
   * grads[first, first + count) of the flat gradient buffer
   * (ct_model_grads) are final. On a device model they are in device
   * memory and the kernels writing them are queued on the device's
   * stream, ahead of anything queued after this call. */
  ct_status (*grads_ready)(void *ctx, ct_step *s, int layer, size_t first, size_t count);
  /* In the same backward, before the kernels writing those gradients are
   * queued (a strategy that stages gradients in reused buffers makes
   * them wait here for the buffers). */
  ct_status (*grads_needed)(void *ctx, ct_step *s, int layer, size_t first, size_t count);
  /* Once after that backward, before anything reads the gradients. */
  ct_status (*sync)(void *ctx, ct_step *s);
  /* Combines vals over all replicas, in place. METRICS (host memory)
   * is summed. NONFINITE and SUMSQ (on the step's device; host memory
   * for host models) describe the gradients this replica holds after
   * the sync: a strategy whose replicas hold disjoint shards sums them,
   * one that all-reduced whole gradients has them agreeing already. */
  ct_status (*reduce)(void *ctx, ct_step *s, ct_step_reduce what, ct_tensor *vals);
  /* 1: the hooks only queue work on the device's stream (NCCL
   * collectives), which a CUDA graph captures and replays, and host work
   * that a replay may skip. 0: a step with hooks runs eagerly even when
   * cuda_graph was asked for, since a replay calls no host code. */
  int graph_safe;
  /* After each launch of the captured step (the capture's own first run
   * included): the host work a replay skips, such as checking on the
   * collectives the graph queues. */
  ct_status (*replayed)(void *ctx, ct_step *s);
  /* After the optimizer's update of the group's last micro-batch (also
   * when it was skipped), before the weights are read again: a strategy
   * that updates a shard gathers the parameters here. */
  ct_status (*updated)(void *ctx, ct_step *s);
} ct_step_hooks;

/* A step for m, prepared for training on dev (ct_model_prepare with
 * training = 1), updating it with opt (created for ct_model_params' n).
 * On a device model the optimizer's state moves to the device here
 * (after any checkpoint restore into opt), and the scaler's state with
 * it. The step keeps pointers to m, dev, opt and c->step_sched. */
ct_status ct_step_create(ct_model *m, ct_device *dev, ct_optimizer *opt, const ct_step_config *c, ct_step **out);
/* Frees the step; batches still in flight are not released (drain first). */
void ct_step_destroy(ct_step *s);
/* Installs hooks (NULL: none); hooks that are not graph_safe turn the
 * CUDA graph off (ct_step_graph_on's note says so). */
void ct_step_set_hooks(ct_step *s, const ct_step_hooks *h);

ct_model *ct_step_model(const ct_step *s);
ct_device *ct_step_device(const ct_step *s);
ct_optimizer *ct_step_optimizer(const ct_step *s);
/* The loss scaler's state as of the last result the host received. */
const ct_grad_scaler *ct_step_scaler(const ct_step *s);
/* Whether the model lives on its device (CUDA): the phases queue work and
 * ct_step_end reports with a lag. */
int ct_step_on_device(const ct_step *s);

/* Where a batch stands in training. */
typedef struct ct_step_pos {
  int64_t step;    /* the optimizer step the batch belongs to */
  uint32_t key;    /* dropout mask key (fit: step x accumulate + position in the group) */
  int first;       /* first micro-batch of its group: the backward overwrites the gradients */
  int last;        /* last micro-batch: the optimizer steps after its backward */
  float factor;    /* samples of the batch / samples of its group (1 without accumulation) */
  /* Where the batch's samples stand in the step's whole (global) batch:
   * sample i is number sample_offset + i x sample_stride. Dropout masks
   * are keyed by that number, so a batch split over ranks draws the masks
   * the whole batch would. 0 and 0 (or 1): the batch is the whole. */
  int64_t sample_offset, sample_stride;
} ct_step_pos;

/* The position of a batch when every batch is its own optimizer step. */
ct_step_pos ct_step_pos_single(int64_t step);
/* The position given to the last ct_step_begin (what hooks read). */
const ct_step_pos *ct_step_current(const ct_step *s);

/* The phases, in order (see above). b is held by the step until its
 * result comes back from ct_step_end (or ct_step_drain). */
ct_status ct_step_begin(ct_step *s, ct_batch *b, const ct_step_pos *pos);
ct_status ct_step_forward(ct_step *s, const ct_tensor **out);
ct_status ct_step_loss(ct_step *s);
ct_status ct_step_backward(ct_step *s);
ct_status ct_step_sync(ct_step *s);
ct_status ct_step_unscale_check_clip(ct_step *s);
ct_status ct_step_update(ct_step *s);
/* Finishes the phases of the batch begun last. *have = 1 when a result is
 * ready in *done: on a host model at once, on a device model the oldest
 * step in flight once more than the lag are. */
ct_status ct_step_end(ct_step *s, ct_step_result *done, int *have);

/* All phases of one batch. */
ct_status ct_step_train(ct_step *s, ct_batch *b, const ct_step_pos *pos, ct_step_result *done, int *have);
/* The oldest step still in flight (*have = 0 when none): call until *have
 * is 0 before anything reads the model or the optimizer on the host. */
ct_status ct_step_drain(ct_step *s, ct_step_result *done, int *have);

/* Forward in eval mode on b, with the loss and top-1/top-5 hits added to
 * *loss_sum (loss x n), *top1 and *top5. *out (may be NULL) is the
 * output, on the model's device, valid until the next forward. Works on
 * a model prepared for inference too; no step object is needed. */
ct_status ct_step_eval_batch(ct_model *m, ct_device *dev, const ct_batch *b, ct_loss_kind loss, float label_smoothing,
                             double *loss_sum, int64_t *top1, int64_t *top5, const ct_tensor **out);
/* Forward in eval mode on b and the softmax of the output into probs
 * [b->n, K] (host memory). */
ct_status ct_step_predict_batch(ct_model *m, ct_device *dev, const ct_batch *b, float *probs);

/* The read-back lag in effect (0 on a host model, or on a device that
 * cannot run ahead) and, once decided, whether a CUDA graph is in use;
 * *note gets a one-line reason when cuda_graph was asked for and is not
 * used (else NULL). */
int ct_step_lag(const ct_step *s);
int ct_step_graph_on(const ct_step *s, const char **note);

#ifdef __cplusplus
}
#endif
#endif
