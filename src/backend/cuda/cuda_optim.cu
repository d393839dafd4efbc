/* Device-resident training step kernels: gradient statistics for the loss
 * scaler and clipping, the fused multi-tensor optimizer pass, the loss
 * scaler's update, and top-1/top-5 counting. The per-element formulas are
 * src/math/fused_step.h, shared with the host reference the CPU tests
 * check, so the GPU applies the exact f32 operations of
 * src/optim/optimizer_step.c. Flat buffers make "multi-tensor" one launch
 * over every parameter. Nothing here synchronises: the skip decision, the
 * clip coefficient and the scale are read from the ct_step_stats block in
 * device memory. */
#include "backend/cuda/cuda_common.cuh"
#include "math/fused_step.h"

/* The partial count depends on n alone: one block per 8192 gradients
 * (four 8-wide loads a thread), at most 512. So the two-stage sum's order
 * depends only on n and a step is deterministic run to run, and a small
 * model's gradients take a few blocks instead of 512 mostly reducing
 * zeros. */
#define STATS_BLOCKS 512
static unsigned stats_blocks(int64_t n) {
  int64_t b = (n + (int64_t)CT_THREADS * CT_VEC * 4 - 1) / ((int64_t)CT_THREADS * CT_VEC * 4);
  return (unsigned)(b < 1 ? 1 : b > STATS_BLOCKS ? STATS_BLOCKS : b);
}

/* vec: ct_vec_for's 8-wide loads (g 16-byte aligned); the partials then
 * add the same squares in another order. */
__global__ void k_grad_stats_partial(const float *g, int64_t n, int vec, const ct_step_stats *st, double *part_sum,
                                     int *part_bad) {
  __shared__ double sh[CT_THREADS / 32];
  const float inv = ct_fused_inv_scale(&st->scaler);
  double acc = 0;
  int bad = 0;
  ct_vec_for(n, vec, [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float x[W];
    ct_ldw<W>(g, CT_F32, i, x);
    for (int k = 0; k < W; k++) {
      if (!isfinite(x[k])) bad = 1;
      float u = inv != 1.0f ? x[k] * inv : x[k];
      acc += (double)u * (double)u;
    }
  });
  double t = ct_block_sum(acc, sh);
  int anyb = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    part_sum[blockIdx.x] = t;
    part_bad[blockIdx.x] = anyb;
  }
}

__global__ void k_grad_stats_final(const double *part_sum, const int *part_bad, int parts, ct_step_stats *st) {
  __shared__ double sh[CT_THREADS / 32];
  double acc = 0;
  int bad = 0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) {
    acc += part_sum[i];
    bad |= part_bad[i];
  }
  double t = ct_block_sum(acc, sh);
  int anyb = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    st->sumsq = t;
    st->nonfinite = anyb;
  }
}

extern "C" ct_status cuda_grad_stats(ct_device *d, const ct_tensor *grads, ct_step_stats *stats) {
  if (grads->dtype != CT_F32) return ct_error(CT_ERR_UNSUPPORTED, "cuda grad_stats: gradients must be f32");
  CT_TRY(cuda_enter(d));
  void *scr = NULL;
  CT_TRY(cuda_scratch(d, STATS_BLOCKS * (sizeof(double) + sizeof(int)), &scr));
  double *ps = (double *)scr;
  int *pb = (int *)(ps + STATS_BLOCKS);
  cudaStream_t s = cuda_stream(d);
  const unsigned blocks = stats_blocks(ct_tensor_numel(grads));
  k_grad_stats_partial<<<blocks, CT_THREADS, 0, s>>>((const float *)grads->data, ct_tensor_numel(grads),
                                                     ct_vec_ok(grads->data), stats, ps, pb);
  CUDA_LAUNCHED("grad_stats");
  k_grad_stats_final<<<1, CT_THREADS, 0, s>>>(ps, pb, (int)blocks, stats);
  CUDA_LAUNCHED("grad_stats (final)");
  return CT_OK;
}

