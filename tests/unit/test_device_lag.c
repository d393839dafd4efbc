/* Host-side logic of the device step that runs without a GPU:
 *  - the lagged read-back's FIFO (order, slot rotation, full/empty, depth);
 *  - the read-back lag (clamped to CT_STEP_LAG_MAX);
 *  - the optimizer argument table: the fused step emulated on the host
 *    with the device's rules (the row picked by the device's own step
 *    count, the count advanced only by taken steps) while the host commits
 *    the skip decisions one or two steps late gives bit-identical weights
 *    to the same steps with an immediate commit, across an inf/NaN skip,
 *    for Adam, AdamW+amsgrad and SGD with momentum, with and without a
 *    OneCycle schedule stepped at each commit of a taken step (the rows
 *    look ahead of it); taking row 0 (what a host-side count would give),
 *    or rows that do not look ahead of the schedule, does not;
 *  - double-buffered staging: which staging slot each step takes and when
 *    the host must wait before overwriting one, simulated against a model
 *    of the device (a step finishes only when the host waited for it or a
 *    later step), for lag 0, 1 and 2;
 *  - the CUDA graph audit on zoo models (dropout models accepted: the mask
 *    step comes from device memory) and its argument list. */
#include "test_util.h"

#include "ctrain/model.h"
#include "exec/device_state.h"
#include "optim/optimizer_device.h"
#include "optim/optimizer_impl.h"
#include "train/device_step.h"

static uint64_t rs = 0xD1B54A32D192ED03ull;
static float frand(void) { return test_frand(&rs); }

static void test_ring(void) {
  ct_lag_ring r;
  ct_batch b[8];
  ct_step_result out;
  ct_lag_ring_init(&r, 1);
  CHECK(r.depth == 1);
  CHECK(!ct_lag_ring_due(&r));
  CHECK(ct_lag_ring_pop(&r, &out) == -1);
  int used[CT_STEP_LAG_MAX + 1] = {0};
  /* Steady state of lag 1: push k+1, then pop k. */
  int s0 = ct_lag_ring_push(&r, &b[0], 10, 32);
  CHECK(s0 >= 0 && !ct_lag_ring_due(&r));
  for (int k = 1; k < 8; k++) {
    int s = ct_lag_ring_push(&r, &b[k], 10 + k, 32 + k);
    CHECK(s >= 0 && s <= CT_STEP_LAG_MAX);
    CHECK(ct_lag_ring_due(&r));
    int ps = ct_lag_ring_pop(&r, &out);
    CHECK_MSG(out.batch == &b[k - 1] && out.step == 10 + k - 1 && out.n == 32 + k - 1,
              "pop %d gave step %lld", k, (long long)out.step);
    /* The popped slot is not the one just handed out: the in-flight
     * copy of step k is never overwritten by step k-1's read. */
    CHECK(ps != s);
    used[s]++;
    CHECK(!ct_lag_ring_due(&r));
  }
  for (int i = 0; i <= CT_STEP_LAG_MAX; i++) CHECK_MSG(used[i] > 0, "slot %d never used", i);
  CHECK(ct_lag_ring_pop(&r, &out) >= 0 && out.batch == &b[7]);
  CHECK(ct_lag_ring_pop(&r, &out) == -1);
  /* Full ring refuses; depth 0 is due at once; depth clamps. */
  ct_lag_ring_init(&r, 99);
  CHECK(r.depth == CT_STEP_LAG_MAX);
  for (int i = 0; i <= CT_STEP_LAG_MAX; i++) CHECK(ct_lag_ring_push(&r, &b[i], i, 1) >= 0);
  CHECK(ct_lag_ring_push(&r, &b[7], 7, 1) == -1);
  ct_lag_ring_init(&r, 0);
  CHECK(ct_lag_ring_push(&r, &b[0], 0, 1) >= 0 && ct_lag_ring_due(&r));
  ct_lag_ring_init(&r, -3);
  CHECK(r.depth == 0);
}

static void test_lag_policy(void) {
  CHECK(ct_device_step_lag(1) == 1);
  CHECK(ct_device_step_lag(0) == 0);
  CHECK(ct_device_step_lag(-3) == 0);
  CHECK(ct_device_step_lag(50) == CT_STEP_LAG_MAX);
}

/* Runs STEPS fused steps on the host with the device's rules. lag: how
 * many steps late the host commits (and, with sched, steps a OneCycle
 * schedule over the STEPS steps for each taken one, as the device trainer
 * does); naive: 1 uses row 0 always, 2 builds the table without looking
 * ahead of the schedule. */
