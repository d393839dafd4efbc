/* Convolutions on small output maps as one batched GEMM (im2col over the
 * whole batch, then dnnl_sgemm), for f32, groups 1, any activation layout.
 *
 * Why: oneDNN's direct kernels vectorise along the output row, and on maps
 * of a few positions (ResNet-18 at 32x32 ends in 2x2 and 1x1 maps) their
 * register blocking is mostly idle; on AVX2 its backward weights for a
 * 3x3 convolution on a 2x2 map even falls back to im2col + GEMM image by
 * image, GEMMs of 4 rows, several times slower than the same FLOPs as one
 * GEMM with M = batch x positions (docs/ARCHITECTURE.md, "Small output
 * maps as one GEMM"). Here the GEMM's rows are every output position of
 * the batch, so M is large however small the map is.
 * cpu_conv_gemm_ok leaves to oneDNN what it measured as fast or faster:
 * 1x1 convolutions, and the backward data of stride-1 uncropped ones.
 *
 * The columns follow the weights' OIHW order (channel, then the kept taps),
 * so uncropped weights are used as they lie; taps that read only padding
 * (cpu_conv_used_taps) are left out of the columns and the weights are
 * packed without them. Buffers come from one per-device scratch entry of
 * the primitive cache, grown to the largest shape seen. */
#include "backend/cpu/cpu_conv.h"
#include "backend/cpu/cpu_impl.h"

enum { OP_CONV_GEMM_SCRATCH = 150 };
enum { TMP_COL, TMP_OUT, TMP_W };

static int gemm_on = 1;
void cpu_conv_set_gemm(int on) { gemm_on = on; }

/* Output positions per image up to which the GEMM path is taken: where
 * oneDNN's direct kernels were measured slower (see the header). */
#define GEMM_MAX_POSITIONS 4
/* Bound on the column matrix, so a huge batch keeps oneDNN's path. */
#define GEMM_MAX_COL_BYTES ((size_t)64 << 20)

/* The shape of one convolution as the GEMMs see it. */
typedef struct gg {
  int64_t N, C, H, W, K, OH, OW, KH, KW;
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t th0, th1, tw0, tw1; /* kept taps, inclusive */
  int64_t taps, M, Ck;        /* kept taps, rows, columns */
} gg;

static void gg_init(gg *g, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w, const ct_tensor *y) {
  g->N = x->shape[0], g->C = x->shape[1], g->H = x->shape[2], g->W = x->shape[3];
  g->K = y->shape[1], g->OH = y->shape[2], g->OW = y->shape[3], g->KH = w->shape[2], g->KW = w->shape[3];
  g->sh = p->stride_h, g->sw = p->stride_w, g->ph = p->pad_h, g->pw = p->pad_w;
  g->dh = p->dil_h > 0 ? p->dil_h : 1, g->dw = p->dil_w > 0 ? p->dil_w : 1;
  cpu_conv_used_taps(g->H, g->OH, g->KH, g->sh, g->ph, g->dh, &g->th0, &g->th1);
  cpu_conv_used_taps(g->W, g->OW, g->KW, g->sw, g->pw, g->dw, &g->tw0, &g->tw1);
  g->taps = (g->th1 - g->th0 + 1) * (g->tw1 - g->tw0 + 1);
  g->M = g->N * g->OH * g->OW;
  g->Ck = g->C * g->taps;
}

static int is_f32(const ct_tensor *t) { return !t || t->dtype == CT_F32; }

int cpu_conv_gemm_ok(const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w, const ct_tensor *y,
                     ct_act act, int bwd_data) {
  if (!gemm_on || (p->groups > 1) || !is_f32(x) || !is_f32(w) || !is_f32(y)) return 0;
  if (act != CT_ACT_NONE && act != CT_ACT_RELU) return 0;
  if (x->ndim != 4 || y->ndim != 4 || w->ndim != 4 || w->layout != CT_LAYOUT_PLAIN) return 0;
  if (y->shape[2] * y->shape[3] > GEMM_MAX_POSITIONS) return 0;
  gg g;
  gg_init(&g, p, x, w, y);
  /* One tap (a 1x1 kernel, or one cropped to its centre) is a 1x1
   * convolution, which oneDNN's jit_1x1 kernels do as fast; no tap
   * reading data is left to oneDNN too. */
  if (g.th0 > g.th1 || g.tw0 > g.tw1 || g.taps == 1) return 0;
  /* Backward data with stride 1 and every tap kept (a 3x3 convolution on
   * a 2x2 map) was faster in oneDNN's direct kernel than the GEMM and the
   * scatter back. */
  if (bwd_data && g.sh == 1 && g.sw == 1 && g.taps == g.KH * g.KW) return 0;
  return (size_t)g.M * (size_t)g.Ck * sizeof(float) <= GEMM_MAX_COL_BYTES;
}

