/* The CUDA training step without host synchronisation: the loss backward
 * with the scale read from the device's scaler against the host-scale
 * backward, the lagged pipeline against the synchronous step (identical
 * weights; also under OneCycleLR across a step the scaler skips, the
 * schedule stepped at read-back with the rows looking ahead), N steps replayed from a CUDA graph against N eager steps
 * (identical weights; for both, when a second synchronous run shows
 * non-deterministic cuDNN algorithms, as close as that control), the same
 * for cnn (dropout: the mask step read from
 * device memory under the graph, two graphs for the two staging slots;
 * synchronous = kernel-argument step, lagged eager, lag 2, graph; lag 2
 * with one x staging buffer for both slots), and the
 * dropout kernels with the step from device memory against the key's step
 * (bitwise), and the cuBLASLt plan cache (repeated and
 * interleaved shapes give the first call's bits and match the reference),
 * and the fused GPU linear regression against ct_linreg_fit.
 * Labelled gpu; exits 77 without a CUDA device. */
#include "test_util.h"

#include "backend/backend.h"
#include "exec/device_state.h"
#include "optim/optimizer_device.h"
#include "train/device_step.h"
#include "train/linreg_device.h"

static uint64_t rs = 0x243F6A8885A308D3ull;
static float frand(void) { return test_frand(&rs); }

static void *up(ct_device *d, const void *h, size_t b) {
  void *p = ct_device_alloc(d, b);
  CHECK(p != NULL);
  if (p) CHECK_OK(ct_device_copy(d, p, NULL, h, b));
  return p;
}

/* Device-scale loss backward == host-scale backward, bit for bit (same
 * kernel, the scale only travels differently), scaler on and off. */
static void test_loss_bwd_dev(ct_device *d) {
  const ct_backend *be = ct_device_backend(d);
  enum { R = 37, C = 11 };
  float x[R * C];
  int64_t t[R];
  for (int i = 0; i < R * C; i++) x[i] = frand() * 3.0f;
  for (int i = 0; i < R; i++) t[i] = (int64_t)((frand() + 1.0f) * 5.49f);
  float *dx = up(d, x, sizeof x), *g1 = up(d, x, sizeof x), *g2 = up(d, x, sizeof x);
  int64_t *dt = up(d, t, sizeof t);
  ct_tensor lx = ct_tensor_2d(dx, CT_F32, R, C), lt = ct_tensor_1d(dt, CT_I64, R);
  ct_tensor o1 = ct_tensor_2d(g1, CT_F32, R, C), o2 = ct_tensor_2d(g2, CT_F32, R, C);
  lx.device = lt.device = o1.device = o2.device = d;
  for (int on = 0; on < 2; on++) {
    ct_grad_scaler gs;
    ct_grad_scaler_init(&gs, on, 1, 3072.0);
    ct_step_stats hs;
    memset(&hs, 0, sizeof hs);
    ct_scaler_to_dev(&gs, &hs.scaler);
    ct_step_stats *st = up(d, &hs, sizeof hs);
    float scale = on ? gs.scale : 1.0f;
    float h1[R * C], h2[R * C];
    CHECK_OK(be->cross_entropy_bwd(d, &lx, &lt, 0.1f, scale, &o1));
    CHECK_OK(be->cross_entropy_bwd_dev(d, &lx, &lt, 0.1f, st, &o2));
    CHECK_OK(ct_device_copy(NULL, h1, d, g1, sizeof h1));
    CHECK_OK(ct_device_copy(NULL, h2, d, g2, sizeof h2));
    CHECK_MSG(!memcmp(h1, h2, sizeof h1), "cross entropy backward, scaler %d: device scale differs", on);
    double mx = 0;
    for (int i = 0; i < R * C; i++) mx = fmax(mx, fabs(h1[i]));
    CHECK_MSG(mx > 0, "cross entropy backward is all zero");
    CHECK_OK(be->nll_bwd(d, &lt, scale, &o1));
    CHECK_OK(be->nll_bwd_dev(d, &lt, st, &o2));
    CHECK_OK(ct_device_copy(NULL, h1, d, g1, sizeof h1));
    CHECK_OK(ct_device_copy(NULL, h2, d, g2, sizeof h2));
    CHECK_MSG(!memcmp(h1, h2, sizeof h1), "nll backward, scaler %d: device scale differs", on);
    ct_device_free(d, st);
  }
  ct_device_free(d, dx), ct_device_free(d, g1), ct_device_free(d, g2), ct_device_free(d, dt);
}

