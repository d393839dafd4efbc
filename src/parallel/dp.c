/* DataParallel: replicas on the devices of one process, their gradients
 * summed at the step's sync point: in shared memory on virtual host
 * devices, by the devices' own collectives (NCCL) on GPUs. */
#include "parallel/dp.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/device_impl.h"
#include "ctrain/device.h"
#include "parallel/buckets.h"

/* How long a GPU replica's host waits for its collectives (PyTorch's
 * default timeout, as --dist-timeout's), and for those of a step another
 * replica failed in before it gives up on them. */
#define DP_TIMEOUT_S 600.0
#define DP_ABANDON_S 10.0

/* The replicas' meeting point. A replica that failed breaks it, so the
 * others return from their wait instead of waiting for it for good. */
typedef struct dp_group {
  int R;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived, broken;
  long generation;
  double metrics[64][4];
  const double *norm[64]; /* ct_dp_norm_sum: each replica's values */
} dp_group;

/* What a replica's thread runs next. */
typedef enum dp_phase { DP_TRAIN, DP_EVAL, DP_DRAIN, DP_JOIN } dp_phase;

typedef struct dp_rep {
  struct ct_dp *dp;
  int r;
  ct_model *m;
  ct_device *dev;
  ct_optimizer *opt;
  ct_step *step;
  ct_buckets *buckets; /* GPUs: the gradient buckets, all-reduced as the backward finishes them */
  /* This step's work, filled by the caller before the replica runs it. */
  ct_batch b;
  ct_step_pos pos;
  dp_phase phase;
  int active;
  ct_loss_kind loss;
  float label_smoothing;
  double eval_sums[3];
  ct_step_result res;
  int have;
  ct_status status;
  char error[512];
} dp_rep;

struct ct_dp {
  dp_group g;
  dp_rep rep[64];
  int R;
  /* The replicas' devices reduce among themselves (coll_*): GPUs. */
  int device;
  /* The global batches whose results are still to come, oldest first: a
   * GPU replica's result arrives a step late (its lagged read-back). */
  ct_batch *waiting[8];
  int n_waiting;
  char coll_id[CT_COLL_ID_BYTES];
};

static ct_status join(ct_dp *dp);

int ct_dp_replicas(const ct_dp *dp) { return dp->R; }
ct_model *ct_dp_model(ct_dp *dp, int r) { return dp->rep[r].m; }
void *ct_dp_replica(ct_dp *dp, int r) { return &dp->rep[r]; }

/* Waits until every replica arrived; CT_ERR_INTERNAL when one failed. */
static ct_status meet(dp_group *g) {
  pthread_mutex_lock(&g->mu);
  long gen = g->generation;
  if (++g->arrived == g->R) {
    g->arrived = 0;
    g->generation++;
    pthread_cond_broadcast(&g->cv);
  }
  while (gen == g->generation && !g->broken) pthread_cond_wait(&g->cv, &g->mu);
  int broken = g->broken;
  pthread_mutex_unlock(&g->mu);
  return broken ? ct_error(CT_ERR_INTERNAL, "dp: another replica failed") : CT_OK;
}

