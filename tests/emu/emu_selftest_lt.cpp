/* Self-test of the emulated cuBLASLt (emu_cublaslt.cpp) against a naive
 * triple loop written here independently (own f16/bf16/TF32 conversions):
 * every transpose combination, leading dimensions larger than the rows,
 * f32/f16/bf16 inputs with same-type and f32 outputs, each epilogue the
 * backend uses (DEFAULT, RELU, BIAS, RELU_BIAS), TF32 vs plain f32, beta
 * != 0 in place (C == D), strided batches, device pointer mode, graph
 * capture (inputs read at each replay, descriptors gone), the
 * heuristic's workspace and alignment bookkeeping, refusals of what is not
 * emulated, and that a host pointer is reported as an illegal address.
 * Exits nonzero on any failure. */
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "emu_selftest.h"

namespace {


uint64_t g_rng = 0x9e3779b97f4a7c15ull;
uint64_t next_u64() {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}
/* Uniform in [-1, 1). */
double frand() { return (double)(next_u64() >> 11) / (double)(1ull << 52) - 1.0; }

/* ---- independent conversions ---- */

/* Random value exactly representable in type t (f16: 11 significant bits
 * and small exponent range; bf16: 8 bits; f32: full 24-bit mantissa). */
double rand_value(cudaDataType_t t) {
  if (t == CUDA_R_16F) return (double)((int64_t)(next_u64() % 2047) - 1023) / 512.0;
  if (t == CUDA_R_16BF) return (double)((int64_t)(next_u64() % 255) - 127) / 64.0;
  return (float)frand();
}

uint16_t encode_f16_exact(double v) {
  uint16_t s = v < 0 ? 0x8000 : 0;
  v = std::fabs(v);
  if (v == 0) return s;
  int e;
  double f = std::frexp(v, &e);  // v = f * 2^e, f in [0.5, 1)
  int E = e - 1 + 15;
  if (E <= 0) return s | (uint16_t)std::lround(v * 16777216.0);  // subnormal
  return s | (uint16_t)(E << 10) | (uint16_t)std::lround((f * 2 - 1) * 1024);
}

double decode_f16(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? m * std::ldexp(1.0, -24) : e == 31 ? (m ? NAN : INFINITY) : (1 + m / 1024.0) * std::ldexp(1.0, e - 15);
  return (h & 0x8000) ? -v : v;
}

void store_value(void *p, size_t i, cudaDataType_t t, double v) {
  if (t == CUDA_R_32F) {
    ((float *)p)[i] = (float)v;
  } else if (t == CUDA_R_16F) {
    ((uint16_t *)p)[i] = encode_f16_exact(v);
  } else {
    float f = (float)v;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
  }
}

double load_value(const void *p, size_t i, cudaDataType_t t) {
  if (t == CUDA_R_32F) return ((const float *)p)[i];
  if (t == CUDA_R_16F) return decode_f16(((const uint16_t *)p)[i]);
  uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

size_t esize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
int mant_bits(cudaDataType_t t) { return t == CUDA_R_32F ? 23 : t == CUDA_R_16F ? 10 : 7; }

/* TF32 by hand: keep 10 mantissa bits, round to nearest even. */
double tf32(double v) {
  float f = (float)v;
  int e;
  std::frexp(f, &e);
  double q = std::ldexp(1.0, e - 11);
  double lo = std::floor(f / q) * q, hi = lo + q;
  double dl = f - lo, dh = hi - f;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return std::fmod(std::fabs(lo / q), 2.0) == 0 ? lo : hi;
}

/* ---- one case ---- */

struct Case {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int m = 5, n = 4, k = 7;
  int pad_a = 0, pad_b = 0, pad_d = 0;  // ld - rows
  cudaDataType_t in = CUDA_R_32F, out = CUDA_R_32F;
  bool tf32 = false;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  float alpha = 1, beta = 0;
  int batch = 1;
  bool device_scalars = false;
};

struct Result {
  std::vector<double> got, ref, scale;  // scale: sum |alpha a b| + |beta c| + |bias|
  bool ok_status = false;
  bool pad_intact = true;
};

cublasLtHandle_t g_lt;

const char *tn(cudaDataType_t t) { return t == CUDA_R_32F ? "f32" : t == CUDA_R_16F ? "f16" : "bf16"; }

/* Runs c through the emulated cuBLASLt (D = C in place) and computes the
 * reference from the same inputs. */
Result run_case(const Case &c, uint64_t seed) {
  g_rng = seed;
  Result r;
  const bool na = c.ta == CUBLAS_OP_N, nb = c.tb == CUBLAS_OP_N;
  const int ar = na ? c.m : c.k, ac = na ? c.k : c.m, br = nb ? c.k : c.n, bc = nb ? c.n : c.k;
  const int lda = ar + c.pad_a, ldb = br + c.pad_b, ldd = c.m + c.pad_d;
  const size_t sa = (size_t)lda * ac, sb = (size_t)ldb * bc, sd = (size_t)ldd * c.n;
  void *A, *B, *D, *bias, *scal, *ws;
  cudaMalloc(&A, sa * c.batch * esize(c.in));
  cudaMalloc(&B, sb * c.batch * esize(c.in));
  cudaMalloc(&D, sd * c.batch * esize(c.out));
  cudaMalloc(&bias, (size_t)c.m * esize(c.out));
  cudaMalloc(&scal, 8);
  cudaMalloc(&ws, 1 << 20);
  for (size_t i = 0; i < sa * c.batch; i++) store_value(A, i, c.in, rand_value(c.in));
  for (size_t i = 0; i < sb * c.batch; i++) store_value(B, i, c.in, rand_value(c.in));
  for (size_t i = 0; i < sd * c.batch; i++) store_value(D, i, c.out, rand_value(c.out));
  for (int i = 0; i < c.m; i++) store_value(bias, i, c.out, rand_value(c.out));
  std::vector<double> d0(sd * c.batch);
  for (size_t i = 0; i < d0.size(); i++) d0[i] = load_value(D, i, c.out);
  ((float *)scal)[0] = c.alpha;
  ((float *)scal)[1] = c.beta;

  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulPreference_t pref;
  cublasComputeType_t ct = c.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  bool ok = cublasLtMatmulDescCreate(&desc, ct, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &c.ta, sizeof c.ta) == 0;
  ok = ok && cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &c.tb, sizeof c.tb) == 0;
  ok = ok && cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epi, sizeof c.epi) == 0;
  const bool has_bias = c.epi == CUBLASLT_EPILOGUE_BIAS || c.epi == CUBLASLT_EPILOGUE_RELU_BIAS;
  const bool has_relu = c.epi == CUBLASLT_EPILOGUE_RELU || c.epi == CUBLASLT_EPILOGUE_RELU_BIAS;
  if (has_bias) ok = ok && cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) == 0;
  if (c.device_scalars) {
    int32_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    ok = ok && cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm) == 0;
  }
  ok = ok && cublasLtMatrixLayoutCreate(&la, c.in, ar, ac, lda) == 0;
  ok = ok && cublasLtMatrixLayoutCreate(&lb, c.in, br, bc, ldb) == 0;
  ok = ok && cublasLtMatrixLayoutCreate(&ld, c.out, c.m, c.n, ldd) == 0;
  if (c.batch > 1) {
    int32_t bcnt = c.batch;
    int64_t st[3] = {(int64_t)sa, (int64_t)sb, (int64_t)sd};
    cublasLtMatrixLayout_t ls[3] = {la, lb, ld};
    for (int i = 0; i < 3; i++) {
      ok = ok && cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bcnt, sizeof bcnt) == 0;
      ok = ok &&
           cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st[i], sizeof st[i]) == 0;
    }
  }
  ok = ok && cublasLtMatmulPreferenceCreate(&pref) == 0;
  uint64_t wsmax = 32 << 20;
  ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsmax, sizeof wsmax) == 0;
  cublasLtMatmulHeuristicResult_t res;
  int nres = 0;
  ok = ok && cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, ld, ld, pref, 1, &res, &nres) == 0 && nres == 1;
  ok = ok && res.workspaceSize <= wsmax;
  const void *alpha = c.device_scalars ? (const void *)scal : (const void *)&c.alpha;
  const void *beta = c.device_scalars ? (const void *)((float *)scal + 1) : (const void *)&c.beta;
  ok = ok && cublasLtMatmul(g_lt, desc, alpha, A, la, B, lb, beta, D, ld, D, ld, &res.algo, ws, res.workspaceSize,
                            0) == CUBLAS_STATUS_SUCCESS;
  /* Descriptors may go away before the queued work runs. */
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  ok = ok && cudaDeviceSynchronize() == cudaSuccess;
  r.ok_status = ok;

  for (int bt = 0; bt < c.batch; bt++)
    for (int j = 0; j < c.n; j++) {
      for (int i = 0; i < c.m; i++) {
        double acc = 0, sc = 0;
        for (int q = 0; q < c.k; q++) {
          double a = load_value(A, bt * sa + (na ? (size_t)q * lda + i : (size_t)i * lda + q), c.in);
          double b = load_value(B, bt * sb + (nb ? (size_t)j * ldb + q : (size_t)q * ldb + j), c.in);
          if (c.tf32) a = tf32(a), b = tf32(b);
          acc += a * b;
          sc += std::fabs(a * b);
        }
        double v = c.alpha * acc;
        sc = std::fabs(c.alpha) * sc;
        size_t di = bt * sd + (size_t)j * ldd + i;
        if (c.beta != 0) v += c.beta * d0[di], sc += std::fabs(c.beta * d0[di]);
        if (has_bias) {
          double bv = load_value(bias, i, c.out);
          v += bv;
          sc += std::fabs(bv);
        }
        if (has_relu && v < 0) v = 0;
        r.ref.push_back(v);
        r.scale.push_back(sc);
        r.got.push_back(load_value(D, di, c.out));
      }
      for (int i = c.m; i < ldd; i++) {
        size_t di = bt * sd + (size_t)j * ldd + i;
        if (load_value(D, di, c.out) != d0[di]) r.pad_intact = false;
      }
    }
  cudaFree(A);
  cudaFree(B);
  cudaFree(D);
  cudaFree(bias);
  cudaFree(scal);
  cudaFree(ws);
  return r;
}

