/* Gradient accumulation bookkeeping (ct_train_config.accumulate): which
 * loader batches form one optimizer step and what share of the step's
 * gradient each one carries. Pure host arithmetic, shared by the host step
 * and the device step in ct_fit, tested on the CPU. Internal. */
#ifndef CTRAIN_TRAIN_ACCUMULATE_H
#define CTRAIN_TRAIN_ACCUMULATE_H

#include <stdint.h>

#include "ctrain/trainer.h" /* CT_ACCUMULATE_MAX */

/* Where one micro-batch stands in its group. Groups are aligned to the
 * epoch's start: group g holds batches [g*N, min((g+1)*N, batches)), so a
 * resumed epoch (which restarts at a group boundary) forms the same
 * groups, and the last group of an epoch may be shorter. */
typedef struct ct_accum_pos {
  int index;        /* position in the group, 0..N-1 */
  int first;        /* zero the gradients before its backward */
  int last;         /* the optimizer steps after its backward */
  int64_t group_n;  /* samples of the whole group */
  double factor;    /* samples of this batch / group_n: its loss gradient's weight */
} ct_accum_pos;

/* The position of loader batch `batch` (0-based in the epoch, n samples)
 * for accumulate (<= 1: off, every batch is a group of one with factor
 * exactly 1). order_n is the rank's samples in the epoch (ct_batch.order_n)
 * and batch_size the loader's; batches is ct_loader_batches_per_epoch, so a
 * drop_last loader's tail never counts. */
ct_accum_pos ct_accum_position(int accumulate, int64_t batch, int64_t n, int64_t batches, int64_t order_n,
                               int64_t batch_size);


#endif
