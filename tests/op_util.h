/* Host helpers shared by the op tests (cpu and gpu): PyTorch's pooled size,
 * a pooling case, and the permutations between plain NCHW order and the
 * activation layouts (NHWC, channels blocked by 16 or 8) that build
 * laid-out inputs and read laid-out outputs back. */
#ifndef CTRAIN_TEST_OP_UTIL_H
#define CTRAIN_TEST_OP_UTIL_H

#include <stdint.h>

#include "backend/backend.h"

/* PyTorch's pooled size, ceil_mode's rule included (the last window must
 * start inside the input or the left padding). */
static inline int64_t pool_out(int64_t in, int k, int s, int pad, int ceil_mode) {
  int64_t num = in + 2 * pad - k;
  int64_t o = (ceil_mode ? (num + s - 1) / s : num / s) + 1;
  if (ceil_mode && (o - 1) * s >= in + pad) o--;
  return o;
}

typedef struct pool_case {
  int64_t N, C, H, W;
  ct_pool2d_params p;
} pool_case;

/* Where element (n, c, p) of an [N][C][HW] tensor lies in layout lay (C16
 * and C8 need C a multiple of the block). */
static inline int64_t layout_at(ct_layout lay, int64_t C, int64_t HW, int64_t n, int64_t c, int64_t p) {
  switch (lay) {
    case CT_LAYOUT_NHWC: return (n * HW + p) * C + c;
    case CT_LAYOUT_C16: return ((n * (C / 16) + c / 16) * HW + p) * 16 + c % 16;
    case CT_LAYOUT_C8: return ((n * (C / 8) + c / 8) * HW + p) * 8 + c % 8;
    default: return (n * C + c) * HW + p;
  }
}

/* [N][C][HW] -> layout lay, and back. */
static inline void to_layout(const float *src, float *dst, ct_layout lay, int64_t N, int64_t C, int64_t HW) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t p = 0; p < HW; p++) dst[layout_at(lay, C, HW, n, c, p)] = src[(n * C + c) * HW + p];
}
static inline void from_layout(const float *src, float *dst, ct_layout lay, int64_t N, int64_t C, int64_t HW) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t p = 0; p < HW; p++) dst[(n * C + c) * HW + p] = src[layout_at(lay, C, HW, n, c, p)];
}

/* [N][C][HW] <-> [N][HW][C]. */
static inline void to_nhwc(const float *src, float *dst, int64_t N, int64_t C, int64_t HW) {
  to_layout(src, dst, CT_LAYOUT_NHWC, N, C, HW);
}
static inline void from_nhwc(const float *src, float *dst, int64_t N, int64_t C, int64_t HW) {
  from_layout(src, dst, CT_LAYOUT_NHWC, N, C, HW);
}

#endif
