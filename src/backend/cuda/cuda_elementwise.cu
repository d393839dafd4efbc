/* Elementwise kernels of the CUDA backend: activations and their
 * gradients, dropout (the Philox masks of src/core/rng.c, bit for bit),
 * add, axpby, fill, cast, and the bias+activation / per-channel sum helpers
 * the cuBLASLt and cuDNN ops use. Storage f32, bf16 or f16; arithmetic in
 * float (dropout's scaling in double, as the reference does). */
#include "backend/cuda/cuda_common.cuh"
#include "ctrain/rng.h"

/* ---- Philox4x32-10, a copy of ct_philox4x32 / ct_rng_uniform_at ---- */

/* The four words of counter block blk (elements 4 blk .. 4 blk + 3). */
__device__ __forceinline__ void ct_philox_block_dev(uint64_t seed, uint32_t kind, uint32_t a, uint32_t b, uint64_t blk,
                                                    uint32_t *w) {
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  uint32_t c0 = (uint32_t)blk, c1 = kind ^ ((uint32_t)(blk >> 32) << 8), c2 = a, c3 = b;
#pragma unroll
  for (int round = 0; round < 10; round++) {
    uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  w[0] = c0, w[1] = c1, w[2] = c2, w[3] = c3;
}

__device__ __forceinline__ float ct_rng_word_uniform(uint32_t w) { return (float)(w >> 8) * (1.0f / 16777216.0f); }

__device__ __forceinline__ float ct_rng_uniform_at_dev(uint64_t seed, uint32_t kind, uint32_t a, uint32_t b,
                                                       uint64_t i) {
  uint32_t w[4];
  ct_philox_block_dev(seed, kind, a, b, i >> 2, w);
  return ct_rng_word_uniform(w[i & 3]);
}

/* ---- kernels ---- */

/* The elementwise kernels below take vec (ct_vec_for: 8 elements a step
 * when every pointer is 16-byte aligned); the results do not depend on it. */

__global__ void k_act_fwd(int act, float alpha, const void *x, int xt, void *y, int yt, int64_t n, int vec) {
  ct_vec_for(n, vec, [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float v[W];
    ct_ldw<W>(x, xt, i, v);
    for (int k = 0; k < W; k++) v[k] = ct_act_dev(act, alpha, v[k]);
    ct_stw<W>(y, yt, i, v);
  });
}

__global__ void k_act_bwd(int act, float alpha, const void *x, int xt, const void *y, int yt, const void *dy, int dyt,
                          void *dx, int dxt, int64_t n, int vec) {
  ct_vec_for(n, vec, [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float xv[W] = {}, yv[W] = {}, g[W];
    if (x) ct_ldw<W>(x, xt, i, xv);
    if (y) ct_ldw<W>(y, yt, i, yv);
    ct_ldw<W>(dy, dyt, i, g);
    for (int k = 0; k < W; k++) g[k] *= ct_act_grad_dev(act, alpha, xv[k], yv[k]);
    ct_stw<W>(dx, dxt, i, g);
  });
}

/* mode 0: copy, 1: zero, 2: mask and scale. step_dev: the step from
 * device memory (a captured graph replays the address, not the value);
 * NULL: the step argument. Either way the Philox inputs are the same.
 * 8 elements with one mask per element (group 1) draw two Philox blocks
 * where one at a time each element draws the whole block of its word. */
__global__ void k_dropout(int mode, float pf, double scale, int64_t group, ct_dropout_key key,
                          const uint32_t *step_dev, const void *x, int xt, void *y, int yt, int64_t n, int vec) {
  const uint64_t seed = key.seed;
  const uint32_t layer = key.layer;
  uint32_t step = key.step;
  if (mode == 2 && step_dev) step = *step_dev;
  const int whole = ct_dropout_key_whole(&key);
  ct_vec_for(n, vec, [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float v[W] = {};
    if (mode != 1) ct_ldw<W>(x, xt, i, v);
    if (mode == 2) {
      float u[W];
      if (W == CT_VEC && group == 1 && whole) {
        uint32_t r[8];
        ct_philox_block_dev(seed, CT_RNG_DROPOUT, layer, step, (uint64_t)i >> 2, r);
        ct_philox_block_dev(seed, CT_RNG_DROPOUT, layer, step, ((uint64_t)i >> 2) + 1, r + 4);
        for (int k = 0; k < W; k++) u[k] = ct_rng_word_uniform(r[k]);
      } else {
        for (int k = 0; k < W; k++)
          u[k] = ct_rng_uniform_at_dev(seed, CT_RNG_DROPOUT, layer, step,
                                       ct_dropout_mask_index(&key, (uint64_t)((i + k) / group)));
      }
      for (int k = 0; k < W; k++) v[k] = u[k] < pf ? 0.f : (float)((double)v[k] * scale);
    }
    ct_stw<W>(y, yt, i, v);
  });
}

/* y = act(a + b), the residual add with its folded ReLU in one pass. */
__global__ void k_add(int act, const void *a, int at, const void *b, int bt, void *y, int yt, int64_t n, int vec) {
  ct_vec_for(n, vec, [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float va[W], vb[W];
    ct_ldw<W>(a, at, i, va);
    ct_ldw<W>(b, bt, i, vb);
    for (int k = 0; k < W; k++) va[k] = ct_act_dev(act, 0.01f, va[k] + vb[k]);
    ct_stw<W>(y, yt, i, va);
  });
}

__global__ void k_axpby(float alpha, const void *x, int xt, float beta, void *y, int yt, int64_t n, int vec) {
  ct_vec_for(n, vec, [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    /* beta 0 overwrites, so stale NaN in y does not leak through */
    float vx[W], vy[W] = {};
    ct_ldw<W>(x, xt, i, vx);
    if (beta != 0.f) ct_ldw<W>(y, yt, i, vy);
    /* fmaf spelled out: a*x + b*y may fuse either product, and the two
     * widths must not choose differently */
    for (int k = 0; k < W; k++) vy[k] = fmaf(alpha, vx[k], beta != 0.f ? beta * vy[k] : 0.f);
    ct_stw<W>(y, yt, i, vy);
  });
}

__global__ void k_fill(void *x, int xt, float v, int64_t n, int vec) {
  ct_vec_for(n, vec, [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float f[W];
    for (int k = 0; k < W; k++) f[k] = v;
    ct_stw<W>(x, xt, i, f);
  });
}

/* Any-to-any conversion through double, with the host's rules: floats to
 * 16-bit round to nearest even (f64 -> f16/bf16 via f32, as ct_convert),
 * floats to integers truncate. */
__device__ __forceinline__ double ld_any(const void *p, int t, int64_t i) {
  switch (t) {
    case CT_F32: return ((const float *)p)[i];
    case CT_F64: return ((const double *)p)[i];
    case CT_F16: return __half2float(((const __half *)p)[i]);
    case CT_BF16: return ct_bf16_to_f32_dev(((const uint16_t *)p)[i]);
    case CT_I32: return ((const int32_t *)p)[i];
    case CT_I64: return (double)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
  }
}

__device__ __forceinline__ void st_any(void *p, int t, int64_t i, double v) {
  switch (t) {
    case CT_F32: ((float *)p)[i] = (float)v; break;
    case CT_F64: ((double *)p)[i] = v; break;
    case CT_F16: ((__half *)p)[i] = __float2half_rn((float)v); break;
    case CT_BF16: ((uint16_t *)p)[i] = ct_f32_to_bf16_dev((float)v); break;
    case CT_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case CT_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
  }
}

/* vec: both dtypes float (f32, bf16, f16; through float, which is exact
 * between them and rounds as the double detour would) and aligned. */
__global__ void k_cast(const void *x, int xt, void *y, int yt, int64_t n, int vec) {
  if (vec) {
    ct_vec_for(n, 1, [&](int64_t i, auto w) {
      constexpr int W = decltype(w)::value;
      float f[W];
      ct_ldw<W>(x, xt, i, f);
      ct_stw<W>(y, yt, i, f);
    });
    return;
  }
  CT_GRID_STRIDE(i, n) st_any(y, yt, i, ld_any(x, xt, i));
}

/* The channel of the group's first element takes two divisions; the rest
 * step through [channels][inner] by counting. */
__global__ void k_bias_act(void *y, int yt, int64_t n, const void *b, int bt, int64_t channels, int64_t inner,
                           int act, int vec) {
  ct_vec_for(n, vec, [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float v[W];
    ct_ldw<W>(y, yt, i, v);
    if (b) {
      const int64_t q = i / inner;
      int64_t c = q % channels, r = i - q * inner;
      for (int k = 0; k < W; k++) {
        v[k] += ct_ld(b, bt, c);
        if (++r == inner) {
          r = 0;
          if (++c == channels) c = 0;
        }
      }
    }
    for (int k = 0; k < W; k++) v[k] = ct_act_dev(act, 0.01f, v[k]);
    ct_stw<W>(y, yt, i, v);
  });
}

/* Column sums of a row-major [rows][C] matrix (an NHWC gradient, a linear
 * layer's dy): a block of 32x8 threads takes 32 adjacent columns, so a
 * warp reads 32 consecutive elements of a row, and grid.y slices the rows.
 * part[y][c] gets slice y's sum in double; k_col_finish adds the slices in
 * order, so the result does not depend on scheduling. (One block per
 * channel, as below, would read with a stride of C and run C blocks:
 * AlexNet's first conv has 64 channels over 774k rows at batch 256.) */
#define COL_W 32
#define COL_H 8
__global__ void k_col_partials(const void *x, int xt, int64_t rows, int64_t C, double *part) {
  __shared__ double sh[COL_H][COL_W + 1];
  const int64_t c = (int64_t)blockIdx.x * COL_W + threadIdx.x;
  double s = 0;
  if (c < C)
    for (int64_t r = (int64_t)blockIdx.y * COL_H + threadIdx.y; r < rows; r += (int64_t)COL_H * gridDim.y)
      s += ct_ld(x, xt, r * C + c);
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double t = 0;
    for (int k = 0; k < COL_H; k++) t += sh[k][threadIdx.x];
    part[(int64_t)blockIdx.y * C + c] = t;
  }
}

