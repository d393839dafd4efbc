/* A training loop of a user's own over the public step (include/ctrain
 * only: this folder's tests are built without src/ on the include path),
 * checked against ct_fit: the torchkeras `cnn` with Adam, the same
 * batches and seeds, trained both ways for STEPS steps, must end with the
 * same weights bit for bit, on the device named. */
#ifndef CTRAIN_TESTS_STEP_LOOP_H
#define CTRAIN_TESTS_STEP_LOOP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/data.h"
#include "ctrain/device.h"
#include "ctrain/model.h"
#include "ctrain/optim.h"
#include "ctrain/step.h"
#include "try.h"
#include "ctrain/trainer.h"

#define STEPS 6
#define BATCH 16

static ct_model *new_cnn(ct_device *dev) {
  ct_model_options mo = {0, 0, 0, 0, 7};
  ct_model *m;
  TRY(ct_model_create("cnn", &mo, &m));
  TRY(ct_model_prepare(m, dev, BATCH, 1));
  return m;
}

static ct_loader *new_loader(const ct_dataset *ds) {
  ct_loader_options lo;
  ct_loader_options_default(&lo);
  lo.batch_size = BATCH;
  lo.shuffle = 1;
  lo.seed = 11;
  lo.prefetch = 4; /* a lag-2 step holds three batches */
  ct_loader *l;
  TRY(ct_loader_create(ds, &lo, &l));
  return l;
}

/* The loop a user writes: one step object, one batch after another, each
 * result (on a device: a step or more later) handed back to the loader. */
static void user_loop(ct_model *m, ct_device *dev, ct_loader *l, const ct_optim_config *oc, int lag) {
  size_t n;
  ct_model_params(m, &n);
  ct_optimizer *opt;
  TRY(ct_optimizer_create(oc, n, &opt));
  ct_step_config sc;
  ct_step_config_default(&sc);
  sc.lag = lag;
  ct_step *step;
  TRY(ct_step_create(m, dev, opt, &sc, &step));
  TRY(ct_loader_start_epoch(l, 0, 0));
  int results = 0;
  for (int64_t k = 0; k < STEPS; k++) {
    ct_batch *b;
    TRY(ct_loader_next(l, &b));
    ct_step_pos pos = ct_step_pos_single(k);
    /* The phases one by one: what ct_step_train runs. */
    TRY(ct_step_begin(step, b, &pos));
    TRY(ct_step_forward(step, NULL));
    TRY(ct_step_loss(step));
    TRY(ct_step_backward(step));
    TRY(ct_step_sync(step));
    TRY(ct_step_unscale_check_clip(step));
    TRY(ct_step_update(step));
    ct_step_result r;
    int have = 0;
    TRY(ct_step_end(step, &r, &have));
    if (have) ct_loader_release(l, r.batch), results++;
  }
  for (int have = 1; have;) {
    ct_step_result r;
    TRY(ct_step_drain(step, &r, &have));
    if (have) ct_loader_release(l, r.batch), results++;
  }
  if (results != STEPS) {
    fprintf(stderr, "user loop: %d results for %d steps\n", results, STEPS);
    exit(1);
  }
  ct_step_destroy(step);
  ct_optimizer_destroy(opt);
}

static ct_status count_ready(void *ctx, ct_step *s, int layer, size_t first, size_t count) {
  (void)s, (void)layer, (void)first, (void)count;
  ++*(int *)ctx;
  return CT_OK;
}

/* On a device that captures CUDA graphs: a step asked for a graph
 * captures one without hooks, and with host hooks runs eagerly and calls
 * them every step (a replay would skip them). 0 when so. */
static int graph_hooks_check(ct_device *dev, ct_loader *l) {
  int bad = 0;
  for (int hooked = 0; hooked < 2; hooked++) {
    ct_model *m = new_cnn(dev);
    size_t n;
    ct_model_params(m, &n);
    ct_optim_config oc = ct_optim_config_default(CT_OPTIM_ADAM);
    ct_optimizer *opt;
    TRY(ct_optimizer_create(&oc, n, &opt));
    ct_step_config sc;
    ct_step_config_default(&sc);
    sc.lag = 1, sc.cuda_graph = 1;
    ct_step *step;
    TRY(ct_step_create(m, dev, opt, &sc, &step));
    int calls = 0;
    ct_step_hooks h = {.ctx = &calls, .grads_ready = count_ready};
    if (hooked) ct_step_set_hooks(step, &h);
    TRY(ct_loader_start_epoch(l, 0, 0));
    for (int64_t k = 0; k < STEPS; k++) {
      ct_batch *b;
      ct_step_result r;
      int have = 0;
      TRY(ct_loader_next(l, &b));
      ct_step_pos pos = ct_step_pos_single(k);
      TRY(ct_step_train(step, b, &pos, &r, &have));
      if (have) ct_loader_release(l, r.batch);
    }
    for (int have = 1; have;) {
      ct_step_result r;
      TRY(ct_step_drain(step, &r, &have));
      if (have) ct_loader_release(l, r.batch);
    }
    const char *note = NULL;
    int on = ct_step_graph_on(step, &note);
    /* cnn: 4 layers with parameters (2 convolutions, 2 linear) */
    if (hooked ? on || calls != 4 * STEPS || !note || !strstr(note, "hooks") : !on) {
      fprintf(stderr, "FAIL: %s hooks: graph %s (%s), grads_ready called %d times (want %d)\n", hooked ? "with" : "without",
              on ? "on" : "off", note ? note : "no note", calls, hooked ? 4 * STEPS : 0);
      bad = 1;
    }
    ct_step_destroy(step);
    ct_optimizer_destroy(opt);
    ct_model_destroy(m);
  }
  if (!bad) printf("ok: a graph is captured without hooks; with host hooks the step runs eagerly and calls them\n");
  return bad;
}

