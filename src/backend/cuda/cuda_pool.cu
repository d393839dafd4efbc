/* Max, average and adaptive pooling on the GPU with the window rules of
 * src/backend/cpu/ref_pool.inc (PyTorch's): padding counts as -inf for max
 * (first maximum wins, NaN wins), count_include_pad counts the window
 * clipped to the padded input, adaptive bins are [floor(i*H/OH),
 * ceil((i+1)*H/OH)). Backward passes gather (each input element sums the
 * outputs whose window holds it, in double) instead of scattering with
 * atomics, so they are deterministic and need no zeroed f32 buffer. The
 * max-pool workspace holds, per output element and in the output's
 * element order, where its maximum lies in its window: the offset
 * (ih - oh*sh + ph) * kw + (iw - ow*sw + pw) in the unclipped window, one
 * byte when the window has fewer than 255 elements (every usual pooling
 * layer; 255 = an empty window), else an int32 (-1 = empty). A flat int32
 * index, the reference's, took four times the bytes: ResNet-50's stem at
 * batch 256 keeps 49 MiB to its backward instead of 196 (PyTorch keeps
 * int64 indices, 392).
 *
 * Layouts: x and y (dx and dy) are both plain NCHW or both NHWC
 * (CT_LAYOUT_NHWC, src/plan/layout.h); in NHWC consecutive threads take
 * consecutive channels of one pixel, so every load and store is a
 * contiguous channel vector. A global adaptive pool (1x1 output) may
 * read NHWC and write plain: for one pixel the two are the same bytes.
 * Other layouts are refused. */
#include "backend/cuda/cuda_common.cuh"

#define STREAM(d) cuda_stream(d)

typedef struct pool_geom {
  int64_t planes, C, H, W, OH, OW;
  int kh, kw, sh, sw, ph, pw, cip;
  int nhwc;
} pool_geom;

/* The geometry as the kernels index it: in 32-bit integers when every
 * index and product they form fits (pool_fits32), which makes the many
 * divisions of index unpacking several times cheaper than 64-bit ones
 * (docs/GPU.md, "Channels-last"; still several times the bytes' time). */
template <typename I> struct pool_geom_t {
  I planes, C, H, W, OH, OW;
  int kh, kw, sh, sw, ph, pw, cip;
  int nhwc;
};

template <typename I> static pool_geom_t<I> geom_as(const pool_geom &g) {
  pool_geom_t<I> t = {(I)g.planes, (I)g.C, (I)g.H, (I)g.W, (I)g.OH, (I)g.OW, g.kh, g.kw,
                      g.sh, g.sw, g.ph, g.pw, g.cip, g.nhwc};
  return t;
}

/* Whether the kernels' index arithmetic fits int32: both tensors' element
 * counts, the window reach past the edges (sizes plus kernel plus padding,
 * times the largest stride) and the adaptive bins' products i * n. */
static int pool_fits32(const pool_geom &g) {
  const int64_t lim = INT32_MAX / 2;
  int64_t reach_h = (g.H + g.kh + g.ph + 1) * (g.sh + 1), reach_w = (g.W + g.kw + g.pw + 1) * (g.sw + 1);
  return g.planes * g.H * g.W < lim && g.planes * g.OH * g.OW < lim && reach_h < lim && reach_w < lim &&
         (g.H + 1) * (g.OH + 1) < lim && (g.W + 1) * (g.OW + 1) < lim;
}

/* Launches kernel K over n threads with the geometry in 32-bit indices
 * when it fits, else 64-bit. Through pointers to the instances, named by
 * the caller (K32, K64): the CUDA emulator's launch rewrite, tests/emu,
 * needs a plain name at a launch, and its trace (bench/gpu/step_census.py)
 * shows that name. */
#define POOL_LAUNCH(K, K32, K64, n, g, ...) POOL_LAUNCH_T(K<int32_t>, K<int64_t>, K32, K64, n, g, __VA_ARGS__)
/* The same with the two instances given (parenthesised when their
 * template arguments hold a comma: the max-pool kernels' workspace type). */