static void break_group(dp_group *g) {
  pthread_mutex_lock(&g->mu);
  g->broken = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* On GPUs: each bucket's all-reduce is queued on the device's collective
 * stream as soon as the backward has queued its last gradient (DDP's
 * buckets), so the sums run beside the rest of the backward. */
static ct_status start_buckets(dp_rep *me) {
  float *g = ct_model_grads(me->m, NULL);
  for (int k; (k = ct_buckets_next(me->buckets)) >= 0;) {
    size_t lo, hi;
    ct_buckets_range(me->buckets, k, &lo, &hi);
    CT_TRY(me->dev->backend->coll_allreduce(me->dev, g + lo, hi - lo, CT_F32));
  }
  return CT_OK;
}

static ct_status grads_ready(void *ctx, ct_step *s, int layer, size_t first, size_t count) {
  (void)s, (void)layer;
  dp_rep *me = ctx;
  ct_buckets_ready(me->buckets, first, count);
  return start_buckets(me);
}

/* The buckets not started yet and rank 0's buffers follow; the update
 * waits for them on the device, and the host checks the previous step's
 * (as DDP does). */
static ct_status sync_device(dp_rep *me, int64_t step) {
  const ct_backend *be = me->dev->backend;
  ct_buckets_all_ready(me->buckets);
  ct_status st = start_buckets(me);
  ct_buckets_reset(me->buckets);
  CT_TRY(st);
  /* Buffers in host memory (batch norm's counters) count the same steps
   * on every replica already. */
  for (int i = 0; i < ct_model_state_count(me->m); i++) {
    const ct_state_entry *e = ct_model_state(me->m, i);
    if (e->is_buffer && e->value.device == me->dev)
      CT_TRY(be->coll_bcast(me->dev, e->value.data, ct_tensor_nbytes(&e->value), 0));
  }
  CT_TRY(be->coll_fence(me->dev));
  char what[96];
  snprintf(what, sizeof what, "the gradient all-reduce of step %lld", (long long)step - 1);
  return be->coll_wait(me->dev, 1, DP_TIMEOUT_S, what);
}

/* A launch of a replica's captured step (GPUs, graph_safe): its
 * collectives are checked one step late, as sync_device does eagerly. */
static ct_status replayed(void *ctx, ct_step *s) {
  dp_rep *me = ctx;
  const ct_backend *be = me->dev->backend;
  CT_TRY(be->coll_mark(me->dev));
  char what[96];
  snprintf(what, sizeof what, "the gradient all-reduce of step %lld", (long long)ct_step_current(s)->step - 1);
  return be->coll_wait(me->dev, 1, DP_TIMEOUT_S, what);
}

/* Host devices: replica r adds chunk r of the gradients over all
 * replicas, in replica order, and writes it into every replica's buffer;
 * then buffers follow replica 0's. GPUs: sync_device. */
static ct_status sync(void *ctx, ct_step *s) {
  dp_rep *me = ctx;
  ct_dp *dp = me->dp;
  if (dp->device) return sync_device(me, ct_step_current(s)->step);
  CT_TRY(meet(&dp->g));
  size_t n;
  ct_model_grads(me->m, &n);
  size_t lo = n * (size_t)me->r / (size_t)dp->R, hi = n * (size_t)(me->r + 1) / (size_t)dp->R;
  float *g0 = ct_model_grads(dp->rep[0].m, NULL);
  for (int k = 1; k < dp->R; k++) {
    const float *gk = ct_model_grads(dp->rep[k].m, NULL);
    for (size_t i = lo; i < hi; i++) g0[i] += gk[i];
  }
  for (int k = 1; k < dp->R; k++) memcpy(ct_model_grads(dp->rep[k].m, NULL) + lo, g0 + lo, (hi - lo) * sizeof *g0);
  if (me->r > 0)
    for (int i = 0; i < ct_model_state_count(me->m); i++) {
      const ct_state_entry *e = ct_model_state(me->m, i), *e0 = ct_model_state(dp->rep[0].m, i);
      if (e->is_buffer) memcpy(e->value.data, e0->value.data, ct_tensor_nbytes(&e->value));
    }
  return meet(&dp->g);
}

static ct_status reduce(void *ctx, ct_step *s, ct_step_reduce what, ct_tensor *vals) {
  (void)s;
  dp_rep *me = ctx;
  ct_dp *dp = me->dp;
  /* The summed gradients agree already: their flag and norm too. */
  if (what != CT_STEP_REDUCE_METRICS) return CT_OK;
  double *v = vals->data;
  for (int j = 0; j < 4; j++) dp->g.metrics[me->r][j] = me->active ? v[j] : 0.0;
  CT_TRY(meet(&dp->g));
  for (int j = 0; j < 4; j++) {
    double sum = 0;
    for (int k = 0; k < dp->R; k++) sum += dp->g.metrics[k][j];
    v[j] = sum;
  }
  return meet(&dp->g); /* nobody writes the next sums before all have read these */
}

int ct_dp_norm_excluded(void *replica) { return !((dp_rep *)replica)->active; }

ct_status ct_dp_norm_sum(void *replica, double *vals, int n) {
  dp_rep *me = replica;
  ct_dp *dp = me->dp;
  if (dp->device) {
    /* On the collective stream; the layer's next kernels wait for it. */
    CT_TRY(me->dev->backend->coll_allreduce(me->dev, vals, (size_t)n, CT_F64));
    return me->dev->backend->coll_fence(me->dev);
  }
  double *sum = malloc((size_t)n * sizeof *sum + 8);
  if (!sum) {
    break_group(&dp->g);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "dp: out of host memory");
  }
  dp->g.norm[me->r] = vals;
  ct_status s = meet(&dp->g);
  for (int j = 0; s == CT_OK && j < n; j++) {
    double t = 0;
    for (int k = 0; k < dp->R; k++) t += dp->g.norm[k][j];
    sum[j] = t;
  }
  /* Nobody overwrites its values before every replica has read them. */
  if (s == CT_OK) s = meet(&dp->g);
  if (s == CT_OK) memcpy(vals, sum, (size_t)n * sizeof *vals);
  free(sum);
  return s;
}

