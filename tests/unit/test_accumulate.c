/* Gradient accumulation in ct_fit (ct_train_config.accumulate) on the CPU:
 * batch 16 x accumulate 4 against batch 64 from the same initial weights
 * and sample order (no shuffle), for an MLP and a small CNN, with SGD
 * momentum and Adam; an epoch whose last group is short (100 samples:
 * groups of 64 and 36, the batch-64 loader's own batches); accumulate 1
 * bit-identical to no accumulation (dropout and a per-step schedule on);
 * steps, max_steps and the per-step schedule counting optimizer steps;
 * an inf in one micro-batch under the loss scaler skipping the group's
 * step once; and the group arithmetic of src/train/accumulate.h. */
#include <unistd.h>

#include "test_util.h"

#include "ctrain/history.h"
#include "ctrain/trainer.h"
#include "train/accumulate.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint32_t urand(void) { return (uint32_t)(test_xorshift(&rs) >> 32); }

static const char *MLP = "input 1x8x8\nflatten\nlinear 64 32\nrelu\nlinear 32 10\n";
static const char *CNN = "input 1x8x8\nconv2d 1 4 3 padding=1\nrelu\nmaxpool2d 2\nflatten\nlinear 64 10\n";
static const char *DROP = "input 1x8x8\nflatten\nlinear 64 32\nrelu\ndropout 0.5\nlinear 32 10\n";
/* Two channels: the first is 0 everywhere except in the poisoned samples. */
static const char *MLP2 = "input 2x8x8\nflatten\nlinear 128 32\nrelu\nlinear 32 10\n";

static char *model_file(const char *name, const char *text) {
  static char paths[8][512];
  static int k;
  char *p = paths[k++ % 8];
  snprintf(p, 512, "%s/accum_%s_%d.txt", test_tmpdir(), name, (int)getpid());
  FILE *f = fopen(p, "w");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
  return p;
}

static ct_dataset *make_data(int64_t n, int c, int poison_lo, int poison_hi) {
  uint8_t *px = malloc((size_t)n * c * 64);
  int64_t *y = malloc((size_t)n * sizeof *y);
  for (int64_t i = 0; i < n; i++) {
    y[i] = urand() % 10;
    for (int j = 0; j < c * 64; j++) px[i * c * 64 + j] = (uint8_t)(urand() & 255);
    /* Channel 0 of a two-channel set: zero outside the poisoned range. */
    if (c == 2 && !(i >= poison_lo && i < poison_hi)) memset(px + i * c * 64, 0, 64);
    if (c == 2 && i >= poison_lo && i < poison_hi) px[i * c * 64] = 200;
  }
  ct_dataset *ds = NULL;
  CHECK_OK(ct_dataset_from_memory("accum", n, c, 8, 8, 10, px, y, &ds));
  free(px);
  free(y);
  return ds;
}

typedef struct run_opts {
  const char *model;
  int64_t batch;
  int accumulate;
  int epochs;
  int64_t max_steps;
  ct_optim_kind optim;
  int onecycle;
  int scaler;
  const ct_transform *transform;
} run_opts;