#define POOL_LAUNCH_T(KI32, KI64, K32, K64, n, g, ...)                           \
  do {                                                                            \
    if (pool_fits32(g)) {                                                         \
      auto K32 = KI32;                                                            \
      K32<<<ct_blocks(n), CT_THREADS, 0, STREAM(d)>>>(geom_as<int32_t>(g), __VA_ARGS__); \
    } else {                                                                      \
      auto K64 = KI64;                                                            \
      K64<<<ct_blocks(n), CT_THREADS, 0, STREAM(d)>>>(geom_as<int64_t>(g), __VA_ARGS__); \
    }                                                                             \
  } while (0)

static ct_status check_pool(const char *op, const ct_pool2d_params *p, const ct_tensor *big, const ct_tensor *small,
                            pool_geom *g) {
  CT_TRY(cuda_check_float(op, big, 1));
  CT_TRY(cuda_check_float(op, small, 2));
  if (big->ndim != 4 || small->ndim != 4 || big->shape[0] != small->shape[0] || big->shape[1] != small->shape[1])
    return ct_error(CT_ERR_SHAPE, "cuda %s: expected 4-D NCHW tensors with equal N and C", op);
  /* A plain 1x1 adaptive output has the bytes of an NHWC one. */
  const int same = big->layout == small->layout ||
                   (!p && small->layout == CT_LAYOUT_PLAIN && small->shape[2] == 1 && small->shape[3] == 1);
  if (!same || (big->layout != CT_LAYOUT_PLAIN && big->layout != CT_LAYOUT_NHWC))
    return ct_error(CT_ERR_UNSUPPORTED,
                    "cuda %s: layouts %d and %d; the pooling kernels take both plain (NCHW) or both NHWC (a global "
                    "adaptive pool: an NHWC input and a plain 1x1 output)",
                    op, (int)big->layout, (int)small->layout);
  if (p && (p->kernel_h < 1 || p->kernel_w < 1 || p->stride_h < 1 || p->stride_w < 1 || p->pad_h < 0 || p->pad_w < 0))
    return ct_error(CT_ERR_INVALID_ARG,
                    "cuda %s: kernel=(%d,%d) stride=(%d,%d) padding=(%d,%d); kernel and stride must be >= 1 and "
                    "padding >= 0",
                    op, p->kernel_h, p->kernel_w, p->stride_h, p->stride_w, p->pad_h, p->pad_w);
  if (!p && (small->shape[2] < 1 || small->shape[3] < 1))
    return ct_error(CT_ERR_SHAPE, "cuda %s: adaptive output size must be at least 1x1", op);
  /* The max-pool workspace stores offsets within the window as int32. */
  if (p && (int64_t)p->kernel_h * p->kernel_w > INT32_MAX)
    return ct_error(CT_ERR_UNSUPPORTED, "cuda %s: a %dx%d window exceeds int32 offsets", op, p->kernel_h, p->kernel_w);
  if (big->shape[2] * big->shape[3] > INT32_MAX)
    return ct_error(CT_ERR_UNSUPPORTED, "cuda %s: plane of %lld elements exceeds int32 indices", op,
                    (long long)(big->shape[2] * big->shape[3]));
  g->planes = big->shape[0] * big->shape[1];
  g->C = big->shape[1];
  g->nhwc = big->layout == CT_LAYOUT_NHWC;
  g->H = big->shape[2];
  g->W = big->shape[3];
  g->OH = small->shape[2];
  g->OW = small->shape[3];
  g->kh = p ? p->kernel_h : 0;
  g->kw = p ? p->kernel_w : 0;
  g->sh = p ? p->stride_h : 1;
  g->sw = p ? p->stride_w : 1;
  g->ph = p ? p->pad_h : 0;
  g->pw = p ? p->pad_w : 0;
  g->cip = p ? p->count_include_pad : 0;
  return CT_OK;
}

/* Whether max pooling takes the NHWC vector kernels below: both tensors
 * NHWC in one dtype and 16-byte aligned, whole vectors of channels,
 * 32-bit indices. */
static int nhwc_vec(const pool_geom &g, const ct_tensor *a, const ct_tensor *b) {
  return g.nhwc && a->dtype == b->dtype && g.C % CT_VEC == 0 && pool_fits32(g) && ct_vec_ok(a->data, b->data);
}

template <typename I> __device__ __forceinline__ I imin(I a, I b) { return a < b ? a : b; }
template <typename I> __device__ __forceinline__ I imax(I a, I b) { return a > b ? a : b; }