__global__ void k_col_finish(const double *part, int slices, int64_t C, void *out, int ot, float beta) {
  CT_GRID_STRIDE(c, C) {
    double s = 0;
    for (int k = 0; k < slices; k++) s += part[(int64_t)k * C + c];
    double v = beta != 0.f ? (double)beta * ct_ld(out, ot, c) + s : s;
    ct_st(out, ot, c, (float)v);
  }
}

/* One block per channel: [outer][C][inner] with inner > 1 (NCHW), each
 * block's reads contiguous along inner. */
__global__ void k_channel_sum(const void *x, int xt, int64_t outer, int64_t channels, int64_t inner, void *out,
                              int ot, float beta) {
  __shared__ double sh[CT_THREADS / 32];
  const int64_t c = blockIdx.x, cnt = outer * inner;
  double s = 0;
  for (int64_t k = threadIdx.x; k < cnt; k += blockDim.x) {
    int64_t o = k / inner, j = k - o * inner;
    s += ct_ld(x, xt, (o * channels + c) * inner + j);
  }
  s = ct_block_sum(s, sh);
  if (threadIdx.x == 0) {
    double v = beta != 0.f ? (double)beta * ct_ld(out, ot, c) + s : s;
    ct_st(out, ot, c, (float)v);
  }
}

