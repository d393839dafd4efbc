/* Convolution timings of the cpu device for the torchkeras MNIST CNN:
 * N=128, 1x28x28 -> conv 32 k3 (+relu) -> maxpool 2 -> conv 64 k5 (+relu).
 * Times forward and backward (data, weights+bias) per layer, median of
 * several steps after warm-up, with oneDNN's blocked layouts and with
 * plain NCHW, in fp32 and bf16. Usage: bench_conv [N [runs]] */
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
#include <sys/resource.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_conv.h"
#include "bench_util.h"
#include "ctrain/ctrain.h"

static ct_tensor mk(ct_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d) {
  int64_t s[4] = {a, b, c, d};
  ct_tensor t;
  if (ct_tensor_alloc(&t, dt, 4, s) != CT_OK) exit(1);
  ct_rng r;
  ct_rng_init(&r, (uint64_t)(a * 131 + b * 17 + c), CT_RNG_TEST, 0, 0);
  int64_t n = ct_tensor_numel(&t);
  for (int64_t i = 0; i < n; i++) {
    float v = ct_rng_uniform(&r) - 0.5f;
    if (dt == CT_F32)
      ((float *)t.data)[i] = v;
    else
      ((uint16_t *)t.data)[i] = ct_f32_to_bf16(v);
  }
  return t;
}

#define CK(x)                                                 \
  do {                                                        \
    if ((x) != CT_OK) {                                       \
      fprintf(stderr, "%s: %s\n", #x, ct_last_error());       \
      exit(1);                                                \
    }                                                         \
  } while (0)

static void bench(ct_device *d, int64_t N, int runs, ct_dtype dt, int blocked) {
  const ct_backend *be = ct_device_backend(d);
  cpu_conv_set_blocked(blocked);
  ct_conv2d_params p = {1, 1, 0, 0, 1, 1, 1};
  ct_pool2d_params pp = {2, 2, 2, 2, 0, 0, 0, 1};
  ct_tensor x = mk(dt, N, 1, 28, 28), w1 = mk(dt, 32, 1, 3, 3), b1 = mk(CT_F32, 32, 1, 1, 1);
  ct_tensor y1 = mk(dt, N, 32, 26, 26), dy1 = mk(dt, N, 32, 26, 26), dw1 = mk(CT_F32, 32, 1, 3, 3);
  ct_tensor p1 = mk(dt, N, 32, 13, 13), dp1 = mk(dt, N, 32, 13, 13);
  ct_tensor w2 = mk(dt, 64, 32, 5, 5), b2 = mk(CT_F32, 64, 1, 1, 1), y2 = mk(dt, N, 64, 9, 9);
  ct_tensor dy2 = mk(dt, N, 64, 9, 9), dw2 = mk(CT_F32, 64, 32, 5, 5), db1 = mk(CT_F32, 32, 1, 1, 1);
  ct_tensor db2 = mk(CT_F32, 64, 1, 1, 1);
  b1.ndim = db1.ndim = b2.ndim = db2.ndim = 1;
  p1.dtype = dp1.dtype = y1.dtype; /* pooling keeps the dtype */
  size_t wsb = be->maxpool2d_workspace_bytes(d, &pp, &y1, &p1);
  void *ws = malloc(wsb + 64);
  enum { C1F, C1W, PF, PB, C2F, C2D, C2W, NT };
  static const char *names[NT] = {"conv1 fwd", "conv1 bwd_w", "pool fwd", "pool bwd", "conv2 fwd", "conv2 bwd_data",
                                  "conv2 bwd_w"};
  double *t[NT], *ct[NT];
  for (int k = 0; k < NT; k++) t[k] = malloc(sizeof(double) * (size_t)runs), ct[k] = malloc(sizeof(double) * (size_t)runs);
  for (int i = -2; i < runs; i++) {
    double s[NT + 1], c[NT + 1];
#define MARK(k) (s[k] = bench_now(), c[k] = bench_cpu_now())
    MARK(0);
    CK(be->conv2d_fwd(d, &p, &x, &w1, &b1, CT_ACT_RELU, &y1));
    MARK(1);
    CK(be->conv2d_bwd_weights(d, &p, &x, &dy1, &dw1, &db1, 1.f));
    MARK(2);
    CK(be->maxpool2d_fwd(d, &pp, &y1, &p1, ws));
    MARK(3);
    CK(be->maxpool2d_bwd(d, &pp, &dp1, ws, &dy1));
    MARK(4);
    CK(be->conv2d_fwd(d, &p, &p1, &w2, &b2, CT_ACT_RELU, &y2));
    MARK(5);
    CK(be->conv2d_bwd_data(d, &p, &dy2, &w2, &dp1));
    MARK(6);
    CK(be->conv2d_bwd_weights(d, &p, &p1, &dy2, &dw2, &db2, 1.f));
    MARK(7);
    if (i >= 0)
      for (int k = 0; k < NT; k++)
        t[k][i] = s[k + 1] - s[k], ct[k][i] = (c[k + 1] - c[k]) / omp_get_max_threads();
  }
  double total = 0, conv = 0, ctotal = 0, cconv = 0;
  printf("%s, %s layouts, N=%lld, median of %d:\n", ct_dtype_name(dt), blocked ? "blocked (oneDNN any)" : "plain NCHW",
         (long long)N, runs);
  for (int k = 0; k < NT; k++) {
    bench_sort(t[k], runs);
    bench_sort(ct[k], runs);
    double m = t[k][runs / 2], cm = ct[k][runs / 2];
    total += m, ctotal += cm;
    if (k != PF && k != PB) conv += m, cconv += cm;
    printf("  %-15s wall %8.2f ms   cpu/threads %8.2f ms\n", names[k], m * 1e3, cm * 1e3);
    free(t[k]), free(ct[k]);
  }
  printf("  conv fwd+bwd total: wall %.2f ms, cpu/threads %.2f ms; with pooling: wall %.2f ms, cpu/threads %.2f ms\n",
         conv * 1e3, cconv * 1e3, total * 1e3, ctotal * 1e3);
  free(ws);
  ct_tensor *all[] = {&x, &w1, &b1, &y1, &dy1, &dw1, &p1, &dp1, &w2, &b2, &y2, &dy2, &dw2, &db1, &db2};
  for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_tensor_free(all[k]);
}

int main(int argc, char **argv) {
  int64_t N = argc >= 2 ? atoll(argv[1]) : 128;
  int runs = argc >= 3 ? atoi(argv[2]) : 11;
  ct_device *d;
  if (ct_device_open("cpu", &d) != CT_OK) {
    fprintf(stderr, "%s\n", ct_last_error());
    return 1;
  }
  bench(d, N, runs, CT_F32, 1);
  bench(d, N, runs, CT_F32, 0);
  bench(d, N, runs, CT_BF16, 1);
  ct_device_close(d);
  return 0;
}
