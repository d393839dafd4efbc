/* Reductions of the CUDA backend: batch norm's own kernels (two passes per
 * channel, as src/backend/cpu/cpu_bnorm.c and the reference; the fallback
 * of cuda_bnorm.c's cuDNN path), row softmax, the losses
 * (mean reduction, result in a 1-element device tensor) and the optimizer
 * reductions sumsq and nonfinite. Every sum is accumulated in double in a
 * fixed order (block tree, then one finishing block), so results do not
 * depend on scheduling. Statistics and partial sums go through the
 * device's scratch buffer.
 *
 * Targets (int64 or int32) live on the device and cannot be checked from
 * the host without a synchronisation; a class index outside [0, C) makes
 * that row's loss and gradient NaN instead of an error. */
#include "backend/cuda/cuda_common.cuh"
#include "math/fused_step.h"

#define STREAM(d) cuda_stream(d)
#define PARTIAL_BLOCKS 1024

__device__ __forceinline__ int64_t target_at(const void *t, int tt, int64_t i) {
  return tt == CT_I64 ? ((const int64_t *)t)[i] : (int64_t)((const int32_t *)t)[i];
}

/* ---- batch norm: the own kernels ----
 * cuda_bnorm.c runs batch norm on cuDNN and calls these for what cuDNN
 * refuses (non-f32 parameters or statistics, activations of different
 * dtypes, an epsilon below CUDNN_BN_MIN_EPSILON, more elements than cuDNN's int descriptors hold,
 * CUDNN_STATUS_NOT_SUPPORTED). Element (n, c, s) of x [N, C, S] is at
 * (n*C + c)*S + s in plain order and at (n*S + s)*C + c channels-last
 * (nhwc). One block per channel reads its channel with a stride of C in
 * NHWC, so a warp touches 32 different cache lines per load: poor
 * coalescing, acceptable for a fallback, not for the hot path. */

__device__ __forceinline__ int64_t bn_at(int nhwc, int64_t k, int64_t c, int64_t C, int64_t S) {
  if (nhwc) return k * C + c; /* k = n*S + s */
  int64_t n = k / S;
  return (n * C + c) * S + (k - n * S);
}

__device__ __forceinline__ int64_t bn_chan(int nhwc, int64_t e, int64_t C, int64_t S) {
  return nhwc ? e % C : (e / S) % C;
}

/* One block per channel: stats[c] = mean, stats[C + c] = invstd. */
__global__ void k_bn_stats(int training, int nhwc, const void *x, int xt, int64_t N, int64_t C, int64_t S, void *rm,
                           int rmt, void *rv, int rvt, double momentum, double eps, void *sm, int smt, void *si,
                           int sit, double *stats) {
  __shared__ double sh[CT_THREADS / 32];
  const int64_t c = blockIdx.x, cnt = N * S;
  double mean, invstd;
  if (training) {
    double s = 0;
    for (int64_t k = threadIdx.x; k < cnt; k += blockDim.x) s += ct_ld(x, xt, bn_at(nhwc, k, c, C, S));
    mean = ct_block_sum(s, sh) / (double)cnt;
    double ss = 0;
    for (int64_t k = threadIdx.x; k < cnt; k += blockDim.x) {
      double dv = ct_ld(x, xt, bn_at(nhwc, k, c, C, S)) - mean;
      ss += dv * dv;
    }
    double var = ct_block_sum(ss, sh) / (double)cnt;
    /* normalised with the statistics as saved (f32), as batchnorm_apply
     * does from them */
    mean = (float)mean;
    invstd = (float)(1.0 / sqrt(var + eps));
    if (threadIdx.x == 0) {
      if (sm) ct_st(sm, smt, c, (float)mean);
      if (si) ct_st(si, sit, c, (float)invstd);
      if (rm) ct_st(rm, rmt, c, (float)((1.0 - momentum) * ct_ld(rm, rmt, c) + momentum * mean));
      if (rv)
        ct_st(rv, rvt, c,
              (float)((1.0 - momentum) * ct_ld(rv, rvt, c) + momentum * var * (double)cnt / (double)(cnt - 1)));
    }
  } else {
    mean = ct_ld(rm, rmt, c);
    invstd = 1.0 / sqrt((double)ct_ld(rv, rvt, c) + eps);
  }
  if (threadIdx.x == 0) {
    stats[c] = mean;
    stats[C + c] = invstd;
  }
}

/* stats[c] = save_mean[c], stats[C + c] = save_invstd[c] (batchnorm_apply). */
__global__ void k_bn_saved_stats(const void *sm, int smt, const void *si, int sit, int64_t C, double *stats) {
  CT_GRID_STRIDE(c, C) {
    stats[c] = ct_ld(sm, smt, c);
    stats[C + c] = ct_ld(si, sit, c);
  }
}

