/* Dataset handle: spec parsing, accessors and the in-memory constructor. The
 * format readers live in idx.c, cifar.c, folder.c and synthetic.c. */
#include "data/dataset_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ct_dataset_options_default(ct_dataset_options *opt) {
  memset(opt, 0, sizeof *opt);
  opt->synth_channels = 1;
  opt->synth_height = 28;
  opt->synth_width = 28;
  opt->synth_classes = 10;
}

ct_status ct_dataset_alloc(ct_dataset *ds, const char *what, int64_t n, int c, int h, int w) {
  size_t img = (size_t)c * (size_t)h * (size_t)w;
  ds->n = n;
  ds->c = c;
  ds->h = h;
  ds->w = w;
  /* +1 so a dataset of 0 samples still gets non-NULL pointers. */
  ds->pixels = malloc(img * (size_t)n + 1);
  ds->labels = calloc((size_t)n + 1, sizeof *ds->labels);
  if (!ds->pixels || !ds->labels)
    return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes for %lld images of %dx%dx%d", what,
                    img * (size_t)n, (long long)n, c, h, w);
  return CT_OK;
}

static void dataset_free(ct_dataset *ds) {
  if (!ds) return;
  free(ds->pixels);
  free(ds->labels);
  if (ds->class_names)
    for (int k = 0; k < ds->classes; k++) free(ds->class_names[k]);
  free(ds->class_names);
  free(ds);
}

/* "kind" or "kind:path" -> kind and path (NULL when absent). */
static int spec_is(const char *spec, const char *kind, const char **path) {
  size_t n = strlen(kind);
  if (strncmp(spec, kind, n) != 0) return 0;
  if (spec[n] == 0) {
    *path = NULL;
    return 1;
  }
  if (spec[n] == ':') {
    *path = spec + n + 1;
    return 1;
  }
  return 0;
}

/* "synthetic:N": N training samples and ceil(N/4) test samples (the
 * default 1024/256 keeps that ratio), like torchvision's FakeData(size=N);
 * a count in the options wins. */
static ct_status synthetic_open(ct_dataset *ds, const char *spec, const char *count, int train,
                                const ct_dataset_options *opt) {
  if (!count) return ct_synthetic_load(ds, train, opt);
  char *end;
  errno = 0;
  long long n = strtoll(count, &end, 10);
  if (!*count || *end || errno || n < 1 || n > (1ll << 31))
    return ct_error(CT_ERR_INVALID_ARG, "dataset '%s': expected synthetic or synthetic:N, N training samples in 1..%lld",
                    spec, 1ll << 31);
  if (opt->synth_count > 0) return ct_synthetic_load(ds, train, opt);
  ct_dataset_options o = *opt;
  o.synth_count = train ? n : (n + 3) / 4;
  return ct_synthetic_load(ds, train, &o);
}

ct_status ct_dataset_open(const char *spec, int train, const ct_dataset_options *opt, ct_dataset **out) {
  *out = NULL;
  if (!spec) return ct_error(CT_ERR_INVALID_ARG, "dataset: no spec given");
  ct_dataset_options defaults;
  if (!opt) {
    ct_dataset_options_default(&defaults);
    opt = &defaults;
  }
  ct_dataset *ds = calloc(1, sizeof *ds);
  if (!ds) return ct_error(CT_ERR_OUT_OF_MEMORY, "dataset: out of memory");
  const char *path = NULL;
  ct_status s;
  if (spec_is(spec, "fashion-mnist", &path)) {
    s = ct_idx_load(ds, path && *path ? path : CT_FASHION_MNIST_DIR, train, 1, !(path && *path));
  } else if (spec_is(spec, "mnist", &path)) {
    if (!path || !*path)
      s = ct_error(CT_ERR_INVALID_ARG,
                   "dataset 'mnist': give the folder holding the IDX files as 'mnist:PATH' "
                   "(train-images-idx3-ubyte[.gz], ...)");
    else
      s = ct_idx_load(ds, path, train, 0, 0);
  } else if (spec_is(spec, "cifar10", &path) || spec_is(spec, "cifar100", &path)) {
    int hundred = strncmp(spec, "cifar100", 8) == 0;
    if (!path || !*path)
      s = ct_error(CT_ERR_INVALID_ARG, "dataset '%s': give the folder of the binary version as '%s:PATH'",
                   hundred ? "cifar100" : "cifar10", hundred ? "cifar100" : "cifar10");
    else
      s = ct_cifar_load(ds, path, train, hundred);
  } else if (spec_is(spec, "folder", &path)) {
    if (!path || !*path)
      s = ct_error(CT_ERR_INVALID_ARG, "dataset 'folder': give the image folder as 'folder:PATH'");
    else
      s = ct_folder_load(ds, path, train, opt);
  } else if (spec_is(spec, "synthetic", &path)) {
    s = synthetic_open(ds, spec, path, train, opt);
  } else {
    s = ct_error(CT_ERR_INVALID_ARG,
                 "dataset '%s': unknown kind; expected fashion-mnist[:PATH], mnist:PATH, cifar10:PATH, "
                 "cifar100:PATH, folder:PATH or synthetic[:N]",
                 spec);
  }
  if (s != CT_OK) {
    dataset_free(ds);
    return s;
  }
  *out = ds;
  return CT_OK;
}

