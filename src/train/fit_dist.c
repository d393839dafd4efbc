/* ct_fit's data-parallel parts: the start of DDP (settings compared,
 * weights broadcast, ZeRO-1's shard), SyncBatchNorm's sums, and the
 * whole optimizer a ZeRO checkpoint holds. */
#include "train/fit_run.h"

#include <string.h>

#include "exec/exec_impl.h"

/* The settings every rank must share, compared at the start: a rank
 * started with another model, batch, precision, data set or seed would
 * train a different run, or wait in a collective the others never start. */
static ct_status dist_check(fit_run *f) {
  const ct_train_config *cfg = f->cfg;
  const ct_loader_options *lo = ct_loader_get_options(f->train);
  uint64_t model = 0;
  for (int i = 0; i < ct_model_state_count(f->m); i++) {
    const ct_state_entry *e = ct_model_state(f->m, i);
    model = ct_dist_hash(e->name, strlen(e->name) + 1, model);
    model = ct_dist_hash(e->value.shape, (size_t)e->value.ndim * sizeof e->value.shape[0], model);
  }
  uint64_t lr, mb, mb1;
  memcpy(&lr, &cfg->optim.lr, sizeof lr);
  /* Buckets must match: each is one collective every rank calls. */
  memcpy(&mb, &cfg->dist.bucket_mb, sizeof mb);
  memcpy(&mb1, &cfg->dist.first_bucket_mb, sizeof mb1);
  const ct_dist_field fields[] = {
      {"model (parameter names and shapes)", model, 1},
      {"batch size", (uint64_t)lo->batch_size, 0},
      {"training samples", (uint64_t)ct_dataset_size(ct_loader_dataset(f->train)), 0},
      {"test samples", f->val ? (uint64_t)ct_dataset_size(ct_loader_dataset(f->val)) : 0, 0},
      {"precision", (uint64_t)ct_model_precision(f->m), 0},
      {"accumulate", (uint64_t)f->acc, 0},
      {"epochs", (uint64_t)cfg->epochs, 0},
      {"seed", cfg->seed, 0},
      {"data seed", lo->seed, 0},
      {"optimizer", (uint64_t)cfg->optim.kind, 0},
      {"learning rate", lr, 1},
      {"resume", (uint64_t)cfg->resume, 0},
      {"bucket size (--bucket-mb)", mb, 1},
      {"first bucket size", mb1, 1},
      {"ZeRO stage (--zero)", (uint64_t)cfg->dist.zero, 0},
      {"SyncBatchNorm (--sync-bn)", (uint64_t)cfg->dist.sync_bn, 0},
      {"settings", cfg->config_id ? ct_dist_hash(cfg->config_id, strlen(cfg->config_id), 0) : 0, 1},
  };
  return ct_dist_check_same(cfg->dist.comm, fields, (int)(sizeof fields / sizeof fields[0]));
}

