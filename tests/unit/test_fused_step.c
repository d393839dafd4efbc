/* The fused device step's host reference (src/math/fused_step.h, the
 * formulas the CUDA kernels run) against the CPU trainer's four calls:
 * ct_grad_scaler_unscale + ct_clip_grad_norm + ct_optimizer_step +
 * ct_grad_scaler_update, over several steps on random data, for SGD
 * (plain, momentum/nesterov/weight decay), Adam, AdamW and amsgrad, with
 * and without clipping and with an overflowing step. Also the
 * out-of-memory message built from the memory plan's numbers. */
#include "test_util.h"

#include "exec/device_state.h"
#include "optim/optimizer_device.h"

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static float frand(void) { return test_frand(&rs); }

/* Max |a-b| / max(1, |a|) over n. */
static double maxrel(const float *a, const float *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]) / fmax(1.0, fabs((double)a[i]));
    if (!(d <= m)) m = d;
  }
  return m;
}

static void run_case(ct_device *dev, const char *name, ct_optim_config cfg, int scaler_on, double clip) {
  enum { N = 4099, STEPS = 5 };
  float *p_cpu = malloc(N * 4), *p_fus = malloc(N * 4), *g = malloc(N * 4), *g_cpu = malloc(N * 4);
  for (int i = 0; i < N; i++) p_cpu[i] = p_fus[i] = frand();
  ct_optimizer *oc = NULL, *of = NULL;
  CHECK_OK(ct_optimizer_create(&cfg, N, &oc));
  CHECK_OK(ct_optimizer_create(&cfg, N, &of));
  ct_grad_scaler gs_cpu, gs_fus;
  ct_grad_scaler_init(&gs_cpu, scaler_on, 1, 1024.0);
  ct_grad_scaler_init(&gs_fus, scaler_on, 1, 1024.0);
  gs_cpu.growth_interval = gs_fus.growth_interval = 2; /* exercise growth too */
  int skipped_seen = 0;
  for (int st = 0; st < STEPS; st++) {
    for (int i = 0; i < N; i++) g[i] = frand() * gs_cpu.scale * (st == 1 ? 50.0f : 1.0f);
    if (scaler_on && st == 3) g[N / 2] = INFINITY;
    memcpy(g_cpu, g, N * 4);
    /* CPU trainer order. */
    int found = 0;
    CHECK_OK(ct_grad_scaler_unscale(&gs_cpu, dev, g_cpu, N, &found));
    if (!found && clip > 0) ct_clip_grad_norm(g_cpu, N, clip);
    if (!found) CHECK_OK(ct_optimizer_step(oc, p_cpu, g_cpu));
    ct_grad_scaler_update(&gs_cpu, found);
    /* Fused reference. */
    ct_step_stats ss;
    memset(&ss, 0, sizeof ss);
    ct_scaler_to_dev(&gs_fus, &ss.scaler);
    ct_optim_fused_stats_host(g, N, &ss);
    ct_fused_optim_args a;
    ct_optim_fused_args(of, clip, &a);
    const char *sn;
    float *s0 = NULL, *s1 = NULL, *s2 = NULL;
    size_t cnt, k = ct_optimizer_state_count(of);
    if (k > 0) CHECK_OK(ct_optimizer_state(of, 0, &sn, &s0, &cnt));
    if (k > 1) CHECK_OK(ct_optimizer_state(of, 1, &sn, &s1, &cnt));
    if (k > 2) CHECK_OK(ct_optimizer_state(of, 2, &sn, &s2, &cnt));
    ct_optim_fused_update_host(&a, &ss, p_fus, g, s0, s1, s2);
    int skip = ct_fused_skip(&ss);
    ct_optimizer_commit_step(of, skip);
    ct_fused_scaler_update(&ss.scaler, ss.nonfinite);
    ct_scaler_from_dev(&ss.scaler, &gs_fus);
    skipped_seen |= skip;
    CHECK_MSG(skip == found, "%s step %d: fused skip %d, CPU found_inf %d", name, st, skip, found);
    CHECK_MSG(gs_fus.scale == gs_cpu.scale && gs_fus.growth_tracker == gs_cpu.growth_tracker &&
                  gs_fus.skipped_steps == gs_cpu.skipped_steps,
              "%s step %d: scaler fused (%g, %lld, %lld) vs CPU (%g, %lld, %lld)", name, st, gs_fus.scale,
              (long long)gs_fus.growth_tracker, (long long)gs_fus.skipped_steps, gs_cpu.scale,
              (long long)gs_cpu.growth_tracker, (long long)gs_cpu.skipped_steps);
    CHECK_MSG(ct_optimizer_steps(of) == ct_optimizer_steps(oc), "%s: step counters %lld vs %lld", name,
              (long long)ct_optimizer_steps(of), (long long)ct_optimizer_steps(oc));
    double d = maxrel(p_cpu, p_fus, N);
    /* Same f32 operations; gcc may contract differently in the two loops
     * and the clip norm sums in another order: a few ulps at most. */
    CHECK_MSG(d <= 4e-7, "%s step %d: params differ by %g (relative)", name, st, d);
    for (size_t i = 0; i < k; i++) {
      float *a1, *a2;
      CHECK_OK(ct_optimizer_state(oc, i, &sn, &a1, &cnt));
      CHECK_OK(ct_optimizer_state(of, i, &sn, &a2, &cnt));
      double ds = maxrel(a1, a2, N);
      CHECK_MSG(ds <= 4e-7, "%s step %d: state %s differs by %g", name, st, sn, ds);
    }
  }
  /* The inputs must have moved the weights, or the comparison is empty. */
  int moved = 0;
  for (int i = 0; i < N && !moved; i++) moved = p_cpu[i] != p_fus[i] || p_fus[i] != p_fus[i];
  float p0 = 0;
  rs = rs; /* keep the stream going between cases */
  (void)p0;
  if (scaler_on) CHECK_MSG(skipped_seen, "%s: the overflow step was not skipped", name);
  ct_optimizer_destroy(oc);
  ct_optimizer_destroy(of);
  free(p_cpu), free(p_fus), free(g), free(g_cpu);
}

