/* The static memory plan of one step.
 *
 * Buffers (activations, activation gradients, workspaces) are described by
 * size and lifetime [first, last] on a timeline of the step (forward of
 * layer i at time i, backward of layer i at time 2L-1-i). The planner gives
 * every buffer an offset in one arena so that buffers alive at the same
 * time never overlap, and reports the peak: the arena size. The peak is
 * therefore known before any memory is taken, and a step allocates nothing.
 */
#ifndef CTRAIN_PLAN_H
#define CTRAIN_PLAN_H

#include <stddef.h>

#include "ctrain/status.h"

typedef struct ct_plan_buf {
  size_t bytes;
  int first, last; /* inclusive lifetime on the step timeline */
  size_t offset;   /* assigned by ct_plan_solve */
} ct_plan_buf;

typedef struct ct_plan {
  int n, cap;
  ct_plan_buf *bufs;
  size_t peak;       /* arena bytes */
  size_t naive;      /* sum of all buffers: what no reuse would cost */
} ct_plan;

/* Every buffer's size, and so every offset, is a multiple of this. 256
 * bytes is what cudaMalloc returns and cuBLASLt's default minimum
 * alignment: a planned operand never shuts out a kernel that wants it, and
 * which kernel the heuristic picks for a matmul does not depend on where
 * the plan happens to place its operands (so `ctrain eval` runs the same
 * kernels as the evaluation inside `ctrain train`, and a recompute step
 * those of the plain step, though their plans differ). */
#define CT_PLAN_ALIGN 256

/* Larger buffers, sums and peaks are refused (CT_ERR_OUT_OF_MEMORY) rather
 * than let a size computed from absurd shapes wrap around. */
#define CT_PLAN_MAX_BYTES ((size_t)1 << 62)

void ct_plan_init(ct_plan *p);
void ct_plan_free(ct_plan *p);
/* Adds a buffer; returns its id or -1 on allocation failure. Sizes are
 * rounded up to CT_PLAN_ALIGN bytes. A zero-byte buffer gets an id and no space. */
int ct_plan_add(ct_plan *p, size_t bytes, int first, int last);
/* Assigns offsets (largest first, lowest free offset that fits among the
 * already placed buffers whose lifetimes intersect). Fails with
 * CT_ERR_OUT_OF_MEMORY past CT_PLAN_MAX_BYTES. */
ct_status ct_plan_solve(ct_plan *p);

#endif
