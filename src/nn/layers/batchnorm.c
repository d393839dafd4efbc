/* BatchNorm1d / BatchNorm2d: ip[0] num_features, ip[1] 1 or 2, ip[2]
 * affine; fp[0] eps, fp[1] momentum. State in PyTorch order: weight, bias,
 * running_mean, running_var, num_batches_tracked. The workspace keeps the
 * batch mean and 1/sqrt(var+eps) from forward to backward, and after them
 * (at a 256-byte aligned address) the reserve of a backend that fuses the
 * layer's activation (batchnorm_act_*: cuDNN's BN+ReLU), unless a max pool
 * took the ReLU's gradient over: then no backward reads the reserve and
 * the forward's pass workspace holds it. Without such a backend, or in
 * eval, the activation runs in place after the forward and on dy before
 * the backward. Under SyncBatchNorm (ct_exec.norm_sync) a training pass
 * takes the global batch's statistics (sync_forward, sync_backward). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/device_impl.h"
#include "nn/layer.h"

static ct_status setup(ct_layer *l) {
  int64_t c = l->ip[0];
  int nd = l->in_ndim[0];
  char got[96];
  if (l->ip[1] == 2 && nd != 3)
    return ct_error(CT_ERR_SHAPE, "BatchNorm2d expects input [N, C, H, W], got %s", ct_layer_input_str(l, 0, got, sizeof got));
  if (l->ip[1] == 1 && nd != 1 && nd != 2)
    return ct_error(CT_ERR_SHAPE, "BatchNorm1d expects input [N, C] or [N, C, L], got %s",
                    ct_layer_input_str(l, 0, got, sizeof got));
  if (l->in_shape[0][0] != c)
    return ct_error(CT_ERR_SHAPE, "expected %lld channels (num_features), got %lld", (long long)c,
                    (long long)l->in_shape[0][0]);
  l->out_ndim = nd;
  for (int i = 0; i < 4; i++) l->out_shape[i] = l->in_shape[0][i];
  int64_t scalar = 0;
  if (l->ip[2]) {
    ct_layer_declare(l, "weight", 0, CT_F32, 1, &c);
    ct_layer_declare(l, "bias", 0, CT_F32, 1, &c);
  }
  ct_layer_declare(l, "running_mean", 1, CT_F32, 1, &c);
  ct_layer_declare(l, "running_var", 1, CT_F32, 1, &c);
  ct_layer_declare(l, "num_batches_tracked", 1, CT_I64, 0, &scalar);
  return CT_OK;
}

static void init(ct_layer *l, uint64_t seed, float **state, int64_t **counters) {
  (void)seed;
  int64_t c = l->ip[0];
  int k = 0;
  if (l->ip[2]) {
    for (int64_t i = 0; i < c; i++) state[0][i] = 1.0f, state[1][i] = 0.0f;
    k = 2;
  }
  for (int64_t i = 0; i < c; i++) state[k][i] = 0.0f, state[k + 1][i] = 1.0f;
  counters[k + 2][0] = 0;
}

static size_t stats_bytes(const ct_layer *l) { return 2 * (size_t)l->ip[0] * sizeof(float); }

static int fused(const ct_layer *l, const ct_exec *e) {
  return l->act != CT_ACT_NONE && e->training && e->be->batchnorm_act_fwd;
}

/* Whether a max pool took this layer's ReLU gradient over (plan/fuse.h):
 * the fused forward's reserve then serves no backward. */
static int relu_moved(const ct_layer *l) { return l->relu_moved == CT_RELU_MOVED_TO_POOL; }

/* The reserve the fused forward keeps for the fused backward, for the
 * planned batch: the planner calls the sizing functions below for the
 * step's plan and for trial plans (also after steps at other batch sizes:
 * ctrain summary), always with e->batch the planned largest batch, so it
 * is sized from l->x[0]'s dtype and layout and comes out the same each
 * time. */
static size_t reserve_bytes(ct_layer *l, ct_exec *e) {
  if (!fused(l, e)) return 0;
  ct_tensor x = l->x[0];
  x.shape[0] = e->batch;
  return e->be->batchnorm_act_reserve(e->dev, l->act, &x);
}

/* The workspace kept from forward to backward: the statistics, and the
 * reserve unless the ReLU moved (then the forward's pass workspace holds
 * it, pass_ws_bytes). 255 bytes of slack let the reserve start on a
 * 256-byte boundary (the alignment cudaMalloc gives; plan buffers have
 * 64). */
static size_t ws_bytes(ct_layer *l, ct_exec *e) {
  l->ws_reserve = reserve_bytes(l, e);
  size_t kept = relu_moved(l) ? 0 : l->ws_reserve;
  return stats_bytes(l) + (kept ? 255 + kept : 0);
}

static size_t pass_ws_bytes(ct_layer *l, ct_exec *e, int backward) {
  size_t r = backward || !relu_moved(l) ? 0 : reserve_bytes(l, e);
  return r ? 255 + r : 0;
}

