/* The fused optimizer kernels (src/backend/cuda/cuda_optim.cu, formulas in
 * src/math/fused_step.h) on the GPU against the CPU optimizer
 * (ct_grad_scaler_unscale + ct_clip_grad_norm + ct_optimizer_step +
 * ct_grad_scaler_update on host memory: optimizer_step.c, not the shared
 * header) over 5 steps from the same random parameters and gradients, for
 * the variants test_gpu_train does not reach: SGD with Nesterov momentum
 * (weight decay, clipping, dynamic loss scaling), Adam with amsgrad
 * (beta2 0.9 and gradients that shrink, so max_exp_avg_sq departs from
 * exp_avg_sq), Adam with L2 weight decay and AdamW's decoupled decay (both
 * with clipping). Each step runs on the GPU twice: through
 * ct_optimizer_step_device (arguments by value, k_fused_optim) and through
 * ct_optimizer_write_step_args + ct_optimizer_step_device_args (arguments
 * from device memory, k_fused_optim_dev).
 *
 * Checks after every step: parameters and every state buffer within 1e-6
 * normwise (max |gpu - cpu| / max |cpu|) of the CPU's (the f32 operations
 * are the same; gcc may contract a multiply-add differently and the clip
 * norm sums in another order: a few ulps), the two GPU paths bitwise
 * equal (same kernel formulas, same arguments, same statistics), the
 * device's loss scale equal to the CPU's. The test is not blind: a CPU
 * twin with the variant's feature switched off (no Nesterov, no amsgrad,
 * AdamW instead of Adam-L2 and back) must end at least 1e-4 away, so a
 * kernel that ignored the feature would miss 1e-6 by two orders.
 * Labelled gpu; exits 77 without a CUDA device. */
#include "test_util.h"

#include "backend/backend.h"
#include "optim/optimizer_device.h"

#define TOL 1e-6
#define MIN_FEATURE_EFFECT 1e-4

enum { N = 50021, STEPS = 5 };

static uint64_t rs = 0x5DEECE66Dull;
static float frand(void) { return test_frand(&rs); }

/* max |a - b| / max |b|; NaN anywhere gives infinity. */
static double nerr(const float *a, const float *b, size_t n) {
  double m = 0, s = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= m)) m = isnan(d) ? INFINITY : d;
    if (fabs((double)b[i]) > s) s = fabs((double)b[i]);
  }
  return s > 0 ? m / s : (m > 0 ? INFINITY : 0);
}

static void *up(ct_device *d, const void *h, size_t b) {
  void *p = ct_device_alloc(d, b);
  CHECK(p != NULL);
  if (p) CHECK_OK(ct_device_copy(d, p, NULL, h, b));
  return p;
}

static void down(ct_device *d, void *h, const void *p, size_t b) {
  CHECK_OK(ct_device_sync(d));
  CHECK_OK(ct_device_copy(NULL, h, d, p, b));
}

/* The gradient of step st, scaled as a model's backward under the loss
 * scale would leave it; late steps shrink (amsgrad's maximum then stays
 * above exp_avg_sq). */
static void make_grads(float *g, int st, float scale) {
  float k = st < 2 ? 1.0f : 0.05f;
  for (int i = 0; i < N; i++) g[i] = frand() * k * scale;
}

/* The CPU optimizer alone over the same data (the twin with a feature
 * off); returns its final parameters. */
static float *cpu_run(const ct_optim_config *cfg, ct_device *cpu, int scaler_on, double clip, uint64_t seed,
                      const float *p0) {
  float *p = malloc(N * 4), *g = malloc(N * 4);
  memcpy(p, p0, N * 4);
  ct_optimizer *o = NULL;
  CHECK_OK(ct_optimizer_create(cfg, N, &o));
  ct_grad_scaler gs;
  ct_grad_scaler_init(&gs, scaler_on, 1, 1024.0);
  gs.growth_interval = 2;
  rs = seed;
  for (int st = 0; st < STEPS && o; st++) {
    make_grads(g, st, gs.enabled ? gs.scale : 1.0f);
    int found = 0;
    CHECK_OK(ct_grad_scaler_unscale(&gs, cpu, g, N, &found));
    if (!found && clip > 0) ct_clip_grad_norm(g, N, clip);
    if (!found) CHECK_OK(ct_optimizer_step(o, p, g));
    ct_grad_scaler_update(&gs, found);
  }
  ct_optimizer_destroy(o);
  free(g);
  return p;
}

