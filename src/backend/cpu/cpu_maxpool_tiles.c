/* Max pooling with non-overlapping windows (kernel == stride, no padding,
 * every window inside the input: the 2x2/2 pools of LeNet-style CNNs) on
 * plain NCHW, f32 and bf16, as branchless OpenMP loops.
 *
 * Why: oneDNN 2.6 pools plain NCHW through a slow transposing path, and
 * its fast path wants nChw16c, which would cost a reorder on each side. An
 * earlier version of these loops picked the argmax with branches and lost
 * to oneDNN (random data mispredicts half the compares); here every
 * compare is a select the compiler turns into vector blends.
 *
 * The workspace is one byte per output element, the argmax's offset in
 * its window. Same choice as PyTorch and the reference: the first maximum
 * in row-major window order wins, and a NaN wins over any number (the last
 * NaN, as in PyTorch's CPU loop). bf16 values are compared widened; the
 * output is the selected input rounded back, which is the input itself. */
#include <string.h>

#include "backend/cpu/cpu_impl.h"

int cpu_maxpool_tiles_ok(const ct_pool2d_params *p, const ct_tensor *x, const ct_tensor *y) {
  return x->layout == CT_LAYOUT_PLAIN && y->layout == CT_LAYOUT_PLAIN && x->dtype == y->dtype &&
         (x->dtype == CT_F32 || x->dtype == CT_BF16) && x->ndim == 4 && y->ndim == 4 &&
         p->kernel_h == p->stride_h && p->kernel_w == p->stride_w && p->pad_h == 0 && p->pad_w == 0 &&
         p->kernel_h * p->kernel_w <= 255 && y->shape[2] * p->kernel_h <= x->shape[2] &&
         y->shape[3] * p->kernel_w <= x->shape[3] && y->shape[0] == x->shape[0] && y->shape[1] == x->shape[1];
}

/* Left to the compiler, the 2x2 loops become gathers/scatters (vectorised)
 * or branches (scalar): both measured slower than oneDNN. The 2x2 case
 * is therefore written with AVX-512 below (contiguous loads, permutes to
 * split even/odd columns, mask blends for the selection), and with AVX2
 * where that is the best the build targets (several times faster than
 * these loops); these generic loops serve other windows and other CPUs. */
#define NOVEC __attribute__((optimize("no-tree-vectorize")))

#define F32_LD(v) (v)
#define F32_ST(v) (v)

/* One plane, forward. NAME_plane(xp, yp, wp, H, W, OH, OW, kh, kw). */
#define TILES_FWD(NAME, T, LD, ST)                                                                          \
  NOVEC static void NAME(const T *restrict xp, T *restrict yp, uint8_t *restrict wp, int64_t W, int64_t OH,       \
                   int64_t OW, int kh, int kw) {                                                            \
    for (int64_t oh = 0; oh < OH; oh++) {                                                                   \
      const T *r0 = xp + oh * kh * W;                                                                       \
      T *yr = yp + oh * OW;                                                                                 \
      uint8_t *wr = wp ? wp + oh * OW : NULL;                                                               \
      if (kh == 2 && kw == 2) {                                                                             \
        const T *r1 = r0 + W;                                                                               \
        uint8_t kk[OW > 0 ? OW : 1];                                                                        \
        for (int64_t ow = 0; ow < OW; ow++) {                                                               \
          float a = LD(r0[2 * ow]), b = LD(r0[2 * ow + 1]), c = LD(r1[2 * ow]), d = LD(r1[2 * ow + 1]);     \
          float m = a;                                                                                      \
          int k = 0;                                                                                        \
          int t = (b > m) | (b != b);                                                                       \
          m = t ? b : m;                                                                                    \
          k = t ? 1 : k;                                                                                    \
          t = (c > m) | (c != c);                                                                           \
          m = t ? c : m;                                                                                    \
          k = t ? 2 : k;                                                                                    \
          t = (d > m) | (d != d);                                                                           \
          m = t ? d : m;                                                                                    \
          k = t ? 3 : k;                                                                                    \
          yr[ow] = ST(m);                                                                                   \
          kk[ow] = (uint8_t)k;                                                                              \
        }                                                                                                   \
        if (wr) memcpy(wr, kk, (size_t)OW);                                                                 \
        continue;                                                                                           \
      }                                                                                                     \
      for (int64_t ow = 0; ow < OW; ow++) {                                                                 \
        const T *b = r0 + ow * kw;                                                                          \
        float m = LD(b[0]);                                                                                 \
        int k = 0;                                                                                          \
        for (int i = 0; i < kh; i++)                                                                        \
          for (int j = 0; j < kw; j++) {                                                                    \
            float v = LD(b[i * W + j]);                                                                     \
            int t = (v > m) | (v != v);                                                                     \
            m = t ? v : m;                                                                                  \
            k = t ? i * kw + j : k;                                                                         \
          }                                                                                                 \
        yr[ow] = ST(m);                                                                                     \
        if (wr) wr[ow] = (uint8_t)k;                                                                        \
      }                                                                                                     \
    }                                                                                                       \
  }

