/* src/math/: host code and CUDA kernels share it; any layer may include it.
 *
 * The per-sample transform arithmetic shared by the CPU loader
 * (src/data/transform.c), the host batch version (transform_batch.c) and
 * the CUDA batch transform (src/backend/cuda/cuda_transform.cu): the random
 * draws (crop offsets, flip) from (seed, epoch, sample), the bilinear
 * source taps, and the value of one output pixel. Compiled as C (gcc) and
 * as CUDA C++ (nvcc), hence CT_XF_HD and plain structs; the two sides run
 * these same lines, so they cannot drift.
 *
 * Bit-exactness across compilers: gcc (gnu17, -march=native) and nvcc both
 * contract a*b + c into an FMA when they like, and each picks its own
 * places. Every multiply-add here is therefore an explicit fmaf() at the
 * place gcc contracted the original transform.c, so the result is the same
 * whatever either compiler does (fmaf is correctly rounded everywhere; no
 * a*b + c is left for a compiler to fuse). Divisions and subtractions are
 * IEEE on both sides (nvcc's default -prec-div=true; --use_fast_math would
 * break this). */
#ifndef CTRAIN_MATH_TRANSFORM_PARAMS_H
#define CTRAIN_MATH_TRANSFORM_PARAMS_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define CT_XF_HD __host__ __device__ __forceinline__
#else
#define CT_XF_HD static inline
#endif

/* Most channels (== CT_DATA_MAX_CHANNELS; data.h is not included so the
 * header stays free of host-only declarations for nvcc). */
#define CT_XF_MAX_CHANNELS 4
/* The augmentation stream id (== CT_RNG_AUGMENT in ctrain/rng.h). */
#define CT_XF_RNG_AUGMENT 4u

/* A ct_transform resolved against one input shape (ct_xf_params_from). */
typedef struct ct_xf_params {
  int32_t c, h, w;    /* input image */
  int32_t rh, rw;     /* after resize (h, w when resize is off) */
  int32_t oh, ow;     /* output */
  int32_t resize;     /* 1: bilinear resize */
  int32_t crop;       /* 1: random crop (offsets drawn) */
  int32_t pad;        /* crop padding (0 without crop) */
  float hflip_p;      /* 0: no flip draw */
  float scale;        /* 255 (ToFloat) or 1 */
  float sy, sx;       /* h / rh and w / rw in float */
  float mean[CT_XF_MAX_CHANNELS]; /* 0 and 1 when normalize is off */
  float std[CT_XF_MAX_CHANNELS];
} ct_xf_params;

/* One batch for the batch transform (backend entry transform_u8, or
 * ct_xf_batch_host): dst[i] = transform of image src[row i] keyed by
 * sample id samples[i], each value computed in f32 and stored in dtype
 * (rounded to nearest even once, as a cast of the f32 batch would) in
 * the layout nhwc says. Pointers are device memory for a device backend. */
typedef struct ct_xf_batch {
  ct_xf_params p;
  int64_t n;
  uint64_t seed;
  int64_t epoch;
  const uint8_t *src;     /* images [*, c, h, w] */
  const int64_t *rows;    /* [n] image of output i in src; NULL: i */
  const int64_t *samples; /* [n] augmentation key of output i; NULL: the row */
  void *dst;              /* [n, c, oh, ow], or [n, oh, ow, c] when nhwc */
  int32_t dtype;          /* a ct_dtype: CT_F32 (0), CT_BF16 or CT_F16 */
  int32_t nhwc;           /* 1: channels-last output */
  const int64_t *labels;  /* optional, with labels_out: labels_out[i] = labels[row i] */
  int64_t *labels_out;
} ct_xf_batch;

/* ---- Philox4x32-10 and the two draws the transform makes, as in
 * src/core/rng.c (ct_rng_init, ct_rng_u32, ct_rng_below, ct_rng_uniform);
 * test_transform_shared checks them against it. ---- */
typedef struct ct_xf_rng {
  uint32_t key[2], ctr[4], buf[4];
  int used;
} ct_xf_rng;

