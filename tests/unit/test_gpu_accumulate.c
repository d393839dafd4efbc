/* Gradient accumulation on a CUDA device (ct_fit with the model resident,
 * src/train/device_step.c's micro-batches): batch 16 x accumulate 4
 * against batch 64 on cuda and against the cpu device's accumulation, an
 * epoch ending in a short group (100 samples: 64 + 36), an inf in one
 * micro-batch under the loss scaler skipping the group's step once (the
 * device-side scale and check), and --cuda-graph with accumulation
 * training eagerly with the trainer's one-line note. Labelled gpu; exits
 * 77 without a CUDA device. */
#include <unistd.h>

#include "test_util.h"

#include "ctrain/trainer.h"
#include "exec/device_state.h"
#include "optim/optimizer_device.h"

static uint64_t rs = 0x2545f4914f6cdd1dull;
static uint32_t urand(void) { return (uint32_t)(test_xorshift(&rs) >> 32); }

static const char *MLP = "input 2x8x8\nflatten\nlinear 128 32\nrelu\nlinear 32 10\n";
static const char *CNN = "input 2x8x8\nconv2d 2 4 3 padding=1\nrelu\nmaxpool2d 2\nflatten\nlinear 64 10\n";
static char mlp_path[512], cnn_path[512];

static void write_model(char *path, const char *name, const char *text) {
  snprintf(path, 512, "%s/gpu_accum_%s_%d.txt", test_tmpdir(), name, (int)getpid());
  FILE *f = fopen(path, "w");
  if (f) fputs(text, f), fclose(f);
}

/* Channel 0 is zero outside [plo, phi) (and 200 / 1e-38 = inf inside it
 * under the poison transform); channel 1 random. */
static ct_dataset *make_data(int64_t n, int plo, int phi) {
  uint8_t *px = malloc((size_t)n * 128);
  int64_t *y = malloc((size_t)n * sizeof *y);
  for (int64_t i = 0; i < n; i++) {
    y[i] = urand() % 10;
    for (int j = 0; j < 128; j++) px[i * 128 + j] = (uint8_t)(urand() & 255);
    if (!(i >= plo && i < phi)) memset(px + i * 128, 0, 64);
    else px[i * 128] = 200;
  }
  ct_dataset *ds = NULL;
  CHECK_OK(ct_dataset_from_memory("gpu_accum", n, 2, 8, 8, 10, px, y, &ds));
  free(px);
  free(y);
  return ds;
}

typedef struct run_opts {
  const char *dev, *model;
  int64_t batch;
  int accumulate;
  ct_optim_kind optim;
  int scaler, cuda_graph;
  FILE *progress;
} run_opts;

static float *train(ct_dataset *ds, const run_opts *r, ct_fit_result *res, size_t *np) {
  ct_device *dev = NULL;
  ct_model *m = NULL;
  ct_loader *l = NULL;
  float *w = NULL;
  memset(res, 0, sizeof *res);
  CHECK_OK(ct_device_open(r->dev, &dev));
  ct_model_options mo = {0};
  mo.seed = 11;
  CHECK_OK(ct_model_create(r->model, &mo, &m));
  ct_train_config cfg;
  ct_train_config_default(&cfg);
  cfg.optim = ct_optim_config_default(r->optim);
  if (r->optim == CT_OPTIM_SGD) cfg.optim.lr = 0.05, cfg.optim.momentum = 0.9;
  else cfg.optim.lr = 0.003, cfg.optim.eps = 1e-4; /* see test_accumulate.c */
  if (m) {
    ct_model_reserve_optimizer_state(m, ct_optim_state_buffers(&cfg.optim));
    CHECK_OK(ct_model_prepare(m, dev, r->batch, 1));
  }
  ct_loader_options lo;
  ct_loader_options_default(&lo);
  lo.batch_size = r->batch;
  ct_transform_default(&lo.transform);
  lo.transform.to_float = 0;
  lo.transform.normalize = 1;
  lo.transform.std[0] = 1e-38f;
  lo.transform.std[1] = 255;
  CHECK_OK(ct_loader_create(ds, &lo, &l));
  cfg.epochs = 2;
  cfg.accumulate = r->accumulate;
  cfg.seed = 3;
  cfg.cuda_graph = r->cuda_graph;
  cfg.progress = r->progress;
  if (r->scaler) ct_grad_scaler_init(&cfg.scaler, 1, 1, (double)r->scaler);
  if (m && l && ct_fit(m, dev, l, NULL, &cfg, res) == CT_OK) {
    const float *p = ct_model_params(m, np);
    w = malloc(*np * sizeof *w);
    CHECK_OK(ct_device_copy(NULL, w, ct_model_device_resident(dev) ? dev : NULL, p, *np * sizeof *w));
  } else {
    CHECK_MSG(0, "ct_fit on %s: %s", r->dev, ct_last_error());
  }
  ct_loader_destroy(l);
  ct_model_destroy(m);
  ct_device_close(dev);
  return w;
}