/* One plane, backward: every element of dx is written once (window cells
 * and the border no window covers), so dx needs no zeroing pass. */
#define TILES_BWD(NAME, T, ZERO)                                                                            \
  NOVEC static void NAME(const T *restrict gp, const uint8_t *restrict wp, T *restrict dp, int64_t H, int64_t W,  \
                   int64_t OH, int64_t OW, int kh, int kw) {                                                \
    for (int64_t oh = 0; oh < OH; oh++) {                                                                   \
      const T *g = gp + oh * OW;                                                                            \
      const uint8_t *w = wp + oh * OW;                                                                      \
      for (int i = 0; i < kh; i++) {                                                                        \
        T *row = dp + (oh * kh + i) * W;                                                                    \
        if (kw == 2) {                                                                                      \
          const int k0 = 2 * i, k1 = 2 * i + 1;                                                             \
          for (int64_t ow = 0; ow < OW; ow++) {                                                             \
            row[2 * ow] = w[ow] == k0 ? g[ow] : ZERO;                                                       \
            row[2 * ow + 1] = w[ow] == k1 ? g[ow] : ZERO;                                                   \
          }                                                                                                 \
        } else {                                                                                            \
          for (int64_t ow = 0; ow < OW; ow++)                                                               \
            for (int j = 0; j < kw; j++) row[ow * kw + j] = w[ow] == i * kw + j ? g[ow] : ZERO;             \
        }                                                                                                   \
        for (int64_t c = OW * kw; c < W; c++) row[c] = ZERO;                                                \
      }                                                                                                     \
    }                                                                                                       \
    for (int64_t h = OH * kh; h < H; h++) memset(dp + h * W, 0, sizeof(T) * (size_t)W);                     \
  }


/* The AVX-512 tiles are compiled whatever the build's baseline (x86-64-v3
 * by default) and run only where the CPU has AVX-512F, BW and VL, checked
 * once at run time; the AVX2 tiles are the baseline's. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* Up to 16 windows of one output row: a/b/c/d = top-left, top-right,
 * bottom-left, bottom-right; the sequential rule of the scalar loop
 * (replace when greater, or when NaN) as mask blends. */
AVX512 static inline void sel4(__m512 a, __m512 b, __m512 c, __m512 d, __m512 *m, __m512i *k) {
  __m512 v = a;
  __m512i i = _mm512_setzero_si512();
  __mmask16 t = _mm512_cmp_ps_mask(b, v, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
  v = _mm512_mask_blend_ps(t, v, b);
  i = _mm512_mask_blend_epi32(t, i, _mm512_set1_epi32(1));
  t = _mm512_cmp_ps_mask(c, v, _CMP_GT_OQ) | _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q);
  v = _mm512_mask_blend_ps(t, v, c);
  i = _mm512_mask_blend_epi32(t, i, _mm512_set1_epi32(2));
  t = _mm512_cmp_ps_mask(d, v, _CMP_GT_OQ) | _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
  *m = _mm512_mask_blend_ps(t, v, d);
  *k = _mm512_mask_blend_epi32(t, i, _mm512_set1_epi32(3));
}

