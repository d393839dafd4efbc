/* The step's plan of a prepared model: the plan buffer ids of every
 * layer (ct_exec_bufs), and what the planner and the executor (src/exec)
 * both need to know of a bound layer: its output dtype, whether an input
 * edge is cast, what its backward reads. Internal. */
#ifndef CTRAIN_PLAN_EXEC_PLAN_H
#define CTRAIN_PLAN_EXEC_PLAN_H

#include "nn/model_impl.h"
#include "plan/fuse.h"
#include "plan/plan.h"
#include "plan/recompute.h"

_Static_assert(CT_STATE_ALIGN == CT_PLAN_ALIGN, "parameters are placed as activations are");

/* ct_exec_bufs.tmp of an input edge whose layer adds its input gradient
 * into the producer's itself (exec_plan.c's dx_accumulates). */
#define CT_EXEC_DX_ACC (-2)

/* Plan ids of a step's buffers, per layer (-1 = none). */
typedef struct ct_exec_bufs {
  int *act;  /* [L] activation buffer of layer i's output (-1 = alias) */
  int *root; /* [L] layer whose activation buffer layer i's output uses */
  int *grad; /* [L] dL/dy of layer i */
  int *ws;   /* [L] workspace kept from forward to backward */
  int *tmp;  /* [2L] temporary dx of input edge j of layer i (or CT_EXEC_DX_ACC) */
  int *layout; /* [L] ct_layout of layer i's y and dy (plan/layout.h) */
  /* Mixed precision (all -1 under O0): input edge j of layer i cast to the
   * layer's dtype, that edge's gradient in the layer's dtype before it is
   * cast back, and an fp32 copy of the output (and of its gradient) for
   * the loss. */
  int *xcast;  /* [2L] */
  int *dxcast; /* [2L] */
  int out32, dout32;
  /* Activation recompute (plan/recompute.h): the segments and times of the
   * step, and for a layer whose output is dropped the buffers its
   * recompute forward writes (output, workspace, cast inputs); the plain
   * act/ws/xcast ids then serve its first forward only. -1 elsewhere. */
  ct_timeline tl;
  int *act_rc;   /* [L] */
  int *ws_rc;    /* [L] */
  int *xcast_rc; /* [2L] */
  /* Pass workspaces (the cuDNN workspace a convolution needs only while
   * it runs): entry 3i + CT_PASS_* of layer i's forward, recompute forward
   * and backward, each alive at that pass's time alone. */
  int *pws; /* [3L] */
  /* Low-precision weight copies (src/amp/amp_model.c): layer i's for its
   * forward (for the whole step in an inference plan), and in a training
   * plan its second, cast again for its recompute forward or its
   * backward-data pass, whichever comes first. lpw_bwd points into lpw's
   * block. */
  int *lpw, *lpw_bwd; /* [L] each */
  /* The gradient of the model input (ct_model_set_input_grad), -1 = none. */
  int in_grad;
} ct_exec_bufs;

enum { CT_PASS_FWD, CT_PASS_RC, CT_PASS_BWD };

/* Frees the executor's per-model tables (called by ct_model_destroy). */
void ct_exec_bufs_free(ct_exec_bufs *b);
/* The arena peak the prepared training plan would have with `segments`
 * recompute segments (CT_RECOMPUTE_AUTO: the best count); the plan in use
 * is unchanged. For the out-of-memory advice (device_state.c). */
ct_status ct_model_plan_peak_with_recompute(ct_model *m, int segments, size_t *peak);

/* The dtype of layer i's output (f32 unless the precision policy chose
 * another), and of the producer of input edge j (-1 = the model input:
 * f32 unless narrowed, ct_model_narrow_input). */
static inline ct_dtype ct_exec_out_dt(const ct_model *m, int i) { return m->act_dt ? m->act_dt[i] : CT_F32; }
static inline ct_dtype ct_exec_src_dt(const ct_model *m, int src) {
  return src < 0 ? m->in_dt : ct_exec_out_dt(m, src);
}
/* Input edge j of layer i needs a cast into the layer's dtype. */
static inline int ct_exec_edge_cast(const ct_model *m, int i, int j) {
  return ct_exec_src_dt(m, m->layers[i].inputs[j]) != ct_exec_out_dt(m, i);
}

/* What a layer's backward reads (the planner keeps it alive): its input
 * (a cast edge's backward reads the cast copy instead), its output. */
static inline int ct_exec_saves_input(const ct_layer *l) {
  if (l->cls == &ct_layer_activation) return CT_ACT_BWD_NEEDS_X(l->act);
  return (l->cls->flags & CT_LAYER_SAVES_INPUT) != 0;
}
static inline int ct_exec_saves_output(const ct_layer *l) {
  if (l->cls == &ct_layer_activation) return CT_ACT_BWD_NEEDS_Y(l->act);
  if (ct_layer_is_fused(l)) return 0; /* a folded ReLU: its producer's backward applies it */
  /* fused activation: backward reads y, unless a max pool took its ReLU's
   * gradient over, which reads its own y for it instead (plan/fuse.h) */
  if (ct_layer_bwd_act(l) != CT_ACT_NONE || l->relu_moved == CT_RELU_MOVED_FROM_INPUT) return 1;
  return (l->cls->flags & CT_LAYER_SAVES_OUTPUT) != 0;
}

/* The layout of layer i's output and gradient (-1: the model input's),
 * and the one layer i reads input edge j in. */
ct_layout ct_exec_layout(const ct_model *m, int i);
ct_layout ct_exec_edge_layout(const ct_model *m, int i, int j);
/* Sets every layer's x/y/dx/dy descriptors (shape, dtype, layout, device)
 * for batch n; data pointers are bound separately (src/exec). */
void ct_exec_shape_tensors(ct_model *m, int64_t n);

/* The step's plan for m on dev at max_batch (training: forward and
 * backward) with the model's recompute setting (auto chosen here), into
 * m->eb and m->plan (allocated when NULL). Fusion, the precision policy,
 * layouts and the input's format must be applied first (ct_model_prepare,
 * src/exec/prepare.c). */
ct_status ct_exec_plan_build(ct_model *m, ct_device *dev, int64_t max_batch, int training);

#endif
