/* Two replicas of one model, each fed half a batch, their gradients summed
 * through the step's hooks (a minimal in-process communicator written
 * here, as a strategy would write one), against the single model on the
 * whole batch: the summed gradients, the clipped global norm and the
 * updated weights must agree within rounding, and the two replicas must
 * end bit-identical. Threads mode: each replica runs on its own device's
 * thread (cpu:0 and cpu:1), concurrently, meeting at the hooks. Lockstep
 * mode (one device without threads of its own, cuda): one thread walks
 * both replicas through each phase in turn. */
#ifndef CTRAIN_TESTS_REPLICAS_H
#define CTRAIN_TESTS_REPLICAS_H

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrain/device.h"
#include "ctrain/model.h"
#include "ctrain/optim.h"
#include "ctrain/step.h"
#include "try.h"

#define R 2      /* replicas */
#define NB 16    /* the global batch */
#define CLIP 0.05

/* The communicator: each collective is complete when the last replica
 * arrives, which reduces for all. In threads mode the others wait for it
 * (at most 60 s: a test must fail, not hang); in lockstep mode nobody
 * waits, since no replica reads the result before every replica arrived. */
typedef struct comm {
  int threads;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived[4];          /* per collective: the reduce kinds, and the sync (3) */
  long generation[4];
  ct_step *step[R];
  ct_tensor vals[3][R];   /* the reduce hook's tensors, per kind */
  size_t n;               /* flat gradient length */
  float *summed;          /* [n] replica 0's gradients right after the sum */
  /* What the hooks saw, per replica: spans in call order. */
  int calls[R], bad_order[R];
  int seen[3], disagree;    /* reduce calls by kind; NONFINITE/SUMSQ that differed */
  size_t last_first[R], covered[R];
} comm;

typedef struct rep {
  comm *c;
  int rank;
} rep;

static int rank_of(comm *c, ct_step *s) {
  for (int r = 0; r < R; r++)
    if (c->step[r] == s) return r;
  return -1;
}

/* Sums what every replica put at p[r] (bytes each, on device dev) as
 * doubles of kind dt, into every p[r]. */
static void sum_into_all(ct_device *const *dev, void *const *p, size_t count, ct_dtype dt) {
  size_t es = dt == CT_F64 ? 8 : 4, bytes = count * es;
  double *acc = calloc(count, sizeof *acc);
  char *h = malloc(bytes);
  for (int r = 0; r < R; r++) {
    TRY(ct_device_copy(NULL, h, dev[r], p[r], bytes));
    for (size_t i = 0; i < count; i++)
      acc[i] += dt == CT_F64 ? ((double *)h)[i] : dt == CT_I32 ? ((int32_t *)h)[i] : ((float *)h)[i];
  }
  for (size_t i = 0; i < count; i++) {
    if (dt == CT_F64) ((double *)h)[i] = acc[i];
    else if (dt == CT_I32) ((int32_t *)h)[i] = (int32_t)acc[i];
    else ((float *)h)[i] = (float)acc[i];
  }
  for (int r = 0; r < R; r++) TRY(ct_device_copy(dev[r], p[r], NULL, h, bytes));
  free(h);
  free(acc);
}

/* Arrives at collective k (in lockstep one replica may be at several at
 * once); the last arrival runs fn for everyone. */
static ct_status arrive(comm *c, int k, void (*fn)(comm *, void *), void *arg) {
  pthread_mutex_lock(&c->mu);
  long gen = c->generation[k];
  if (++c->arrived[k] == R) {
    fn(c, arg);
    c->arrived[k] = 0;
    c->generation[k]++;
    pthread_cond_broadcast(&c->cv);
  } else if (c->threads) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    while (c->generation[k] == gen)
      if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT) {
        pthread_mutex_unlock(&c->mu);
        return ct_error(CT_ERR_INTERNAL, "replicas: a collective waited 60 s for the other replica");
      }
  }
  pthread_mutex_unlock(&c->mu);
  return CT_OK;
}

static void sum_grads(comm *c, void *arg) {
  (void)arg;
  ct_device *dev[R];
  void *p[R];
  for (int r = 0; r < R; r++) {
    dev[r] = ct_step_device(c->step[r]);
    p[r] = ct_model_grads(ct_step_model(c->step[r]), NULL);
  }
  sum_into_all(dev, p, c->n, CT_F32);
  TRY(ct_device_copy(NULL, c->summed, dev[0], p[0], c->n * sizeof(float)));
}

/* METRICS: summed. NONFINITE, SUMSQ: after the gradients were all-reduced
 * every replica must see the same value; a difference is recorded. */
