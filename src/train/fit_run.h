/* What one ct_fit call holds from its start to its end, shared by the
 * loop (trainer.c) and its data-parallel parts (fit_dist.c). Internal. */
#ifndef CTRAIN_TRAIN_FIT_RUN_H
#define CTRAIN_TRAIN_FIT_RUN_H

#include "ctrain/history.h"
#include "ctrain/step.h"
#include "ctrain/tensorboard.h"
#include "ctrain/trainer.h"
#include "io/train_state.h"
#include "nn/layer.h"
#include "parallel/ddp.h"
#include "parallel/dp.h"

typedef struct fit_run {
  ct_model *m;
  ct_device *dev;
  ct_loader *train, *val;
  const ct_train_config *cfg;
  ct_fit_result *res;
  ct_optimizer *opt;
  ct_scheduler *sch;
  ct_history *hist;
  ct_tb_writer *tb;
  ct_step *step;
  float *best_state; /* host copy of parameters and buffers at the best epoch (restore_best) */
  ct_loop_state ls;
  ct_grad_scaler gs; /* the configured scaler, or a disabled one */
  const char *monitor;
  int maximize, acc, graph_told, have_val;
  int64_t batches, batch_size;
  ct_eval_result vres;
  int64_t guard_skips; /* steps passed over with CT_NONFINITE_SKIP */
  int logs_off;         /* a log writer failed: no more history files or events */
  ct_ddp *ddp;          /* data parallel (cfg->dist.comm), else NULL */
  ct_dp *dp;            /* DataParallel (cfg->dist.dp_count >= 2), else NULL */
  ct_norm_sync norm_sync[64]; /* SyncBatchNorm's sums: this rank's model (DDP) or each replica's (DP) */
  int rank, world;      /* 0 and 1 without it */
  size_t shard_lo, shard_hi; /* ZeRO-1: the parameters opt holds state for (0, 0: all) */
  float *shard_grads;        /* ZeRO-2 on a device: the shard's gradients (the model has no others) */
  int lead;             /* rank 0: writes checkpoints and logs */
} fit_run;

/* Data parallel's part of the start, after any restore (cfg->dist.comm):
 * the loaders' shares checked, the settings compared across ranks, the
 * DDP buckets, rank 0's weights on every rank, and under ZeRO-1 the
 * optimizer cut to this rank's shard. */
ct_status fit_dist_open(fit_run *f);
/* SyncBatchNorm (cfg->dist.sync_bn): every model of the run sums its
 * batch norms' statistics over the ranks (DDP) or the replicas (DP). */
ct_status fit_sync_bn_open(fit_run *f);
/* The optimizer a checkpoint holds: f->opt, or under ZeRO every rank's
 * shard gathered into a whole one (*tmp, the caller frees it; every rank
 * takes part). */
ct_status fit_ckpt_optimizer(fit_run *f, ct_optimizer **o, ct_optimizer **tmp);
/* Undoes the above before the step is destroyed (the replicas, the
 * buckets, the models' SyncBatchNorm). */
void fit_dist_close(fit_run *f);

#endif
