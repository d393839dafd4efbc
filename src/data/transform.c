/* Per-sample transforms, in torchvision's usual order: Resize (bilinear,
 * F.interpolate align_corners=False, antialias=False), RandomCrop with zero
 * padding, RandomHorizontalFlip, ToFloat (/255), Normalize. Crop and flip
 * are only index maps, so one pass reads each output pixel straight from the
 * source image with no intermediate buffer. */
#include "data/dataset_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/rng.h"
#include "math/transform_params.h"

_Static_assert(CT_XF_MAX_CHANNELS == CT_DATA_MAX_CHANNELS, "transform_params.h: channel limit");
_Static_assert(CT_XF_RNG_AUGMENT == CT_RNG_AUGMENT, "transform_params.h: augmentation stream id");

void ct_transform_default(ct_transform *t) {
  memset(t, 0, sizeof *t);
  t->to_float = 1;
  for (int c = 0; c < CT_DATA_MAX_CHANNELS; c++) t->std[c] = 1.0f;
}

ct_status ct_transform_check(const ct_transform *t, int c, int h, int w, int *out_h, int *out_w) {
  if ((t->resize_h > 0) != (t->resize_w > 0) || t->resize_h < 0 || t->resize_w < 0)
    return ct_error(CT_ERR_INVALID_ARG, "transform: resize %dx%d: give both height and width (> 0) or neither",
                    t->resize_h, t->resize_w);
  if ((t->crop_h > 0) != (t->crop_w > 0) || t->crop_h < 0 || t->crop_w < 0)
    return ct_error(CT_ERR_INVALID_ARG, "transform: crop %dx%d: give both height and width (> 0) or neither",
                    t->crop_h, t->crop_w);
  if (t->crop_padding < 0 || (t->crop_padding > 0 && t->crop_h == 0))
    return ct_error(CT_ERR_INVALID_ARG, "transform: crop padding %d needs a crop size and must be >= 0",
                    t->crop_padding);
  if (!(t->hflip_p >= 0.0f && t->hflip_p <= 1.0f))
    return ct_error(CT_ERR_INVALID_ARG, "transform: flip probability %g is outside [0, 1]", (double)t->hflip_p);
  if (c < 1 || c > CT_DATA_MAX_CHANNELS)
    return ct_error(CT_ERR_INVALID_ARG, "transform: %d channels; at most %d are supported", c, CT_DATA_MAX_CHANNELS);
  int rh = t->resize_h > 0 ? t->resize_h : h, rw = t->resize_w > 0 ? t->resize_w : w;
  int ph = rh + 2 * t->crop_padding, pw = rw + 2 * t->crop_padding;
  if (t->crop_h > ph || t->crop_w > pw)
    return ct_error(CT_ERR_INVALID_ARG, "transform: crop %dx%d is larger than the %dx%d image (after resize and padding %d)",
                    t->crop_h, t->crop_w, ph, pw, t->crop_padding);
  if (t->normalize)
    for (int k = 0; k < c; k++)
      if (!(t->std[k] != 0.0f) || !isfinite(t->std[k]) || !isfinite(t->mean[k]))
        return ct_error(CT_ERR_INVALID_ARG, "transform: normalize channel %d has mean %g std %g; std must be finite and non-zero",
                        k, (double)t->mean[k], (double)t->std[k]);
  if (out_h) *out_h = t->crop_h > 0 ? t->crop_h : rh;
  if (out_w) *out_w = t->crop_w > 0 ? t->crop_w : rw;
  return CT_OK;
}

/* Source taps of output index dst when resizing in -> out, computed as
 * PyTorch's CPU upsample_bilinear2d does (float scale, clamp at 0, guard
 * the last index). w1 is the weight of i1; i0 gets 1 - w1. */
static inline void bilinear_taps(int dst, int in, float scale, int *i0, int *i1, float *w1) {
  float src = scale * ((float)dst + 0.5f) - 0.5f;
  if (src < 0.0f) src = 0.0f;
  int i = (int)src;
  if (i > in - 1) i = in - 1;
  float l = src - (float)i;
  if (l < 0.0f) l = 0.0f;
  if (l > 1.0f) l = 1.0f;
  *i0 = i;
  *i1 = i + (i < in - 1 ? 1 : 0);
  *w1 = l;
}