static void sum_vals(comm *c, void *arg) {
  ct_step_reduce what = *(ct_step_reduce *)arg;
  if (what != CT_STEP_REDUCE_METRICS) {
    double v[R];
    for (int r = 0; r < R; r++) {
      char h[8] = {0};
      TRY(ct_device_copy(NULL, h, c->vals[what][r].device, c->vals[what][r].data, what == CT_STEP_REDUCE_SUMSQ ? 8 : 4));
      v[r] = what == CT_STEP_REDUCE_SUMSQ ? *(double *)h : *(int32_t *)h;
    }
    for (int r = 1; r < R; r++) c->disagree += v[r] != v[0];
    c->seen[what]++;
    return;
  }
  c->seen[what]++;
  ct_device *dev[R];
  void *p[R];
  for (int r = 0; r < R; r++) dev[r] = c->vals[what][r].device, p[r] = c->vals[what][r].data;
  sum_into_all(dev, p, (size_t)ct_tensor_numel(&c->vals[what][0]), c->vals[what][0].dtype);
}

static ct_status on_grads_ready(void *ctx, ct_step *s, int layer, size_t first, size_t count) {
  comm *c = ctx;
  int r = rank_of(c, s);
  (void)layer;
  /* Reverse layer order: each span ends where the one before began. */
  if (c->calls[r]++ && first + count > c->last_first[r]) c->bad_order[r]++;
  c->last_first[r] = first;
  c->covered[r] += count;
  return CT_OK;
}

static ct_status on_sync(void *ctx, ct_step *s) {
  (void)s;
  return arrive(ctx, 3, sum_grads, NULL);
}

static ct_status on_reduce(void *ctx, ct_step *s, ct_step_reduce what, ct_tensor *vals) {
  comm *c = ctx;
  (void)what;
  /* Lockstep: a host value (the metrics) must be reduced before the hook
   * returns, which one thread walking the replicas in turn cannot do;
   * device values are read later, by kernels queued after the reduction. */
  if (!c->threads && what == CT_STEP_REDUCE_METRICS) {
    c->seen[what] += rank_of(c, s) == 0;
    return CT_OK;
  }
  c->vals[what][rank_of(c, s)] = *vals;
  return arrive(c, what, sum_vals, &what);
}

/* A replica's step, phase by phase (threads mode: on its device's thread). */
typedef struct job {
  ct_step *step;
  ct_batch *b;
  int phase; /* -1: all */
  ct_status status;
} job;

static void run_phase(ct_step *s, ct_batch *b, int phase, ct_status *st) {
  /* Each replica's loss gradient weighs its half of the batch by 1/R (the
   * micro-batch share), so the sum is the whole batch's mean. */
  ct_step_pos pos = {0, 0, 1, 1, 1.0f / R, 0, 1};
  ct_step_result res;
  int have;
  switch (phase) {
    case 0: *st = ct_step_begin(s, b, &pos); break;
    case 1: *st = ct_step_forward(s, NULL); break;
    case 2: *st = ct_step_loss(s); break;
    case 3: *st = ct_step_backward(s); break;
    case 4: *st = ct_step_sync(s); break;
    case 5: *st = ct_step_unscale_check_clip(s); break;
    case 6: *st = ct_step_update(s); break;
    case 7: *st = ct_step_end(s, &res, &have); break;
    default: break;
  }
}

static void job_fn(void *arg) {
  job *j = arg;
  j->status = CT_OK;
  for (int p = 0; p < 8 && j->status == CT_OK; p++) run_phase(j->step, j->b, p, &j->status);
  /* The others must not wait for a replica that failed half way: they
   * time out and report it. */
}

static ct_batch batch_view(float *x, int64_t *y, int64_t n, const int64_t *shape, int ndim, ct_device *dev) {
  ct_batch b;
  memset(&b, 0, sizeof b);
  int64_t sh[4] = {n, shape[0], shape[1], shape[2]};
  b.x = ct_tensor_view(x, CT_F32, ndim + 1, sh);
  b.x.device = dev;
  b.y = ct_tensor_1d(y, CT_I64, n);
  b.y.device = dev;
  b.n = n;
  return b;
}

static float *host_copy(const float *p, ct_device *dev, size_t n) {
  float *h = malloc(n * sizeof *h);
  TRY(ct_device_copy(NULL, h, dev, p, n * sizeof *h));
  return h;
}

/* Relative difference of two arrays (max |a-b| / max(max |a|, tiny)). */
static double rel_diff(const float *a, const float *b, size_t n) {
  double d = 0, m = 1e-30;
  for (size_t i = 0; i < n; i++) {
    d = fmax(d, fabs((double)a[i] - b[i]));
    m = fmax(m, fabs((double)a[i]));
  }
  return d / m;
}