/* y = act((x - mean) * invstd * gamma + beta) from stats, 8 elements a
 * step where vec (ct_vec_for); the channel of a group's first element
 * takes a division, the rest step through [C] (nhwc) or [C][S] by
 * counting. act NONE for the forward (the layer applies its own). */
__global__ void k_bn_apply(int nhwc, const void *x, int xt, int64_t n, int64_t C, int64_t S, const double *stats,
                           const void *gamma, int gt, const void *beta, int bt, int act, float alpha, void *y, int yt,
                           int vec) {
  ct_vec_for(n, vec, [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float v[W];
    ct_ldw<W>(x, xt, i, v);
    int64_t c, r = 0;
    if (nhwc) {
      c = i % C;
    } else {
      const int64_t q = i / S;
      c = q % C, r = i - q * S;
    }
    for (int k = 0; k < W; k++) {
      double g = gamma ? (double)ct_ld(gamma, gt, c) : 1.0, b = beta ? (double)ct_ld(beta, bt, c) : 0.0;
      v[k] = ct_act_dev(act, alpha, (float)(((double)v[k] - stats[c]) * stats[C + c] * g + b));
      if (nhwc) {
        if (++c == C) c = 0;
      } else if (++r == S) {
        r = 0;
        if (++c == C) c = 0;
      }
    }
    ct_stw<W>(y, yt, i, v);
  });
}

/* One block per channel: sums[c] = sum dy, sums[C + c] = sum dy * xhat. */
__global__ void k_bn_bwd_sums(int nhwc, const void *x, int xt, const void *dy, int dyt, int64_t N, int64_t C,
                              int64_t S, const void *sm, int smt, const void *si, int sit, void *dg, int dgt, void *db,
                              int dbt, float beta_acc, double *sums) {
  __shared__ double sh[CT_THREADS / 32];
  const int64_t c = blockIdx.x, cnt = N * S;
  const double mean = ct_ld(sm, smt, c), invstd = ct_ld(si, sit, c);
  double sdy = 0, sdyx = 0;
  for (int64_t k = threadIdx.x; k < cnt; k += blockDim.x) {
    int64_t e = bn_at(nhwc, k, c, C, S);
    double g = ct_ld(dy, dyt, e);
    sdy += g;
    sdyx += g * ((double)ct_ld(x, xt, e) - mean) * invstd;
  }
  sdy = ct_block_sum(sdy, sh);
  sdyx = ct_block_sum(sdyx, sh);
  if (threadIdx.x == 0) {
    sums[c] = sdy;
    sums[C + c] = sdyx;
    if (dg) ct_st(dg, dgt, c, (float)(beta_acc != 0.f ? (double)beta_acc * ct_ld(dg, dgt, c) + sdyx : sdyx));
    if (db) ct_st(db, dbt, c, (float)(beta_acc != 0.f ? (double)beta_acc * ct_ld(db, dbt, c) + sdy : sdy));
  }
}

__global__ void k_bn_bwd_dx(int nhwc, const void *x, int xt, const void *dy, int dyt, int64_t n, int64_t C, int64_t S,
                            double cnt, const void *sm, int smt, const void *si, int sit, const void *gamma, int gt,
                            const double *sums, void *dx, int dxt) {
  CT_GRID_STRIDE(k, n) {
    int64_t c = bn_chan(nhwc, k, C, S);
    double mean = ct_ld(sm, smt, c), invstd = ct_ld(si, sit, c), g = gamma ? (double)ct_ld(gamma, gt, c) : 1.0;
    double xhat = ((double)ct_ld(x, xt, k) - mean) * invstd;
    ct_st(dx, dxt, k, (float)(g * invstd * ((double)ct_ld(dy, dyt, k) - sums[c] / cnt - xhat * sums[C + c] / cnt)));
  }
}

#define TT(t) ((t) ? (t)->data : NULL), ((t) ? (int)(t)->dtype : 0)

/* The map of the forward and of batchnorm_apply from stats (scratch). */
static ct_status bn_apply(ct_device *d, int nhwc, int64_t N, int64_t C, int64_t S, const ct_tensor *x,
                          const ct_tensor *gamma, const ct_tensor *beta, const double *stats, ct_act act, float alpha,
                          ct_tensor *y, const char *what) {
  const int64_t n = N * C * S;
  const int vec = ct_vec_ok(x->data, y->data);
  k_bn_apply<<<ct_vec_blocks(n, vec), CT_THREADS, 0, STREAM(d)>>>(nhwc, x->data, x->dtype, n, C, S, stats, TT(gamma),
                                                                  TT(beta), (int)act, alpha, y->data, y->dtype, vec);
  CUDA_LAUNCHED(what);
  return CT_OK;
}