ct_status ct_dp_create(ct_step *step0, const ct_step_config *sc, const ct_optim_config *oc, const ct_dist_config *dist,
                       int64_t max_batch, ct_dp **out) {
  *out = NULL;
  ct_device *const *devs = dist->dp_devices;
  const int R = dist->dp_count;
  if (R < 2 || R > 64) return ct_error(CT_ERR_INVALID_ARG, "dp: %d devices; expected 2..64", R);
  /* Host replicas sum in shared memory, so they must be virtual devices
   * of one host; GPU replicas need their backend's collectives. */
  int device = devs[0]->backend->coll_allreduce != NULL;
  for (int r = 0; r < R; r++) {
    const char *name = ct_device_name(devs[r]);
    if ((devs[r]->backend->coll_allreduce != NULL) != device)
      return ct_error(CT_ERR_UNSUPPORTED, "dp: devices %s and %s: DataParallel's devices are all host devices or all "
                      "GPUs", ct_device_name(devs[0]), name);
    if (!device && !devs[r]->is_virtual)
      return ct_error(CT_ERR_UNSUPPORTED, "dp: device '%s': DataParallel on the host runs on virtual host devices "
                      "(cpu:N, ref:N)", name);
    for (int k = 0; k < r; k++)
      if (device && ct_device_index(devs[k]) == ct_device_index(devs[r]))
        return ct_error(CT_ERR_INVALID_ARG, "dp: %s and %s are the same GPU", ct_device_name(devs[k]), name);
  }
  if (!device && (dist->bucket_mb > 0 || dist->first_bucket_mb > 0))
    return ct_error(CT_ERR_UNSUPPORTED, "dp: gradient buckets (--bucket-mb) are DataParallel's over GPUs; on host "
                    "devices the replicas sum whole gradients in shared memory");
  ct_model *m0 = ct_step_model(step0);
  if (device && (!ct_model_state_count(m0) || ct_model_state(m0, 0)->value.device != devs[0]))
    return ct_error(CT_ERR_INVALID_ARG, "dp: model '%s' is not resident on %s", ct_model_name(m0),
                    ct_device_name(devs[0]));
  ct_dp *dp = calloc(1, sizeof *dp);
  if (!dp) return ct_error(CT_ERR_OUT_OF_MEMORY, "dp: out of host memory");
  dp->R = dp->g.R = R, dp->device = device;
  pthread_mutex_init(&dp->g.mu, NULL);
  pthread_cond_init(&dp->g.cv, NULL);
  ct_optimizer *o0 = ct_step_optimizer(step0);
  size_t np;
  ct_model_params(m0, &np);
  ct_status s = CT_OK;
  for (int r = 0; r < R && s == CT_OK; r++) {
    dp_rep *p = &dp->rep[r];
    p->dp = dp, p->r = r, p->dev = devs[r];
    if (r == 0) {
      p->m = m0, p->opt = o0, p->step = step0;
    } else {
      ct_step_config c = *sc;
      c.step_sched = NULL; /* replica 0's schedule sets the rate; ct_dp_train copies it */
      s = ct_model_replicate(m0, &p->m);
      if (s == CT_OK) s = ct_model_prepare(p->m, devs[r], max_batch, 1);
      if (s == CT_OK) s = ct_optimizer_create(oc, np, &p->opt);
      if (s == CT_OK) s = ct_optimizer_copy_state(p->opt, 0, o0, 0, np);
      if (s == CT_OK) s = ct_step_create(p->m, devs[r], p->opt, &c, &p->step);
    }
    if (s == CT_OK && device) s = ct_buckets_create(p->m, dist->first_bucket_mb, dist->bucket_mb, &p->buckets);
    if (s == CT_OK) {
      /* On GPUs the hooks only queue collectives (the host's own work,
       * a replay's `replayed`): a CUDA graph captures them. */
      ct_step_hooks h = {.ctx = p, .grads_ready = device ? grads_ready : NULL, .sync = sync, .reduce = reduce,
                         .graph_safe = device, .replayed = device ? replayed : NULL};
      ct_step_set_hooks(p->step, &h);
    }
    if (s == CT_OK) s = ct_device_start_worker(devs[r]);
  }
  if (s == CT_OK && device) s = join(dp);
  if (s != CT_OK) {
    ct_dp_destroy(dp);
    return ct_error_wrap(s, "dp");
  }
  *out = dp;
  return CT_OK;
}