/* Unscale, clip and update this thread's elements with the arguments a
 * (the caller has checked that the step is not skipped). */
__device__ __forceinline__ void fused_update(const ct_fused_optim_args *a, float *p, const float *g, float *s0,
                                             float *s1, float *s2, const ct_step_stats *st, int vec) {
  const float inv = ct_fused_inv_scale(&st->scaler);
  float cf = 1.0f;
  const int clip = ct_fused_clip(a, st, &cf);
  ct_vec_for(a->n, vec, [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float pv[W], gv[W], m[W] = {}, v[W] = {}, vm[W] = {};
    ct_ldw<W>(p, CT_F32, i, pv);
    ct_ldw<W>(g, CT_F32, i, gv);
    if (s0) ct_ldw<W>(s0, CT_F32, i, m);
    if (s1) ct_ldw<W>(s1, CT_F32, i, v);
    if (s2) ct_ldw<W>(s2, CT_F32, i, vm);
    for (int k = 0; k < W; k++) {
      float gi = ct_fused_grad(gv[k], inv, clip, cf);
      if (a->kind == 0)
        ct_fused_sgd_elem(a, &pv[k], gi, s0 ? &m[k] : (float *)0);
      else
        ct_fused_adam_elem(a, &pv[k], gi, &m[k], &v[k], s2 ? &vm[k] : (float *)0);
    }
    ct_stw<W>(p, CT_F32, i, pv);
    if (s0) ct_stw<W>(s0, CT_F32, i, m);
    if (s1) ct_stw<W>(s1, CT_F32, i, v);
    if (s2) ct_stw<W>(s2, CT_F32, i, vm);
  });
}

/* 1 when the pass may take 8 elements a step (ct_vec_for). */
static int optim_vec(const float *p, const float *g, const float *s0, const float *s1, const float *s2) {
  return ct_vec_ok(p, g, s0, s1) && ct_vec_ok(s2);
}

/* The argument block travels by value (kernel parameter space), so the
 * host may reuse its copy at once. */
__global__ void k_fused_optim(ct_fused_optim_args a, float *p, const float *g, float *s0, float *s1, float *s2,
                              const ct_step_stats *st, int vec) {
  if (ct_fused_skip(st)) return;
  fused_update(&a, p, g, s0, s1, s2, st, vec);
}

/* The same pass with its scalars read from device memory (the row of
 * st->args matching the device's step count), so a replayed graph sees
 * the host's latest learning rate; the row goes through shared memory
 * once per block. */
__global__ void k_fused_optim_dev(float *p, const float *g, float *s0, float *s1, float *s2, const ct_step_stats *st,
                                  int vec) {
  __shared__ ct_fused_optim_args a;
  if (ct_fused_skip(st)) return;
  if (threadIdx.x == 0) a = *ct_step_args_pick(&st->args, st->opt_steps);
  __syncthreads();
  fused_update(&a, p, g, s0, s1, s2, st, vec);
}

extern "C" ct_status cuda_fused_optim_step_dev(ct_device *d, int kind, int64_t n, float *params, const float *grads,
                                               float *s0, float *s1, float *s2, const ct_step_stats *stats) {
  if (kind != 0 && (!s0 || !s1))
    return ct_error(CT_ERR_INVALID_ARG, "cuda fused_optim_step_dev: Adam needs exp_avg and exp_avg_sq");
  CT_TRY(cuda_enter(d));
  if (n <= 0) return CT_OK;
  const int vec = optim_vec(params, grads, s0, s1, s2);
  k_fused_optim_dev<<<ct_vec_blocks(n, vec), CT_THREADS, 0, cuda_stream(d)>>>(params, grads, s0, s1, s2, stats, vec);
  CUDA_LAUNCHED("fused_optim_step_dev");
  return CT_OK;
}

