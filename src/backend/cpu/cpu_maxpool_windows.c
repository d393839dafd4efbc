/* Max pooling with any window, stride and padding (overlapping windows:
 * ResNet's 3x3 / stride 2 / pad 1 stem pool) on plain NCHW, f32 and
 * bf16, and, in AVX2 builds, on f32 C8 (nChw8c) activations; AVX2
 * builds also run plain planes eight at a time through the C8 kernels
 * (transposed tiles), and pool a C8 x into a plain y
 * (the backend's maxpool_to_plain: the pool that ends a C8 chain in front
 * of flatten or dropout, so the convolution before it keeps C8).
 *
 * Why: oneDNN 2.6 pools plain NCHW through its slow reference kernel
 * `simple_nchw`, and nChw8c several times slower than these loops
 * (docs/ARCHITECTURE.md, "Small maps, plain and C8 layouts"). Plain
 * windows that do not overlap take cpu_maxpool_tiles.c instead; C16 stays
 * with oneDNN's AVX-512 kernels.
 *
 * Semantics are the reference's (ref_pool.inc) bit for bit: padding counts
 * as -inf, the first maximum in row-major window order wins, a NaN wins
 * over any number (the last NaN); the workspace is one byte per output,
 * the argmax's offset in its (unclipped) window, 255 for a window that
 * holds no input element (impossible with PyTorch's size rules; its output
 * is -inf and the backward skips it), laid out as the output is. The
 * backward adds each gradient into a per-plane double accumulator and
 * rounds once, as the reference does, so inputs under several windows get
 * the same sums. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"

#define NO_ARG 255
/* The plain loops run unvectorised, which measured faster. */
#define NOVEC __attribute__((optimize("no-tree-vectorize")))

/* Lanes per pixel: 1 for plain NCHW (a plane at a time), 8 for f32 C8 (a
 * block of 8 channels, the channel as the vector lane; AVX2 builds, the
 * CPUs whose activations take C8), 0 for what this file does not take. */
static int lanes(const ct_tensor *t) {
  if (t->layout == CT_LAYOUT_PLAIN) return 1;
#ifdef __AVX2__
  if (t->layout == CT_LAYOUT_C8 && t->shape[1] % 8 == 0 && t->dtype == CT_F32) return 8;
#endif
  return 0;
}

/* x laid out in C8 with y plain (the backend's maxpool_to_plain). */
static int to_plain(const ct_tensor *x, const ct_tensor *y) {
  return lanes(x) == 8 && y->layout == CT_LAYOUT_PLAIN;
}

unsigned cpu_maxpool_windows_to_plain(void) {
#ifdef __AVX2__
  return 1u << CT_LAYOUT_C8;
#else
  return 0;
#endif
}

int cpu_maxpool_windows_ok(const ct_pool2d_params *p, const ct_tensor *x, const ct_tensor *y) {
  return x->ndim == 4 && y->ndim == 4 && lanes(x) && (x->layout == y->layout || to_plain(x, y)) &&
         x->dtype == y->dtype &&
         (x->dtype == CT_F32 || x->dtype == CT_BF16) && p->kernel_h > 0 && p->kernel_w > 0 && p->stride_h > 0 &&
         p->stride_w > 0 && p->pad_h >= 0 && p->pad_w >= 0 && p->kernel_h * p->kernel_w < NO_ARG &&
         y->shape[0] == x->shape[0] && y->shape[1] == x->shape[1];
}

/* Output position o's window along one axis (stride s, padding pad,
 * kernel k, input extent n): it starts at input *at, and its taps
 * [*t0, *t1) lie inside the input. */
static inline void window(int64_t o, int s, int pad, int k, int64_t n, int64_t *at, int *t0, int *t1) {
  *at = o * s - pad;
  *t0 = *at < 0 ? (int)-*at : 0;
  *t1 = *at + k > n ? (int)(n - *at) : k;
}