/* Trains a fresh model (seed 7) on ds and returns its weights (malloc'd). */
static float *train(ct_dataset *ds, const run_opts *r, ct_fit_result *res, size_t *np) {
  ct_device *dev = NULL;
  ct_model *m = NULL;
  ct_loader *l = NULL;
  float *w = NULL;
  CHECK_OK(ct_device_open("cpu", &dev));
  ct_model_options mo = {0};
  mo.seed = 7;
  CHECK_OK(ct_model_create(r->model, &mo, &m));
  if (m) CHECK_OK(ct_model_prepare(m, dev, r->batch, 1));
  ct_loader_options lo;
  ct_loader_options_default(&lo);
  lo.batch_size = r->batch;
  lo.shuffle = 0;
  if (r->transform) lo.transform = *r->transform;
  CHECK_OK(ct_loader_create(ds, &lo, &l));
  ct_train_config cfg;
  ct_train_config_default(&cfg);
  cfg.epochs = r->epochs;
  cfg.max_steps = r->max_steps;
  cfg.accumulate = r->accumulate;
  cfg.seed = 3;
  cfg.optim = ct_optim_config_default(r->optim);
  if (r->optim == CT_OPTIM_SGD) cfg.optim.lr = 0.05, cfg.optim.momentum = 0.9;
  /* Adam's eps 1e-8 turns gradients near zero (a conv bias's sum that
   * cancels) into +-lr steps, amplifying their rounding (a summation
   * order) to ~1e-4 of the weights; eps 1e-4 keeps the comparison at the
   * rounding level of the gradients (~1e-6). */
  else cfg.optim.lr = 0.003, cfg.optim.eps = 1e-4;
  if (r->onecycle) {
    cfg.use_scheduler = 1;
    cfg.sched = ct_sched_config_default(CT_SCHED_ONECYCLE);
    cfg.sched.max_lr = cfg.optim.lr;
    cfg.sched.total_steps = r->epochs * ct_accum_steps_per_epoch(r->accumulate, ct_loader_batches_per_epoch(l));
    cfg.sched_per_step = 1;
  }
  if (r->scaler) ct_grad_scaler_init(&cfg.scaler, 1, 1, (double)r->scaler);
  memset(res, 0, sizeof *res);
  if (m && l) {
    CHECK_OK(ct_fit(m, dev, l, NULL, &cfg, res));
    const float *p = ct_model_params(m, np);
    w = malloc(*np * sizeof *w);
    memcpy(w, p, *np * sizeof *w);
  }
  ct_loader_destroy(l);
  ct_model_destroy(m);
  ct_device_close(dev);
  return w;
}

static double lr_of(const ct_fit_result *r, int64_t epoch) {
  double v = NAN;
  if (r->history) ct_history_get(r->history, epoch, "lr", &v);
  return v;
}

/* batch 64 vs 16 x 4 over n samples: weights within tol, steps equal. */
static void compare(const char *what, const char *model, ct_optim_kind k, int64_t n, int epochs, int onecycle,
                    double tol) {
  ct_dataset *ds = make_data(n, 1, 0, 0);
  run_opts a = {model, 64, 0, epochs, 0, k, onecycle, 0, NULL}, b = a;
  b.batch = 16, b.accumulate = 4;
  ct_fit_result ra, rb;
  size_t na = 0, nb = 0;
  float *wa = train(ds, &a, &ra, &na), *wb = train(ds, &b, &rb, &nb);
  int64_t want_steps = epochs * ((n + 63) / 64);
  CHECK_MSG(ra.steps == want_steps && rb.steps == want_steps, "%s: steps %lld and %lld, want %lld", what,
            (long long)ra.steps, (long long)rb.steps, (long long)want_steps);
  if (wa && wb && na == nb) {
    double e = test_max_rel_err_f32(wb, wa, na, 1e-2);
    if (getenv("ACCUM_VERBOSE")) printf("%s: max rel err %.3g\n", what, e);
    CHECK_MSG(e < tol, "%s: batch 16 x accumulate 4 vs batch 64: max rel err %.3g", what, e);
    /* The run moved the weights: a broken accumulation cannot hide in a no-op. */
    ct_model *m0 = NULL;
    ct_model_options mo = {0};
    mo.seed = 7;
    CHECK_OK(ct_model_create(model, &mo, &m0));
    if (m0) {
      size_t n0;
      const float *w0 = ct_model_params(m0, &n0);
      CHECK_MSG(test_max_rel_err_f32(wb, w0, n0, 1e-2) > 100 * tol, "%s: weights barely moved", what);
      ct_model_destroy(m0);
    }
  }
  /* Training loss per sample is the same quantity in both runs. */
  CHECK_MSG(fabs(ra.train_loss - rb.train_loss) < 1e-4 * fabs(ra.train_loss), "%s: train loss %.8g vs %.8g", what,
            ra.train_loss, rb.train_loss);
  if (onecycle)
    for (int e = 1; e <= epochs; e++)
      CHECK_MSG(fabs(lr_of(&ra, e) - lr_of(&rb, e)) <= 1e-12 * fabs(lr_of(&ra, e)), "%s: epoch %d lr %.10g vs %.10g",
                what, e, lr_of(&ra, e), lr_of(&rb, e));
  free(wa);
  free(wb);
  ct_fit_result_free(&ra);
  ct_fit_result_free(&rb);
  ct_dataset_close(ds);
}

