/* Every function entry of ct_backend (backend.h), in struct order, with
 * the rule for when it may be NULL. The list, not an entry's position,
 * says which entries are optional: ct_backend_fill_defaults fills the
 * required ones from the reference, and ct_backend_check holds every
 * backend's table to the rules (tests run it on ref, cpu, cpu:N and
 * cuda). A field added to the struct without a line here makes
 * ct_backend_check fail on every table.
 *
 * The rules:
 *   CT_OP_REQUIRED  never NULL once the table is filled;
 *   CT_OP_OPTIONAL  may be NULL anywhere (the caller has a fallback);
 *   CT_OP_MEMORY    the device's own memory: all or none, none meaning
 *                   host memory;
 *   CT_OP_DEVICE    device-resident training and the GPU data path: set
 *                   exactly on the backends with their own memory;
 *   CT_OP_WS, CT_OP_BN_ACT, CT_OP_COLL
 *                   groups that come all or none (the planned workspace,
 *                   batch norm with its activation fused, collectives;
 *                   collectives only on backends with their own memory). */
#ifndef CTRAIN_BACKEND_OPS_H
#define CTRAIN_BACKEND_OPS_H

#include <stddef.h>

#include "backend/backend.h"

typedef enum ct_op_rule {
  CT_OP_REQUIRED,
  CT_OP_OPTIONAL,
  CT_OP_MEMORY,
  CT_OP_DEVICE,
  CT_OP_WS,
  CT_OP_BN_ACT,
  CT_OP_COLL
} ct_op_rule;

#define CT_BACKEND_OPS(X)                                                                                         \
  X(open, CT_OP_OPTIONAL) X(close, CT_OP_OPTIONAL) X(alloc, CT_OP_MEMORY) X(free, CT_OP_MEMORY)                   \
  X(copy, CT_OP_MEMORY) X(sync, CT_OP_MEMORY)                                                                     \
  X(grad_stats, CT_OP_DEVICE) X(fused_optim_step, CT_OP_DEVICE) X(scaler_update, CT_OP_DEVICE)                    \
  X(count_correct, CT_OP_DEVICE) X(host_alloc, CT_OP_DEVICE) X(host_free, CT_OP_DEVICE)                           \
  X(copy_h2d_async, CT_OP_DEVICE) X(set_option, CT_OP_DEVICE) X(mem_info, CT_OP_DEVICE) X(describe, CT_OP_DEVICE) \
  X(copy_async, CT_OP_DEVICE) X(event_record, CT_OP_DEVICE) X(event_wait, CT_OP_DEVICE)                           \
  X(cross_entropy_bwd_dev, CT_OP_DEVICE) X(nll_bwd_dev, CT_OP_DEVICE) X(fused_optim_step_dev, CT_OP_DEVICE)       \
  X(dropout_step_from, CT_OP_DEVICE) X(graph_begin, CT_OP_DEVICE) X(graph_end, CT_OP_DEVICE)                      \
  X(graph_launch, CT_OP_DEVICE) X(graph_free, CT_OP_DEVICE) X(linreg_fit, CT_OP_DEVICE)                           \
  X(transform_u8, CT_OP_DEVICE)                                                                                   \
  X(conv2d_bwd_data_acc, CT_OP_OPTIONAL) X(conv2d_workspace_bytes, CT_OP_WS) X(set_workspace, CT_OP_WS)           \
  X(batchnorm_act_reserve, CT_OP_BN_ACT) X(batchnorm_act_fwd, CT_OP_BN_ACT) X(batchnorm_act_bwd, CT_OP_BN_ACT)    \
  X(coll_new_id, CT_OP_COLL) X(coll_open, CT_OP_COLL) X(coll_allreduce, CT_OP_COLL) X(coll_bcast, CT_OP_COLL)     \
  X(coll_fence, CT_OP_COLL) X(coll_wait, CT_OP_COLL) X(coll_close, CT_OP_COLL)                                    \
  X(matmul, CT_OP_REQUIRED) X(linear_fwd, CT_OP_REQUIRED) X(linear_bwd_data, CT_OP_REQUIRED)                      \
  X(linear_bwd_weights, CT_OP_REQUIRED) X(conv2d_fwd, CT_OP_REQUIRED) X(conv2d_bwd_data, CT_OP_REQUIRED)          \
  X(conv2d_bwd_weights, CT_OP_REQUIRED) X(maxpool2d_workspace_bytes, CT_OP_REQUIRED)                              \
  X(maxpool2d_fwd, CT_OP_REQUIRED) X(maxpool2d_bwd, CT_OP_REQUIRED) X(avgpool2d_fwd, CT_OP_REQUIRED)              \
  X(avgpool2d_bwd, CT_OP_REQUIRED) X(adaptive_avgpool2d_fwd, CT_OP_REQUIRED)                                      \
  X(adaptive_avgpool2d_bwd, CT_OP_REQUIRED) X(adaptive_maxpool2d_fwd, CT_OP_REQUIRED)                             \
  X(adaptive_maxpool2d_bwd, CT_OP_REQUIRED) X(batchnorm_fwd, CT_OP_REQUIRED) X(batchnorm_bwd, CT_OP_REQUIRED)     \
  X(batchnorm_apply, CT_OP_REQUIRED) X(act_fwd, CT_OP_REQUIRED) X(act_bwd, CT_OP_REQUIRED)                        \
  X(dropout_fwd, CT_OP_REQUIRED) X(dropout_bwd, CT_OP_REQUIRED) X(add, CT_OP_REQUIRED) X(axpby, CT_OP_REQUIRED)   \
  X(fill, CT_OP_REQUIRED) X(cast, CT_OP_REQUIRED) X(softmax_fwd, CT_OP_REQUIRED) X(softmax_bwd, CT_OP_REQUIRED)   \
  X(cross_entropy_fwd, CT_OP_REQUIRED) X(cross_entropy_bwd, CT_OP_REQUIRED) X(nll_fwd, CT_OP_REQUIRED)            \
  X(nll_bwd, CT_OP_REQUIRED) X(mse_fwd, CT_OP_REQUIRED) X(mse_bwd, CT_OP_REQUIRED) X(sumsq, CT_OP_REQUIRED)       \
  X(nonfinite, CT_OP_REQUIRED)

typedef struct ct_backend_op {
  const char *name;
  size_t offset; /* offsetof(ct_backend, name) */
  ct_op_rule rule;
} ct_backend_op;

extern const ct_backend_op ct_backend_ops[];
extern const int ct_backend_op_count;

/* Whether b's entry op is set. */
int ct_backend_has(const ct_backend *b, const ct_backend_op *op);
/* CT_OK when b (filled) keeps every rule, and the list covers every
 * function entry of the struct; CT_ERR_INTERNAL naming the backend and
 * the first entry that breaks one. */
ct_status ct_backend_check(const ct_backend *b);

#endif
