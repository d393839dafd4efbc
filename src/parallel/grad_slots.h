/* ZeRO-2's gradient memory on a device: a few bucket-sized slots and the
 * rank's shard, instead of a buffer of the whole model's gradients.
 *
 * Bucket k (buckets.h) is written by the backward into slot k % nslots:
 * the parameters' gradient views point there for good, so a captured
 * step replays the same addresses. As soon as the bucket is final its
 * reduce-scatter takes it from the slot into the shard's gradients, and
 * bucket k + nslots takes the slot only after that collective: the
 * compute stream waits for it (a point on the collective stream,
 * backend_ops.def's coll_record / coll_await) and zeroes the slot before
 * the first kernel writes there. Every wait is on the device, so the
 * backward overlaps the collectives of the buckets before, as DDP's does.
 * The previous step's collectives are done before a step's backward (the
 * sync hook's fence). One step writes each bucket once: micro-steps that
 * accumulate are not supported (ct_fit refuses them). */
#ifndef CTRAIN_PARALLEL_GRAD_SLOTS_H
#define CTRAIN_PARALLEL_GRAD_SLOTS_H

#include "ctrain/model.h"
#include "parallel/buckets.h"

typedef struct ct_grad_slots ct_grad_slots;

/* The slots at most (fewer when there are fewer buckets). */
#define CT_GRAD_SLOTS 2

/* Device bytes of the slots for b's buckets and of a shard of n values. */
size_t ct_grad_slots_bytes(const ct_buckets *b, size_t n);
/* Prepares m (resident on dev, prepared for training, the buckets b made
 * from it) again without its gradient buffer (unless it was prepared
 * without one), allocates the slots and the
 * shard [lo, hi) of the flat layout (zeroed), and points the gradients at
 * the slots. b must outlive the slots. On failure the model may be left
 * without gradients (prepare it again). */
ct_status ct_grad_slots_create(ct_model *m, ct_device *dev, const ct_buckets *b, size_t lo, size_t hi,
                               ct_grad_slots **out);
/* Points the gradients nowhere (the model has none until prepared again)
 * and frees the memory, after the collectives reading it are done. */
void ct_grad_slots_destroy(ct_grad_slots *g);
/* The shard's reduced gradients: hi - lo values, flat offset lo first. */
float *ct_grad_slots_shard(const ct_grad_slots *g);
/* Bucket k's slot: the bucket's slice of the flat layout from its start. */
float *ct_grad_slots_of(const ct_grad_slots *g, int k);
/* Before the backward writes gradients [first, first + count): each
 * bucket among them takes its slot, if it has not this step. */
ct_status ct_grad_slots_take(ct_grad_slots *g, size_t first, size_t count);
/* Every bucket that has not taken its slot this step does (the sync: a
 * parameter without a gradient this step then reads zeros). */
ct_status ct_grad_slots_take_all(ct_grad_slots *g);
/* Bucket k's collective is queued: its slot is free once that is done. */
ct_status ct_grad_slots_queued(ct_grad_slots *g, int k);
/* A new step: no bucket holds a slot. */
void ct_grad_slots_reset(ct_grad_slots *g);

#endif