CT_XF_HD void ct_xf_philox(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
    uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

CT_XF_HD void ct_xf_rng_init(ct_xf_rng *r, uint64_t seed, uint32_t kind, uint32_t a, uint32_t b) {
  r->key[0] = (uint32_t)seed, r->key[1] = (uint32_t)(seed >> 32);
  r->ctr[0] = 0, r->ctr[1] = kind, r->ctr[2] = a, r->ctr[3] = b;
  r->used = 4;
}

CT_XF_HD uint32_t ct_xf_u32(ct_xf_rng *r) {
  if (r->used == 4) {
    ct_xf_philox(r->key, r->ctr, r->buf);
    r->ctr[0]++;
    r->used = 0;
  }
  return r->buf[r->used++];
}

CT_XF_HD uint32_t ct_xf_below(ct_xf_rng *r, uint32_t n) {
  uint64_t m = (uint64_t)ct_xf_u32(r) * n; /* Lemire, as ct_rng_below */
  uint32_t l = (uint32_t)m;
  if (l < n) {
    uint32_t t = (uint32_t)(0u - n) % n;
    while (l < t) {
      m = (uint64_t)ct_xf_u32(r) * n;
      l = (uint32_t)m;
    }
  }
  return (uint32_t)(m >> 32);
}

CT_XF_HD float ct_xf_uniform(ct_xf_rng *r) { return (float)(ct_xf_u32(r) >> 8) * (1.0f / 16777216.0f); }

/* Crop offsets (*oy, *ox in the padded resized image) and the flip bit of
 * one sample. Draw order is fixed (crop row, crop column, flip) so the
 * stream is the same whatever options are combined. */
CT_XF_HD void ct_xf_draw(const ct_xf_params *p, uint64_t seed, int64_t epoch, int64_t sample, int *oy, int *ox,
                         int *flip) {
  *oy = 0, *ox = 0, *flip = 0;
  if (!p->crop && !(p->hflip_p > 0.0f)) return;
  ct_xf_rng r;
  ct_xf_rng_init(&r, seed, CT_XF_RNG_AUGMENT, (uint32_t)epoch, (uint32_t)sample);
  if (p->crop) {
    *oy = (int)ct_xf_below(&r, (uint32_t)(p->rh + 2 * p->pad - p->oh + 1));
    *ox = (int)ct_xf_below(&r, (uint32_t)(p->rw + 2 * p->pad - p->ow + 1));
  }
  if (p->hflip_p > 0.0f) *flip = ct_xf_uniform(&r) < p->hflip_p;
}

/* Source taps of output index dst when resizing in -> out, as PyTorch's
 * CPU upsample_bilinear2d computes them (float scale, clamp at 0, guard
 * the last index). w1 is the weight of i1; i0 gets 1 - w1. */
CT_XF_HD void ct_xf_taps(int dst, int in, float scale, int *i0, int *i1, float *w1) {
  float src = fmaf(scale, (float)dst + 0.5f, -0.5f);
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

/* A product ptxas may not fuse into anything (PTX mul.f32 without .rn
 * may be contracted; mul.rn.f32 may not). */
#ifdef __CUDA_ARCH__
#define CT_XF_MUL(a, b) __fmul_rn((a), (b))
#else
#define CT_XF_MUL(a, b) ((a) * (b))
#endif

/* a * (1 - w) + b * w, in the one rounding order used everywhere. */
CT_XF_HD float ct_xf_lerp(float a, float b, float w) { return fmaf(a, 1.0f - w, CT_XF_MUL(b, w)); }

/* Bilinear value from the four taps: rows first, then mix (PyTorch's
 * Interpolate<2> association). */
CT_XF_HD float ct_xf_bilinear(float v00, float v01, float v10, float v11, float wx, float wy) {
  return ct_xf_lerp(ct_xf_lerp(v00, v01, wx), ct_xf_lerp(v10, v11, wx), wy);
}

/* ToFloat + Normalize of one (resized) value of channel k. */
CT_XF_HD float ct_xf_norm(const ct_xf_params *p, int k, float v) { return (v / p->scale - p->mean[k]) / p->std[k]; }

/* Output pixel (k, y, x) of one image img ([c, h, w] uint8) for the
 * sample's draws (oy, ox, flip). */
CT_XF_HD float ct_xf_pixel(const ct_xf_params *p, const uint8_t *img, int k, int y, int x, int oy, int ox, int flip) {
  int ry = y + oy - p->pad, rx = (flip ? p->ow - 1 - x : x) + ox - p->pad;
  if (ry < 0 || ry >= p->rh || rx < 0 || rx >= p->rw) return ct_xf_norm(p, k, 0.0f);
  const uint8_t *plane = img + (int64_t)k * p->h * p->w;
  if (!p->resize) return ct_xf_norm(p, k, (float)plane[(int64_t)ry * p->w + rx]);
  int y0, y1, x0, x1;
  float wy, wx;
  ct_xf_taps(ry, p->h, p->sy, &y0, &y1, &wy);
  ct_xf_taps(rx, p->w, p->sx, &x0, &x1, &wx);
  const uint8_t *r0 = plane + (int64_t)y0 * p->w, *r1 = plane + (int64_t)y1 * p->w;
  return ct_xf_norm(p, k, ct_xf_bilinear((float)r0[x0], (float)r0[x1], (float)r1[x0], (float)r1[x1], wx, wy));
}

#ifdef __cplusplus
extern "C" {
#endif
#ifndef __CUDACC__
struct ct_transform;
/* Resolves t against an input of c x h x w (which must have passed
 * ct_transform_check) into *p. */
void ct_xf_params_from(const struct ct_transform *t, int c, int h, int w, ct_xf_params *p);

/* The batch transform on the host, one output pixel at a time through
 * ct_xf_pixel: exactly the arithmetic and the loop-free per-pixel form the
 * CUDA kernel runs, so comparing it with ct_transform_apply on the CPU
 * tests the kernel's arithmetic without a GPU. Host pointers. */
void ct_xf_batch_host(const ct_xf_batch *b);
#endif
#ifdef __cplusplus
}
#endif

#endif