ct_status fit_dist_open(fit_run *f) {
  ct_comm *c = f->cfg->dist.comm;
  f->rank = ct_comm_rank(c), f->world = ct_comm_size(c), f->lead = f->rank == 0;
  const ct_loader *ls[2] = {f->train, f->val};
  for (int i = 0; i < 2; i++) {
    if (!ls[i]) continue;
    const ct_loader_options *o = ct_loader_get_options(ls[i]);
    int n = o->num_replicas > 1 ? o->num_replicas : 1;
    if (n != f->world || (n > 1 && o->rank != f->rank))
      return ct_error(CT_ERR_INVALID_ARG, "fit: the %s loader reads share %d of %d, but this is rank %d of %d",
                      i ? "validation" : "training", n > 1 ? o->rank : 0, n, f->rank, f->world);
    /* Every rank must run the same steps (collectives), and an evaluation
     * must not count padded duplicates. */
    if (n > 1 && !i && o->dist_tail == CT_DIST_EXACT)
      return ct_error(CT_ERR_INVALID_ARG, "fit: the training loader's CT_DIST_EXACT shares differ in length between "
                      "ranks; use CT_DIST_PAD or CT_DIST_DROP");
    if (n > 1 && i && o->dist_tail != CT_DIST_EXACT)
      return ct_error(CT_ERR_INVALID_ARG, "fit: the validation loader pads or drops samples; give it CT_DIST_EXACT "
                      "so the evaluation counts every sample once");
  }
  CT_TRY(dist_check(f));
  CT_TRY(ct_ddp_create(c, f->m, &f->cfg->dist, &f->ddp));
  /* ZeRO-2's slots hold one micro-batch's gradients at a time. */
  if (ct_ddp_shard_grads(f->ddp) && f->acc > 1)
    return ct_error(CT_ERR_UNSUPPORTED, "fit: ZeRO-2 (--zero 2) on %s keeps no whole gradients to accumulate %d "
                    "micro-batches in (%s); use --zero 1", ct_device_name(f->dev), f->acc,
                    f->cfg->resume ? "resuming on fewer ranks accumulates to keep the global batch" : "--accumulate");
  CT_TRY(ct_ddp_broadcast_state(f->ddp));
  if (!f->cfg->dist.zero) return CT_OK;
  /* ZeRO: from here on this rank keeps its shard of the optimizer state
   * only. A fresh run's whole optimizer was made without state (fit
   * asks for one parameter, so no rank ever holds it all); a resumed
   * one's shard is cut from the restored state. */
  size_t lo, hi;
  ct_ddp_shard(f->ddp, &lo, &hi);
  ct_optimizer *sh;
  CT_TRY(ct_optimizer_create(ct_optimizer_get_config(f->opt), hi - lo, &sh));
  ct_status s = f->cfg->resume ? ct_optimizer_copy_state(sh, 0, f->opt, lo, hi - lo) : CT_OK;
  if (s != CT_OK) {
    ct_optimizer_destroy(sh);
    return s;
  }
  ct_optimizer_destroy(f->opt);
  f->opt = sh, f->shard_lo = lo, f->shard_hi = hi, f->shard_grads = ct_ddp_shard_grads(f->ddp);
  return CT_OK;
}

ct_status fit_sync_bn_open(fit_run *f) {
  if (!f->ddp && !f->dp)
    return ct_error(CT_ERR_INVALID_ARG, "fit: SyncBatchNorm needs data parallel (dist.comm or dist.dp_count >= 2)");
  if (f->ddp) {
    f->norm_sync[0] = (ct_norm_sync){.sum = ct_ddp_norm_sum, .ctx = f->ddp};
    ct_model_set_norm_sync(f->m, &f->norm_sync[0]);
    return CT_OK;
  }
  for (int r = 0; r < ct_dp_replicas(f->dp); r++) {
    f->norm_sync[r] = (ct_norm_sync){.sum = ct_dp_norm_sum, .excluded = ct_dp_norm_excluded, .ctx = ct_dp_replica(f->dp, r)};
    ct_model_set_norm_sync(ct_dp_model(f->dp, r), &f->norm_sync[r]);
  }
  return CT_OK;
}

ct_status fit_ckpt_optimizer(fit_run *f, ct_optimizer **o, ct_optimizer **tmp) {
  *o = f->opt, *tmp = NULL;
  if (!f->shard_hi) return CT_OK;
  size_t np;
  ct_model_params(f->m, &np);
  CT_TRY(ct_optimizer_create(ct_optimizer_get_config(f->opt), np, tmp));
  *o = *tmp;
  return ct_ddp_gather_optimizer(f->ddp, f->opt, *tmp);
}

void fit_dist_close(fit_run *f) {
  if (f->cfg->dist.sync_bn) ct_model_set_norm_sync(f->m, NULL); /* f->norm_sync dies with fit */
  for (int r = 0; r < (int)(sizeof f->norm_sync / sizeof f->norm_sync[0]); r++) ct_norm_sync_release(&f->norm_sync[r]);
  ct_dp_destroy(f->dp);
  ct_ddp_destroy(f->ddp);
  f->dp = NULL, f->ddp = NULL;
}