#define F32_LD(v) (v)
#define F32_ST(v) ((float)(v))

/* One plane, forward. */
#define WINDOWS_FWD(NAME, T, LD, ST)                                                                              \
  NOVEC static void NAME(const ct_pool2d_params *p, const T *restrict xp, T *restrict yp, uint8_t *restrict wp,   \
                   int64_t H, int64_t W, int64_t OH, int64_t OW) {                                                \
    const int kh = p->kernel_h, kw = p->kernel_w;                                                                 \
    for (int64_t oh = 0; oh < OH; oh++) {                                                                         \
      int64_t h0;                                                                                                 \
      int i0, i1;                                                                                                 \
      window(oh, p->stride_h, p->pad_h, kh, H, &h0, &i0, &i1);                                                    \
      for (int64_t ow = 0; ow < OW; ow++) {                                                                       \
        int64_t w0;                                                                                               \
        int j0, j1;                                                                                               \
        window(ow, p->stride_w, p->pad_w, kw, W, &w0, &j0, &j1);                                                  \
        float m = -INFINITY;                                                                                      \
        int k = NO_ARG;                                                                                           \
        if (i0 < i1 && j0 < j1) {                                                                                 \
          const T *b = xp + (h0 * W + w0); /* the window's corner; only in-input cells are read */                \
          m = LD(b[i0 * W + j0]);                                                                                 \
          k = i0 * kw + j0;                                                                                       \
          for (int i = i0; i < i1; i++)                                                                           \
            for (int j = j0; j < j1; j++) {                                                                       \
              float v = LD(b[i * W + j]);                                                                         \
              int t = (v > m) | (v != v);                                                                         \
              m = t ? v : m;                                                                                      \
              k = t ? i * kw + j : k;                                                                             \
            }                                                                                                     \
        }                                                                                                         \
        yp[oh * OW + ow] = ST(m);                                                                                 \
        if (wp) wp[oh * OW + ow] = (uint8_t)k;                                                                    \
      }                                                                                                           \
    }                                                                                                             \
  }

/* One plane, backward, through acc (H*W doubles). */
#define WINDOWS_BWD(NAME, T, LD, ST)                                                                              \
  static void NAME(const ct_pool2d_params *p, const T *restrict gp, const uint8_t *restrict wp, T *restrict dp,   \
                   double *restrict acc, int64_t H, int64_t W, int64_t OH, int64_t OW) {                          \
    memset(acc, 0, sizeof(double) * (size_t)(H * W));                                                             \
    for (int64_t oh = 0; oh < OH; oh++)                                                                           \
      for (int64_t ow = 0; ow < OW; ow++) {                                                                       \
        const int k = wp[oh * OW + ow];                                                                           \
        if (k == NO_ARG) continue;                                                                                \
        const int64_t h = oh * p->stride_h - p->pad_h + k / p->kernel_w;                                          \
        const int64_t w = ow * p->stride_w - p->pad_w + k % p->kernel_w;                                          \
        acc[h * W + w] += LD(gp[oh * OW + ow]);                                                                   \
      }                                                                                                           \
    for (int64_t i = 0; i < H * W; i++) dp[i] = ST(acc[i]);                                                       \
  }

WINDOWS_FWD(fwd_f32, float, F32_LD, F32_ST)
WINDOWS_FWD(fwd_bf16, uint16_t, cpu_bf16_ld, cpu_bf16_st)
WINDOWS_BWD(bwd_f32, float, F32_LD, F32_ST)
WINDOWS_BWD(bwd_bf16, uint16_t, cpu_bf16_ld, cpu_bf16_st)

#ifdef __AVX2__
#include "backend/cpu/cpu_pool_avx2.h"

/* fwd8_f32 with AVX2: a pixel's 8 lanes as one vector, the selection rule
 * as blends, the argmax packed to bytes. */