/* Every element within half an ulp of the output type (correct rounding
 * of the exact value) plus a summation-order slack. */
void check_case(const Case &c, const char *what) {
  Result r = run_case(c, 0x1234567ull + (uint64_t)c.m * 31 + (uint64_t)c.ta * 7 + (uint64_t)c.tb * 3);
  EXPECT(r.ok_status, "%s: cuBLASLt calls failed", what);
  EXPECT(r.pad_intact, "%s: D's padding rows (ld > rows) were written", what);
  int bad = 0;
  bool any_relu_zero = false;
  for (size_t i = 0; i < r.got.size(); i++) {
    double ref = r.ref[i], got = r.got[i];
    double ulp = ref == 0 ? 0 : std::ldexp(1.0, std::ilogb(ref) - mant_bits(c.out));
    if (c.out == CUDA_R_16F && std::fabs(ref) < std::ldexp(1.0, -14)) ulp = std::ldexp(1.0, -24);
    double tol = 0.5 * ulp * (1 + 1e-9) + 1e-13 * r.scale[i];
    /* f16 rounds to inf from max (65504) + half an ulp (16) on. */
    bool want_inf = c.out == CUDA_R_16F && std::fabs(ref) >= 65520;
    if (want_inf ? got != (ref > 0 ? INFINITY : -INFINITY) : !(std::fabs(got - ref) <= tol)) {
      if (bad++ < 3) std::printf("  %s: element %zu got %.9g want %.9g (tol %.3g)\n", what, i, got, ref, tol);
    }
    if (ref == 0 && r.scale[i] > 0) any_relu_zero = true;
  }
  EXPECT(bad == 0, "%s: %d of %zu elements off", what, bad, r.got.size());
  if (c.epi == CUBLASLT_EPILOGUE_RELU || c.epi == CUBLASLT_EPILOGUE_RELU_BIAS)
    EXPECT(any_relu_zero, "%s: random inputs gave no negative pre-activation (test does not cover ReLU)", what);
}