static const int32_t even_idx[16] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
static const int32_t odd_idx[16] = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
static const int32_t lo_idx[16] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
static const int32_t hi_idx[16] = {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

/* 32 consecutive elements (fewer under mask m2 = 2n bits) as two f32 halves. */
AVX512 static inline void load32_f32(const float *p, int n, __m512 *lo, __m512 *hi) {
  __mmask16 m0 = n >= 8 ? 0xffff : (__mmask16)((1u << (2 * n)) - 1);
  __mmask16 m1 = n <= 8 ? 0 : (__mmask16)(n >= 16 ? 0xffff : (1u << (2 * (n - 8))) - 1);
  *lo = _mm512_maskz_loadu_ps(m0, p);
  *hi = _mm512_maskz_loadu_ps(m1, p + 16);
}
AVX512 static inline void load32_bf16(const uint16_t *p, int n, __m512 *lo, __m512 *hi) {
  __mmask32 m = n >= 16 ? 0xffffffffu : (__mmask32)((1ull << (2 * n)) - 1);
  __m512i v = _mm512_maskz_loadu_epi16(m, p);
  *lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16));
  *hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16));
}

AVX512 static void fwd2x2_avx512(const void *xp, void *yp, uint8_t *wp, int bf, int64_t W, int64_t OH, int64_t OW) {
  const __m512i ev = _mm512_loadu_si512(even_idx), od = _mm512_loadu_si512(odd_idx);
  for (int64_t oh = 0; oh < OH; oh++)
    for (int64_t o = 0; o < OW; o += 16) {
      int n = OW - o < 16 ? (int)(OW - o) : 16;
      __mmask16 mo = (__mmask16)((1u << n) - 1);
      __m512 l0, h0, l1, h1;
      if (bf) {
        const uint16_t *r0 = (const uint16_t *)xp + 2 * oh * W + 2 * o;
        load32_bf16(r0, n, &l0, &h0);
        load32_bf16(r0 + W, n, &l1, &h1);
      } else {
        const float *r0 = (const float *)xp + 2 * oh * W + 2 * o;
        load32_f32(r0, n, &l0, &h0);
        load32_f32(r0 + W, n, &l1, &h1);
      }
      __m512 m;
      __m512i k;
      sel4(_mm512_permutex2var_ps(l0, ev, h0), _mm512_permutex2var_ps(l0, od, h0), _mm512_permutex2var_ps(l1, ev, h1),
           _mm512_permutex2var_ps(l1, od, h1), &m, &k);
      if (bf) {
        /* m is a bf16 value widened: its high half, NaN kept quiet as
         * cpu_bf16_st does. */
        __m512i u = _mm512_srli_epi32(_mm512_castps_si512(m), 16);
        u = _mm512_mask_or_epi32(u, _mm512_cmp_ps_mask(m, m, _CMP_UNORD_Q), u, _mm512_set1_epi32(0x40));
        _mm256_mask_storeu_epi16((uint16_t *)yp + oh * OW + o, mo, _mm512_cvtepi32_epi16(u));
      } else {
        _mm512_mask_storeu_ps((float *)yp + oh * OW + o, mo, m);
      }
      if (wp) _mm_mask_storeu_epi8(wp + oh * OW + o, mo, _mm512_cvtepi32_epi8(k));
    }
}