static void fwd8_f32_avx2(const ct_pool2d_params *p, const float *restrict xp, float *restrict yp,
                          uint8_t *restrict wp, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  const int kh = p->kernel_h, kw = p->kernel_w;
  for (int64_t oh = 0; oh < OH; oh++) {
    int64_t h0;
    int i0, i1;
    window(oh, p->stride_h, p->pad_h, kh, H, &h0, &i0, &i1);
    for (int64_t ow = 0; ow < OW; ow++) {
      int64_t w0;
      int j0, j1;
      window(ow, p->stride_w, p->pad_w, kw, W, &w0, &j0, &j1);
      __m256 m = _mm256_set1_ps(-INFINITY);
      __m256i k = _mm256_set1_epi32(NO_ARG);
      if (i0 < i1 && j0 < j1) {
        const float *c = xp + (h0 * W + w0) * 8;
        m = _mm256_loadu_ps(c + (i0 * W + j0) * 8);
        k = _mm256_set1_epi32(i0 * kw + j0);
        for (int i = i0; i < i1; i++)
          for (int j = j0; j < j1; j++) pool_sel8(_mm256_loadu_ps(c + (i * W + j) * 8), i * kw + j, &m, &k);
      }
      _mm256_storeu_ps(yp + (oh * OW + ow) * 8, m);
      if (wp) pool_store_k8(wp + (oh * OW + ow) * 8, k);
    }
  }
}
/* bwd8_f32 with AVX2: each window position adds the gradient lanes whose
 * argmax is that position, widened to double (no division per lane). */
static void bwd8_f32_avx2(const ct_pool2d_params *p, const float *restrict gp, const uint8_t *restrict wp,
                          float *restrict dp, double *restrict acc, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  const int kh = p->kernel_h, kw = p->kernel_w;
  memset(acc, 0, sizeof(double) * (size_t)(H * W * 8));
  for (int64_t oh = 0; oh < OH; oh++) {
    int64_t h0;
    int i0, i1;
    window(oh, p->stride_h, p->pad_h, kh, H, &h0, &i0, &i1);
    for (int64_t ow = 0; ow < OW; ow++) {
      int64_t w0;
      int j0, j1;
      window(ow, p->stride_w, p->pad_w, kw, W, &w0, &j0, &j1);
      const __m256 g = _mm256_loadu_ps(gp + (oh * OW + ow) * 8);
      const __m256i k = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(wp + (oh * OW + ow) * 8)));
      for (int i = i0; i < i1; i++)
        for (int j = j0; j < j1; j++) {
          __m256 hit = _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(k, _mm256_set1_epi32(i * kw + j))), g);
          double *a = acc + ((h0 + i) * W + w0 + j) * 8;
          _mm256_storeu_pd(a, _mm256_add_pd(_mm256_loadu_pd(a), _mm256_cvtps_pd(_mm256_castps256_ps128(hit))));
          _mm256_storeu_pd(a + 4, _mm256_add_pd(_mm256_loadu_pd(a + 4), _mm256_cvtps_pd(_mm256_extractf128_ps(hit, 1))));
        }
    }
  }
  for (int64_t q = 0; q < H * W * 8; q += 4) _mm_storeu_ps(dp + q, _mm256_cvtpd_ps(_mm256_loadu_pd(acc + q)));
}
#define HAVE_C8 1

/* Plain planes, eight at a time, through the C8 kernels above: eight
 * planes are interleaved into a per-thread pixel-major tile (8x8
 * transposes; bf16 widened on the way, which is exact), pooled there, and
 * the results (and argmax bytes) transposed back: far faster than the
 * scalar loops; the transposes cost a pass over the data in cache. Same
 * lanes rule, so the same bits as the scalar loops. */

/* 8x8 transpose of r[0..7]. */
static inline void tr8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