/* Element i of an [N, C, Hd, Wd] tensor in g's layout: its plane
 * (n*C + c) and pixel (h, w); and the memory index of (plane, h, w). In
 * NCHW these are the old pl = i / (Hd*Wd) and pl*Hd*Wd + h*Wd + w. */
template <typename I>
__device__ __forceinline__ void split(const pool_geom_t<I> &g, I i, I Hd, I Wd, I *pl, I *h,
                                      I *w) {
  if (g.nhwc) {
    I c = i % g.C, px = i / g.C;
    *w = px % Wd;
    *h = (px / Wd) % Hd;
    *pl = px / (Wd * Hd) * g.C + c;
  } else {
    *w = i % Wd;
    *h = (i / Wd) % Hd;
    *pl = i / (Wd * Hd);
  }
}

template <typename I>
__device__ __forceinline__ I at(const pool_geom_t<I> &g, I pl, I h, I w, I Hd, I Wd) {
  if (g.nhwc) return ((pl / g.C * Hd + h) * Wd + w) * g.C + pl % g.C;
  return (pl * Hd + h) * Wd + w;
}

/* Outputs along one dim whose (unclipped) window [o*s - pad, o*s - pad + k)
 * can hold input i: a superset; callers re-check the clipped window. */
template <typename I>
__device__ __forceinline__ void cover(I i, int k, int s, int pad, I O, I *lo, I *hi) {
  I a = i + pad - k + 1;
  *lo = a <= 0 ? 0 : (a + s - 1) / s;
  *hi = imin<I>(O - 1, (i + pad) / s);
}

/* The argmax's place in window (oh, ow), whose unclipped top-left corner
 * is (oh*sh - ph, ow*sw - pw); A (uint8_t or int32_t) as the workspace
 * stores it, (A)-1 for an empty window. -1 when (ih, iw) is outside the
 * window: the backward then skips that output (its cover is exact, but
 * an element outside must never match another element's offset). */
template <typename I>
__device__ __forceinline__ int32_t win_off(const pool_geom_t<I> &g, I oh, I ow, I ih, I iw) {
  const I dh = ih - (oh * g.sh - g.ph), dw = iw - (ow * g.sw - g.pw);
  return dh >= 0 && dh < g.kh && dw >= 0 && dw < g.kw ? (int32_t)(dh * g.kw + dw) : -1;
}

template <typename I, typename A>
__global__ void k_maxpool_fwd(pool_geom_t<I> g, const void *x, int xt, void *y, int yt, A *ws) {
  const I n = g.planes * g.OH * g.OW;
  CT_GRID_STRIDE_T(I, o, n) {
    I ow, oh, pl;
    split(g, o, g.OH, g.OW, &pl, &oh, &ow);
    I h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    I h1 = imin<I>(h0 + g.kh, g.H), w1 = imin<I>(w0 + g.kw, g.W);
    h0 = imax<I>(h0, 0);
    w0 = imax<I>(w0, 0);
    float best = -INFINITY;
    A arg = (h0 < h1 && w0 < w1) ? (A)win_off(g, oh, ow, h0, w0) : (A)-1;
    for (I ih = h0; ih < h1; ih++)
      for (I iw = w0; iw < w1; iw++) {
        float v = ct_ld(x, xt, at(g, pl, ih, iw, g.H, g.W));
        if (v > best || isnan(v)) {
          best = v;
          arg = (A)win_off(g, oh, ow, ih, iw);
        }
      }
    ct_st(y, yt, o, best);
    if (ws) ws[o] = arg;
  }
}

template <typename I, typename A>
__global__ void k_maxpool_bwd(pool_geom_t<I> g, const void *dy, int dyt, const A *ws, void *dx, int dxt) {
  const I n = g.planes * g.H * g.W;
  CT_GRID_STRIDE_T(I, i, n) {
    I iw, ih, pl;
    split(g, i, g.H, g.W, &pl, &ih, &iw);
    I oh0, oh1, ow0, ow1;
    cover(ih, g.kh, g.sh, g.ph, g.OH, &oh0, &oh1);
    cover(iw, g.kw, g.sw, g.pw, g.OW, &ow0, &ow1);
    double s = 0;
    for (I oh = oh0; oh <= oh1; oh++)
      for (I ow = ow0; ow <= ow1; ow++) {
        const I o = at(g, pl, oh, ow, g.OH, g.OW);
        const int32_t off = win_off(g, oh, ow, ih, iw);
        if (off >= 0 && ws[o] == (A)off) s += ct_ld(dy, dyt, o);
      }
    ct_st(dx, dxt, i, (float)s);
  }
}