extern "C" ct_status cuda_fused_optim_step(ct_device *d, const ct_fused_optim_args *a, float *params,
                                           const float *grads, float *s0, float *s1, float *s2,
                                           const ct_step_stats *stats) {
  if (a->kind != 0 && (!s0 || !s1))
    return ct_error(CT_ERR_INVALID_ARG, "cuda fused_optim_step: Adam needs exp_avg and exp_avg_sq");
  if (a->kind == 0 && a->momentum_on && !s0)
    return ct_error(CT_ERR_INVALID_ARG, "cuda fused_optim_step: SGD with momentum needs the momentum buffer");
  if (a->amsgrad && !s2) return ct_error(CT_ERR_INVALID_ARG, "cuda fused_optim_step: amsgrad needs max_exp_avg_sq");
  CT_TRY(cuda_enter(d));
  const int vec = optim_vec(params, grads, s0, s1, s2);
  k_fused_optim<<<ct_vec_blocks(a->n, vec), CT_THREADS, 0, cuda_stream(d)>>>(*a, params, grads, s0, s1, s2, stats,
                                                                             vec);
  CUDA_LAUNCHED("fused_optim_step");
  return CT_OK;
}

/* Also counts the optimizer step when it was taken, so the next step's
 * arguments (Adam's bias correction, SGD's first momentum step) follow the
 * device's skip decisions without the host reading them first. */
__global__ void k_scaler_update(ct_step_stats *st) {
  if (!ct_fused_skip(st)) st->opt_steps++;
  ct_fused_scaler_update(&st->scaler, st->nonfinite);
}

extern "C" ct_status cuda_scaler_update(ct_device *d, ct_step_stats *stats) {
  CT_TRY(cuda_enter(d));
  k_scaler_update<<<1, 1, 0, cuda_stream(d)>>>(stats);
  CUDA_LAUNCHED("scaler_update");
  return CT_OK;
}

/* One block: a batch has at most a few thousand rows, and one block keeps
 * the count free of atomics and of a zeroing pass. */
__global__ void k_count_correct(const void *scores, int dt, const int64_t *labels, int64_t n, int64_t k,
                                ct_step_stats *st) {
  __shared__ double sh[CT_THREADS / 32];
  double c1 = 0, c5 = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    int64_t y = labels[i];
    float sy = (y >= 0 && y < k) ? ct_ld(scores, dt, i * k + y) : -INFINITY;
    int64_t rank = sy != sy ? k : 0; /* a NaN score never ranks: the row is wrong */
    for (int64_t j = 0; j < k; j++) {
      float s = ct_ld(scores, dt, i * k + j);
      if (s > sy || (s == sy && j < y) || s != s) rank++;
    }
    c1 += rank < 1;
    c5 += rank < 5;
  }
  double t1 = ct_block_sum(c1, sh);
  double t5 = ct_block_sum(c5, sh);
  if (threadIdx.x == 0) {
    st->top1 = (int64_t)t1;
    st->top5 = (int64_t)t5;
  }
}

extern "C" ct_status cuda_count_correct(ct_device *d, const ct_tensor *scores, const ct_tensor *labels,
                                        ct_step_stats *stats) {
  CT_TRY(cuda_check_float("count_correct", scores, 0));
  if (scores->ndim != 2 || labels->dtype != CT_I64 || ct_tensor_numel(labels) != scores->shape[0])
    return ct_error(CT_ERR_SHAPE, "cuda count_correct: expected scores [N, K] and int64 labels [N]");
  CT_TRY(cuda_enter(d));
  k_count_correct<<<1, CT_THREADS, 0, cuda_stream(d)>>>(scores->data, (int)scores->dtype,
                                                        (const int64_t *)labels->data, scores->shape[0],
                                                        scores->shape[1], stats);
  CUDA_LAUNCHED("count_correct");
  return CT_OK;
}

/* ---- fused full-batch linear regression (src/train/linreg.c's math) ----
 * Per step: one pass over the points sums {r^2, r x_j, r} in double into a
 * fixed number of per-block partials, then one block adds the partials
 * (a fixed tree, so a run is deterministic), and its first thread forms
 * loss = sum r^2 / n and grad_j = 2/n sum r x_j rounded to f32 (the CPU's
 * formulas) and applies the optimizer element formulas of fused_step.h
 * with step k's arguments (args[k], rounded on the host). Every step of
 * the run is queued at once: the host reads nothing until the end. (One
 * thread adding the 512 x (F+2) partials itself, as this did at first,
 * took longer than the pass over the data.) */
