/* Batch normalisation over dim 1 of [N,C], [N,C,L] or [N,C,H,W], as two
 * OpenMP passes per direction (statistics, then the elementwise map) with
 * double accumulation: f32 for plain tensors, f32 or bf16 for the layouts
 * the executor keeps between layers (src/plan/layout.h). Other cases go to
 * the reference (bf16 plain tensors through its widening path).
 *
 * Why not oneDNN: for plain NCHW oneDNN 2.6 picks its generic `ncsp_bnorm`,
 * which measured an order of magnitude slower here than these loops.
 *
 * Plain tensors are walked a channel at a time. Channel-blocked
 * (CT_LAYOUT_C16, [N][C/16][HW][16]; CT_LAYOUT_C8 likewise by 8) and
 * channels-last (CT_LAYOUT_NHWC, [N][HW][C]) tensors are walked a block of
 * 16 (C8: 8) channels at a time, the channel as the vector lane: all are
 * "16 or 8 (or, for NHWC's last block, fewer) adjacent channels at a fixed
 * pixel stride", so one set of loops (cpu_bnorm_blocked.inc) serves them. There a partial sum over one image
 * runs in order along its lane rather than as a 16-way tree, so it
 * accumulates in double: in float, the sequential sums made ResNet-50's
 * gradients less accurate against PyTorch. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"

static void dims3(const ct_tensor *x, int64_t *n, int64_t *c, int64_t *hw) {
  *n = x->shape[0];
  *c = x->shape[1];
  *hw = 1;
  for (int i = 2; i < x->ndim; i++) *hw *= x->shape[i];
}

/* Statistics and running averages of channel c from its double sums.
 * *mean and *invstd come out rounded to f32, as saved: the forward
 * normalises with those, so that batchnorm_apply from the saved pair
 * gives its bits again. */
static void bn_stats(int64_t c, double shift, double s, double ss, double cnt, float eps, float momentum, float *sm,
                     float *si, float *rm, float *rv, double *mean, double *invstd) {
  double m = s / cnt;
  double var = ss / cnt - m * m;
  if (var < 0) var = 0;
  *mean = (float)(shift + m);
  *invstd = (float)(1.0 / sqrt(var + eps));
  if (sm) sm[c] = (float)*mean;
  if (si) si[c] = (float)*invstd;
  if (rm) rm[c] = (1.f - momentum) * rm[c] + momentum * (float)*mean;
  if (rv) rv[c] = (1.f - momentum) * rv[c] + momentum * (float)(var * cnt / (cnt - 1));
}

/* Where block cb of image n starts (n * img + cb * blk), the stride from
 * one pixel to the next (pix), the channels a block holds (bw, the last
 * NHWC block fewer) and the number of blocks (CB). */
typedef struct bn_geom {
  int64_t N, C, HW, CB, img, blk, pix, bw;
} bn_geom;

static bn_geom blocked_geom(const ct_tensor *x) {
  bn_geom g;
  dims3(x, &g.N, &g.C, &g.HW);
  g.bw = x->layout == CT_LAYOUT_C8 ? 8 : 16;
  g.CB = (g.C + g.bw - 1) / g.bw;
  if (x->layout == CT_LAYOUT_NHWC) {
    g.img = g.HW * g.C, g.blk = 16, g.pix = g.C;
  } else { /* C16, C8 */
    g.img = g.C * g.HW, g.blk = g.bw * g.HW, g.pix = g.bw;
  }
  return g;
}

static inline int bn_width(const bn_geom *g, int64_t cb) {
  return g->C - cb * g->bw < g->bw ? (int)(g->C - cb * g->bw) : (int)g->bw;
}

/* Where a forward takes its statistics: the batch's (training), the
 * running pair (eval), or a training forward's saved pair (apply). */
enum { BN_EVAL = 0, BN_TRAIN = 1, BN_SAVED = 2 };

/* The per-channel f32 vectors of one call (any may be NULL where the op
 * allows). */
typedef struct bn_args {
  const float *G, *B, *M, *I;
  float *rm, *rv, *sm, *si, *DG, *DB;
  float momentum, eps, beta_acc;
} bn_args;