/* ---- entry points ---- */

#define STREAM(d) cuda_stream(d)

extern "C" ct_status cuda_act_fwd(ct_device *d, ct_act act, float alpha, const ct_tensor *x, ct_tensor *y) {
  CT_TRY(cuda_check_float("act_fwd", x, 1));
  CT_TRY(cuda_check_float("act_fwd", y, 2));
  if ((int)act < 0 || act >= CT_ACT_COUNT) return ct_error(CT_ERR_INVALID_ARG, "cuda act_fwd: unknown activation %d", (int)act);
  CT_TRY(cuda_enter(d));
  int64_t n = ct_tensor_numel(x);
  if (!n) return CT_OK;
  const int vec = ct_vec_ok(x->data, y->data);
  k_act_fwd<<<ct_vec_blocks(n, vec), CT_THREADS, 0, STREAM(d)>>>((int)act, alpha, x->data, x->dtype, y->data, y->dtype,
                                                                 n, vec);
  CUDA_LAUNCHED("act_fwd");
  return CT_OK;
}

extern "C" ct_status cuda_act_bwd(ct_device *d, ct_act act, float alpha, const ct_tensor *x, const ct_tensor *y,
                                  const ct_tensor *dy, ct_tensor *dx) {
  CT_TRY(cuda_check_float("act_bwd", x, 1));
  CT_TRY(cuda_check_float("act_bwd", y, 2));
  CT_TRY(cuda_check_float("act_bwd", dy, 3));
  CT_TRY(cuda_check_float("act_bwd", dx, 4));
  if ((int)act < 0 || act >= CT_ACT_COUNT) return ct_error(CT_ERR_INVALID_ARG, "cuda act_bwd: unknown activation %d", (int)act);
  if ((CT_ACT_BWD_NEEDS_X(act) && !x) || (CT_ACT_BWD_NEEDS_Y(act) && !y))
    return ct_error(CT_ERR_INVALID_ARG, "cuda act_bwd: activation %d needs its %s", (int)act,
                    CT_ACT_BWD_NEEDS_X(act) ? "input x" : "output y");
  CT_TRY(cuda_enter(d));
  int64_t n = ct_tensor_numel(dy);
  if (!n) return CT_OK;
  /* Pass only what the formula reads, so a caller's NULL is never touched. */
  const void *xp = CT_ACT_BWD_NEEDS_X(act) ? x->data : NULL, *yp = CT_ACT_BWD_NEEDS_Y(act) ? y->data : NULL;
  const int vec = ct_vec_ok(xp, yp, dy->data, dx->data);
  k_act_bwd<<<ct_vec_blocks(n, vec), CT_THREADS, 0, STREAM(d)>>>((int)act, alpha, xp, x ? x->dtype : CT_F32, yp,
                                                                 y ? y->dtype : CT_F32, dy->data, dy->dtype, dx->data,
                                                                 dx->dtype, n, vec);
  CUDA_LAUNCHED("act_bwd");
  return CT_OK;
}

