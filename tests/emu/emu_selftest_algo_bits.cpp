/* Self-test of CT_EMU_ALGO_BITS (emu.h), which every other emulator test
 * runs under (this one turns it on itself): one key gives the same value
 * every time, a whole number of f32 last places from the input (at most
 * 1 for an f32 output, 256 for a 16-bit one), and two keys differ in most
 * elements; and through the
 * emulated cuBLASLt, an f32 product computed twice with one alignment
 * preference gives the same bits, with another preference (a kernel chosen
 * for 16-byte operands instead of 256) other bits. Exits nonzero on any
 * failure. */
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
  bool ok = cudaMalloc((void **)&a, bytes + 256) == cudaSuccess && cudaMalloc((void **)&b, bytes) == cudaSuccess &&
            cudaMalloc((void **)&d, bytes) == cudaSuccess;
  float *A = ok ? (float *)(a + a_off) : nullptr;
  ok = ok && cudaMemcpy(A, h.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(b, h.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess;
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t l = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t res;
  int nres = 0;
  ok = ok && cublasLtCreate(&lt) == 0 && cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0 &&
            cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, n, n, n) == 0 && cublasLtMatmulPreferenceCreate(&pref) == 0;
  ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a_align,
                                                  sizeof a_align) == 0;
  ok = ok && cublasLtMatmulAlgoGetHeuristic(lt, desc, l, l, l, l, pref, 1, &res, &nres) == 0 && nres == 1;
  const float one = 1, zero = 0;
  ok = ok && res.workspaceSize == 0 &&
       cublasLtMatmul(lt, desc, &one, A, l, b, l, &zero, d, l, d, l, &res.algo, nullptr, 0, nullptr) == 0;
  ok = ok && cudaMemcpy(out.data(), d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
  EXPECT(ok, "the product with A at offset %zu, alignment preference %u", a_off, a_align);
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (l) cublasLtMatrixLayoutDestroy(l);
  if (desc) cublasLtMatmulDescDestroy(desc);
  if (lt) cublasLtDestroy(lt);
  cudaFree(a), cudaFree(b), cudaFree(d);
  return out;
}

}  // namespace

int main() {
  setenv("CT_EMU_ALGO_BITS", "1", 1); /* before the first query caches it */
  EXPECT(ct_emu::algo_bits_on(), "CT_EMU_ALGO_BITS=1 not seen");
  /* An f32 output moves by -1..+1 of its last places, a 16-bit one's f32
   * accumulator by -256..+256 (CT_EMU_ALGO_BITS=1). */
  for (int narrow = 0; narrow < 2; narrow++) {
    const int most = narrow ? 256 : 1;
    int differ = 0, far = 0;
    for (uint64_t i = 0; i < 3000; i++) {
      const double v = (float)(1.0 + (double)i / 3000.0);
      const double a = ct_emu::algo_bits(v, 5, i, narrow), b = ct_emu::algo_bits(v, 6, i, narrow);
      EXPECT(a == ct_emu::algo_bits(v, 5, i, narrow), "key 5, element %llu: not the same twice",
             (unsigned long long)i);
      differ += a != b;
      const double ulp = std::ldexp(1.0, std::ilogb(v) - 23), q = (a - v) / ulp;
      far += !(q == std::nearbyint(q) && std::fabs(q) <= most);
    }
    EXPECT(far == 0, "narrow %d: %d elements moved by other than 0..%d last places of f32", narrow, far, most);
    /* Equal by chance: 1 in 3 (f32), 1 in 513 (16-bit). */
    EXPECT(narrow ? differ > 2950 : differ > 1800 && differ < 2200, "narrow %d: two keys differ in %d of 3000",
           narrow, differ);
  }

  const int n = 32;
  const std::vector<float> wide = product(n, 0, 256), again = product(n, 0, 256), narrow = product(n, 16, 16);
  int changed = 0;
  for (int i = 0; i < n * n; i++) changed += std::memcmp(&wide[i], &narrow[i], sizeof(float)) != 0;
  EXPECT(std::memcmp(wide.data(), again.data(), wide.size() * sizeof(float)) == 0,
         "one kernel gave other bits the second time");
  EXPECT(changed > n * n / 4, "a kernel chosen for 16-byte A changed %d of %d elements", changed, n * n);
  return emu_selftest_summary("emu_selftest_algo_bits");
}
