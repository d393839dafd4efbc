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

/* ---- 8 elements at a time ----
 * Bandwidth-bound kernels move 8 consecutive elements per step: one
 * 16-byte access for 16-bit storage, two for f32. With one 2-byte access
 * per thread too few bytes are in flight to reach HBM's rate (docs/GPU.md,
 * "Since the H100 run"). The per-element
 * arithmetic is the scalar kernels', so both paths give the same bits. The
 * 8-wide path needs every pointer 16-byte aligned (ct_vec_ok); device
 * allocations are 256-aligned and plan buffers 64-aligned, so only views
 * into the middle of a buffer fall back to the scalar path. */
#define CT_VEC 8

template <int W>
struct ct_width {
  static constexpr int value = W;
};

__device__ __forceinline__ float ct_bits16_to_f32(uint32_t h, int dt) {
  return dt == CT_BF16 ? ct_bf16_to_f32_dev((uint16_t)h) : __half2float(__ushort_as_half((unsigned short)h));
}
__device__ __forceinline__ uint32_t ct_f32_to_bits16(float v, int dt) {
  return dt == CT_BF16 ? ct_f32_to_bf16_dev(v) : __half_as_ushort(__float2half_rn(v));
}

/* Elements i .. i+W-1 of a float tensor as floats; for W 8, i is a
 * multiple of 8 and p 16-byte aligned. */
template <int W>
__device__ __forceinline__ void ct_ldw(const void *p, int dt, int64_t i, float *f) {
  if constexpr (W == 1) {
    f[0] = ct_ld(p, dt, i);
  } else {
    static_assert(W == CT_VEC, "8 elements or 1");
    if (dt == CT_F32) {
      const float4 *q = (const float4 *)((const float *)p + i);
      const float4 a = q[0], b = q[1];
      f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    } else {
      const uint4 u = *(const uint4 *)((const uint16_t *)p + i);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int k = 0; k < 4; k++) {
        f[2 * k] = ct_bits16_to_f32(w[k] & 0xffffu, dt);
        f[2 * k + 1] = ct_bits16_to_f32(w[k] >> 16, dt);
      }
    }
  }
}

template <int W>
__device__ __forceinline__ void ct_stw(void *p, int dt, int64_t i, const float *f) {
  if constexpr (W == 1) {
    ct_st(p, dt, i, f[0]);
  } else {
    static_assert(W == CT_VEC, "8 elements or 1");
    if (dt == CT_F32) {
      float4 *q = (float4 *)((float *)p + i);
      q[0] = make_float4(f[0], f[1], f[2], f[3]);
      q[1] = make_float4(f[4], f[5], f[6], f[7]);
    } else {
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; k++) w[k] = ct_f32_to_bits16(f[2 * k], dt) | ct_f32_to_bits16(f[2 * k + 1], dt) << 16;
      *(uint4 *)((uint16_t *)p + i) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

/* Runs body(i, ct_width<W>()) over elements [0, n): when vec, groups of 8
 * (i = 8g) in a grid-stride loop, then the last n % 8 one at a time;
 * otherwise all of them one at a time. body reads and writes through
 * ct_ldw<W> / ct_stw<W>, so one lambda serves both widths. */
template <class F>
__device__ __forceinline__ void ct_vec_for(int64_t n, int vec, F body) {
  int64_t done = 0;
  if (vec) {
    const int64_t groups = n / CT_VEC;
    CT_GRID_STRIDE(g, groups) body(g * CT_VEC, ct_width<CT_VEC>());
    done = groups * CT_VEC;
  }
  for (int64_t i = done + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    body(i, ct_width<1>());
}

/* Host side: 1 when every non-NULL pointer is 16-byte aligned. */
static inline int ct_vec_ok(const void *a, const void *b = 0, const void *c = 0, const void *d = 0) {
  return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) & 15) == 0;
}

/* The grid for ct_vec_for over n elements. */
static inline unsigned ct_vec_blocks(int64_t n, int vec) { return ct_blocks(vec ? (n + CT_VEC - 1) / CT_VEC : n); }

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
    case CT_ACT_RELU: return y <= 0.f ? 0.f : 1.f; /* torch: a NaN y passes dy */
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