static ct_status dropout_apply(ct_device *d, const char *op, float p, int64_t group, ct_dropout_key key,
                               const ct_tensor *x, ct_tensor *y) {
  CT_TRY(cuda_check_float(op, x, 1));
  CT_TRY(cuda_check_float(op, y, 2));
  if (group < 1) return ct_error(CT_ERR_INVALID_ARG, "cuda %s: group %lld must be >= 1", op, (long long)group);
  CT_TRY(cuda_enter(d));
  int64_t n = ct_tensor_numel(x);
  if (!n) return CT_OK;
  int mode = p == 0 ? 0 : p >= 1 ? 1 : 2;
  double scale = mode == 2 ? 1.0 / (1.0 - (double)p) : 1.0;
  const int vec = ct_vec_ok(x->data, y->data);
  k_dropout<<<ct_vec_blocks(n, vec), CT_THREADS, 0, STREAM(d)>>>(mode, p, scale, group, key, cuda_dropout_step(d),
                                                                 x->data, x->dtype, y->data, y->dtype, n, vec);
  CUDA_LAUNCHED(op);
  return CT_OK;
}

extern "C" ct_status cuda_dropout_fwd(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *x,
                                      ct_tensor *y) {
  return dropout_apply(d, "dropout_fwd", p, group, key, x, y);
}

