/* How much of DDP's communication the backward hides, on this machine.
 * Run under `mpirun -np 2` (also works at -np 1, a world of one). Every
 * rank holds a zoo model and feeds it its own synthetic batch (ranks draw
 * different data, as DistributedSampler's shares), on --threads threads.
 *
 * Four variants run interleaved in each of --rounds rounds (the order
 * rotates per round, so that this VM's drift falls on all of them):
 *
 *   compute   the step with no hooks: this rank's compute alone (every
 *             rank runs it at the same time, so the ranks contend for
 *             memory bandwidth as they do under DDP)
 *   timeline  the step with hooks that only note when the backward calls
 *             grads_ready: when each layer's gradients are final, the
 *             per-layer backward times the projection needs
 *             (bench/ddp_projection.py)
 *   ddp       the step with ct_ddp's hooks, as ct_fit installs them
 *             (pos.factor 1/world, sample_offset rank, sample_stride
 *             world); the same noting wraps them
 *   comm      DDP's hooks called with no backward: grads_ready for every
 *             layer at once in the backward's order, then sync. The same
 *             buckets, started and driven by the same code, so it is the
 *             communication alone as DDP issues it (all buckets in flight
 *             together, waited for by sync)
 *
 * and a sweep of blocking ct_comm_allreduce calls of --sweep sizes (on a
 * buffer of its own), from which the projection fits the latency and
 * bandwidth of this machine's MPI.
 *
 * Reported per variant: median wall time of the step and its phases (each
 * rank's, and per step the slower rank's: a DDP step waits for it), the
 * communication the backward did not hide (ct_ddp_get_stats' wait_seconds
 * per step, spent in sync; per step the rank that waited least, since the
 * other's wait also holds its lead over the slower rank) and the time
 * DDP's grads_ready spent inside the backward (starting and driving
 * all-reduces: MPI progresses a non-blocking collective only inside MPI
 * calls, so that is where the copying and summing run on a CPU).
 * hidden share = 1 - exposed / comm alone; effective hidden share =
 * 1 - (ddp step - compute step) / comm alone, what the step actually
 * gained, also paired by round (the median over rounds of each round's
 * difference) beside the noise, |timeline - compute| paired the same way
 * (the same work measured twice).
 *
 * Usage: mpirun -np 2 bench_ddp --model NAME [--batch 8] [--input CxHxW]
 *          [--classes 1000] [--threads 1] [--rounds 5] [--steps 2]
 *          [--comm-reps 3] [--warmup 1] [--optim sgd|adam] [--momentum 0.9]
 *          [--bucket-mb 25] [--first-bucket-mb 1]
 *          [--sweep 4K,256K,1M,4M,25M,100M] [--sweep-reps 2] [--json FILE] [--dump 1]
 * --dump 1 prints every sample (rank, round, variant, phases) to stderr.
 * Last line: "RESULT key=value ...". Public headers only. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ctrain/ctrain.h"

static ct_comm *g_comm; /* for CK's abort: a rank that fails alone would leave the other waiting */