enum { B = 32, STEPS = 6 };

/* A resident model trained STEPS steps through the pipeline (mode 1:
 * eager, 2: graph, 3: eager with lag 2, 4: as 3 with one x staging buffer
 * for both slots, ct_model_share_stage_x) or through ct_device_train_step
 * (mode 0, sync); returns its parameters. sched: under OneCycleLR over the
 * STEPS steps, with step 2's batch holding an inf so that the scaler skips
 * it: the pipeline steps the schedule at read-back and looks ahead of it,
 * the synchronous loop steps it after each taken step. */
static float *train(ct_device *gpu, const char *model, int mode, int sched, int64_t *np_out, const char **note,
                    float **init_out) {
  ct_model_options mo = {1, 28, 28, 10, 3};
  ct_model *m;
  CHECK_OK(ct_model_create(model, &mo, &m));
  ct_model_reserve_optimizer_state(m, 2);
  if (mode == 4) ct_model_share_stage_x(m, 1);
  CHECK_OK(ct_model_prepare(m, gpu, B, 1));
  CHECK((ct_model_stage_x_at(m, 0) == ct_model_stage_x_at(m, 1)) == (mode == 4));
  CHECK(ct_model_stage_y_at(m, 0) != ct_model_stage_y_at(m, 1));
  ct_optim_config oc = ct_optim_config_default(CT_OPTIM_ADAM);
  oc.lr = 1e-3;
  ct_optimizer *o;
  size_t np;
  ct_model_params(m, &np);
  CHECK_OK(ct_optimizer_create(&oc, np, &o));
  ct_scheduler *sc = NULL;
  if (sched) {
    ct_sched_config c = ct_sched_config_default(CT_SCHED_ONECYCLE);
    c.max_lr = 2e-3, c.total_steps = STEPS, c.pct_start = 0.4;
    CHECK_OK(ct_scheduler_create(&c, o, &sc));
  }
  ct_grad_scaler gs;
  ct_grad_scaler_init(&gs, 1, 1, 65536.0);
  gs.growth_interval = 2;
  CHECK_OK(ct_device_train_begin(m, gpu, o, &gs));
  float *p_init = malloc(np * 4);
  CHECK_OK(ct_device_copy(NULL, p_init, gpu, ct_model_params(m, NULL), np * 4));
  static float x[STEPS][B * 28 * 28];
  static int64_t y[STEPS][B];
  ct_batch b[STEPS];
  rs = 77;
  for (int s = 0; s < STEPS; s++) {
    for (int i = 0; i < B * 28 * 28; i++) x[s][i] = frand();
    for (int i = 0; i < B; i++) y[s][i] = (int64_t)((frand() + 1.0f) * 4.99f);
    memset(&b[s], 0, sizeof b[s]);
    int64_t xs[4] = {B, 1, 28, 28};
    b[s].x = ct_tensor_view(x[s], CT_F32, 4, xs);
    b[s].y = ct_tensor_1d(y[s], CT_I64, B);
    b[s].n = B;
    b[s].index = s;
  }
  if (sched) x[2][5] = INFINITY;
  if (mode == 0) {
    for (int s = 0; s < STEPS; s++) {
      double lv;
      int64_t t1 = 0, t5 = 0;
      int sk;
      CHECK_OK(ct_device_train_step(m, gpu, o, &b[s], CT_LOSS_CROSS_ENTROPY, 0, 1.0, (uint32_t)s, &gs, &lv, &t1, &t5, &sk));
      if (sc && !sk) CHECK_OK(ct_scheduler_step(sc, o));
    }
  } else {
    ct_device_train_opts dto = {mode >= 3 ? 2 : 1, mode == 2, 2};
    ct_device_trainer *t;
    CHECK_OK(ct_device_trainer_create(m, gpu, o, &gs, CT_LOSS_CROSS_ENTROPY, 0, 1.0, sc, &dto, &t));
    CHECK(ct_device_trainer_lag(t) == (mode >= 3 ? 2 : 1));
    int got = 0;
    for (int s = 0; s < STEPS; s++) {
      ct_step_result r;
      int have;
      CHECK_OK(ct_device_trainer_step(t, &b[s], s, &r, &have));
      if (have) CHECK(r.batch == &b[got++]);
    }
    for (int have = 1; have;) {
      ct_step_result r;
      CHECK_OK(ct_device_trainer_drain(t, &r, &have));
      if (have) CHECK(r.batch == &b[got++]);
    }
    CHECK_MSG(got == STEPS, "%d results for %d steps", got, STEPS);
    if (mode == 2) CHECK_MSG(ct_device_trainer_graph_on(t, note), "graph not used: %s", *note ? *note : "?");
    ct_device_trainer_destroy(t);
  }
  CHECK(ct_optimizer_steps(o) + gs.skipped_steps == STEPS);
  if (sched) CHECK_MSG(gs.skipped_steps == 1, "%s mode %d: %lld skipped steps, expected 1 (the inf batch)", model, mode,
                       (long long)gs.skipped_steps);
  ct_scheduler_destroy(sc);
  /* The four modes are compared with each other only: if every step were
   * skipped (or the update never ran) they would agree on the initial
   * weights. Most steps must be taken and the weights must move. */
  CHECK_MSG(ct_optimizer_steps(o) >= STEPS - 2, "%s mode %d: only %lld of %d steps taken", model, mode,
            (long long)ct_optimizer_steps(o), STEPS);
  float *p = malloc(np * 4);
  CHECK_OK(ct_device_copy(NULL, p, gpu, ct_model_params(m, NULL), np * 4));
  CHECK_MSG(memcmp(p, p_init, np * 4) != 0, "%s mode %d: the weights did not change", model, mode);
  if (init_out)
    *init_out = p_init;
  else
    free(p_init);
  *np_out = (int64_t)np;
  ct_optimizer_destroy(o);
  ct_model_destroy(m);
  return p;
}