static void run_case(ct_device *gpu, ct_device *cpu, const char *name, ct_optim_config cfg, int scaler_on,
                     double clip, const ct_optim_config *twin) {
  float *p0 = malloc(N * 4), *pc = malloc(N * 4), *g = malloc(N * 4), *gc = malloc(N * 4);
  float *ha = malloc(N * 4), *hb = malloc(N * 4);
  rs = 0x1234567ull + (uint64_t)cfg.kind;
  for (int i = 0; i < N; i++) p0[i] = frand();
  memcpy(pc, p0, N * 4);
  ct_optimizer *oc = NULL, *oa = NULL, *ob = NULL;
  CHECK_OK(ct_optimizer_create(&cfg, N, &oc));
  CHECK_OK(ct_optimizer_create(&cfg, N, &oa));
  CHECK_OK(ct_optimizer_create(&cfg, N, &ob));
  if (!oc || !oa || !ob) return;
  CHECK_OK(ct_optimizer_to_device(oa, gpu));
  CHECK_OK(ct_optimizer_to_device(ob, gpu));
  CHECK(ct_optimizer_device(oa) == gpu && ct_optimizer_device(ob) == gpu);
  ct_grad_scaler gs;
  ct_grad_scaler_init(&gs, scaler_on, 1, 1024.0);
  gs.growth_interval = 2; /* the scale grows inside the run */
  ct_step_stats hs;
  memset(&hs, 0, sizeof hs);
  ct_scaler_to_dev(&gs, &hs.scaler);
  ct_step_stats *sa = up(gpu, &hs, sizeof hs), *sb = up(gpu, &hs, sizeof hs);
  float *pa = up(gpu, p0, N * 4), *pb = up(gpu, p0, N * 4), *gd = ct_device_alloc(gpu, N * 4);
  const uint64_t seed = 0xABCDEF01ull + (uint64_t)cfg.kind;
  rs = seed;
  for (int st = 0; st < STEPS; st++) {
    make_grads(g, st, gs.enabled ? gs.scale : 1.0f);
    memcpy(gc, g, N * 4);
    /* CPU: the trainer's four calls. */
    int found = 0;
    CHECK_OK(ct_grad_scaler_unscale(&gs, cpu, gc, N, &found));
    if (!found && clip > 0) ct_clip_grad_norm(gc, N, clip);
    if (!found) CHECK_OK(ct_optimizer_step(oc, pc, gc));
    ct_grad_scaler_update(&gs, found);
    /* GPU, both launches. */
    CHECK_OK(ct_device_copy(gpu, gd, NULL, g, N * 4));
    CHECK_OK(ct_optimizer_step_device(oa, gpu, pa, gd, sa, clip));
    CHECK_OK(ct_optimizer_write_step_args(ob, gpu, sb, clip));
    CHECK_OK(ct_optimizer_step_device_args(ob, gpu, pb, gd, sb));
    ct_step_stats ra, rb;
    memset(&ra, 0, sizeof ra), memset(&rb, 0, sizeof rb);
    down(gpu, &ra, sa, CT_STEP_STATS_READBACK);
    down(gpu, &rb, sb, CT_STEP_STATS_READBACK);
    ct_optimizer_commit_step(oa, ct_fused_skip(&ra));
    ct_optimizer_commit_step(ob, ct_fused_skip(&rb));
    CHECK_MSG(!ct_fused_skip(&ra) && !ct_fused_skip(&rb) && !found, "%s step %d: a finite step was skipped", name, st);
    CHECK_MSG(ra.scaler.scale == gs.scale && rb.scaler.scale == gs.scale,
              "%s step %d: loss scale device %g / %g, CPU %g", name, st, (double)ra.scaler.scale,
              (double)rb.scaler.scale, (double)gs.scale);
    CHECK_MSG(ra.opt_steps == st + 1 && rb.opt_steps == st + 1, "%s step %d: device step counts %lld / %lld", name,
              st, (long long)ra.opt_steps, (long long)rb.opt_steps);
    down(gpu, ha, pa, N * 4);
    down(gpu, hb, pb, N * 4);
    double ea = nerr(ha, pc, N), eb = nerr(hb, pc, N);
    CHECK_MSG(ea <= TOL, "%s step %d: params (by-value args) differ from the CPU by %.3g", name, st, ea);
    CHECK_MSG(eb <= TOL, "%s step %d: params (device args) differ from the CPU by %.3g", name, st, eb);
    CHECK_MSG(!memcmp(ha, hb, N * 4), "%s step %d: the two GPU launches disagree", name, st);
    size_t k = ct_optimizer_state_count(oc);
    CHECK_MSG(ct_optimizer_state_count(oa) == k && ct_optimizer_state_count(ob) == k, "%s: state buffer counts", name);
    for (size_t i = 0; i < k && ct_optimizer_state_count(oa) == k && ct_optimizer_state_count(ob) == k; i++) {
      const char *sn = NULL;
      float *bc, *ba, *bb;
      size_t cnt;
      CHECK_OK(ct_optimizer_state(oc, i, &sn, &bc, &cnt));
      CHECK_OK(ct_optimizer_state(oa, i, &sn, &ba, &cnt));
      CHECK_OK(ct_optimizer_state(ob, i, &sn, &bb, &cnt));
      down(gpu, ha, ba, N * 4);
      down(gpu, hb, bb, N * 4);
      double es = nerr(ha, bc, N);
      CHECK_MSG(es <= TOL, "%s step %d: state %s differs from the CPU by %.3g", name, st, sn, es);
      CHECK_MSG(!memcmp(ha, hb, N * 4), "%s step %d: state %s differs between the two GPU launches", name, st, sn);
    }
  }
  double moved = nerr(pc, p0, N);
  CHECK_MSG(moved > 1e-3, "%s: the CPU parameters moved by only %.3g; the comparison is blind", name, moved);
  if (cfg.kind != CT_OPTIM_SGD && cfg.amsgrad) {
    /* amsgrad must have mattered: max_exp_avg_sq above exp_avg_sq somewhere. */
    float *v, *vmax;
    const char *sn;
    size_t cnt;
    CHECK_OK(ct_optimizer_state(oa, 1, &sn, &v, &cnt));
    CHECK_OK(ct_optimizer_state(oa, 2, &sn, &vmax, &cnt));
    down(gpu, ha, v, N * 4);
    down(gpu, hb, vmax, N * 4);
    int64_t above = 0;
    for (int i = 0; i < N; i++) above += hb[i] > ha[i];
    CHECK_MSG(above > N / 2, "%s: max_exp_avg_sq above exp_avg_sq at only %lld of %d elements", name,
              (long long)above, N);
  }
  if (twin) {
    float *pt = cpu_run(twin, cpu, scaler_on, clip, seed, p0);
    double d = nerr(pt, pc, N);
    CHECK_MSG(d >= MIN_FEATURE_EFFECT, "%s: switching the feature off moves the result by only %.3g", name, d);
    free(pt);
  }
  printf("%-14s %d steps: params match the CPU, parameters moved %.3g (normwise)\n", name, STEPS, moved);
  ct_optimizer_destroy(oc), ct_optimizer_destroy(oa), ct_optimizer_destroy(ob);
  ct_device_free(gpu, sa), ct_device_free(gpu, sb), ct_device_free(gpu, pa), ct_device_free(gpu, pb);
  ct_device_free(gpu, gd);
  free(p0), free(pc), free(g), free(gc), free(ha), free(hb);
}

