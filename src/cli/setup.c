/* Opening data and models from command-line options. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ctrain/atomic_file.h"

ct_status cli_open_data(const cli_opts *o, int train, ct_dataset **ds, ct_loader **ld, int shuffle, int augment) {
  ct_dataset_options dopt;
  ct_dataset_options_default(&dopt);
  dopt.seed = o->seed;
  if (o->in_c) {
    dopt.synth_channels = o->in_c;
    dopt.synth_height = o->in_h ? o->in_h : 1;
    dopt.synth_width = o->in_w ? o->in_w : 1;
  }
  if (o->classes) dopt.synth_classes = o->classes;
  if (o->resize) dopt.resize_h = dopt.resize_w = o->resize;
  CT_TRY(ct_dataset_open(o->data, train, &dopt, ds));
  ct_loader_options lo;
  ct_loader_options_default(&lo);
  lo.batch_size = o->batch_size;
  lo.shuffle = shuffle;
  lo.workers = o->workers;
  lo.seed = o->seed;
  if (o->stage_alloc) lo.alloc = o->stage_alloc, lo.free = o->stage_free, lo.alloc_ctx = o->stage_ctx;
  lo.mode = o->loader_mode;
  /* Data parallel: the training split padded as DistributedSampler pads
   * (every rank the same batches), the test split every sample once. */
  lo.num_replicas = o->dist_size, lo.rank = o->dist_rank;
  lo.dist_tail = train ? CT_DIST_PAD : CT_DIST_EXACT;
  int c, h, w;
  ct_dataset_shape(*ds, &c, &h, &w);
  if (o->resize && (h != o->resize || w != o->resize)) lo.transform.resize_h = lo.transform.resize_w = o->resize;
  if (augment && !strcmp(o->augment, "flip")) lo.transform.hflip_p = 0.5f;
  if (augment && !strcmp(o->augment, "crop-flip")) {
    lo.transform.hflip_p = 0.5f;
    lo.transform.crop_h = o->resize ? o->resize : h;
    lo.transform.crop_w = o->resize ? o->resize : w;
    lo.transform.crop_padding = 4;
  }
  ct_status s = ct_loader_create(*ds, &lo, ld);
  if (s != CT_OK) {
    ct_dataset_close(*ds);
    *ds = NULL;
  }
  return s;
}

ct_status cli_open_model(const cli_opts *o, const ct_dataset *ds, ct_model **m) {
  ct_model_options mo = {0};
  mo.seed = o->seed;
  if (ds) {
    ct_dataset_shape(ds, &mo.in_channels, &mo.height, &mo.width);
    if (o->resize) mo.height = mo.width = o->resize;
    mo.num_classes = ct_dataset_classes(ds);
  }
  if (o->in_c) mo.in_channels = o->in_c, mo.height = o->in_h, mo.width = o->in_w;
  if (o->classes) mo.num_classes = o->classes;
  CT_TRY(ct_model_create(o->model, &mo, m));
  ct_memory_format f = CT_MEMORY_FORMAT_AUTO;
  ct_status fs = o->memory_format ? ct_memory_format_parse(o->memory_format, &f) : CT_OK;
  if (fs == CT_OK) fs = ct_model_set_memory_format(*m, f);
  if (fs == CT_OK) fs = ct_model_set_recompute(*m, cli_recompute(o));
  if (fs != CT_OK) {
    ct_model_destroy(*m);
    *m = NULL;
    return fs;
  }
  if (!ds) return CT_OK;
  /* Refuse a mismatch up front rather than at the first step. */
  int dc, dh, dw, c, h, w;
  ct_dataset_shape(ds, &dc, &dh, &dw);
  if (o->resize) dh = dw = o->resize;
  ct_model_input_shape(*m, &c, &h, &w);
  int vec = ct_model_input_ndim(*m) == 1;
  if (vec ? (int64_t)dc * dh * dw != c : (dc != c || dh != h || dw != w)) {
    ct_status s = vec ? ct_error(CT_ERR_SHAPE,
                                 "model '%s' takes %d input features but %s images are %dx%dx%d (%lld values); "
                                 "fix --input or the model's 'input' line",
                                 ct_model_name(*m), c, ct_dataset_name(ds), dc, dh, dw, (long long)dc * dh * dw)
                      : ct_error(CT_ERR_SHAPE,
                                 "model '%s' takes %dx%dx%d input but %s images are %dx%dx%d; drop --input (the model "
                                 "then follows the data) or use --resize N for the height and width",
                                 ct_model_name(*m), c, h, w, ct_dataset_name(ds), dc, dh, dw);
    ct_model_destroy(*m);
    *m = NULL;
    return s;
  }
  return CT_OK;
}

ct_status cli_check_output(const char *flag, const char *path) {
  if (!path) return CT_OK;
  if (!*path) return ct_error(CT_ERR_INVALID_ARG, "%s: empty path", flag);
  ct_status s = ct_atomic_file_check(path);
  return s == CT_OK ? s : ct_error_wrap(s, "%s", flag);
}

/* The largest label of ds (-1 when empty). */
static int64_t max_label(const ct_dataset *ds) {
  int64_t top = -1, y;
  for (int64_t i = 0; i < ct_dataset_size(ds); i++)
    if (ct_dataset_sample(ds, i, NULL, &y) == CT_OK && y > top) top = y;
  return top;
}

ct_status cli_check_splits(const cli_opts *o, const ct_dataset *train, const ct_dataset *test, const ct_model *m) {
  const ct_dataset *split[2] = {train, test};
  const char *what[2] = {"train", "test"};
  for (int k = 0; k < 2; k++) {
    if (!split[k]) continue;
    if (ct_dataset_size(split[k]) == 0)
      return ct_error(CT_ERR_PARSE, "%s: the %s split has no samples", o->data, what[k]);
    int64_t top = max_label(split[k]), out = ct_model_output_size(m);
    if (top >= out)
      return ct_error(CT_ERR_SHAPE, "%s: the %s split has labels up to %lld but model '%s' has %lld outputs%s", o->data,
                      what[k], (long long)top, ct_model_name(m), (long long)out,
                      o->classes ? " (--classes); drop --classes or give one more than the largest label" : "");
  }
  int c0, h0, w0, c1, h1, w1;
  if (!train || !test) return CT_OK;
  ct_dataset_shape(train, &c0, &h0, &w0);
  ct_dataset_shape(test, &c1, &h1, &w1);
  if (c0 != c1 || (!o->resize && (h0 != h1 || w0 != w1)))
    return ct_error(CT_ERR_SHAPE, "%s: the test split's images are %dx%dx%d, the train split's %dx%dx%d%s", o->data, c1,
                    h1, w1, c0, h0, w0, c0 == c1 ? "; --resize N makes them one size" : "");
  return CT_OK;
}