/* NHWC max pooling, CT_VEC channels of one pixel per thread: the
 * index unpacking (the divisions) is paid once per vector instead of once
 * per element. Same windows, order and comparisons as k_maxpool_fwd and
 * k_maxpool_bwd, so the results are the same bits. DT is the dtype of
 * both tensors, a compile-time constant; the 8 channels move through
 * ct_ldw / ct_stw (cuda_common.cuh), 16-byte accesses. Used when C is a
 * multiple of CT_VEC and the geometry fits int32. */

/* CT_VEC (8) consecutive workspace entries: one 8-byte access for bytes
 * (the workspace is planned 64-byte aligned and o a multiple of 8; the
 * launch checks the pointer), element by element for int32. */
template <typename A> __device__ __forceinline__ void st_args(A *ws, int32_t o, const int32_t *a) {
#pragma unroll
  for (int j = 0; j < CT_VEC; j++) ws[o + j] = (A)a[j];
}
template <> __device__ __forceinline__ void st_args<uint8_t>(uint8_t *ws, int32_t o, const int32_t *a) {
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int j = 0; j < 4; j++) lo |= (uint32_t)(uint8_t)a[j] << (8 * j), hi |= (uint32_t)(uint8_t)a[j + 4] << (8 * j);
  *(uint2 *)(ws + o) = make_uint2(lo, hi);
}
template <typename A> __device__ __forceinline__ void ld_args(const A *ws, int32_t o, int32_t *a) {
#pragma unroll
  for (int j = 0; j < CT_VEC; j++) a[j] = ws[o + j];
}
template <> __device__ __forceinline__ void ld_args<uint8_t>(const uint8_t *ws, int32_t o, int32_t *a) {
  const uint2 u = *(const uint2 *)(ws + o);
#pragma unroll
  for (int j = 0; j < 4; j++) a[j] = (int32_t)((u.x >> (8 * j)) & 0xff), a[j + 4] = (int32_t)((u.y >> (8 * j)) & 0xff);
}

template <int DT, typename A>
__global__ void k_maxpool_fwd_nhwc(pool_geom_t<int32_t> g, const void *x, void *y, A *ws) {
  const int32_t cv = g.C / CT_VEC, n = g.planes / g.C * g.OH * g.OW * cv;
  CT_GRID_STRIDE_T(int32_t, t, n) {
    const int32_t c0 = t % cv * CT_VEC, px = t / cv;
    const int32_t ow = px % g.OW, oh = px / g.OW % g.OH, img = px / (g.OW * g.OH);
    int32_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    const int32_t h1 = imin<int32_t>(h0 + g.kh, g.H), w1 = imin<int32_t>(w0 + g.kw, g.W);
    h0 = imax<int32_t>(h0, 0);
    w0 = imax<int32_t>(w0, 0);
    float best[CT_VEC];
    int32_t arg[CT_VEC];
    const int32_t first = (h0 < h1 && w0 < w1) ? win_off(g, oh, ow, h0, w0) : (int32_t)(A)-1;
#pragma unroll
    for (int j = 0; j < CT_VEC; j++) best[j] = -INFINITY, arg[j] = first;
    for (int32_t ih = h0; ih < h1; ih++)
      for (int32_t iw = w0; iw < w1; iw++) {
        float v[CT_VEC];
        ct_ldw<CT_VEC>(x, DT, ((img * g.H + ih) * g.W + iw) * g.C + c0, v);
        const int32_t off = win_off(g, oh, ow, ih, iw);
#pragma unroll
        for (int j = 0; j < CT_VEC; j++)
          if (v[j] > best[j] || isnan(v[j])) best[j] = v[j], arg[j] = off;
      }
    const int32_t o = px * g.C + c0;
    ct_stw<CT_VEC>(y, DT, o, best);
    if (ws) st_args<A>(ws, o, arg);
  }
}

