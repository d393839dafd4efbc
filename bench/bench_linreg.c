/* Full-batch linear regression through ct_linreg_fit (one fused pass over
 * the data per step, then the project's Adam), the ctrain side of the
 * torchkeras linear-regression benchmark:
 *   X ~ U(-10, 10) [n, 2], y = X @ [2, -3] + 5 + N(0, 2) (std 2),
 *   nn.Linear(2, 1)'s default init U(-1/sqrt(F), 1/sqrt(F)), Adam, MSE.
 * Times `runs` complete fits from the same initial parameters after one
 * warm-up fit and prints the median; then the final loss and parameters.
 * --save-data writes the data and initial parameters for
 * bench/torch_baselines.py linreg, so both train on identical bytes.
 * File layout (little-endian): "CTLR0001", int64 n, int64 F, f32 X[n*F],
 * f32 y[n], f32 init[F+1] (weights then bias).
 *
 * --device cuda runs the fit on the GPU (ct_linreg_fit_device: a fused
 * reduction kernel + a one-thread Adam kernel per step, every step queued
 * at once); X and y are uploaded once before the timed fits, as the
 * PyTorch GPU side keeps its tensors on the device.
 *
 * Usage: bench_linreg [--n N] [--steps S] [--lr LR] [--runs R] [--seed SEED]
 *                     [--save-data PATH] [--device D]
 * The last line is machine-readable: "RESULT key=value ...". */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_util.h"
#include "ctrain/ctrain.h"
#include "ctrain/linreg.h"
#include "train/linreg_device.h"

#define F 2

static int save(const char *path, long long n, const float *x, const float *y, const float *init) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    return 1;
  }
  int64_t hdr[2] = {n, F};
  int ok = fwrite("CTLR0001", 1, 8, f) == 8 && fwrite(hdr, sizeof hdr, 1, f) == 1 &&
           fwrite(x, sizeof(float), (size_t)(n * F), f) == (size_t)(n * F) &&
           fwrite(y, sizeof(float), (size_t)n, f) == (size_t)n && fwrite(init, sizeof(float), F + 1, f) == F + 1;
  if (fclose(f) != 0) ok = 0;
  if (!ok) fprintf(stderr, "%s: write failed\n", path);
  return !ok;
}