void ct_dp_destroy(ct_dp *dp) {
  if (!dp) return;
  for (int r = 0; r < dp->R && dp->device; r++)
    if (dp->rep[r].dev) dp->rep[r].dev->backend->coll_close(dp->rep[r].dev);
  for (int r = 0; r < dp->R; r++) ct_buckets_destroy(dp->rep[r].buckets);
  for (int r = 1; r < dp->R; r++) {
    ct_step_destroy(dp->rep[r].step);
    ct_optimizer_destroy(dp->rep[r].opt);
    ct_model_destroy(dp->rep[r].m);
  }
  if (dp->R > 0) ct_step_set_hooks(dp->rep[0].step, NULL);
  pthread_mutex_destroy(&dp->g.mu);
  pthread_cond_destroy(&dp->g.cv);
  free(dp);
}

/* Replica r's slice of b: consecutive samples, sizes differing by one;
 * an empty slice takes the first sample, inactive. */
static void slice(dp_rep *p, const ct_batch *b, int R) {
  int64_t lo = b->n * p->r / R, hi = b->n * (p->r + 1) / R;
  p->active = hi > lo;
  if (!p->active) lo = 0, hi = 1;
  p->b = *b;
  p->b.n = hi - lo;
  p->b.x.shape[0] = p->b.y.shape[0] = hi - lo;
  size_t per = (size_t)ct_tensor_nbytes(&b->x) / (size_t)(b->x.shape[0] > 0 ? b->x.shape[0] : 1);
  p->b.x.data = (char *)b->x.data + (size_t)lo * per;
  p->b.y.data = (int64_t *)b->y.data + lo;
  if (b->samples) p->b.samples = b->samples + lo;
}

static void run_replica(void *arg) {
  dp_rep *p = arg;
  p->have = 0;
  if (p->phase == DP_JOIN) {
    /* Every replica joins at once, each on its own thread: NCCL's
     * communicator forms when all have called in. */
    const ct_backend *be = p->dev->backend;
    p->status = be->coll_open(p->dev, p->dp->coll_id, p->r, p->dp->R);
  } else if (p->phase == DP_DRAIN) {
    /* The lagged read-backs sum their metrics across replicas: all
     * drain together. */
    p->status = ct_step_drain(p->step, &p->res, &p->have);
  } else if (p->phase == DP_EVAL) {
    int64_t t1 = 0, t5 = 0;
    double ls = 0;
    p->status = ct_step_eval_batch(p->m, p->dev, &p->b, p->loss, p->label_smoothing, &ls, &t1, &t5, NULL);
    p->eval_sums[0] = ls, p->eval_sums[1] = (double)t1, p->eval_sums[2] = (double)t5;
  } else {
    p->status = ct_step_train(p->step, &p->b, &p->pos, &p->res, &p->have);
  }
  if (p->status != CT_OK) {
    snprintf(p->error, sizeof p->error, "%s", ct_last_error());
    break_group(&p->dp->g);
  }
}

/* A failed step's collectives may wait for a replica that never queued
 * its part: each device waits a little, then aborts its communicator so
 * its streams drain. */
static void abandon(ct_dp *dp) {
  for (int r = 0; r < dp->R && dp->device; r++)
    (void)dp->rep[r].dev->backend->coll_wait(dp->rep[r].dev, 0, DP_ABANDON_S, "a failed step's collectives");
}

/* Runs every replica's work at once and waits (for the host's part: GPU
 * replicas leave their queued kernels running); the first failure (not
 * the others' "another replica failed") is the error. */