/* 8 f32 or bf16 elements at p as f32. */
static inline __m256 ld8(const void *p, int bf) {
  if (!bf) return _mm256_loadu_ps((const float *)p);
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* 8 f32 values to p as f32, or as bf16 rounded as cpu_bf16_st does
 * (nearest even; a NaN kept, made quiet). */
static inline void st8(void *p, int bf, __m256 f) {
  if (!bf) {
    _mm256_storeu_ps((float *)p, f);
    return;
  }
  __m256i u = _mm256_castps_si256(f), hi = _mm256_srli_epi32(u, 16);
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
  r = _mm256_srli_epi32(r, 16);
  __m256i q = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  __m256i v = _mm256_blendv_epi8(r, q, _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)));
  _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

/* Planes l = 0..7 of n elements each, plane l at src + l * n (element
 * size es), into t[q * 8 + l]. */
static void interleave8(const char *src, int bf, int64_t n, float *restrict t) {
  const size_t es = bf ? 2 : 4;
  int64_t q = 0;
  for (; q + 8 <= n; q += 8) {
    __m256 r[8];
    for (int l = 0; l < 8; l++) r[l] = ld8(src + (size_t)(l * n + q) * es, bf);
    tr8(r);
    for (int j = 0; j < 8; j++) _mm256_storeu_ps(t + (q + j) * 8, r[j]);
  }
  for (; q < n; q++)
    for (int l = 0; l < 8; l++)
      t[q * 8 + l] = bf ? cpu_bf16_ld(((const uint16_t *)src)[l * n + q]) : ((const float *)src)[l * n + q];
}

/* The inverse: t[q * 8 + l] to plane l at dst + l * n, rounded to bf16
 * when bf. */
static void deinterleave8(const float *restrict t, char *dst, int bf, int64_t n) {
  const size_t es = bf ? 2 : 4;
  int64_t q = 0;
  for (; q + 8 <= n; q += 8) {
    __m256 r[8];
    for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(t + (q + j) * 8);
    tr8(r);
    for (int l = 0; l < 8; l++) st8(dst + (size_t)(l * n + q) * es, bf, r[l]);
  }
  for (; q < n; q++)
    for (int l = 0; l < 8; l++) {
      if (bf)
        ((uint16_t *)dst)[l * n + q] = cpu_bf16_st(t[q * 8 + l]);
      else
        ((float *)dst)[l * n + q] = t[q * 8 + l];
    }
}

/* Argmax bytes from the tile order t[q * 8 + l] to planes k[l * n + q],
 * and back. */
static void bytes8_to_planes(const uint8_t *restrict t, uint8_t *restrict k, int64_t n) {
  for (int64_t q = 0; q < n; q++)
    for (int l = 0; l < 8; l++) k[l * n + q] = t[q * 8 + l];
}

static void bytes8_to_tile(const uint8_t *restrict k, uint8_t *restrict t, int64_t n) {
  for (int64_t q = 0; q < n; q++)
    for (int l = 0; l < 8; l++) t[q * 8 + l] = k[l * n + q];
}
#endif

/* Plain plane pl (scalar loops). */
static void plane_fwd(const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y, uint8_t *ws, int64_t pl) {
  const int64_t H = x->shape[2], W = x->shape[3], OH = y->shape[2], OW = y->shape[3], in = H * W, out = OH * OW;
  uint8_t *wp = ws ? ws + pl * out : NULL;
  if (x->dtype == CT_BF16)
    fwd_bf16(p, (const uint16_t *)x->data + pl * in, (uint16_t *)y->data + pl * out, wp, H, W, OH, OW);
  else
    fwd_f32(p, (const float *)x->data + pl * in, (float *)y->data + pl * out, wp, H, W, OH, OW);
}

#ifdef HAVE_C8
/* Plain planes in groups of eight (the C8 kernel on transposed tiles),
 * the P % 8 left over one at a time; a thread whose tiles cannot be
 * allocated runs the scalar loops. With x in C8 and y plain (to_plain),
 * each C8 block is already the input tile and only the output is
 * transposed; there is no scalar way round, so a thread without its tiles
 * fails the op (out of memory). */
