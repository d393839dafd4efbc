/* DistributedDataParallel as hooks of the one training step (ct_step).
 *
 * Each rank holds a whole replica. The flat gradient buffer is cut into
 * buckets, views of it in reverse state order (the order the backward
 * finishes them): the first first_bucket_mb, the others bucket_mb. The
 * grads_ready hook counts a bucket's gradients as the backward makes them
 * final and starts its all-reduce (a sum: each rank's loss gradient
 * carries its share of the global batch, ct_step_pos.factor) the moment
 * the last one is; later hooks drive the started ones, and the sync hook
 * waits for all. The reduce hook sums the metrics; the non-finite flag
 * and the gradient norm need nothing, since every rank holds the same
 * summed gradients. Host models only (the CPU over MPI).
 */
#ifndef CTRAIN_PARALLEL_DDP_H
#define CTRAIN_PARALLEL_DDP_H

#include "ctrain/dist.h"
#include "ctrain/step.h"

typedef struct ct_ddp ct_ddp;

/* Buckets over m's gradients (m prepared for training on a host device). */
ct_status ct_ddp_create(ct_comm *c, ct_model *m, const ct_dist_config *cfg, ct_ddp **out);
void ct_ddp_destroy(ct_ddp *d);
/* The step hooks (ctx is d). */
void ct_ddp_hooks(ct_ddp *d, ct_step_hooks *h);
/* Rank 0's parameters and buffers to every rank (the start of a run). */
ct_status ct_ddp_broadcast_state(ct_ddp *d);
/* Compares a hash of the parameters across ranks: CT_ERR_INTERNAL naming
 * the first rank that differs from rank 0 (silent desynchronisation). */
ct_status ct_ddp_check_sync(ct_ddp *d, int64_t step);
/* Sums vals (host f64) over ranks; what names it for errors. */
ct_status ct_ddp_sum(ct_ddp *d, double *vals, int n, const char *what);
int ct_ddp_bucket_count(const ct_ddp *d);

#endif
