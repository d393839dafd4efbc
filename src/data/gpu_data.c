/* Device side of the GPU data modes. One device allocation per loader:
 *   raw mode    | u8 batch [B, c, h, w] | sample ids [B] |  x CT_GPU_DATA_SLOTS
 *   index mode  | u8 images [n, c, h, w] | labels [n] | epoch order [order_n] |
 * Raw batches take one slot per device-step staging slot so that batch k+1's
 * copy (copy stream) never lands in the buffer batch k's transform (compute
 * stream) has still to read.
 * The transform itself is the backend's transform_u8 (cuda_transform.cu),
 * whose arithmetic is src/math/transform_params.h. */
#include "data/gpu_data.h"

#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "data/dataset_impl.h"
#include "math/transform_params.h"

struct ct_gpu_data {
  ct_device *dev;
  ct_loader *loader;
  int mode;
  ct_xf_params p;
  uint64_t seed;
  void *block;
  uint8_t *images;   /* raw: slot 0's batch (slot k at + k * slot_bytes); index: the split */
  int64_t *ids;      /* raw: slot 0's sample ids (same stride) */
  size_t slot_bytes; /* raw: one slot, batch and ids */
  int64_t *labels;   /* index: every label */
  int64_t *order;    /* index: the epoch's order */
  int64_t order_epoch;            /* epoch whose order is on the device; -1: none */
  const int64_t *order_host;      /* the host order that was uploaded */
};

static size_t al(size_t b) { return (b + 255) / 256 * 256; }
static double gib(size_t b) { return (double)b / 1073741824.0; }

/* One raw slot: a batch of uint8 images, then its sample ids. */
static size_t raw_slot_bytes(const ct_loader_options *o, size_t img) {
  return al((size_t)o->batch_size * img) + al((size_t)o->batch_size * 8);
}

size_t ct_gpu_data_bytes(const ct_loader *l) {
  const ct_loader_options *o = ct_loader_get_options(l);
  const ct_dataset *ds = ct_loader_dataset(l);
  size_t img = (size_t)ds->c * (size_t)ds->h * (size_t)ds->w;
  if (o->mode == CT_LOADER_RAW_U8) return CT_GPU_DATA_SLOTS * raw_slot_bytes(o, img);
  if (o->mode == CT_LOADER_INDICES) {
    /* This rank's order, as long as the loader's (the same sampler). */
    ct_sampler sm;
    ct_loader_sampler(o, ds->n, &sm);
    size_t order_n = (size_t)ct_sampler_count(&sm);
    return al((size_t)ds->n * img) + al((size_t)ds->n * 8) + al(order_n * 8);
  }
  return 0;
}

ct_status ct_gpu_data_create(ct_device *dev, ct_loader *l, const char *what, ct_gpu_data **out) {
  *out = NULL;
  const ct_backend *be = ct_device_backend(dev);
  const ct_loader_options *o = ct_loader_get_options(l);
  const ct_dataset *ds = ct_loader_dataset(l);
  if (!be->transform_u8)
    return ct_error(CT_ERR_UNSUPPORTED,
                    "GPU data path (%s split): device %s has no batch transform; --gpu-transforms and "
                    "--data-on-gpu need --device cuda",
                    what, ct_device_name(dev));
  if (o->mode != CT_LOADER_RAW_U8 && o->mode != CT_LOADER_INDICES)
    return ct_error(CT_ERR_INVALID_ARG, "GPU data path (%s split): the loader must deliver raw uint8 batches or indices (mode %d)",
                    what, o->mode);
  size_t img = (size_t)ds->c * (size_t)ds->h * (size_t)ds->w, need = ct_gpu_data_bytes(l);
  size_t dfree = 0, dtotal = 0;
  if (be->mem_info && be->mem_info(dev, &dfree, &dtotal) != CT_OK) dfree = dtotal = 0;
  int resident = o->mode == CT_LOADER_INDICES;
  if (dtotal && need > dfree) {
    if (resident)
      return ct_error(CT_ERR_OUT_OF_MEMORY,
                      "--data-on-gpu: the %s split of %s (%lld images of %dx%dx%d uint8 = %.3f GiB + labels %.3f GiB + "
                      "epoch order %.3f GiB) needs %.3f GiB but %s has %.3f GiB free of %.3f GiB (the model is already "
                      "resident); use --gpu-transforms (streams uint8 batches) instead",
                      what, ds->name, (long long)ds->n, ds->c, ds->h, ds->w, gib(al((size_t)ds->n * img)),
                      gib(al((size_t)ds->n * 8)), gib(need - al((size_t)ds->n * img) - al((size_t)ds->n * 8)), gib(need),
                      ct_device_name(dev), gib(dfree), gib(dtotal));
    return ct_error(CT_ERR_OUT_OF_MEMORY,
                    "--gpu-transforms: the %s split's uint8 batch staging (%d slots of %lld x %dx%dx%d) needs %.3f GiB "
                    "but %s has %.3f GiB free of %.3f GiB",
                    what, CT_GPU_DATA_SLOTS, (long long)o->batch_size, ds->c, ds->h, ds->w, gib(need),
                    ct_device_name(dev), gib(dfree), gib(dtotal));
  }
  ct_gpu_data *g = calloc(1, sizeof *g);
  if (!g) return ct_error(CT_ERR_OUT_OF_MEMORY, "GPU data path: out of host memory");
  g->dev = dev;
  g->loader = l;
  g->mode = o->mode;
  g->seed = o->seed;
  g->order_epoch = -1;
  ct_xf_params_from(&o->transform, ds->c, ds->h, ds->w, &g->p);
  g->block = ct_device_alloc(dev, need);
  if (!g->block) {
    free(g);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "GPU data path (%s split): cannot allocate %.3f GiB on %s", what, gib(need),
                    ct_device_name(dev));
  }
  char *b = g->block;
  g->images = (uint8_t *)b;
  ct_status s = CT_OK;
  if (resident) {
    size_t oi = al((size_t)ds->n * img), ol = oi + al((size_t)ds->n * 8);
    g->labels = (int64_t *)(b + oi);
    g->order = (int64_t *)(b + ol);
    /* Once, synchronously: the split stays on the device for the run. */
    if (ds->n) s = ct_device_copy(dev, g->images, NULL, ds->pixels, (size_t)ds->n * img);
    if (s == CT_OK && ds->n) s = ct_device_copy(dev, g->labels, NULL, ds->labels, (size_t)ds->n * 8);
  } else {
    g->slot_bytes = raw_slot_bytes(o, img);
    g->ids = (int64_t *)(b + al((size_t)o->batch_size * img));
  }
  if (s != CT_OK) {
    ct_gpu_data_destroy(g);
    return ct_error_wrap(s, "--data-on-gpu: uploading the %s split (%.3f GiB)", what, gib(need));
  }
  ct_loader_set_device_data(l, g);
  *out = g;
  return CT_OK;
}