enum { N = 2053, STEPS = 7 };
static void emulate(ct_optim_config cfg, int sched, int lag, int naive, const float *grads, float *p, int64_t *skips) {
  ct_optimizer *o;
  CHECK_OK(ct_optimizer_create(&cfg, N, &o));
  ct_scheduler *sc = NULL;
  if (sched) {
    ct_sched_config c = ct_sched_config_default(CT_SCHED_ONECYCLE);
    c.max_lr = 0.01, c.total_steps = STEPS, c.pct_start = 0.4;
    CHECK_OK(ct_scheduler_create(&c, o, &sc));
  }
  float *s[3] = {NULL, NULL, NULL};
  int nb = ct_optim_state_buffers(&cfg);
  for (int i = 0; i < nb; i++) s[i] = calloc(N, 4);
  ct_grad_scaler gs;
  ct_grad_scaler_init(&gs, 1, 1, 256.0);
  gs.growth_interval = 2;
  ct_step_stats ds; /* the "device" block */
  memset(&ds, 0, sizeof ds);
  ct_scaler_to_dev(&gs, &ds.scaler);
  ct_step_stats pending[STEPS];
  int head = 0, count = 0;
  *skips = 0;
  for (int st = 0; st < STEPS; st++) {
    /* Host: the table from its (possibly lagging) counters. */
    ct_optim_step_args(o, naive == 2 ? NULL : sc, 0.0, &ds.args);
    /* Device: statistics, the picked row, the update, the counters. */
    ct_optim_fused_stats_host(grads + (size_t)st * N, N, &ds);
    const ct_fused_optim_args *a = naive ? &ds.args.row[0] : ct_step_args_pick(&ds.args, ds.opt_steps);
    ct_optim_fused_update_host(a, &ds, p, grads + (size_t)st * N, s[0], s[1], s[2]);
    if (!ct_fused_skip(&ds)) ds.opt_steps++;
    ct_fused_scaler_update(&ds.scaler, ds.nonfinite);
    pending[(head + count++) % STEPS] = ds;
    /* Host: reads (commits) results lag steps behind; all at the end. */
    while (count > (st == STEPS - 1 ? 0 : lag)) {
      ct_step_stats *h = &pending[head];
      head = (head + 1) % STEPS, count--;
      *skips += ct_fused_skip(h);
      ct_optimizer_commit_step(o, ct_fused_skip(h));
      if (sc && !ct_fused_skip(h)) CHECK_OK(ct_scheduler_step(sc, o));
      ct_scaler_from_dev(&h->scaler, &gs);
    }
  }
  ct_scheduler_destroy(sc);
  CHECK(ct_optimizer_steps(o) + *skips == STEPS);
  CHECK(ds.opt_steps == ct_optimizer_steps(o));
  for (int i = 0; i < nb; i++) free(s[i]);
  ct_optimizer_destroy(o);
}

static void lag_case(const char *name, ct_optim_config cfg, int sched) {
  float *g = malloc(sizeof(float) * N * STEPS), *p0 = malloc(N * 4), *p1 = malloc(N * 4), *p2 = malloc(N * 4);
  float *p3 = malloc(N * 4), *p4 = malloc(N * 4);
  for (int i = 0; i < N; i++) p0[i] = p1[i] = p2[i] = p3[i] = p4[i] = frand();
  for (int i = 0; i < N * STEPS; i++) g[i] = frand() * 256.0f;
  g[2 * N + 17] = INFINITY; /* step 2 is skipped by the scaler */
  int64_t k0, k1, k2, k3, k4;
  emulate(cfg, sched, 0, 0, g, p0, &k0);
  emulate(cfg, sched, 1, 0, g, p1, &k1);
  emulate(cfg, sched, 1, 1, g, p2, &k2);
  emulate(cfg, sched, 2, 0, g, p3, &k3);
  CHECK_MSG(k0 == 1 && k1 == 1 && k3 == 1, "%s: %lld/%lld/%lld skipped steps, expected 1", name, (long long)k0,
            (long long)k1, (long long)k3);
  CHECK_MSG(!memcmp(p0, p1, N * 4), "%s: lagged commit changed the weights", name);
  CHECK_MSG(!memcmp(p0, p3, N * 4), "%s: commit two steps late changed the weights", name);
  /* Row 0 (a host step count one behind after the skip) must differ:
   * otherwise this test could not see a wrong row. */
  CHECK_MSG(memcmp(p0, p2, N * 4) != 0, "%s: the table row made no difference; the test is blind", name);
  if (sched) {
    /* Nor may the schedule's look-ahead be left out. */
    emulate(cfg, sched, 1, 2, g, p4, &k4);
    CHECK_MSG(memcmp(p0, p4, N * 4) != 0, "%s: the schedule's look-ahead made no difference; the test is blind", name);
  }
  free(g), free(p0), free(p1), free(p2), free(p3), free(p4);
}

