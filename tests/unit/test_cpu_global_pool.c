/* Global adaptive pooling (1x1 output) on the cpu device reading a plain,
 * C16, C8 or NHWC input (cpu_adaptive_pool.c) against the reference on the same
 * values in plain NCHW, bit for bit: average and max, forward (values
 * and the max's flat indices) and backward, f32 and bf16. The input holds
 * a plane with a tie (the first maximum wins), one with two NaNs (the
 * later wins), one of -inf and one all -0.0; dy holds -0.0 (the
 * reference's sum turns it into +0). Average pooling to the input's own
 * size (one-pixel bins, AlexNet's 6x6 to 6x6: a copy on the cpu) in plain
 * and NHWC against the reference too, with -0, NaN and infinities on both
 * sides. A laid-out input pooled to more than one pixel is refused with a
 * message. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "test_util.h"

#include "backend/backend.h"

enum { N = 3, C = 32, H = 5, W = 7, HW = H * W };

static uint64_t rs = 99;

/* Where (n, c, p) lies in layout lay. */
static int64_t at(ct_layout lay, int64_t n, int64_t c, int64_t p) {
  if (lay == CT_LAYOUT_NHWC) return (n * HW + p) * C + c;
  if (lay == CT_LAYOUT_C16) return ((n * (C / 16) + c / 16) * HW + p) * 16 + c % 16;
  if (lay == CT_LAYOUT_C8) return ((n * (C / 8) + c / 8) * HW + p) * 8 + c % 8;
  return (n * C + c) * HW + p;
}

/* plain f32 values -> buffer of dtype t in layout lay, and back. */
static void put(const float *plain, void *dst, ct_dtype t, ct_layout lay, int64_t hw) {
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t p = 0; p < hw; p++) {
        float v = plain[(n * C + c) * hw + p];
        int64_t j = hw == 1 ? n * C + c : at(lay, n, c, p);
        if (t == CT_BF16) ((uint16_t *)dst)[j] = ct_f32_to_bf16(v);
        else ((float *)dst)[j] = v;
      }
}

/* Element (n, c, p) as raw bits (bf16 widened), for a bitwise compare. */
static uint32_t bits(const void *src, ct_dtype t, int64_t j) {
  if (t == CT_BF16) return ((const uint16_t *)src)[j];
  uint32_t u;
  memcpy(&u, (const float *)src + j, 4);
  return u;
}

static ct_tensor t4(void *p, ct_dtype t, int64_t h, int64_t w, ct_layout lay) {
  ct_tensor x = ct_tensor_4d(p, t, N, C, h, w);
  x.layout = lay;
  return x;
}

static void one_case(ct_device *cpu, ct_device *ref, ct_layout lay, ct_dtype t, int is_max) {
  const ct_backend *B = ct_device_backend(cpu), *R = ct_device_backend(ref);
  float xv[N * C * HW], dyv[N * C];
  for (int i = 0; i < N * C * HW; i++) xv[i] = test_frand(&rs);
  float *pl = xv + (0 * C + 1) * HW; /* a tie: the first 3.0 wins */
  pl[4] = 3.0f, pl[9] = 3.0f;
  pl = xv + (1 * C + 5) * HW; /* NaNs: the later wins */
  pl[2] = NAN, pl[20] = NAN;
  pl = xv + (2 * C + 17) * HW;
  for (int p = 0; p < HW; p++) pl[p] = -INFINITY;
  pl = xv + (2 * C + 30) * HW;
  for (int p = 0; p < HW; p++) pl[p] = -0.0f;
  for (int i = 0; i < N * C; i++) dyv[i] = i % 7 == 0 ? -0.0f : test_frand(&rs);

  char xr[sizeof xv], xl[sizeof xv], yr[sizeof dyv], yl[sizeof dyv], dy[sizeof dyv], dxr[sizeof xv], dxl[sizeof xv];
  int32_t ir[N * C], il[N * C];
  put(xv, xr, t, CT_LAYOUT_PLAIN, HW), put(xv, xl, t, lay, HW), put(dyv, dy, t, CT_LAYOUT_PLAIN, 1);
  memset(yl, 0x5a, sizeof yl), memset(il, 0x5a, sizeof il), memset(dxl, 0x5a, sizeof dxl);
  ct_tensor x_r = t4(xr, t, H, W, CT_LAYOUT_PLAIN), x_l = t4(xl, t, H, W, lay);
  ct_tensor y_r = t4(yr, t, 1, 1, CT_LAYOUT_PLAIN), y_l = t4(yl, t, 1, 1, CT_LAYOUT_PLAIN);
  ct_tensor dy_t = t4(dy, t, 1, 1, CT_LAYOUT_PLAIN);
  ct_tensor dx_r = t4(dxr, t, H, W, CT_LAYOUT_PLAIN), dx_l = t4(dxl, t, H, W, lay);
  if (is_max) {
    CHECK_OK(R->adaptive_maxpool2d_fwd(ref, &x_r, &y_r, ir));
    CHECK_OK(B->adaptive_maxpool2d_fwd(cpu, &x_l, &y_l, il));
    CHECK_OK(R->adaptive_maxpool2d_bwd(ref, &dy_t, ir, &dx_r));
    CHECK_OK(B->adaptive_maxpool2d_bwd(cpu, &dy_t, il, &dx_l));
  } else {
    CHECK_OK(R->adaptive_avgpool2d_fwd(ref, &x_r, &y_r));
    CHECK_OK(B->adaptive_avgpool2d_fwd(cpu, &x_l, &y_l));
    CHECK_OK(R->adaptive_avgpool2d_bwd(ref, &dy_t, &dx_r));
    CHECK_OK(B->adaptive_avgpool2d_bwd(cpu, &dy_t, &dx_l));
  }
  int bad_y = 0, bad_i = 0, bad_dx = 0;
  for (int64_t i = 0; i < N * C; i++) {
    bad_y += bits(yr, t, i) != bits(yl, t, i);
    bad_i += is_max && ir[i] != il[i];
  }
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t p = 0; p < HW; p++) bad_dx += bits(dxr, t, (n * C + c) * HW + p) != bits(dxl, t, at(lay, n, c, p));
  const char *what = is_max ? "max" : "avg";
  const char *ln = lay == CT_LAYOUT_NHWC ? "NHWC" : lay == CT_LAYOUT_C8 ? "C8" : lay == CT_LAYOUT_C16 ? "C16" : "plain";
  CHECK_MSG(!bad_y && !bad_i && !bad_dx, "%s %s %s: %d outputs, %d indices, %d input gradients differ", what, ln,
            ct_dtype_name(t), bad_y, bad_i, bad_dx);
  if (is_max) {
    CHECK_MSG(il[1] == 4 && il[C + 5] == 20, "%s %s: tie index %d, NaN index %d", ln, ct_dtype_name(t), il[1],
              il[C + 5]);
  }
}

