/* Data: datasets, per-sample transforms and a prefetching batch loader.
 *
 * Conventions follow torchvision + torch.utils.data: a dataset is a list of
 * (image, label) samples held in memory once as uint8 CHW planes with an
 * integer class label; transforms run per sample in the loader in the fixed
 * order Resize -> RandomCrop -> RandomHorizontalFlip -> ToFloat ->
 * Normalize; the loader yields float32 [B,C,H,W] batches and int64 labels
 * [B] in a deterministic order. Every random draw is a pure function of
 * the seed and the epoch: the order is torch.utils.data.DistributedSampler's
 * (torch.randperm seeded with seed + epoch, ct_sampler_indices), and crop
 * offsets and flips come from the counter-based RNG keyed by (seed, epoch,
 * sample index), so results do not depend on the number of worker threads
 * or their timing, and a run resumed at batch k of an epoch sees exactly
 * the batches an uninterrupted run would have seen.
 */
#ifndef CTRAIN_DATA_H
#define CTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>
#include "ctrain/status.h"
#include "ctrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most channels a dataset image may have (Normalize takes one mean/std per
 * channel). */
#define CT_DATA_MAX_CHANNELS 4

/* Where Debian's `dataset-fashion-mnist` package installs its files. */
#define CT_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

typedef struct ct_dataset ct_dataset;

typedef struct ct_dataset_options {
  uint64_t seed;          /* synthetic data */
  int synth_channels;     /* synthetic: C, H, W (default 1, 28, 28) */
  int synth_height;
  int synth_width;
  int synth_classes;      /* default 10 */
  int64_t synth_count;    /* 0: 1024 for train, 256 for test */
  int resize_h, resize_w; /* folder: images of another size are resized
                             (bilinear) to this at load; 0 = all images must
                             have the size of the first one */
  int channels;           /* folder: 1 (gray) or 3 (RGB); 0 = from the first
                             image (1 if it is grayscale, else 3) */
} ct_dataset_options;

/* Fills the defaults documented in ct_dataset_options (seed 0). */
void ct_dataset_options_default(ct_dataset_options *opt);

/* Opens the train (train != 0) or test split of a dataset and reads it all
 * into memory. spec is one of
 *   "fashion-mnist"            Fashion-MNIST from CT_FASHION_MNIST_DIR
 *   "fashion-mnist:PATH", "mnist:PATH"   IDX files (raw or .gz) in PATH
 *   "cifar10:PATH", "cifar100:PATH"      CIFAR binary batches in PATH (or in
 *                              PATH/cifar-10-batches-bin, PATH/cifar-100-binary)
 *   "folder:PATH"              PATH/{train,test}/<class>/<file>.png or .jpg, or
 *                              PATH/<class>/... when there is no split (then
 *                              both splits are the same images); classes are
 *                              the sorted subfolder names, files are sorted
 *   "synthetic"                learnable random data from opt (seeded)
 *   "synthetic:N"              the same with N training and ceil(N/4) test
 *                              samples (opt->synth_count, when set, wins)
 * opt may be NULL (defaults). Files are fully validated (magic numbers,
 * dimensions, sizes, label ranges); a failure returns CT_ERR_NOT_FOUND,
 * CT_ERR_IO or CT_ERR_PARSE with a message naming the file and what was
 * expected, and a missing dataset lists every path tried and how to get it. */
ct_status ct_dataset_open(const char *spec, int train, const ct_dataset_options *opt, ct_dataset **out);

/* Builds a dataset from n images already in memory: pixels [n, c, h, w]
 * uint8 and labels [n] each in [0, classes). Both are copied. Fails with
 * CT_ERR_INVALID_ARG on bad sizes or a label out of range. */
ct_status ct_dataset_from_memory(const char *name, int64_t n, int c, int h, int w, int classes,
                                 const uint8_t *pixels, const int64_t *labels, ct_dataset **out);

/* Number of samples. */
int64_t ct_dataset_size(const ct_dataset *ds);
/* Image shape (channels, height, width); any output pointer may be NULL. */
void ct_dataset_shape(const ct_dataset *ds, int *c, int *h, int *w);
/* Number of classes; labels are in [0, classes). */
int ct_dataset_classes(const ct_dataset *ds);
/* Short name, e.g. "fashion-mnist", "cifar10", "folder", "synthetic". */
const char *ct_dataset_name(const ct_dataset *ds);
/* Name of class k for folder datasets (the subfolder name), else NULL. */
const char *ct_dataset_class_name(const ct_dataset *ds, int k);
/* Sample i: *pixels points at its c*h*w uint8 CHW bytes, owned by the
 * dataset and valid until ct_dataset_close(). Either output may be NULL.
 * CT_ERR_INVALID_ARG if i is out of range. Safe to call from many threads. */
