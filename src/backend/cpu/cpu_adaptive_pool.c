/* Adaptive pooling on the cpu. Average pooling to the input's own size
 * (one-pixel bins) is a copy. A global pool (a 1x1 output: ResNet's
 * avgpool, the fast CIFAR network's and the torchkeras cnn's max pools)
 * runs the threaded loops below, on a plain NCHW input or one laid out
 * C16, C8 or NHWC (src/plan/layout.h lets its producer keep the layout, so a
 * residual stage ending in one needs no reorders); its output and dy are
 * plain, which for 1x1 are the same bytes in every layout. Every other
 * plain case (larger outputs, fp16) goes to the reference (ref_pool.inc
 * through ref_half.c), whose single-threaded loop was a visible part of
 * the cnn's step for its 4x4 global max pool. The global loops give the
 * reference's numbers bit for bit: the
 * average sums in double in (h, w) order and rounds once to f32 (then to
 * bf16); the max keeps the reference's first maximum, later NaNs winning,
 * and its flat index h*W+w; the backward writes dy/HW (avg) or dy at the
 * index and zeros elsewhere (max). */
#include <math.h>

#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/ref_ops.h"

/* A laid-out [N, C, H*W] tensor as N*C planes: plane nc = n*C + c starts
 * at first(nc) and its pixels are a.sw elements apart. */
typedef struct planes {
  int64_t C, NC, HW;
  cpu_act_strides a;
} planes;

static int64_t first(const planes *g, int64_t nc) { return cpu_act_chan(&g->a, nc / g->C, nc % g->C); }

