/* First layers: convolutions on few input channels where oneDNN 2.6 was
 * measured slow, f32 (the weight gradient also bf16 where oneDNN has no
 * bf16), the input plain NCHW (as the executor leaves a tensor of fewer
 * channels than a block). Two of them: the backward
 * weights of a one-channel input (a network on grey images), here, and
 * the forward of large kernels (AlexNet's 11x11), at the end of the file.
 *
 * Backward weights, why: oneDNN 2.6's AVX2 backward-weights kernel pads a 1-channel input to
 * a block of 8 (it reorders x into nChw8c and computes eight channels, seven
 * of them zero), a large share of the torchkeras cnn's step for a small
 * convolution (docs/ARCHITECTURE.md, "First-layer weight gradients").
 * Here each output-gradient row
 * is taken as vectors of 8 channels, so a tap's gradient is a sum over the
 * row of such a vector times one input element: FMAs on whole vectors, no
 * padded channels. C8, C16 and NHWC are read in place, plain gathered a
 * row at a time; the sums are the same in all four, so a model gives the
 * same bits whatever its memory format (test_layout).
 *
 * Each thread takes whole images, copies its image into a zero-padded
 * buffer (no bounds tests in the loops), sums each row in float and adds
 * the rows into its own double accumulators; the threads' sums are added
 * in thread order at the end, so the result depends on the thread count
 * only. Buffers come from a per-device scratch entry of the primitive
 * cache. */
#include <string.h>

#include "backend/cpu/cpu_conv.h"
#include "backend/cpu/cpu_impl.h"

enum { OP_CONV_THIN_SCRATCH = 151, OP_CONV_THIN_FWD_SCRATCH };

/* -1 (default): on where oneDNN has no AVX-512 kernels. Both paths were
 * written against oneDNN 2.6's AVX2 kernels; its AVX-512 ones handle a
 * first layer without padding it to a block and beat both here
 * (bench/results/2026-11-28-cpu-ab-conv-thin.md). */
static int thin_mode = -1;
void cpu_conv_set_thin(int on) { thin_mode = on; }
static int thin_on(void) { return thin_mode < 0 ? !cpu_dnnl_avx512() : thin_mode; }

/* Input channels up to which this path is taken. One: oneDNN pads only
 * that to a block. With three (RGB) it reads the input plain, and its
 * kernel beat this one several times over on ResNet-18's 7x7 stem, where
 * each row's short dot products and the double accumulation of 147 taps
 * dominate. */
#define THIN_MAX_C 1

/* What both directions need: groups 1, dilation 1, 4-D, plain weights
 * and a plain input (one channel lies the same plain and NHWC). */
static int thin_shapes(const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w, const ct_tensor *y) {
  if (!thin_on() || p->groups > 1 || p->dil_h > 1 || p->dil_w > 1) return 0;
  if (x->ndim != 4 || y->ndim != 4 || w->ndim != 4 || w->layout != CT_LAYOUT_PLAIN) return 0;
  return x->layout == CT_LAYOUT_PLAIN || (x->layout == CT_LAYOUT_NHWC && x->shape[1] == 1);
}

/* bf16 tensors the weight gradient reads or writes itself, converting on
 * the way (exact when widening; dw and db rounded once, from the f32 the
 * widening path would have rounded): only where oneDNN has no bf16 (AVX2),
 * whose alternative is that path's whole-tensor copies (far slower than
 * f32), and a bf16 dy only
 * plain, read through the gather. */
static int wgrad_dtype(const ct_tensor *t) { return t->dtype == CT_F32 || (t->dtype == CT_BF16 && !cpu_dnnl_bf16()); }

int cpu_conv_thin_ok(const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *dy, const ct_tensor *dw,
                     const ct_tensor *db) {
  return thin_shapes(p, x, dw, dy) && wgrad_dtype(x) && wgrad_dtype(dy) && wgrad_dtype(dw) &&
         (dy->dtype == CT_F32 || dy->layout == CT_LAYOUT_PLAIN) && (!db || wgrad_dtype(db)) &&
         x->shape[1] <= THIN_MAX_C;
}

/* Element i of an f32 or bf16 tensor's data, as f32. */
static inline float elem(const void *d, ct_dtype dt, int64_t i) {
  return dt == CT_BF16 ? cpu_bf16_ld(((const uint16_t *)d)[i]) : ((const float *)d)[i];
}