extern "C" ct_status cuda_bn_fwd_kernels(ct_device *d, int training, int nhwc, int64_t N, int64_t C, int64_t S,
                                         const ct_tensor *x, const ct_tensor *gamma, const ct_tensor *beta,
                                         ct_tensor *running_mean, ct_tensor *running_var, float momentum, float eps,
                                         ct_tensor *y, ct_tensor *save_mean, ct_tensor *save_invstd) {
  if (C > 0x7fffffff)
    return ct_error(CT_ERR_UNSUPPORTED, "cuda batchnorm_fwd: %lld channels exceed the grid", (long long)C);
  CT_TRY(cuda_enter(d));
  if (C == 0 || N == 0 || S == 0) return CT_OK;
  void *scr;
  CT_TRY(cuda_scratch(d, (size_t)C * 2 * sizeof(double), &scr));
  double *stats = (double *)scr;
  k_bn_stats<<<(unsigned)C, CT_THREADS, 0, STREAM(d)>>>(training, nhwc, x->data, x->dtype, N, C, S, TT(running_mean),
                                                        TT(running_var), (double)momentum, (double)eps,
                                                        TT(training ? save_mean : NULL),
                                                        TT(training ? save_invstd : NULL), stats);
  CUDA_LAUNCHED("batchnorm_fwd stats");
  return bn_apply(d, nhwc, N, C, S, x, gamma, beta, stats, CT_ACT_NONE, 0.f, y, "batchnorm_fwd apply");
}

extern "C" ct_status cuda_bn_apply_kernels(ct_device *d, int nhwc, int64_t N, int64_t C, int64_t S, const ct_tensor *x,
                                          const ct_tensor *gamma, const ct_tensor *beta, const ct_tensor *save_mean,
                                          const ct_tensor *save_invstd, ct_act act, float alpha, ct_tensor *y) {
  CT_TRY(cuda_enter(d));
  if (C == 0 || N == 0 || S == 0) return CT_OK;
  void *scr;
  CT_TRY(cuda_scratch(d, (size_t)C * 2 * sizeof(double), &scr));
  double *stats = (double *)scr;
  k_bn_saved_stats<<<ct_blocks(C), CT_THREADS, 0, STREAM(d)>>>(TT(save_mean), TT(save_invstd), C, stats);
  CUDA_LAUNCHED("batchnorm_apply stats");
  return bn_apply(d, nhwc, N, C, S, x, gamma, beta, stats, act, alpha, y, "batchnorm_apply");
}

extern "C" ct_status cuda_bn_bwd_kernels(ct_device *d, int nhwc, int64_t N, int64_t C, int64_t S, const ct_tensor *x,
                                         const ct_tensor *dy, const ct_tensor *gamma, const ct_tensor *save_mean,
                                         const ct_tensor *save_invstd, ct_tensor *dx, ct_tensor *dgamma,
                                         ct_tensor *dbeta, float beta_acc) {
  if (C > 0x7fffffff)
    return ct_error(CT_ERR_UNSUPPORTED, "cuda batchnorm_bwd: %lld channels exceed the grid", (long long)C);
  CT_TRY(cuda_enter(d));
  if (C == 0 || N == 0 || S == 0) return CT_OK;
  void *scr;
  CT_TRY(cuda_scratch(d, (size_t)C * 2 * sizeof(double), &scr));
  double *sums = (double *)scr;
  k_bn_bwd_sums<<<(unsigned)C, CT_THREADS, 0, STREAM(d)>>>(nhwc, x->data, x->dtype, dy->data, dy->dtype, N, C, S,
                                                           TT(save_mean), TT(save_invstd), TT(dgamma), TT(dbeta),
                                                           beta_acc, sums);
  CUDA_LAUNCHED("batchnorm_bwd sums");
  if (!dx) return CT_OK;
  int64_t n = N * C * S;
  k_bn_bwd_dx<<<ct_blocks(n), CT_THREADS, 0, STREAM(d)>>>(nhwc, x->data, x->dtype, dy->data, dy->dtype, n, C, S,
                                                          (double)(N * S), TT(save_mean), TT(save_invstd), TT(gamma),
                                                          sums, dx->data, dx->dtype);
  CUDA_LAUNCHED("batchnorm_bwd dx");
  return CT_OK;
}
#undef TT

/* ---- SyncBatchNorm's per-channel arithmetic (the contract in
 * backend_ops.def; the reference's arithmetic, one thread a channel) ---- */