/* Share of the n weights where run b differs from run a by more than
 * 1e-2 of the largest update a made. */
static double share_off(const float *a, const float *b, const float *init, int64_t n) {
  double mu = 0;
  for (int64_t i = 0; i < n; i++) mu = fmax(mu, fabs((double)a[i] - init[i]));
  int64_t off = 0;
  for (int64_t i = 0; i < n; i++) off += !(fabs((double)a[i] - b[i]) <= 1e-2 * mu);
  return (double)off / (double)n;
}

/* The modes run the same kernels on the same data, so their weights are
 * bitwise equal when every kernel is deterministic. cuDNN may pick
 * algorithms that add with atomics (backward filter/data ALGO_0 and
 * ALGO_3) for cnn's convolutions, which makes two identical runs differ
 * in the last bits, and Adam amplifies that where a gradient cancels. A
 * second synchronous run is the control: bitwise equal -> every mode must
 * be bitwise equal; not -> each mode may be as far from the synchronous
 * run as the control is (elements off by more than 1e-2 of the largest
 * update: at most 1%, or 3x the control's share), while a wrong row of
 * Adam's arguments, a skipped or repeated step, a stale batch or another
 * dropout mask moves nearly every weight. */
static void test_pipeline_and_graph(ct_device *gpu, const char *model, int sched) {
  int64_t n0, n0b, n1, n2, n3, n4;
  const char *note = NULL;
  float *init = NULL;
  float *p0 = train(gpu, model, 0, sched, &n0, &note, &init), *p0b = train(gpu, model, 0, sched, &n0b, &note, NULL);
  float *p1 = train(gpu, model, 1, sched, &n1, &note, NULL);
  float *p2 = train(gpu, model, 2, sched, &n2, &note, NULL), *p3 = train(gpu, model, 3, sched, &n3, &note, NULL);
  float *p4 = train(gpu, model, 4, sched, &n4, &note, NULL);
  char label[64];
  snprintf(label, sizeof label, "%s%s", model, sched ? " (onecycle, a skipped step)" : "");
  CHECK(n0 == n0b && n0 == n1 && n1 == n2 && n2 == n3 && n3 == n4);
  if (!memcmp(p0, p0b, (size_t)n0 * 4)) {
    CHECK_MSG(!memcmp(p0, p1, (size_t)n0 * 4), "%s: lagged pipeline weights differ from the synchronous step's", label);
    CHECK_MSG(!memcmp(p0, p2, (size_t)n0 * 4), "%s: graph-replayed weights differ from the eager steps'", label);
    CHECK_MSG(!memcmp(p0, p3, (size_t)n0 * 4), "%s: lag 2 (staging waits) weights differ from the synchronous step's",
              label);
    CHECK_MSG(!memcmp(p0, p4, (size_t)n0 * 4), "%s: lag 2 with a shared x buffer: weights differ from the synchronous "
              "step's", label);
  } else {
    double ctl = share_off(p0, p0b, init, n0), lim = fmax(0.01, 3 * ctl);
    printf("%s: two synchronous runs differ (non-deterministic kernels, %.3g%% of the weights beyond 1e-2 of the "
           "largest update); comparing the modes at that level\n",
           label, 100 * ctl);
    CHECK_MSG(ctl <= 0.2, "%s: two identical synchronous runs differ at %.3g%% of the weights", label, 100 * ctl);
    const float *pm[4] = {p1, p2, p3, p4};
    const char *what[4] = {"lagged pipeline", "graph-replayed", "lag 2 (staging waits)", "lag 2, shared x"};
    for (int k = 0; k < 4; k++) {
      double sh = share_off(p0, pm[k], init, n0);
      CHECK_MSG(sh <= lim, "%s: %s weights differ from the synchronous step's at %.3g%% of the weights (control %.3g%%)",
                label, what[k], 100 * sh, 100 * ctl);
    }
  }
  free(p0), free(p0b), free(p1), free(p2), free(p3), free(p4), free(init);
}

