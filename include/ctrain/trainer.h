/* The training loop: fit, evaluate, predict (Keras-like).
 *
 * ct_fit trains a prepared model on a training loader for a number of
 * epochs, evaluating on a validation loader after each epoch, with an
 * optimizer, an optional LR schedule (stepped per step or per epoch, or on
 * a monitored metric for ReduceLROnPlateau), gradient clipping, early
 * stopping, per-epoch and keep-best checkpoints, exact resume, a progress
 * display, history files and TensorBoard logs. It never prints except to
 * the progress stream the caller passes.
 */
#ifndef CTRAIN_TRAINER_H
#define CTRAIN_TRAINER_H

#include <signal.h>
#include <stdio.h>

#include "ctrain/amp.h"
#include "ctrain/data.h"
#include "ctrain/dist.h"
#include "ctrain/loss.h"
#include "ctrain/model.h"
#include "ctrain/optim.h"
#include "ctrain/sched.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_eval_result {
  double loss;      /* mean over samples */
  double accuracy;  /* top-1 (classification losses only) */
  double top5;      /* top-5 accuracy (0 when fewer than 5 classes) */
  int64_t samples;
  double seconds;
} ct_eval_result;

/* The largest ct_train_config.accumulate (--accumulate). */
#define CT_ACCUMULATE_MAX 1024

/* Optimizer steps in an epoch of `batches` loader batches: ceil(batches /
 * accumulate) (batches when accumulate <= 1). */
int64_t ct_accum_steps_per_epoch(int accumulate, int64_t batches);

typedef struct ct_train_config {
  int epochs;               /* default 1 */
  int64_t max_steps;        /* 0 = no limit; stops mid-epoch and checkpoints */
  ct_loss_kind loss;        /* default cross entropy */
  float label_smoothing;
  double clip_grad_norm;    /* 0 = off */
  uint64_t seed;            /* dropout masks */
  ct_optim_config optim;
  int use_scheduler;
  ct_sched_config sched;
  int sched_per_step;       /* 1: step the schedule every optimizer step */
  /* Early stopping (Keras EarlyStopping) on monitor ("val_loss",
   * "val_accuracy", "loss", "accuracy"); patience 0 = off. */
  const char *monitor;      /* also drives ReduceLROnPlateau and keep-best */
  int monitor_max;          /* 1: larger is better (accuracy) */
  int patience;
  double min_delta;
  int restore_best;
  /* Files; any may be NULL. */
  const char *checkpoint_dir; /* last.safetensors, epoch-NNNN.safetensors, best.safetensors */
  int keep_last;              /* epoch checkpoints kept (default 3) */
  int resume;                 /* continue from checkpoint_dir/last.safetensors */
  const char *config_id;      /* text recorded in checkpoints; resume refuses a different one */
  const char *log_dir;        /* TensorBoard events + history.csv/json */
  const char *settings_text;  /* written to TensorBoard as the run's settings */
  /* Mixed precision loss scaling (amp.h; zeroed = off). The model's
   * precision is set on the model (ct_model_set_precision) before prepare.
   * With the scaler on, the loss gradient is multiplied by the scale, the
   * gradients are checked and unscaled before clipping, a step with
   * inf/NaN gradients is skipped (optimizer and per-step schedule do not
   * advance) and the scale follows GradScaler; its state is checkpointed. */
  ct_grad_scaler scaler;
  FILE *progress;             /* Keras-like progress; NULL = silent */
  int progress_tty;
  /* 1: capture the training step as a CUDA graph after two eager steps and
   * replay it (model resident on a CUDA device; refused elsewhere; falls
   * back to eager steps with a one-line note on cfg->progress when the
   * model's step cannot be replayed, see docs/GPU.md). */
  int cuda_graph;
  /* Gradient accumulation (PyTorch's `(loss / N).backward()` every batch,
   * `opt.step(); opt.zero_grad()` every N): 0 or 1 = off, else 2..1024
   * (CT_ERR_INVALID_ARG outside [0, 1024]). One optimizer step per group
   * of `accumulate` consecutive loader batches (micro-batches); groups
   * start at the epoch's first batch and the last group of an epoch may be
   * shorter (fewer batches, a partial last batch): it steps at the epoch's
   * end and nothing carries into the next epoch. The gradients of a group
   * add up, each micro-batch's loss gradient weighted by n_i / n_group
   * (its samples over the group's), so a step follows the mean loss over
   * the group's samples: equal, up to summation order, to one batch of
   * all of them for models without batch norm (batch norm normalises and
   * counts per micro-batch, as in PyTorch). Optimizer steps are what
   * max_steps, per-step schedules, the step numbers in TensorBoard
   * (train/loss_step logs the group's mean loss) and the loss scaler's
   * growth interval count; clipping and the scaler's unscale and inf/NaN
   * check run once per group on the accumulated gradient, so a non-finite
   * value in any micro-batch skips the group's step and backs the scale
   * off once. Dropout masks are keyed by the optimizer step and each
   * sample's number in the group (distinct per micro-batch, the same
   * after a resume, and the same for one batch of the group's samples).
   * Checkpoints record the value and resume refuses another one; epoch-end
   * and max_steps checkpoints always fall on a group boundary. Progress,
   * loss and accuracy are per sample as without accumulation; on a CUDA
   * device cuda_graph trains eagerly (see docs/GPU.md). */
  int accumulate;
  /* Read at every optimizer-step boundary (the last micro-batch of a
   * group) when not NULL: a non-zero value stops fit there. The steps in
   * flight finish, a mid-epoch checkpoint (resumable exactly) is written
   * when checkpoint_dir is set, no validation runs, and fit returns CT_OK
   * with ct_fit_result.stopped_by set to the value. A signal handler may
   * set it (ctrain train does for SIGINT, SIGTERM, SIGHUP); the library
   * installs no handler. */
  volatile sig_atomic_t *stop_request;
  /* Without a loss scaler, a step whose loss or gradients are NaN or inf
   * is never applied (ct_step_config.apply_nonfinite 0); then
   * CT_NONFINITE_STOP (default) ends fit with CT_ERR_INVALID_ARG naming
   * the step and the first gradient holding them, CT_NONFINITE_SKIP goes
   * on (counted in skipped_steps). With a scaler, the scaler decides. At
   * every epoch end and before a mid-epoch checkpoint the weights are
   * checked too (a ReLU fused into oneDNN's convolution turns NaN into 0,
   * so NaN weights can leave the loss finite): non-finite weights end fit
   * with the first tensor named, whatever this says. */
  int on_nonfinite;
  /* Data parallel (dist.h): with dist.comm set, every rank of it calls
   * ct_fit with the same settings and its share of the data (the loaders'
   * num_replicas and rank: the training loader padded, the validation
   * loader every sample once), on a host model. Each rank's batch_size
   * is its part of the global batch; the loss gradient carries the
   * rank's share, the gradients are summed over ranks during the
   * backward, so a step equals one device's step on the global batch up
   * to summation order. The settings are compared at the start (refused
   * with the first difference named), rank 0's weights broadcast, the
   * metrics and the evaluation summed over ranks, stop requests agreed
   * on, and only rank 0 writes checkpoints and logs. */
  ct_dist_config dist;
} ct_train_config;

