/* GEMM throughput of the cpu device's matmul: C[M,N] = A[M,K] @ B[K,N],
 * default 10000x200 @ 200x10000, fp32 and bf16 inputs (f32 output).
 * Prints the median GFLOP/s of several timed runs after two warm-ups, and
 * per dtype a "RESULT key=value ..." line that bench/run.sh reads.
 * --device cuda times the CUDA backend (cuBLASLt; operands resident on the
 * GPU, each timed call followed by a stream synchronisation, so the time
 * is the GEMM's, not the launch's; the cuBLASLt plan comes from the cache
 * after the warm-ups).
 * Usage: bench_matmul [--device D] [M K N [runs]] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <sys/resource.h>
#include <time.h>

#include "backend/backend.h"
#include "bench_util.h"
#include "ctrain/ctrain.h"

/* A tensor like t on d (t itself on a host device). */
static int to_dev(ct_device *d, const ct_tensor *t, ct_tensor *out) {
  *out = *t;
  if (!ct_device_backend(d)->alloc) return 0;
  out->data = ct_device_alloc(d, ct_tensor_nbytes(t));
  out->device = d;
  return !out->data || ct_device_copy(d, out->data, NULL, t->data, ct_tensor_nbytes(t)) != CT_OK;
}

static void free_dev(ct_device *d, ct_tensor *t) {
  if (ct_device_backend(d)->alloc) ct_device_free(d, t->data);
}

static int run(ct_device *d, ct_dtype in, long long M, long long K, long long N, int runs) {
  const ct_backend *be = ct_device_backend(d);
  const int on_dev = be->alloc != NULL;
  ct_tensor a, b, c;
  int64_t sa[2] = {M, K}, sb[2] = {K, N}, sc[2] = {M, N};
  if (ct_tensor_alloc(&a, CT_F32, 2, sa) || ct_tensor_alloc(&b, CT_F32, 2, sb) || ct_tensor_alloc(&c, CT_F32, 2, sc)) {
    fprintf(stderr, "%s\n", ct_last_error());
    return 1;
  }
  ct_rng r;
  ct_rng_init(&r, 1, CT_RNG_TEST, 0, 0);
  float *pa = a.data, *pb = b.data;
  for (long long i = 0; i < M * K; i++) pa[i] = ct_rng_uniform(&r) - 0.5f;
  for (long long i = 0; i < K * N; i++) pb[i] = ct_rng_uniform(&r) - 0.5f;
  ct_tensor da, db, dc;
  if (to_dev(d, &a, &da) || to_dev(d, &b, &db) || to_dev(d, &c, &dc)) {
    fprintf(stderr, "bench_matmul: cannot place the operands on %s: %s\n", ct_device_name(d), ct_last_error());
    return 1;
  }
  ct_tensor ai = da, bi = db;
  if (in == CT_BF16) {
    ct_tensor ha, hb;
    if (ct_tensor_alloc(&ha, CT_BF16, 2, sa) || ct_tensor_alloc(&hb, CT_BF16, 2, sb)) return 1;
    if (to_dev(d, &ha, &ai) || to_dev(d, &hb, &bi)) return 1;
    be->cast(d, &da, &ai);
    be->cast(d, &db, &bi);
    if (on_dev) ct_tensor_free(&ha), ct_tensor_free(&hb);
  }
  double *t = malloc(sizeof(double) * (size_t)runs), *ct = malloc(sizeof(double) * (size_t)runs);
  for (int i = -2; i < runs; i++) { /* two warm-up runs: primitive creation, page faults */
    double t0 = bench_now(), c0 = bench_cpu_now();
    ct_status s = be->matmul(d, 0, 0, &ai, &bi, 1.f, 0.f, &dc);
    if (s == CT_OK && on_dev) s = ct_device_sync(d);
    double t1 = bench_now(), c1 = bench_cpu_now();
    if (s != CT_OK) {
      fprintf(stderr, "matmul: %s\n", ct_last_error());
      return 1;
    }
    if (i >= 0) t[i] = t1 - t0, ct[i] = (c1 - c0) / omp_get_max_threads();
  }
  bench_sort(t, runs);
  bench_sort(ct, runs);
  double med = t[runs / 2], cmed = ct[runs / 2], flop = 2.0 * (double)M * (double)K * (double)N;
  printf("matmul %s on %s %lldx%lld @ %lldx%lld: median %.4f s (min %.4f, max %.4f) over %d runs = %.1f GFLOP/s\n",
         ct_dtype_name(in), ct_device_name(d), M, K, K, N, med, t[0], t[runs - 1], runs, flop / med * 1e-9);
  if (!on_dev)
    printf("  cpu-time/threads (%d threads): median %.4f s = %.1f GFLOP/s uncontended estimate\n",
           omp_get_max_threads(), cmed, flop / cmed * 1e-9);
  /* One machine-readable line per dtype for bench/run.sh. */
  printf("RESULT workload=matmul device=%s dtype=%s m=%lld k=%lld n=%lld threads=%d median_s=%.6f min_s=%.6f "
         "max_s=%.6f cpu_s=%.6f gflops=%.3f\n",
         ct_device_name(d), ct_dtype_name(in), M, K, N, omp_get_max_threads(), med, t[0], t[runs - 1], cmed,
         flop / med * 1e-9);
  if (in == CT_BF16) {
    if (on_dev) free_dev(d, &ai), free_dev(d, &bi);
    else ct_tensor_free(&ai), ct_tensor_free(&bi);
  }
  if (on_dev) free_dev(d, &da), free_dev(d, &db), free_dev(d, &dc);
  ct_tensor_free(&a), ct_tensor_free(&b), ct_tensor_free(&c);
  free(t), free(ct);
  return 0;
}

int main(int argc, char **argv) {
  long long M = 10000, K = 200, N = 10000;
  int runs = 7;
  const char *device = "cpu";
  char *pos[4];
  int npos = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    else if (npos < 4) pos[npos++] = argv[i];
  }
  if (npos >= 3) M = atoll(pos[0]), K = atoll(pos[1]), N = atoll(pos[2]);
  if (npos >= 4) runs = atoi(pos[3]);
  ct_device *d;
  if (ct_device_open(device, &d) != CT_OK) {
    fprintf(stderr, "%s\n", ct_last_error());
    return 1;
  }
  int rc = run(d, CT_F32, M, K, N, runs) || run(d, CT_BF16, M, K, N, runs);
  ct_device_close(d);
  return rc;
}