ct_status ct_dataset_sample(const ct_dataset *ds, int64_t i, const uint8_t **pixels, int64_t *label);
void ct_dataset_close(ct_dataset *ds);

/* ---- transforms ---- */

/* Most pixels (height x width) a decoded image may have: PIL's
 * decompression-bomb limit (2 * Image.MAX_IMAGE_PIXELS), beyond which it
 * refuses to open a file. */
#define CT_IMAGE_MAX_PIXELS 178956970ull

/* Decodes the PNG or JPEG file at path (recognised by its signature, not
 * its name) into *pixels, malloc'd, interleaved HWC: *channels is 1 for a
 * grayscale image and 3 for a colour one; alpha is dropped and palettes and
 * 16-bit samples are expanded/reduced to 8-bit, as PIL's convert() does.
 * Fails with CT_ERR_PARSE naming the file for anything undecodable, and
 * CT_ERR_UNSUPPORTED for a format this build lacks, a CMYK JPEG or an image
 * of more than CT_IMAGE_MAX_PIXELS pixels. */
ct_status ct_image_decode(const char *path, uint8_t **pixels, int *h, int *w, int *channels);

typedef struct ct_transform {
  int resize_h, resize_w;  /* Resize((h, w)), bilinear as F.interpolate(
                              align_corners=False, antialias=False); 0 = off */
  int crop_h, crop_w;      /* RandomCrop((h, w)); 0 = off */
  int crop_padding;        /* zeros added on every side before cropping */
  float hflip_p;           /* RandomHorizontalFlip(p); 0 = off */
  int to_float;            /* 1: divide by 255 (ToTensor); 0: keep 0..255 */
  int normalize;           /* 1: (x - mean[c]) / std[c] */
  float mean[CT_DATA_MAX_CHANNELS];
  float std[CT_DATA_MAX_CHANNELS];
} ct_transform;

/* ToFloat only: no resize, crop, flip or normalize. */
void ct_transform_default(ct_transform *t);

/* Checks t against an input of c x h x w and gives the output size. Fails
 * with CT_ERR_INVALID_ARG (naming the field) for a crop larger than the
 * padded image, a negative size, a std of 0 or too many channels. */
ct_status ct_transform_check(const ct_transform *t, int c, int h, int w, int *out_h, int *out_w);

/* Transforms one CHW uint8 image into dst (float [c, out_h, out_w]). The
 * random choices come from the RNG stream (seed, CT_RNG_AUGMENT, epoch,
 * sample), so the same sample in the same epoch is always transformed the
 * same way. t must have passed ct_transform_check for this shape. */
void ct_transform_apply(const ct_transform *t, const uint8_t *src, int c, int h, int w, uint64_t seed,
                        int64_t epoch, int64_t sample, float *dst);

/* ---- sampler ---- */

/* Writes torch.randperm(n, generator=torch.Generator().manual_seed(seed))
 * of PyTorch 1.13 on the CPU into out[n]: an MT19937 seeded as
 * at::mt19937(seed) does (the low 32 bits of seed; higher bits are ignored
 * there too), then randperm's Fisher-Yates pass, which for i in [0, n-1)
 * swaps out[i] with out[i + next() % (n - i)]: one 32-bit draw per step,
 * the same path for every n (tests/parity/test_sampler_torch.py checks it
 * against torch). n 0 writes nothing. */
void ct_randperm(int64_t n, uint64_t seed, int64_t *out);

/* What a distributed split does with the samples num_replicas (R) does not
 * divide evenly: ct_sampler.tail, ct_loader_options.dist_tail. */
typedef enum ct_dist_tail {
  CT_DIST_PAD = 0,  /* DistributedSampler(drop_last=False): the order is
                       padded by repeating it from its start to R * ceil(n/R)
                       entries; every rank has ceil(n/R) (the default) */
  CT_DIST_DROP = 1, /* DistributedSampler(drop_last=True): the order is cut
                       to R * floor(n/R) entries; every rank has floor(n/R) */
  CT_DIST_EXACT = 2 /* evaluation: every sample exactly once, no padding;
                       rank r has ceil((n - r) / R), one fewer than rank 0
                       on the ranks r >= n % R when R does not divide n */
} ct_dist_tail;