/* Where the fused forward writes its reserve: after the statistics in the
 * kept workspace or, with the ReLU moved, in the forward's pass
 * workspace; NULL without one (the backend then runs unfused). */
static void *reserve(const ct_layer *l, const ct_exec *e) {
  if (!l->ws_reserve) return NULL;
  uintptr_t p = 0;
  if (!relu_moved(l)) p = l->ws ? (uintptr_t)l->ws + stats_bytes(l) : 0;
  else if (e->pass_ws_bytes >= 255 + l->ws_reserve) p = (uintptr_t)e->pass_ws;
  return p ? (void *)((p + 255) & ~(uintptr_t)255) : NULL;
}

static void stats(ct_layer *l, ct_tensor *mean, ct_tensor *invstd) {
  float *ws = l->ws;
  *mean = ct_tensor_1d(ws, CT_F32, l->ip[0]);
  *invstd = ct_tensor_1d(ws ? ws + l->ip[0] : NULL, CT_F32, l->ip[0]);
  mean->device = invstd->device = l->y.device;
}

/* SyncBatchNorm's per-channel arithmetic runs where the model lives
 * (batchnorm_sync_stats / _grads), its f64 sums in the strategy's
 * scratch (ct_norm_sync_scratch) summed over the replicas by the
 * strategy: on a GPU queued on its collectives, so the host never waits.
 * A replica without samples this step (ct_norm_sync.excluded) adds
 * nothing (n = 0) but still takes part in every sum. */
static double sync_count(const ct_layer *l, const ct_exec *e) {
  const ct_norm_sync *ns = e->norm_sync;
  if (ns->excluded && ns->excluded(ns->ctx)) return 0.0;
  return (double)(ct_tensor_numel(&l->x[0]) / l->ip[0]);
}

/* SyncBatchNorm's forward: the local batch's mean and variance (the
 * backend's own pass), combined over the replicas as Chan's parallel
 * variance does (the means first, then each replica's squared deviations
 * around the global mean: no cancellation when the mean is large), the
 * running statistics updated with the global ones (unbiased variance over
 * all samples), and x normalised with them. Counts may differ between
 * replicas. */
static ct_status sync_forward(ct_layer *l, ct_exec *e, const ct_tensor *gamma, const ct_tensor *beta,
                              ct_tensor *mean, ct_tensor *invstd, ct_tensor *rm, ct_tensor *rv) {
  const int C = (int)l->ip[0];
  const double n = sync_count(l, e);
  ct_norm_sync *ns = e->norm_sync;
  double *v;
  CT_TRY(ct_norm_sync_scratch(ns, e->dev, (size_t)(3 * C + 1) * sizeof *v, (void **)&v));
  CT_TRY(e->be->batchnorm_fwd(e->dev, 1, &l->x[0], NULL, NULL, NULL, NULL, 0.0f, l->fp[0], &l->y, mean, invstd));
  for (int stage = 0; stage < 3; stage++) {
    CT_TRY(e->be->batchnorm_sync_stats(e->dev, stage, n, l->fp[1], l->fp[0], mean, invstd, rm, rv, v));
    if (stage < 2) CT_TRY(ns->sum(ns->ctx, v, stage == 0 ? C + 1 : C));
  }
  return e->be->batchnorm_apply(e->dev, &l->x[0], gamma, beta, mean, invstd, l->act, 0.0f, &l->y);
}

/* SyncBatchNorm's backward: the backend's backward with the global
 * statistics gives dx from this replica's sums of dy and dy x xhat; with
 * the global sums, dx differs from it by a_c + b_c xhat per channel
 * (computed into dy, which nothing reads after this backward, through
 * batchnorm_apply, which computes xhat b + a), and the parameter
 * gradients stay this replica's (the data-parallel reduction sums them). */
static ct_status sync_backward(ct_layer *l, ct_exec *e, const ct_tensor *gamma, ct_tensor *mean, ct_tensor *invstd,
                               ct_tensor *dgamma, ct_tensor *dbeta) {
  const int64_t C = l->ip[0];
  const double n = sync_count(l, e);
  ct_norm_sync *ns = e->norm_sync;
  size_t head = (size_t)(2 * C + 1) * sizeof(double);
  double *v;
  CT_TRY(ct_norm_sync_scratch(ns, e->dev, head + (size_t)(4 * C) * sizeof(float), (void **)&v));
  float *f = (float *)((char *)v + head);
  ct_tensor dg = ct_tensor_1d(f, CT_F32, C), db = ct_tensor_1d(f + C, CT_F32, C);
  ct_tensor a = ct_tensor_1d(f + 2 * C, CT_F32, C), b = ct_tensor_1d(f + 3 * C, CT_F32, C);
  dg.device = db.device = a.device = b.device = l->dx[0].device;
  CT_TRY(e->be->batchnorm_bwd(e->dev, &l->x[0], &l->dy, gamma, mean, invstd, &l->dx[0], &dg, &db, 0.0f));
  CT_TRY(e->be->batchnorm_sync_grads(e->dev, 0, n, gamma, invstd, &dg, &db, NULL, NULL, v));
  CT_TRY(ns->sum(ns->ctx, v, (int)(2 * C + 1)));
  /* Left out of the step: its dx stays the local one, zero (dy is). */
  if (n > 0) {
    CT_TRY(e->be->batchnorm_sync_grads(e->dev, 1, n, gamma, invstd, &dg, &db, &a, &b, v));
    CT_TRY(e->be->batchnorm_apply(e->dev, &l->x[0], &b, &a, mean, invstd, CT_ACT_NONE, 0.0f, &l->dy));
    CT_TRY(e->be->add(e->dev, &l->dx[0], &l->dy, CT_ACT_NONE, &l->dx[0]));
  }
  if (dgamma) CT_TRY(e->be->axpby(e->dev, 1.0f, &dg, l->grad_beta, dgamma));
  if (dbeta) CT_TRY(e->be->axpby(e->dev, 1.0f, &db, l->grad_beta, dbeta));
  return CT_OK;
}

