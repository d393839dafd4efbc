/* The dataset object behind ct_dataset and the per-format loaders that fill
 * it. Internal to src/data. */
#ifndef CTRAIN_DATA_DATASET_IMPL_H
#define CTRAIN_DATA_DATASET_IMPL_H

#include <stdint.h>
#include "ctrain/data.h"

struct ct_dataset {
  char name[32];
  int64_t n;
  int c, h, w;
  int classes;
  uint8_t *pixels;    /* [n, c, h, w] */
  int64_t *labels;    /* [n] */
  char **class_names; /* [classes] for folder datasets, else NULL */
};

/* Allocates pixels and labels for n samples of c x h x w (zeroed labels).
 * Fails with CT_ERR_OUT_OF_MEMORY naming the size and `what`. */
ct_status ct_dataset_alloc(ct_dataset *ds, const char *what, int64_t n, int c, int h, int w);

/* Format readers: each fills a zeroed ct_dataset (name included) or fails
 * with a message; on failure the caller frees whatever was allocated. */
ct_status ct_idx_load(ct_dataset *ds, const char *dir, int train, int fashion, int default_dir);
ct_status ct_cifar_load(ct_dataset *ds, const char *dir, int train, int hundred);
ct_status ct_folder_load(ct_dataset *ds, const char *dir, int train, const ct_dataset_options *opt);
ct_status ct_synthetic_load(ct_dataset *ds, int train, const ct_dataset_options *opt);

/* Bilinear resize of one CHW uint8 image to oh x ow (F.interpolate
 * semantics, rounded to nearest and clamped), used when loading folders. */
void ct_resize_u8(const uint8_t *src, int c, int h, int w, uint8_t *dst, int oh, int ow);

/* The per-channel table v -> ((v / 255) - mean) / std (or its raw/
 * un-normalized variants) that ct_transform_apply uses for uint8 inputs;
 * the loader builds it once instead of per sample. */
void ct_transform_lut(const ct_transform *t, int c, float lut[][256]);
void ct_transform_apply_lut(const ct_transform *t, const float lut[][256], const uint8_t *src, int c, int h, int w,
                            uint64_t seed, int64_t epoch, int64_t sample, float *dst);

/* The sampler of a loader with options o over a dataset of n samples (its
 * shuffle, seed, num_replicas, rank and dist_tail): loader.c and gpu_data.c
 * both size the epoch's order from it, so the two cannot disagree. */
void ct_loader_sampler(const ct_loader_options *o, int64_t n, ct_sampler *s);

#endif