/* torch.utils.data.DistributedSampler(dataset of n samples, num_replicas,
 * rank, shuffle, seed, drop_last) with set_epoch(epoch): the epoch's order
 * is randperm(n, seed + epoch) with shuffle, else 0..n-1; it is padded or
 * cut as `tail` says, and rank takes every num_replicas-th entry from
 * position rank. num_replicas 0 or 1 is one rank that takes the whole
 * order (rank is then ignored), as DistributedSampler(num_replicas=1). */
typedef struct ct_sampler {
  int64_t n;          /* dataset length, >= 0 */
  int num_replicas;   /* >= 0 */
  int rank;           /* in [0, num_replicas) when num_replicas > 1 */
  int shuffle;        /* 1: randperm(n, seed + epoch); 0: file order */
  uint64_t seed;
  int tail;           /* ct_dist_tail */
} ct_sampler;

/* CT_OK, or CT_ERR_INVALID_ARG naming the field for a negative n or
 * num_replicas, a rank outside [0, num_replicas) or an unknown tail.
 * ct_sampler_count and ct_sampler_indices take only a sampler that passed. */
ct_status ct_sampler_check(const ct_sampler *s);

/* The number of indices s gives its rank in every epoch (the same in every
 * epoch): DistributedSampler's num_samples for CT_DIST_PAD and
 * CT_DIST_DROP, ceil((n - rank) / num_replicas) for CT_DIST_EXACT. */
int64_t ct_sampler_count(const ct_sampler *s);

/* Writes s's rank's indices of epoch `epoch` (ct_sampler_count of them)
 * into out, in the order the rank visits them. work is n entries of scratch
 * that receives the whole epoch's permutation; it is unused (may be NULL)
 * without shuffle, and may be out itself when num_replicas <= 1 (the rank's
 * share is then the whole order). The shuffle seed is s->seed + epoch,
 * wrapping modulo 2^64, as DistributedSampler's seed + epoch. */
void ct_sampler_indices(const ct_sampler *s, int64_t epoch, int64_t *work, int64_t *out);

/* ---- loader ---- */

/* What a loader puts in its batches (ct_loader_options.mode). The two
 * device modes leave the transform to the GPU (src/data/gpu_data.h); the
 * transform is still checked against the dataset and ct_loader_shape
 * still gives its output shape. */
typedef enum ct_loader_mode {
  CT_LOADER_FLOAT = 0,   /* x: transformed f32 images (the default) */
  CT_LOADER_RAW_U8 = 1,  /* x: the images as stored, u8 [B, C, H, W], untransformed */
  CT_LOADER_INDICES = 2  /* x: no data (NULL, u8 [B, C, H, W] shape): only samples and labels */
} ct_loader_mode;

typedef struct ct_batch {
  ct_tensor x;     /* [B, C, H, W] f32, contiguous, 64-byte aligned (see ct_loader_mode) */
  ct_tensor y;     /* [B] i64 labels */
  int64_t n;       /* B: batch_size, or fewer for a last partial batch */
  int64_t index;   /* batch index within the epoch */
  int64_t epoch;
  /* [n] dataset index of each sample: the augmentation key. In
   * CT_LOADER_RAW_U8 mode a copy in the batch's own (alloc-hook) buffer,
   * otherwise a view into order. */
  const int64_t *samples;
  /* This rank's whole order of the epoch ([order_n]); batch k holds
   * order[k * batch_size ...]. Valid until the next ct_loader_start_epoch. */
  const int64_t *order;
  int64_t order_n;
  void *device_data; /* the loader's ct_loader_set_device_data pointer */
} ct_batch;