AVX512 static void bwd2x2_avx512(const void *gp, const uint8_t *wp, void *dp, int bf, int64_t W, int64_t OH, int64_t OW) {
  const __m512i lo = _mm512_loadu_si512(lo_idx), hi = _mm512_loadu_si512(hi_idx);
  for (int64_t oh = 0; oh < OH; oh++)
    for (int64_t o = 0; o < OW; o += 16) {
      int n = OW - o < 16 ? (int)(OW - o) : 16;
      __mmask16 mo = (__mmask16)((1u << n) - 1);
      /* gradients as 32-bit lanes: f32 bits, or bf16 bits zero-extended */
      __m512i g = bf ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mo, (const uint16_t *)gp + oh * OW + o))
                     : _mm512_maskz_loadu_epi32(mo, (const float *)gp + oh * OW + o);
      __m512i k = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mo, wp + oh * OW + o));
      for (int i = 0; i < 2; i++) {
        __m512i e = _mm512_maskz_mov_epi32(_mm512_cmpeq_epi32_mask(k, _mm512_set1_epi32(2 * i)), g);
        __m512i d = _mm512_maskz_mov_epi32(_mm512_cmpeq_epi32_mask(k, _mm512_set1_epi32(2 * i + 1)), g);
        __m512i a = _mm512_permutex2var_epi32(e, lo, d), b = _mm512_permutex2var_epi32(e, hi, d);
        int64_t off = (2 * oh + i) * W + 2 * o;
        __mmask16 m0 = n >= 8 ? 0xffff : (__mmask16)((1u << (2 * n)) - 1);
        __mmask16 m1 = n <= 8 ? 0 : (__mmask16)(n >= 16 ? 0xffff : (1u << (2 * (n - 8))) - 1);
        if (bf) {
          _mm256_mask_storeu_epi16((uint16_t *)dp + off, m0, _mm512_cvtepi32_epi16(a));
          _mm256_mask_storeu_epi16((uint16_t *)dp + off + 16, m1, _mm512_cvtepi32_epi16(b));
        } else {
          _mm512_mask_storeu_epi32((float *)dp + off, m0, a);
          _mm512_mask_storeu_epi32((float *)dp + off + 16, m1, b);
        }
      }
    }
  /* the border no window covers */
  size_t es = bf ? 2 : 4;
  for (int64_t h = 0; h < 2 * OH; h++)
    if (2 * OW < W) memset((char *)dp + (size_t)(h * W + 2 * OW) * es, 0, (size_t)(W - 2 * OW) * es);
}
#define HAVE_AVX512_TILES 1
#endif
#if defined(__AVX2__)
#include "backend/cpu/cpu_pool_avx2.h"

/* The AVX2 2x2 kernels: 8 windows of one output row at a time (a row's
 * last OW % 8 windows as the block of its last 8, which redoes some with
 * the same result; a row narrower than 8 windows through zero-padded
 * copies), even/odd columns split by shuffles,
 * the sequential selection rule as blends, the argmax packed to bytes.
 * bf16 runs on 32-bit lanes holding the bf16 bits (widened by a shift,
 * which is exact). */

/* 16 consecutive elements from p as two f32 vectors. */
static inline void load16(const void *p, int bf, __m256 *lo, __m256 *hi) {
  if (bf) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(v)), 16));
    *hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1)), 16));
  } else {
    *lo = _mm256_loadu_ps((const float *)p);
    *hi = _mm256_loadu_ps((const float *)p + 8);
  }
}

/* Elements 0,2,..,14 (even) and 1,3,..,15 (odd) of lo:hi. */
static inline __m256 evens(__m256 lo, __m256 hi) {
  return _mm256_castpd_ps(
      _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))), 0xd8));
}
static inline __m256 odds(__m256 lo, __m256 hi) {
  return _mm256_castpd_ps(
      _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1))), 0xd8));
}

/* 8 windows: inputs at r0 / r1 (16 elements each), 8 outputs to y, 8
 * argmax bytes to w (if any). */
static inline void fwd_block8(const char *r0, const char *r1, int bf, void *y, uint8_t *w) {
  __m256 l0, h0, l1, h1;
  load16(r0, bf, &l0, &h0);
  load16(r1, bf, &l1, &h1);
  __m256 m = evens(l0, h0);
  __m256i k = _mm256_setzero_si256();
  pool_sel8(odds(l0, h0), 1, &m, &k);
  pool_sel8(evens(l1, h1), 2, &m, &k);
  pool_sel8(odds(l1, h1), 3, &m, &k);
  if (bf) {
    /* m is a bf16 value widened: its high half, NaN kept quiet as
     * cpu_bf16_st does. */
    __m256i u = _mm256_srli_epi32(_mm256_castps_si256(m), 16);
    u = _mm256_or_si256(u, _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(m, m, _CMP_UNORD_Q)),
                                            _mm256_set1_epi32(0x40)));
    _mm_storeu_si128((__m128i *)y, _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)));
  } else {
    _mm256_storeu_ps((float *)y, m);
  }
  if (w) pool_store_k8(w, k);
}