#define LINREG_BLOCKS 512

__global__ void k_linreg_partial(const float *x, const float *y, int64_t n, int F, const float *p, double *part) {
  __shared__ double sh[CT_THREADS / 32];
  double w[CT_LINREG_MAX_FEATURES + 1], acc[CT_LINREG_MAX_FEATURES + 2];
  for (int j = 0; j <= F; j++) w[j] = (double)p[j];
  for (int j = 0; j < F + 2; j++) acc[j] = 0;
  CT_GRID_STRIDE(i, n) {
    const float *xi = x + i * F;
    double r = w[F] - (double)y[i];
    for (int j = 0; j < F; j++) r += (double)xi[j] * w[j];
    acc[0] += r * r;
    for (int j = 0; j < F; j++) acc[1 + j] += r * (double)xi[j];
    acc[F + 1] += r;
  }
  for (int j = 0; j < F + 2; j++) {
    double t = ct_block_sum(acc[j], sh);
    if (threadIdx.x == 0) part[(size_t)blockIdx.x * (F + 2) + j] = t;
  }
}

__global__ void k_linreg_update(const double *part, int F, int64_t n, const ct_fused_optim_args *a, float *p,
                                float *s0, float *s1, float *s2, double *loss_out) {
  __shared__ double sh[CT_THREADS / 32];
  __shared__ double sum[CT_LINREG_MAX_FEATURES + 2];
  for (int j = 0; j < F + 2; j++) {
    double t = 0;
    for (int b = threadIdx.x; b < LINREG_BLOCKS; b += blockDim.x) t += part[(size_t)b * (F + 2) + j];
    t = ct_block_sum(t, sh);
    if (threadIdx.x == 0) sum[j] = t;
  }
  if (threadIdx.x != 0) return;
  const double inv_n = 1.0 / (double)n;
  *loss_out = sum[0] * inv_n;
  for (int j = 0; j <= F; j++) {
    float g = (float)(2.0 * inv_n * sum[1 + j]);
    if (a->kind == 0)
      ct_fused_sgd_elem(a, &p[j], g, s0 ? &s0[j] : (float *)0);
    else
      ct_fused_adam_elem(a, &p[j], g, &s0[j], &s1[j], s2 ? &s2[j] : (float *)0);
  }
}

extern "C" ct_status cuda_linreg_fit(ct_device *d, const float *x, const float *y, int64_t n, int features,
                                     const ct_fused_optim_args *args, int64_t steps, float *params, float *state,
                                     double *loss_history) {
  if (features < 1 || features > CT_LINREG_MAX_FEATURES)
    return ct_error(CT_ERR_UNSUPPORTED, "cuda linreg: %d features; the fused kernel takes 1..%d", features,
                    CT_LINREG_MAX_FEATURES);
  CT_TRY(cuda_enter(d));
  void *scr = NULL;
  CT_TRY(cuda_scratch(d, (size_t)LINREG_BLOCKS * (size_t)(features + 2) * sizeof(double), &scr));
  const int64_t np = features + 1;
  float *s0 = state, *s1 = state + np, *s2 = state + 2 * np;
  cudaStream_t st = cuda_stream(d);
  for (int64_t k = 0; k < steps; k++) {
    k_linreg_partial<<<LINREG_BLOCKS, CT_THREADS, 0, st>>>(x, y, n, features, params, (double *)scr);
    CUDA_LAUNCHED("linreg partial sums");
    k_linreg_update<<<1, CT_THREADS, 0, st>>>((const double *)scr, features, n, args + k, params, s0, s1, s2,
                                              loss_history + k);
    CUDA_LAUNCHED("linreg update");
  }
  return CT_OK;
}