static void test_equal_to_big_batch(void) {
  compare("mlp sgd-momentum", model_file("mlp", MLP), CT_OPTIM_SGD, 256, 2, 0, 5e-6);
  compare("mlp adam", model_file("mlp", MLP), CT_OPTIM_ADAM, 256, 2, 0, 5e-6);
  compare("cnn sgd-momentum", model_file("cnn", CNN), CT_OPTIM_SGD, 256, 2, 0, 5e-6);
  compare("cnn adam", model_file("cnn", CNN), CT_OPTIM_ADAM, 256, 2, 0, 5e-6);
  /* 100 samples: groups of 64 (4 x 16) and 36 (16 + 16 + 4) against the
   * batch-64 loader's batches of 64 and 36; the per-step OneCycle spans
   * 2 steps per epoch in both. */
  compare("mlp short group, onecycle", model_file("mlp", MLP), CT_OPTIM_SGD, 100, 3, 1, 5e-6);
  compare("cnn short group, adam", model_file("cnn", CNN), CT_OPTIM_ADAM, 100, 3, 0, 5e-6);
}

static void test_accumulate_one_is_off(void) {
  ct_dataset *ds = make_data(100, 1, 0, 0);
  run_opts a = {model_file("drop", DROP), 16, 0, 2, 0, CT_OPTIM_ADAM, 1, 0, NULL}, b = a;
  b.accumulate = 1;
  ct_fit_result ra, rb;
  size_t na = 0, nb = 0;
  float *wa = train(ds, &a, &ra, &na), *wb = train(ds, &b, &rb, &nb);
  CHECK(wa && wb && na == nb && memcmp(wa, wb, na * sizeof *wa) == 0);
  CHECK(ra.steps == 14 && rb.steps == 14 && ra.train_loss == rb.train_loss);
  free(wa);
  free(wb);
  ct_fit_result_free(&ra);
  ct_fit_result_free(&rb);
  ct_dataset_close(ds);
}

static void test_max_steps(void) {
  /* --max-steps counts optimizer steps: 3 steps of 4 micro-batches equal
   * 3 batch-64 steps, and stop the epoch after 12 of its 16 batches. */
  ct_dataset *ds = make_data(256, 1, 0, 0);
  run_opts a = {model_file("mlp", MLP), 64, 0, 2, 3, CT_OPTIM_SGD, 0, 0, NULL}, b = a;
  b.batch = 16, b.accumulate = 4;
  ct_fit_result ra, rb;
  size_t na = 0, nb = 0;
  float *wa = train(ds, &a, &ra, &na), *wb = train(ds, &b, &rb, &nb);
  CHECK_MSG(ra.steps == 3 && rb.steps == 3, "steps %lld %lld", (long long)ra.steps, (long long)rb.steps);
  if (wa && wb) CHECK(test_max_rel_err_f32(wb, wa, na, 1e-2) < 5e-6);
  free(wa);
  free(wb);
  ct_fit_result_free(&ra);
  ct_fit_result_free(&rb);
  ct_dataset_close(ds);
}

static void test_scaler_skips_group_once(void) {
  /* Samples 16..31 (micro-batch 1 of the first group) carry 200 / 1e-38 =
   * inf in channel 0; the second group (samples 64..127) is clean. */
  ct_dataset *ds = make_data(128, 2, 16, 32);
  ct_transform t;
  ct_transform_default(&t);
  t.to_float = 0;
  t.normalize = 1;
  t.mean[0] = 0, t.std[0] = 1e-38f;
  t.mean[1] = 0, t.std[1] = 255;
  run_opts a = {model_file("mlp2", MLP2), 16, 4, 1, 0, CT_OPTIM_SGD, 0, 1024, &t};
  ct_fit_result ra;
  size_t na = 0;
  float *wa = train(ds, &a, &ra, &na);
  CHECK_MSG(ra.steps == 2 && ra.skipped_steps == 1 && ra.loss_scale == 512.0, "steps %lld skipped %lld scale %g",
            (long long)ra.steps, (long long)ra.skipped_steps, ra.loss_scale);
  /* The skipped group left no trace: the weights are one clean step on
   * the second group alone (batch 64, scale 512 as after the backoff). */
  uint8_t *px = malloc(64 * 128);
  int64_t y[64];
  for (int64_t i = 0; i < 64; i++) {
    const uint8_t *p;
    CHECK_OK(ct_dataset_sample(ds, 64 + i, &p, &y[i]));
    memcpy(px + i * 128, p, 128);
  }
  ct_dataset *ds2 = NULL;
  CHECK_OK(ct_dataset_from_memory("clean", 64, 2, 8, 8, 10, px, y, &ds2));
  run_opts b = {a.model, 64, 0, 1, 0, CT_OPTIM_SGD, 0, 512, &t};
  ct_fit_result rb;
  size_t nb = 0;
  float *wb = ds2 ? train(ds2, &b, &rb, &nb) : NULL;
  if (wa && wb) {
    double e = test_max_rel_err_f32(wa, wb, na, 1e-2);
    CHECK_MSG(e < 2e-5, "after the skipped group: max rel err %.3g", e);
  }
  if (wb) CHECK(rb.skipped_steps == 0);
  free(px);
  free(wa);
  free(wb);
  ct_fit_result_free(&ra);
  if (wb) ct_fit_result_free(&rb);
  ct_dataset_close(ds);
  ct_dataset_close(ds2);
}

