/* Activation recompute (gradient checkpointing): which activations a
 * training step drops after the forward and recomputes before the
 * backward, and the step timeline that follows from it.
 *
 * The layers are split into contiguous segments at clean cuts: points
 * after a layer whose output is the only activation the later layers read
 * (in a ResNet, the end of a residual block; in a sequential net, every
 * layer). An activation produced and read only inside one segment, that is
 * not the segment's last output and not in the last segment, is dropped:
 * its forward buffer is free once its readers in that segment have run.
 * Before the backward of a segment, the layers that produced its dropped
 * activations run their forward again (batch norm without touching the
 * running statistics, dropout with the same counter-based masks), so the
 * gradients are those of the plain step, bit for bit on a deterministic
 * backend. This is torch.utils.checkpoint.checkpoint_sequential for any
 * graph; the last segment is never dropped, as there.
 *
 * Timeline: forward of layer i at time i; then for each segment, last
 * first, the recompute forwards of its dropped layers in order, then the
 * backwards of its layers in reverse. Without recompute (one segment) the
 * backward of layer i is at 2L-1-i as before. */
#ifndef CTRAIN_NN_RECOMPUTE_H
#define CTRAIN_NN_RECOMPUTE_H

#include <stddef.h>

#include "ctrain/status.h"

typedef struct ct_model ct_model;

typedef struct ct_timeline {
  int L;      /* layers */
  int T;      /* end of the step: one past the last backward */
  int nseg;   /* segments (1 = no recompute) */
  int *seg;   /* [L] segment of layer i (0 = first) */
  int *rerun; /* [L] 1 = layer i's output is dropped after the forward and recomputed */
  int *rc;    /* [L] time of layer i's recompute forward, -1 = none */
  int *bwd;   /* [L] time of layer i's backward */
} ct_timeline;

/* Clean cuts: cut[i] = 1 when, after layer i (i < L-1), no activation but
 * root[i]'s is read by a later layer (root: the layer whose buffer layer
 * i's output uses, itself unless a view). Returns how many. */
int ct_recompute_cuts(const ct_model *m, const int *root, int *cut);

/* Builds the timeline of a training step split into at most `segments`
 * segments (<= 1: none) at clean cuts. bytes[i]: the size of root i's
 * buffer (0 for views and for outputs without a buffer); cost[i]: of
 * those, the bytes the plain step keeps for the backward (what dropping
 * saves). The cuts minimise the largest cost a segment keeps inside it
 * (all but its last output); nseg may come out lower when there are fewer
 * cuts or more would not lower that. CT_ERR_OUT_OF_MEMORY on allocation
 * failure. */
ct_status ct_timeline_build(const ct_model *m, const int *root, const size_t *bytes, const size_t *cost, int segments,
                            ct_timeline *tl);
void ct_timeline_free(ct_timeline *tl);

/* Layer i ends its segment (its output is kept; the segment's recompute
 * runs just before its backward). */
int ct_timeline_seg_end(const ct_timeline *tl, int i);

#endif
