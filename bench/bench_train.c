/* Training throughput of a zoo model through the step `ctrain train` runs
 * (include/ctrain/step.h: forward, cross-entropy, backward overwriting the
 * gradients, Adam step) but on in-memory random data, so the loader is out
 * of the measurement. Public headers only. On --device cuda the model is
 * resident and each step reads its statistics back at once (lag 0: batch
 * copied to the GPU, fused optimizer, read-back), so a step's wall time
 * includes one host-device round trip the trainer's lagged read-back hides.
 * Prepares the model, runs warm-up steps, then times each step (bf16 =
 * opt level O1, autocast-style); prints the median step time as images/s,
 * process CPU time per step divided by the threads (an uncontended
 * estimate on a shared machine; cpu only),
 * the forward conv/linear FLOPs (training = 3x forward) and achieved
 * GFLOP/s, and peak RSS.
 *
 * Usage: bench_train --model NAME [--batch 128] [--input CxHxW]
 *                    [--classes 10] [--steps 20] [--warmup 3]
 *                    [--threads 2] [--precision fp32|bf16|fp16] [--profile]
 *                    [--no-fuse] [--no-conv-gemm] [--[no-]conv-thin]
 *                    [--memory-format auto|contiguous|channels-last]
 *                    [--recompute auto|cheap|norm|selective|N|off] [--optim adam|sgd]
 *                    [--momentum F] [--device cpu|cuda[:N]] [--cudnn-benchmark] [--tf32]
 *                    [--profiler-range] [--noop-hooks]
 * --profile adds the step's phases (forward, loss, backward with the loss
 * gradient, optimizer; cpu) and per-layer forward/backward medians
 * (ct_model_rerun_layer: layers re-run one by one on the bound step; for
 * finding where a step's time goes);
 * --no-fuse turns off the ReLU folding of src/plan/fuse.c (and with it
 * cuDNN's fused batch norm + ReLU), the residual adds' gradient sharing
 * and the accumulating convolution backward-data (src/plan/exec_plan.c);
 * --no-conv-gemm sends the cpu's small-map convolutions to oneDNN's
 * primitives instead of batched GEMMs (src/backend/cpu/dnnl_conv_gemm.c),
 * --no-conv-thin and --conv-thin turn off or force the first layers'
 * paths (one-channel weight gradients, large-kernel forwards:
 * src/backend/cpu/dnnl_conv_thin.c; by default on only where oneDNN has
 * no AVX-512 kernels);
 * --memory-format
 * picks the activation layouts (src/plan/layout.h; contiguous keeps every
 * activation NCHW; --plain-layouts is kept as its old spelling);
 * --recompute sets ct_model_set_recompute before prepare (auto = the
 * mode with the smallest plan, cheap = batch norm/activation/add/
 * dropout outputs only, norm = batch norm outputs only, selective = norm
 * and the cheapest convolutions run again, N >= 2 segments,
 * off/0/1 = none)
 * and the summary names the segments and the layers run forward twice;
 * --optim sgd swaps Adam for plain SGD (lr 0.01, no momentum: no state),
 * what bench/recompute.sh uses to match torch.optim.SGD; --momentum sets
 * SGD's (bench/gpu/run_gpu.sh: 0.9, as its PyTorch side).
 * On cuda: --precision fp16 too (O1 with the dynamic loss scale, as
 * `ctrain train`), --cudnn-benchmark and --tf32 as `ctrain train`'s, and --profile
 * times each layer's forward and backward between two device
 * synchronisations (wall time, so each includes a launch and a sync,
 * some microseconds) and then lists the backend's choices (each cuDNN
 * plan's algorithm, cudnnFind* times, workspace, scratch; the backend's
 * describe op); the RSS figures are the host's, the device's peak
 * is reported beside them. --profile ends with the memory plan at its
 * peak (ct_model_memory_report: live buffers by kind, the 10 largest).
 * --profiler-range brackets the timed steps with
 * cudaProfilerStart/Stop, so `ncu --profile-from-start off` records just
 * their kernels (bench/gpu/ncu_table.py). --threads is the host's OpenMP threads.
 * --noop-hooks installs step hooks that do nothing (what calling a
 * strategy's hooks costs; the RESULT line says hooks=1).
 * Last line: "RESULT key=value ..." for bench/run.sh. */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench_util.h"
#include "ctrain/ctrain.h"

