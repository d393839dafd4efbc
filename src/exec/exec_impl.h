/* The passes that run in a prepared model's arena (executor.c): the
 * runtime descriptors for a batch and the pass workspaces. The plan's
 * own tables and predicates are plan/exec_plan.h. Internal. */
#ifndef CTRAIN_EXEC_EXEC_IMPL_H
#define CTRAIN_EXEC_EXEC_IMPL_H

#include "plan/exec_plan.h"

/* Hands layer i's planned workspace of pass `pass` (CT_PASS_FWD, _RC or
 * _BWD: exec_plan.c) to the backend and to the layer (e->pass_ws) for the
 * calls that follow, or none (pass -1; also where the plan has none for
 * that pass). */
void ct_exec_pass_workspace(ct_model *m, int i, int pass, ct_exec *e);

/* Installs or removes (NULL) the backward's per-layer hooks
 * (ct_model_grad_hook): `need` before the backward of each layer with
 * parameters writes their gradients, `final` after it. */
void ct_model_set_grad_hooks(ct_model *m, ct_model_grad_hook need, ct_model_grad_hook final, void *ctx);

/* Where the next passes' samples stand in the step's whole batch
 * (ct_step_pos.sample_offset and sample_stride): dropout's mask numbers. */
void ct_model_set_sample_span(ct_model *m, int64_t offset, int64_t stride);

/* SyncBatchNorm: with sync set (it must outlive the model's training), the
 * training passes' batch norms take the statistics of the global batch,
 * summed through it; NULL: each replica its own batch's. */
void ct_model_set_norm_sync(ct_model *m, ct_norm_sync *sync);

#endif
