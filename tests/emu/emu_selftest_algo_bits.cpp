/* Self-test of CT_EMU_ALGO_BITS (emu.h), which every other emulator test
 * runs under: off, algo_bits changes nothing; on, one key gives the same
 * value every time, within one last place of f32, and two keys differ in
 * about two thirds of the elements; and through the emulated cuBLASLt, an
 * f32 product computed twice with one alignment preference gives the same
 * bits, with another preference (a kernel chosen for 16-byte operands
 * instead of 256) other bits. Exits nonzero on any failure. */
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "emu.h"
#include "emu_selftest.h"

namespace {

/* D = A B (n x n, f32, column-major) with A at byte offset a_off into its
 * buffer and the heuristic told A's alignment; returns D. */
std::vector<float> product(int n, size_t a_off, uint32_t a_align) {
  const size_t bytes = (size_t)n * n * sizeof(float);
  std::vector<float> h(n * n), out(n * n);
  for (int i = 0; i < n * n; i++) h[i] = (float)((i * 7919 % 1000) - 500) / 256.0f;
  char *a = nullptr;
  float *b = nullptr, *d = nullptr;
  cudaMalloc((void **)&a, bytes + 256);
  cudaMalloc((void **)&b, bytes);
  cudaMalloc((void **)&d, bytes);
  float *A = (float *)(a + a_off);
  cudaMemcpy(A, h.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(b, h.data(), bytes, cudaMemcpyHostToDevice);
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t l;
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulHeuristicResult_t res;
  int nres = 0;
  bool ok = cublasLtCreate(&lt) == 0 && cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0 &&
            cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, n, n, n) == 0 && cublasLtMatmulPreferenceCreate(&pref) == 0;
  ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a_align,
                                                  sizeof a_align) == 0;
  ok = ok && cublasLtMatmulAlgoGetHeuristic(lt, desc, l, l, l, l, pref, 1, &res, &nres) == 0 && nres == 1;
  const float one = 1, zero = 0;
  ok = ok && res.workspaceSize == 0 &&
       cublasLtMatmul(lt, desc, &one, A, l, b, l, &zero, d, l, d, l, &res.algo, nullptr, 0, nullptr) == 0;
  ok = ok && cudaMemcpy(out.data(), d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
  EXPECT(ok, "the product with A at offset %zu, alignment preference %u", a_off, a_align);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
  cudaFree(a), cudaFree(b), cudaFree(d);
  return out;
}

}  // namespace

int main() {
  setenv("CT_EMU_ALGO_BITS", "1", 1); /* before the first query caches it */
  EXPECT(ct_emu::algo_bits_on(), "CT_EMU_ALGO_BITS=1 not seen");
  int differ = 0, far = 0;
  for (uint64_t i = 0; i < 3000; i++) {
    const double v = 1.0 + (double)i / 3000.0;
    const double a = ct_emu::algo_bits(v, 5, i), b = ct_emu::algo_bits(v, 6, i);
    EXPECT(a == ct_emu::algo_bits(v, 5, i), "key 5, element %llu: not the same twice", (unsigned long long)i);
    differ += a != b;
    far += std::fabs(a - v) > v * std::ldexp(1.0, -23) * 1.0000001;
  }
  EXPECT(far == 0, "%d elements moved by more than one last place of f32", far);
  EXPECT(differ > 1500 && differ < 2500, "two keys differ in %d of 3000 elements (about 2000 expected)", differ);

  const int n = 32;
  const std::vector<float> wide = product(n, 0, 256), again = product(n, 0, 256), narrow = product(n, 16, 16);
  int changed = 0;
  for (int i = 0; i < n * n; i++) changed += std::memcmp(&wide[i], &narrow[i], sizeof(float)) != 0;
  EXPECT(std::memcmp(wide.data(), again.data(), wide.size() * sizeof(float)) == 0,
         "one kernel gave other bits the second time");
  EXPECT(changed > n * n / 4, "a kernel chosen for 16-byte A changed %d of %d elements", changed, n * n);
  return emu_selftest_summary("emu_selftest_algo_bits");
}