/* Returns 0 when both ways end with the same weights, 1 otherwise, 77
 * when the device cannot be opened. */
static int step_loop_check(const char *spec) {
  ct_device *dev;
  if (ct_device_open(spec, &dev) != CT_OK) {
    printf("SKIP: no %s device (%s)\n", spec, ct_last_error());
    return 77;
  }
  ct_dataset_options dopt;
  ct_dataset_options_default(&dopt);
  dopt.synth_count = BATCH * STEPS;
  ct_dataset *ds;
  TRY(ct_dataset_open("synthetic", 1, &dopt, &ds));

  ct_train_config cfg;
  ct_train_config_default(&cfg);
  cfg.optim = ct_optim_config_default(CT_OPTIM_ADAM);
  cfg.optim.lr = 2e-3;
  cfg.max_steps = STEPS;
  ct_model *a = new_cnn(dev);
  ct_loader *la = new_loader(ds);
  ct_fit_result fr;
  TRY(ct_fit(a, dev, la, NULL, &cfg, &fr));
  ct_fit_result_free(&fr);

  ct_model *b = new_cnn(dev);
  ct_loader *lb = new_loader(ds);
  user_loop(b, dev, lb, &cfg.optim, 0);
  ct_model *c = new_cnn(dev);
  ct_loader *lc = new_loader(ds);
  user_loop(c, dev, lc, &cfg.optim, 2);

  int bad = 0;
  for (int i = 0; i < ct_model_state_count(a); i++) {
    const ct_tensor *ta = &ct_model_state(a, i)->value;
    size_t bytes = ct_tensor_nbytes(ta);
    void *ha = malloc(bytes), *hb = malloc(bytes), *hc = malloc(bytes);
    TRY(ct_device_copy(NULL, ha, ta->device, ta->data, bytes));
    const ct_tensor *tb = &ct_model_state(b, i)->value, *tc = &ct_model_state(c, i)->value;
    TRY(ct_device_copy(NULL, hb, tb->device, tb->data, bytes));
    TRY(ct_device_copy(NULL, hc, tc->device, tc->data, bytes));
    if (memcmp(ha, hb, bytes) || memcmp(ha, hc, bytes)) {
      fprintf(stderr, "FAIL %s: %s differs between ct_fit and the user loop (lag 0: %s, lag 2: %s)\n", spec,
              ct_model_state(a, i)->name, memcmp(ha, hb, bytes) ? "differs" : "same",
              memcmp(ha, hc, bytes) ? "differs" : "same");
      bad = 1;
    }
    free(ha), free(hb), free(hc);
  }
  /* The loop trained: the weights moved from their initial values. */
  ct_model *fresh;
  ct_model_options mo = {0, 0, 0, 0, 7};
  TRY(ct_model_create("cnn", &mo, &fresh));
  const ct_tensor *w0 = &ct_model_state(fresh, 0)->value, *w1 = &ct_model_state(b, 0)->value;
  size_t wb = ct_tensor_nbytes(w0);
  void *h1 = malloc(wb);
  TRY(ct_device_copy(NULL, h1, w1->device, w1->data, wb));
  if (!memcmp(w0->data, h1, wb)) {
    fprintf(stderr, "FAIL %s: the user loop left %s at its initial values\n", spec, ct_model_state(b, 0)->name);
    bad = 1;
  }
  free(h1);
  ct_model_destroy(fresh);
  if (ct_device_can_capture_graphs(dev)) bad |= graph_hooks_check(dev, la);
  ct_loader_destroy(la), ct_loader_destroy(lb), ct_loader_destroy(lc);
  ct_model_destroy(a), ct_model_destroy(b), ct_model_destroy(c);
  ct_dataset_close(ds);
  ct_device_close(dev);
  if (!bad) printf("ok: %d steps of the user loop (lag 0 and 2) end on ct_fit's weights on %s\n", STEPS, spec);
  return bad;
}

#endif
