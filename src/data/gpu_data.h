/* The device side of a loader in one of the GPU data modes (--gpu-transforms,
 * --data-on-gpu): device buffers for the raw uint8 batches or the whole
 * split, and the staging step that turns a delivered batch into the
 * batch the model takes, with the transform run on the device
 * (backend entry transform_u8). Internal. */
#ifndef CTRAIN_DATA_GPU_DATA_H
#define CTRAIN_DATA_GPU_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/data.h"
#include "ctrain/device.h"


/* (ct_gpu_data, CT_GPU_DATA_SLOTS, ct_gpu_data_bytes, ct_gpu_data_create
 * and ct_gpu_data_destroy are public: ctrain/data.h. CT_GPU_DATA_SLOTS raw
 * batches are staged at once: as many as the device step's staging slots,
 * CT_STAGE_SLOTS in src/exec/device_state.h.) */


/* Queues, on g's device, what puts batch b (delivered by g's loader) into
 * the device buffers xd (the transform's output [n, C, H', W'] in dtype
 * (f32, bf16 or f16) and layout (CT_LAYOUT_PLAIN or NHWC): what the model
 * takes, ct_model_input_dtype) and yd (int64 [n] labels), and sets *x to
 * the device view of xd. Raw
 * mode: the uint8 images, sample ids and labels go host->device on the
 * copy stream into raw slot `slot` (0 .. CT_GPU_DATA_SLOTS-1), then the
 * transform runs on the compute stream; the caller guarantees that no
 * queued work still reads that slot (the device step stages batch k in
 * slot k % CT_STAGE_SLOTS after its ct_stage_wait_slot), and keeps b's
 * host buffers untouched until the copy has run. Index mode (slot
 * ignored): the epoch's order is uploaded when b is the first batch seen
 * of a new epoch, then images and labels are gathered on the device by
 * index: no image crosses the bus. */
ct_status ct_gpu_data_stage(ct_gpu_data *g, const ct_batch *b, int slot, void *xd, ct_dtype dtype, ct_layout layout,
                            int64_t *yd, ct_tensor *x);


#endif