static int planes8_fwd(const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y, uint8_t *ws) {
  const int64_t P = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3], OH = y->shape[2], OW = y->shape[3];
  const int64_t in = H * W, out = OH * OW, G = P / 8;
  const int bf = x->dtype == CT_BF16, x_c8 = x->layout == CT_LAYOUT_C8;
  const size_t es = bf ? 2 : 4;
  int failed = 0;
#pragma omp parallel reduction(| : failed)
  {
    float *x8 = x_c8 ? NULL : malloc(sizeof(float) * (size_t)(in * 8)), *y8 = malloc(sizeof(float) * (size_t)(out * 8));
    uint8_t *k8 = ws ? malloc((size_t)(out * 8)) : NULL;
    const int tiles = (x_c8 || x8) && y8 && (!ws || k8);
    failed = x_c8 && !tiles;
#pragma omp for schedule(static)
    for (int64_t g = 0; g < G + P % 8; g++) {
      if (failed) continue;
      if (g >= G) {
        plane_fwd(p, x, y, ws, G * 8 + (g - G));
      } else if (!tiles) {
        for (int l = 0; l < 8; l++) plane_fwd(p, x, y, ws, g * 8 + l);
      } else {
        const float *xt = x8;
        if (x_c8)
          xt = (const float *)x->data + g * 8 * in;
        else
          interleave8((const char *)x->data + (size_t)(g * 8 * in) * es, bf, in, x8);
        fwd8_f32_avx2(p, xt, y8, k8, H, W, OH, OW);
        deinterleave8(y8, (char *)y->data + (size_t)(g * 8 * out) * es, bf, out);
        if (ws) bytes8_to_planes(k8, ws + g * 8 * out, out);
      }
    }
    free(x8);
    free(y8);
    free(k8);
  }
  return failed;
}
#endif

ct_status cpu_maxpool_windows_fwd(const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y, uint8_t *ws) {
  const int64_t L = lanes(x), P = x->shape[0] * x->shape[1] / L;
#ifdef HAVE_C8
  if (L == 1 || to_plain(x, y)) {
    if (planes8_fwd(p, x, y, ws))
      return ct_error(CT_ERR_OUT_OF_MEMORY, "maxpool2d_fwd: cannot allocate a %lldx%lld tile per thread",
                      (long long)y->shape[2], (long long)y->shape[3]);
    return CT_OK;
  }
  const int64_t H = x->shape[2], W = x->shape[3], OH = y->shape[2], OW = y->shape[3];
#pragma omp parallel for schedule(static)
  for (int64_t pl = 0; pl < P; pl++)
    fwd8_f32_avx2(p, (const float *)x->data + pl * H * W * 8, (float *)y->data + pl * OH * OW * 8,
                  ws ? ws + pl * OH * OW * 8 : NULL, H, W, OH, OW);
#else
#pragma omp parallel for schedule(static)
  for (int64_t pl = 0; pl < P; pl++) plane_fwd(p, x, y, ws, pl);
#endif
  return CT_OK;
}

/* Plane (or C8 block) pl, backward, through acc. */
static void plane_bwd(const ct_pool2d_params *p, const ct_tensor *dy, const uint8_t *ws, ct_tensor *dx, double *acc,
                      int64_t pl) {
  const int64_t L = lanes(dx), H = dx->shape[2], W = dx->shape[3], OH = dy->shape[2], OW = dy->shape[3];
  const int64_t in = H * W * L, out = OH * OW * L;
  const uint8_t *wp = ws + pl * out;
#ifdef HAVE_C8
  if (L == 8) {
    bwd8_f32_avx2(p, (const float *)dy->data + pl * out, wp, (float *)dx->data + pl * in, acc, H, W, OH, OW);
    return;
  }
#endif
  if (dx->dtype == CT_BF16)
    bwd_bf16(p, (const uint16_t *)dy->data + pl * out, wp, (uint16_t *)dx->data + pl * in, acc, H, W, OH, OW);
  else
    bwd_f32(p, (const float *)dy->data + pl * out, wp, (float *)dx->data + pl * in, acc, H, W, OH, OW);
}

