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
 * A second mode (CT_RECOMPUTE_CHEAP, "memory-efficient batch norm") drops
 * only what is cheap to recompute: the outputs of batch norms,
 * activations, residual adds and dropout, rebuilt from the convolution
 * and linear outputs the backward keeps anyway, each just before the
 * first backward that reads it. A third (CT_RECOMPUTE_NORM) drops the
 * outputs of batch norms alone (with their fused activation) whose input
 * the backward keeps: each is rebuilt by one elementwise pass from that
 * input and the statistics its forward saved. A fourth
 * (CT_RECOMPUTE_SELECTIVE) drops what norm drops and the outputs of
 * convolutions cheap to run again next to the bytes they keep (at most
 * CT_RECOMPUTE_SELECTIVE_MACS multiply-adds per output element), with the
 * rebuilt batch norm outputs they read.
 *
 * Timeline: forward of layer i at time i; then, for i from L-1 down, the
 * recompute forwards due before layer i's backward (in layer order), then
 * that backward. Without recompute the backward of layer i is at 2L-1-i
 * as before. */
#ifndef CTRAIN_NN_RECOMPUTE_H
#define CTRAIN_NN_RECOMPUTE_H

#include <stddef.h>

#include "ctrain/model.h"
#include "ctrain/status.h"

typedef struct ct_model ct_model;

typedef struct ct_timeline {
  int L;       /* layers */
  int T;       /* end of the step: one past the last backward */
  int nseg;    /* segments (1 = none) */
  int n_rerun; /* layers whose forward runs twice (0 = no recompute) */
  int mode;    /* CT_RECOMPUTE_CHEAP, _NORM or _SELECTIVE, else nseg */
  int *seg;    /* [L] segment of layer i (0 = first) */
  int *rerun;  /* [L] 1 = layer i's output is dropped after the forward and recomputed */
  int *rc_at;  /* [L] the layer before whose backward layer i's recompute runs, -1 = none */
  int *rc;     /* [L] time of layer i's recompute forward, -1 = none */
  int *order;  /* [n_rerun] the rerun layers in the order they run */
  int *bwd;    /* [L] time of layer i's backward */
} ct_timeline;

/* The named modes that drop single layers' outputs (no segments): cheap,
 * norm and selective. */
static inline int ct_recompute_layer_mode(int mode) {
  return mode == CT_RECOMPUTE_CHEAP || mode == CT_RECOMPUTE_NORM || mode == CT_RECOMPUTE_SELECTIVE;
}

/* Clean cuts: cut[i] = 1 when, after layer i (i < L-1), no activation but
 * root[i]'s is read by a later layer (root: the layer whose buffer layer
 * i's output uses, itself unless a view). Returns how many. */
int ct_recompute_cuts(const ct_model *m, const int *root, int *cut);

/* Builds the timeline of a training step. bytes[i]: the size of root i's
 * buffer (0 for views and outputs without a buffer). segments <= 1: no
 * recompute; N > 1: at most N segments at clean cuts, placed to minimise
 * the largest cost a segment keeps inside it (the bytes of its
 * activations but its last output that the plain step keeps for a
 * backward); nseg may come out lower when there are fewer cuts or more
 * would not lower that. CT_RECOMPUTE_CHEAP: no segments; the outputs of
 * batch norms, activations, residual adds and dropout that a backward
 * reads are dropped when their inputs stay (or are dropped the same way),
 * each recomputed just before the first backward that reads it.
 * CT_RECOMPUTE_NORM: the same for batch norms alone; CT_RECOMPUTE_SELECTIVE:
 * for batch norms and convolutions of at most CT_RECOMPUTE_SELECTIVE_MACS
 * multiply-adds per output element.
 * Recomputes run in layer order before the backward of their rc_at layer.
 * CT_ERR_OUT_OF_MEMORY on allocation failure. */
ct_status ct_timeline_build(const ct_model *m, const int *root, const size_t *bytes, int segments, ct_timeline *tl);
void ct_timeline_free(ct_timeline *tl);

/* Layer i ends its segment. */
int ct_timeline_seg_end(const ct_timeline *tl, int i);

#endif
