#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

void ct_plan_init(ct_plan *p) { memset(p, 0, sizeof *p); }

void ct_plan_free(ct_plan *p) {
  free(p->bufs);
  memset(p, 0, sizeof *p);
}

int ct_plan_add(ct_plan *p, size_t bytes, int first, int last) {
  if (p->n == p->cap) {
    int cap = p->cap ? p->cap * 2 : 64;
    ct_plan_buf *b = realloc(p->bufs, (size_t)cap * sizeof *b);
    if (!b) return -1;
    p->bufs = b;
    p->cap = cap;
  }
  ct_plan_buf *b = &p->bufs[p->n];
  /* Beyond CT_PLAN_MAX_BYTES (an overflowed size) ct_plan_solve refuses. */
  b->bytes = bytes > CT_PLAN_MAX_BYTES ? CT_PLAN_MAX_BYTES + 1 : (bytes + CT_PLAN_ALIGN - 1) / CT_PLAN_ALIGN * CT_PLAN_ALIGN;
  b->first = first;
  b->last = last < first ? first : last;
  b->offset = 0;
  return p->n++;
}

static _Thread_local const ct_plan *sort_plan; /* qsort has no context argument */
static int by_size_desc(const void *a, const void *b) {
  const ct_plan_buf *x = &sort_plan->bufs[*(const int *)a], *y = &sort_plan->bufs[*(const int *)b];
  if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
  if (x->first != y->first) return x->first < y->first ? -1 : 1;
  return *(const int *)a - *(const int *)b;
}

static int by_offset(const void *a, const void *b) {
  const ct_plan_buf *x = &sort_plan->bufs[*(const int *)a], *y = &sort_plan->bufs[*(const int *)b];
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

ct_status ct_plan_solve(ct_plan *p) {
  int *order = malloc((size_t)(p->n ? p->n : 1) * sizeof *order);
  int *placed = malloc((size_t)(p->n ? p->n : 1) * sizeof *placed);
  int *overl = malloc((size_t)(p->n ? p->n : 1) * sizeof *overl);
  if (!order || !placed || !overl) {
    free(order), free(placed), free(overl);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "memory plan: out of host memory for %d buffers", p->n);
  }
  for (int i = 0; i < p->n; i++) order[i] = i;
  sort_plan = p;
  qsort(order, (size_t)p->n, sizeof *order, by_size_desc);
  int n_placed = 0;
  p->peak = 0;
  p->naive = 0;
  ct_status s = CT_OK;
  for (int k = 0; k < p->n && s == CT_OK; k++) {
    ct_plan_buf *b = &p->bufs[order[k]];
    /* Sizes and offsets stay below 2^62, so no sum here wraps. */
    if (b->bytes > CT_PLAN_MAX_BYTES || p->naive > CT_PLAN_MAX_BYTES) {
      s = ct_error(CT_ERR_OUT_OF_MEMORY, "memory plan: %s 2^62 bytes or more, more than any machine has",
                   b->bytes > CT_PLAN_MAX_BYTES ? "a buffer of" : "buffers of");
      break;
    }
    p->naive += b->bytes;
    if (!b->bytes) continue;
    /* Buffers already placed whose lifetimes intersect this one, by offset:
     * take the first gap large enough. */
    int m = 0;
    for (int j = 0; j < n_placed; j++) {
      ct_plan_buf *o = &p->bufs[placed[j]];
      if (o->first <= b->last && b->first <= o->last) overl[m++] = placed[j];
    }
    qsort(overl, (size_t)m, sizeof *overl, by_offset);
    size_t off = 0;
    for (int j = 0; j < m; j++) {
      ct_plan_buf *o = &p->bufs[overl[j]];
      if (o->offset >= off + b->bytes) break;
      if (o->offset + o->bytes > off) off = o->offset + o->bytes;
    }
    b->offset = off;
    if (off + b->bytes > p->peak) p->peak = off + b->bytes;
    if (p->peak > CT_PLAN_MAX_BYTES) s = ct_error(CT_ERR_OUT_OF_MEMORY, "memory plan: a peak of 2^62 bytes or more");
    placed[n_placed++] = order[k];
  }
  free(order);
  free(placed);
  free(overl);
  return s;
}
