/* The deterministic mode on CUDA (ct_device_set_deterministic, `ctrain
 * train --deterministic`): the same training run twice on one device
 * ends with the same weights bit for bit. resnet18 3x32x32 (convolutions
 * with batch norm, residual adds) in fp32 and bf16 O1, the seed's cnn
 * 1x28x28 (dropout) and alexnet 3x64x64 in bf16 (the emulator: resnet18
 * fp32 and cnn), batch 4, each trained for 2 SGD-momentum steps by the
 * synchronous device step twice and once by the lagged trainer (one eager
 * step, then a captured CUDA graph): all three must give the same
 * weights. Turning the mode on must not leave plans
 * built without it in use (the plan cache keys on it): each model first
 * trains with the mode off on the same device.
 *
 * Whether the check can fail: on the CUDA emulator with
 * CT_EMU_DNN_NONDET=1 (tests/emu: the emu_test_gpu_deterministic_nondet
 * reruns, graph and legacy cuDNN APIs) the backward passes rank an
 * algorithm or engine cuDNN marks nondeterministic first, and it varies
 * its results per call, as atomics do; the two runs with the mode off must
 * then differ, and those with it on must not. On a GPU the runs with the
 * mode off may or may not differ (cuDNN's heuristics pick a
 * nondeterministic algorithm for some shapes only): printed, not checked.
 * Labelled gpu; exits 77 without a CUDA device. */
#include <stdint.h>

#include "test_util.h"
#include "step_harness.h"

#include "exec/device_state.h"
#include "train/device_step.h"

enum { B = 4, STEPS = 2 };

static float *down(ct_device *d, const void *p, size_t n) {
  float *h = malloc(sizeof(float) * (n ? n : 1));
  if (h && ct_device_copy(NULL, h, d, p, sizeof(float) * n) != CT_OK) {
    free(h);
    return NULL;
  }
  return h;
}

/* The weights after STEPS steps of model `name` trained from its seeded
 * initialisation on fixed batches: the synchronous device step, or with
 * graph the lagged trainer capturing the step as a CUDA graph. */
static float *train(ct_device *gpu, const char *name, int c, int h, int w, ct_precision prec, int graph, size_t *np) {
  ct_model_options mo = {c, h, w, 10, 5};
  ct_model *m = NULL;
  ct_optimizer *o = NULL;
  float *p = NULL;
  static float x[STEPS][B * 3 * 64 * 64];
  static int64_t y[STEPS][B];
  ct_batch b[STEPS];
  const int64_t per = (int64_t)c * h * w;
  if (per > 3 * 64 * 64) return NULL;
  if (ct_model_create(name, &mo, &m) != CT_OK) goto fail;
  if (prec != CT_PRECISION_FP32 && ct_model_set_precision(m, prec, CT_OPT_O1) != CT_OK) goto fail;
  ct_model_reserve_optimizer_state(m, 1);
  if (ct_model_prepare(m, gpu, B, 1) != CT_OK) goto fail;
  ct_model_params(m, np);
  for (int s = 0; s < STEPS; s++) step_fixed_batch(&b[s], x[s], y[s], B, c, h, w, s, 17);
  ct_optim_config oc = ct_optim_config_default(CT_OPTIM_SGD);
  oc.lr = 0.05, oc.momentum = 0.9;
  if (ct_optimizer_create(&oc, *np, &o) != CT_OK) goto fail;
  ct_grad_scaler gs;
  ct_grad_scaler_init(&gs, 0, 0, 1.0);
  if (ct_device_train_begin(m, gpu, o, &gs) != CT_OK) goto fail;
  if (!graph) {
    for (int s = 0; s < STEPS; s++) {
      double lv;
      int64_t t1 = 0, t5 = 0;
      int sk = 1;
      if (ct_device_train_step(m, gpu, o, &b[s], CT_LOSS_CROSS_ENTROPY, 0, 0, (uint32_t)s, &gs, &lv, &t1, &t5, &sk) !=
          CT_OK)
        goto fail;
      CHECK(!sk);
    }
  } else {
    ct_device_train_opts dto = {1, 1, 1}; /* one eager step, then the graph */
    ct_device_trainer *t = NULL;
    if (ct_device_trainer_create(m, gpu, o, &gs, CT_LOSS_CROSS_ENTROPY, 0, 0, NULL, &dto, &t) != CT_OK) goto fail;
    int got = 0;
    ct_status s = CT_OK;
    for (int k = 0; s == CT_OK && k < STEPS; k++) {
      ct_step_result r;
      int have = 0;
      s = ct_device_trainer_step(t, &b[k], k, &r, &have);
      got += have;
    }
    for (int have = 1; s == CT_OK && have;) {
      ct_step_result r;
      have = 0;
      s = ct_device_trainer_drain(t, &r, &have);
      got += have;
    }
    const char *note = NULL;
    CHECK_MSG(s != CT_OK || ct_device_trainer_graph_on(t, &note), "%s: the CUDA graph was not used: %s", name,
              note ? note : "?");
    ct_device_trainer_destroy(t);
    if (s != CT_OK) goto fail;
    CHECK_MSG(got == STEPS, "%s graph: %d results for %d steps", name, got, STEPS);
  }
  CHECK(ct_optimizer_steps(o) == STEPS);
  p = down(gpu, ct_model_params(m, NULL), *np);
  ct_optimizer_destroy(o);
  ct_model_destroy(m);
  return p;
fail:
  CHECK_MSG(0, "%s %s: %s", name, ct_precision_name(prec), ct_last_error());
  ct_optimizer_destroy(o);
  ct_model_destroy(m);
  return NULL;
}