/* The backward of 8 windows: g (8 gradients) and k (8 argmax bytes) to
 * 16 elements of each of the rows d0 / d1. For window row i, each input
 * pair gets the gradient where the argmax points at it, else 0 (32-bit
 * lanes: f32 bits, or bf16 bits zero-extended). */
static inline void bwd_block8(const void *g8, const uint8_t *k8, int bf, char *d0, char *d1) {
  __m256i g = bf ? _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)g8)) : _mm256_loadu_si256((const __m256i *)g8);
  __m256i k = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)k8));
  for (int i = 0; i < 2; i++) {
    __m256i e = _mm256_and_si256(_mm256_cmpeq_epi32(k, _mm256_set1_epi32(2 * i)), g);
    __m256i d = _mm256_and_si256(_mm256_cmpeq_epi32(k, _mm256_set1_epi32(2 * i + 1)), g);
    __m256i a = _mm256_unpacklo_epi32(e, d), b = _mm256_unpackhi_epi32(e, d);
    __m256i first = _mm256_permute2x128_si256(a, b, 0x20), second = _mm256_permute2x128_si256(a, b, 0x31);
    char *row = i ? d1 : d0;
    if (bf) {
      _mm256_storeu_si256((__m256i *)row, _mm256_permute4x64_epi64(_mm256_packus_epi32(first, second), 0xd8));
    } else {
      _mm256_storeu_si256((__m256i *)row, first);
      _mm256_storeu_si256((__m256i *)row + 1, second);
    }
  }
}

static void fwd2x2_avx2(const void *xp, void *yp, uint8_t *wp, int bf, int64_t W, int64_t OH, int64_t OW) {
  const size_t es = bf ? 2 : 4;
  for (int64_t oh = 0; oh < OH; oh++) {
    const char *r0 = (const char *)xp + (size_t)(2 * oh * W) * es, *r1 = r0 + (size_t)W * es;
    char *y = (char *)yp + (size_t)(oh * OW) * es;
    uint8_t *w = wp ? wp + oh * OW : NULL;
    if (OW < 8) {
      /* through zero-padded copies of the row pair */
      float t0[16] = {0}, t1[16] = {0}, ty[8];
      uint8_t tw[8];
      memcpy(t0, r0, (size_t)(2 * OW) * es);
      memcpy(t1, r1, (size_t)(2 * OW) * es);
      fwd_block8((const char *)t0, (const char *)t1, bf, ty, tw);
      memcpy(y, ty, (size_t)OW * es);
      if (w) memcpy(w, tw, (size_t)OW);
      continue;
    }
    for (int64_t b = 0; b < OW; b += 8) {
      const int64_t o = b + 8 <= OW ? b : OW - 8;
      fwd_block8(r0 + (size_t)(2 * o) * es, r1 + (size_t)(2 * o) * es, bf, y + (size_t)o * es, w ? w + o : NULL);
    }
  }
}

static void bwd2x2_avx2(const void *gp, const uint8_t *wp, void *dp, int bf, int64_t W, int64_t OH, int64_t OW) {
  const size_t es = bf ? 2 : 4;
  for (int64_t oh = 0; oh < OH; oh++) {
    const char *g = (const char *)gp + (size_t)(oh * OW) * es;
    const uint8_t *k = wp + oh * OW;
    char *d0 = (char *)dp + (size_t)(2 * oh * W) * es, *d1 = d0 + (size_t)W * es;
    if (OW < 8) {
      float tg[8] = {0}, t0[16], t1[16]; /* what the padding lanes write is dropped */
      uint8_t tk[8] = {0};
      memcpy(tg, g, (size_t)OW * es);
      memcpy(tk, k, (size_t)OW);
      bwd_block8(tg, tk, bf, (char *)t0, (char *)t1);
      memcpy(d0, t0, (size_t)(2 * OW) * es);
      memcpy(d1, t1, (size_t)(2 * OW) * es);
    } else {
      for (int64_t b = 0; b < OW; b += 8) {
        const int64_t o = b + 8 <= OW ? b : OW - 8;
        bwd_block8(g + (size_t)o * es, k + o, bf, d0 + (size_t)(2 * o) * es, d1 + (size_t)(2 * o) * es);
      }
    }
    /* the columns no window covers */
    if (2 * OW < W) {
      memset(d0 + (size_t)(2 * OW) * es, 0, (size_t)(W - 2 * OW) * es);
      memset(d1 + (size_t)(2 * OW) * es, 0, (size_t)(W - 2 * OW) * es);
    }
  }
}
#define HAVE_AVX2_TILES 1
#endif