static void test_positions(void) {
  /* 100 samples, batch 16, accumulate 4: batches 0-3 (64 samples), 4-6
   * (16 + 16 + 4 = 36). */
  int64_t ns[7] = {16, 16, 16, 16, 16, 16, 4};
  for (int64_t k = 0; k < 7; k++) {
    ct_accum_pos p = ct_accum_position(4, k, ns[k], 7, 100, 16);
    int64_t g = k < 4 ? 64 : 36;
    CHECK_MSG(p.group_n == g && p.index == (int)(k % 4) && p.first == (k % 4 == 0) && p.last == (k == 3 || k == 6) &&
                  p.factor == (double)ns[k] / (double)g,
              "batch %lld: n %lld index %d first %d last %d factor %g", (long long)k, (long long)p.group_n, p.index,
              p.first, p.last, p.factor);
  }
  /* drop_last: 100 samples in 6 batches of 16; the 4 left over never count. */
  ct_accum_pos p = ct_accum_position(4, 5, 16, 6, 100, 16);
  CHECK(p.group_n == 32 && p.last && p.factor == 0.5);
  p = ct_accum_position(1, 6, 4, 7, 100, 16);
  CHECK(p.first && p.last && p.factor == 1.0 && p.index == 0);
  p = ct_accum_position(0, 3, 16, 7, 100, 16);
  CHECK(p.first && p.last && p.factor == 1.0);
  CHECK(ct_accum_steps_per_epoch(4, 7) == 2 && ct_accum_steps_per_epoch(4, 8) == 2 && ct_accum_steps_per_epoch(4, 9) == 3);
  CHECK(ct_accum_steps_per_epoch(0, 7) == 7 && ct_accum_steps_per_epoch(1, 7) == 7);
}

static void test_bad_value(void) {
  ct_dataset *ds = make_data(64, 1, 0, 0);
  ct_device *dev = NULL;
  ct_model *m = NULL;
  ct_loader *l = NULL;
  CHECK_OK(ct_device_open("cpu", &dev));
  ct_model_options mo = {0};
  CHECK_OK(ct_model_create(model_file("mlp", MLP), &mo, &m));
  CHECK_OK(ct_model_prepare(m, dev, 16, 1));
  ct_loader_options lo;
  ct_loader_options_default(&lo);
  lo.batch_size = 16;
  CHECK_OK(ct_loader_create(ds, &lo, &l));
  ct_train_config cfg;
  ct_train_config_default(&cfg);
  ct_fit_result r;
  int bad[2] = {-1, CT_ACCUMULATE_MAX + 1};
  for (int i = 0; i < 2; i++) {
    cfg.accumulate = bad[i];
    CHECK(ct_fit(m, dev, l, NULL, &cfg, &r) == CT_ERR_INVALID_ARG && strstr(ct_last_error(), "accumulate"));
    ct_fit_result_free(&r);
  }
  ct_loader_destroy(l);
  ct_model_destroy(m);
  ct_device_close(dev);
  ct_dataset_close(ds);
}

int main(void) {
  test_positions();
  test_equal_to_big_batch();
  test_accumulate_one_is_off();
  test_max_steps();
  test_scaler_skips_group_once();
  test_bad_value();
  return test_summary("test_accumulate");
}
