/* DistributedDataParallel as hooks of the one training step: the
 * contract is in include/ctrain/dist.h. Internal additions for ct_fit. */
#ifndef CTRAIN_PARALLEL_DDP_H
#define CTRAIN_PARALLEL_DDP_H

#include "ctrain/dist.h"

/* Sums vals (host f64) over ranks; what names it for errors. */
ct_status ct_ddp_sum(ct_ddp *d, double *vals, int n, const char *what);
/* SyncBatchNorm's sums (ct_norm_sync.sum, ddp the ct_ddp): vals in the
 * memory of the rank's model, on a GPU summed by its collectives. */
ct_status ct_ddp_norm_sum(void *ddp, double *vals, int n);

#endif