/* Each bin one pixel: y has x's shape and layout (plain or NHWC). */
static void one_pixel_case(ct_device *cpu, ct_device *ref, ct_layout lay, ct_dtype t) {
  const ct_backend *B = ct_device_backend(cpu), *R = ct_device_backend(ref);
  enum { NV = N * C * HW };
  static float xv[NV], gv[NV];
  for (int i = 0; i < NV; i++) {
    xv[i] = test_frand(&rs), gv[i] = test_frand(&rs);
    const float odd[] = {-0.0f, NAN, INFINITY, -INFINITY};
    if (i % 11 == 0) xv[i] = odd[(i / 11) % 4], gv[i] = odd[(i / 11 + 1) % 4];
  }
  static char xr[sizeof xv], xl[sizeof xv], gr[sizeof xv], gl[sizeof xv];
  static char yr[sizeof xv], yl[sizeof xv], dxr[sizeof xv], dxl[sizeof xv];
  put(xv, xr, t, CT_LAYOUT_PLAIN, HW), put(xv, xl, t, lay, HW);
  put(gv, gr, t, CT_LAYOUT_PLAIN, HW), put(gv, gl, t, lay, HW);
  memset(yl, 0x5a, sizeof yl), memset(dxl, 0x5a, sizeof dxl);
  ct_tensor x_r = t4(xr, t, H, W, CT_LAYOUT_PLAIN), x_l = t4(xl, t, H, W, lay);
  ct_tensor y_r = t4(yr, t, H, W, CT_LAYOUT_PLAIN), y_l = t4(yl, t, H, W, lay);
  ct_tensor g_r = t4(gr, t, H, W, CT_LAYOUT_PLAIN), g_l = t4(gl, t, H, W, lay);
  ct_tensor dx_r = t4(dxr, t, H, W, CT_LAYOUT_PLAIN), dx_l = t4(dxl, t, H, W, lay);
  CHECK_OK(R->adaptive_avgpool2d_fwd(ref, &x_r, &y_r));
  CHECK_OK(B->adaptive_avgpool2d_fwd(cpu, &x_l, &y_l));
  CHECK_OK(R->adaptive_avgpool2d_bwd(ref, &g_r, &dx_r));
  CHECK_OK(B->adaptive_avgpool2d_bwd(cpu, &g_l, &dx_l));
  int bad_y = 0, bad_dx = 0;
  for (int64_t n = 0; n < N; n++)
    for (int64_t c = 0; c < C; c++)
      for (int64_t p = 0; p < HW; p++) {
        int64_t i = (n * C + c) * HW + p, j = at(lay, n, c, p);
        bad_y += bits(yr, t, i) != bits(yl, t, j);
        bad_dx += bits(dxr, t, i) != bits(dxl, t, j);
      }
  CHECK_MSG(!bad_y && !bad_dx, "one-pixel bins %s %s: %d outputs, %d input gradients differ",
            lay == CT_LAYOUT_NHWC ? "NHWC" : "plain", ct_dtype_name(t), bad_y, bad_dx);
}

int main(void) {
  ct_device *cpu, *ref;
  CHECK_OK(ct_device_open("cpu", &cpu));
  CHECK_OK(ct_device_open("ref", &ref));
  const ct_layout lays[] = {CT_LAYOUT_PLAIN, CT_LAYOUT_C16, CT_LAYOUT_C8, CT_LAYOUT_NHWC};
  const ct_dtype dts[] = {CT_F32, CT_BF16};
  for (int l = 0; l < 4; l++)
    for (int d = 0; d < 2; d++)
      for (int mx = 0; mx < 2; mx++) one_case(cpu, ref, lays[l], dts[d], mx);
  for (int d = 0; d < 2; d++) {
    one_pixel_case(cpu, ref, CT_LAYOUT_PLAIN, dts[d]);
    one_pixel_case(cpu, ref, CT_LAYOUT_NHWC, dts[d]);
  }
  /* Pooled to 2x2, a laid-out input is refused, not misread. */
  float x[N * C * HW] = {0}, y[N * C * 4];
  ct_tensor xt = t4(x, CT_F32, H, W, CT_LAYOUT_NHWC), yt = t4(y, CT_F32, 2, 2, CT_LAYOUT_PLAIN);
  CHECK(ct_device_backend(cpu)->adaptive_avgpool2d_fwd(cpu, &xt, &yt) == CT_ERR_UNSUPPORTED);
  CHECK_MSG(strstr(ct_last_error(), "global pooling") != NULL, "message: %s", ct_last_error());
  ct_device_close(ref);
  ct_device_close(cpu);
  return test_summary("cpu_global_pool");
}