template <int DT, typename A>
__global__ void k_maxpool_bwd_nhwc(pool_geom_t<int32_t> g, const void *dy, const A *ws, void *dx) {
  const int32_t cv = g.C / CT_VEC, n = g.planes / g.C * g.H * g.W * cv;
  CT_GRID_STRIDE_T(int32_t, t, n) {
    const int32_t c0 = t % cv * CT_VEC, px = t / cv;
    const int32_t iw = px % g.W, ih = px / g.W % g.H, img = px / (g.W * g.H);
    int32_t oh0, oh1, ow0, ow1;
    cover<int32_t>(ih, g.kh, g.sh, g.ph, g.OH, &oh0, &oh1);
    cover<int32_t>(iw, g.kw, g.sw, g.pw, g.OW, &ow0, &ow1);
    double s[CT_VEC];
#pragma unroll
    for (int j = 0; j < CT_VEC; j++) s[j] = 0;
    for (int32_t oh = oh0; oh <= oh1; oh++)
      for (int32_t ow = ow0; ow <= ow1; ow++) {
        const int32_t off = win_off(g, oh, ow, ih, iw);
        if (off < 0) continue;
        const int32_t o = ((img * g.OH + oh) * g.OW + ow) * g.C + c0;
        float v[CT_VEC];
        int32_t a[CT_VEC];
        ct_ldw<CT_VEC>(dy, DT, o, v);
        ld_args<A>(ws, o, a);
#pragma unroll
        for (int j = 0; j < CT_VEC; j++)
          if (a[j] == off) s[j] += v[j];
      }
    float f[CT_VEC];
#pragma unroll
    for (int j = 0; j < CT_VEC; j++) f[j] = (float)s[j];
    ct_stw<CT_VEC>(dx, DT, px * g.C + c0, f);
  }
}

/* The reference's avg_window: divisor and clipped window of output (oh, ow). */
template <typename I>
__device__ __forceinline__ I avg_window(const pool_geom_t<I> &g, I oh, I ow, I *h0, I *h1,
                                              I *w0, I *w1) {
  I a0 = oh * g.sh - g.ph, b0 = ow * g.sw - g.pw;
  I a1 = imin<I>(a0 + g.kh, g.H + g.ph), b1 = imin<I>(b0 + g.kw, g.W + g.pw);
  I pool = (a1 - a0) * (b1 - b0);
  *h0 = imax<I>(a0, 0);
  *w0 = imax<I>(b0, 0);
  *h1 = imin<I>(a1, g.H);
  *w1 = imin<I>(b1, g.W);
  return g.cip ? pool : (*h1 - *h0) * (*w1 - *w0);
}

template <typename I>
__global__ void k_avgpool_fwd(pool_geom_t<I> g, const void *x, int xt, void *y, int yt) {
  const I n = g.planes * g.OH * g.OW;
  CT_GRID_STRIDE_T(I, o, n) {
    I ow, oh, pl;
    split(g, o, g.OH, g.OW, &pl, &oh, &ow);
    I h0, h1, w0, w1;
    I div = avg_window(g, oh, ow, &h0, &h1, &w0, &w1);
    double s = 0;
    for (I ih = h0; ih < h1; ih++)
      for (I iw = w0; iw < w1; iw++) s += ct_ld(x, xt, at(g, pl, ih, iw, g.H, g.W));
    ct_st(y, yt, o, (float)(h0 < h1 && w0 < w1 && div > 0 ? s / (double)div : 0.0));
  }
}

template <typename I>
__global__ void k_avgpool_bwd(pool_geom_t<I> g, const void *dy, int dyt, void *dx, int dxt) {
  const I n = g.planes * g.H * g.W;
  CT_GRID_STRIDE_T(I, i, n) {
    I iw, ih, pl;
    split(g, i, g.H, g.W, &pl, &ih, &iw);
    I oh0, oh1, ow0, ow1;
    cover(ih, g.kh, g.sh, g.ph, g.OH, &oh0, &oh1);
    cover(iw, g.kw, g.sw, g.pw, g.OW, &ow0, &ow1);
    double s = 0;
    for (I oh = oh0; oh <= oh1; oh++)
      for (I ow = ow0; ow <= ow1; ow++) {
        I h0, h1, w0, w1;
        I div = avg_window(g, oh, ow, &h0, &h1, &w0, &w1);
        if (!(h0 < h1 && w0 < w1 && div > 0)) continue;
        if (ih < h0 || ih >= h1 || iw < w0 || iw >= w1) continue;
        s += (double)ct_ld(dy, dyt, at(g, pl, oh, ow, g.OH, g.OW)) / (double)div;
      }
    ct_st(dx, dxt, i, (float)s);
  }
}