static ct_status forward(ct_layer *l, ct_exec *e) {
  int k = l->ip[2] ? 2 : 0;
  ct_tensor mean, invstd;
  stats(l, &mean, &invstd);
  const ct_tensor *gamma = l->ip[2] ? &l->w[0] : NULL, *beta = l->ip[2] ? &l->w[1] : NULL;
  /* A recompute forward normalises with the statistics the first forward
   * saved (the planner keeps its workspace to the backward,
   * CT_LAYER_RERUN_READS_WS, with a fused forward's reserve, which the
   * backward reads as that forward left it): no pass over x for the
   * statistics, the same bits on the cpu, and the running statistics and
   * the counter stay as the first forward left them, unlike a re-run
   * PyTorch module. */
  if (e->recompute)
    return e->be->batchnorm_apply(e->dev, &l->x[0], gamma, beta, &mean, &invstd, l->act, 0.0f, &l->y);
  ct_tensor *rm = &l->w[k], *rv = &l->w[k + 1];
  ct_status s;
  if (e->training && e->norm_sync) {
    s = sync_forward(l, e, gamma, beta, &mean, &invstd, rm, rv);
  } else if (fused(l, e)) {
    s = e->be->batchnorm_act_fwd(e->dev, l->act, &l->x[0], gamma, beta, rm, rv, l->fp[1], l->fp[0], &l->y, &mean,
                                 &invstd, reserve(l, e), l->ws_reserve);
  } else {
    s = e->be->batchnorm_fwd(e->dev, e->training, &l->x[0], gamma, beta, rm, rv, l->fp[1], l->fp[0], &l->y,
                             e->training ? &mean : NULL, e->training ? &invstd : NULL);
    if (s == CT_OK && l->act != CT_ACT_NONE) s = e->be->act_fwd(e->dev, l->act, 0.0f, &l->y, &l->y);
  }
  if (s == CT_OK && e->training) (*l->counter)++;
  return s;
}

static ct_status backward(ct_layer *l, ct_exec *e) {
  ct_tensor mean, invstd;
  stats(l, &mean, &invstd);
  const ct_tensor *gamma = l->ip[2] ? &l->w[0] : NULL;
  ct_tensor *dgamma = l->ip[2] ? &l->g[0] : NULL, *dbeta = l->ip[2] ? &l->g[1] : NULL;
  /* A max pool that alone reads this output has applied the ReLU's
   * gradient already (CT_RELU_MOVED_TO_POOL, plan/fuse.h): the plain
   * backward then runs on dy as it is, after a fused forward too (the
   * saved statistics are the same; the reserve only serves the fused
   * backward), and y need not be kept. */
  ct_act act = ct_layer_bwd_act(l);
  if (e->norm_sync) {
    if (act != CT_ACT_NONE) CT_TRY(e->be->act_bwd(e->dev, l->act, 0.0f, NULL, &l->y, &l->dy, &l->dy));
    return sync_backward(l, e, gamma, &mean, &invstd, dgamma, dbeta);
  }
  /* The executor always gives batch norm a dx buffer (the backends compute
   * it with the parameter gradients in one pass). */
  if (act != CT_ACT_NONE && fused(l, e))
    return e->be->batchnorm_act_bwd(e->dev, l->act, &l->x[0], &l->y, &l->dy, gamma, l->ip[2] ? &l->w[1] : NULL,
                                    l->fp[0], &mean, &invstd, reserve(l, e), l->ws_reserve, &l->dx[0], dgamma, dbeta,
                                    l->grad_beta);
  if (act != CT_ACT_NONE) CT_TRY(e->be->act_bwd(e->dev, l->act, 0.0f, NULL, &l->y, &l->dy, &l->dy));
  return e->be->batchnorm_bwd(e->dev, &l->x[0], &l->dy, gamma, &mean, &invstd, &l->dx[0], dgamma, dbeta,
                              l->grad_beta);
}

const ct_layer_class ct_layer_batchnorm = {"batchnorm", "BatchNorm", CT_LAYER_SAVES_INPUT | CT_LAYER_RERUN_READS_WS,
                                           setup, init, ws_bytes,
                                           forward, backward, pass_ws_bytes};
