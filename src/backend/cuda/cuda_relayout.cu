/* NCHW <-> NHWC copies with a dtype conversion and an optional
 * accumulate, for operands whose layout or dtype differs from the one a
 * cuDNN call runs in (cuda_conv.c). One thread per destination element,
 * so the destination is written coalesced; plain copies (same layout,
 * beta 0) are left to cuda_convert. */
#include "backend/cuda/cuda_common.cuh"

/* Element i of the destination from its source element; I is the index
 * type: 32-bit division is several times cheaper than 64-bit on the GPU,
 * so tensors below 2^31 elements take the 32-bit instance. */
template <class I>
__device__ __forceinline__ void relayout_elem(const void *src, int st, int src_nhwc, void *dst, int dt, int dst_nhwc,
                                              I i, I C, I HW, float beta) {
  I b, c, p;
  if (dst_nhwc)
    c = i % C, p = (i / C) % HW, b = i / (C * HW);
  else
    p = i % HW, c = (i / HW) % C, b = i / (C * HW);
  const I j = src_nhwc ? (b * HW + p) * C + c : (b * C + c) * HW + p;
  float v = ct_ld(src, st, j);
  if (beta != 0.f) v += beta * ct_ld(dst, dt, i);
  ct_st(dst, dt, i, v);
}

__global__ void k_relayout(const void *src, int st, int src_nhwc, void *dst, int dt, int dst_nhwc, int64_t N,
                           int64_t C, int64_t HW, float beta) {
  const int64_t n = N * C * HW, grid = (int64_t)gridDim.x * blockDim.x;
  if (n + grid <= INT32_MAX) { /* i + stride below never overflows */
    const int32_t n32 = (int32_t)n, stride = (int32_t)grid;
    for (int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x); i < n32; i += stride)
      relayout_elem<int32_t>(src, st, src_nhwc, dst, dt, dst_nhwc, i, (int32_t)C, (int32_t)HW, beta);
    return;
  }
  CT_GRID_STRIDE(i, n) relayout_elem<int64_t>(src, st, src_nhwc, dst, dt, dst_nhwc, i, C, HW, beta);
}

extern "C" ct_status cuda_relayout(ct_device *d, const void *src, ct_dtype st, int src_nhwc, void *dst, ct_dtype dt,
                                   int dst_nhwc, int64_t N, int64_t C, int64_t HW, float beta) {
  if (!cuda_float_dtype(st) || !cuda_float_dtype(dt))
    return ct_error(CT_ERR_UNSUPPORTED, "cuda relayout: dtypes %s -> %s; expected f32, bf16 or f16",
                    ct_dtype_name(st) ? ct_dtype_name(st) : "?", ct_dtype_name(dt) ? ct_dtype_name(dt) : "?");
  const int64_t n = N * C * HW;
  if (!n) return CT_OK;
  CT_TRY(cuda_enter(d));
  k_relayout<<<ct_blocks(n), CT_THREADS, 0, cuda_stream(d)>>>(src, (int)st, src_nhwc, dst, (int)dt, dst_nhwc, N, C,
                                                               HW, beta);
  CUDA_LAUNCHED("relayout");
  return CT_OK;
}
