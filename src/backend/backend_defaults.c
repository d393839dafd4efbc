#include <stddef.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/backend_ops.h"
#include "backend/device_impl.h"

/* Copies every NULL required op (backend_ops.h) from the reference table.
 * The others are left alone: NULL there is meaningful (host memory, no
 * fused path, no collectives). */
void ct_backend_fill_defaults(ct_backend *b) {
  const ct_backend *r = ct_ref_backend();
  if (b == r) return;
  for (int i = 0; i < ct_backend_op_count; i++) {
    const ct_backend_op *op = &ct_backend_ops[i];
    if (op->rule != CT_OP_REQUIRED || ct_backend_has(b, op)) continue;
    memcpy((char *)b + op->offset, (const char *)r + op->offset, sizeof(void (*)(void)));
  }
}

/* SyncBatchNorm's per-channel vectors: f32 [C], or absent where allowed. */
static ct_status bn_sync_vec(const char *who, const char *op, const char *name, const ct_tensor *t, int64_t C,
                             int may_be_null) {
  if (!t && may_be_null) return CT_OK;
  if (!t || t->dtype != CT_F32 || ct_tensor_numel(t) != C)
    return ct_error(CT_ERR_INVALID_ARG, "%s %s: %s must be f32 with %lld values", who, op, name, (long long)C);
  return CT_OK;
}

ct_status ct_bn_sync_stats_args(const char *who, const ct_tensor *mean, const ct_tensor *invstd,
                                const ct_tensor *running_mean, const ct_tensor *running_var) {
  const char *op = "batchnorm_sync_stats";
  const int64_t C = mean ? ct_tensor_numel(mean) : 0;
  CT_TRY(bn_sync_vec(who, op, "mean", mean, C, 0));
  CT_TRY(bn_sync_vec(who, op, "invstd", invstd, C, 0));
  CT_TRY(bn_sync_vec(who, op, "running_mean", running_mean, C, 1));
  return bn_sync_vec(who, op, "running_var", running_var, C, 1);
}

ct_status ct_bn_sync_grads_args(const char *who, int stage, const ct_tensor *gamma, const ct_tensor *invstd,
                                const ct_tensor *dgamma, const ct_tensor *dbeta, const ct_tensor *a,
                                const ct_tensor *b) {
  const char *op = "batchnorm_sync_grads";
  const int64_t C = invstd ? ct_tensor_numel(invstd) : 0;
  CT_TRY(bn_sync_vec(who, op, "invstd", invstd, C, 0));
  CT_TRY(bn_sync_vec(who, op, "gamma", gamma, C, 1));
  CT_TRY(bn_sync_vec(who, op, "dgamma", dgamma, C, 0));
  CT_TRY(bn_sync_vec(who, op, "dbeta", dbeta, C, 0));
  CT_TRY(bn_sync_vec(who, op, "a", a, C, stage == 0));
  return bn_sync_vec(who, op, "b", b, C, stage == 0);
}