static void expect_close(const char *what, const float *a, const float *b, size_t n, double tol) {
  if (!a || !b) return;
  double e = test_max_rel_err_f32(a, b, n, 1e-2);
  CHECK_MSG(e < tol, "%s: max rel err %.3g (tolerance %.3g)", what, e, tol);
}

static void test_equal(const char *model, ct_optim_kind k, int64_t n) {
  ct_dataset *ds = make_data(n, 0, 0);
  run_opts g64 = {"cuda", model, 64, 0, k, 0, 0, NULL}, g16 = g64, c16 = g64;
  g16.batch = 16, g16.accumulate = 4;
  c16.dev = "cpu", c16.batch = 16, c16.accumulate = 4;
  ct_fit_result ra, rb, rc;
  size_t na = 0, nb = 0, nc = 0;
  float *wa = train(ds, &g64, &ra, &na), *wb = train(ds, &g16, &rb, &nb), *wc = train(ds, &c16, &rc, &nc);
  int64_t steps = 2 * ((n + 63) / 64);
  CHECK_MSG(ra.steps == steps && rb.steps == steps && rc.steps == steps, "%s: steps %lld %lld %lld, want %lld", model,
            (long long)ra.steps, (long long)rb.steps, (long long)rc.steps, (long long)steps);
  expect_close("cuda 16 x 4 vs cuda batch 64", wb, wa, na, 1e-5);
  expect_close("cuda 16 x 4 vs cpu 16 x 4", wb, wc, na, 1e-4);
  free(wa), free(wb), free(wc);
  ct_fit_result_free(&ra), ct_fit_result_free(&rb), ct_fit_result_free(&rc);
  ct_dataset_close(ds);
}

static void test_scaler_inf(void) {
  /* Samples 16..31: micro-batch 1 of the first group of each epoch. */
  ct_dataset *ds = make_data(128, 16, 32);
  run_opts g = {"cuda", mlp_path, 16, 4, CT_OPTIM_SGD, 1024, 0, NULL}, c = g;
  c.dev = "cpu";
  ct_fit_result rg, rc;
  size_t ng = 0, nc = 0;
  float *wg = train(ds, &g, &rg, &ng), *wc = train(ds, &c, &rc, &nc);
  /* Two epochs, each with one poisoned group: two skips, 1024 -> 256. */
  CHECK_MSG(rg.steps == 4 && rg.skipped_steps == 2 && rg.loss_scale == 256.0, "cuda: steps %lld skipped %lld scale %g",
            (long long)rg.steps, (long long)rg.skipped_steps, rg.loss_scale);
  CHECK(rc.steps == 4 && rc.skipped_steps == 2 && rc.loss_scale == 256.0);
  expect_close("scaler skip: cuda vs cpu", wg, wc, ng, 1e-4);
  free(wg), free(wc);
  ct_fit_result_free(&rg), ct_fit_result_free(&rc);
  ct_dataset_close(ds);
}

static void test_graph_note(void) {
  ct_dataset *ds = make_data(128, 0, 0);
  char path[600];
  snprintf(path, sizeof path, "%s/gpu_accum_progress_%d.txt", test_tmpdir(), (int)getpid());
  FILE *f = fopen(path, "w+");
  run_opts e = {"cuda", mlp_path, 16, 4, CT_OPTIM_ADAM, 0, 0, NULL}, gr = e;
  gr.cuda_graph = 1, gr.progress = f;
  ct_fit_result re, rg;
  size_t ne = 0, ng = 0;
  float *we = train(ds, &e, &re, &ne), *wg = f ? train(ds, &gr, &rg, &ng) : NULL;
  if (we && wg) CHECK(memcmp(we, wg, ne * sizeof *we) == 0 || test_max_rel_err_f32(wg, we, ne, 1e-2) < 1e-6);
  if (f) {
    char buf[8192] = {0};
    rewind(f);
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    buf[got] = 0;
    CHECK_MSG(strstr(buf, "cuda graph: off: --accumulate 4 trains eagerly") != NULL, "progress: %s", buf);
    fclose(f);
    ct_fit_result_free(&rg);
  }
  remove(path);
  free(we), free(wg);
  ct_fit_result_free(&re);
  ct_dataset_close(ds);
}

int main(void) {
  /* f32 comparisons: TF32 would be ~1e-3. */
  unsetenv("CTRAIN_CUDA_TF32");
  ct_device *d = NULL;
  if (ct_device_open("cuda", &d) != CT_OK) {
    printf("skipped: %s\n", ct_last_error());
    return 77;
  }
  ct_device_close(d);
  write_model(mlp_path, "mlp", MLP);
  write_model(cnn_path, "cnn", CNN);
  test_equal(mlp_path, CT_OPTIM_SGD, 256);
  test_equal(mlp_path, CT_OPTIM_ADAM, 100);
  test_equal(cnn_path, CT_OPTIM_ADAM, 256);
  test_equal(cnn_path, CT_OPTIM_SGD, 100);
  test_scaler_inf();
  test_graph_note();
  remove(mlp_path);
  remove(cnn_path);
  return test_summary("test_gpu_accumulate");
}