static inline float bilinear_at(const uint8_t *plane, int w, int y0, int y1, float wy, int x0, int x1, float wx) {
  /* Same association as PyTorch's Interpolate<2>: rows first, then mix. */
  float top = (float)plane[y0 * w + x0] * (1.0f - wx) + (float)plane[y0 * w + x1] * wx;
  float bot = (float)plane[y1 * w + x0] * (1.0f - wx) + (float)plane[y1 * w + x1] * wx;
  return top * (1.0f - wy) + bot * wy;
}

void ct_resize_u8(const uint8_t *src, int c, int h, int w, uint8_t *dst, int oh, int ow) {
  float sy = (float)h / (float)oh, sx = (float)w / (float)ow;
  for (int k = 0; k < c; k++) {
    const uint8_t *plane = src + (size_t)k * (size_t)h * (size_t)w;
    uint8_t *out = dst + (size_t)k * (size_t)oh * (size_t)ow;
    for (int y = 0; y < oh; y++) {
      int y0, y1, x0, x1;
      float wy, wx;
      bilinear_taps(y, h, sy, &y0, &y1, &wy);
      for (int x = 0; x < ow; x++) {
        bilinear_taps(x, w, sx, &x0, &x1, &wx);
        float v = floorf(bilinear_at(plane, w, y0, y1, wy, x0, x1, wx) + 0.5f);
        out[y * ow + x] = (uint8_t)(v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v);
      }
    }
  }
}

void ct_xf_params_from(const ct_transform *t, int c, int h, int w, ct_xf_params *p) {
  memset(p, 0, sizeof *p);
  p->c = c, p->h = h, p->w = w;
  p->resize = t->resize_h > 0;
  p->rh = p->resize ? t->resize_h : h;
  p->rw = p->resize ? t->resize_w : w;
  p->crop = t->crop_h > 0;
  p->pad = p->crop ? t->crop_padding : 0;
  p->oh = p->crop ? t->crop_h : p->rh;
  p->ow = p->crop ? t->crop_w : p->rw;
  p->hflip_p = t->hflip_p;
  p->scale = t->to_float ? 255.0f : 1.0f;
  p->sy = (float)h / (float)p->rh;
  p->sx = (float)w / (float)p->rw;
  for (int k = 0; k < CT_XF_MAX_CHANNELS; k++) {
    p->mean[k] = t->normalize ? t->mean[k] : 0.0f;
    p->std[k] = t->normalize ? t->std[k] : 1.0f;
  }
}

void ct_transform_lut(const ct_transform *t, int c, float lut[][256]) {
  float scale = t->to_float ? 255.0f : 1.0f;
  for (int k = 0; k < c; k++) {
    float mean = t->normalize ? t->mean[k] : 0.0f, std = t->normalize ? t->std[k] : 1.0f;
    for (int v = 0; v < 256; v++) lut[k][v] = ((float)v / scale - mean) / std;
  }
}

void ct_transform_apply(const ct_transform *t, const uint8_t *src, int c, int h, int w, uint64_t seed,
                        int64_t epoch, int64_t sample, float *dst) {
  float lut[CT_DATA_MAX_CHANNELS][256];
  ct_transform_lut(t, c, lut);
  ct_transform_apply_lut(t, (const float(*)[256])lut, src, c, h, w, seed, epoch, sample, dst);
}

