/* DistributedDataParallel: gradient buckets as views of the flat gradient
 * buffer, all-reduced while the backward runs; over MPI for host models,
 * over the device's own collectives (NCCL) for device-resident ones,
 * where ZeRO-2 stages the buckets in a few slots (grad_slots.h). */
#include "parallel/ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/device_impl.h"
#include "parallel/buckets.h"
#include "parallel/comm.h"
#include "parallel/grad_slots.h"

struct ct_ddp {
  ct_comm *c;
  ct_model *m;
  ct_buckets *b;
  int nb;
  int *req;           /* [nb] each bucket's started collective over MPI, or -1 */
  double step_bytes;  /* the buckets' bytes, what a step sends */
  ct_ddp_stats stats;
  int zero;           /* 1: reduce-scatter, shard updates, all-gather; 2: also releases the other shards' gradients */
  size_t nflat;       /* the flat buffers' length */
  size_t *shard;      /* [size + 1] shard boundaries: rank r owns [shard[r], shard[r + 1]) */
  size_t *counts;     /* [size] scratch: one collective's part per rank */
  /* A device-resident model's device (NULL: host memory, MPI): its
   * collectives run on the device's collective stream, and the sync hook
   * waits for the previous step's with the deadline (the host never waits
   * for the current step's). */
  ct_device *dev;
  ct_grad_slots *slots; /* ZeRO-2 on a device: the buckets' slots and the shard's gradients */
};

void ct_ddp_shard(const ct_ddp *d, size_t *lo, size_t *hi) {
  int r = ct_comm_rank(d->c);
  *lo = d->zero ? d->shard[r] : 0;
  *hi = d->zero ? d->shard[r + 1] : d->nflat;
}

