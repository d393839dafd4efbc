/* Gradient buckets: the contract is in buckets.h. */
#include "parallel/buckets.h"

#include <stdlib.h>

/* One parameter's place in the flat gradient buffer. */
typedef struct bucket_param {
  size_t first, count;
  int bucket;
} bucket_param;

typedef struct bucket {
  size_t lo, hi;  /* the slice [lo, hi) of the gradient buffer, gaps included */
  size_t total;   /* its gradient elements */
  size_t pending; /* of those, not final yet in this step */
} bucket;

struct ct_buckets {
  bucket_param *params; /* [np] in reverse state order */
  int np;
  bucket *b; /* [nb], b[0] the first to be final */
  int nb, next;
};

ct_status ct_buckets_create(ct_model *m, double first_mb, double mb, ct_buckets **out) {
  *out = NULL;
  int ns = ct_model_state_count(m);
  ct_buckets *b = calloc(1, sizeof *b);
  if (b) b->params = calloc((size_t)ns + 1, sizeof *b->params);
  if (b) b->b = calloc((size_t)ns + 1, sizeof *b->b);
  if (!b || !b->params || !b->b) {
    ct_buckets_destroy(b);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "gradient buckets: out of host memory");
  }
  /* A gradient's offset is its parameter's (the model may have no
   * gradient buffer: ZeRO-2 on a device). */
  float *p = ct_model_params(m, NULL);
  for (int i = ns - 1; i >= 0; i--) {
    const ct_state_entry *e = ct_model_state(m, i);
    if (e->is_buffer || e->value.dtype != CT_F32) continue;
    b->params[b->np].first = (size_t)((float *)e->value.data - p);
    b->params[b->np].count = (size_t)ct_tensor_numel(&e->value);
    b->np++;
  }
  if (mb <= 0) mb = 25.0;
  if (first_mb <= 0) first_mb = mb < 1.0 ? mb : 1.0;
  /* Greedy in reverse order: a bucket closes once it holds its cap. */
  for (int i = 0; i < b->np; i++) {
    bucket_param *p = &b->params[i];
    double cap = (b->nb <= 1 ? first_mb : mb) * 1e6 / sizeof(float);
    if (b->nb == 0 || (double)b->b[b->nb - 1].total >= cap) {
      b->b[b->nb].lo = p->first;
      b->b[b->nb].hi = p->first + p->count;
      b->nb++;
    }
    bucket *k = &b->b[b->nb - 1];
    if (p->first < k->lo) k->lo = p->first;
    if (p->first + p->count > k->hi) k->hi = p->first + p->count;
    k->total += p->count;
    p->bucket = b->nb - 1;
  }
  ct_buckets_reset(b);
  *out = b;
  return CT_OK;
}

void ct_buckets_destroy(ct_buckets *b) {
  if (!b) return;
  free(b->params);
  free(b->b);
  free(b);
}

int ct_buckets_count(const ct_buckets *b) { return b->nb; }

void ct_buckets_range(const ct_buckets *b, int k, size_t *lo, size_t *hi) {
  *lo = b->b[k].lo;
  *hi = b->b[k].hi;
}

int ct_buckets_find(const ct_buckets *b, size_t offset) {
  for (int k = 0; k < b->nb; k++)
    if (offset >= b->b[k].lo && offset < b->b[k].hi) return k;
  return -1;
}

void ct_buckets_ready(ct_buckets *b, size_t first, size_t count) {
  size_t end = first + count;
  for (int i = 0; i < b->np; i++) {
    const bucket_param *p = &b->params[i];
    size_t lo = p->first > first ? p->first : first, hi = p->first + p->count < end ? p->first + p->count : end;
    if (lo < hi) b->b[p->bucket].pending -= hi - lo;
  }
}

void ct_buckets_all_ready(ct_buckets *b) {
  for (int k = 0; k < b->nb; k++) b->b[k].pending = 0;
}

int ct_buckets_next(ct_buckets *b) {
  if (b->next >= b->nb || b->b[b->next].pending) return -1;
  return b->next++;
}

void ct_buckets_reset(ct_buckets *b) {
  for (int k = 0; k < b->nb; k++) b->b[k].pending = b->b[k].total;
  b->next = 0;
}