typedef struct thin {
  int64_t N, C, H, W, K, OH, OW, KH, KW, sh, sw, ph, pw;
  int64_t Hp, Wp, taps; /* padded image; C*KH*KW */
} thin;

/* The geometry of input x, weights w and output y (or their gradients). */
static thin thin_init(const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w, const ct_tensor *y) {
  thin g = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], y->shape[1], y->shape[2], y->shape[3],
            w->shape[2], w->shape[3], p->stride_h, p->stride_w, p->pad_h, p->pad_w, 0, 0, 0};
  /* Rows past the image that a stride can reach stay zero too. */
  g.Hp = (g.OH - 1) * g.sh + g.KH > g.H + 2 * g.ph ? (g.OH - 1) * g.sh + g.KH : g.H + 2 * g.ph;
  g.Wp = (g.OW - 1) * g.sw + g.KW > g.W + 2 * g.pw ? (g.OW - 1) * g.sw + g.KW : g.W + 2 * g.pw;
  g.taps = g.C * g.KH * g.KW;
  return g;
}

/* Image n of x (f32 or bf16) into xp with its padding as zeros. Only the
 * interior is written: the padding stays zero from the scratch's clearing
 * on. */
static void pad_image(const thin *g, const ct_tensor *x, int64_t n, float *xp) {
  for (int64_t c = 0; c < g->C; c++)
    for (int64_t h = 0; h < g->H; h++) {
      float *dst = xp + (c * g->Hp + h + g->ph) * g->Wp + g->pw;
      const int64_t at = ((n * g->C + c) * g->H + h) * g->W;
      if (x->dtype == CT_F32)
        memcpy(dst, (const float *)x->data + at, (size_t)g->W * sizeof(float));
      else
        for (int64_t w = 0; w < g->W; w++) dst[w] = elem(x->data, x->dtype, at + w);
    }
}