/* On the copy stream where the backend has one (the compute stream waits
 * on its event), so the copy overlaps the steps still queued. */
static ct_status h2d(ct_device *dev, void *dst, const void *src, size_t bytes) {
  const ct_backend *be = ct_device_backend(dev);
  if (!bytes) return CT_OK;
  return be->copy_h2d_async ? be->copy_h2d_async(dev, dst, src, bytes) : ct_device_copy(dev, dst, NULL, src, bytes);
}

ct_status ct_gpu_data_stage(ct_gpu_data *g, const ct_batch *b, int slot, void *xd, ct_dtype dtype, ct_layout layout,
                            int64_t *yd, ct_tensor *x) {
  ct_device *dev = g->dev;
  const ct_backend *be = ct_device_backend(dev);
  ct_xf_batch xb;
  memset(&xb, 0, sizeof xb);
  xb.p = g->p;
  xb.n = b->n;
  xb.seed = g->seed;
  xb.epoch = b->epoch;
  xb.dst = xd;
  xb.dtype = (int32_t)dtype;
  xb.nhwc = layout == CT_LAYOUT_NHWC;
  if (layout != CT_LAYOUT_PLAIN && layout != CT_LAYOUT_NHWC)
    return ct_error(CT_ERR_INVALID_ARG, "GPU data path: the transform writes NCHW or channels-last, not layout %d",
                    (int)layout);
  if (g->mode == CT_LOADER_RAW_U8) {
    if (b->x.dtype != CT_U8 || !b->x.data || !b->samples)
      return ct_error(CT_ERR_INVALID_ARG, "GPU data path: batch %lld is not a raw uint8 batch", (long long)b->index);
    if (slot < 0 || slot >= CT_GPU_DATA_SLOTS)
      return ct_error(CT_ERR_INVALID_ARG, "GPU data path: staging slot %d (there are %d)", slot, CT_GPU_DATA_SLOTS);
    size_t img = (size_t)g->p.c * (size_t)g->p.h * (size_t)g->p.w;
    uint8_t *images = g->images + (size_t)slot * g->slot_bytes;
    int64_t *ids = (int64_t *)((char *)g->ids + (size_t)slot * g->slot_bytes);
    CT_TRY(h2d(dev, images, b->x.data, (size_t)b->n * img));
    CT_TRY(h2d(dev, ids, b->samples, (size_t)b->n * 8));
    CT_TRY(h2d(dev, yd, b->y.data, (size_t)b->n * 8));
    xb.src = images;
    xb.samples = ids;
  } else {
    if (!b->order || !b->samples || b->samples < b->order || b->samples + b->n > b->order + b->order_n)
      return ct_error(CT_ERR_INVALID_ARG, "GPU data path: batch %lld carries no epoch order", (long long)b->index);
    if (g->order_epoch != b->epoch || g->order_host != b->order) {
      /* Once per epoch, in order on the compute stream, so the previous
       * epoch's gathers (queued earlier) still see their order. */
      CT_TRY(ct_device_copy(dev, g->order, NULL, b->order, (size_t)b->order_n * 8));
      g->order_epoch = b->epoch;
      g->order_host = b->order;
    }
    xb.src = g->images;
    xb.rows = g->order + (b->samples - b->order);
    xb.labels = g->labels;
    xb.labels_out = yd;
  }
  CT_TRY(be->transform_u8(dev, &xb));
  int64_t xs[4] = {b->n, g->p.c, g->p.oh, g->p.ow};
  *x = ct_tensor_view(xd, dtype, 4, xs);
  x->layout = layout;
  x->device = dev;
  return CT_OK;
}

void ct_gpu_data_destroy(ct_gpu_data *g) {
  if (!g) return;
  if (g->block) {
    /* Queued transforms may still read the block. */
    (void)ct_device_sync(g->dev);
    ct_device_free(g->dev, g->block);
  }
  free(g);
}
