/* The backend table's entries as data: each entry's name, offset in
 * struct ct_backend and rule (when it may be NULL), generated from
 * backend_ops.def, the one list of them. ct_backend_fill_defaults fills
 * a host table's required entries from the reference, and
 * ct_backend_check holds every backend's table to the rules (tests run it
 * on ref, cpu, cpu:N and cuda). */
#ifndef CTRAIN_BACKEND_OPS_H
#define CTRAIN_BACKEND_OPS_H

#include <stddef.h>

#include "backend/backend.h"

/* The rules, as backend_ops.def's header explains them. */
typedef enum ct_op_rule {
  CT_OP_REQUIRED,
  CT_OP_OPTIONAL,
  CT_OP_MEMORY,
  CT_OP_DEVICE,
  CT_OP_WS,
  CT_OP_BN_ACT,
  CT_OP_COLL
} ct_op_rule;

typedef struct ct_backend_op {
  const char *name;
  size_t offset; /* offsetof(ct_backend, name) */
  ct_op_rule rule;
} ct_backend_op;

extern const ct_backend_op ct_backend_ops[];
extern const int ct_backend_op_count;

/* Whether b's entry op is set. */
int ct_backend_has(const ct_backend *b, const ct_backend_op *op);
/* CT_OK when b (filled) keeps every rule; CT_ERR_INTERNAL naming the
 * backend and the first entry that breaks one. */
ct_status ct_backend_check(const ct_backend *b);

#endif