template <typename I>
__device__ __forceinline__ I bin_start(I i, I n, I out) { return (i * n) / out; }
template <typename I>
__device__ __forceinline__ I bin_end(I i, I n, I out) { return ((i + 1) * n + out - 1) / out; }

/* Bins that can hold input i (superset; callers re-check). */
template <typename I>
__device__ __forceinline__ void bin_cover(I i, I n, I out, I *lo, I *hi) {
  *lo = imax<I>(0, (i * out) / n - 1);
  *hi = imin<I>(out - 1, ((i + 1) * out + n - 1) / n);
}

template <typename I>
__global__ void k_adaptive_fwd(pool_geom_t<I> g, int is_max, const void *x, int xt, void *y, int yt, int32_t *idx) {
  const I n = g.planes * g.OH * g.OW;
  CT_GRID_STRIDE_T(I, o, n) {
    I ow, oh, pl;
    split(g, o, g.OH, g.OW, &pl, &oh, &ow);
    I h0 = bin_start(oh, g.H, g.OH), h1 = bin_end(oh, g.H, g.OH);
    I w0 = bin_start(ow, g.W, g.OW), w1 = bin_end(ow, g.W, g.OW);
    if (is_max) {
      float best = -INFINITY;
      int32_t arg = (int32_t)(h0 * g.W + w0);
      for (I ih = h0; ih < h1; ih++)
        for (I iw = w0; iw < w1; iw++) {
          float v = ct_ld(x, xt, at(g, pl, ih, iw, g.H, g.W));
          if (v > best || isnan(v)) {
            best = v;
            arg = (int32_t)(ih * g.W + iw);
          }
        }
      ct_st(y, yt, o, best);
      if (idx) idx[o] = arg;
    } else {
      double s = 0;
      for (I ih = h0; ih < h1; ih++)
        for (I iw = w0; iw < w1; iw++) s += ct_ld(x, xt, at(g, pl, ih, iw, g.H, g.W));
      ct_st(y, yt, o, (float)(s / (double)((h1 - h0) * (w1 - w0))));
    }
  }
}

template <typename I>
__global__ void k_adaptive_bwd(pool_geom_t<I> g, const void *dy, int dyt, const int32_t *idx, void *dx, int dxt) {
  const I n = g.planes * g.H * g.W;
  CT_GRID_STRIDE_T(I, i, n) {
    I iw, ih, pl;
    split(g, i, g.H, g.W, &pl, &ih, &iw);
    I oh0, oh1, ow0, ow1;
    bin_cover(ih, g.H, g.OH, &oh0, &oh1);
    bin_cover(iw, g.W, g.OW, &ow0, &ow1);
    const int32_t me = (int32_t)(ih * g.W + iw);
    double s = 0;
    for (I oh = oh0; oh <= oh1; oh++) {
      I h0 = bin_start(oh, g.H, g.OH), h1 = bin_end(oh, g.H, g.OH);
      if (ih < h0 || ih >= h1) continue;
      for (I ow = ow0; ow <= ow1; ow++) {
        I w0 = bin_start(ow, g.W, g.OW), w1 = bin_end(ow, g.W, g.OW);
        if (iw < w0 || iw >= w1) continue;
        I o = at(g, pl, oh, ow, g.OH, g.OW);
        if (idx)
          s += idx[o] == me ? (double)ct_ld(dy, dyt, o) : 0.0;
        else
          s += (double)ct_ld(dy, dyt, o) / (double)((h1 - h0) * (w1 - w0));
      }
    }
    ct_st(dx, dxt, i, (float)s);
  }
}

/* ---- entry points ---- */

/* Workspace entries of one byte when every window offset and the empty
 * mark (255) fit in one. */
static int args_in_bytes(const ct_pool2d_params *p) { return (int64_t)p->kernel_h * p->kernel_w < 255; }