typedef struct ct_loader_options {
  int64_t batch_size;  /* default 64 */
  int shuffle;         /* 1: new permutation per epoch; 0: file order */
  int drop_last;       /* 1: no partial last batch */
  int workers;         /* loader threads; 0 = load on the caller's thread */
  int prefetch;        /* batches prepared ahead (0: 2 per worker, >= 2) */
  uint64_t seed;       /* shuffle (randperm seeded with seed + epoch) and augmentation */
  ct_transform transform;
  /* DistributedSampler: each of num_replicas ranks sees every
   * num_replicas-th index of the epoch's order (ct_sampler, whose shuffle
   * and seed are the fields above). num_replicas 0 or 1 = off: the whole
   * order, the same as DistributedSampler(num_replicas=1). */
  int num_replicas, rank;
  /* ct_dist_tail: what the ranks do with the samples num_replicas does not
   * divide evenly. CT_DIST_PAD (default) wraps so all ranks have the same
   * count; CT_DIST_DROP leaves them out; CT_DIST_EXACT, for evaluation,
   * visits each sample exactly once. drop_last above is separate: it drops
   * this rank's partial last batch, as DataLoader's drop_last. */
  int dist_tail;
  /* Optional allocator for batch buffers (e.g. pinned host memory); must
   * return 64-byte aligned memory. NULL = aligned_alloc/free. */
  void *(*alloc)(void *ctx, size_t bytes);
  void (*free)(void *ctx, void *p);
  void *alloc_ctx;
  int mode;            /* ct_loader_mode; default CT_LOADER_FLOAT */
} ct_loader_options;

typedef struct ct_loader ct_loader;

/* batch_size 64, no shuffle, no drop_last, 0 workers, seed 0, ToFloat. */
void ct_loader_options_default(ct_loader_options *opt);

/* Creates a loader over ds (which must outlive it), allocating its batch
 * buffers and starting opt->workers threads. Fails with CT_ERR_INVALID_ARG
 * for bad options or a transform that does not fit the dataset's shape. */
ct_status ct_loader_create(const ct_dataset *ds, const ct_loader_options *opt, ct_loader **out);

/* Batches in one epoch for this rank. */
int64_t ct_loader_batches_per_epoch(const ct_loader *l);
/* Output image shape after the transform. Any pointer may be NULL. */
void ct_loader_shape(const ct_loader *l, int *c, int *h, int *w);

/* Begins epoch `epoch` at batch start_batch (0 for a fresh epoch; k to
 * resume after k delivered batches). Work still queued for a previous epoch
 * is dropped; batches the caller still holds stay valid until released.
 * CT_ERR_INVALID_ARG if start_batch is outside [0, batches_per_epoch]. */
ct_status ct_loader_start_epoch(ct_loader *l, int64_t epoch, int64_t start_batch);

/* Hands out the next batch of the epoch in order, waiting for a worker if
 * needed. At the end of the epoch returns CT_OK with *b == NULL. The batch
 * belongs to the caller until ct_loader_release(); a caller may hold up to
 * `prefetch` batches at once (more fails with CT_ERR_INVALID_ARG rather
 * than waiting forever). CT_ERR_INVALID_ARG before ct_loader_start_epoch. */
ct_status ct_loader_next(ct_loader *l, ct_batch **b);

/* Gives a batch's buffers back for reuse. b may be NULL. */
void ct_loader_release(ct_loader *l, ct_batch *b);

/* The options the loader runs with (defaults filled in: alloc hooks,
 * prefetch); valid while the loader lives. */
const ct_loader_options *ct_loader_get_options(const ct_loader *l);

/* The dataset the loader reads (as given to ct_loader_create). */
const ct_dataset *ct_loader_dataset(const ct_loader *l);

/* Sets the pointer every batch delivered from now on carries in
 * device_data (the trainer's device step uses it to find the GPU-side
 * data of this loader); NULL clears it. Thread-safe; batches already
 * handed out keep the pointer they had. */
void ct_loader_set_device_data(ct_loader *l, void *p);

/* Stops the workers (also in the middle of an epoch) and frees everything;
 * batches not yet released become invalid. NULL is a no-op. */
void ct_loader_destroy(ct_loader *l);

/* The device side of a loader in a GPU data mode (CT_LOADER_RAW_U8,
 * CT_LOADER_INDICES): its buffers on a CUDA device and the transform
 * that runs there. ct_fit, ct_evaluate and ct_predict stage the loader's
 * batches through it. */
typedef struct ct_gpu_data ct_gpu_data;
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

/* Waits for work queued on the device and frees g's buffers. The loader
 * must stage no further batch through g (destroy it first, or
 * ct_loader_set_device_data(l, NULL)). NULL is a no-op. */
void ct_gpu_data_destroy(ct_gpu_data *g);

#ifdef __cplusplus
}
#endif
#endif
