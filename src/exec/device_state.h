/* A model's state on a device with its own memory (CUDA): one device
 * allocation holding the step arena, the flat parameters, gradients and
 * buffers, O3's rounding buffer, the batch staging buffers and the step
 * statistics (the optimizer's state is the optimizer's own allocation,
 * counted in the memory check only); and the
 * out-of-memory message that gives the plan's numbers. Internal. */
#ifndef CTRAIN_EXEC_DEVICE_STATE_H
#define CTRAIN_EXEC_DEVICE_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/model.h"
#include "math/fused_step.h"

/* The numbers an out-of-memory message reports (bytes). */
typedef struct ct_mem_numbers {
  const char *device, *model, *precision;
  int64_t batch;
  /* low_precision: O3's rounding buffer (the AMP weight copies are in the arena) */
  size_t arena, params, grads, buffers, low_precision, optimizer_state, staging;
  size_t dev_free, dev_total; /* 0 when the device cannot say */
  /* The step arena with activation recompute (--recompute), 0 when it is
   * on already or would save nothing. */
  size_t arena_recompute;
} ct_mem_numbers;

/* Sum of every part of n. */
size_t ct_mem_total(const ct_mem_numbers *n);

/* Writes the out-of-memory message for n into buf (cap bytes, always
 * terminated): what the plan needs in total and by part, what the device
 * has, and what would fit: --precision bf16 (when not already 16-bit; its
 * estimate halves the arena and staging), the largest --batch-size that
 * fits (the arena and staging scale with the batch), --batch-size B/k
 * --accumulate k for the smallest divisor k of the batch whose
 * micro-batch fits (the same effective batch; k = 2 when the free memory
 * is unknown), and --recompute with the total its smaller arena gives
 * (when n->arena_recompute says it saves something). */
void ct_oom_message(const ct_mem_numbers *n, char *buf, size_t cap);

/* 1 when models prepared on dev keep their state in dev's own memory. */
int ct_model_device_resident(const ct_device *dev);

/* Called by ct_model_prepare after the plan is solved, for a resident
 * device: allocates the one block (or fails with CT_ERR_OUT_OF_MEMORY and
 * ct_oom_message's text), copies parameters, buffers and counters in,
 * zeroes the gradients, and points the model's flat storage, state views,
 * weights and arena into the block. */
ct_status ct_model_device_bind(ct_model *m, ct_device *dev);

/* Copies the state back to the host buffers, frees the block and points
 * everything at host memory again (re-prepare, destroy). No-op when the
 * model is not resident. */
void ct_model_device_release(ct_model *m);


/* Batch staging slots in the device block: the copy of batch k+1 lands
 * in the other slot while step k still reads its own (src/train/
 * device_step.c), so the copy can overlap compute. */
#define CT_STAGE_SLOTS 2

/* Whether ct_model_share_stage_x is on. */
int ct_model_stage_x_shared(const ct_model *m);


/* The resident model's pieces (NULL when not resident): batch staging
 * for x [max_batch, ...] (f32, or the narrowed input's dtype) and y
 * [max_batch] int64 (slot 0), and the step statistics block. */
void *ct_model_stage_x(ct_model *m);
int64_t *ct_model_stage_y(ct_model *m);
/* Staging slot k (0..CT_STAGE_SLOTS-1; other k give NULL) for x and y,
 * shaped as ct_model_stage_x/y. NULL when the model is not resident. */
void *ct_model_stage_x_at(ct_model *m, int k);
int64_t *ct_model_stage_y_at(ct_model *m, int k);
ct_step_stats *ct_model_step_stats(ct_model *m);

#endif