/* The NHWC vector kernels move 8 workspace bytes at a time. */
static int ws_vec_ok(const void *ws) { return ((uintptr_t)ws & 7) == 0; }

extern "C" size_t cuda_maxpool2d_workspace_bytes(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x,
                                                 const ct_tensor *y) {
  (void)d;
  (void)x;
  return (size_t)ct_tensor_numel(y) * (args_in_bytes(p) ? sizeof(uint8_t) : sizeof(int32_t));
}

template <typename A>
static void maxpool_fwd_launch(ct_device *d, const pool_geom &g, int64_t n, const ct_tensor *x, ct_tensor *y, A *ws) {
  if (nhwc_vec(g, x, y) && ws_vec_ok(ws)) {
    auto k_maxpool_fwd_nhwc8 = x->dtype == CT_F32    ? k_maxpool_fwd_nhwc<CT_F32, A>
                               : x->dtype == CT_BF16 ? k_maxpool_fwd_nhwc<CT_BF16, A>
                                                     : k_maxpool_fwd_nhwc<CT_F16, A>;
    k_maxpool_fwd_nhwc8<<<ct_blocks(n / CT_VEC), CT_THREADS, 0, STREAM(d)>>>(geom_as<int32_t>(g), x->data, y->data, ws);
  } else {
    POOL_LAUNCH_T((k_maxpool_fwd<int32_t, A>), (k_maxpool_fwd<int64_t, A>), k_maxpool_fwd32, k_maxpool_fwd64, n, g,
                  x->data, x->dtype, y->data, y->dtype, ws);
  }
}

template <typename A>
static void maxpool_bwd_launch(ct_device *d, const pool_geom &g, int64_t n, const ct_tensor *dy, const A *ws,
                               ct_tensor *dx) {
  if (nhwc_vec(g, dy, dx) && ws_vec_ok(ws)) {
    auto k_maxpool_bwd_nhwc8 = dx->dtype == CT_F32    ? k_maxpool_bwd_nhwc<CT_F32, A>
                               : dx->dtype == CT_BF16 ? k_maxpool_bwd_nhwc<CT_BF16, A>
                                                      : k_maxpool_bwd_nhwc<CT_F16, A>;
    k_maxpool_bwd_nhwc8<<<ct_blocks(n / CT_VEC), CT_THREADS, 0, STREAM(d)>>>(geom_as<int32_t>(g), dy->data, ws,
                                                                           dx->data);
  } else {
    POOL_LAUNCH_T((k_maxpool_bwd<int32_t, A>), (k_maxpool_bwd<int64_t, A>), k_maxpool_bwd32, k_maxpool_bwd64, n, g,
                  dy->data, dy->dtype, ws, dx->data, dx->dtype);
  }
}

extern "C" ct_status cuda_maxpool2d_fwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y,
                                        void *ws) {
  pool_geom g;
  CT_TRY(check_pool("maxpool2d_fwd", p, x, y, &g));
  CT_TRY(cuda_enter(d));
  int64_t n = g.planes * g.OH * g.OW;
  if (!n) return CT_OK;
  if (args_in_bytes(p)) maxpool_fwd_launch<uint8_t>(d, g, n, x, y, (uint8_t *)ws);
  else maxpool_fwd_launch<int32_t>(d, g, n, x, y, (int32_t *)ws);
  CUDA_LAUNCHED("maxpool2d_fwd");
  return CT_OK;
}

extern "C" ct_status cuda_maxpool2d_bwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *dy, const void *ws,
                                        ct_tensor *dx) {
  pool_geom g;
  CT_TRY(check_pool("maxpool2d_bwd", p, dx, dy, &g));
  if (!ws) return ct_error(CT_ERR_INVALID_ARG, "cuda maxpool2d_bwd: no workspace (the forward was run with ws = NULL)");
  CT_TRY(cuda_enter(d));
  int64_t n = g.planes * g.H * g.W;
  if (!n) return CT_OK;
  if (args_in_bytes(p)) maxpool_bwd_launch<uint8_t>(d, g, n, dy, (const uint8_t *)ws, dx);
  else maxpool_bwd_launch<int32_t>(d, g, n, dy, (const int32_t *)ws, dx);
  CUDA_LAUNCHED("maxpool2d_bwd");
  return CT_OK;
}