#define T float
#define LD(p, i) ((p)[i])
#define ST(p, i, v) ((p)[i] = (v))
#define FN(name) name##_f32
#include "backend/cpu/cpu_bnorm_blocked.inc"
#undef T
#undef LD
#undef ST
#undef FN
#define T uint16_t
#define LD(p, i) cpu_bf16_ld((p)[i])
#define ST(p, i, v) ((p)[i] = cpu_bf16_st(v))
#define FN(name) name##_bf16
#include "backend/cpu/cpu_bnorm_blocked.inc"
#undef T
#undef LD
#undef ST
#undef FN

static const void *data_of(const ct_tensor *t) { return t ? t->data : NULL; }

/* Whether the blocked loops take this call: x and the other activations
 * (NULL-terminated) share a non-plain layout and the dtype f32 or bf16, and
 * every per-channel vector is f32. */
static int blocked_ok(const ct_tensor *x, const ct_tensor *const *acts, const ct_tensor *const *vecs, int nvec) {
  if (x->layout == CT_LAYOUT_PLAIN || x->ndim != 4 || (x->dtype != CT_F32 && x->dtype != CT_BF16)) return 0;
  if (x->layout != CT_LAYOUT_NHWC && (x->layout != CT_LAYOUT_C16 || x->shape[1] % 16) &&
      (x->layout != CT_LAYOUT_C8 || x->shape[1] % 8))
    return 0;
  for (; *acts; acts++)
    if ((*acts)->layout != x->layout || (*acts)->dtype != x->dtype) return 0;
  for (int i = 0; i < nvec; i++)
    if (vecs[i] && vecs[i]->dtype != CT_F32) return 0;
  return 1;
}

/* The forward's map in mode BN_TRAIN / BN_EVAL / BN_SAVED (then
 * save_mean and save_invstd are read) on the layouts and dtypes these
 * loops take (blocked: blocked_ok; else plain f32); the callers check
 * the rest. */
static ct_status bn_forward(ct_device *d, int mode, int blocked, const ct_tensor *x, const ct_tensor *gamma,
                            const ct_tensor *beta, ct_tensor *running_mean, ct_tensor *running_var, float momentum,
                            float eps, ct_tensor *y, const ct_tensor *save_mean, const ct_tensor *save_invstd) {
  int64_t N, C, HW;
  dims3(x, &N, &C, &HW);
  float *sm = mode == BN_TRAIN && save_mean ? save_mean->data : NULL;
  float *si = mode == BN_TRAIN && save_invstd ? save_invstd->data : NULL;
  const float *SM = mode == BN_SAVED ? save_mean->data : NULL, *SI = mode == BN_SAVED ? save_invstd->data : NULL;
  if (blocked) {
    const bn_geom g = blocked_geom(x);
    const bn_args a = {.G = data_of(gamma), .B = data_of(beta), .M = SM, .I = SI,
                       .rm = running_mean ? running_mean->data : NULL, .rv = running_var ? running_var->data : NULL,
                       .sm = sm, .si = si, .momentum = momentum, .eps = eps};
    int prev = cpu_op_begin(d);
    if (x->dtype == CT_F32)
      bn_fwd_blocked_f32(&g, mode, x->data, y->data, &a);
    else
      bn_fwd_blocked_bf16(&g, mode, x->data, y->data, &a);
    cpu_op_end(d, prev);
    return CT_OK;
  }
  if (x->layout != CT_LAYOUT_PLAIN || y->layout != CT_LAYOUT_PLAIN)
    return ct_error(CT_ERR_UNSUPPORTED,
                    "batchnorm_%s: x and y must share a layout (C16 / C8: 4-D, channels a multiple of 16 / 8; C16, C8 "
                    "and NHWC: f32 or bf16 activations with f32 statistics)",
                    mode == BN_SAVED ? "apply" : "fwd");
  const float *X = x->data, *G = gamma ? gamma->data : NULL, *B = beta ? beta->data : NULL;
  float *Y = y->data, *rm = running_mean ? running_mean->data : NULL, *rv = running_var ? running_var->data : NULL;
  int prev = cpu_op_begin(d);
  const double cnt = (double)(N * HW);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; c++) {
    double mean, invstd;
    if (mode == BN_TRAIN) {
      /* Shifted sums (by the first value) keep the variance accurate when
       * the mean is large relative to the spread. */
      const double shift = X[c * HW];
      double s = 0, ss = 0;
      for (int64_t n = 0; n < N; n++) {
        const float *p = X + (n * C + c) * HW;
        float fs = 0, fss = 0;
#pragma omp simd reduction(+ : fs, fss)
        for (int64_t i = 0; i < HW; i++) {
          float v = p[i] - (float)shift;
          fs += v;
          fss += v * v;
        }
        s += fs;
        ss += fss;
      }
      bn_stats(c, shift, s, ss, cnt, eps, momentum, sm, si, rm, rv, &mean, &invstd);
    } else if (mode == BN_SAVED) {
      mean = SM[c], invstd = SI[c];
    } else {
      mean = rm[c];
      invstd = 1.0 / sqrt((double)rv[c] + eps);
    }
    const float a = (float)(invstd * (G ? G[c] : 1.0)), b = (float)((B ? B[c] : 0.0) - mean * invstd * (G ? G[c] : 1.0));
    for (int64_t n = 0; n < N; n++) {
      const float *p = X + (n * C + c) * HW;
      float *q = Y + (n * C + c) * HW;
#pragma omp simd
      for (int64_t i = 0; i < HW; i++) q[i] = a * p[i] + b;
    }
  }
  cpu_op_end(d, prev);
  return CT_OK;
}