/* Dropout with the step read through dropout_step_from == the key's step,
 * bit for bit, and a different step gives a different mask (the pointer
 * is really read). */
static void test_dropout_step_dev(ct_device *d) {
  const ct_backend *be = ct_device_backend(d);
  enum { NX = 4099 };
  float x[NX], h1[NX], h2[NX];
  for (int i = 0; i < NX; i++) x[i] = frand() + 1.5f;
  float *dx = up(d, x, sizeof x), *y1 = up(d, x, sizeof x), *y2 = up(d, x, sizeof x);
  uint32_t step = 41;
  uint32_t *ds = up(d, &step, sizeof step);
  ct_tensor tx = ct_tensor_1d(dx, CT_F32, NX), t1 = ct_tensor_1d(y1, CT_F32, NX), t2 = ct_tensor_1d(y2, CT_F32, NX);
  tx.device = t1.device = t2.device = d;
  ct_dropout_key k = {1234, 3, 41, 0, 0, 0}, wrong = {1234, 3, 7, 0, 0, 0};
  CHECK_OK(be->dropout_fwd(d, 0.3f, 1, k, &tx, &t1));
  CHECK_OK(be->dropout_step_from(d, ds));
  CHECK_OK(be->dropout_fwd(d, 0.3f, 1, wrong, &tx, &t2)); /* key.step ignored */
  CHECK_OK(be->dropout_step_from(d, NULL));
  CHECK_OK(ct_device_copy(NULL, h1, d, y1, sizeof h1));
  CHECK_OK(ct_device_copy(NULL, h2, d, y2, sizeof h2));
  CHECK_MSG(!memcmp(h1, h2, sizeof h1), "dropout with the step from device memory differs from the key's step");
  CHECK_OK(be->dropout_bwd(d, 0.3f, 1, wrong, &tx, &t2)); /* pointer off again: step 7 */
  CHECK_OK(ct_device_copy(NULL, h2, d, y2, sizeof h2));
  CHECK_MSG(memcmp(h1, h2, sizeof h1) != 0, "step 7 and step 41 gave the same mask; the test is blind");
  ct_device_free(d, dx), ct_device_free(d, y1), ct_device_free(d, y2), ct_device_free(d, ds);
}

/* cuBLASLt plans: shapes in the order A B A C B A give, for each shape,
 * the same bits every time, and match the host reference. */
