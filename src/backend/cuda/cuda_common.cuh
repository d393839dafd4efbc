/* Device-side helpers shared by the .cu files: dtype-generic loads and
 * stores (f32, bf16, f16 storage; float arithmetic), the launch grid, and
 * the activation formulas. The 16-bit conversions copy src/core/dtype.c
 * (round to nearest even, NaN kept quiet) so a value rounded on the GPU is
 * the value the host would produce. */
#ifndef CTRAIN_CUDA_COMMON_CUH
#define CTRAIN_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_impl.h"

#define CT_THREADS 256

/* Grid for a grid-stride loop over n elements: enough blocks to fill an
 * H100 several times over, never more than needed. */
static inline unsigned ct_blocks(int64_t n) {
  int64_t b = (n + CT_THREADS - 1) / CT_THREADS;
  if (b < 1) b = 1;
  if (b > 8192) b = 8192;
  return (unsigned)b;
}

#define CT_GRID_STRIDE(i, n) \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
/* The same with index type I (int32_t where the caller has checked that n
 * and n plus one grid's stride fit). */
#define CT_GRID_STRIDE_T(I, i, n) \
  for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < (n); i += (I)(gridDim.x * blockDim.x))

__device__ __forceinline__ float ct_bf16_to_f32_dev(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t ct_f32_to_bf16_dev(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Element i of a float tensor of dtype dt, as float. */
__device__ __forceinline__ float ct_ld(const void *p, int dt, int64_t i) {
  if (dt == CT_F32) return ((const float *)p)[i];
  if (dt == CT_BF16) return ct_bf16_to_f32_dev(((const uint16_t *)p)[i]);
  return __half2float(((const __half *)p)[i]);
}

__device__ __forceinline__ void ct_st(void *p, int dt, int64_t i, float v) {
  if (dt == CT_F32)
    ((float *)p)[i] = v;
  else if (dt == CT_BF16)
    ((uint16_t *)p)[i] = ct_f32_to_bf16_dev(v);
  else
    ((__half *)p)[i] = __float2half_rn(v);
}

/* Activation and its derivative (from x or y, as CT_ACT_BWD_NEEDS_* say),
 * the formulas of src/backend/cpu/ref_util.h in float. */
__device__ __forceinline__ float ct_act_dev(int a, float alpha, float x) {
  switch (a) {
    case CT_ACT_RELU: return x < 0.f ? 0.f : x;
    case CT_ACT_LEAKY_RELU: return x > 0.f ? x : alpha * x;
    case CT_ACT_GELU: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case CT_ACT_SILU: return x / (1.f + expf(-x));
    case CT_ACT_SIGMOID: return 1.f / (1.f + expf(-x));
    case CT_ACT_TANH: return tanhf(x);
    default: return x;
  }
}

__device__ __forceinline__ float ct_act_grad_dev(int a, float alpha, float x, float y) {
  switch (a) {
    case CT_ACT_RELU: return y > 0.f ? 1.f : 0.f;
    case CT_ACT_LEAKY_RELU: return x > 0.f ? 1.f : alpha;
    case CT_ACT_GELU: {
      float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752f));
      float pdf = expf(-0.5f * x * x) * 0.39894228040143268f;
      return cdf + x * pdf;
    }
    case CT_ACT_SILU: {
      float s = 1.f / (1.f + expf(-x));
      return s * (1.f + x * (1.f - s));
    }
    case CT_ACT_SIGMOID: return y * (1.f - y);
    case CT_ACT_TANH: return 1.f - y * y;
    default: return 1.f;
  }
}

/* Block-wide sum of one double per thread; every thread gets the total.
 * blockDim.x must be CT_THREADS; sh holds CT_THREADS/32 doubles. */
__device__ __forceinline__ double ct_block_sum(double v, double *sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads(); /* sh may still be read from a previous call */
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  double t = 0;
  for (int w = 0; w < CT_THREADS / 32; w++) t += sh[w];
  return t;
}

/* Block-wide max of one float per thread (NaN wins); all threads get it. */
__device__ __forceinline__ float ct_block_max(float v, float *sh) {
  for (int o = 16; o > 0; o >>= 1) {
    float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = (u > v || isnan(u)) ? u : v;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float t = sh[0];
  for (int w = 1; w < CT_THREADS / 32; w++) t = (sh[w] > t || isnan(sh[w])) ? sh[w] : t;
  return t;
}

#endif