/* 8 floats, one AVX register; unaligned loads through memcpy. */
typedef float v8 __attribute__((vector_size(32)));
static inline v8 ld8(const float *p) {
  v8 v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* One output row oh of 8 output channels k0 .. k0+nk-1 (the lanes; nk <=
 * 8): adds its weight and bias gradients into acc ([K][taps] then [K],
 * double). dr is the row, lane j of position ow at dr[ow*ls + j]; xp the
 * image, zero-padded. Four accumulators per tap so the FMAs of a row do
 * not wait on each other. The arithmetic of a lane does not depend on ls,
 * so every layout of dy gives the same bits. */
static void row(const thin *g, const float *dr, int64_t ls, int64_t oh, const float *xp, double *acc, int64_t k0,
                int nk) {
  v8 bs = {0};
  for (int64_t ow = 0; ow < g->OW; ow++) bs += ld8(dr + ow * ls);
  for (int j = 0; j < nk; j++) acc[g->K * g->taps + k0 + j] += bs[j];
  for (int64_t c = 0; c < g->C; c++)
    for (int64_t kh = 0; kh < g->KH; kh++) {
      const float *xr = xp + (c * g->Hp + oh * g->sh + kh) * g->Wp;
      for (int64_t kw = 0; kw < g->KW; kw++) {
        v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        int64_t ow = 0;
        for (; ow + 4 <= g->OW; ow += 4) {
          a0 += ld8(dr + ow * ls) * xr[ow * g->sw + kw];
          a1 += ld8(dr + (ow + 1) * ls) * xr[(ow + 1) * g->sw + kw];
          a2 += ld8(dr + (ow + 2) * ls) * xr[(ow + 2) * g->sw + kw];
          a3 += ld8(dr + (ow + 3) * ls) * xr[(ow + 3) * g->sw + kw];
        }
        for (; ow < g->OW; ow++) a0 += ld8(dr + ow * ls) * xr[ow * g->sw + kw];
        v8 a = (a0 + a1) + (a2 + a3);
        int64_t t = (c * g->KH + kh) * g->KW + kw;
        for (int j = 0; j < nk; j++) acc[(k0 + j) * g->taps + t] += a[j];
      }
    }
}

/* Image n: its padded copy in xp, then every row of every group of 8
 * output channels. Where the 8 channels lie side by side (C8, C16, NHWC)
 * the gradient is read in place; otherwise (plain, or fewer than 8 left)
 * it is gathered a row at a time into rbuf ([OW][8], zeros past K). */
static void image(const thin *g, const ct_tensor *x, const ct_tensor *dy, int64_t n, float *xp, float *rbuf,
                  double *acc) {
  pad_image(g, x, n, xp);
  const float *ds = dy->data;
  const int bf = dy->dtype == CT_BF16; /* then plain: gathered */
  cpu_act_strides a = cpu_act_strides_of(dy);
  for (int64_t k0 = 0; k0 < g->K; k0 += 8) {
    int nk = g->K - k0 < 8 ? (int)(g->K - k0) : 8;
    /* The channels' first elements, fixed per group (the layout
     * arithmetic, with its divisions, once per group rather than per
     * element). */
    int64_t dc[8];
    for (int j = 0; j < nk; j++) dc[j] = cpu_act_chan(&a, n, k0 + j);
    for (int64_t oh = 0; oh < g->OH; oh++) {
      if (a.sc == 1 && nk == 8 && !bf) { /* C8, C16, NHWC: 8 channels side by side */
        row(g, ds + dc[0] + oh * a.sh, a.sw, oh, xp, acc, k0, nk);
        continue;
      }
      for (int j = 0; j < 8; j++) {
        const int64_t at = j < nk ? dc[j] + oh * a.sh : -1;
        if (at < 0)
          for (int64_t ow = 0; ow < g->OW; ow++) rbuf[ow * 8 + j] = 0.f;
        else if (bf)
          for (int64_t ow = 0; ow < g->OW; ow++) rbuf[ow * 8 + j] = elem(dy->data, CT_BF16, at + ow * a.sw);
        else
          for (int64_t ow = 0; ow < g->OW; ow++) rbuf[ow * 8 + j] = ds[at + ow * a.sw];
      }
      row(g, rbuf, 8, oh, xp, acc, k0, nk);
    }
  }
}

/* out[i] = beta * out[i] + v (v alone when beta is 0, so stale NaN does
 * not leak), computed in double and rounded to f32, then to bf16 for a
 * bf16 out: what the widening path gives. */
static void store_grad(const ct_tensor *t, int64_t i, double v, float beta) {
  float f = (float)(beta == 0.f ? v : beta * elem(t->data, t->dtype, i) + v);
  if (t->dtype == CT_BF16)
    ((uint16_t *)t->data)[i] = cpu_bf16_st(f);
  else
    ((float *)t->data)[i] = f;
}

ct_status cpu_conv_thin_wgrad(cpu_dev *cd, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *dy,
                              ct_tensor *dw, ct_tensor *db, float beta, const char *what) {
  thin g = thin_init(p, x, dw, dy);
  int nt = omp_get_max_threads();
  size_t img = (size_t)(g.C * g.Hp * g.Wp), accn = (size_t)(g.K * g.taps + g.K), rown = (size_t)g.OW * 8;

  cpu_entry *e = cpu_scratch_entry(cd, OP_CONV_THIN_SCRATCH);
  float *xp = e ? cpu_entry_tmp(e, 0, (size_t)nt * img * sizeof(float)) : NULL;
  double *acc = e ? cpu_entry_tmp(e, 1, (size_t)nt * accn * sizeof(double)) : NULL;
  float *rbuf = e ? cpu_entry_tmp(e, 2, (size_t)nt * rown * sizeof(float)) : NULL;
  if (!xp || !acc || !rbuf) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate its scratch", what);
  memset(xp, 0, (size_t)nt * img * sizeof(float));
  memset(acc, 0, (size_t)nt * accn * sizeof(double));

#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num();
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.N; n++)
      image(&g, x, dy, n, xp + (size_t)t * img, rbuf + (size_t)t * rown, acc + (size_t)t * accn);
  }
  for (int t = 1; t < nt; t++)
    for (size_t i = 0; i < accn; i++) acc[i] += acc[(size_t)t * accn + i];
  for (int64_t i = 0; i < g.K * g.taps; i++) store_grad(dw, i, acc[i], beta);
  for (int64_t i = 0; db && i < g.K; i++) store_grad(db, i, acc[g.K * g.taps + i], beta);
  return CT_OK;
}

