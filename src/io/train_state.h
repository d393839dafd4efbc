/* The training loop's state that a checkpoint stores beyond the tensors
 * (epoch, position in the epoch, the running sums of the epoch's metrics,
 * optimizer and scheduler scalars, the loss scaler, early-stopping
 * counters, history), saved as safetensors metadata, and read back
 * checked: every number whole and in range before anything is loaded,
 * and a checkpoint made with other settings refused with the difference
 * named. Internal (ct_fit's). */
#ifndef CTRAIN_IO_TRAIN_STATE_H
#define CTRAIN_IO_TRAIN_STATE_H

#include <stdint.h>

#include "ctrain/amp.h"
#include "ctrain/history.h"
#include "ctrain/model.h"
#include "ctrain/optim.h"
#include "ctrain/sched.h"
#include "ctrain/trainer.h"

/* The loop's own state, all of it saved in checkpoints. */
typedef struct ct_loop_state {
  int64_t epoch, batch, step;
  double loss_sum;
  int64_t correct, top5, seen;
  double best;
  int64_t best_epoch, bad_epochs;
  double train_seconds;
  int64_t train_images;
  /* The current accumulation group's loss sum and samples (for its
   * train/loss_step value). Not checkpointed: a checkpoint never falls
   * inside a group. */
  double group_loss;
  int64_t group_n;
  /* Data-parallel ranks of the run that saved it (1: one process);
   * checkpointed as its own key, "world_size" (absent: 1). batch counts
   * that many ranks' batches. */
  int64_t world;
} ct_loop_state;

/* Writes dir/file: m's and o's tensors, and as metadata the run's
 * settings (cfg->config_id, seed, accumulate), ls, o's and sc's scalars
 * (sc may be NULL), gs and the history h. */
ct_status ct_train_state_save(const char *dir, const char *file, ct_model *m, ct_optimizer *o, ct_scheduler *sc,
                              const ct_loop_state *ls, const ct_history *h, const ct_train_config *cfg,
                              const ct_grad_scaler *gs);
/* Restores everything ct_train_state_save wrote from dir/last.safetensors,
 * after checking that its settings match cfg's and that every number
 * reads: a refused file changes nothing. */
ct_status ct_train_state_restore(const char *dir, ct_model *m, ct_optimizer *o, ct_scheduler *sc, ct_loop_state *ls,
                                 ct_history *h, const ct_train_config *cfg, ct_grad_scaler *gs);
/* Keeps the newest keep_last epoch checkpoints (epochs epoch-keep_last+1
 * .. epoch) of dir; keep_last <= 0 keeps all. */
void ct_train_state_prune(const char *dir, int64_t epoch, int keep_last);
/* Creates dir when missing; CT_ERR_IO when it cannot be, or is no directory. */
ct_status ct_ensure_dir(const char *dir);

#endif