extern "C" ct_status cuda_dropout_bwd(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *dy,
                                      ct_tensor *dx) {
  return dropout_apply(d, "dropout_bwd", p, group, key, dy, dx);
}

extern "C" ct_status cuda_add(ct_device *d, const ct_tensor *a, const ct_tensor *b, ct_act act, ct_tensor *y) {
  CT_TRY(cuda_check_float("add", a, 1));
  CT_TRY(cuda_check_float("add", b, 2));
  CT_TRY(cuda_check_float("add", y, 3));
  if ((int)act < 0 || act >= CT_ACT_COUNT) return ct_error(CT_ERR_INVALID_ARG, "cuda add: unknown activation %d", (int)act);
  CT_TRY(cuda_enter(d));
  int64_t n = ct_tensor_numel(y);
  if (!n) return CT_OK;
  const int vec = ct_vec_ok(a->data, b->data, y->data);
  k_add<<<ct_vec_blocks(n, vec), CT_THREADS, 0, STREAM(d)>>>((int)act, a->data, a->dtype, b->data, b->dtype, y->data,
                                                             y->dtype, n, vec);
  CUDA_LAUNCHED("add");
  return CT_OK;
}

extern "C" ct_status cuda_axpby(ct_device *d, float alpha, const ct_tensor *x, float beta, ct_tensor *y) {
  CT_TRY(cuda_check_float("axpby", x, 1));
  CT_TRY(cuda_check_float("axpby", y, 2));
  CT_TRY(cuda_enter(d));
  int64_t n = ct_tensor_numel(y);
  if (!n) return CT_OK;
  const int vec = ct_vec_ok(x->data, y->data);
  k_axpby<<<ct_vec_blocks(n, vec), CT_THREADS, 0, STREAM(d)>>>(alpha, x->data, x->dtype, beta, y->data, y->dtype, n,
                                                               vec);
  CUDA_LAUNCHED("axpby");
  return CT_OK;
}

extern "C" ct_status cuda_fill(ct_device *d, ct_tensor *x, float value) {
  CT_TRY(cuda_check_float("fill", x, 1));
  CT_TRY(cuda_enter(d));
  int64_t n = ct_tensor_numel(x);
  if (!n) return CT_OK;
  const int vec = ct_vec_ok(x->data);
  k_fill<<<ct_vec_blocks(n, vec), CT_THREADS, 0, STREAM(d)>>>(x->data, x->dtype, value, n, vec);
  CUDA_LAUNCHED("fill");
  return CT_OK;
}

static int cast_vec(const void *x, ct_dtype xt, const void *y, ct_dtype yt) {
  return cuda_float_dtype(xt) && cuda_float_dtype(yt) && ct_vec_ok(x, y);
}

extern "C" ct_status cuda_cast(ct_device *d, const ct_tensor *x, ct_tensor *y) {
  if ((unsigned)x->dtype >= CT_DTYPE_COUNT || (unsigned)y->dtype >= CT_DTYPE_COUNT)
    return ct_error(CT_ERR_INVALID_ARG, "cuda cast: invalid dtype %d -> %d", (int)x->dtype, (int)y->dtype);
  int64_t n = ct_tensor_numel(x);
  if (ct_tensor_numel(y) != n)
    return ct_error(CT_ERR_SHAPE, "cuda cast: %lld elements into %lld", (long long)n, (long long)ct_tensor_numel(y));
  if (x->layout != y->layout) {
    /* plain -> NHWC (backend.h): one transpose that also converts (its
     * dtypes checked there) */
    if (x->layout != CT_LAYOUT_PLAIN || y->layout != CT_LAYOUT_NHWC || x->ndim != 4 || y->ndim != 4)
      return ct_error(CT_ERR_UNSUPPORTED, "cuda cast: layout %d -> %d (%d-D); only a 4-D plain -> NHWC cast "
                      "changes the layout", (int)x->layout, (int)y->layout, x->ndim);
    return cuda_relayout(d, x->data, x->dtype, 0, y->data, y->dtype, 1, x->shape[0], x->shape[1],
                         x->shape[2] * x->shape[3], 0.f);
  }
  CT_TRY(cuda_enter(d));
  if (!n) return CT_OK;
  if (x->dtype == y->dtype) {
    CUDA_TRY(cudaMemcpyAsync(y->data, x->data, (size_t)n * ct_dtype_size(x->dtype), cudaMemcpyDeviceToDevice, STREAM(d)));
    return CT_OK;
  }
  const int vec = cast_vec(x->data, x->dtype, y->data, y->dtype);
  k_cast<<<ct_vec_blocks(n, vec), CT_THREADS, 0, STREAM(d)>>>(x->data, x->dtype, y->data, y->dtype, n, vec);
  CUDA_LAUNCHED("cast");
  return CT_OK;
}