#define CK(x)                                                                                \
  do {                                                                                       \
    if ((x) != CT_OK) {                                                                      \
      fprintf(stderr, "bench_ddp: rank %d: %s: %s\n", ct_comm_rank(g_comm), #x, ct_last_error()); \
      if (g_comm) ct_comm_abort(g_comm, 1);                                                  \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

enum { V_COMPUTE, V_TIMELINE, V_DDP, V_COMM, NV };
static const char *const vname[NV] = {"compute", "timeline", "ddp", "comm"};
/* What each sample records; P_WAIT: DDP's wait_seconds of the step, P_HOOK:
 * time inside DDP's grads_ready. For comm, P_STEP is the whole exchange. */
enum { P_FWD, P_LOSS, P_BWD, P_SYNC, P_UPD, P_END, P_STEP, P_WAIT, P_HOOK, NP };
static const char *const pname[NP] = {"forward", "loss", "backward", "sync", "update", "end", "step", "wait", "hook"};

typedef struct hook_ev {
  int layer;
  size_t first, count;
} hook_ev;

typedef struct bench {
  ct_comm *c;
  int rank, world;
  ct_model *m;
  ct_step *s;
  ct_ddp *ddp;
  ct_step_hooks ddp_h, wrap; /* DDP's hooks; ours around them (or around nothing) */
  int inner;                 /* 1: our hooks call DDP's */
  hook_ev *ev;               /* grads_ready calls of one backward, in order */
  int nev, cap, learning;    /* learning: the first timeline step records ev */
  double t0;                 /* this backward's start */
  double *t_ev;              /* [nev] this step's hook times since t0 */
  int k;                     /* hooks seen in this step */
  double hook_s;             /* this step's time inside DDP's grads_ready */
  ct_batch b;
  int64_t step_no;
} bench;

static ct_status wrap_ready(void *ctx, ct_step *s, int layer, size_t first, size_t count) {
  bench *B = ctx;
  double t = bench_now();
  if (B->learning) {
    if (B->nev == B->cap) {
      B->cap = B->cap ? 2 * B->cap : 64;
      B->ev = realloc(B->ev, (size_t)B->cap * sizeof *B->ev);
      if (!B->ev) return ct_error(CT_ERR_OUT_OF_MEMORY, "bench_ddp: out of memory");
    }
    B->ev[B->nev++] = (hook_ev){layer, first, count};
  } else {
    /* Every backward must call the same hooks in the same order, or the
     * per-layer medians would mix layers. */
    if (B->k >= B->nev || B->ev[B->k].layer != layer)
      return ct_error(CT_ERR_INTERNAL, "bench_ddp: hook %d came for layer %d, expected %d", B->k, layer,
                      B->k < B->nev ? B->ev[B->k].layer : -1);
    B->t_ev[B->k] = t - B->t0;
  }
  B->k++;
  if (!B->inner) return CT_OK;
  ct_status st = B->ddp_h.grads_ready(B->ddp_h.ctx, s, layer, first, count);
  B->hook_s += bench_now() - t;
  return st;
}

static ct_status wrap_sync(void *ctx, ct_step *s) {
  bench *B = ctx;
  return B->inner ? B->ddp_h.sync(B->ddp_h.ctx, s) : CT_OK;
}

/* Without DDP the metrics stay this rank's (nothing to sum). */
static ct_status wrap_reduce(void *ctx, ct_step *s, ct_step_reduce what, ct_tensor *vals) {
  bench *B = ctx;
  return B->inner ? B->ddp_h.reduce(B->ddp_h.ctx, s, what, vals) : CT_OK;
}

/* Both ranks leave together. Twice: a rank that waited long in the first
 * polls it every 200 us (ct_comm's wait sleeps between polls) and may
 * leave that much late; the second starts with the ranks that close, so
 * it is left within a short poll. */
static void barrier(bench *B) {
  for (int i = 0; i < 2; i++) {
    int32_t one = 1;
    CK(ct_comm_allreduce(B->c, &one, 1, CT_I32, "the benchmark's barrier"));
  }
}

static double wait_total(const bench *B) {
  ct_ddp_stats st;
  ct_ddp_get_stats(B->ddp, &st);
  return st.wait_seconds;
}

/* One training step of variant v through the public phases; ph[NP]. */
static void run_step(bench *B, int v, double *ph) {
  ct_step_pos pos = ct_step_pos_single(B->step_no++);
  /* ct_fit's position under DDP: this rank's share of the global batch. */
  pos.factor = 1.0f / (float)B->world;
  pos.sample_offset = B->rank;
  pos.sample_stride = B->world;
  ct_step_set_hooks(B->s, v == V_COMPUTE ? NULL : &B->wrap);
  B->inner = v == V_DDP;
  B->k = 0;
  B->hook_s = 0;
  double w0 = wait_total(B), start = bench_now(), t = start, n;
#define LAP(p) (n = bench_now(), ph[p] = n - t, t = n)
  CK(ct_step_begin(B->s, &B->b, &pos));
  CK(ct_step_forward(B->s, NULL));
  LAP(P_FWD);
  CK(ct_step_loss(B->s));
  LAP(P_LOSS);
  B->t0 = t;
  CK(ct_step_backward(B->s));
  LAP(P_BWD);
  CK(ct_step_sync(B->s));
  LAP(P_SYNC);
  CK(ct_step_unscale_check_clip(B->s));
  CK(ct_step_update(B->s));
  LAP(P_UPD);
  ct_step_result r;
  int have = 0;
  CK(ct_step_end(B->s, &r, &have));
  LAP(P_END);
#undef LAP
  ph[P_STEP] = t - start;
  ph[P_WAIT] = wait_total(B) - w0;
  ph[P_HOOK] = B->hook_s;
  if (!B->learning && B->k != B->nev && v != V_COMPUTE) {
    fprintf(stderr, "bench_ddp: a backward called %d hooks, the first %d\n", B->k, B->nev);
    ct_comm_abort(B->c, 1);
  }
}

/* DDP's communication with no backward: every hook at once, then sync. */
static void run_comm(bench *B, double *ph) {
  memset(ph, 0, NP * sizeof *ph);
  ct_step_set_hooks(B->s, &B->wrap);
  B->inner = 1;
  B->k = 0;
  B->hook_s = 0;
  barrier(B);
  double w0 = wait_total(B), t = bench_now();
  B->t0 = t;
  for (int i = 0; i < B->nev; i++) CK(wrap_ready(B, B->s, B->ev[i].layer, B->ev[i].first, B->ev[i].count));
  double t1 = bench_now();
  CK(wrap_sync(B, B->s));
  ph[P_SYNC] = bench_now() - t1;
  ph[P_STEP] = bench_now() - t;
  ph[P_WAIT] = wait_total(B) - w0;
  ph[P_HOOK] = B->hook_s;
}

/* "4K", "1M", "25M", "1.5M" (powers of 1000 for M, as DDP's bucket MB;
 * K = 1024), or bytes. */
static double parse_size(const char *s) {
  char *e;
  double v = strtod(s, &e);
  if (*e == 'K' || *e == 'k') v *= 1024;
  else if (*e == 'M' || *e == 'm') v *= 1e6;
  else if (*e == 'G' || *e == 'g') v *= 1e9;
  return v;
}

/* Median of a copy of v[0..n). */
static double med(const double *v, int n) {
  if (n <= 0) return 0;
  double *w = malloc((size_t)n * sizeof *w);
  memcpy(w, v, (size_t)n * sizeof *w);
  double r = bench_median(w, n);
  free(w);
  return r;
}

int main(int argc, char **argv) {
  const char *model = "cnn", *json = NULL, *sweep_arg = "4K,256K,1M,4M,25M,100M";
  int batch = 8, classes = 1000, threads = 1, rounds = 5, steps = 2, creps = 3, warmup = 1, sweep_reps = 2, dump = 0;
  int c = 0, h = 0, w = 0;
  double momentum = 0.9, bucket_mb = 25, first_mb = 1;
  ct_optim_kind optim = CT_OPTIM_SGD;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "%s needs a value\n", a);
      return 2;
    }
    i++;
    if (!strcmp(a, "--model")) model = v;
    else if (!strcmp(a, "--batch")) batch = atoi(v);
    else if (!strcmp(a, "--classes")) classes = atoi(v);
    else if (!strcmp(a, "--threads")) threads = atoi(v);
    else if (!strcmp(a, "--rounds")) rounds = atoi(v);
    else if (!strcmp(a, "--steps")) steps = atoi(v);
    else if (!strcmp(a, "--comm-reps")) creps = atoi(v);
    else if (!strcmp(a, "--warmup")) warmup = atoi(v);
    else if (!strcmp(a, "--momentum")) momentum = atof(v);
    else if (!strcmp(a, "--bucket-mb")) bucket_mb = atof(v);
    else if (!strcmp(a, "--first-bucket-mb")) first_mb = atof(v);
    else if (!strcmp(a, "--sweep")) sweep_arg = v;
    else if (!strcmp(a, "--sweep-reps")) sweep_reps = atoi(v);
    else if (!strcmp(a, "--json")) json = v;
    else if (!strcmp(a, "--dump")) dump = atoi(v);
    else if (!strcmp(a, "--optim")) {
      if (!strcmp(v, "sgd")) optim = CT_OPTIM_SGD;
      else if (!strcmp(v, "adam")) optim = CT_OPTIM_ADAM;
      else {
        fprintf(stderr, "--optim wants sgd or adam, got '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--input")) {
      if (sscanf(v, "%dx%dx%d", &c, &h, &w) != 3) {
        fprintf(stderr, "--input wants CxHxW, got '%s'\n", v);
        return 2;
      }
    } else {
      fprintf(stderr, "unknown option %s\n", a);
      return 2;
    }
  }
  if (batch <= 0 || threads <= 0 || rounds <= 0 || steps <= 0 || creps <= 0 || warmup < 0 || sweep_reps < 0) {
    fprintf(stderr, "batch, threads, rounds, steps and comm-reps must be positive\n");
    return 2;
  }
  /* The sweep's sizes, in f32 elements. */
  size_t sw_n[32], sw_max = 0;
  int nsw = 0;
  for (const char *p = sweep_arg; *p && nsw < 32;) {
    double bytes = parse_size(p);
    if (bytes >= 4) {
      sw_n[nsw] = (size_t)(bytes / 4);
      if (sw_n[nsw] > sw_max) sw_max = sw_n[nsw];
      nsw++;
    }
    p = strchr(p, ',');
    if (!p) break;
    p++;
  }

  bench B;
  memset(&B, 0, sizeof B);
  if (ct_comm_open_mpi(&B.c) != CT_OK) {
    fprintf(stderr, "bench_ddp: %s\n", ct_last_error());
    return 1;
  }
  g_comm = B.c;
  B.rank = ct_comm_rank(B.c), B.world = ct_comm_size(B.c);
  omp_set_num_threads(threads);
  ct_device *dev;
  CK(ct_device_open("cpu", &dev));
  ct_device_set_threads(dev, threads);
  ct_model_options mo = {c, h, w, classes, 1};
  CK(ct_model_create(model, &mo, &B.m));
  CK(ct_model_prepare(B.m, dev, batch, 1));
  int ic, ih, iw;
  ct_model_input_shape(B.m, &ic, &ih, &iw);
  int64_t per = ct_model_input_ndim(B.m) == 1 ? ic : (int64_t)ic * ih * iw;
  size_t np;
  ct_model_params(B.m, &np);
  ct_optim_config oc = ct_optim_config_default(optim);
  if (optim == CT_OPTIM_SGD) oc.momentum = momentum;
  ct_optimizer *opt;
  CK(ct_optimizer_create(&oc, np, &opt));
  ct_step_config stc;
  ct_step_config_default(&stc);
  CK(ct_step_create(B.m, dev, opt, &stc, &B.s));
  ct_dist_config dc;
  memset(&dc, 0, sizeof dc);
  dc.comm = B.c, dc.bucket_mb = bucket_mb, dc.first_bucket_mb = first_mb;
  CK(ct_ddp_create(B.c, B.m, &dc, &B.ddp));
  CK(ct_ddp_broadcast_state(B.ddp));
  ct_ddp_hooks(B.ddp, &B.ddp_h);
  memset(&B.wrap, 0, sizeof B.wrap);
  B.wrap.ctx = &B, B.wrap.grads_ready = wrap_ready, B.wrap.sync = wrap_sync, B.wrap.reduce = wrap_reduce;

  /* This rank's synthetic batch: images U(-1, 1), uniform labels, a
   * stream per rank (each rank reads its own share of the data). */
  float *xd = aligned_alloc(64, ((sizeof(float) * (size_t)(per * batch)) + 63) / 64 * 64);
  int64_t *yd = malloc(sizeof(int64_t) * (size_t)batch);
  ct_rng r;
  ct_rng_init(&r, 7, CT_RNG_TEST, (uint32_t)B.rank, 0);
  for (int64_t i = 0; i < per * batch; i++) xd[i] = 2.0f * ct_rng_uniform(&r) - 1.0f;
  for (int i = 0; i < batch; i++) yd[i] = (int64_t)(ct_rng_uniform(&r) * (float)classes) % classes;
  B.b.x = ct_model_input_ndim(B.m) == 1 ? ct_tensor_2d(xd, CT_F32, batch, per) : ct_tensor_4d(xd, CT_F32, batch, ic, ih, iw);
  B.b.y = ct_tensor_1d(yd, CT_I64, batch);
  B.b.n = batch;
  float *swb = sw_max ? malloc(sw_max * sizeof(float)) : NULL;
  /* The sums double per call on 2 ranks; they reach inf after ~120 calls,
   * which changes nothing in the timing (no denormals, no NaN). */
  for (size_t i = 0; i < sw_max; i++) swb[i] = 1e-3f;

  double la0[3] = {0, 0, 0};
  FILE *lf = fopen("/proc/loadavg", "r");
  if (lf) {
    if (fscanf(lf, "%lf %lf %lf", &la0[0], &la0[1], &la0[2]) != 3) la0[0] = 0;
    fclose(lf);
  }

  /* Warm-up; the first timeline step learns the hooks' order. */
  double ph[NP];
  B.learning = 1;
  run_step(&B, V_TIMELINE, ph);
  B.learning = 0;
  B.t_ev = calloc((size_t)B.nev + 1, sizeof *B.t_ev);
  for (int i = 0; i < warmup; i++) {
    run_step(&B, V_COMPUTE, ph);
    run_step(&B, V_DDP, ph);
    run_comm(&B, ph);
  }

  int ns[NV];
  for (int v = 0; v < NV; v++) ns[v] = rounds * (v == V_COMM ? creps : steps);
  double *smp[NV][NP], *tev[NV];
  for (int v = 0; v < NV; v++) {
    for (int p = 0; p < NP; p++) smp[v][p] = calloc((size_t)ns[v], sizeof(double));
    tev[v] = calloc((size_t)ns[v] * (size_t)(B.nev + 1), sizeof(double));
  }
  double *swt = calloc((size_t)(nsw + 1) * (size_t)(rounds * sweep_reps + 1), sizeof(double));
  int idx[NV] = {0}, swi = 0;
  double t_start = bench_now();
  for (int rd = 0; rd < rounds; rd++) {
    /* NV + 1 blocks per round (the sweep last at first), rotated. */
    for (int j = 0; j <= NV; j++) {
      int v = (j + rd) % (NV + 1);
      if (v == NV) {
        for (int q = 0; q < sweep_reps; q++, swi++)
          for (int k = 0; k < nsw; k++) {
            barrier(&B);
            double t = bench_now();
            CK(ct_comm_allreduce(B.c, swb, sw_n[k], CT_F32, "the sweep's all-reduce"));
            swt[k * (rounds * sweep_reps) + swi] = bench_now() - t;
          }
        continue;
      }
      int reps = v == V_COMM ? creps : steps;
      barrier(&B);
      for (int q = 0; q < reps; q++) {
        if (v == V_COMM) run_comm(&B, ph);
        else run_step(&B, v, ph);
        for (int p = 0; p < NP; p++) smp[v][p][idx[v]] = ph[p];
        if (dump) {
          /* every sample, for looking at the spread behind a median */
          fprintf(stderr, "sample rank %d round %d %s:", B.rank, rd, vname[v]);
          for (int p = 0; p < NP; p++) fprintf(stderr, " %s %.2f", pname[p], ph[p] * 1e3);
          fprintf(stderr, "\n");
        }
        for (int e = 0; e < B.nev; e++) tev[v][(size_t)e * (size_t)ns[v] + (size_t)idx[v]] = B.t_ev[e];
        idx[v]++;
      }
    }
  }
  double t_total = bench_now() - t_start;

  /* Every rank's samples, gathered (a few thousand doubles): per variant
   * and phase ns[v], then the sweep's. */
  int nsr = rounds * sweep_reps;
  size_t off[NV], nm = 0;
  for (int v = 0; v < NV; v++) off[v] = nm, nm += (size_t)NP * (size_t)ns[v];
  size_t off_sw = nm;
  nm += (size_t)nsw * (size_t)nsr;
  double *mine = calloc(nm + 1, sizeof(double)), *all = calloc(nm * (size_t)B.world + 1, sizeof(double));
  for (int v = 0; v < NV; v++)
    for (int p = 0; p < NP; p++) memcpy(mine + off[v] + (size_t)p * (size_t)ns[v], smp[v][p], (size_t)ns[v] * sizeof(double));
  memcpy(mine + off_sw, swt, (size_t)nsw * (size_t)nsr * sizeof(double));
  CK(ct_comm_allgather(B.c, mine, all, nm * sizeof(double), "the gathering of the samples"));
  /* This rank's median hook times, and the median per-layer intervals of
   * the timeline (the first from the backward's start: the loss gradient
   * and any layers without parameters after the last one with). */
  double *t_tl = calloc((size_t)B.nev + 1, sizeof(double)), *t_dd = calloc((size_t)B.nev + 1, sizeof(double));
  double *dt = calloc((size_t)B.nev + 1, sizeof(double)), *iv = calloc((size_t)ns[V_TIMELINE], sizeof(double));
  for (int e = 0; e < B.nev; e++) {
    const double *te = tev[V_TIMELINE] + (size_t)e * (size_t)ns[V_TIMELINE];
    t_tl[e] = med(te, ns[V_TIMELINE]);
    t_dd[e] = med(tev[V_DDP] + (size_t)e * (size_t)ns[V_DDP], ns[V_DDP]);
    for (int q = 0; q < ns[V_TIMELINE]; q++) iv[q] = te[q] - (e ? te[q - ns[V_TIMELINE]] : 0);
    dt[e] = med(iv, ns[V_TIMELINE]);
  }
  double la1[3] = {0, 0, 0};
  lf = fopen("/proc/loadavg", "r");
  if (lf) {
    if (fscanf(lf, "%lf %lf %lf", &la1[0], &la1[1], &la1[2]) != 3) la1[0] = 0;
    fclose(lf);
  }

  if (B.rank == 0) {
    /* fig: per step, the slowest rank (a DDP step waits for it; for wait
     * the rank that waited least: the other one's wait includes its lead
     * over the slower rank, which is imbalance, not communication); then
     * the median over steps. rk: each rank's own median. */
    double fig[NV][NP], *rk = calloc((size_t)NV * NP * (size_t)B.world, sizeof(double));
    double *ps = calloc(nm + 1, sizeof(double)); /* the across-ranks figure of each sample, laid out as all */
    double *col = calloc((size_t)(ns[V_COMPUTE] + ns[V_COMM] + nsr + 1), sizeof(double));
    for (int v = 0; v < NV; v++)
      for (int p = 0; p < NP; p++) {
        size_t o = off[v] + (size_t)p * (size_t)ns[v];
        for (int q = 0; q < ns[v]; q++) {
          double x = all[o + (size_t)q];
          for (int k = 1; k < B.world; k++) {
            double y = all[(size_t)k * nm + o + (size_t)q];
            x = p == P_WAIT ? (y < x ? y : x) : (y > x ? y : x);
          }
          ps[o + (size_t)q] = x;
        }
        fig[v][p] = med(ps + o, ns[v]);
        for (int k = 0; k < B.world; k++) rk[(v * NP + p) * B.world + k] = med(all + (size_t)k * nm + o, ns[v]);
      }
    /* Paired by round: the variants of one round ran within seconds of
     * each other, so their differences carry less of this VM's drift than
     * differences of medians over the whole run. Per round the mean of its
     * steps; then the median over rounds. noise: the timeline and compute
     * steps are the same work measured twice. */
    double *pr[5];
    for (int i = 0; i < 5; i++) pr[i] = calloc((size_t)rounds, sizeof(double));
    for (int rd = 0; rd < rounds; rd++) {
      double m[NV][NP];
      for (int v = 0; v < NV; v++)
        for (int p = 0; p < NP; p++) {
          int per = ns[v] / rounds;
          m[v][p] = 0;
          for (int q = rd * per; q < (rd + 1) * per; q++) m[v][p] += ps[off[v] + (size_t)p * (size_t)ns[v] + (size_t)q] / per;
        }
      double d = m[V_DDP][P_STEP] - m[V_COMPUTE][P_STEP], cm = m[V_COMM][P_STEP];
      pr[0][rd] = d;
      pr[1][rd] = cm > 0 ? 1 - d / cm : 0;
      pr[2][rd] = cm > 0 ? 1 - m[V_DDP][P_WAIT] / cm : 0;
      pr[3][rd] = m[V_TIMELINE][P_STEP] - m[V_COMPUTE][P_STEP];
      pr[3][rd] = pr[3][rd] < 0 ? -pr[3][rd] : pr[3][rd];
      pr[4][rd] = m[V_DDP][P_BWD] - m[V_COMPUTE][P_BWD];
    }
    double p_diff = med(pr[0], rounds), p_eff = med(pr[1], rounds), p_hid = med(pr[2], rounds);
    double p_noise = med(pr[3], rounds), p_bwd = med(pr[4], rounds);
    double *swf = calloc((size_t)nsw + 1, sizeof(double));
    for (int i = 0; i < nsw; i++) {
      size_t o = off_sw + (size_t)i * (size_t)nsr;
      for (int q = 0; q < nsr; q++) {
        double x = 0;
        for (int k = 0; k < B.world; k++) x = all[(size_t)k * nm + o + (size_t)q] > x ? all[(size_t)k * nm + o + (size_t)q] : x;
        col[q] = x;
      }
      swf[i] = med(col, nsr);
    }
    double grad_mb = 0;
    for (int e = 0; e < B.nev; e++) grad_mb += (double)B.ev[e].count * 4 / 1e6;
    printf("%s, batch %d per rank, input %dx%dx%d, %d classes, %d rank(s) x %d thread(s), %s; %d rounds of %d steps "
           "(comm: %d reps) per variant after %d warm-up, %.0f s; load %.2f -> %.2f\n",
           model, batch, ic, ih, iw, classes, B.world, threads, optim == CT_OPTIM_SGD ? "sgd" : "adam", rounds, steps,
           creps, warmup, t_total, la0[0], la1[0]);
    printf("gradients %.1f MB in %d hook calls, %d bucket(s) (first %.3g MB, then %.3g MB)\n", grad_mb, B.nev,
           ct_ddp_bucket_count(B.ddp), first_mb, bucket_mb);
    printf("median wall ms (first line: per step the slowest rank, for wait the rank that waited least; then each "
           "rank's own):\n  %-9s",
           "variant");
    for (int p = 0; p < NP; p++) printf(" %9s", pname[p]);
    printf("\n");
    for (int v = 0; v < NV; v++) {
      printf("  %-9s", vname[v]);
      for (int p = 0; p < NP; p++) printf(" %9.2f", fig[v][p] * 1e3);
      printf("\n");
      for (int k = 0; k < B.world && B.world > 1; k++) {
        printf("   rank %-3d", k);
        for (int p = 0; p < NP; p++) printf(" %9.2f", rk[(v * NP + p) * B.world + k] * 1e3);
        printf("\n");
      }
    }
    double comp = fig[V_COMPUTE][P_STEP], ddp = fig[V_DDP][P_STEP], comm = fig[V_COMM][P_STEP];
    double exposed = fig[V_DDP][P_WAIT], hook = fig[V_DDP][P_HOOK];
    double hidden = comm > 0 ? 1 - exposed / comm : 0, eff = comm > 0 ? 1 - (ddp - comp) / comm : 0;
    if (B.world < 2) hidden = eff = p_hid = p_eff = 0; /* one rank: nothing is sent, the shares mean nothing */
    printf("compute alone %.2f ms, ddp step %.2f ms (+%.2f), comm alone %.2f ms; exposed (wait in sync) %.2f ms, "
           "inside the backward's hooks %.2f ms\n",
           comp * 1e3, ddp * 1e3, (ddp - comp) * 1e3, comm * 1e3, exposed * 1e3, hook * 1e3);
    printf("hidden share 1 - exposed/comm = %.3f; effective 1 - (ddp - compute)/comm = %.3f\n", hidden, eff);
    printf("paired by round (median over %d rounds): ddp - compute %.2f ms (backward %+.2f), hidden %.3f, effective "
           "%.3f; |timeline - compute| (the same work twice: the noise) %.2f ms\n",
           rounds, p_diff * 1e3, p_bwd * 1e3, p_hid, p_eff, p_noise * 1e3);
    printf("sweep: blocking ct_comm_allreduce, median ms per size (slowest rank per call):");
    for (int k = 0; k < nsw; k++) printf(" %zuB=%.3f", sw_n[k] * 4, swf[k] * 1e3);
    printf("\nper-layer backward (grads_ready times since the backward's start, rank 0, median ms):\n"
           "  %-4s %-5s %-24s %10s %10s %10s %10s\n",
           "#", "layer", "name", "grad MB", "final at", "interval", "under ddp");
    for (int e = 0; e < B.nev; e++)
      printf("  %-4d %-5d %-24s %10.3f %10.3f %10.3f %10.3f\n", e, B.ev[e].layer, ct_model_layer_name(B.m, B.ev[e].layer),
             (double)B.ev[e].count * 4 / 1e6, t_tl[e] * 1e3, dt[e] * 1e3, t_dd[e] * 1e3);
    printf("  backward ends at %.3f (timeline), %.3f (compute), %.3f (ddp)\n", fig[V_TIMELINE][P_BWD] * 1e3,
           fig[V_COMPUTE][P_BWD] * 1e3, fig[V_DDP][P_BWD] * 1e3);

    if (json) {
      FILE *f = fopen(json, "w");
      if (!f) {
        fprintf(stderr, "bench_ddp: cannot write %s\n", json);
        ct_comm_abort(B.c, 1);
      }
      fprintf(f, "{\n \"model\": \"%s\", \"input\": [%d, %d, %d], \"classes\": %d, \"batch\": %d, \"world\": %d, "
                 "\"threads\": %d, \"optim\": \"%s\",\n \"bucket_mb\": %g, \"first_bucket_mb\": %g, \"ddp_buckets\": %d, "
                 "\"rounds\": %d, \"steps\": %d, \"comm_reps\": %d, \"seconds\": %.1f, \"load\": [%.2f, %.2f],\n",
              model, ic, ih, iw, classes, batch, B.world, threads, optim == CT_OPTIM_SGD ? "sgd" : "adam", bucket_mb,
              first_mb, ct_ddp_bucket_count(B.ddp), rounds, steps, creps, t_total, la0[0], la1[0]);
      /* Parameters in state order: DDP's buckets are built from these. */
      float *g0 = ct_model_grads(B.m, NULL);
      fprintf(f, " \"params\": [");
      int first = 1;
      for (int i = 0; i < ct_model_state_count(B.m); i++) {
        const ct_state_entry *se = ct_model_state(B.m, i);
        if (se->is_buffer || !se->grad.data) continue;
        fprintf(f, "%s\n  {\"name\": \"%s\", \"first\": %zu, \"count\": %lld}", first ? "" : ",", se->name,
                (size_t)((float *)se->grad.data - g0), (long long)ct_tensor_numel(&se->grad));
        first = 0;
      }
      fprintf(f, "],\n \"events\": [");
      for (int e = 0; e < B.nev; e++)
        fprintf(f, "%s\n  {\"layer\": %d, \"name\": \"%s\", \"first\": %zu, \"count\": %zu, \"t_ms\": %.4f, "
                   "\"dt_ms\": %.4f, \"t_ddp_ms\": %.4f}",
                e ? "," : "", B.ev[e].layer, ct_model_layer_name(B.m, B.ev[e].layer), B.ev[e].first, B.ev[e].count,
                t_tl[e] * 1e3, dt[e] * 1e3, t_dd[e] * 1e3);
      fprintf(f, "],\n \"sweep\": [");
      for (int k = 0; k < nsw; k++) fprintf(f, "%s\n  {\"bytes\": %zu, \"ms\": %.4f}", k ? "," : "", sw_n[k] * 4, swf[k] * 1e3);
      /* Per variant and phase: the across-ranks figure, then each rank's median, ms. */
      fprintf(f, "],\n \"paired\": {\"ddp_minus_compute\": %.4f, \"backward_ddp_minus_compute\": %.4f, \"hidden\": %.4f, "
                 "\"effective\": %.4f, \"noise\": %.4f},",
              p_diff * 1e3, p_bwd * 1e3, p_hid, p_eff, p_noise * 1e3);
      fprintf(f, "\n \"variants\": {");
      for (int v = 0; v < NV; v++) {
        fprintf(f, "%s\n  \"%s\": {", v ? "," : "", vname[v]);
        for (int p = 0; p < NP; p++) {
          fprintf(f, "%s\"%s\": %.4f, \"%s_ranks\": [", p ? ", " : "", pname[p], fig[v][p] * 1e3, pname[p]);
          for (int k = 0; k < B.world; k++) fprintf(f, "%s%.4f", k ? ", " : "", rk[(v * NP + p) * B.world + k] * 1e3);
          fprintf(f, "]");
        }
        fprintf(f, "}");
      }
      fprintf(f, "}\n}\n");
      fclose(f);
    }
    printf("RESULT model=%s batch=%d world=%d threads=%d compute_ms=%.3f ddp_ms=%.3f comm_ms=%.3f exposed_ms=%.3f "
           "hook_ms=%.3f hidden=%.4f effective_hidden=%.4f paired_diff_ms=%.3f paired_effective=%.4f noise_ms=%.3f "
           "buckets=%d grad_mb=%.2f load=%.2f\n",
           model, batch, B.world, threads, comp * 1e3, ddp * 1e3, comm * 1e3, exposed * 1e3, hook * 1e3, hidden, eff,
           p_diff * 1e3, p_eff, p_noise * 1e3, ct_ddp_bucket_count(B.ddp), grad_mb, la1[0]);
    free(rk), free(col), free(swf), free(ps);
    for (int i = 0; i < 5; i++) free(pr[i]);
  }
  fflush(stdout);
  for (int v = 0; v < NV; v++) {
    for (int p = 0; p < NP; p++) free(smp[v][p]);
    free(tev[v]);
  }
  free(swt), free(mine), free(all), free(dt), free(iv), free(t_tl), free(t_dd), free(B.t_ev), free(B.ev), free(swb), free(xd), free(yd);
  ct_ddp_destroy(B.ddp);
  ct_step_destroy(B.s);
  ct_optimizer_destroy(opt);
  ct_model_destroy(B.m);
  ct_device_close(dev);
  ct_comm_close(B.c);
  return 0;
}