/* For output position o (oh*OW + ow) and kept tap t, the offset of the
 * input element it reads within one channel plane, or -1 for padding. */
static void tap_offsets(const gg *g, const cpu_act_strides *a, int64_t *off) {
  int64_t nkw = g->tw1 - g->tw0 + 1;
  for (int64_t oh = 0; oh < g->OH; oh++)
    for (int64_t ow = 0; ow < g->OW; ow++)
      for (int64_t t = 0; t < g->taps; t++) {
        int64_t ih = oh * g->sh - g->ph + (g->th0 + t / nkw) * g->dh;
        int64_t iw = ow * g->sw - g->pw + (g->tw0 + t % nkw) * g->dw;
        int inb = ih >= 0 && ih < g->H && iw >= 0 && iw < g->W;
        off[(oh * g->OW + ow) * g->taps + t] = inb ? ih * a->sh + iw * a->sw : -1;
      }
}

/* col[m][c*taps + t] = the input element output row m reads at (c, t). */
static void im2col(const gg *g, const ct_tensor *x, const int64_t *off, float *col) {
  cpu_act_strides a = cpu_act_strides_of(x);
  const float *xs = x->data;
  int64_t P = g->OH * g->OW;
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < g->M; m++) {
    int64_t n = m / P, o = m % P;
    const int64_t *oo = off + o * g->taps;
    float *row = col + m * g->Ck;
    for (int64_t c = 0; c < g->C; c++) {
      const float *xc = xs + cpu_act_chan(&a, n, c);
      for (int64_t t = 0; t < g->taps; t++) row[c * g->taps + t] = oo[t] >= 0 ? xc[oo[t]] : 0.f;
    }
  }
}

/* dx = the column gradients summed back onto the input (overwrites dx).
 * One image per iteration, so no two threads write the same element. */
static void col2im(const gg *g, const float *dcol, const int64_t *off, ct_tensor *dx) {
  cpu_act_strides a = cpu_act_strides_of(dx);
  float *xs = dx->data;
  int64_t P = g->OH * g->OW;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < g->N; n++) {
    for (int64_t c = 0; c < g->C; c++) {
      float *xc = xs + cpu_act_chan(&a, n, c);
      for (int64_t h = 0; h < g->H; h++)
        for (int64_t w = 0; w < g->W; w++) xc[h * a.sh + w * a.sw] = 0.f;
      for (int64_t o = 0; o < P; o++) {
        const int64_t *oo = off + o * g->taps;
        const float *row = dcol + (n * P + o) * g->Ck + c * g->taps;
        for (int64_t t = 0; t < g->taps; t++)
          if (oo[t] >= 0) xc[oo[t]] += row[t];
      }
    }
  }
}

/* dyg[m][k] = dy at output row m, channel k. */
static void gather_rows(const gg *g, const ct_tensor *dy, float *dyg) {
  cpu_act_strides a = cpu_act_strides_of(dy);
  const float *ds = dy->data;
  int64_t P = g->OH * g->OW;
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < g->M; m++) {
    int64_t n = m / P, o = m % P, oh = o / g->OW, ow = o % g->OW;
    for (int64_t k = 0; k < g->K; k++) dyg[m * g->K + k] = ds[cpu_act_chan(&a, n, k) + oh * a.sh + ow * a.sw];
  }
}

/* The kept taps of the OIHW weights as a [K][Ck] matrix, or the weights
 * themselves when nothing is cropped. */
static const float *packed_weights(const gg *g, const float *w, float *buf) {
  if (g->taps == g->KH * g->KW) return w;
  int64_t nkw = g->tw1 - g->tw0 + 1;
#pragma omp parallel for schedule(static)
  for (int64_t kc = 0; kc < g->K * g->C; kc++)
    for (int64_t t = 0; t < g->taps; t++)
      buf[kc * g->taps + t] = w[(kc * g->KH + g->th0 + t / nkw) * g->KW + g->tw0 + t % nkw];
  return buf;
}

/* The per-device scratch entry, its buffers grown to the sizes asked. */
static ct_status scratch(cpu_dev *cd, const size_t bytes[3], float *buf[3], const char *what) {
  cpu_entry *e = cpu_scratch_entry(cd, OP_CONV_GEMM_SCRATCH);
  if (!e) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate the GEMM scratch", what);
  for (int i = 0; i < 3; i++)
    if (!(buf[i] = cpu_entry_tmp(e, i, bytes[i] ? bytes[i] : 1)))
      return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of GEMM scratch", what, bytes[i]);
  return CT_OK;
}

/* Shape, scratch and tap offsets (into the layout of `in`, the input or
 * its gradient) shared by the three directions. */