/* Each rank's part of [lo, hi) under the shards. */
static void parts(ct_ddp *d, size_t lo, size_t hi) {
  for (int r = 0; r < ct_comm_size(d->c); r++) {
    size_t a = d->shard[r] > lo ? d->shard[r] : lo, b = d->shard[r + 1] < hi ? d->shard[r + 1] : hi;
    d->counts[r] = b > a ? b - a : 0;
  }
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void ct_ddp_get_stats(const ct_ddp *d, ct_ddp_stats *st) { *st = d->stats; }

int ct_ddp_bucket_count(const ct_ddp *d) { return d->nb; }

/* ZeRO-2: once bucket k's reduce-scatter is done, its gradient pages
 * outside this rank's shard go back to the OS. They read as zeros after
 * that, which the reduce-scatter left there anyway, so the step computes
 * exactly what ZeRO-1 does; the next backward faults them in again, so a
 * rank's resident gradients are its shard plus the buckets not yet
 * reduced. Only pages wholly outside the shard are released. */
static void release_bucket(ct_ddp *d, int k) {
  if (d->zero < 2 || d->dev) return;
  int r = ct_comm_rank(d->c);
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  float *g = ct_model_grads(d->m, NULL);
  size_t lo, hi;
  ct_buckets_range(d->b, k, &lo, &hi);
  size_t cut[2][2] = {{lo, hi < d->shard[r] ? hi : d->shard[r]}, {lo > d->shard[r + 1] ? lo : d->shard[r + 1], hi}};
  for (int i = 0; i < 2; i++) {
    uintptr_t a = ((uintptr_t)(g + cut[i][0]) + page - 1) & ~(page - 1), e = (uintptr_t)(g + cut[i][1]) & ~(page - 1);
    if (cut[i][1] <= cut[i][0] || e <= a) continue;
    if (madvise((void *)a, e - a, MADV_DONTNEED) == 0) d->stats.released_bytes += (double)(e - a);
  }
}

/* A model resident on a device (its gradients in device memory) joins a
 * communicator of the device's backend, its id sent from rank 0 over MPI. */
static ct_status open_device(ct_ddp *d, const ct_dist_config *cfg) {
  ct_device *dev = NULL;
  for (int i = 0; i < ct_model_state_count(d->m) && !dev; i++) dev = ct_model_state(d->m, i)->grad.device;
  if (!dev || !dev->backend->alloc) return CT_OK;
  if (!dev->backend->coll_allreduce)
    return ct_error(CT_ERR_UNSUPPORTED, "ddp: %s has no collectives in this build (NCCL's header was not found)",
                    dev->name);
  unsigned char id[CT_COLL_ID_BYTES];
  if (ct_comm_rank(d->c) == 0) CT_TRY(dev->backend->coll_new_id(dev, id));
  CT_TRY(ct_comm_bcast(d->c, id, sizeof id, 0, "the broadcast of the NCCL communicator's id"));
  CT_TRY(dev->backend->coll_open(dev, id, ct_comm_rank(d->c), ct_comm_size(d->c)));
  d->dev = dev;
  size_t lo, hi;
  ct_ddp_shard(d, &lo, &hi);
  /* ZeRO-2 stages the gradients in slots where that holds less. */
  if (cfg->zero < 2 || ct_grad_slots_bytes(d->b, hi - lo) >= d->nflat * sizeof(float)) return CT_OK;
  return ct_grad_slots_create(d->m, dev, d->b, lo, hi, &d->slots);
}

ct_status ct_ddp_zero2_plan(ct_model *m, const ct_dist_config *cfg, int rank, int size, int *slots, size_t *held,
                             size_t *whole) {
  size_t np;
  ct_model_params(m, &np);
  *slots = 0, *whole = *held = np * sizeof(float);
  if (cfg->zero < 2 || size < 1 || rank < 0 || rank >= size) return CT_OK;
  ct_buckets *b;
  CT_TRY(ct_buckets_create(m, cfg->first_bucket_mb, cfg->bucket_mb, &b));
  size_t r = (size_t)rank, n = (size_t)size;
  size_t bytes = ct_grad_slots_bytes(b, np * (r + 1) / n - np * r / n);
  ct_buckets_destroy(b);
  if (bytes >= *whole) return CT_OK;
  *slots = 1, *held = bytes;
  ct_model_reserve_grads_elsewhere(m, bytes);
  return CT_OK;
}

float *ct_ddp_shard_grads(const ct_ddp *d) { return d->slots ? ct_grad_slots_shard(d->slots) : NULL; }

ct_status ct_ddp_create(ct_comm *c, ct_model *m, const ct_dist_config *cfg, ct_ddp **out) {
  *out = NULL;
  ct_ddp *d = calloc(1, sizeof *d);
  if (!d) return ct_error(CT_ERR_OUT_OF_MEMORY, "ddp: out of host memory");
  d->c = c;
  d->m = m;
  d->zero = cfg->zero;
  ct_model_grads(m, &d->nflat);
  int N = ct_comm_size(c);
  d->shard = calloc((size_t)N + 1, sizeof *d->shard);
  d->counts = calloc((size_t)N, sizeof *d->counts);
  ct_status st = d->shard && d->counts ? CT_OK : ct_error(CT_ERR_OUT_OF_MEMORY, "ddp: out of host memory");
  if (st == CT_OK) st = ct_buckets_create(m, cfg->first_bucket_mb, cfg->bucket_mb, &d->b);
  if (st == CT_OK) {
    d->nb = ct_buckets_count(d->b);
    d->req = malloc(((size_t)d->nb + 1) * sizeof *d->req);
    if (!d->req) st = ct_error(CT_ERR_OUT_OF_MEMORY, "ddp: out of host memory");
  }
  for (int r = 0; st == CT_OK && r <= N; r++) d->shard[r] = d->nflat * (size_t)r / (size_t)N;
  if (st == CT_OK) st = open_device(d, cfg);
  if (st != CT_OK) {
    ct_ddp_destroy(d);
    return st;
  }
  for (int k = 0; k < d->nb; k++) {
    size_t lo, hi;
    ct_buckets_range(d->b, k, &lo, &hi);
    d->step_bytes += (double)(hi - lo) * sizeof(float);
    d->req[k] = -1;
    /* ZeRO-2: the other shards' gradients are never resident between
     * steps, from the start (the model zeroed them all when it was made). */
    release_bucket(d, k);
  }
  *out = d;
  return CT_OK;
}

void ct_ddp_destroy(ct_ddp *d) {
  if (!d) return;
  if (d->dev) d->dev->backend->coll_close(d->dev);
  ct_grad_slots_destroy(d->slots);
  ct_buckets_destroy(d->b);
  free(d->req);
  free(d->shard);
  free(d->counts);
  free(d);
}

/* ZeRO-2 on a device: bucket k's reduce-scatter from its slot into the
 * shard's gradients; the slot is free once it is done. */
static ct_status reduce_slot(ct_ddp *d, int k, size_t lo) {
  size_t mine = d->shard[ct_comm_rank(d->c)], from = lo > mine ? lo : mine;
  CT_TRY(ct_grad_slots_take(d->slots, lo, 1));
  CT_TRY(d->dev->backend->coll_reduce_scatter(d->dev, ct_grad_slots_of(d->slots, k),
                                                ct_grad_slots_shard(d->slots) + (from - mine), d->counts));
  return ct_grad_slots_queued(d->slots, k);
}

static ct_status start_ready(ct_ddp *d, int64_t step) {
  float *g = ct_model_grads(d->m, NULL);
  for (int k; (k = ct_buckets_next(d->b)) >= 0;) {
    size_t lo, hi;
    ct_buckets_range(d->b, k, &lo, &hi);
    char what[128];
    snprintf(what, sizeof what, "the %s of gradient bucket %d of %d (step %lld)",
             d->zero ? "reduce-scatter" : "all-reduce", k + 1, d->nb, (long long)step);
    if (d->zero) parts(d, lo, hi);
    if (d->slots) CT_TRY(reduce_slot(d, k, lo));
    else if (d->dev && d->zero) CT_TRY(d->dev->backend->coll_reduce_scatter(d->dev, g + lo, NULL, d->counts));
    else if (d->dev) CT_TRY(d->dev->backend->coll_allreduce(d->dev, g + lo, hi - lo, CT_F32));
    else if (d->zero) CT_TRY(ct_comm_reduce_scatter_start(d->c, g + lo, d->counts, CT_F32, what, &d->req[k]));
    else CT_TRY(ct_comm_allreduce_start(d->c, g + lo, hi - lo, CT_F32, what, &d->req[k]));
    d->stats.bytes += (double)(hi - lo) * sizeof(float);
  }
  /* Drive what is in flight: MPI progresses a non-blocking collective
   * only inside MPI calls. */
  for (int k = 0; k < d->nb; k++) {
    if (d->req[k] < 0) continue;
    int done;
    CT_TRY(ct_comm_test(d->c, d->req[k], &done));
    if (done) d->req[k] = -1, release_bucket(d, k);
  }
  return CT_OK;
}

static ct_status grads_needed(void *ctx, ct_step *s, int layer, size_t first, size_t count) {
  (void)s, (void)layer;
  ct_ddp *d = ctx;
  return ct_grad_slots_take(d->slots, first, count);
}

static ct_status grads_ready(void *ctx, ct_step *s, int layer, size_t first, size_t count) {
  (void)layer;
  ct_ddp *d = ctx;
  ct_buckets_ready(d->b, first, count);
  return start_ready(d, ct_step_current(s)->step);
}

/* Buffers (running statistics) follow rank 0's, as PyTorch's
 * broadcast_buffers does: every rank then evaluates and saves alike. */
static ct_status bcast_entry(ct_ddp *d, const ct_state_entry *e, const char *what) {
  if (d->dev && e->value.device) return d->dev->backend->coll_bcast(d->dev, e->value.data, ct_tensor_nbytes(&e->value), 0);
  return ct_comm_bcast(d->c, e->value.data, ct_tensor_nbytes(&e->value), 0, what);
}

static ct_status bcast_buffers(ct_ddp *d, int64_t step) {
  char what[96];
  snprintf(what, sizeof what, "the broadcast of rank 0's buffers (step %lld)", (long long)step);
  for (int i = 0; i < ct_model_state_count(d->m); i++) {
    const ct_state_entry *e = ct_model_state(d->m, i);
    if (e->is_buffer) CT_TRY(bcast_entry(d, e, what));
  }
  return CT_OK;
}

/* On a device: the compute stream waits for the collectives queued so
 * far, and the host for those before the fence `back` fences ago, within
 * the deadline. */
static ct_status device_fence(ct_ddp *d, int back, const char *what) {
  const ct_backend *be = d->dev->backend;
  CT_TRY(be->coll_fence(d->dev));
  return be->coll_wait(d->dev, back, ct_comm_timeout(d->c), what);
}

static ct_status sync_hook(void *ctx, ct_step *s) {
  ct_ddp *d = ctx;
  int64_t step = ct_step_current(s)->step;
  /* A bucket some hook never reported (a parameter without a gradient
   * this step) is reduced anyway: every rank starts every bucket. */
  ct_buckets_all_ready(d->b);
  double t0 = now_s();
  ct_status st = start_ready(d, step);
  if (d->dev && st == CT_OK) {
    /* The buffers' broadcast queues behind the buckets; the host checks
     * the previous step's collectives (a hang surfaces one step late,
     * before anything waits for it without a deadline). */
    char what[96];
    snprintf(what, sizeof what, "the collectives of step %lld", (long long)step - 1);
    st = bcast_buffers(d, step);
    if (st == CT_OK) st = device_fence(d, 1, what);
  }
  for (int k = 0; k < d->nb; k++) {
    if (st == CT_OK && d->req[k] >= 0 && (st = ct_comm_wait(d->c, d->req[k])) == CT_OK) release_bucket(d, k);
    d->req[k] = -1;
  }
  ct_buckets_reset(d->b);
  if (d->slots) ct_grad_slots_reset(d->slots);
  d->stats.wait_seconds += now_s() - t0;
  d->stats.steps++;
  return st == CT_OK && !d->dev ? bcast_buffers(d, step) : st;
}

/* A launch of the captured step (graph_safe on a device): its
 * collectives are checked one step late, as the sync hook does eagerly. */
static ct_status replayed(void *ctx, ct_step *s) {
  ct_ddp *d = ctx;
  int64_t step = ct_step_current(s)->step;
  CT_TRY(d->dev->backend->coll_mark(d->dev));
  char what[96];
  snprintf(what, sizeof what, "the collectives of step %lld", (long long)step - 1);
  CT_TRY(d->dev->backend->coll_wait(d->dev, 1, ct_comm_timeout(d->c), what));
  d->stats.bytes += d->step_bytes;
  d->stats.steps++;
  return CT_OK;
}

ct_status ct_ddp_finish(ct_ddp *d) {
  if (!d->dev) return CT_OK;
  return d->dev->backend->coll_wait(d->dev, 0, ct_comm_timeout(d->c), "the last step's collectives");
}

static ct_status reduce(void *ctx, ct_step *s, ct_step_reduce what, ct_tensor *vals) {
  ct_ddp *d = ctx;
  /* Gradients summed whole agree in their flag and norm already; under
   * ZeRO each rank measured its own shard. */
  if (what != CT_STEP_REDUCE_METRICS && !d->zero) return CT_OK;
  static const char *const names[] = {"the non-finite flags", "the squared gradient norms", "the metrics"};
  /* A device's statistics stay there: summed on the collective stream,
   * the update fenced behind them. */
  if (vals->device) {
    const ct_backend *be = d->dev->backend;
    CT_TRY(be->coll_allreduce(d->dev, vals->data, (size_t)ct_tensor_numel(vals), vals->dtype));
    return be->coll_fence(d->dev);
  }
  char w[96];
  snprintf(w, sizeof w, "the all-reduce of %s (step %lld)", names[what], (long long)ct_step_current(s)->step);
  return ct_comm_allreduce(d->c, vals->data, (size_t)ct_tensor_numel(vals), vals->dtype, w);
}

/* ZeRO: every rank updated its shard; all get all. */
static ct_status updated(void *ctx, ct_step *s) {
  ct_ddp *d = ctx;
  char w[96];
  snprintf(w, sizeof w, "the all-gather of the updated parameters (step %lld)", (long long)ct_step_current(s)->step);
  parts(d, 0, d->nflat);
  float *p = ct_model_params(d->m, NULL);
  if (d->dev) {
    /* The next forward waits for the gathered weights on the device. */
    CT_TRY(d->dev->backend->coll_allgather(d->dev, p, d->counts));
    return d->dev->backend->coll_fence(d->dev);
  }
  return ct_comm_allgatherv(d->c, p, d->counts, CT_F32, w);
}

void ct_ddp_hooks(ct_ddp *d, ct_step_hooks *h) {
  memset(h, 0, sizeof *h);
  h->ctx = d;
  h->grads_ready = grads_ready;
  if (d->slots) h->grads_needed = grads_needed;
  h->sync = sync_hook;
  h->reduce = reduce;
  if (d->zero) h->updated = updated;
  /* On a device every hook only queues collectives (and bookkeeping a
   * capture does once); a replay's host part is `replayed`. */
  h->graph_safe = d->dev != NULL;
  if (d->dev) h->replayed = replayed;
}

ct_status ct_ddp_gather_optimizer(ct_ddp *d, const ct_optimizer *opt, ct_optimizer *full) {
  size_t lo, hi;
  ct_ddp_shard(d, &lo, &hi);
  CT_TRY(ct_optimizer_copy_state(full, lo, opt, 0, hi - lo));
  parts(d, 0, d->nflat);
  for (size_t i = 0; i < ct_optimizer_state_count(full); i++) {
    const char *name;
    float *data;
    size_t n;
    CT_TRY(ct_optimizer_state(full, i, &name, &data, &n));
    char w[96];
    snprintf(w, sizeof w, "the all-gather of the optimizer's %s for a checkpoint", name);
    CT_TRY(ct_comm_allgatherv(d->c, data, d->counts, CT_F32, w));
  }
  return CT_OK;
}

ct_status ct_ddp_broadcast_state(ct_ddp *d) {
  for (int i = 0; i < ct_model_state_count(d->m); i++) {
    const ct_state_entry *e = ct_model_state(d->m, i);
    char what[192];
    snprintf(what, sizeof what, "the broadcast of rank 0's %s", e->name);
    CT_TRY(bcast_entry(d, e, what));
  }
  return d->dev ? device_fence(d, 0, "the broadcast of rank 0's parameters and buffers") : CT_OK;
}

ct_status ct_ddp_check_sync(ct_ddp *d, int64_t step) {
  size_t n;
  float *p = ct_model_params(d->m, &n), *host = NULL;
  if (d->dev) {
    host = malloc(n * sizeof *host);
    if (!host) return ct_error(CT_ERR_OUT_OF_MEMORY, "ddp: out of host memory");
    ct_status s = ct_device_copy(NULL, host, d->dev, p, n * sizeof *host);
    if (s != CT_OK) {
      free(host);
      return s;
    }
    p = host;
  }
  ct_dist_field f = {"parameters", ct_dist_hash(p, n * sizeof *p, 0), 1};
  free(host);
  ct_status s = ct_dist_check_same(d->c, &f, 1);
  if (s == CT_OK) return s;
  return ct_error(CT_ERR_INTERNAL, "ddp: after step %lld the ranks' weights are no longer the same (--check-sync): %s",
                  (long long)step, ct_last_error());
}

ct_status ct_ddp_sum(ct_ddp *d, double *vals, int n, const char *what) {
  return ct_comm_allreduce(d->c, vals, (size_t)n, CT_F64, what);
}

ct_status ct_ddp_norm_sum(void *ddp, double *vals, int n) {
  ct_ddp *d = ddp;
  if (!d->dev) return ct_ddp_sum(d, vals, n, "the all-reduce of SyncBatchNorm's sums");
  CT_TRY(d->dev->backend->coll_allreduce(d->dev, vals, (size_t)n, CT_F64));
  return d->dev->backend->coll_fence(d->dev);
}
