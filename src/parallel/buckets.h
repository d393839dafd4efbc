/* Gradient buckets: the flat gradient buffer of a model cut into slices
 * in reverse state order (the order the backward makes them final), the
 * first at most first_mb MB of f32 gradients and the others mb (a
 * parameter larger than its cap is a bucket of its own). mb 0 takes
 * PyTorch's 25, first_mb 0 its 1, or mb where that is smaller. A bucket is a slice [lo, hi) of the buffer, the
 * gaps between its parameters included, so a collective takes it as it
 * lies: no copy. As the grads_ready hook reports gradients final,
 * ct_buckets_next hands out the buckets whose gradients all are, always in
 * index order, so every replica starts the same collectives in the same
 * order. Used by DDP (src/parallel/ddp.c) and by DataParallel over GPUs
 * (src/parallel/dp.c). */
#ifndef CTRAIN_PARALLEL_BUCKETS_H
#define CTRAIN_PARALLEL_BUCKETS_H

#include <stddef.h>

#include "ctrain/model.h"

typedef struct ct_buckets ct_buckets;

ct_status ct_buckets_create(ct_model *m, double first_mb, double mb, ct_buckets **out);
void ct_buckets_destroy(ct_buckets *b);
int ct_buckets_count(const ct_buckets *b);
/* Bucket k's slice of the flat gradient buffer. */
void ct_buckets_range(const ct_buckets *b, int k, size_t *lo, size_t *hi);
/* The bucket whose slice holds offset of the flat buffer (-1: none). */
int ct_buckets_find(const ct_buckets *b, size_t offset);
/* The gradients [first, first + count) of the flat buffer are final. */
void ct_buckets_ready(ct_buckets *b, size_t first, size_t count);
/* Every gradient counts as final (the sync point: a parameter without a
 * gradient this step never reports one). */
void ct_buckets_all_ready(ct_buckets *b);
/* The next bucket to start (-1: the next in order is not final yet, or
 * all have started). */
int ct_buckets_next(ct_buckets *b);
/* A new step: nothing final, nothing started. */
void ct_buckets_reset(ct_buckets *b);

#endif
