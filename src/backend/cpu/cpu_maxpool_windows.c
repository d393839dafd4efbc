/* Max pooling with any window, stride and padding (overlapping windows:
 * ResNet's 3x3 / stride 2 / pad 1 stem pool) on plain NCHW, f32 and bf16.
 *
 * Why: where the activations stay plain NCHW (any CPU without AVX-512,
 * whose oneDNN layouts ctrain does not keep between layers), oneDNN 2.6
 * pools through its reference kernel `simple_nchw`: 22-25 ms forward for
 * ResNet-18's 128x64x16x16 stem pool at 32x32 on the 2-core AVX2
 * development machine, a twentieth of a whole training step. Windows that
 * do not overlap take cpu_maxpool_tiles.c instead.
 *
 * Semantics are the reference's (ref_pool.inc) bit for bit: padding counts
 * as -inf, the first maximum in row-major window order wins, a NaN wins
 * over any number (the last NaN); the workspace is one byte per output,
 * the argmax's offset in its (unclipped) window, 255 for a window that
 * holds no input element (impossible with PyTorch's size rules; its output
 * is -inf and the backward skips it). The backward adds each gradient
 * into a per-plane double accumulator and rounds once, as the reference
 * does, so inputs under several windows get the same sums. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"

#define NO_ARG 255
#define NOVEC __attribute__((optimize("no-tree-vectorize")))

int cpu_maxpool_windows_ok(const ct_pool2d_params *p, const ct_tensor *x, const ct_tensor *y) {
  return x->layout == CT_LAYOUT_PLAIN && y->layout == CT_LAYOUT_PLAIN && x->dtype == y->dtype &&
         (x->dtype == CT_F32 || x->dtype == CT_BF16) && x->ndim == 4 && y->ndim == 4 && p->kernel_h > 0 &&
         p->kernel_w > 0 && p->stride_h > 0 && p->stride_w > 0 && p->pad_h >= 0 && p->pad_w >= 0 &&
         p->kernel_h * p->kernel_w < NO_ARG && y->shape[0] == x->shape[0] && y->shape[1] == x->shape[1];
}

#define F32_LD(v) (v)
#define F32_ST(v) ((float)(v))

/* One plane, forward. */
#define WINDOWS_FWD(NAME, T, LD, ST)                                                                              \
  NOVEC static void NAME(const ct_pool2d_params *p, const T *restrict xp, T *restrict yp, uint8_t *restrict wp,   \
                   int64_t H, int64_t W, int64_t OH, int64_t OW) {                                                \
    const int kh = p->kernel_h, kw = p->kernel_w;                                                                 \
    for (int64_t oh = 0; oh < OH; oh++) {                                                                         \
      const int64_t h0 = oh * p->stride_h - p->pad_h;                                                             \
      const int i0 = h0 < 0 ? (int)-h0 : 0, i1 = h0 + kh > H ? (int)(H - h0) : kh;                                \
      for (int64_t ow = 0; ow < OW; ow++) {                                                                       \
        const int64_t w0 = ow * p->stride_w - p->pad_w;                                                           \
        const int j0 = w0 < 0 ? (int)-w0 : 0, j1 = w0 + kw > W ? (int)(W - w0) : kw;                              \
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

void cpu_maxpool_windows_fwd(const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y, uint8_t *ws) {
  const int64_t P = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
  const int64_t OH = y->shape[2], OW = y->shape[3];
  const int bf = x->dtype == CT_BF16;
#pragma omp parallel for schedule(static)
  for (int64_t pl = 0; pl < P; pl++) {
    uint8_t *wp = ws ? ws + pl * OH * OW : NULL;
    if (bf)
      fwd_bf16(p, (const uint16_t *)x->data + pl * H * W, (uint16_t *)y->data + pl * OH * OW, wp, H, W, OH, OW);
    else
      fwd_f32(p, (const float *)x->data + pl * H * W, (float *)y->data + pl * OH * OW, wp, H, W, OH, OW);
  }
}

ct_status cpu_maxpool_windows_bwd(const ct_pool2d_params *p, const ct_tensor *dy, const uint8_t *ws, ct_tensor *dx) {
  const int64_t P = dx->shape[0] * dx->shape[1], H = dx->shape[2], W = dx->shape[3];
  const int64_t OH = dy->shape[2], OW = dy->shape[3];
  const int bf = dx->dtype == CT_BF16;
  int failed = 0;
#pragma omp parallel reduction(| : failed)
  {
    double *acc = malloc(sizeof(double) * (size_t)(H * W > 0 ? H * W : 1));
    failed = !acc;
#pragma omp for schedule(static)
    for (int64_t pl = 0; pl < P; pl++) {
      if (!acc) continue;
      const uint8_t *wp = ws + pl * OH * OW;
      if (bf)
        bwd_bf16(p, (const uint16_t *)dy->data + pl * OH * OW, wp, (uint16_t *)dx->data + pl * H * W, acc, H, W, OH,
                 OW);
      else
        bwd_f32(p, (const float *)dy->data + pl * OH * OW, wp, (float *)dx->data + pl * H * W, acc, H, W, OH, OW);
    }
    free(acc);
  }
  if (failed)
    return ct_error(CT_ERR_OUT_OF_MEMORY, "maxpool2d_bwd: cannot allocate a %lldx%lld accumulator per thread",
                    (long long)H, (long long)W);
  return CT_OK;
}