ct_status cpu_batchnorm_fwd(ct_device *d, int training, const ct_tensor *x, const ct_tensor *gamma,
                            const ct_tensor *beta, ct_tensor *running_mean, ct_tensor *running_var, float momentum,
                            float eps, ct_tensor *y, ct_tensor *save_mean, ct_tensor *save_invstd) {
  const ct_tensor *acts[] = {y, NULL};
  const ct_tensor *vecs[] = {gamma, beta, running_mean, running_var, save_mean, save_invstd};
  const int blocked = blocked_ok(x, acts, vecs, 6);
  if (!blocked && (x->dtype != CT_F32 || y->dtype != CT_F32 || x->ndim < 2)) {
    CT_TRY(cpu_need_plain(x, y, "batchnorm_fwd"));
    return ct_ref_backend()->batchnorm_fwd(d, training, x, gamma, beta, running_mean, running_var, momentum, eps, y,
                                           save_mean, save_invstd);
  }
  if (!training && (!running_mean || !running_var))
    return ct_error(CT_ERR_INVALID_ARG, "batchnorm_fwd: eval mode needs running_mean and running_var");
  int64_t N, C, HW;
  dims3(x, &N, &C, &HW);
  if (training && N * HW < 2)
    return ct_error(CT_ERR_INVALID_ARG, "batchnorm_fwd: expected more than 1 value per channel when training, got input %lldx%lld",
                    (long long)N, (long long)C);
  return bn_forward(d, training ? BN_TRAIN : BN_EVAL, blocked, x, gamma, beta, running_mean, running_var, momentum, eps,
                    y, save_mean, save_invstd);
}

ct_status cpu_batchnorm_apply(ct_device *d, const ct_tensor *x, const ct_tensor *gamma, const ct_tensor *beta,
                              const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_act act, float alpha,
                              ct_tensor *y) {
  if (!save_mean || !save_invstd)
    return ct_error(CT_ERR_INVALID_ARG, "batchnorm_apply: save_mean and save_invstd from the training forward are required");
  const ct_tensor *acts[] = {y, NULL};
  const ct_tensor *vecs[] = {gamma, beta, save_mean, save_invstd};
  const int blocked = blocked_ok(x, acts, vecs, 4);
  if (!blocked && (x->dtype != CT_F32 || y->dtype != CT_F32 || save_mean->dtype != CT_F32 ||
                   save_invstd->dtype != CT_F32 || x->ndim < 2)) {
    CT_TRY(cpu_need_plain(x, y, "batchnorm_apply"));
    return ct_ref_backend()->batchnorm_apply(d, x, gamma, beta, save_mean, save_invstd, act, alpha, y);
  }
  CT_TRY(bn_forward(d, BN_SAVED, blocked, x, gamma, beta, NULL, NULL, 0.f, 0.f, y, save_mean, save_invstd));
  return act == CT_ACT_NONE ? CT_OK : cpu_act_fwd(d, act, alpha, y, y);
}