__global__ void k_bn_sync_stats(int stage, double n, double momentum, double eps, int64_t C, float *m, float *is,
                                float *rm, float *rv, double *v) {
  int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c == 0 && stage == 0) v[C] = n;
  if (c >= C) return;
  if (stage == 0) {
    v[c] = n * m[c];
  } else if (stage == 1) {
    double N = v[C], var = 1.0 / ((double)is[c] * is[c]) - eps, dev = m[c] - v[c] / N;
    v[C + 1 + c] = v[c] / N;
    v[c] = n * ((var > 0 ? var : 0) + dev * dev);
  } else {
    double N = v[C], M = v[C + 1 + c], V = v[c] / N;
    m[c] = (float)M;
    is[c] = (float)(1.0 / sqrt(V + eps));
    if (rm) rm[c] = (float)((1 - momentum) * rm[c] + momentum * M);
    if (rv) rv[c] = (float)((1 - momentum) * rv[c] + momentum * V * (N > 1 ? N / (N - 1) : 1));
  }
}

__global__ void k_bn_sync_grads(int stage, double n, int64_t C, const float *g, const float *is, const float *dg,
                                const float *db, float *a, float *b, double *v) {
  int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c == 0 && stage == 0) v[2 * C] = n;
  if (c >= C) return;
  if (stage == 0) {
    double w = n > 0 ? 1.0 : 0.0;
    v[c] = w * db[c], v[C + c] = w * dg[c];
  } else {
    double N = v[2 * C], k = (g ? g[c] : 1.0) * is[c];
    a[c] = (float)(k * (db[c] / n - v[c] / N));
    b[c] = (float)(k * (dg[c] / n - v[C + c] / N));
  }
}

#define F32P(t) ((t) ? (float *)(t)->data : NULL)

extern "C" ct_status cuda_batchnorm_sync_stats(ct_device *d, int stage, double n, float momentum, float eps,
                                               ct_tensor *mean, ct_tensor *invstd, ct_tensor *running_mean,
                                               ct_tensor *running_var, double *vals) {
  CT_TRY(ct_bn_sync_stats_args("cuda", mean, invstd, running_mean, running_var));
  const int64_t C = ct_tensor_numel(mean);
  CT_TRY(cuda_enter(d));
  k_bn_sync_stats<<<ct_blocks(C + 1), CT_THREADS, 0, STREAM(d)>>>(stage, n, (double)momentum, (double)eps, C,
                                                                   F32P(mean), F32P(invstd), F32P(running_mean),
                                                                   F32P(running_var), vals);
  CUDA_LAUNCHED("batchnorm_sync_stats");
  return CT_OK;
}

extern "C" ct_status cuda_batchnorm_sync_grads(ct_device *d, int stage, double n, const ct_tensor *gamma,
                                               const ct_tensor *invstd, const ct_tensor *dgamma,
                                               const ct_tensor *dbeta, ct_tensor *a, ct_tensor *b, double *vals) {
  CT_TRY(ct_bn_sync_grads_args("cuda", stage, gamma, invstd, dgamma, dbeta, a, b));
  const int64_t C = ct_tensor_numel(invstd);
  CT_TRY(cuda_enter(d));
  k_bn_sync_grads<<<ct_blocks(C + 1), CT_THREADS, 0, STREAM(d)>>>(stage, n, C, F32P(gamma), F32P(invstd),
                                                                   F32P(dgamma), F32P(dbeta), F32P(a), F32P(b), vals);
  CUDA_LAUNCHED("batchnorm_sync_grads");
  return CT_OK;
}
#undef F32P

/* ---- softmax over the last dim (one block per row) ---- */

/* Row max (float, NaN wins) and log of sum exp(x - max) (double sum). */
__device__ __forceinline__ void row_lse(const void *x, int xt, int64_t base, int64_t C, float *mx_out, double *lse_out,
                                        float *shf, double *shd) {
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float v = ct_ld(x, xt, base + c);
    mx = (v > mx || isnan(v)) ? v : mx;
  }
  mx = ct_block_max(mx, shf);
  double s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += expf(ct_ld(x, xt, base + c) - mx);
  s = ct_block_sum(s, shd);
  *mx_out = mx;
  *lse_out = log(s);
}

__global__ void k_softmax_fwd(int log_, const void *x, int xt, void *y, int yt, int64_t C) {
  __shared__ float shf[CT_THREADS / 32];
  __shared__ double shd[CT_THREADS / 32];
  const int64_t base = (int64_t)blockIdx.x * C;
  float mx;
  double lse;
  row_lse(x, xt, base, C, &mx, &lse, shf, shd);
  const float l = (float)lse, inv = (float)exp(-lse);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float v = ct_ld(x, xt, base + c) - mx;
    ct_st(y, yt, base + c, log_ ? v - l : expf(v) * inv);
  }
}