enum { CT_NONFINITE_STOP = 0, CT_NONFINITE_SKIP = 1 };

void ct_train_config_default(ct_train_config *c);

typedef struct ct_fit_result {
  int epochs_run;
  int64_t steps;            /* optimizer steps (one per accumulation group) */
  double train_loss;        /* mean of the last epoch */
  double train_accuracy;
  ct_eval_result val;       /* after the last epoch (or the restored best); NaN when none ran */
  double images_per_second; /* training only, evaluation excluded */
  double *epoch_seconds;    /* [epochs_run], owned; free with ct_fit_result_free */
  struct ct_history *history; /* per-epoch metrics of the whole run (resumed epochs too), owned */
  int stopped_early;
  int stopped_by;           /* the stop_request value that stopped fit (a signal number), else 0 */
  int resumed_from_epoch;   /* -1 when not resumed */
  /* 1: resumed a run that had already trained all its epochs; nothing was
   * trained, train_loss/train_accuracy are its last epoch's (history) and
   * val is evaluated again on its final weights. */
  int already_done;
  /* A log writer (history.csv/json, TensorBoard) that failed, a full disk
   * say: its message, also written to cfg->progress when set. Logging
   * stopped there and training went on (checkpoints stay fatal). "" if
   * none failed. */
  char log_warning[512];
  size_t peak_memory_bytes; /* step arena (low-precision weight copies included) + parameters, gradients, optimizer state */
  /* The device's own high-water mark at the end (ct_device_mem_peak):
   * everything ctrain allocated on it through its allocator. On cuda the
   * model's block (plan, state, input staging), the backend's scratch
   * buffer, the buffers that time cuDNN graph plans, and a data set kept
   * on the GPU (not what cuDNN allocates inside its own algorithm search);
   * on the CPU the step arena and temporaries (parameters live in host
   * memory there). */
  size_t device_peak_bytes;
  int64_t skipped_steps;    /* optimizer steps skipped by the loss scaler (whole run) */
  double loss_scale;        /* the scaler's scale at the end (1 when off) */
} ct_fit_result;

void ct_fit_result_free(ct_fit_result *r);

/* Trains m (prepared for training on dev) on train; val may be NULL. */
ct_status ct_fit(ct_model *m, ct_device *dev, ct_loader *train, ct_loader *val, const ct_train_config *cfg,
                 ct_fit_result *res);
/* Mean loss and accuracy of m over one pass of the loader (eval mode).
 * A loader in CT_LOADER_RAW_U8 or CT_LOADER_INDICES mode needs m resident
 * on a CUDA device: its batches are transformed there (the same kernel and
 * values as the loader's CPU transform); when no device side is attached to
 * the loader yet, one is made for this pass (in index mode that uploads the
 * whole split) and freed at its end. On a device without the transform the
 * call fails with CT_ERR_UNSUPPORTED before any batch is computed. */
ct_status ct_evaluate(ct_model *m, ct_device *dev, ct_loader *l, ct_loss_kind loss, float label_smoothing,
                      ct_eval_result *res);
/* Runs the model in eval mode over the loader and calls fn for every
 * sample with its softmax probabilities [classes] and the label. Loaders
 * in the GPU data modes are handled as by ct_evaluate. */
typedef ct_status (*ct_predict_fn)(void *ctx, int64_t index, const float *probs, int64_t classes, int64_t label);
ct_status ct_predict(ct_model *m, ct_device *dev, ct_loader *l, ct_predict_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