ct_status cpu_batchnorm_bwd(ct_device *d, const ct_tensor *x, const ct_tensor *dy, const ct_tensor *gamma,
                            const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_tensor *dx, ct_tensor *dgamma,
                            ct_tensor *dbeta, float beta_acc) {
  const ct_tensor *acts[] = {dy, dx ? dx : dy, NULL};
  const ct_tensor *vecs[] = {gamma, save_mean, save_invstd, dgamma, dbeta};
  const int blocked = save_mean && save_invstd && blocked_ok(x, acts, vecs, 5);
  if (!blocked && (x->dtype != CT_F32 || dy->dtype != CT_F32 || (dx && dx->dtype != CT_F32) || x->ndim < 2)) {
    CT_TRY(cpu_need_plain(x, dy, "batchnorm_bwd"));
    return ct_ref_backend()->batchnorm_bwd(d, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, beta_acc);
  }
  if (blocked) {
    const bn_geom g = blocked_geom(x);
    const bn_args a = {.G = data_of(gamma), .M = save_mean->data, .I = save_invstd->data,
                       .DG = dgamma ? dgamma->data : NULL, .DB = dbeta ? dbeta->data : NULL, .beta_acc = beta_acc};
    int prev = cpu_op_begin(d);
    if (x->dtype == CT_F32)
      bn_bwd_blocked_f32(&g, x->data, dy->data, dx ? dx->data : NULL, &a);
    else
      bn_bwd_blocked_bf16(&g, x->data, dy->data, dx ? dx->data : NULL, &a);
    cpu_op_end(d, prev);
    return CT_OK;
  }
  if (x->layout != CT_LAYOUT_PLAIN || dy->layout != CT_LAYOUT_PLAIN || (dx && dx->layout != CT_LAYOUT_PLAIN))
    return ct_error(CT_ERR_UNSUPPORTED,
                    "batchnorm_bwd: x, dy and dx must share a layout (C16 / C8: 4-D, channels a multiple of 16 / 8; "
                    "C16, C8 and NHWC: f32 or bf16 activations with f32 statistics)");
  int64_t N, C, HW;
  dims3(x, &N, &C, &HW);
  const float *X = x->data, *DY = dy->data, *G = gamma ? gamma->data : NULL;
  const float *M = save_mean->data, *I = save_invstd->data;
  float *DX = dx ? dx->data : NULL, *DG = dgamma ? dgamma->data : NULL, *DB = dbeta ? dbeta->data : NULL;
  int prev = cpu_op_begin(d);
  const double cnt = (double)(N * HW);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; c++) {
    const float m = M[c], inv = I[c];
    double sdy = 0, sdyx = 0; /* sum(dy), sum(dy * xhat) */
    for (int64_t n = 0; n < N; n++) {
      const float *p = X + (n * C + c) * HW, *g = DY + (n * C + c) * HW;
      float a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
      for (int64_t i = 0; i < HW; i++) {
        a += g[i];
        b += g[i] * (p[i] - m);
      }
      sdy += a;
      sdyx += b;
    }
    sdyx *= inv;
    /* beta 0 overwrites: a stale NaN in the gradient does not leak in */
    if (DG) DG[c] = (float)(beta_acc != 0.f ? beta_acc * DG[c] + sdyx : sdyx);
    if (DB) DB[c] = (float)(beta_acc != 0.f ? beta_acc * DB[c] + sdy : sdy);
    /* dx = gamma*invstd * (dy - mean(dy) - xhat * mean(dy*xhat)) */
    const float k = (float)((G ? G[c] : 1.0) * inv);
    const float mdy = (float)(sdy / cnt), mdyx = (float)(sdyx / cnt);
    for (int64_t n = 0; DX && n < N; n++) {
      const float *p = X + (n * C + c) * HW, *g = DY + (n * C + c) * HW;
      float *q = DX + (n * C + c) * HW;
#pragma omp simd
      for (int64_t i = 0; i < HW; i++) q[i] = k * (g[i] - mdy - (p[i] - m) * inv * mdyx);
    }
  }
  cpu_op_end(d, prev);
  return CT_OK;
}