/* Heuristic + matmul status for a descriptor/layout combination that is
 * expected to be refused. */
cublasStatus_t try_types(cudaDataType_t in, cudaDataType_t out, cublasComputeType_t ct) {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, ld;
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulDescCreate(&desc, ct, CUDA_R_32F);
  cublasLtMatrixLayoutCreate(&la, in, 4, 4, 4);
  cublasLtMatrixLayoutCreate(&ld, out, 4, 4, 4);
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulHeuristicResult_t res;
  int n = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, la, ld, ld, pref, 1, &res, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  return s;
}

void test_numerics() {
  const cublasOperation_t ops[2] = {CUBLAS_OP_N, CUBLAS_OP_T};
  const cudaDataType_t ins[3] = {CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF};
  char what[160];
  for (cudaDataType_t in : ins)
    for (int same = 0; same < 2; same++) {
      cudaDataType_t out = same ? in : CUDA_R_32F;
      if (same && in == CUDA_R_32F) continue;
      for (cublasOperation_t ta : ops)
        for (cublasOperation_t tb : ops) {
          Case c;
          c.ta = ta;
          c.tb = tb;
          c.m = 13;
          c.n = 9;
          c.k = 21;
          c.pad_a = 3;
          c.pad_b = 2;
          c.pad_d = 5;
          c.in = in;
          c.out = out;
          c.alpha = 0.75f;
          std::snprintf(what, sizeof what, "%s->%s ta=%c tb=%c padded ld", tn(in), tn(out), ta ? 'T' : 'N',
                        tb ? 'T' : 'N');
          check_case(c, what);
          c.beta = -1.25f;
          std::snprintf(what, sizeof what, "%s->%s ta=%c tb=%c beta!=0 in place", tn(in), tn(out), ta ? 'T' : 'N',
                        tb ? 'T' : 'N');
          check_case(c, what);
        }
    }
  const cublasLtEpilogue_t epis[4] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_BIAS,
                                      CUBLASLT_EPILOGUE_RELU_BIAS};
  for (cublasLtEpilogue_t e : epis)
    for (cudaDataType_t in : ins) {
      Case c;
      c.ta = CUBLAS_OP_T;  // the backend's linear_fwd shape
      c.m = 17;
      c.n = 11;
      c.k = 19;
      c.in = in;
      c.out = in;
      c.epi = e;
      c.beta = 0.5f;
      std::snprintf(what, sizeof what, "epilogue %d %s", (int)e, tn(in));
      check_case(c, what);
    }
  for (float alpha : {20000.f, 1e-6f}) {
    /* f16 output overflowing to inf and underflowing to subnormals. */
    Case c;
    c.in = c.out = CUDA_R_16F;
    c.m = 16;
    c.n = 16;
    c.alpha = alpha;
    std::snprintf(what, sizeof what, "f16 out of range, alpha %g", alpha);
    check_case(c, what);
  }
  {
    Case c;
    c.batch = 3;
    c.pad_d = 1;
    c.beta = 2;
    c.epi = CUBLASLT_EPILOGUE_RELU_BIAS;
    check_case(c, "strided batch of 3");
    c.batch = 1;
    c.device_scalars = true;
    c.alpha = -1.5f;
    check_case(c, "device pointer mode alpha/beta");
  }
}