static float ld(const void *p, ct_dtype t, int64_t i) {
  return t == CT_BF16 ? cpu_bf16_ld(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static void st(void *p, ct_dtype t, int64_t i, float v) {
  if (t == CT_BF16) ((uint16_t *)p)[i] = cpu_bf16_st(v);
  else ((float *)p)[i] = v;
}

/* big (x or dx) laid out, small (y or dy) plain [N, C, 1, 1] of a dtype
 * the loops know: the only non-plain case this file takes. */
static ct_status check_global(const char *op, const ct_tensor *big, const ct_tensor *small, planes *g) {
  if (big->ndim != 4 || small->ndim != 4 || big->shape[0] != small->shape[0] || big->shape[1] != small->shape[1] ||
      small->shape[2] != 1 || small->shape[3] != 1 || small->layout != CT_LAYOUT_PLAIN)
    return ct_error(CT_ERR_UNSUPPORTED,
                    "cpu %s: a %s input is pooled only to a plain [N, C, 1, 1] output (global pooling); plain "
                    "inputs take any output size",
                    op, big->layout == CT_LAYOUT_NHWC ? "NHWC" : "channel-blocked");
  if (big->layout != CT_LAYOUT_PLAIN && big->layout != CT_LAYOUT_NHWC &&
      !(big->layout == CT_LAYOUT_C16 && big->shape[1] % 16 == 0) &&
      !(big->layout == CT_LAYOUT_C8 && big->shape[1] % 8 == 0))
    return ct_error(CT_ERR_UNSUPPORTED, "cpu %s: input layout %d with %lld channels; expected NHWC, C16 (channels a "
                    "multiple of 16) or C8 (of 8)", op, (int)big->layout, (long long)big->shape[1]);
  if ((big->dtype != CT_F32 && big->dtype != CT_BF16) || big->dtype != small->dtype)
    return ct_error(CT_ERR_UNSUPPORTED, "cpu %s: dtypes %s and %s; a laid-out input takes f32 or bf16, both alike", op,
                    ct_dtype_name(big->dtype) ? ct_dtype_name(big->dtype) : "?",
                    ct_dtype_name(small->dtype) ? ct_dtype_name(small->dtype) : "?");
  if (big->shape[2] * big->shape[3] > INT32_MAX)
    return ct_error(CT_ERR_UNSUPPORTED, "cpu %s: a plane of %lld elements exceeds int32 indices", op,
                    (long long)(big->shape[2] * big->shape[3]));
  g->C = big->shape[1], g->NC = big->shape[0] * g->C, g->HW = big->shape[2] * big->shape[3];
  g->a = cpu_act_strides_of(big);
  return CT_OK;
}

static ct_status global_fwd(const char *op, int is_max, const ct_tensor *x, ct_tensor *y, int32_t *idx) {
  planes g;
  CT_TRY(check_global(op, x, y, &g));
#pragma omp parallel for if (g.NC * g.HW > 65536)
  for (int64_t nc = 0; nc < g.NC; nc++) {
    const int64_t at = first(&g, nc);
    double s = 0, best = -INFINITY;
    int32_t arg = 0;
    for (int64_t p = 0; p < g.HW; p++) {
      double v = ld(x->data, x->dtype, at + p * g.a.sw);
      if (!is_max) s += v;
      else if (v > best || isnan(v)) best = v, arg = (int32_t)p;
    }
    st(y->data, y->dtype, nc, is_max ? (float)best : (float)(s / (double)g.HW));
    if (is_max && idx) idx[nc] = arg;
  }
  return CT_OK;
}

static ct_status global_bwd(const char *op, const ct_tensor *dy, const int32_t *idx, ct_tensor *dx) {
  planes g;
  CT_TRY(check_global(op, dx, dy, &g));
#pragma omp parallel for if (g.NC * g.HW > 65536)
  for (int64_t nc = 0; nc < g.NC; nc++) {
    const int64_t at = first(&g, nc);
    /* The reference adds into zeroed doubles: -0 comes out +0. */
    const double gr = ld(dy->data, dy->dtype, nc);
    const float hit = (float)(0.0 + gr), avg = (float)(0.0 + gr / (double)g.HW);
    for (int64_t p = 0; p < g.HW; p++)
      st(dx->data, dx->dtype, at + p * g.a.sw, idx ? (idx[nc] == p ? hit : 0.0f) : avg);
  }
  return CT_OK;
}

/* A plain case the global loops do not take: the reference's. */
static int plain_to_ref(const ct_tensor *big, const ct_tensor *small) {
  return big->layout == CT_LAYOUT_PLAIN &&
         !(big->ndim == 4 && small->ndim == 4 && small->shape[2] == 1 && small->shape[3] == 1 &&
           small->layout == CT_LAYOUT_PLAIN && (big->dtype == CT_F32 || big->dtype == CT_BF16) &&
           big->dtype == small->dtype);
}

/* Average pooling whose every bin is one pixel (AlexNet's 6x6 to 6x6)
 * moves each element unchanged, in either direction: a threaded copy
 * instead of the reference's single-threaded loop, a visible part of
 * AlexNet bf16's step. It adds +0 as the
 * reference's sum does (which starts from a zeroed double), so -0 comes
 * out +0 and the bits are the reference's. Same shape, dtype (f32 or bf16)
 * and a layout without padding (plain or NHWC) on both sides. */
static int one_pixel_bins(const ct_tensor *a, const ct_tensor *b) {
  if (a->ndim != 4 || b->ndim != 4 || a->dtype != b->dtype || (a->dtype != CT_F32 && a->dtype != CT_BF16)) return 0;
  if (a->layout != b->layout || (a->layout != CT_LAYOUT_PLAIN && a->layout != CT_LAYOUT_NHWC)) return 0;
  for (int i = 0; i < 4; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

static void copy_plus_zero(const ct_tensor *from, ct_tensor *to) {
  const int64_t n = ct_tensor_numel(from);
  if (from->dtype == CT_F32) {
    const float *a = from->data;
    float *b = to->data;
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; i++) b[i] = a[i] + 0.0f;
  } else {
    const uint16_t *a = from->data;
    uint16_t *b = to->data;
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; i++) b[i] = cpu_bf16_st(cpu_bf16_ld(a[i]) + 0.0f);
  }
}

ct_status cpu_adaptive_avgpool2d_fwd(ct_device *d, const ct_tensor *x, ct_tensor *y) {
  if (one_pixel_bins(x, y)) {
    copy_plus_zero(x, y);
    return CT_OK;
  }
  if (plain_to_ref(x, y)) return ct_ref_half_adaptive_avgpool2d_fwd(d, x, y);
  return global_fwd("adaptive_avgpool2d_fwd", 0, x, y, NULL);
}

ct_status cpu_adaptive_avgpool2d_bwd(ct_device *d, const ct_tensor *dy, ct_tensor *dx) {
  if (one_pixel_bins(dy, dx)) {
    copy_plus_zero(dy, dx);
    return CT_OK;
  }
  if (plain_to_ref(dx, dy)) return ct_ref_half_adaptive_avgpool2d_bwd(d, dy, dx);
  return global_bwd("adaptive_avgpool2d_bwd", dy, NULL, dx);
}

ct_status cpu_adaptive_maxpool2d_fwd(ct_device *d, const ct_tensor *x, ct_tensor *y, int32_t *idx) {
  if (plain_to_ref(x, y)) return ct_ref_half_adaptive_maxpool2d_fwd(d, x, y, idx);
  return global_fwd("adaptive_maxpool2d_fwd", 1, x, y, idx);
}

ct_status cpu_adaptive_maxpool2d_bwd(ct_device *d, const ct_tensor *dy, const int32_t *idx, ct_tensor *dx) {
  if (plain_to_ref(dx, dy)) return ct_ref_half_adaptive_maxpool2d_bwd(d, dy, idx, dx);
  if (!idx)
    return ct_error(CT_ERR_INVALID_ARG, "cpu adaptive_maxpool2d_bwd: no indices (the forward was run with idx = NULL)");
  return global_bwd("adaptive_maxpool2d_bwd", dy, idx, dx);
}