static void test_optimizers(void) {
  ct_device *dev;
  CHECK_OK(ct_device_open("cpu", &dev));
  ct_optim_config c = ct_optim_config_default(CT_OPTIM_SGD);
  c.lr = 0.1;
  run_case(dev, "sgd", c, 0, 0);
  c.momentum = 0.9, c.nesterov = 1, c.weight_decay = 1e-3;
  run_case(dev, "sgd-nesterov-wd-clip-scaler", c, 1, 5.0);
  c.nesterov = 0, c.dampening = 0.1;
  run_case(dev, "sgd-dampening", c, 1, 0);
  c = ct_optim_config_default(CT_OPTIM_ADAM);
  c.weight_decay = 1e-2;
  run_case(dev, "adam-l2-clip", c, 0, 1.0);
  c = ct_optim_config_default(CT_OPTIM_ADAMW);
  run_case(dev, "adamw-scaler", c, 1, 0);
  c.amsgrad = 1;
  run_case(dev, "adamw-amsgrad-clip-scaler", c, 1, 2.0);
  ct_device_close(dev);
}

/* The fused update does nothing when the scaler found inf/NaN. */
static void test_skip_leaves_weights(void) {
  enum { N = 300 };
  float p[N], q[N], g[N], m[N] = {0}, v[N] = {0};
  for (int i = 0; i < N; i++) p[i] = q[i] = frand(), g[i] = frand();
  g[7] = NAN;
  ct_optimizer *o;
  ct_optim_config c = ct_optim_config_default(CT_OPTIM_ADAM);
  CHECK_OK(ct_optimizer_create(&c, N, &o));
  ct_step_stats ss;
  memset(&ss, 0, sizeof ss);
  ct_grad_scaler gs;
  ct_grad_scaler_init(&gs, 1, 1, 65536.0);
  ct_scaler_to_dev(&gs, &ss.scaler);
  ct_optim_fused_stats_host(g, N, &ss);
  CHECK(ss.nonfinite == 1);
  ct_fused_optim_args a;
  ct_optim_fused_args(o, 0, &a);
  ct_optim_fused_update_host(&a, &ss, p, g, m, v, NULL);
  CHECK(memcmp(p, q, sizeof p) == 0);
  ct_fused_scaler_update(&ss.scaler, ss.nonfinite);
  CHECK(ss.scaler.scale == 32768.0f && ss.scaler.skipped_steps == 1);
  ct_optimizer_destroy(o);
}