void test_tf32() {
  Case c;
  c.m = 24;
  c.n = 16;
  c.k = 64;
  check_case(c, "f32 plain");
  c.tf32 = true;
  check_case(c, "f32 TF32 vs TF32-rounded reference");
  Case p = c;
  p.tf32 = false;
  Result rf = run_case(p, 99), rt = run_case(c, 99);
  int differ = 0, far = 0;
  for (size_t i = 0; i < rf.got.size(); i++) {
    if (rf.got[i] != rt.got[i]) differ++;
    if (std::fabs(rf.got[i] - rt.got[i]) > std::ldexp(1.0, -10) * rf.scale[i]) far++;
  }
  EXPECT(differ > 0, "TF32 result equals the f32 result on random inputs (TF32 rounding not applied)");
  EXPECT(far == 0, "TF32 result off the f32 one by more than 2^-10 relative in %d elements", far);
  /* Plain f32 must not round to TF32: compare against the unrounded reference
   * tightly (done by check_case above) and against TF32 (must differ). */
  int diff_ref = 0;
  for (size_t i = 0; i < rf.got.size(); i++) diff_ref += rf.got[i] != rt.ref[i];
  EXPECT(diff_ref > 0, "plain f32 result equals the TF32 reference");
}

void test_heuristic_and_refusals() {
  EXPECT(try_types(CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_SUCCESS, "f32 GEMM refused");
  EXPECT(try_types(CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_SUCCESS, "f16 GEMM refused");
  EXPECT(try_types(CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_SUCCESS, "bf16->f32 GEMM refused");
  EXPECT(try_types(CUDA_R_32F, CUDA_R_16F, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_NOT_SUPPORTED, "f32->f16 accepted");
  EXPECT(try_types(CUDA_R_16F, CUDA_R_16BF, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_NOT_SUPPORTED, "f16->bf16 accepted");
  EXPECT(try_types(CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_16F) == CUBLAS_STATUS_NOT_SUPPORTED, "COMPUTE_16F accepted");
  EXPECT(try_types(CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F_FAST_TF32) == CUBLAS_STATUS_NOT_SUPPORTED,
         "FAST_TF32 with f16 inputs accepted");
  EXPECT(try_types(CUDA_R_8I, CUDA_R_32F, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_NOT_SUPPORTED, "int8 accepted");

  cublasLtMatmulDesc_t desc;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  uint32_t gelu = CUBLASLT_EPILOGUE_GELU_BIAS, bgradb = CUBLASLT_EPILOGUE_BGRADB;
  EXPECT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &gelu, sizeof gelu) ==
             CUBLAS_STATUS_NOT_SUPPORTED, "GELU_BIAS epilogue accepted");
  EXPECT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &bgradb, sizeof bgradb) ==
             CUBLAS_STATUS_NOT_SUPPORTED, "BGRADB epilogue accepted");
  int32_t opc = CUBLAS_OP_C, pm = CUBLASLT_POINTER_MODE_DEVICE_VECTOR;
  EXPECT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opc, sizeof opc) ==
             CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_OP_C accepted");
  EXPECT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm) ==
             CUBLAS_STATUS_NOT_SUPPORTED, "DEVICE_VECTOR pointer mode accepted");
  int64_t small = 1;
  EXPECT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &small, sizeof small) ==
             CUBLAS_STATUS_INVALID_VALUE, "wrong attribute size accepted");
  void *amax = nullptr;
  EXPECT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &amax, sizeof amax) ==
             CUBLAS_STATUS_NOT_SUPPORTED, "AMAX_D_POINTER accepted");

  cublasLtMatrixLayout_t la;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 8, 8, 8);
  int32_t row = CUBLASLT_ORDER_ROW;
  EXPECT(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_ORDER, &row, sizeof row) ==
             CUBLAS_STATUS_NOT_SUPPORTED, "row order accepted");

  /* Workspace: none allowed -> 0; allowed -> the matmul needs what it asked. */
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulHeuristicResult_t res;
  int n = 0;
  EXPECT(cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, la, la, la, pref, 1, &res, &n) == 0 && n == 1 &&
             res.workspaceSize == 0, "default preference (no workspace): got %zu bytes", res.workspaceSize);
  uint64_t wsmax = 1 << 20;
  uint32_t al4 = 4;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsmax, sizeof wsmax);
  EXPECT(cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, la, la, la, pref, 1, &res, &n) == 0 && n == 1 &&
             res.workspaceSize > 0 && res.workspaceSize <= wsmax, "workspace %zu", res.workspaceSize);
  void *A, *D, *ws;
  cudaMalloc(&A, 1024);
  cudaMalloc(&D, 1024 + 16);
  cudaMalloc(&ws, 1 << 20);
  for (int i = 0; i < 64; i++) ((float *)A)[i] = (float)frand();
  float one = 1, zero = 0;
  EXPECT(cublasLtMatmul(g_lt, desc, &one, A, la, A, la, &zero, D, la, D, la, &res.algo, ws, res.workspaceSize - 1, 0) ==
             CUBLAS_STATUS_INVALID_VALUE, "too small a workspace accepted");
  std::memset(ws, 0, res.workspaceSize);
  EXPECT(cublasLtMatmul(g_lt, desc, &one, A, la, A, la, &zero, D, la, D, la, &res.algo, ws, res.workspaceSize, 0) ==
             CUBLAS_STATUS_SUCCESS, "matmul with the heuristic's workspace refused");
  cudaDeviceSynchronize();
  /* The workspace is scribbled on, as scratch would be on a device. */
  EXPECT(((unsigned char *)ws)[0] != 0 && ((unsigned char *)ws)[res.workspaceSize - 1] != 0,
         "workspace left untouched");
  /* The algo was chosen for 256-byte aligned D (the default preference). */
  float *d4 = (float *)D + 1;
  EXPECT(cublasLtMatmul(g_lt, desc, &one, A, la, A, la, &zero, d4, la, d4, la, &res.algo, ws, res.workspaceSize, 0) ==
             CUBLAS_STATUS_INVALID_VALUE, "4-byte aligned D accepted by an algo chosen for 256");
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al4, sizeof al4);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al4, sizeof al4);
  cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, la, la, la, pref, 1, &res, &n);
  EXPECT(cublasLtMatmul(g_lt, desc, &one, A, la, A, la, &zero, d4, la, d4, la, &res.algo, ws, res.workspaceSize, 0) ==
             CUBLAS_STATUS_SUCCESS, "4-byte aligned D refused by an algo chosen for 4");
  /* An algo chosen for another transpose is refused. */
  int32_t t = CUBLAS_OP_T;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
  EXPECT(cublasLtMatmul(g_lt, desc, &one, A, la, A, la, &zero, d4, la, d4, la, &res.algo, ws, res.workspaceSize, 0) ==
             CUBLAS_STATUS_INVALID_VALUE, "algo from another descriptor accepted");
  /* D overlapping A races on a real device. */
  cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, la, la, la, pref, 1, &res, &n);
  EXPECT(cublasLtMatmul(g_lt, desc, &one, A, la, A, la, &zero, A, la, A, la, &res.algo, ws, res.workspaceSize, 0) ==
             CUBLAS_STATUS_INVALID_VALUE, "D == A accepted");
  EXPECT(cudaDeviceSynchronize() == cudaSuccess, "an error was recorded by the valid calls");

  /* A host pointer is reported as an illegal address (last: the error may
   * be sticky). */
  std::vector<float> host(64, 1.f);
  cublasStatus_t st =
      cublasLtMatmul(g_lt, desc, &one, host.data(), la, A, la, &zero, D, la, D, la, &res.algo, ws, res.workspaceSize, 0);
  cudaError_t e = cudaDeviceSynchronize();
  cudaError_t e2 = cudaGetLastError();
  EXPECT(st != CUBLAS_STATUS_SUCCESS || e == cudaErrorIllegalAddress || e2 == cudaErrorIllegalAddress,
         "host pointer as A not reported (status %d, sync %d, last %d)", (int)st, (int)e, (int)e2);
  cudaFree(A);
  cudaFree(D);
  cudaFree(ws);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(desc);
}