TILES_FWD(fwd_f32, float, F32_LD, F32_ST)
TILES_FWD(fwd_bf16, uint16_t, cpu_bf16_ld, cpu_bf16_st)
TILES_BWD(bwd_f32, float, 0.0f)
TILES_BWD(bwd_bf16, uint16_t, (uint16_t)0)

/* 1 where the AVX-512 tiles are built and this CPU runs them. */
static int use_avx512(void) {
#ifdef HAVE_AVX512_TILES
  static int v = -1;
  if (v < 0) v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return v;
#else
  return 0;
#endif
}

#ifdef HAVE_AVX2_TILES
static const int have_avx2 = 1;
#else
static const int have_avx2 = 0;
#endif

void cpu_maxpool_tiles_fwd(const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y, uint8_t *ws) {
  const int avx512 = use_avx512();
  const int64_t P = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
  const int64_t OH = y->shape[2], OW = y->shape[3];
  const int bf = x->dtype == CT_BF16;
  const size_t es = bf ? 2 : 4;
#pragma omp parallel for schedule(static)
  for (int64_t pl = 0; pl < P; pl++) {
    const void *xp = (const char *)x->data + (size_t)(pl * H * W) * es;
    void *yp = (char *)y->data + (size_t)(pl * OH * OW) * es;
    uint8_t *wp = ws ? ws + pl * OH * OW : NULL;
    if (p->kernel_h == 2 && p->kernel_w == 2) {
#ifdef HAVE_AVX512_TILES
      if (avx512) {
        fwd2x2_avx512(xp, yp, wp, bf, W, OH, OW);
        continue;
      }
#endif
#ifdef HAVE_AVX2_TILES
      fwd2x2_avx2(xp, yp, wp, bf, W, OH, OW);
      continue;
#endif
    }
    if (bf)
      fwd_bf16(xp, yp, wp, W, OH, OW, p->kernel_h, p->kernel_w);
    else
      fwd_f32(xp, yp, wp, W, OH, OW, p->kernel_h, p->kernel_w);
  }
}

void cpu_maxpool_tiles_bwd(const ct_pool2d_params *p, const ct_tensor *dy, const uint8_t *ws, ct_tensor *dx) {
  const int avx512 = use_avx512();
  const int64_t P = dx->shape[0] * dx->shape[1], H = dx->shape[2], W = dx->shape[3];
  const int64_t OH = dy->shape[2], OW = dy->shape[3];
  const int bf = dx->dtype == CT_BF16;
  const size_t es = bf ? 2 : 4;
#pragma omp parallel for schedule(static)
  for (int64_t pl = 0; pl < P; pl++) {
    const void *gp = (const char *)dy->data + (size_t)(pl * OH * OW) * es;
    void *dp = (char *)dx->data + (size_t)(pl * H * W) * es;
    if (p->kernel_h == 2 && p->kernel_w == 2 && (avx512 || have_avx2)) {
#ifdef HAVE_AVX512_TILES
      if (avx512) bwd2x2_avx512(gp, ws + pl * OH * OW, dp, bf, W, OH, OW);
#endif
#ifdef HAVE_AVX2_TILES
      if (!avx512) bwd2x2_avx2(gp, ws + pl * OH * OW, dp, bf, W, OH, OW);
#endif
      if (2 * OH < H) memset((char *)dp + (size_t)(2 * OH * W) * es, 0, (size_t)((H - 2 * OH) * W) * es);
      continue;
    }
    if (bf)
      bwd_bf16(gp, ws + pl * OH * OW, dp, H, W, OH, OW, p->kernel_h, p->kernel_w);
    else
      bwd_f32(gp, ws + pl * OH * OW, dp, H, W, OH, OW, p->kernel_h, p->kernel_w);
  }
}