static void test_oom_message(void) {
  const size_t G = (size_t)1 << 30;
  ct_mem_numbers n = {"cuda:0", "alexnet", "fp32", 256, 6 * G, G / 4, G / 4, 1 << 20, 0, G / 2, 150 << 20,
                      4 * G, 80 * G, 0};
  char msg[1024];
  ct_oom_message(&n, msg, sizeof msg);
  CHECK_MSG(strstr(msg, "cuda:0") && strstr(msg, "alexnet") && strstr(msg, "batch 256"), "%s", msg);
  char want[64];
  snprintf(want, sizeof want, "needs %.3f GiB", (double)ct_mem_total(&n) / (double)G);
  CHECK_MSG(strstr(msg, want) != NULL, "missing '%s' in: %s", want, msg);
  CHECK_MSG(strstr(msg, "4.000 GiB free of 80.000 GiB") != NULL, "%s", msg);
  CHECK_MSG(strstr(msg, "--precision bf16") != NULL, "%s", msg);
  /* Largest batch: what is left after the fixed part, per sample. */
  size_t fixed = ct_mem_total(&n) - n.arena - n.staging, per = (n.arena + n.staging) / 256;
  snprintf(want, sizeof want, "--batch-size %zu or smaller", (n.dev_free - fixed) / per);
  CHECK_MSG(strstr(msg, want) != NULL, "missing '%s' in: %s", want, msg);
  /* No recompute figure: the list ends at accumulation, without a comma. */
  CHECK_MSG(strstr(msg, "recompute") == NULL, "%s", msg);
  CHECK_MSG(msg[strlen(msg) - 1] == ')', "%s", msg);
  /* Accumulation: the smallest k dividing 256 whose micro-batch fits. */
  char want2[160];
  long long k = 2;
  while (256 % k || fixed + per * (size_t)(256 / k) > n.dev_free) k++;
  snprintf(want2, sizeof want2, "--batch-size %lld --accumulate %lld (same effective batch 256, about %.3f GiB)",
           256 / k, k, (double)(fixed + per * (size_t)(256 / k)) / (double)G);
  CHECK_MSG(strstr(msg, want2) != NULL, "missing '%s' in: %s", want2, msg);
  /* With recompute's smaller arena: the option and the total it gives. */
  ct_mem_numbers nr = n;
  nr.arena_recompute = 2 * G;
  ct_oom_message(&nr, msg, sizeof msg);
  snprintf(want2, sizeof want2, "or --recompute (activation recompute: a step arena of 2.000 instead of 6.000 GiB, about %.3f GiB)",
           (double)(ct_mem_total(&n) - 4 * G) / (double)G);
  CHECK_MSG(strstr(msg, want2) != NULL, "missing '%s' in: %s", want2, msg);
  /* Batch 12 with room for 5 samples: k = 2 (6) does not fit, k = 3 (4) does. */
  ct_mem_numbers n12 = n;
  n12.batch = 12;
  n12.arena = 12 * per - n12.staging;
  n12.dev_free = fixed + 5 * per;
  ct_oom_message(&n12, msg, sizeof msg);
  CHECK_MSG(strstr(msg, "--batch-size 4 --accumulate 3 (same effective batch 12,") != NULL, "%s", msg);
  /* No free-memory figure: micro-batches of half the batch. */
  n12.dev_total = n12.dev_free = 0;
  ct_oom_message(&n12, msg, sizeof msg);
  CHECK_MSG(strstr(msg, "--batch-size 6 --accumulate 2 (same effective batch 12,") != NULL, "%s", msg);
  /* Already 16-bit: no bf16 advice. Nothing fits: say what the fixed part needs. */
  n.precision = "bf16";
  n.dev_free = G / 2;
  ct_oom_message(&n, msg, sizeof msg);
  CHECK_MSG(strstr(msg, "--precision bf16") == NULL, "%s", msg);
  CHECK_MSG(strstr(msg, "--batch-size") == NULL && strstr(msg, "smaller model") != NULL, "%s", msg);
  /* A tiny buffer is truncated, never overrun. */
  char tiny[16];
  memset(tiny, 'x', sizeof tiny);
  ct_oom_message(&n, tiny, 10);
  CHECK(strlen(tiny) == 9 && tiny[10] == 'x');
}

int main(void) {
  test_optimizers();
  test_skip_leaves_weights();
  test_oom_message();
  return test_summary("test_fused_step");
}
