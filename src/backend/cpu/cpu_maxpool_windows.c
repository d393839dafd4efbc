/* Max pooling with any window, stride and padding (overlapping windows:
 * ResNet's 3x3 / stride 2 / pad 1 stem pool) on plain NCHW, f32 and
 * bf16, and, in AVX2 builds, on f32 C8 (nChw8c) activations.
 *
 * Why: oneDNN 2.6 pools plain NCHW through its reference kernel
 * `simple_nchw` (22-25 ms forward for ResNet-18's 128x64x16x16 stem pool
 * at 32x32 on the 2-core AVX2 development machine, a twentieth of a whole
 * training step), and nChw8c at 4.5 ms for the convnet's 128x32x28x28 2x2
 * pool, where these loops take 0.4. Plain windows that do not overlap
 * take cpu_maxpool_tiles.c instead; C16 stays with oneDNN's AVX-512
 * kernels.
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
/* The plain loops run unvectorised: measured faster (7.9 against 10.0 ms
 * forward for ResNet-18's stem pool). */
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

int cpu_maxpool_windows_ok(const ct_pool2d_params *p, const ct_tensor *x, const ct_tensor *y) {
  return x->ndim == 4 && y->ndim == 4 && lanes(x) && x->layout == y->layout && x->dtype == y->dtype &&
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
#endif

void cpu_maxpool_windows_fwd(const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y, uint8_t *ws) {
  const int64_t L = lanes(x), P = x->shape[0] * x->shape[1] / L, H = x->shape[2], W = x->shape[3];
  const int64_t OH = y->shape[2], OW = y->shape[3], in = H * W * L, out = OH * OW * L;
  const int bf = x->dtype == CT_BF16;
#pragma omp parallel for schedule(static)
  for (int64_t pl = 0; pl < P; pl++) {
    uint8_t *wp = ws ? ws + pl * out : NULL;
#ifdef HAVE_C8
    if (L == 8) {
      fwd8_f32_avx2(p, (const float *)x->data + pl * in, (float *)y->data + pl * out, wp, H, W, OH, OW);
      continue;
    }
#endif
    if (bf)
      fwd_bf16(p, (const uint16_t *)x->data + pl * in, (uint16_t *)y->data + pl * out, wp, H, W, OH, OW);
    else
      fwd_f32(p, (const float *)x->data + pl * in, (float *)y->data + pl * out, wp, H, W, OH, OW);
  }
}

ct_status cpu_maxpool_windows_bwd(const ct_pool2d_params *p, const ct_tensor *dy, const uint8_t *ws, ct_tensor *dx) {
  const int64_t L = lanes(dx), P = dx->shape[0] * dx->shape[1] / L, H = dx->shape[2], W = dx->shape[3];
  const int64_t OH = dy->shape[2], OW = dy->shape[3], in = H * W * L, out = OH * OW * L;
  const int bf = dx->dtype == CT_BF16;
  int failed = 0;
#pragma omp parallel reduction(| : failed)
  {
    double *acc = malloc(sizeof(double) * (size_t)(in > 0 ? in : 1));
    failed = !acc;
#pragma omp for schedule(static)
    for (int64_t pl = 0; pl < P; pl++) {
      if (!acc) continue;
      const uint8_t *wp = ws + pl * out;
#ifdef HAVE_C8
      if (L == 8) {
        bwd8_f32_avx2(p, (const float *)dy->data + pl * out, wp, (float *)dx->data + pl * in, acc, H, W, OH, OW);
        continue;
      }
#endif
      if (bf)
        bwd_bf16(p, (const uint16_t *)dy->data + pl * out, wp, (uint16_t *)dx->data + pl * in, acc, H, W, OH, OW);
      else
        bwd_f32(p, (const float *)dy->data + pl * out, wp, (float *)dx->data + pl * in, acc, H, W, OH, OW);
    }
    free(acc);
  }
  if (failed)
    return ct_error(CT_ERR_OUT_OF_MEMORY, "maxpool2d_bwd: cannot allocate a %lldx%lld accumulator per thread",
                    (long long)H, (long long)W);
  return CT_OK;
}