ct_status ct_dataset_from_memory(const char *name, int64_t n, int c, int h, int w, int classes,
                                 const uint8_t *pixels, const int64_t *labels, ct_dataset **out) {
  *out = NULL;
  if (n < 0 || c < 1 || c > CT_DATA_MAX_CHANNELS || h < 1 || w < 1 || classes < 1 || (n > 0 && (!pixels || !labels)))
    return ct_error(CT_ERR_INVALID_ARG,
                    "dataset from memory: bad shape n=%lld c=%d h=%d w=%d classes=%d (need c in 1..%d, "
                    "positive sizes, data pointers)",
                    (long long)n, c, h, w, classes, CT_DATA_MAX_CHANNELS);
  for (int64_t i = 0; i < n; i++)
    if (labels[i] < 0 || labels[i] >= classes)
      return ct_error(CT_ERR_INVALID_ARG, "dataset from memory: label %lld of sample %lld is outside [0, %d)",
                      (long long)labels[i], (long long)i, classes);
  ct_dataset *ds = calloc(1, sizeof *ds);
  if (!ds) return ct_error(CT_ERR_OUT_OF_MEMORY, "dataset from memory: out of memory");
  snprintf(ds->name, sizeof ds->name, "%s", name ? name : "memory");
  ct_status s = ct_dataset_alloc(ds, ds->name, n, c, h, w);
  if (s != CT_OK) {
    dataset_free(ds);
    return s;
  }
  ds->classes = classes;
  if (n > 0) {
    memcpy(ds->pixels, pixels, (size_t)n * (size_t)c * (size_t)h * (size_t)w);
    memcpy(ds->labels, labels, (size_t)n * sizeof *labels);
  }
  *out = ds;
  return CT_OK;
}

int64_t ct_dataset_size(const ct_dataset *ds) { return ds->n; }

void ct_dataset_shape(const ct_dataset *ds, int *c, int *h, int *w) {
  if (c) *c = ds->c;
  if (h) *h = ds->h;
  if (w) *w = ds->w;
}

int ct_dataset_classes(const ct_dataset *ds) { return ds->classes; }

const char *ct_dataset_name(const ct_dataset *ds) { return ds->name; }

const char *ct_dataset_class_name(const ct_dataset *ds, int k) {
  if (!ds->class_names || k < 0 || k >= ds->classes) return NULL;
  return ds->class_names[k];
}

ct_status ct_dataset_sample(const ct_dataset *ds, int64_t i, const uint8_t **pixels, int64_t *label) {
  if (i < 0 || i >= ds->n)
    return ct_error(CT_ERR_INVALID_ARG, "dataset %s: sample %lld is outside [0, %lld)", ds->name, (long long)i,
                    (long long)ds->n);
  if (pixels) *pixels = ds->pixels + (size_t)i * (size_t)ds->c * (size_t)ds->h * (size_t)ds->w;
  if (label) *label = ds->labels[i];
  return CT_OK;
}

void ct_dataset_close(ct_dataset *ds) { dataset_free(ds); }