static void test_args_table(void) {
  ct_optim_config a = ct_optim_config_default(CT_OPTIM_ADAM);
  ct_optim_config w = ct_optim_config_default(CT_OPTIM_ADAMW);
  w.amsgrad = 1;
  w.weight_decay = 0.05;
  ct_optim_config s = ct_optim_config_default(CT_OPTIM_SGD);
  s.momentum = 0.9;
  s.dampening = 0.3; /* the first momentum step differs from the later ones */
  /* Then under OneCycleLR (learning rate and momentum/beta1 per step),
   * over the schedule's last step (the look-ahead past it is refused). */
  for (int sched = 0; sched <= 1; sched++) {
    lag_case(sched ? "adam onecycle" : "adam", a, sched);
    lag_case(sched ? "adamw amsgrad onecycle" : "adamw amsgrad", w, sched);
    lag_case(sched ? "sgd momentum onecycle" : "sgd momentum", s, sched);
  }
  /* Row j equals the arguments of an optimizer j taken steps further. */
  ct_optimizer *o;
  CHECK_OK(ct_optimizer_create(&a, 16, &o));
  CHECK_OK(ct_optimizer_set_steps(o, 5));
  ct_step_args t;
  ct_optim_step_args(o, NULL, 1.5, &t);
  CHECK(t.base_steps == 5);
  for (int j = 0; j <= CT_STEP_LAG_MAX; j++) {
    ct_fused_optim_args want;
    CHECK_OK(ct_optimizer_set_steps(o, 5 + j));
    ct_optim_fused_args(o, 1.5, &want);
    CHECK_MSG(!memcmp(&want, &t.row[j], sizeof want), "row %d differs from steps %d's arguments", j, 5 + j);
    CHECK(ct_step_args_pick(&t, 5 + j) == &t.row[j]);
  }
  CHECK(ct_step_args_pick(&t, 0) == &t.row[0]);
  CHECK(ct_step_args_pick(&t, 1000) == &t.row[CT_STEP_LAG_MAX]);
  ct_optimizer_destroy(o);
}

static void audit(const char *model, int want_ok, const char *want_word) {
  ct_model_options mo = {1, 28, 28, 10, 1};
  if (!strcmp(model, "resnet18")) mo.in_channels = 3, mo.height = mo.width = 32;
  ct_model *m;
  CHECK_OK(ct_model_create(model, &mo, &m));
  char why[256];
  int ok = ct_device_graph_audit(m, NULL, why, sizeof why);
  CHECK_MSG(ok == want_ok, "%s: audit %d, expected %d (%s)", model, ok, want_ok, why);
  if (want_word) CHECK_MSG(strstr(why, want_word) != NULL, "%s: reason '%s' lacks '%s'", model, why, want_word);
  ct_model_destroy(m);
}

/* Simulates the trainer's staging with `lag` and the ring: the device
 * finishes step j when the host waits on j's event (or on a later step's:
 * one stream, in order). Before staging step j into slot s, the previous
 * user of s must have finished; the wait slot must name that step's event,
 * never a later one (that would wait needlessly). */