/* ---- Forward: large kernels on few channels ------------------------------
 * oneDNN 2.6 on AVX2 runs AlexNet's first convolution (3 -> 64, 11x11,
 * stride 4) as im2col + GEMM image by image, each GEMM on both threads.
 * The same scheme with whole images per thread (one single-threaded GEMM
 * each, 64 x 3025 x 363) and an im2col from a zero-padded copy (no bounds
 * tests) took far less (docs/ARCHITECTURE.md, "Large kernels on few
 * channels, forward"). ResNet's 7x7 stem (3 channels) was a wash, so
 * the kernel must be larger than 7x7. */
#define THIN_FWD_MAX_C 4
#define THIN_FWD_MIN_TAPS 50

int cpu_conv_thin_fwd_ok(const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w, const ct_tensor *y,
                         ct_act act) {
  return thin_shapes(p, x, w, y) && x->dtype == CT_F32 && w->dtype == CT_F32 && y->dtype == CT_F32 &&
         (act == CT_ACT_NONE || act == CT_ACT_RELU) && x->shape[1] <= THIN_FWD_MAX_C &&
         w->shape[2] * w->shape[3] >= THIN_FWD_MIN_TAPS;
}

ct_status cpu_conv_thin_fwd(cpu_dev *cd, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w,
                            const ct_tensor *b, ct_act act, ct_tensor *y, const char *what) {
  thin g = thin_init(p, x, w, y);
  int64_t P = g.OH * g.OW;
  int nt = omp_get_max_threads(), plain = y->layout == CT_LAYOUT_PLAIN;
  size_t img = (size_t)(g.C * g.Hp * g.Wp), coln = (size_t)(g.taps * P), outn = plain ? 0 : (size_t)(g.K * P);
  cpu_entry *e = cpu_scratch_entry(cd, OP_CONV_THIN_FWD_SCRATCH);
  float *xp = e ? cpu_entry_tmp(e, 0, (size_t)nt * img * sizeof(float)) : NULL;
  float *col = e ? cpu_entry_tmp(e, 1, (size_t)nt * coln * sizeof(float)) : NULL;
  float *ob = e ? cpu_entry_tmp(e, 2, (size_t)nt * (outn ? outn : 1) * sizeof(float)) : NULL;
  if (!xp || !col || !ob) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate its scratch", what);
  memset(xp, 0, (size_t)nt * img * sizeof(float));
  const float *ws = w->data, *bias = b ? b->data : NULL;
  float *ys = y->data;
  cpu_act_strides ay = cpu_act_strides_of(y);
  int relu = act == CT_ACT_RELU;
  dnnl_status_t bad = dnnl_success;
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num();
    float *xpt = xp + (size_t)t * img, *ct = col + (size_t)t * coln;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.N; n++) {
      pad_image(&g, x, n, xpt);
      /* col[(c, kh, kw)][(oh, ow)]: the GEMM's right-hand side. */
      for (int64_t r = 0; r < g.taps; r++) {
        int64_t c = r / (g.KH * g.KW), kh = r / g.KW % g.KH, kw = r % g.KW;
        float *cr = ct + r * P;
        for (int64_t oh = 0; oh < g.OH; oh++) {
          const float *xr = xpt + (c * g.Hp + oh * g.sh + kh) * g.Wp + kw;
          for (int64_t ow = 0; ow < g.OW; ow++) cr[oh * g.OW + ow] = xr[ow * g.sw];
        }
      }
      /* y_n[K][P] = W[K][taps] x col: in place when y is plain. */
      float *yn = plain ? ys + n * g.K * P : ob + (size_t)t * outn;
      dnnl_status_t st = dnnl_sgemm('N', 'N', g.K, P, g.taps, 1.f, ws, g.taps, ct, P, 0.f, yn, P);
      if (st != dnnl_success) {
#pragma omp critical
        bad = st;
      }
      /* Bias and ReLU on the way into y's layout (in place when plain). */
      for (int64_t k = 0; k < g.K; k++) {
        float bk = bias ? bias[k] : 0.f, *dst = ys + cpu_act_chan(&ay, n, k);
        for (int64_t i = 0; i < P; i++) {
          float v = yn[k * P + i] + bk;
          dst[i * ay.sw] = relu && v < 0.f ? 0.f : v; /* NaN stays, as torch.relu */
        }
      }
    }
  }
  if (bad != dnnl_success) return cpu_dnnl_error(bad, what, "dnnl_sgemm");
  return CT_OK;
}