ct_status cpu_maxpool_windows_bwd(const ct_pool2d_params *p, const ct_tensor *dy, const uint8_t *ws, ct_tensor *dx) {
  const int64_t L = lanes(dx), P = dx->shape[0] * dx->shape[1] / L, H = dx->shape[2], W = dx->shape[3];
  const int64_t OH = dy->shape[2], OW = dy->shape[3], in = H * W * L;
  int failed = 0;
  /* Through transposed tiles (AVX2), as in the forward: plain planes
   * eight at a time (unit u < G is planes 8u..8u+7, the P % 8 left over
   * are one unit each; a thread whose tiles cannot be allocated runs its
   * groups' planes one at a time), and a plain dy onto a C8 dx (unit u is
   * C8 block u, the same eight planes of dy; no way round the tiles). */
#ifdef HAVE_C8
  const int mixed = to_plain(dx, dy);
  const int64_t G = mixed ? P : L == 1 ? P / 8 : 0, units = L == 1 ? G + P % 8 : P, hw_in = H * W, hw_out = OH * OW;
  const int bf = dx->dtype == CT_BF16;
  const size_t es = bf ? 2 : 4;
#else
  const int64_t G = 0, units = P;
#endif
#pragma omp parallel reduction(| : failed)
  {
    float *g8 = NULL, *d8 = NULL;
    uint8_t *k8 = NULL;
    double *acc = NULL;
#ifdef HAVE_C8
    if (G) {
      g8 = malloc(sizeof(float) * (size_t)(hw_out * 8));
      d8 = mixed ? NULL : malloc(sizeof(float) * (size_t)(hw_in * 8));
      k8 = malloc((size_t)(hw_out * 8));
      acc = malloc(sizeof(double) * (size_t)(hw_in * 8));
      if (!(g8 && (mixed || d8) && k8 && acc)) {
        free(g8), free(d8), free(k8), free(acc);
        g8 = d8 = NULL, k8 = NULL, acc = NULL;
      }
    }
    const int tiles = acc != NULL;
    failed = mixed && !tiles;
#endif
    if (!acc && !failed) acc = malloc(sizeof(double) * (size_t)(in > 0 ? in : 1));
    failed = failed || !acc;
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; u++) {
      if (failed) continue;
      if (u >= G) { /* also every unit without groups (G = 0) */
        plane_bwd(p, dy, ws, dx, acc, G * 8 + (u - G));
        continue;
      }
#ifdef HAVE_C8
      if (tiles) {
        interleave8((const char *)dy->data + (size_t)(u * 8 * hw_out) * es, bf, hw_out, g8);
        bytes8_to_tile(ws + u * 8 * hw_out, k8, hw_out);
        float *dt = mixed ? (float *)dx->data + u * 8 * hw_in : d8;
        bwd8_f32_avx2(p, g8, k8, dt, acc, H, W, OH, OW);
        if (!mixed) deinterleave8(d8, (char *)dx->data + (size_t)(u * 8 * hw_in) * es, bf, hw_in);
        continue;
      }
#endif
      for (int l = 0; l < 8; l++) plane_bwd(p, dy, ws, dx, acc, u * 8 + l);
    }
    free(acc);
    free(g8);
    free(d8);
    free(k8);
  }
  if (failed)
    return ct_error(CT_ERR_OUT_OF_MEMORY, "maxpool2d_bwd: cannot allocate a %lldx%lld accumulator per thread",
                    (long long)H, (long long)W);
  return CT_OK;
}