int main(int argc, char **argv) {
  long long n = 1000000, steps = 500;
  int runs = 5;
  double lr = 0.01;
  unsigned long long seed = 1;
  const char *save_path = NULL, *device = "cpu";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "%s: missing value\n", a);
      return 2;
    }
    if (!strcmp(a, "--n")) n = atoll(v);
    else if (!strcmp(a, "--steps")) steps = atoll(v);
    else if (!strcmp(a, "--lr")) lr = atof(v);
    else if (!strcmp(a, "--runs")) runs = atoi(v);
    else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--save-data")) save_path = v;
    else if (!strcmp(a, "--device")) device = v;
    else {
      fprintf(stderr, "unknown option %s\n", a);
      return 2;
    }
    i++;
  }
  if (n <= 0 || steps <= 0 || runs <= 0) {
    fprintf(stderr, "--n, --steps and --runs must be positive\n");
    return 2;
  }

  float *x = malloc(sizeof(float) * (size_t)(n * F)); /* [n, F] */
  float *y = malloc(sizeof(float) * (size_t)n);       /* [n] */
  double *hist = malloc(sizeof(double) * (size_t)steps);
  double *t = malloc(sizeof(double) * (size_t)runs), *ct = malloc(sizeof(double) * (size_t)runs);
  if (!x || !y || !hist || !t || !ct) {
    fprintf(stderr, "out of memory for n=%lld\n", n);
    return 1;
  }
  const float w_true[F] = {2.f, -3.f}, b_true = 5.f;
  ct_rng r;
  ct_rng_init(&r, seed, CT_RNG_DATA, 0, 0);
  for (long long i = 0; i < n; i++) {
    double s = b_true;
    for (int j = 0; j < F; j++) {
      x[i * F + j] = (float)(20.0 * ct_rng_uniform_f64(&r) - 10.0);
      s += (double)w_true[j] * x[i * F + j];
    }
    y[i] = (float)(s + 2.0 * ct_rng_normal(&r));
  }
  float init[F + 1], params[F + 1];
  ct_rng_init(&r, seed, CT_RNG_INIT, 0, 0);
  const double bound = 1.0 / sqrt((double)F); /* nn.Linear: U(-1/sqrt(in), 1/sqrt(in)) */
  for (int j = 0; j <= F; j++) init[j] = (float)((2.0 * ct_rng_uniform_f64(&r) - 1.0) * bound);
  if (save_path && save(save_path, n, x, y, init)) return 1;

  ct_linreg_data data = {x, y, n, F};
  ct_optim_config cfg = ct_optim_config_default(CT_OPTIM_ADAM);
  cfg.lr = lr;
  ct_device *dev = NULL;
  ct_linreg_data ddata = data;
  int on_dev = strcmp(device, "cpu") != 0;
  if (on_dev) {
    if (ct_device_open(device, &dev) != CT_OK) {
      fprintf(stderr, "%s\n", ct_last_error());
      return 1;
    }
    float *dx = ct_device_alloc(dev, sizeof(float) * (size_t)(n * F)), *dy = ct_device_alloc(dev, sizeof(float) * (size_t)n);
    if (!dx || !dy || ct_device_copy(dev, dx, NULL, x, sizeof(float) * (size_t)(n * F)) != CT_OK ||
        ct_device_copy(dev, dy, NULL, y, sizeof(float) * (size_t)n) != CT_OK) {
      fprintf(stderr, "bench_linreg: uploading the data to %s: %s\n", device, ct_last_error());
      return 1;
    }
    ddata.x = dx, ddata.y = dy;
  }
  for (int k = -1; k < runs; k++) { /* one warm-up fit: page faults, thread pool */
    memcpy(params, init, sizeof init);
    double t0 = bench_now(), c0 = bench_cpu_now();
    ct_status s = on_dev ? ct_linreg_fit_device(dev, &ddata, &cfg, steps, params, hist)
                         : ct_linreg_fit(&data, &cfg, steps, params, hist);
    double t1 = bench_now(), c1 = bench_cpu_now();
    if (s != CT_OK) {
      fprintf(stderr, "ct_linreg_fit: %s\n", ct_last_error());
      return 1;
    }
    if (k >= 0) t[k] = t1 - t0, ct[k] = (c1 - c0) / omp_get_max_threads();
  }
  bench_sort(t, runs);
  bench_sort(ct, runs);
  double med = t[runs / 2], cmed = ct[runs / 2];
  double final_loss;
  if (ct_linreg_loss_grad(&data, params, &final_loss, NULL) != CT_OK) {
    fprintf(stderr, "%s\n", ct_last_error());
    return 1;
  }
  /* Bytes a step must read: X and y once (the fused pass). */
  double bytes = (double)steps * (double)n * (F + 1) * sizeof(float);
  printf("linreg on %s n=%lld F=%d steps=%lld Adam lr=%g, %d threads: median %.4f s (min %.4f, max %.4f) over %d runs\n",
         device, n, F, steps, lr, omp_get_max_threads(), med, t[0], t[runs - 1], runs);
  printf("  cpu-time/threads: median %.4f s (uncontended estimate); %.2f ms/step; data read %.1f GB/s\n", cmed,
         1e3 * med / (double)steps, bytes / med * 1e-9);
  printf("  init w=[%.7g, %.7g] b=%.7g\n", init[0], init[1], init[2]);
  printf("  loss at last step %.9g, after training %.9g; w=[%.7g, %.7g] b=%.7g\n", hist[steps - 1], final_loss,
         params[0], params[1], params[2]);
  printf("RESULT workload=linreg device=%s n=%lld steps=%lld lr=%g threads=%d median_s=%.6f min_s=%.6f max_s=%.6f "
         "cpu_s=%.6f gbs=%.3f loss_last=%.9g loss_final=%.9g params=%.9g,%.9g,%.9g\n",
         device, n, steps, lr, omp_get_max_threads(), med, t[0], t[runs - 1], cmed, bytes / med * 1e-9, hist[steps - 1],
         final_loss, params[0], params[1], params[2]);
  if (dev) {
    ct_device_free(dev, (void *)ddata.x), ct_device_free(dev, (void *)ddata.y);
    ct_device_close(dev);
  }
  free(x), free(y), free(hist), free(t), free(ct);
  return 0;
}