int main(void) {
  ct_device *gpu, *cpu;
  if (ct_device_open("cuda", &gpu) != CT_OK) {
    printf("test_gpu_optim: skipped: %s\n", ct_last_error());
    return 77;
  }
  CHECK_OK(ct_device_open("cpu", &cpu));
  ct_optim_config c = ct_optim_config_default(CT_OPTIM_SGD), t;
  c.lr = 0.05, c.momentum = 0.9, c.nesterov = 1, c.weight_decay = 1e-3;
  t = c, t.nesterov = 0;
  run_case(gpu, cpu, "sgd-nesterov", c, 1, 20.0, &t);
  c = ct_optim_config_default(CT_OPTIM_ADAM);
  c.lr = 1e-2, c.beta2 = 0.9, c.amsgrad = 1;
  t = c, t.amsgrad = 0;
  run_case(gpu, cpu, "adam-amsgrad", c, 0, 0, &t);
  c = ct_optim_config_default(CT_OPTIM_ADAM);
  c.lr = 1e-2, c.weight_decay = 0.1;
  t = c, t.kind = CT_OPTIM_ADAMW;
  run_case(gpu, cpu, "adam-l2", c, 0, 50.0, &t);
  c.kind = CT_OPTIM_ADAMW;
  t = c, t.kind = CT_OPTIM_ADAM;
  run_case(gpu, cpu, "adamw", c, 0, 50.0, &t);
  ct_device_close(cpu);
  ct_device_close(gpu);
  return test_summary("test_gpu_optim");
}