#define CK(x)                                             \
  do {                                                    \
    if ((x) != CT_OK) {                                   \
      fprintf(stderr, "%s: %s\n", #x, ct_last_error());   \
      exit(1);                                            \
    }                                                     \
  } while (0)

/* Resident set now (VmRSS), MB; 0 where /proc is not there. */
static double vmrss_mb(void) {
  char line[256];
  double kb = 0;
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %lf", &kb) == 1) break;
  fclose(f);
  return kb / 1024.0;
}

enum { STEP_PHASES = 4 };

typedef struct step_ctx {
  ct_model *m;
  ct_device *dev;
  ct_optimizer *opt;
  ct_step *step;      /* the one training step (ct_fit's), read back at once */
  ct_batch b;
  int resident;       /* the model lives on the device: its phases are queued, not timed */
  double *phase[STEP_PHASES]; /* per timed step wall seconds, or NULL */
  int timed;                  /* index of the timed step being run */
} step_ctx;

static const char *const phase_name[STEP_PHASES] = {"forward", "loss", "backward", "optimizer"};

/* Wall time of phase p of the current step when the phases are recorded. */
static void mark(step_ctx *c, int p, double *t) {
  double n = bench_now();
  if (c->phase[p]) c->phase[p][c->timed] = n - *t;
  *t = n;
}

/* --noop-hooks: strategy hooks that do nothing, to measure what calling
 * them costs (a run without hooks calls none). */
static ct_status noop_ready(void *ctx, ct_step *s, int layer, size_t first, size_t count) {
  (void)ctx, (void)s, (void)layer, (void)first, (void)count;
  return CT_OK;
}
static ct_status noop_sync(void *ctx, ct_step *s) {
  (void)ctx, (void)s;
  return CT_OK;
}
static ct_status noop_reduce(void *ctx, ct_step *s, ct_step_reduce what, ct_tensor *vals) {
  (void)ctx, (void)s, (void)what, (void)vals;
  return CT_OK;
}

/* One step through the public step's phases (on a device the GPU runs
 * them asynchronously and the phase marks time only their queuing). */
static double step(step_ctx *c, uint32_t k) {
  ct_step_pos pos = ct_step_pos_single(k);
  ct_step_result r;
  int have = 0;
  double t = bench_now();
  CK(ct_step_begin(c->step, &c->b, &pos));
  CK(ct_step_forward(c->step, NULL));
  mark(c, 0, &t);
  CK(ct_step_loss(c->step));
  mark(c, 1, &t);
  CK(ct_step_backward(c->step));
  mark(c, 2, &t);
  CK(ct_step_unscale_check_clip(c->step));
  CK(ct_step_update(c->step));
  mark(c, 3, &t);
  CK(ct_step_end(c->step, &r, &have));
  return have ? r.loss : 0;
}

/* The time of one layer pass. On the cpu: CPU time / threads (wall time
 * of one layer is mostly preemption noise on a loaded machine). On a
 * device: wall time between two synchronisations. */
static double layer_clock(step_ctx *c, int threads) {
  if (c->resident) {
    CK(ct_device_sync(c->dev));
    return bench_now();
  }
  return bench_cpu_now() / threads;
}

/* Per-layer medians: re-runs each layer's forward and then each backward
 * on the tensors the last step bound. */
static void profile(step_ctx *c, int runs, int threads) {
  ct_model *m = c->m;
  int L = ct_model_layer_count(m);
  double *tf = calloc((size_t)L * (size_t)runs, sizeof(double)), *tb = calloc((size_t)L * (size_t)runs, sizeof(double));
  for (int r = 0; r < runs; r++) {
    step(c, (uint32_t)r);
    for (int i = 0; i < L; i++) {
      double t0 = layer_clock(c, threads);
      CK(ct_model_rerun_layer(m, i, 0));
      tf[i * runs + r] = layer_clock(c, threads) - t0;
    }
    for (int i = L - 1; i >= 0; i--) {
      double t0 = layer_clock(c, threads);
      CK(ct_model_rerun_layer(m, i, 1));
      tb[i * runs + r] = layer_clock(c, threads) - t0;
    }
  }
  double sf = 0, sb = 0;
  printf("per-layer medians of %s over %d runs (ms):\n  %-4s %-12s %-22s %9s %9s\n",
         c->resident ? "wall time between device syncs" : "cpu-time/threads", runs, "#", "kind", "name", "forward",
         "backward");
  for (int i = 0; i < L; i++) {
    double f = bench_median(tf + i * runs, runs) * 1e3, b = bench_median(tb + i * runs, runs) * 1e3;
    sf += f, sb += b;
    printf("  %-4d %-12s %-22s %9.3f %9.3f%s\n", i, ct_model_layer_kind(m, i), ct_model_layer_name(m, i), f, b,
           ct_model_layer_fused_act(m, i) ? "  (+act)" : "");
  }
  printf("  %-39s %9.3f %9.3f\n", "sum", sf, sb);
  free(tf), free(tb);
}

int main(int argc, char **argv) {
  const char *model = "cnn";
  int batch = 128, classes = 10, steps = 20, warmup = 3, threads = 2, prof = 0;
  int c = 0, h = 0, w = 0;
  const char *prec = "fp32", *device = "cpu";
  ct_memory_format fmt = CT_MEMORY_FORMAT_AUTO;
  int recompute = 0, cudnn_benchmark = 0, tf32 = 0, profiler_range = 0, noop_hooks = 0;
  double momentum = 0;
  ct_optim_kind optim = CT_OPTIM_ADAM;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--profile")) {
      prof = 1;
      continue;
    }
    if (!strcmp(a, "--cudnn-benchmark")) {
      cudnn_benchmark = 1;
      continue;
    }
    if (!strcmp(a, "--tf32")) {
      tf32 = 1;
      continue;
    }
    if (!strcmp(a, "--profiler-range")) {
      profiler_range = 1;
      continue;
    }
    if (!strcmp(a, "--noop-hooks")) {
      noop_hooks = 1;
      continue;
    }
    if (!strcmp(a, "--no-fuse")) {
      ct_tuning_set_fusion(0);
      continue;
    }
    if (!strcmp(a, "--no-conv-gemm")) {
      ct_tuning_set_cpu_conv_gemm(0);
      continue;
    }
    if (!strcmp(a, "--no-conv-thin") || !strcmp(a, "--conv-thin")) {
      ct_tuning_set_cpu_conv_thin(a[2] == 'c');
      continue;
    }
    if (!strcmp(a, "--plain-layouts")) {
      fmt = CT_MEMORY_FORMAT_CONTIGUOUS;
      continue;
    }
    if (!v) {
      fprintf(stderr, "%s needs a value\n", a);
      return 2;
    }
    i++;
    if (!strcmp(a, "--model")) model = v;
    else if (!strcmp(a, "--batch")) batch = atoi(v);
    else if (!strcmp(a, "--classes")) classes = atoi(v);
    else if (!strcmp(a, "--steps")) steps = atoi(v);
    else if (!strcmp(a, "--warmup")) warmup = atoi(v);
    else if (!strcmp(a, "--threads")) threads = atoi(v);
    else if (!strcmp(a, "--precision")) prec = v;
    else if (!strcmp(a, "--device")) device = v;
    else if (!strcmp(a, "--momentum")) momentum = atof(v);
    else if (!strcmp(a, "--optim")) {
      if (!strcmp(v, "adam")) optim = CT_OPTIM_ADAM;
      else if (!strcmp(v, "sgd")) optim = CT_OPTIM_SGD;
      else {
        fprintf(stderr, "--optim wants adam or sgd, got '%s'\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--recompute")) {
      if (ct_recompute_parse(v, &recompute) != CT_OK) {
        fprintf(stderr, "--recompute: %s\n", ct_last_error());
        return 2;
      }
    }
    else if (!strcmp(a, "--memory-format")) {
      if (ct_memory_format_parse(v, &fmt) != CT_OK) {
        fprintf(stderr, "%s\n", ct_last_error());
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
  if (batch <= 0 || steps <= 0 || warmup < 0 || threads <= 0) {
    fprintf(stderr, "batch, steps and threads must be positive\n");
    return 2;
  }
  omp_set_num_threads(threads);
  ct_device *dev;
  CK(ct_device_open(device, &dev));
  ct_device_set_threads(dev, threads);
  if (cudnn_benchmark && ct_device_set_cudnn_benchmark(dev, 1) != CT_OK) {
    fprintf(stderr, "--cudnn-benchmark: %s\n", ct_last_error());
    return 2;
  }
  if (tf32) CK(ct_device_set_tf32(dev, 1));
  ct_model_options mo = {c, h, w, classes, 1};
  ct_model *m;
  CK(ct_model_create(model, &mo, &m));
  int fp16 = !strcmp(prec, "fp16");
  if (!strcmp(prec, "bf16") || fp16) {
    /* autocast, like torch.autocast */
    CK(ct_model_set_precision(m, fp16 ? CT_PRECISION_FP16 : CT_PRECISION_BF16, CT_OPT_O1));
  } else if (strcmp(prec, "fp32")) {
    fprintf(stderr, "--precision wants fp32, bf16 or fp16, got '%s'\n", prec);
    return 2;
  }
  CK(ct_model_set_memory_format(m, fmt));
  CK(ct_model_set_recompute(m, recompute));
  ct_optim_config oc = ct_optim_config_default(optim);
  if (optim == CT_OPTIM_SGD) oc.momentum = momentum;
  /* A device that keeps the model resident holds the optimizer's state in
   * the model's block, as `ctrain train` reserves it. */
  if (!strncmp(ct_device_name(dev), "cuda", 4)) ct_model_reserve_optimizer_state(m, ct_optim_state_buffers(&oc));
  CK(ct_model_prepare(m, dev, batch, 1));
  int ic, ih, iw;
  ct_model_input_shape(m, &ic, &ih, &iw);
  int64_t per = ct_model_input_ndim(m) == 1 ? ic : (int64_t)ic * ih * iw;

  step_ctx sc;
  memset(&sc, 0, sizeof sc);
  sc.m = m;
  sc.dev = dev;
  size_t np;
  ct_model_params(m, &np);
  CK(ct_optimizer_create(&oc, np, &sc.opt));
  ct_step_config stc;
  ct_step_config_default(&stc);
  /* `ctrain train`'s scaler: dynamic from 2^16 for fp16 (O1), off otherwise. */
  ct_grad_scaler_init(&stc.scaler, fp16, 1, 65536.0);
  CK(ct_step_create(m, dev, sc.opt, &stc, &sc.step));
  sc.resident = ct_step_on_device(sc.step);
  ct_step_hooks hooks = {.grads_ready = noop_ready, .sync = noop_sync, .reduce = noop_reduce};
  if (noop_hooks) ct_step_set_hooks(sc.step, &hooks);
  /* Random, non-constant data: images in [-1, 1), labels uniform. */
  float *xd = malloc(sizeof(float) * (size_t)(per * batch));
  int64_t *yd = malloc(sizeof(int64_t) * (size_t)batch);
  ct_rng r;
  ct_rng_init(&r, 7, CT_RNG_TEST, 0, 0);
  for (int64_t i = 0; i < per * batch; i++) xd[i] = 2.0f * ct_rng_uniform(&r) - 1.0f;
  for (int i = 0; i < batch; i++) yd[i] = (int64_t)(ct_rng_uniform(&r) * (float)classes) % classes;
  if (ct_model_input_ndim(m) == 1)
    sc.b.x = ct_tensor_2d(xd, CT_F32, batch, per);
  else
    sc.b.x = ct_tensor_4d(xd, CT_F32, batch, ic, ih, iw);
  sc.b.y = ct_tensor_1d(yd, CT_I64, batch);
  sc.b.n = batch;

  double rss0_mb = vmrss_mb(); /* before the first step: the arena's pages are not touched yet */
  for (int i = 0; i < warmup; i++) step(&sc, (uint32_t)i);
  double *t = malloc(sizeof(double) * (size_t)steps), *ct = malloc(sizeof(double) * (size_t)steps);
  if (prof && !sc.resident)
    for (int p = 0; p < STEP_PHASES; p++) sc.phase[p] = malloc(sizeof(double) * (size_t)steps);
  double loss = 0;
  if (profiler_range && ct_device_set_profiler_range(dev, 1) != CT_OK) {
    fprintf(stderr, "bench_train: --profiler-range: %s\n", ct_last_error());
    return 2;
  }
  for (int i = 0; i < steps; i++) {
    sc.timed = i;
    double c0 = bench_cpu_now(), t0 = bench_now();
    loss = step(&sc, (uint32_t)(warmup + i));
    t[i] = bench_now() - t0;
    ct[i] = (bench_cpu_now() - c0) / threads;
  }
  if (profiler_range) CK(ct_device_set_profiler_range(dev, 0));
  double tmin = t[0], tmax = t[0];
  for (int i = 0; i < steps; i++) tmin = t[i] < tmin ? t[i] : tmin, tmax = t[i] > tmax ? t[i] : tmax;
  double med = bench_median(t, steps), cmed = bench_median(ct, steps);
  double flop = 3.0 * 2.0 * ct_model_forward_macs(m, 0) * batch; /* training step = 3x forward */
  double rc_flop = 2.0 * ct_model_forward_macs(m, 1) * batch;    /* recompute: one more forward of the dropped layers */
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double rss_mb = (double)ru.ru_maxrss / 1024.0;
  double la[3] = {0, 0, 0};
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3) la[0] = la[1] = la[2] = 0;
    fclose(f);
  }
  const char *oname = optim == CT_OPTIM_SGD ? "sgd" : "adam";
  int segs = ct_model_recompute_segments(m), rcl = ct_model_recompute_layers(m);
  double plan_mb = ct_model_plan_bytes(m) / 1048576.0, state_mb = ct_model_state_bytes(m) / 1048576.0;
  printf("%s %s train step (%s), batch %d, input %dx%dx%d, %d threads, median of %d after %d warm-up:\n", model, prec,
         oname, batch, ic, ih, iw, threads, steps, warmup);
  printf("  wall: median %.2f ms (min %.2f, max %.2f) = %.0f img/s, %.1f GFLOP/s\n", med * 1e3, tmin * 1e3, tmax * 1e3,
         batch / med, flop / med * 1e-9);
  if (!sc.resident)
    printf("  cpu-time/threads: median %.2f ms = %.0f img/s, %.1f GFLOP/s (uncontended estimate)\n", cmed * 1e3,
           batch / cmed, flop / cmed * 1e-9);
  printf("  %.3f GFLOP per step (forward conv/linear MACs x2 x3), plan %.1f MB, peak RSS %.0f MB, loss %.4f, load %.2f\n",
         flop * 1e-9, plan_mb, rss_mb, loss, la[0]);
  char how[32];
  printf("  recompute: %s, %d of %d layers run forward twice (+%.3f GFLOP, +%.1f%%); parameters+gradients %.1f MB, "
         "RSS before the first step %.0f MB\n",
         ct_recompute_mode_str(ct_model_recompute_mode(m), how, sizeof how), rcl, ct_model_layer_count(m), rc_flop * 1e-9,
         100.0 * rc_flop / flop, state_mb, rss0_mb);
  if (sc.resident)
    printf("  on %s: device memory peak %.1f MB (plan + state + scratch), %s\n", ct_device_name(dev),
           ct_device_mem_peak(dev) / 1048576.0, cudnn_benchmark ? "cudnn_benchmark" : "cuDNN heuristics");
  if (prof && !sc.resident) {
    printf("phases of the step, median wall ms over the %d timed steps:", steps);
    for (int p = 0; p < STEP_PHASES; p++) {
      printf(" %s %.3f", phase_name[p], bench_median(sc.phase[p], steps) * 1e3);
      free(sc.phase[p]);
      sc.phase[p] = NULL;
    }
    printf("\n");
  }
  if (prof) profile(&sc, steps < 5 ? 5 : steps, threads);
  size_t need = prof ? ct_device_describe(dev, NULL, 0) : 0;
  if (need) {
    /* cuda: which cuDNN algorithm each convolution pass settled on, what
     * cudnnFind* timed, and what the scratch buffer grew to */
    char *txt = malloc(need + 1);
    if (txt) {
      ct_device_describe(dev, txt, need + 1);
      printf("backend choices:\n%s", txt);
      free(txt);
    }
  }
  /* what the step's plan holds at its peak (the planned side of the
   * device peak above) */
  if (prof) CK(ct_model_memory_report(m, 10, stdout));
  /* rc_mode: norm, cheap or selective, else the segment count (1: off) */
  const int rc_mode = ct_model_recompute_mode(m);
  char rcm[16];
  if (rc_mode < 0) ct_recompute_mode_str(rc_mode, rcm, sizeof rcm);
  else snprintf(rcm, sizeof rcm, "%d", segs);
  printf("RESULT workload=%s device=%s precision=%s batch=%d threads=%d median_s=%.6f min_s=%.6f cpu_s=%.6f img_s=%.1f "
         "cpu_img_s=%.1f gflop_step=%.4f gflops=%.2f rss_mb=%.0f load=%.2f optim=%s plan_mb=%.1f state_mb=%.1f "
         "segments=%d rc_mode=%s rc_layers=%d layers=%d rc_gflop=%.4f rss0_mb=%.0f hooks=%d\n",
         model, ct_device_name(dev), prec, batch, threads, med, tmin, cmed, batch / med, batch / cmed, flop * 1e-9, flop / med * 1e-9, rss_mb,
         la[0], oname, plan_mb, state_mb, segs, rcm, rcl, ct_model_layer_count(m), rc_flop * 1e-9, rss0_mb, noop_hooks);
  free(t), free(ct), free(xd), free(yd);
  ct_step_destroy(sc.step);
  ct_optimizer_destroy(sc.opt);
  ct_model_destroy(m);
  ct_device_close(dev);
  return 0;
}