static ct_status run_all(ct_dp *dp) {
  dp->g.broken = 0;
  ct_status s = CT_OK;
  for (int r = 0; r < dp->R && s == CT_OK; r++) s = ct_device_submit(dp->rep[r].dev, run_replica, &dp->rep[r]);
  for (int r = 0; r < dp->R; r++) ct_device_wait_tasks(dp->rep[r].dev);
  if (s != CT_OK) return s;
  for (int pass = 0; pass < 2; pass++)
    for (int r = 0; r < dp->R; r++) {
      dp_rep *p = &dp->rep[r];
      if (p->status == CT_OK || (pass == 0 && p->status == CT_ERR_INTERNAL && strstr(p->error, "another replica")))
        continue;
      abandon(dp);
      return ct_error(p->status, "dp: replica %d on %s: %s", r, ct_device_name(p->dev), p->error);
    }
  return CT_OK;
}

/* Rank 0's device makes the communicator's id; every replica joins. */
static ct_status join(ct_dp *dp) {
  ct_device *d0 = dp->rep[0].dev;
  CT_TRY(d0->backend->coll_new_id(d0, dp->coll_id));
  for (int r = 0; r < dp->R; r++) dp->rep[r].phase = DP_JOIN;
  return run_all(dp);
}

ct_status ct_dp_finish(ct_dp *dp) {
  for (int r = 0; r < dp->R && dp->device; r++) {
    ct_device *d = dp->rep[r].dev;
    CT_TRY(d->backend->coll_wait(d, 0, DP_TIMEOUT_S, "the last step's gradient all-reduce"));
  }
  return CT_OK;
}

/* Replica 0's result, for the oldest global batch waiting for one. */
static ct_status result(ct_dp *dp, ct_step_result *done, int *have) {
  *have = dp->rep[0].have;
  if (!*have) return CT_OK;
  if (!dp->n_waiting) return ct_error(CT_ERR_INTERNAL, "dp: a result without a batch");
  *done = dp->rep[0].res;
  done->batch = dp->waiting[0];
  memmove(dp->waiting, dp->waiting + 1, (size_t)--dp->n_waiting * sizeof dp->waiting[0]);
  return CT_OK;
}

ct_status ct_dp_train(ct_dp *dp, ct_batch *b, const ct_step_pos *pos, ct_step_result *done, int *have) {
  ct_optimizer *o0 = dp->rep[0].opt;
  int64_t stride = pos->sample_stride > 0 ? pos->sample_stride : 1;
  for (int r = 0; r < dp->R; r++) {
    dp_rep *p = &dp->rep[r];
    slice(p, b, dp->R);
    p->phase = DP_TRAIN;
    p->pos = *pos;
    int64_t lo = b->n * r / dp->R;
    p->pos.factor = p->active ? (float)((double)pos->factor * (double)p->b.n / (double)b->n) : 0.0f;
    p->pos.sample_offset = pos->sample_offset + (p->active ? lo : 0) * stride;
    p->pos.sample_stride = stride;
    /* A schedule changes replica 0's rate and momentum: the others follow. */
    if (r > 0) {
      ct_optimizer_set_lr(p->opt, ct_optimizer_get_lr(o0));
      CT_TRY(ct_optimizer_set_momentum(p->opt, ct_optimizer_get_momentum(o0)));
    }
  }
  if (dp->n_waiting == (int)(sizeof dp->waiting / sizeof dp->waiting[0]))
    return ct_error(CT_ERR_INTERNAL, "dp: %d batches without a result", dp->n_waiting);
  dp->waiting[dp->n_waiting++] = b;
  CT_TRY(run_all(dp));
  return result(dp, done, have);
}

ct_status ct_dp_eval(ct_dp *dp, const ct_batch *b, ct_loss_kind loss, float label_smoothing, double sums[3]) {
  for (int r = 0; r < dp->R; r++) {
    dp_rep *p = &dp->rep[r];
    slice(p, b, dp->R);
    p->phase = DP_EVAL, p->loss = loss, p->label_smoothing = label_smoothing;
  }
  CT_TRY(run_all(dp));
  for (int r = 0; r < dp->R; r++)
    if (dp->rep[r].active)
      for (int j = 0; j < 3; j++) sums[j] += dp->rep[r].eval_sums[j];
  return CT_OK;
}

ct_status ct_dp_drain(ct_dp *dp, ct_step_result *done, int *have) {
  for (int r = 0; r < dp->R; r++) dp->rep[r].phase = DP_DRAIN;
  CT_TRY(run_all(dp));
  return result(dp, done, have);
}