static void stage_case(int lag) {
  ct_lag_ring r;
  ct_lag_ring_init(&r, lag);
  ct_batch b;
  enum { NSTEP = 40 };
  int64_t user[CT_STAGE_SLOTS];          /* step that last staged into slot s, -1 none */
  int64_t ev_step[CT_STEP_LAG_MAX + 1];  /* step whose stats event is in read-back slot e */
  int64_t done = -1;                     /* steps <= done have finished on the device */
  int waits = 0, slot_use[CT_STAGE_SLOTS] = {0};
  for (int s = 0; s < CT_STAGE_SLOTS; s++) user[s] = -1;
  for (int e = 0; e <= CT_STEP_LAG_MAX; e++) ev_step[e] = -1;
  for (int64_t j = 0; j < NSTEP; j++) {
    ct_step_result out;
    if (r.count == CT_STEP_LAG_MAX + 1) {
      int e = ct_lag_ring_pop(&r, &out);
      if (ev_step[e] > done) done = ev_step[e];
    }
    int k = ct_stage_slot(&r, CT_STAGE_SLOTS), w = ct_stage_wait_slot(&r, CT_STAGE_SLOTS);
    CHECK(k == (int)(j % CT_STAGE_SLOTS));
    slot_use[k]++;
    if (w >= 0) {
      waits++;
      CHECK_MSG(ev_step[w] == user[k], "lag %d step %lld: waits on step %lld's event, slot %d was used by %lld", lag,
                (long long)j, (long long)ev_step[w], k, (long long)user[k]);
      if (ev_step[w] > done) done = ev_step[w];
    }
    CHECK_MSG(user[k] <= done, "lag %d step %lld: staging slot %d overwritten while step %lld may still read it", lag,
              (long long)j, k, (long long)user[k]);
    user[k] = j;
    int e = ct_lag_ring_push(&r, &b, j, 1);
    CHECK(e >= 0);
    ev_step[e] = j;
    if (ct_lag_ring_due(&r)) {
      int pe = ct_lag_ring_pop(&r, &out);
      CHECK(out.step == ev_step[pe]);
      if (ev_step[pe] > done) done = ev_step[pe];
    }
  }
  for (int s = 0; s < CT_STAGE_SLOTS; s++) CHECK(slot_use[s] == NSTEP / CT_STAGE_SLOTS);
  /* Two slots: lag 0 and 1 never wait (the read-back already did), lag 2
   * waits before every step once two are in flight. */
  if (lag < CT_STAGE_SLOTS) CHECK_MSG(waits == 0, "lag %d: %d staging waits, expected none", lag, waits);
  else CHECK_MSG(waits == NSTEP - lag, "lag %d: %d staging waits, expected %d", lag, waits, NSTEP - lag);
}

static void test_staging(void) {
  for (int lag = 0; lag <= CT_STEP_LAG_MAX; lag++) stage_case(lag);
  /* With one slot (the old single buffer) every in-flight step blocks. */
  ct_lag_ring r;
  ct_batch b;
  ct_lag_ring_init(&r, 1);
  CHECK(ct_stage_wait_slot(&r, 1) == -1);
  int e = ct_lag_ring_push(&r, &b, 0, 1);
  CHECK(ct_stage_wait_slot(&r, 1) == e);
  CHECK(ct_stage_wait_slot(&r, 2) == -1);
}

static void test_graph_audit(void) {
  audit("mlp", 1, NULL);
  audit("lenet5", 1, NULL);
  audit("cnn", 1, NULL); /* dropout: the mask step is read from device memory */
  audit("resnet18", 1, NULL); /* its counters stay on the host, which counts replays */
  {
    ct_model_options mo = {1, 28, 28, 10, 1};
    ct_model *m;
    CHECK_OK(ct_model_create("cnn", &mo, &m));
    CHECK(ct_model_has_dropout(m));
    ct_model_destroy(m);
    CHECK_OK(ct_model_create("mlp", &mo, &m));
    CHECK(!ct_model_has_dropout(m));
    ct_model_destroy(m);
  }
  /* A late SGD momentum buffer is still refused. */
  {
    ct_model_options mo = {1, 28, 28, 10, 1};
    ct_model *m;
    CHECK_OK(ct_model_create("mlp", &mo, &m));
    ct_optim_config c = ct_optim_config_default(CT_OPTIM_SGD);
    ct_optimizer *o;
    CHECK_OK(ct_optimizer_create(&c, 16, &o));
    o->cfg.momentum = 0.9; /* switched on after the state moved: no buffer */
    char why[256];
    CHECK(ct_device_graph_audit(m, o, why, sizeof why) == 0 && strstr(why, "momentum"));
    ct_optimizer_destroy(o);
    ct_model_destroy(m);
  }
  size_t n;
  const ct_graph_arg *a = ct_device_graph_args(&n);
  int stale = 0;
  for (size_t i = 0; i < n; i++) {
    CHECK(a[i].name && a[i].name[0] && a[i].source && a[i].source[0]);
    stale += !a[i].replay_ok;
  }
  /* Every argument a replay would get wrong is one the audit refuses:
   * a late momentum buffer (dropout's step now comes from the device). */
  CHECK_MSG(stale == 1, "%d arguments replay stale, the audit knows 1", stale);
  int dropout_row = 0;
  for (size_t i = 0; i < n; i++)
    if (strstr(a[i].name, "dropout") && strstr(a[i].source, "dropout_step")) dropout_row = a[i].replay_ok;
  CHECK_MSG(dropout_row, "no replayable dropout step row in the argument table");
}

int main(void) {
  test_ring();
  test_lag_policy();
  test_args_table();
  test_staging();
  test_graph_audit();
  return test_summary("test_device_lag");
}