void ct_transform_apply_lut(const ct_transform *t, const float lut[][256], const uint8_t *src, int c, int h, int w,
                            uint64_t seed, int64_t epoch, int64_t sample, float *dst) {
  /* Sizes and the random draws come from the header the CUDA batch
   * transform shares (transform_params.h). */
  ct_xf_params p;
  ct_xf_params_from(t, c, h, w, &p);
  int resize = p.resize, rh = p.rh, rw = p.rw, pad = p.pad, oh = p.oh, ow = p.ow;
  int oy, ox, flip;
  ct_xf_draw(&p, seed, epoch, sample, &oy, &ox, &flip);
  size_t plane_in = (size_t)h * (size_t)w, plane_out = (size_t)oh * (size_t)ow;
  if (!resize) {
    /* uint8 in, one table lookup per pixel: ToFloat and Normalize exactly
     * as ((v / 255) - mean) / std in float. */
    for (int k = 0; k < c; k++) {
      const float *tab = lut[k];
      const uint8_t *in = src + (size_t)k * plane_in;
      float *out = dst + (size_t)k * plane_out;
      for (int y = 0; y < oh; y++) {
        int ry = y + oy - pad;
        float *orow = out + (size_t)y * (size_t)ow;
        if (ry < 0 || ry >= h) {
          for (int x = 0; x < ow; x++) orow[x] = tab[0];
          continue;
        }
        const uint8_t *irow = in + (size_t)ry * (size_t)w;
        if (!flip && ox - pad >= 0 && ox - pad + ow <= w) {
          irow += ox - pad;
          for (int x = 0; x < ow; x++) orow[x] = tab[irow[x]];
          continue;
        }
        for (int x = 0; x < ow; x++) {
          int rx = (flip ? ow - 1 - x : x) + ox - pad;
          orow[x] = rx >= 0 && rx < w ? tab[irow[rx]] : tab[0];
        }
      }
    }
    return;
  }
  /* Column taps once per call (crop offset and flip folded in), then a
   * plain row loop per channel that the compiler can keep in registers. */
  enum { STACK_COLS = 1024 };
  int xs_stack[2 * STACK_COLS];
  float wx_stack[STACK_COLS];
  int *xs = ow <= STACK_COLS ? xs_stack : malloc(sizeof(int) * 2 * (size_t)ow);
  float *wxs = ow <= STACK_COLS ? wx_stack : malloc(sizeof(float) * (size_t)ow);
  if (!xs || !wxs) {
    /* Out of memory for a > 1024-column table: fall back to one column at a
     * time through the same formula (slow but correct). */
    if (xs != xs_stack) free(xs);
    if (wxs != wx_stack) free(wxs);
    xs = NULL;
    wxs = NULL;
  }
  float scale = t->to_float ? 255.0f : 1.0f;
  float sy = (float)h / (float)rh, sx = (float)w / (float)rw;
  int x_lo = ow, x_hi = 0; /* output columns [x_lo, x_hi) inside the image */
  for (int x = 0; x < ow && xs; x++) {
    int rx = (flip ? ow - 1 - x : x) + ox - pad;
    if (rx < 0 || rx >= rw) {
      xs[2 * x] = xs[2 * x + 1] = -1;
      wxs[x] = 0.0f;
      continue;
    }
    ct_xf_taps(rx, w, sx, &xs[2 * x], &xs[2 * x + 1], &wxs[x]);
    if (x < x_lo) x_lo = x;
    x_hi = x + 1;
  }
  for (int k = 0; k < c; k++) {
    const uint8_t *plane = src + (size_t)k * plane_in;
    float *out = dst + (size_t)k * plane_out;
    float mean = t->normalize ? t->mean[k] : 0.0f, std = t->normalize ? t->std[k] : 1.0f, zero = lut[k][0];
    for (int y = 0; y < oh; y++) {
      int ry = y + oy - pad; /* row in the resized image */
      float *orow = out + (size_t)y * (size_t)ow;
      if (ry < 0 || ry >= rh) {
        for (int x = 0; x < ow; x++) orow[x] = zero;
        continue;
      }
      int y0, y1;
      float wy;
      ct_xf_taps(ry, h, sy, &y0, &y1, &wy);
      const uint8_t *r0 = plane + (size_t)y0 * (size_t)w, *r1 = plane + (size_t)y1 * (size_t)w;
      if (!xs) {
        for (int x = 0; x < ow; x++) {
          int rx = (flip ? ow - 1 - x : x) + ox - pad, x0, x1;
          float wx;
          if (rx < 0 || rx >= rw) {
            orow[x] = zero;
            continue;
          }
          ct_xf_taps(rx, w, sx, &x0, &x1, &wx);
          orow[x] = ((ct_xf_bilinear((float)r0[x0], (float)r0[x1], (float)r1[x0], (float)r1[x1], wx, wy)) / scale -
                     mean) / std;
        }
        continue;
      }
      for (int x = 0; x < x_lo; x++) orow[x] = zero;
      for (int x = x_lo; x < x_hi; x++) {
        int x0 = xs[2 * x], x1 = xs[2 * x + 1];
        float wx = wxs[x];
        orow[x] = (ct_xf_bilinear((float)r0[x0], (float)r0[x1], (float)r1[x0], (float)r1[x1], wx, wy) / scale -
                   mean) / std;
      }
      for (int x = x_hi; x < ow; x++) orow[x] = zero;
    }
  }
  if (xs && xs != xs_stack) free(xs);
  if (wxs && wxs != wx_stack) free(wxs);
}