extern "C" ct_status cuda_convert(ct_device *d, const void *src, ct_dtype st, void *dst, ct_dtype dt, int64_t n) {
  CT_TRY(cuda_enter(d));
  if (!n) return CT_OK;
  const int vec = cast_vec(src, st, dst, dt);
  k_cast<<<ct_vec_blocks(n, vec), CT_THREADS, 0, STREAM(d)>>>(src, st, dst, dt, n, vec);
  CUDA_LAUNCHED("convert");
  return CT_OK;
}

extern "C" ct_status cuda_bias_act(ct_device *d, void *y, ct_dtype yt, int64_t n, const void *b, ct_dtype bt,
                                   int64_t channels, int64_t inner, ct_act act) {
  if (!n || (!b && act == CT_ACT_NONE)) return CT_OK;
  if (channels < 1 || inner < 1)
    return ct_error(CT_ERR_INTERNAL, "cuda bias_act: channels %lld inner %lld", (long long)channels, (long long)inner);
  const int vec = ct_vec_ok(y);
  k_bias_act<<<ct_vec_blocks(n, vec), CT_THREADS, 0, STREAM(d)>>>(y, yt, n, b, bt, channels, inner, (int)act, vec);
  CUDA_LAUNCHED("bias_act");
  return CT_OK;
}

extern "C" ct_status cuda_channel_sum(ct_device *d, const void *x, ct_dtype xt, int64_t outer, int64_t channels,
                                      int64_t inner, void *out, ct_dtype ot, float beta) {
  if (channels < 1) return CT_OK;
  if (channels > 0x7fffffff)
    return ct_error(CT_ERR_UNSUPPORTED, "cuda channel_sum: %lld channels exceed the grid", (long long)channels);
  if (inner == 1 && outer > 0) {
    /* About 64 rows per thread, at most 128 slices (a grid of C/32 x 128
     * blocks fills the GPU; the finishing pass reads 128 doubles per
     * channel). */
    int64_t sl = outer / (COL_H * 64);
    const unsigned slices = (unsigned)(sl < 1 ? 1 : sl > 128 ? 128 : sl);
    const int64_t gx = (channels + COL_W - 1) / COL_W;
    if (gx > 0x7fffffff)
      return ct_error(CT_ERR_UNSUPPORTED, "cuda channel_sum: %lld channels exceed the grid", (long long)channels);
    void *scr;
    CT_TRY(cuda_scratch(d, (size_t)slices * (size_t)channels * sizeof(double), &scr));
    k_col_partials<<<dim3((unsigned)gx, slices), dim3(COL_W, COL_H), 0, STREAM(d)>>>(x, xt, outer, channels,
                                                                                    (double *)scr);
    CUDA_LAUNCHED("channel_sum partials");
    k_col_finish<<<ct_blocks(channels), CT_THREADS, 0, STREAM(d)>>>((const double *)scr, (int)slices, channels, out,
                                                                     ot, beta);
    CUDA_LAUNCHED("channel_sum finish");
    return CT_OK;
  }
  k_channel_sum<<<(unsigned)channels, CT_THREADS, 0, STREAM(d)>>>(x, xt, outer, channels, inner, out, ot, beta);
  CUDA_LAUNCHED("channel_sum");
  return CT_OK;
}