__global__ void k_softmax_bwd(int log_, const void *y, int yt, const void *dy, int dyt, void *dx, int dxt, int64_t C) {
  __shared__ double shd[CT_THREADS / 32];
  const int64_t base = (int64_t)blockIdx.x * C;
  double s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    double g = ct_ld(dy, dyt, base + c);
    s += log_ ? g : g * (double)ct_ld(y, yt, base + c);
  }
  s = ct_block_sum(s, shd);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    double g = ct_ld(dy, dyt, base + c), yv = ct_ld(y, yt, base + c);
    ct_st(dx, dxt, base + c, (float)(log_ ? g - exp(yv) * s : yv * (g - s)));
  }
}

static ct_status rows_of(const char *op, const ct_tensor *x, int64_t *N, int64_t *C) {
  if (x->ndim < 1) return ct_error(CT_ERR_SHAPE, "cuda %s: expected a [N, C] tensor", op);
  *C = x->shape[x->ndim - 1];
  *N = *C ? ct_tensor_numel(x) / *C : 0;
  if (*N > 0x7fffffff) return ct_error(CT_ERR_UNSUPPORTED, "cuda %s: %lld rows exceed the grid", op, (long long)*N);
  return CT_OK;
}

extern "C" ct_status cuda_softmax_fwd(ct_device *d, int log, const ct_tensor *x, ct_tensor *y) {
  CT_TRY(cuda_check_float("softmax_fwd", x, 1));
  CT_TRY(cuda_check_float("softmax_fwd", y, 2));
  int64_t N = 0, C = 0;
  CT_TRY(rows_of("softmax_fwd", x, &N, &C));
  CT_TRY(cuda_enter(d));
  if (!N) return CT_OK;
  k_softmax_fwd<<<(unsigned)N, CT_THREADS, 0, STREAM(d)>>>(log, x->data, x->dtype, y->data, y->dtype, C);
  CUDA_LAUNCHED("softmax_fwd");
  return CT_OK;
}

extern "C" ct_status cuda_softmax_bwd(ct_device *d, int log, const ct_tensor *y, const ct_tensor *dy, ct_tensor *dx) {
  CT_TRY(cuda_check_float("softmax_bwd", y, 1));
  CT_TRY(cuda_check_float("softmax_bwd", dy, 2));
  CT_TRY(cuda_check_float("softmax_bwd", dx, 3));
  int64_t N = 0, C = 0;
  CT_TRY(rows_of("softmax_bwd", y, &N, &C));
  CT_TRY(cuda_enter(d));
  if (!N) return CT_OK;
  k_softmax_bwd<<<(unsigned)N, CT_THREADS, 0, STREAM(d)>>>(log, y->data, y->dtype, dy->data, dy->dtype, dx->data,
                                                           dx->dtype, C);
  CUDA_LAUNCHED("softmax_bwd");
  return CT_OK;
}

/* ---- losses ---- */

/* Sums vals[0..n) in one block and stores scale * total into out[0]. */
__global__ void k_finish(const double *vals, int64_t n, double scale, void *out, int ot, double *out_d) {
  __shared__ double shd[CT_THREADS / 32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += vals[i];
  s = ct_block_sum(s, shd);
  if (threadIdx.x == 0) {
    if (out) ct_st(out, ot, 0, (float)(s * scale));
    if (out_d) *out_d = s * scale;
  }
}

/* One block per row: rowloss[r] = (1-eps)*nll + eps*mean_c(-log p_c). */
__global__ void k_ce_rows(const void *x, int xt, const void *t, int tt, int64_t C, double eps, double *rowloss) {
  __shared__ float shf[CT_THREADS / 32];
  __shared__ double shd[CT_THREADS / 32];
  const int64_t r = blockIdx.x, base = r * C;
  float mx;
  double lse;
  row_lse(x, xt, base, C, &mx, &lse, shf, shd);
  double mean_nll = 0;
  if (eps != 0) {
    double s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s -= (double)ct_ld(x, xt, base + c) - mx - lse;
    mean_nll = ct_block_sum(s, shd) / (double)C;
  }
  if (threadIdx.x == 0) {
    int64_t tc = target_at(t, tt, r);
    double nll = (tc < 0 || tc >= C) ? (double)NAN : -((double)ct_ld(x, xt, base + tc) - mx - lse);
    rowloss[r] = (1.0 - eps) * nll + eps * mean_nll;
  }
}

/* The gradient scale of a loss backward: the host's value, or (st
 * non-NULL) the device-resident loss scaler's, as the host would pass it
 * (its scale when enabled, else 1). */
__device__ __forceinline__ double loss_scale_of(double host_scale, const ct_step_stats *st) {
  if (!st) return host_scale;
  return st->scaler.enabled ? (double)st->scaler.scale : 1.0;
}

/* k = scale / N with the scale from loss_scale_of. */
__global__ void k_ce_bwd(const void *x, int xt, const void *t, int tt, int64_t C, double eps, double scale, double n,
                         const ct_step_stats *st, void *dx, int dxt) {
  const double k = loss_scale_of(scale, st) / n;
  __shared__ float shf[CT_THREADS / 32];
  __shared__ double shd[CT_THREADS / 32];
  const int64_t r = blockIdx.x, base = r * C;
  float mx;
  double lse;
  row_lse(x, xt, base, C, &mx, &lse, shf, shd);
  int64_t tc = target_at(t, tt, r);
  int bad = tc < 0 || tc >= C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    double target = eps / (double)C + (c == tc ? 1.0 - eps : 0.0);
    double v = k * (exp((double)ct_ld(x, xt, base + c) - mx - lse) - target);
    ct_st(dx, dxt, base + c, bad ? NAN : (float)v);
  }
}