static int same(const float *a, const float *b, size_t n) { return a && b && !memcmp(a, b, n * sizeof *a); }

static size_t differing(const float *a, const float *b, size_t n) {
  size_t k = 0;
  for (size_t i = 0; a && b && i < n; i++) k += memcmp(&a[i], &b[i], sizeof *a) != 0;
  return k;
}

static void check_model(ct_device *gpu, const char *name, int c, int h, int w, ct_precision prec, int nondet_emu) {
  const char *pn = ct_precision_name(prec);
  size_t n0 = 0, n1 = 0, n2 = 0, n3 = 0, n4 = 0;
  CHECK_OK(ct_device_set_deterministic(gpu, 0));
  float *f0 = train(gpu, name, c, h, w, prec, 0, &n0), *f1 = train(gpu, name, c, h, w, prec, 0, &n1);
  const size_t free_diff = n0 == n1 ? differing(f0, f1, n0) : 0;
  if (nondet_emu)
    CHECK_MSG(f0 && f1 && free_diff > 0,
              "%s %s: with the mode off two runs are bitwise equal under CT_EMU_DNN_NONDET; the check is blind", name,
              pn);
  CHECK_OK(ct_device_set_deterministic(gpu, 1));
  float *d0 = train(gpu, name, c, h, w, prec, 0, &n2), *d1 = train(gpu, name, c, h, w, prec, 0, &n3);
  float *g0 = train(gpu, name, c, h, w, prec, 1, &n4);
  CHECK_OK(ct_device_set_deterministic(gpu, 0));
  if (d0 && d1 && g0 && n2 == n3 && n2 == n4) {
    CHECK_MSG(same(d0, d1, n2), "%s %s deterministic: two runs differ in %zu of %zu weights", name, pn,
              differing(d0, d1, n2), n2);
    CHECK_MSG(same(d0, g0, n2), "%s %s deterministic: the CUDA graph run differs from the device step in %zu of %zu "
              "weights", name, pn, differing(d0, g0, n2), n2);
    printf("%-8s %-4s %zu weights after %d steps: deterministic runs and graph %s; mode off: %zu weights differ "
           "between two runs\n", name, pn, n2, STEPS,
           same(d0, d1, n2) && same(d0, g0, n2) ? "bitwise equal" : "DIFFER", free_diff);
  } else {
    CHECK_MSG(0, "%s %s: a deterministic run failed", name, pn);
  }
  free(f0), free(f1), free(d0), free(d1), free(g0);
}

int main(void) {
  ct_device *gpu = NULL;
  if (ct_device_open("cuda", &gpu) != CT_OK) {
    printf("no CUDA device: %s (skipped)\n", ct_last_error());
    return 77;
  }
  const char *nd = getenv("CT_EMU_DNN_NONDET");
  const int nondet_emu = getenv("CTRAIN_TEST_EMU") && nd && !strcmp(nd, "1");
  /* cpu and ref are deterministic already: accepted, nothing to set */
  ct_device *cpu = NULL;
  CHECK_OK(ct_device_open("cpu", &cpu));
  if (cpu) {
    CHECK_OK(ct_device_set_deterministic(cpu, 1));
    CHECK(ct_device_set_cudnn_benchmark(cpu, 1) == CT_ERR_INVALID_ARG);
    CHECK_OK(ct_device_set_cudnn_benchmark(cpu, 0));
    ct_device_close(cpu);
  }
  /* The emulator runs the smaller models only (alexnet's 57M weights
   * take it a minute), and without CT_EMU_DNN_NONDET, where nothing is
   * nondeterministic to leave out, one of them. */
  const int emu = getenv("CTRAIN_TEST_EMU") != NULL;
  if (!emu || nondet_emu) check_model(gpu, "resnet18", 3, 32, 32, CT_PRECISION_FP32, nondet_emu);
  if (!emu) check_model(gpu, "resnet18", 3, 32, 32, CT_PRECISION_BF16, nondet_emu);
  check_model(gpu, "cnn", 1, 28, 28, CT_PRECISION_BF16, nondet_emu);
  if (!emu) check_model(gpu, "alexnet", 3, 64, 64, CT_PRECISION_BF16, nondet_emu);
  ct_device_close(gpu);
  return test_summary("test_gpu_deterministic");
}
