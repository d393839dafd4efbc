/* What this machine can do at most, the yardsticks for the other
 * benchmarks:
 *  - fp32 GEMM ceiling: a square S^3 product (default 2048) through the cpu
 *    device's matmul (the oneDNN matmul primitive), 2*S^3 FLOP per call, at
 *    1 thread and at all threads (on 2 cores sharing FMA throughput the two
 *    are expected to be close);
 *  - memory bandwidth: a STREAM-like triad a[i] = b[i] + s*c[i] over
 *    doubles in arrays far larger than the last-level cache, counted as
 *    STREAM does, 24 bytes per element (two reads, one write; the
 *    write-allocate read is not counted).
 * A ceiling is the best of the timed runs (STREAM's convention: on a shared
 * machine any slower run was disturbed); the median is printed beside it.
 * Usage: bench_machine [--gemm S] [--triad-mib MIB] [--runs R]
 * The last line is machine-readable: "RESULT key=value ...". */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "bench_util.h"
#include "ctrain/ctrain.h"

/* Best and median GFLOP/s of `runs` S^3 products after two warm-ups. */
static int gemm(ct_device *d, int64_t S, int runs, double *best, double *median) {
  const ct_backend *be = ct_device_backend(d);
  int64_t sh[2] = {S, S};
  ct_tensor a, b, c;
  if (ct_tensor_alloc(&a, CT_F32, 2, sh) || ct_tensor_alloc(&b, CT_F32, 2, sh) || ct_tensor_alloc(&c, CT_F32, 2, sh)) {
    fprintf(stderr, "%s\n", ct_last_error());
    return 1;
  }
  ct_rng r;
  ct_rng_init(&r, 3, CT_RNG_TEST, 0, 0);
  for (int64_t i = 0; i < S * S; i++) ((float *)a.data)[i] = ct_rng_uniform(&r) - 0.5f;
  for (int64_t i = 0; i < S * S; i++) ((float *)b.data)[i] = ct_rng_uniform(&r) - 0.5f;
  double *g = malloc(sizeof(double) * (size_t)runs);
  for (int i = -2; i < runs; i++) {
    double t0 = bench_now();
    if (be->matmul(d, 0, 0, &a, &b, 1.f, 0.f, &c) != CT_OK) {
      fprintf(stderr, "matmul: %s\n", ct_last_error());
      return 1;
    }
    double dt = bench_now() - t0;
    if (i >= 0) g[i] = 2.0 * (double)S * (double)S * (double)S / dt * 1e-9;
  }
  bench_sort(g, runs);
  *best = g[runs - 1], *median = g[runs / 2];
  free(g);
  ct_tensor_free(&a), ct_tensor_free(&b), ct_tensor_free(&c);
  return 0;
}

/* Best and median GB/s of the triad over n doubles per array. */
static int triad(size_t n, int runs, double *best, double *median) {
  double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double)), *c = malloc(n * sizeof(double));
  double *g = malloc(sizeof(double) * (size_t)runs);
  if (!a || !b || !c || !g) {
    fprintf(stderr, "triad: out of memory for %zu doubles\n", n);
    return 1;
  }
  const long long N = (long long)n;
  /* First touch by the same static partition the triad uses, so pages sit
   * where their thread reads them. */
#pragma omp parallel for schedule(static)
  for (long long i = 0; i < N; i++) a[i] = 0.0, b[i] = 1.0 + (double)(i & 7), c[i] = 0.5;
  const double s = 3.0;
  for (int k = -1; k < runs; k++) {
    double t0 = bench_now();
#pragma omp parallel for simd schedule(static)
    for (long long i = 0; i < N; i++) a[i] = b[i] + s * c[i];
    double dt = bench_now() - t0;
    if (k >= 0) g[k] = 3.0 * sizeof(double) * (double)n / dt * 1e-9;
  }
  /* Read a result so the loop cannot be dropped, and check it. */
  if (a[N / 3] != b[N / 3] + s * c[N / 3]) {
    fprintf(stderr, "triad: wrong result\n");
    return 1;
  }
  bench_sort(g, runs);
  *best = g[runs - 1], *median = g[runs / 2];
  free(a), free(b), free(c), free(g);
  return 0;
}

int main(int argc, char **argv) {
  int64_t S = 2048;
  int runs = 7;
  double triad_mib = 256; /* per array: 8x a 32 MiB L3 */
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--gemm")) S = atoll(argv[i + 1]);
    else if (!strcmp(argv[i], "--triad-mib")) triad_mib = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--runs")) runs = atoi(argv[i + 1]);
    else {
      fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (S <= 0 || runs <= 0 || triad_mib <= 0) {
    fprintf(stderr, "--gemm, --runs and --triad-mib must be positive\n");
    return 2;
  }
  ct_device *d;
  if (ct_device_open("cpu", &d) != CT_OK) {
    fprintf(stderr, "%s\n", ct_last_error());
    return 1;
  }
  /* 0 means the OpenMP default; report the count that actually runs. */
  const int saved = ct_device_threads(d), threads = saved > 0 ? saved : omp_get_max_threads();
  double g1b, g1m, gnb, gnm;
  ct_device_set_threads(d, 1);
  if (gemm(d, S, runs, &g1b, &g1m)) return 1;
  ct_device_set_threads(d, saved);
  if (gemm(d, S, runs, &gnb, &gnm)) return 1;
  ct_device_close(d);
  const double ceiling = g1b > gnb ? g1b : gnb;
  printf("fp32 GEMM %lldx%lldx%lld (oneDNN matmul): 1 thread best %.1f (median %.1f) GFLOP/s, "
         "%d threads best %.1f (median %.1f) GFLOP/s -> ceiling %.1f GFLOP/s\n",
         (long long)S, (long long)S, (long long)S, g1b, g1m, threads, gnb, gnm, ceiling);
  size_t n = (size_t)(triad_mib * 1024 * 1024 / sizeof(double));
  double tb, tm;
  if (triad(n, runs, &tb, &tm)) return 1;
  printf("triad a = b + s*c, 3 x %.0f MiB, %d threads: best %.1f GB/s (median %.1f)\n", triad_mib,
         omp_get_max_threads(), tb, tm);
  printf("RESULT gemm_size=%lld threads=%d gemm1_best=%.3f gemm1_median=%.3f gemmn_best=%.3f gemmn_median=%.3f "
         "gemm_ceiling=%.3f triad_best=%.3f triad_median=%.3f\n",
         (long long)S, threads, g1b, g1m, gnb, gnm, ceiling, tb, tm);
  return 0;
}