extern "C" ct_status cuda_avgpool2d_fwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y) {
  pool_geom g;
  CT_TRY(check_pool("avgpool2d_fwd", p, x, y, &g));
  CT_TRY(cuda_enter(d));
  int64_t n = g.planes * g.OH * g.OW;
  if (!n) return CT_OK;
  POOL_LAUNCH(k_avgpool_fwd, k_avgpool_fwd32, k_avgpool_fwd64, n, g, x->data, x->dtype, y->data, y->dtype);
  CUDA_LAUNCHED("avgpool2d_fwd");
  return CT_OK;
}

extern "C" ct_status cuda_avgpool2d_bwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *dy, ct_tensor *dx) {
  pool_geom g;
  CT_TRY(check_pool("avgpool2d_bwd", p, dx, dy, &g));
  CT_TRY(cuda_enter(d));
  int64_t n = g.planes * g.H * g.W;
  if (!n) return CT_OK;
  POOL_LAUNCH(k_avgpool_bwd, k_avgpool_bwd32, k_avgpool_bwd64, n, g, dy->data, dy->dtype, dx->data, dx->dtype);
  CUDA_LAUNCHED("avgpool2d_bwd");
  return CT_OK;
}

static ct_status adaptive_fwd(ct_device *d, const char *op, int is_max, const ct_tensor *x, ct_tensor *y,
                              int32_t *idx) {
  pool_geom g;
  CT_TRY(check_pool(op, NULL, x, y, &g));
  CT_TRY(cuda_enter(d));
  int64_t n = g.planes * g.OH * g.OW;
  if (!n) return CT_OK;
  /* Bins of one pixel (AlexNet's 6x6 -> 6x6 at 227): the average is the
   * element itself, so a copy (check_pool has made sure the two element
   * orders agree) gives the same bits without a window walk. */
  if (!is_max && g.H == g.OH && g.W == g.OW) return cuda_convert(d, x->data, x->dtype, y->data, y->dtype, n);
  POOL_LAUNCH(k_adaptive_fwd, k_adaptive_fwd32, k_adaptive_fwd64, n, g, is_max, x->data, x->dtype, y->data, y->dtype, idx);
  CUDA_LAUNCHED(op);
  return CT_OK;
}

static ct_status adaptive_bwd(ct_device *d, const char *op, const ct_tensor *dy, const int32_t *idx, ct_tensor *dx) {
  pool_geom g;
  CT_TRY(check_pool(op, NULL, dx, dy, &g));
  CT_TRY(cuda_enter(d));
  int64_t n = g.planes * g.H * g.W;
  if (!n) return CT_OK;
  if (!idx && g.H == g.OH && g.W == g.OW) return cuda_convert(d, dy->data, dy->dtype, dx->data, dx->dtype, n);
  POOL_LAUNCH(k_adaptive_bwd, k_adaptive_bwd32, k_adaptive_bwd64, n, g, dy->data, dy->dtype, idx, dx->data, dx->dtype);
  CUDA_LAUNCHED(op);
  return CT_OK;
}

extern "C" ct_status cuda_adaptive_avgpool2d_fwd(ct_device *d, const ct_tensor *x, ct_tensor *y) {
  return adaptive_fwd(d, "adaptive_avgpool2d_fwd", 0, x, y, NULL);
}

extern "C" ct_status cuda_adaptive_avgpool2d_bwd(ct_device *d, const ct_tensor *dy, ct_tensor *dx) {
  return adaptive_bwd(d, "adaptive_avgpool2d_bwd", dy, NULL, dx);
}

extern "C" ct_status cuda_adaptive_maxpool2d_fwd(ct_device *d, const ct_tensor *x, ct_tensor *y, int32_t *idx) {
  return adaptive_fwd(d, "adaptive_maxpool2d_fwd", 1, x, y, idx);
}

extern "C" ct_status cuda_adaptive_maxpool2d_bwd(ct_device *d, const ct_tensor *dy, const int32_t *idx, ct_tensor *dx) {
  if (!idx)
    return ct_error(CT_ERR_INVALID_ARG, "cuda adaptive_maxpool2d_bwd: no indices (the forward was run with idx = NULL)");
  return adaptive_bwd(d, "adaptive_maxpool2d_bwd", dy, idx, dx);
}