/* spec[r]: replica r's device; threads: run them concurrently. */
static int replicas_check(const char *const *spec, int threads) {
  ct_device *dev[R], *dev1;
  for (int r = 0; r < R; r++)
    if (ct_device_open(spec[r], &dev[r]) != CT_OK) {
      printf("SKIP: no %s device (%s)\n", spec[r], ct_last_error());
      return 77;
    }
  TRY(ct_device_open(spec[0], &dev1));
  ct_model_options mo = {0, 0, 0, 0, 3};
  ct_model *one, *rep[R];
  TRY(ct_model_create("lenet5", &mo, &one));
  for (int r = 0; r < R; r++) {
    TRY(ct_model_replicate(one, &rep[r]));
    TRY(ct_model_prepare(rep[r], dev[r], NB / R, 1));
  }
  TRY(ct_model_prepare(one, dev1, NB, 1));
  int c, h, w;
  ct_model_input_shape(one, &c, &h, &w);
  int64_t shape[3] = {c, h, w}, per = (int64_t)c * h * w;
  /* Data on each model's device (host memory for cpu devices). */
  float *x = malloc((size_t)(NB * per) * sizeof *x);
  int64_t y[NB];
  uint32_t st = 12345;
  for (int64_t i = 0; i < NB * per; i++) st = st * 1664525u + 1013904223u, x[i] = (float)((st >> 8) & 0xffff) / 32768.0f - 1.0f;
  for (int i = 0; i < NB; i++) y[i] = (i * 7) % 10;
  ct_batch bb[R + 1];
  void *xd[R + 1], *yd[R + 1];
  for (int r = 0; r <= R; r++) {
    ct_device *d = r < R ? dev[r] : dev1;
    int64_t n = r < R ? NB / R : NB, off = r < R ? r * (NB / R) : 0;
    xd[r] = ct_device_alloc(d, (size_t)(n * per) * sizeof(float));
    yd[r] = ct_device_alloc(d, (size_t)n * sizeof(int64_t));
    TRY(ct_device_copy(d, xd[r], NULL, x + off * per, (size_t)(n * per) * sizeof(float)));
    TRY(ct_device_copy(d, yd[r], NULL, y + off, (size_t)n * sizeof(int64_t)));
    /* On a device model the step stages the batch from the host. */
    int resident = !strncmp(ct_device_name(d), "cuda", 4);
    bb[r] = resident ? batch_view(x + off * per, y + off, n, shape, 3, NULL)
                     : batch_view(xd[r], yd[r], n, shape, 3, d);
  }
  /* SGD: the update is linear in the gradient, so rounding in the sum
   * stays rounding in the weights (Adam's first step divides a gradient
   * by its own magnitude, which turns 1e-12 noise on a zero into 1). */
  ct_optim_config oc = ct_optim_config_default(CT_OPTIM_SGD);
  oc.lr = 0.5;
  oc.momentum = 0.9;
  ct_step_config sc;
  ct_step_config_default(&sc);
  sc.clip_grad_norm = CLIP;
  size_t n;
  ct_model_params(one, &n);
  ct_optimizer *opt1, *opt[R];
  ct_step *s1, *s[R];
  TRY(ct_optimizer_create(&oc, n, &opt1));
  TRY(ct_step_create(one, dev1, opt1, &sc, &s1));
  comm cm;
  memset(&cm, 0, sizeof cm);
  pthread_mutex_init(&cm.mu, NULL);
  pthread_cond_init(&cm.cv, NULL);
  cm.threads = threads, cm.n = n;
  cm.summed = malloc(n * sizeof(float));
  ct_step_hooks hk = {.ctx = &cm, .grads_ready = on_grads_ready, .sync = on_sync, .reduce = on_reduce};
  for (int r = 0; r < R; r++) {
    TRY(ct_optimizer_create(&oc, n, &opt[r]));
    TRY(ct_step_create(rep[r], dev[r], opt[r], &sc, &s[r]));
    ct_step_set_hooks(s[r], &hk);
    cm.step[r] = s[r];
  }
  /* The single model's step; its gradients before the update. */
  ct_step_result res;
  int have;
  ct_step_pos p0 = ct_step_pos_single(0);
  TRY(ct_step_begin(s1, &bb[R], &p0));
  TRY(ct_step_forward(s1, NULL));
  TRY(ct_step_loss(s1));
  TRY(ct_step_backward(s1));
  float *g1 = host_copy(ct_model_grads(one, NULL), dev1, n);
  TRY(ct_step_unscale_check_clip(s1));
  TRY(ct_step_update(s1));
  TRY(ct_step_end(s1, &res, &have));
  double norm1 = 0;
  for (size_t i = 0; i < n; i++) norm1 += (double)g1[i] * g1[i];
  norm1 = sqrt(norm1);

  job jb[R];
  if (threads) {
    for (int r = 0; r < R; r++) {
      jb[r] = (job){s[r], &bb[r], -1, CT_OK};
      TRY(ct_device_submit(dev[r], job_fn, &jb[r]));
    }
    for (int r = 0; r < R; r++) TRY(ct_device_sync(dev[r]));
    for (int r = 0; r < R; r++) TRY(jb[r].status);
  } else {
    for (int p = 0; p < 8; p++)
      for (int r = 0; r < R; r++) {
        ct_status stt = CT_OK;
        run_phase(s[r], &bb[r], p, &stt);
        TRY(stt);
      }
  }
  int bad = 0;
  double dg = rel_diff(g1, cm.summed, n);
  if (dg > 1e-5) {
    fprintf(stderr, "FAIL: the replicas' summed gradients differ from the whole batch's by %.3g (relative)\n", dg);
    bad = 1;
  }
  float *p1 = host_copy(ct_model_params(one, NULL), dev1, n);
  float *pr[R];
  for (int r = 0; r < R; r++) pr[r] = host_copy(ct_model_params(rep[r], NULL), dev[r], n);
  if (memcmp(pr[0], pr[1], n * sizeof(float))) {
    fprintf(stderr, "FAIL: the two replicas' weights differ after the step\n");
    bad = 1;
  }
  double dp = rel_diff(p1, pr[0], n);
  if (dp > 1e-5) {
    fprintf(stderr, "FAIL: replicas' weights differ from the single model's by %.3g (relative)\n", dp);
    bad = 1;
  }
  /* The spans tile the flat buffer from its end down to 0 (each
   * parameter's alignment gap included), in reverse layer order. */
  for (int r = 0; r < R; r++) {
    if (cm.covered[r] < (size_t)ct_model_param_count(one) || cm.covered[r] > n || cm.last_first[r] != 0 ||
        cm.bad_order[r] || cm.calls[r] != 5) {
      fprintf(stderr, "FAIL: replica %d: grads_ready covered %zu of %zu (%lld parameters) in %d calls, %d out of order\n",
              r, cm.covered[r], n, (long long)ct_model_param_count(one), cm.calls[r], cm.bad_order[r]);
      bad = 1;
    }
  }
  /* One metrics sum per result; the flag (no scaler: not asked) and the
   * norm once each, agreeing across the replicas. */
  if (cm.seen[CT_STEP_REDUCE_METRICS] != 1 || cm.seen[CT_STEP_REDUCE_SUMSQ] != 1 || cm.disagree) {
    fprintf(stderr, "FAIL: reduce hook: %d metrics, %d nonfinite, %d sumsq calls, %d disagreements\n",
            cm.seen[CT_STEP_REDUCE_METRICS], cm.seen[CT_STEP_REDUCE_NONFINITE], cm.seen[CT_STEP_REDUCE_SUMSQ],
            cm.disagree);
    bad = 1;
  }
  /* Clipping ran on the reduced (global) norm: on a host model the
   * replicas' gradients end at norm CLIP, as the single model's do (a
   * device's fused update clips on the fly and leaves them; there the
   * weights above show it). */
  float *gr = host_copy(ct_model_grads(rep[0], NULL), dev[0], n);
  double normr = 0;
  for (size_t i = 0; i < n; i++) normr += (double)gr[i] * gr[i];
  normr = sqrt(normr);
  int fused_clip = !strncmp(ct_device_name(dev[0]), "cuda", 4);
  if (norm1 <= CLIP || (!fused_clip && fabs(normr - CLIP) > 1e-4 * CLIP)) {
    fprintf(stderr, "FAIL: global norm: single %.6g (must exceed %g), replicas clipped to %.6g (want %g)\n", norm1, CLIP,
            normr, CLIP);
    bad = 1;
  }
  if (!bad)
    printf("ok: %d replicas on %s/%s (%s): gradients %.2g, weights %.2g from the whole batch's; global norm %.4g "
           "clipped to %g%s\n",
           R, spec[0], spec[1], threads ? "concurrent threads" : "lockstep", dg, dp, norm1, CLIP,
           fused_clip ? " in the fused update" : "");
  free(g1), free(gr), free(p1), free(x), free(cm.summed);
  for (int r = 0; r < R; r++) free(pr[r]);
  for (int r = 0; r <= R; r++) {
    ct_device *d = r < R ? dev[r] : dev1;
    ct_device_free(d, xd[r]), ct_device_free(d, yd[r]);
  }
  for (int r = 0; r < R; r++) ct_step_destroy(s[r]), ct_optimizer_destroy(opt[r]), ct_model_destroy(rep[r]);
  ct_step_destroy(s1), ct_optimizer_destroy(opt1), ct_model_destroy(one);
  for (int r = 0; r < R; r++) ct_device_close(dev[r]);
  ct_device_close(dev1);
  return bad;
}

#endif
