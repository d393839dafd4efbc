/* What the step planner (exec_plan.c) and the passes that run in its
 * arena (executor.c) both need to know of a bound model: each layer's
 * output dtype and layout, whether an input edge is cast, and the runtime
 * descriptors for a batch. Internal. */
#ifndef CTRAIN_NN_EXEC_IMPL_H
#define CTRAIN_NN_EXEC_IMPL_H

#include "nn/model_impl.h"

/* The dtype of layer i's output (f32 unless the precision policy chose
 * another), and of the producer of input edge j (-1 = the model input). */
static inline ct_dtype ct_exec_out_dt(const ct_model *m, int i) { return m->act_dt ? m->act_dt[i] : CT_F32; }
static inline ct_dtype ct_exec_src_dt(const ct_model *m, int src) {
  return src < 0 ? CT_F32 : ct_exec_out_dt(m, src);
}
/* Input edge j of layer i needs a cast into the layer's dtype. */
static inline int ct_exec_edge_cast(const ct_model *m, int i, int j) {
  return ct_exec_src_dt(m, m->layers[i].inputs[j]) != ct_exec_out_dt(m, i);
}

/* Sets every layer's x/y/dx/dy descriptors (shape, dtype, layout, device)
 * for batch n; data pointers are bound separately. */
void ct_exec_shape_tensors(ct_model *m, int64_t n);

#endif