__global__ void k_nll_rows(const void *x, int xt, const void *t, int tt, int64_t N, int64_t C, double *out_sum) {
  __shared__ double shd[CT_THREADS / 32];
  double s = 0;
  for (int64_t r = threadIdx.x; r < N; r += blockDim.x) {
    int64_t tc = target_at(t, tt, r);
    s -= (tc < 0 || tc >= C) ? (double)NAN : (double)ct_ld(x, xt, r * C + tc);
  }
  s = ct_block_sum(s, shd);
  if (threadIdx.x == 0) *out_sum = s;
}

__global__ void k_nll_bwd(const void *t, int tt, int64_t N, int64_t C, double scale, const ct_step_stats *st, void *dx,
                          int dxt) {
  const float g = (float)(-loss_scale_of(scale, st) / (double)N);
  CT_GRID_STRIDE(i, N * C) {
    int64_t r = i / C, c = i - r * C, tc = target_at(t, tt, r);
    ct_st(dx, dxt, i, (tc < 0 || tc >= C) ? NAN : c == tc ? g : 0.f);
  }
}

/* Per-block partial sums: op 0 = (a-b)^2, op 1 = a^2. */
__global__ void k_partial(int op, const void *a, int at, const void *b, int bt, int64_t n, double *partials) {
  __shared__ double shd[CT_THREADS / 32];
  double s = 0;
  CT_GRID_STRIDE(i, n) {
    double v = ct_ld(a, at, i);
    if (op == 0) v -= (double)ct_ld(b, bt, i);
    s += v * v;
  }
  s = ct_block_sum(s, shd);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void k_mse_bwd(const void *p, int pt, const void *t, int tt, int64_t n, double k, void *dx, int dxt) {
  CT_GRID_STRIDE(i, n) ct_st(dx, dxt, i, (float)(k * ((double)ct_ld(p, pt, i) - (double)ct_ld(t, tt, i))));
}

__global__ void k_nonfinite(const void *x, int xt, int64_t n, int *flag) {
  int bad = 0;
  CT_GRID_STRIDE(i, n) {
    if (xt == CT_F32)
      bad |= (((const uint32_t *)x)[i] & 0x7f800000u) == 0x7f800000u;
    else {
      uint16_t m = xt == CT_BF16 ? 0x7f80u : 0x7c00u;
      bad |= (((const uint16_t *)x)[i] & m) == m;
    }
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

static ct_status check_loss(const char *op, const ct_tensor *x, const ct_tensor *targets, ct_tensor *loss, int64_t *N,
                            int64_t *C) {
  CT_TRY(cuda_check_float(op, x, 1));
  CT_TRY(rows_of(op, x, N, C));
  if (targets) {
    if (targets->dtype != CT_I64 && targets->dtype != CT_I32)
      return ct_error(CT_ERR_INVALID_ARG, "cuda %s: targets must be an i64 (or i32) tensor of class indices", op);
    if (ct_tensor_numel(targets) != *N)
      return ct_error(CT_ERR_SHAPE, "cuda %s: targets has %lld entries, expected %lld (one per row)", op,
                      (long long)ct_tensor_numel(targets), (long long)*N);
  }
  if (loss) {
    CT_TRY(cuda_check_float(op, loss, 3));
    if (ct_tensor_numel(loss) < 1) return ct_error(CT_ERR_INVALID_ARG, "cuda %s: loss tensor must have 1 element", op);
  }
  return CT_OK;
}

extern "C" ct_status cuda_cross_entropy_fwd(ct_device *d, const ct_tensor *logits, const ct_tensor *targets,
                                            float label_smoothing, ct_tensor *loss) {
  int64_t N = 0, C = 0;
  CT_TRY(check_loss("cross_entropy_fwd", logits, targets, loss, &N, &C));
  CT_TRY(cuda_enter(d));
  void *scr;
  CT_TRY(cuda_scratch(d, (size_t)(N > 0 ? N : 1) * sizeof(double), &scr));
  double *rows = (double *)scr;
  if (N) {
    k_ce_rows<<<(unsigned)N, CT_THREADS, 0, STREAM(d)>>>(logits->data, logits->dtype, targets->data, targets->dtype, C,
                                                         (double)label_smoothing, rows);
    CUDA_LAUNCHED("cross_entropy_fwd rows");
  }
  k_finish<<<1, CT_THREADS, 0, STREAM(d)>>>(rows, N, N ? 1.0 / (double)N : 0.0, loss->data, loss->dtype, NULL);
  CUDA_LAUNCHED("cross_entropy_fwd finish");
  return CT_OK;
}

static ct_status ce_bwd(ct_device *d, const ct_tensor *logits, const ct_tensor *targets, float label_smoothing,
                        float grad_scale, const ct_step_stats *st, ct_tensor *dlogits) {
  int64_t N = 0, C = 0;
  CT_TRY(check_loss("cross_entropy_bwd", logits, targets, NULL, &N, &C));
  CT_TRY(cuda_check_float("cross_entropy_bwd", dlogits, 4));
  CT_TRY(cuda_enter(d));
  if (!N) return CT_OK;
  k_ce_bwd<<<(unsigned)N, CT_THREADS, 0, STREAM(d)>>>(logits->data, logits->dtype, targets->data, targets->dtype, C,
                                                      (double)label_smoothing, (double)grad_scale, (double)N, st,
                                                      dlogits->data, dlogits->dtype);
  CUDA_LAUNCHED("cross_entropy_bwd");
  return CT_OK;
}

extern "C" ct_status cuda_cross_entropy_bwd(ct_device *d, const ct_tensor *logits, const ct_tensor *targets,
                                            float label_smoothing, float grad_scale, ct_tensor *dlogits) {
  return ce_bwd(d, logits, targets, label_smoothing, grad_scale, NULL, dlogits);
}

extern "C" ct_status cuda_cross_entropy_bwd_dev(ct_device *d, const ct_tensor *logits, const ct_tensor *targets,
                                                float label_smoothing, const ct_step_stats *stats, ct_tensor *dlogits) {
  return ce_bwd(d, logits, targets, label_smoothing, 1.0f, stats, dlogits);
}

extern "C" ct_status cuda_nll_fwd(ct_device *d, const ct_tensor *logp, const ct_tensor *targets, ct_tensor *loss) {
  int64_t N = 0, C = 0;
  CT_TRY(check_loss("nll_fwd", logp, targets, loss, &N, &C));
  CT_TRY(cuda_enter(d));
  void *scr;
  CT_TRY(cuda_scratch(d, sizeof(double), &scr));
  k_nll_rows<<<1, CT_THREADS, 0, STREAM(d)>>>(logp->data, logp->dtype, targets->data, targets->dtype, N, C,
                                              (double *)scr);
  CUDA_LAUNCHED("nll_fwd rows");
  k_finish<<<1, CT_THREADS, 0, STREAM(d)>>>((const double *)scr, 1, N ? 1.0 / (double)N : 0.0, loss->data,
                                            loss->dtype, NULL);
  CUDA_LAUNCHED("nll_fwd finish");
  return CT_OK;
}

static ct_status nll_bwd(ct_device *d, const ct_tensor *targets, float grad_scale, const ct_step_stats *st,
                         ct_tensor *dlogp) {
  int64_t N = 0, C = 0;
  CT_TRY(check_loss("nll_bwd", dlogp, targets, NULL, &N, &C));
  CT_TRY(cuda_enter(d));
  if (!N) return CT_OK;
  k_nll_bwd<<<ct_blocks(N * C), CT_THREADS, 0, STREAM(d)>>>(targets->data, targets->dtype, N, C, (double)grad_scale,
                                                            st, dlogp->data, dlogp->dtype);
  CUDA_LAUNCHED("nll_bwd");
  return CT_OK;
}

extern "C" ct_status cuda_nll_bwd(ct_device *d, const ct_tensor *targets, float grad_scale, ct_tensor *dlogp) {
  return nll_bwd(d, targets, grad_scale, NULL, dlogp);
}

extern "C" ct_status cuda_nll_bwd_dev(ct_device *d, const ct_tensor *targets, const ct_step_stats *stats,
                                      ct_tensor *dlogp) {
  return nll_bwd(d, targets, 1.0f, stats, dlogp);
}

/* Launches the partial sums of op over n elements and the finishing sum
 * into out (loss tensor) or out_d (device double). */
static ct_status sum_squares(ct_device *d, const char *op, int kind, const ct_tensor *a, const ct_tensor *b,
                             double scale, void *out, int ot, double **out_d) {
  int64_t n = ct_tensor_numel(a);
  unsigned blocks = ct_blocks(n);
  if (blocks > PARTIAL_BLOCKS) blocks = PARTIAL_BLOCKS;
  void *scr;
  CT_TRY(cuda_scratch(d, (PARTIAL_BLOCKS + 1) * sizeof(double), &scr));
  double *partials = (double *)scr, *res = partials + PARTIAL_BLOCKS;
  k_partial<<<blocks, CT_THREADS, 0, STREAM(d)>>>(kind, a->data, a->dtype, b ? b->data : NULL, b ? b->dtype : 0, n,
                                                  partials);
  CUDA_LAUNCHED(op);
  k_finish<<<1, CT_THREADS, 0, STREAM(d)>>>(partials, blocks, scale, out, ot, out_d ? res : NULL);
  CUDA_LAUNCHED(op);
  if (out_d) *out_d = res;
  return CT_OK;
}

extern "C" ct_status cuda_mse_fwd(ct_device *d, const ct_tensor *pred, const ct_tensor *target, ct_tensor *loss) {
  CT_TRY(cuda_check_float("mse_fwd", pred, 1));
  CT_TRY(cuda_check_float("mse_fwd", target, 2));
  CT_TRY(cuda_check_float("mse_fwd", loss, 3));
  if (ct_tensor_numel(target) != ct_tensor_numel(pred))
    return ct_error(CT_ERR_SHAPE, "cuda mse_fwd: target has %lld elements, pred %lld",
                    (long long)ct_tensor_numel(target), (long long)ct_tensor_numel(pred));
  if (ct_tensor_numel(loss) < 1) return ct_error(CT_ERR_INVALID_ARG, "cuda mse_fwd: loss tensor must have 1 element");
  CT_TRY(cuda_enter(d));
  int64_t n = ct_tensor_numel(pred);
  return sum_squares(d, "mse_fwd", 0, pred, target, n ? 1.0 / (double)n : 0.0, loss->data, loss->dtype, NULL);
}

extern "C" ct_status cuda_mse_bwd(ct_device *d, const ct_tensor *pred, const ct_tensor *target, float grad_scale,
                                  ct_tensor *dpred) {
  CT_TRY(cuda_check_float("mse_bwd", pred, 1));
  CT_TRY(cuda_check_float("mse_bwd", target, 2));
  CT_TRY(cuda_check_float("mse_bwd", dpred, 3));
  CT_TRY(cuda_enter(d));
  int64_t n = ct_tensor_numel(pred);
  if (!n) return CT_OK;
  k_mse_bwd<<<ct_blocks(n), CT_THREADS, 0, STREAM(d)>>>(pred->data, pred->dtype, target->data, target->dtype, n,
                                                        (double)grad_scale * 2.0 / (double)n, dpred->data,
                                                        dpred->dtype);
  CUDA_LAUNCHED("mse_bwd");
  return CT_OK;
}

extern "C" ct_status cuda_sumsq(ct_device *d, const ct_tensor *x, double *out) {
  CT_TRY(cuda_check_float("sumsq", x, 1));
  CT_TRY(cuda_enter(d));
  double *res = NULL;
  CT_TRY(sum_squares(d, "sumsq", 1, x, NULL, 1.0, NULL, 0, &res));
  cudaStream_t s = STREAM(d);
  CUDA_TRY(cudaMemcpyAsync(out, res, sizeof(double), cudaMemcpyDeviceToHost, s));
  CUDA_TRY(cudaStreamSynchronize(s));
  return CT_OK;
}

extern "C" ct_status cuda_nonfinite(ct_device *d, const ct_tensor *x, int *out) {
  CT_TRY(cuda_check_float("nonfinite", x, 1));
  CT_TRY(cuda_enter(d));
  int64_t n = ct_tensor_numel(x);
  void *scr;
  CT_TRY(cuda_scratch(d, sizeof(int), &scr));
  cudaStream_t s = STREAM(d);
  CUDA_TRY(cudaMemsetAsync(scr, 0, sizeof(int), s));
  if (n) {
    k_nonfinite<<<ct_blocks(n), CT_THREADS, 0, s>>>(x->data, x->dtype, n, (int *)scr);
    CUDA_LAUNCHED("nonfinite");
  }
  int flag = 0;
  CUDA_TRY(cudaMemcpyAsync(&flag, scr, sizeof(int), cudaMemcpyDeviceToHost, s));
  CUDA_TRY(cudaStreamSynchronize(s));
  *out = flag != 0;
  return CT_OK;
}
