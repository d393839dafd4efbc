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

typedef struct ct_gpu_data ct_gpu_data;

/* Raw batches staged at once (in flight on the device): as many as the
 * device step's staging slots (CT_STAGE_SLOTS, src/nn/device_state.h). */
#define CT_GPU_DATA_SLOTS 2

/* Device bytes ct_gpu_data_create allocates for loader l (its mode, batch
 * size and dataset): CT_LOADER_RAW_U8 CT_GPU_DATA_SLOTS raw batches and
 * their sample ids; CT_LOADER_INDICES every image as uint8, every label
 * (int64) and the epoch's order (int64); 0 for CT_LOADER_FLOAT. */
size_t ct_gpu_data_bytes(const ct_loader *l);

/* Creates the device side of loader l (mode CT_LOADER_RAW_U8 or
 * CT_LOADER_INDICES) on dev and attaches it to l (ct_loader_set_device_data),
 * so the batches l delivers carry it and the device step stages them
 * through ct_gpu_data_stage. In index mode the whole split is uploaded
 * here, once. `what` names the split in messages ("train", "test").
 * Fails with CT_ERR_UNSUPPORTED when dev has no transform_u8 (only CUDA
 * has), CT_ERR_INVALID_ARG for a CT_LOADER_FLOAT loader, and
 * CT_ERR_OUT_OF_MEMORY, with the split's size by part and the device's
 * free/total memory, when it does not fit (decided before allocating). */
ct_status ct_gpu_data_create(ct_device *dev, ct_loader *l, const char *what, ct_gpu_data **out);

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

/* Waits for work queued on the device and frees g's buffers. The loader
 * must stage no further batch through g (destroy it first, or
 * ct_loader_set_device_data(l, NULL)). NULL is a no-op. */
void ct_gpu_data_destroy(ct_gpu_data *g);

#endif
