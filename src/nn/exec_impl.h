/* What the step planner (exec_plan.c) and the passes that run in its
 * arena (executor.c) both need to know of a bound model: each layer's
 * output dtype and layout, whether an input edge is cast, and the runtime
 * descriptors for a batch. Internal. */
#ifndef CTRAIN_NN_EXEC_IMPL_H
#define CTRAIN_NN_EXEC_IMPL_H

#include "plan/fuse.h"
#include "nn/model_impl.h"

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

/* The layout layer i reads input edge j in (executor.c). */
ct_layout ct_exec_edge_layout(const ct_model *m, int i, int j);

/* Sets every layer's x/y/dx/dy descriptors (shape, dtype, layout, device)
 * for batch n; data pointers are bound separately. */
void ct_exec_shape_tensors(ct_model *m, int64_t n);
/* Hands layer i's planned workspace of pass `pass` (CT_PASS_FWD, _RC or
 * _BWD: exec_plan.c) to the backend and to the layer (e->pass_ws) for the
 * calls that follow, or none (pass -1; also where the plan has none for
 * that pass). */
void ct_exec_pass_workspace(ct_model *m, int i, int pass, ct_exec *e);

#endif
