/* The backend table's entries and their rules (backend_ops.h), from
 * backend_ops.def. */
#include "backend/backend_ops.h"

#include <string.h>

const ct_backend_op ct_backend_ops[] = {
#define CT_OP(rule, ret, name, params) {#name, offsetof(ct_backend, name), CT_OP_##rule},
#include "backend/backend_ops.def"
#undef CT_OP
};
const int ct_backend_op_count = (int)(sizeof ct_backend_ops / sizeof ct_backend_ops[0]);

typedef void (*ct_fnp)(void);

int ct_backend_has(const ct_backend *b, const ct_backend_op *op) {
  ct_fnp f;
  memcpy(&f, (const char *)b + op->offset, sizeof f);
  return f != NULL;
}

/* Whether every entry of rule r is set (*all) and whether any is (*any). */
static void group(const ct_backend *b, ct_op_rule r, int *all, int *any) {
  *all = 1, *any = 0;
  for (int i = 0; i < ct_backend_op_count; i++) {
    if (ct_backend_ops[i].rule != r) continue;
    int h = ct_backend_has(b, &ct_backend_ops[i]);
    *all &= h, *any |= h;
  }
}

ct_status ct_backend_check(const ct_backend *b) {
  const char *name = b->name ? b->name : "(unnamed)";
  int mem_all, mem_any;
  group(b, CT_OP_MEMORY, &mem_all, &mem_any);
  if (mem_any && !mem_all)
    return ct_error(CT_ERR_INTERNAL, "backend %s: some memory entries (alloc, free, copy, sync) are set, not all", name);
  for (int i = 0; i < ct_backend_op_count; i++) {
    const ct_backend_op *op = &ct_backend_ops[i];
    int h = ct_backend_has(b, op);
    if (op->rule == CT_OP_REQUIRED && !h)
      return ct_error(CT_ERR_INTERNAL, "backend %s: required entry '%s' is NULL", name, op->name);
    if (op->rule == CT_OP_DEVICE && h != mem_all)
      return ct_error(CT_ERR_INTERNAL, "backend %s: device entry '%s' is %s on a backend %s memory of its own", name,
                      op->name, h ? "set" : "NULL", mem_all ? "with" : "without");
  }
  static const struct {
    ct_op_rule rule;
    const char *what;
  } groups[] = {{CT_OP_WS, "planned-workspace"}, {CT_OP_BN_ACT, "fused batch-norm"}, {CT_OP_COLL, "collective"}};
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
    int all, any;
    group(b, groups[g].rule, &all, &any);
    if (any && !all) return ct_error(CT_ERR_INTERNAL, "backend %s: some %s entries are set, not all", name, groups[g].what);
    if (groups[g].rule == CT_OP_COLL && any && !mem_all)
      return ct_error(CT_ERR_INTERNAL, "backend %s: collectives on a backend without memory of its own", name);
  }
  return CT_OK;
}
