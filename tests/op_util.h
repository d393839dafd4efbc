/* Host helpers shared by the op tests (cpu and gpu): PyTorch's pooled size,
 * a pooling case, and the NCHW <-> NHWC permutations that build
 * channels-last inputs and read channels-last outputs back. */
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

/* [N][C][HW] -> [N][HW][C]. */
static inline void to_nhwc(const float *src, float *dst, int64_t N, int64_t C, int64_t HW) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t p = 0; p < HW; p++) dst[(n * HW + p) * C + c] = src[(n * C + c) * HW + p];
}

/* [N][HW][C] -> [N][C][HW]. */
static inline void from_nhwc(const float *src, float *dst, int64_t N, int64_t C, int64_t HW) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t p = 0; p < HW; p++) dst[(n * C + c) * HW + p] = src[(n * HW + p) * C + c];
}

#endif