static void test_blas_cache(ct_device *d) {
  const ct_backend *be = ct_device_backend(d);
  int shapes[3][3] = {{64, 48, 40}, {33, 17, 65}, {128, 256, 8}};
  int order[6] = {0, 1, 0, 2, 1, 0};
  float *first[3] = {NULL, NULL, NULL};
  for (int it = 0; it < 6; it++) {
    int si = order[it], M = shapes[si][0], K = shapes[si][1], N = shapes[si][2];
    float *a = malloc((size_t)M * K * 4), *b = malloc((size_t)K * N * 4), *c = malloc((size_t)M * N * 4);
    rs = 1000 + (uint64_t)si;
    for (int i = 0; i < M * K; i++) a[i] = frand();
    for (int i = 0; i < K * N; i++) b[i] = frand();
    void *da = up(d, a, (size_t)M * K * 4), *db = up(d, b, (size_t)K * N * 4), *dc = ct_device_alloc(d, (size_t)M * N * 4);
    ct_tensor ta = ct_tensor_2d(da, CT_F32, M, K), tb = ct_tensor_2d(db, CT_F32, K, N), tc = ct_tensor_2d(dc, CT_F32, M, N);
    ta.device = tb.device = tc.device = d;
    CHECK_OK(be->matmul(d, 0, 0, &ta, &tb, 1.0f, 0.0f, &tc));
    CHECK_OK(ct_device_copy(NULL, c, d, dc, (size_t)M * N * 4));
    double err = 0, ref = 0;
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        double s = 0;
        for (int k = 0; k < K; k++) s += (double)a[i * K + k] * b[k * N + j];
        err += (s - c[i * N + j]) * (s - c[i * N + j]);
        ref += s * s;
      }
    CHECK_MSG(sqrt(err / ref) <= 1e-5, "matmul %dx%dx%d (call %d): relative error %g", M, K, N, it, sqrt(err / ref));
    if (!first[si]) {
      first[si] = c;
    } else {
      CHECK_MSG(!memcmp(first[si], c, (size_t)M * N * 4), "matmul %dx%dx%d: a cached plan changed the result", M, K, N);
      free(c);
    }
    ct_device_free(d, da), ct_device_free(d, db), ct_device_free(d, dc);
    free(a), free(b);
  }
  for (int i = 0; i < 3; i++) free(first[i]);
}

/* The GPU linreg fit against the CPU's: same math, sums in another
 * order, so losses agree to ~1e-12 and parameters to a few f32 ulps. */
static void test_linreg(ct_device *d) {
  enum { NP = 50000, FE = 3, ST = 40 };
  float *x = malloc(sizeof(float) * NP * FE), *y = malloc(sizeof(float) * NP);
  for (int i = 0; i < NP; i++) {
    double s = 0.5;
    for (int j = 0; j < FE; j++) {
      x[i * FE + j] = frand() * 10.0f;
      s += (j + 1.5) * x[i * FE + j];
    }
    y[i] = (float)s + frand();
  }
  float pc[FE + 1] = {0.1f, -0.2f, 0.3f, 0.05f}, pg[FE + 1];
  memcpy(pg, pc, sizeof pc);
  double hc[ST], hg[ST];
  ct_optim_config cfg = ct_optim_config_default(CT_OPTIM_ADAM);
  cfg.lr = 0.05;
  ct_linreg_data data = {x, y, NP, FE};
  CHECK_OK(ct_linreg_fit(&data, &cfg, ST, pc, hc));
  ct_linreg_data dd = data;
  dd.x = up(d, x, sizeof(float) * NP * FE);
  dd.y = up(d, y, sizeof(float) * NP);
  CHECK_OK(ct_linreg_fit_device(d, &dd, &cfg, ST, pg, hg));
  for (int k = 0; k < ST; k++)
    CHECK_MSG(fabs(hc[k] - hg[k]) <= 1e-10 * fabs(hc[k]), "loss at step %d: CPU %.17g GPU %.17g", k, hc[k], hg[k]);
  for (int j = 0; j <= FE; j++)
    CHECK_MSG(fabs(pc[j] - pg[j]) <= 1e-5 * fmax(1.0, fabs(pc[j])), "param %d: CPU %.9g GPU %.9g", j, pc[j], pg[j]);
  CHECK_MSG(hc[ST - 1] < 0.5 * hc[0], "the fit did not train (loss %g -> %g)", hc[0], hc[ST - 1]);
  ct_device_free(d, (void *)dd.x), ct_device_free(d, (void *)dd.y);
  free(x), free(y);
}

int main(void) {
  ct_device *d;
  unsetenv("CTRAIN_CUDA_TF32"); /* the cuBLASLt check holds f32 (FMA) math to 1e-5 */
  if (ct_device_open("cuda", &d) != CT_OK) {
    fprintf(stderr, "test_gpu_step: skipped: %s\n", ct_last_error());
    return 77;
  }
  test_loss_bwd_dev(d);
  test_dropout_step_dev(d);
  test_pipeline_and_graph(d, "mlp", 0);
  test_pipeline_and_graph(d, "cnn", 0);
  test_pipeline_and_graph(d, "mlp", 1);
  test_blas_cache(d);
  /* The fused linear regression uses neither cuBLASLt nor staging, which
   * is all the emulator's fault-mode reruns (CTRAIN_TEST_EMU_VARIANT)
   * change. */
  if (!getenv("CTRAIN_TEST_EMU_VARIANT")) test_linreg(d);
  ct_device_close(d);
  return test_summary("test_gpu_step");
}