/* Under graph capture the work runs at each launch: inputs and the bias are
 * read then, alpha at the call, and the descriptors may be gone. */
void test_graph_capture() {
  const int m = 6, n = 5, k = 4;
  cudaStream_t s;
  EXPECT(cudaStreamCreate(&s) == cudaSuccess, "cudaStreamCreate");
  float *A, *B, *D, *bias;
  void *ws;
  cudaMalloc((void **)&A, k * m * 4);  // stored k x m, used as op(A) = A^T
  cudaMalloc((void **)&B, k * n * 4);
  cudaMalloc((void **)&D, m * n * 4);
  cudaMalloc((void **)&bias, m * 4);
  cudaMalloc(&ws, 1 << 16);
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulPreference_t pref;
  int32_t t = CUBLAS_OP_T;
  uint32_t epi = CUBLASLT_EPILOGUE_RELU_BIAS;
  uint64_t wsmax = 1 << 16;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, k, m, k);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, n, k);
  cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsmax, sizeof wsmax);
  cublasLtMatmulHeuristicResult_t res;
  int nres = 0;
  cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, ld, ld, pref, 1, &res, &nres);
  for (int i = 0; i < m * n; i++) D[i] = 7.f;
  float alpha = 2.f, beta = 0.f;
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin capture");
  EXPECT(cublasLtMatmul(g_lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res.algo, ws, res.workspaceSize, s) ==
             CUBLAS_STATUS_SUCCESS, "matmul under capture");
  EXPECT(cudaStreamEndCapture(s, &g) == cudaSuccess, "end capture");
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  alpha = 100.f;  // read at the call: must not matter
  bool untouched = true;
  for (int i = 0; i < m * n; i++) untouched = untouched && D[i] == 7.f;
  EXPECT(untouched, "captured matmul ran at capture time");
  EXPECT(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess, "instantiate");
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < k * m; i++) A[i] = (float)frand();
    for (int i = 0; i < k * n; i++) B[i] = (float)frand();
    for (int i = 0; i < m; i++) bias[i] = (float)frand();
    EXPECT(cudaGraphLaunch(ge, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess, "graph launch");
    int bad = 0;
    for (int j = 0; j < n; j++)
      for (int i = 0; i < m; i++) {
        double acc = 0;
        for (int q = 0; q < k; q++) acc += (double)A[i * k + q] * B[j * k + q];
        double v = 2.0 * acc + bias[i];
        float want = (float)(v > 0 ? v : 0);
        bad += !(std::fabs(D[j * m + i] - want) <= 1e-6 * (1 + std::fabs(want)));
      }
    EXPECT(bad == 0, "graph replay %d: %d elements differ from the values at launch time", round, bad);
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  cudaFree(A);
  cudaFree(B);
  cudaFree(D);
  cudaFree(bias);
  cudaFree(ws);
}

}  // namespace

int main() {
  if (cublasLtCreate(&g_lt) != CUBLAS_STATUS_SUCCESS) {
    std::printf("FAIL: cublasLtCreate\n");
    return 1;
  }
  test_numerics();
  test_tf32();
  test_graph_capture();
  test_heuristic_and_refusals();
  cublasLtDestroy(g_lt);
  return emu_selftest_summary("emu_selftest_lt");
}