static ct_status prepare(cpu_dev *cd, gg *g, const ct_conv2d_params *p, const ct_tensor *in, const ct_tensor *w,
                         const ct_tensor *out, float *buf[3], int64_t **off, const char *what) {
  gg_init(g, p, in, w, out);
  size_t bytes[3] = {(size_t)(g->M * g->Ck) * 4, (size_t)(g->M * g->K) * 4 + (size_t)(g->OH * g->OW * g->taps) * 8,
                     (size_t)(g->K * g->Ck) * 4};
  CT_TRY(scratch(cd, bytes, buf, what));
  *off = (int64_t *)(buf[TMP_OUT] + g->M * g->K);
  cpu_act_strides a = cpu_act_strides_of(in);
  tap_offsets(g, &a, *off);
  return CT_OK;
}

static ct_status sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                       int64_t ldb, float *C, const char *what) {
  CPU_DNNL(dnnl_sgemm(ta, tb, M, N, K, 1.f, A, lda, B, ldb, 0.f, C, N), what);
  return CT_OK;
}

ct_status cpu_conv_gemm_fwd(cpu_dev *cd, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w,
                            const ct_tensor *b, ct_act act, ct_tensor *y, const char *what) {
  gg g;
  float *buf[3];
  int64_t *off;
  CT_TRY(prepare(cd, &g, p, x, w, y, buf, &off, what));
  float *col = buf[TMP_COL], *out = buf[TMP_OUT];
  cpu_act_strides ay = cpu_act_strides_of(y);
  im2col(&g, x, off, col);
  const float *wk = packed_weights(&g, w->data, buf[TMP_W]);
  CT_TRY(sgemm('N', 'T', g.M, g.K, g.Ck, col, g.Ck, wk, g.Ck, out, what));
  const float *bias = b ? b->data : NULL;
  float *ys = y->data;
  int64_t P = g.OH * g.OW;
  int relu = act == CT_ACT_RELU;
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < g.M; m++) {
    int64_t n = m / P, o = m % P, ypos = o / g.OW * ay.sh + o % g.OW * ay.sw;
    for (int64_t k = 0; k < g.K; k++) {
      float v = out[m * g.K + k] + (bias ? bias[k] : 0.f);
      ys[cpu_act_chan(&ay, n, k) + ypos] = relu && v < 0.f ? 0.f : v; /* NaN stays, as torch.relu */
    }
  }
  return CT_OK;
}

ct_status cpu_conv_gemm_bwd_data(cpu_dev *cd, const ct_conv2d_params *p, const ct_tensor *dy, const ct_tensor *w,
                                 ct_tensor *dx, const char *what) {
  gg g;
  float *buf[3];
  int64_t *off;
  CT_TRY(prepare(cd, &g, p, dx, w, dy, buf, &off, what));
  float *dcol = buf[TMP_COL], *dyg = buf[TMP_OUT];
  gather_rows(&g, dy, dyg);
  const float *wk = packed_weights(&g, w->data, buf[TMP_W]);
  CT_TRY(sgemm('N', 'N', g.M, g.Ck, g.K, dyg, g.K, wk, g.Ck, dcol, what));
  col2im(&g, dcol, off, dx);
  return CT_OK;
}

ct_status cpu_conv_gemm_bwd_weights(cpu_dev *cd, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *dy,
                                    ct_tensor *dw, ct_tensor *db, float beta, const char *what) {
  gg g;
  float *buf[3];
  int64_t *off;
  CT_TRY(prepare(cd, &g, p, x, dw, dy, buf, &off, what));
  float *col = buf[TMP_COL], *dyg = buf[TMP_OUT], *dwk = buf[TMP_W];
  im2col(&g, x, off, col);
  gather_rows(&g, dy, dyg);
  CT_TRY(sgemm('T', 'N', g.K, g.Ck, g.M, dyg, g.K, col, g.Ck, dwk, what));
  /* Into the full OIHW kernel: a dropped tap's gradient is zero, so it
   * keeps beta times its old value. */
  float *o = dw->data;
  int64_t nkw = g.tw1 - g.tw0 + 1;
  if (g.taps == g.KH * g.KW) {
    cpu_accumulate_f32(o, CT_F32, dwk, g.K * g.Ck, beta);
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t kc = 0; kc < g.K * g.C; kc++)
      for (int64_t kh = 0; kh < g.KH; kh++)
        for (int64_t kw = 0; kw < g.KW; kw++) {
          int kept = kh >= g.th0 && kh <= g.th1 && kw >= g.tw0 && kw <= g.tw1;
          float v = kept ? dwk[kc * g.taps + (kh - g.th0) * nkw + kw - g.tw0] : 0.f;
          float *d = &o[(kc * g.KH + kh) * g.KW + kw];
          *d = beta == 0.f ? v : beta * *d + v; /* beta 0 overwrites: stale NaN does not leak */
        }
  }
  if (db) {
    float *ob = db->data;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < g.K; k++) {
      float s = 0.f;
      for (int64_t m = 0; m < g.M; m++) s += dyg[m * g.K + k];
      ob[k] = beta == 0.f ? s : beta * ob[k] + s;
    }
  }
  return CT_OK;
}
