/* fit / evaluate / predict. See include/ctrain/trainer.h for the contract.
 *
 * Exact resume: everything a step depends on is either in the checkpoint
 * (model and optimizer state, scheduler scalars, epoch, position in the
 * epoch, the running sums of the epoch's metrics, early-stopping counters,
 * history) or a pure function of the seed and the step (data order,
 * augmentation and dropout masks come from the counter-based RNG), so a
 * resumed run repeats an uninterrupted one bit for bit on the CPU. */
#include "ctrain/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrain/atomic_file.h"
#include "ctrain/history.h"
#include "ctrain/progress.h"
#include "ctrain/step.h"
#include "ctrain/tensorboard.h"
#include "data/gpu_data.h"
#include "io/train_state.h"
#include "exec/device_state.h"
#include "train/accumulate.h"
#include "train/fit_run.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ct_train_config_default(ct_train_config *c) {
  memset(c, 0, sizeof *c);
  c->epochs = 1;
  c->loss = CT_LOSS_CROSS_ENTROPY;
  c->optim = ct_optim_config_default(CT_OPTIM_SGD);
  c->monitor = "val_loss";
  c->keep_last = 3;
}

void ct_fit_result_free(ct_fit_result *r) {
  free(r->epoch_seconds);
  r->epoch_seconds = NULL;
  ct_history_free(r->history);
  r->history = NULL;
}

/* A loader in a GPU data mode (CT_LOADER_RAW_U8, CT_LOADER_INDICES) hands
 * out untransformed batches that the device step stages through the
 * ct_gpu_data attached to the loader (ctrain train attaches one per split
 * before fit). When the caller attached none, evaluate and predict attach
 * one for their pass, so the public loader modes work on their own. b is
 * the pass's first batch: delivered before the attachment, it gets the
 * pointer by hand (the loader stamps every later one). */
static ct_status gpu_pass_begin(ct_model *m, ct_device *dev, ct_loader *l, ct_batch *b, const char *what,
                                ct_gpu_data **tmp) {
  *tmp = NULL;
  if (ct_loader_get_options(l)->mode == CT_LOADER_FLOAT) return CT_OK;
  if (!b->device_data) {
    CT_TRY(ct_gpu_data_create(dev, l, what, tmp));
    b->device_data = *tmp;
  }
  if (!ct_model_step_stats(m))
    return ct_error(CT_ERR_INVALID_ARG,
                    "%s: the loader delivers %s, whose transform runs on the device, but model '%s' is not resident "
                    "on %s; prepare the model on a CUDA device or use a CT_LOADER_FLOAT loader",
                    what,
                    ct_loader_get_options(l)->mode == CT_LOADER_RAW_U8 ? "raw uint8 batches (CT_LOADER_RAW_U8)"
                                                                       : "indices only (CT_LOADER_INDICES)",
                    ct_model_name(m), ct_device_name(dev));
  return CT_OK;
}

/* Detaches and frees what gpu_pass_begin attached (NULL: nothing). */
static void gpu_pass_end(ct_loader *l, ct_gpu_data *tmp) {
  if (!tmp) return;
  ct_loader_set_device_data(l, NULL);
  ct_gpu_data_destroy(tmp);
}

/* One pass of the loader in eval mode: sums[0..3] = loss x n, top-1,
 * top-5 and n. */
static ct_status eval_sums(ct_model *m, ct_device *dev, ct_loader *l, ct_loss_kind loss, float ls, double sums[4]) {
  double loss_sum = 0;
  int64_t top1 = 0, top5 = 0, n = 0;
  CT_TRY(ct_loader_start_epoch(l, 0, 0));
  ct_gpu_data *tmp = NULL;
  ct_status s = CT_OK;
  for (int first = 1; s == CT_OK; first = 0) {
    ct_batch *b;
    s = ct_loader_next(l, &b);
    if (s != CT_OK || !b) break;
    if (first) s = gpu_pass_begin(m, dev, l, b, "evaluation", &tmp);
    if (s == CT_OK) s = ct_step_eval_batch(m, dev, b, loss, ls, &loss_sum, &top1, &top5, NULL);
    if (s == CT_OK) n += b->n;
    ct_loader_release(l, b);
  }
  gpu_pass_end(l, tmp);
  sums[0] = loss_sum, sums[1] = (double)top1, sums[2] = (double)top5, sums[3] = (double)n;
  return s;
}

static void eval_result(const ct_model *m, const double sums[4], double t0, ct_eval_result *res) {
  int64_t n = (int64_t)sums[3];
  res->samples = n;
  res->loss = n ? sums[0] / (double)n : NAN;
  res->accuracy = n ? sums[1] / (double)n : 0;
  res->top5 = n && ct_model_output_size(m) >= 5 ? sums[2] / (double)n : 0;
  res->seconds = now_s() - t0;
}

ct_status ct_evaluate(ct_model *m, ct_device *dev, ct_loader *l, ct_loss_kind loss, float ls, ct_eval_result *res) {
  memset(res, 0, sizeof *res);
  double t0 = now_s(), sums[4];
  CT_TRY(eval_sums(m, dev, l, loss, ls, sums));
  eval_result(m, sums, t0, res);
  return CT_OK;
}

ct_status ct_predict(ct_model *m, ct_device *dev, ct_loader *l, ct_predict_fn fn, void *ctx) {
  int64_t k = ct_model_output_size(m), idx = 0;
  float *probs = NULL;
  int64_t cap = 0;
  ct_gpu_data *tmp = NULL;
  ct_status s = ct_loader_start_epoch(l, 0, 0);
  for (int first = 1; s == CT_OK; first = 0) {
    ct_batch *b;
    s = ct_loader_next(l, &b);
    if (s != CT_OK || !b) break;
    if (first) s = gpu_pass_begin(m, dev, l, b, "prediction", &tmp);
    if (s == CT_OK && b->n * k > cap) {
      float *np = realloc(probs, (size_t)(b->n * k) * sizeof(float));
      if (!np) s = ct_error(CT_ERR_OUT_OF_MEMORY, "predict: out of host memory");
      else probs = np, cap = b->n * k;
    }
    if (s == CT_OK) s = ct_step_predict_batch(m, dev, b, probs);
    /* The labels stay on the host in every loader mode. */
    for (int64_t i = 0; s == CT_OK && i < b->n; i++) s = fn(ctx, idx++, probs + i * k, k, ((int64_t *)b->y.data)[i]);
    ct_loader_release(l, b);
  }
  gpu_pass_end(l, tmp);
  free(probs);
  return s;
}

static double monitored(const char *monitor, double loss, double acc, const ct_eval_result *val, int have_val) {
  if (!strcmp(monitor, "loss")) return loss;
  if (!strcmp(monitor, "accuracy")) return acc;
  if (!strcmp(monitor, "val_accuracy")) return have_val ? val->accuracy : acc;
  return have_val ? val->loss : loss;
}

/* Adds one batch to the epoch's sums. Its loss and hits count only when
 * the loss is finite: under loss scaling an overflowing forward is a
 * skipped step that stays out of the epoch's mean (counting its hits alone
 * let accuracy pass 1). Images and the accumulation group's loss count
 * always. */
static void count_batch(ct_loop_state *ls, double lv, int64_t n, int64_t top1, int64_t top5, int64_t *images) {
  if (isfinite(lv)) {
    ls->loss_sum += lv * (double)n;
    ls->seen += n;
    ls->correct += top1;
    ls->top5 += top5;
  }
  *images += n;
  ls->group_loss += lv * (double)n;
  ls->group_n += n;
}


/* Evaluation over the validation loader; under data parallel each rank
 * evaluates its share (every sample once) and the sums are added up. */
static ct_status fit_evaluate(fit_run *f) {
  double t0 = now_s(), sums[4] = {0, 0, 0, 0};
  memset(&f->vres, 0, sizeof f->vres);
  ct_status s = f->dp ? CT_OK : eval_sums(f->m, f->dev, f->val, f->cfg->loss, f->cfg->label_smoothing, sums);
  /* DataParallel: each validation batch split over the replicas. */
  if (f->dp) s = ct_loader_start_epoch(f->val, 0, 0);
  while (f->dp && s == CT_OK) {
    ct_batch *b;
    s = ct_loader_next(f->val, &b);
    if (s != CT_OK || !b) break;
    s = ct_dp_eval(f->dp, b, f->cfg->loss, f->cfg->label_smoothing, sums);
    sums[3] += (double)b->n;
    ct_loader_release(f->val, b);
  }
  if (s == CT_OK && f->ddp) s = ct_ddp_sum(f->ddp, sums, 4, "the all-reduce of the evaluation's sums");
  if (s == CT_OK) eval_result(f->m, sums, t0, &f->vres);
  f->have_val = s == CT_OK;
  return s;
}

/* A failed log write: warn once, stop logging, train on. */
static void logs_failed(fit_run *f) {
  if (f->logs_off) return;
  f->logs_off = 1;
  snprintf(f->res->log_warning, sizeof f->res->log_warning, "%s", ct_last_error());
  if (f->cfg->progress)
    fprintf(f->cfg->progress, "\nwarning: %s; logging stopped, training goes on\n", f->res->log_warning);
  (void)ct_tb_close(f->tb);
  f->tb = NULL;
}

/* The first state entry of m whose values (grads = 0) or gradients hold
 * NaN or inf, with the count, into what (a message part); 0 if none. */
static int first_nonfinite(ct_model *m, int grads, char *what, size_t cap) {
  for (int i = 0; i < ct_model_state_count(m); i++) {
    const ct_state_entry *e = ct_model_state(m, i);
    const ct_tensor *t = grads ? &e->grad : &e->value;
    if ((grads && e->is_buffer) || !t->data || t->dtype != CT_F32) continue;
    size_t n = (size_t)ct_tensor_numel(t), bad = 0;
    float *h = malloc(n * sizeof *h + 4);
    if (!h || ct_device_copy(NULL, h, t->device, t->data, n * sizeof *h) != CT_OK) {
      free(h);
      continue;
    }
    for (size_t j = 0; j < n; j++) bad += !isfinite(h[j]);
    free(h);
    if (bad) {
      snprintf(what, cap, "%s%s holds %zu NaN/inf of %zu values", e->name, grads ? "'s gradient" : "", bad, n);
      return 1;
    }
  }
  return 0;
}

/* Refuses weights that hold NaN or inf (the run diverged), naming the
 * first such tensor; when: "after epoch 3" and the like. */
static ct_status check_weights(fit_run *f, const char *when) {
  char what[256];
  if (!first_nonfinite(f->m, 0, what, sizeof what)) return CT_OK;
  return ct_error(CT_ERR_INVALID_ARG,
                  "fit: %s (step %lld) the weights are no longer finite: %s; the training diverged and nothing was "
                  "saved from it (earlier checkpoints are intact); lower --lr or clip gradients (--clip-grad-norm)",
                  when, (long long)f->ls.step, what);
}

/* The bookkeeping of one step when its result arrives (at once on a host
 * model, a step after it was queued on a device model with the lagged
 * read-back): sums, checks, logs and progress for the step r.step. The
 * batch is released here, not at queue time: the device may still be
 * copying from it until then. Without a scaler a NaN/inf loss or gradient
 * stops fit, or with CT_NONFINITE_SKIP is counted and passed over. */
static ct_status on_result(fit_run *f, const ct_step_result *r, ct_progress *pg, double t0, int64_t *images) {
  static const char *const names[2] = {"loss", "accuracy"};
  const ct_train_config *cfg = f->cfg;
  ct_loop_state *ls = &f->ls;
  int64_t pos = r->batch->index + 1;
  ct_loader_release(f->train, r->batch);
  double lv = r->loss;
  if (!ct_step_scaler(f->step)->enabled && (!isfinite(lv) || r->skipped)) {
    if (cfg->on_nonfinite == CT_NONFINITE_SKIP) {
      f->guard_skips += !r->micro;
    } else {
      char what[256] = "";
      /* (ZeRO-2 on a device: the parameters' gradients are slots other buckets reuse) */
      if (isfinite(lv) && (f->shard_grads || !first_nonfinite(f->m, 1, what, sizeof what)))
        snprintf(what, sizeof what, "a gradient was NaN or inf (later steps overwrote them)");
      return ct_error(CT_ERR_INVALID_ARG,
                      "fit: step %lld: %s%s%s; the update was not applied. Lower --lr, clip gradients "
                      "(--clip-grad-norm), or pass over such steps with --on-nonfinite skip",
                      (long long)r->step, isfinite(lv) ? "" : "the loss became ", isfinite(lv) ? "" : (lv != lv ? "nan" : "inf"),
                      isfinite(lv) ? what : "");
    }
  }
  /* A per-step schedule was stepped with the update (by the read-back on
   * a device model) if the step was taken: the LR logged is the one after it. */
  ct_status s = CT_OK;
  count_batch(ls, lv, r->n, r->top1, r->top5, images);
  if (f->tb && !r->micro) {
    double gl = cfg->accumulate > 1 ? ls->group_loss / (double)ls->group_n : lv;
    ct_tb_scalar(f->tb, "train/loss_step", r->step + 1, gl);
    ct_tb_scalar(f->tb, "train/lr", r->step + 1, ct_optimizer_get_lr(f->opt));
  }
  if (!r->micro) ls->group_loss = 0, ls->group_n = 0;
  if (s == CT_OK && pg) {
    double vals[2] = {ls->loss_sum / (double)ls->seen, (double)ls->correct / (double)ls->seen};
    double el = now_s() - t0;
    s = ct_progress_update(pg, pos, names, vals, 2, el > 0 ? (double)*images / el : 0);
  }
  return s;
}

/* The epoch's row of the history (written to log_dir's history.csv/json
 * unless NULL) and its TensorBoard scalars (tb NULL: none); val NULL:
 * none. */
static ct_status log_epoch(ct_history *hist, ct_tb_writer *tb, const char *log_dir, int64_t epoch, double tl,
                           double ta, const ct_eval_result *val, double lr, double dt) {
  const char *hn[] = {"loss", "accuracy", "val_loss", "val_accuracy", "lr", "seconds"};
  double hv[] = {tl, ta, val ? val->loss : NAN, val ? val->accuracy : NAN, lr, dt};
  ct_status s = ct_history_add_row(hist, epoch, hn, hv, val ? 6 : 2);
  if (s == CT_OK && !val) {
    s = ct_history_add(hist, epoch, "lr", lr);
    if (s == CT_OK) s = ct_history_add(hist, epoch, "seconds", dt);
  }
  if (s == CT_OK && log_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/history.csv", log_dir);
    s = ct_history_write_csv(hist, path);
    snprintf(path, sizeof path, "%s/history.json", log_dir);
    if (s == CT_OK) s = ct_history_write_json(hist, path);
  }
  if (s == CT_OK && tb) {
    ct_tb_scalar(tb, "epoch/loss", epoch, tl);
    ct_tb_scalar(tb, "epoch/accuracy", epoch, ta);
    ct_tb_scalar(tb, "epoch/lr", epoch, lr);
    if (val) {
      ct_tb_scalar(tb, "epoch/val_loss", epoch, val->loss);
      ct_tb_scalar(tb, "epoch/val_accuracy", epoch, val->accuracy);
    }
    s = ct_tb_flush(tb);
  }
  return s;
}

/* Copies every parameter and buffer of m into the host buffer buf, one
 * after another (to_host), or back from it. */
static ct_status copy_state(ct_model *m, void *buf, int to_host) {
  char *p = buf;
  for (int i = 0; i < ct_model_state_count(m); i++) {
    const ct_tensor *t = &ct_model_state(m, i)->value;
    CT_TRY(to_host ? ct_device_copy(NULL, p, t->device, t->data, ct_tensor_nbytes(t))
                   : ct_device_copy(t->device, t->data, NULL, p, ct_tensor_nbytes(t)));
    p += ct_tensor_nbytes(t);
  }
  return CT_OK;
}

/* The end of epoch `epoch`'s checkpoints: epoch-NNNN, last, best when it
 * improved, and the older ones beyond keep_last pruned. */
static ct_status save_epoch(ct_model *m, ct_optimizer *opt, ct_scheduler *sch, const ct_loop_state *ls,
                            const ct_history *hist, const ct_train_config *cfg, const ct_grad_scaler *gs,
                            int64_t epoch, int improved) {
  char file[64];
  snprintf(file, sizeof file, "epoch-%04lld.safetensors", (long long)epoch);
  CT_TRY(ct_train_state_save(cfg->checkpoint_dir, file, m, opt, sch, ls, hist, cfg, gs));
  CT_TRY(ct_train_state_save(cfg->checkpoint_dir, "last.safetensors", m, opt, sch, ls, hist, cfg, gs));
  if (improved) CT_TRY(ct_train_state_save(cfg->checkpoint_dir, "best.safetensors", m, opt, sch, ls, hist, cfg, gs));
  ct_train_state_prune(cfg->checkpoint_dir, epoch, cfg->keep_last);
  return CT_OK;
}

static ct_status fit_check(const ct_train_config *cfg) {
  if (cfg->epochs <= 0) return ct_error(CT_ERR_INVALID_ARG, "fit: epochs must be positive");
  if (cfg->loss == CT_LOSS_MSE) return ct_error(CT_ERR_UNSUPPORTED, "fit: the trainer trains classifiers (cross_entropy or nll)");
  if (cfg->monitor && strcmp(cfg->monitor, "loss") && strcmp(cfg->monitor, "accuracy") &&
      strcmp(cfg->monitor, "val_loss") && strcmp(cfg->monitor, "val_accuracy"))
    return ct_error(CT_ERR_INVALID_ARG, "fit: monitor '%s' is not one of loss, accuracy, val_loss, val_accuracy", cfg->monitor);
  if (cfg->dist.comm && cfg->dist.dp_count > 1)
    return ct_error(CT_ERR_UNSUPPORTED, "fit: DataParallel inside each rank of a DDP job is not supported");
  if (cfg->accumulate < 0 || cfg->accumulate > CT_ACCUMULATE_MAX)
    return ct_error(CT_ERR_INVALID_ARG, "fit: accumulate must be in [0, %d] (0 or 1 = off), got %d", CT_ACCUMULATE_MAX,
                    cfg->accumulate);
  return CT_OK;
}


/* Whether file can be written in dir before the first step, not after
 * the work (a read-only or full directory). */
static ct_status probe_dir(const char *dir, const char *file) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  ct_status s = ct_atomic_file_check(path);
  return s == CT_OK ? s : ct_error_wrap(s, "fit: cannot write in %s", dir);
}

/* Creates the optimizer, scheduler, history, logs and step, restoring
 * the checkpoint first when resuming. */
static ct_status fit_open(fit_run *f) {
  const ct_train_config *cfg = f->cfg;
  size_t np;
  ct_model_params(f->m, &np);
  f->acc = cfg->accumulate > 1 ? cfg->accumulate : 1;
  f->monitor = cfg->monitor ? cfg->monitor : "val_loss";
  f->maximize = cfg->monitor_max || strstr(f->monitor, "accuracy") != NULL;
  f->gs = cfg->scaler;
  if (!f->gs.enabled) ct_grad_scaler_init(&f->gs, 0, 0, 1.0);
  f->ls.best = f->maximize ? -INFINITY : INFINITY;
  f->ls.best_epoch = -1;
  f->vres.loss = f->vres.accuracy = f->vres.top5 = NAN; /* until an evaluation runs */
  f->batches = ct_loader_batches_per_epoch(f->train);
  f->batch_size = ct_loader_get_options(f->train)->batch_size;
  f->world = 1, f->lead = 1;
  /* Under ZeRO a fresh run's state is created per shard (fit_dist_open):
   * until then the optimizer holds one value, its configuration only. */
  int sharded = cfg->dist.comm && cfg->dist.zero && !cfg->resume;
  ct_status s = ct_optimizer_create(&cfg->optim, sharded ? 1 : np, &f->opt);
  if (s == CT_OK && cfg->use_scheduler) s = ct_scheduler_create(&cfg->sched, f->opt, &f->sch);
  if (s == CT_OK) s = ct_history_create(&f->hist);
  int writes = !cfg->dist.comm || ct_comm_rank(cfg->dist.comm) == 0;
  if (s == CT_OK && cfg->checkpoint_dir && writes) s = ct_ensure_dir(cfg->checkpoint_dir);
  if (s == CT_OK && cfg->checkpoint_dir && writes) s = probe_dir(cfg->checkpoint_dir, "last.safetensors");
  if (s == CT_OK && cfg->resume) {
    if (!cfg->checkpoint_dir) s = ct_error(CT_ERR_INVALID_ARG, "fit: resume needs a checkpoint directory");
    else s = ct_train_state_restore(cfg->checkpoint_dir, f->m, f->opt, f->sch, &f->ls, f->hist, cfg, &f->gs);
    if (s == CT_OK) f->res->resumed_from_epoch = (int)f->ls.epoch;
    /* Another world size: the same global sample, counted in this
     * world's batches (exact: a checkpoint falls on a step boundary, and
     * ranks x accumulate is the same). */
    int run_world = ct_comm_size(cfg->dist.comm);
    if (s == CT_OK && f->ls.world != run_world) f->ls.batch = f->ls.batch * f->ls.world / run_world;
  }
  if (s == CT_OK && cfg->dist.comm) s = fit_dist_open(f);
  /* The step; a model resident on a device trains there, its optimizer
   * state moved to the device after any restore loaded it on the host.
   * The read-back runs one step behind (the host never waits for the GPU
   * inside an epoch); the graph, when asked for, after two eager warm-up
   * steps. */
  if (s == CT_OK) {
    ct_step_config sc;
    ct_step_config_default(&sc);
    sc.loss = cfg->loss, sc.label_smoothing = cfg->label_smoothing, sc.clip_grad_norm = cfg->clip_grad_norm;
    sc.accumulate = f->acc, sc.scaler = f->gs, sc.step_sched = cfg->sched_per_step ? f->sch : NULL;
    sc.lag = 1, sc.cuda_graph = cfg->cuda_graph;
    sc.apply_nonfinite = 0;
    sc.shard_lo = f->shard_lo, sc.shard_hi = f->shard_hi, sc.shard_grads = f->shard_grads;
    s = ct_step_create(f->m, f->dev, f->opt, &sc, &f->step);
    if (s != CT_OK) s = ct_error_wrap(s, "fit");
    int R = cfg->dist.dp_count;
    if (s == CT_OK && R >= 2)
      s = ct_dp_create(f->step, &sc, &cfg->optim, &cfg->dist, (f->batch_size + R - 1) / R, &f->dp);
  }
  if (s == CT_OK && cfg->dist.sync_bn) s = fit_sync_bn_open(f);
  if (s == CT_OK && f->ddp) {
    ct_step_hooks h;
    ct_ddp_hooks(f->ddp, &h);
    ct_step_set_hooks(f->step, &h);
  }
  const char *log_dir = f->lead ? cfg->log_dir : NULL;
  if (s == CT_OK && log_dir) s = ct_ensure_dir(log_dir);
  if (s == CT_OK && log_dir) s = probe_dir(log_dir, "history.csv");
  if (s == CT_OK && log_dir) s = ct_tb_open(log_dir, &f->tb);
  if (s == CT_OK && f->tb && cfg->settings_text) s = ct_tb_text(f->tb, "settings", f->ls.step, cfg->settings_text);
  if (s == CT_OK && cfg->restore_best) {
    size_t nb = 0;
    for (int i = 0; i < ct_model_state_count(f->m); i++) nb += ct_tensor_nbytes(&ct_model_state(f->m, i)->value);
    f->best_state = malloc(nb ? nb : 1);
    if (!f->best_state) s = ct_error(CT_ERR_OUT_OF_MEMORY, "fit: cannot keep a copy of the best weights (%zu bytes)", nb);
  }
  f->res->epoch_seconds = calloc((size_t)cfg->epochs + 1, sizeof(double));
  if (s == CT_OK && !f->res->epoch_seconds) s = ct_error(CT_ERR_OUT_OF_MEMORY, "fit: out of host memory");
  if (s == CT_OK && f->ls.batch > f->batches)
    s = ct_error(CT_ERR_PARSE, "fit: the checkpoint stopped at batch %lld of an epoch of %lld batches",
                 (long long)f->ls.batch, (long long)f->batches);
  if (s == CT_OK && f->ls.batch % f->acc != 0 && f->ls.batch < f->batches)
    s = ct_error(CT_ERR_INVALID_ARG, "fit: the checkpoint stopped at batch %lld, inside a group of --accumulate %d",
                 (long long)f->ls.batch, f->acc);
  return s;
}

/* Whether cfg->stop_request asks to stop; records its value. Under data
 * parallel the ranks agree first (a signal may reach them a step apart,
 * and a rank that stopped alone would leave the others waiting). */
static int stop_requested(fit_run *f, ct_status *s) {
  int v = f->cfg->stop_request ? (int)*f->cfg->stop_request : 0;
  if (f->ddp) {
    double any[2] = {v != 0, v};
    *s = ct_ddp_sum(f->ddp, any, 2, "the all-reduce of the stop requests");
    v = any[0] > 0 ? (int)(any[1] / any[0]) : 0;
  }
  if (v) f->res->stopped_by = v;
  return v != 0;
}

/* The epoch's batches from the loader's position, then the steps still
 * in flight. *stop: max_steps was reached. */
static ct_status train_epoch(fit_run *f, ct_progress *pg, double t0, int64_t *images, int *stop) {
  ct_loop_state *ls = &f->ls;
  ct_status s = CT_OK;
  while (s == CT_OK) {
    ct_batch *b;
    s = ct_loader_next(f->train, &b);
    if (s != CT_OK || !b) break;
    /* The batch's place in its accumulation group (one group of one,
     * factor exactly 1, without accumulation); the statistics of a step
     * arrive when it is done (one step later on a device model), so
     * losses, accuracy, logs and progress may run behind the queue. */
    ct_accum_pos ap = ct_accum_position(f->acc, b->index, b->n, f->batches, b->order_n, f->batch_size);
    /* Under data parallel every rank's batches are alike (the sampler
     * pads), so the batch is 1/world of the global one and its sample i
     * is number world x i + rank of it (the strided share). */
    ct_step_pos pos = {ls->step,
                       (uint32_t)ls->step,
                       ap.first,
                       ap.last,
                       (float)(ap.factor / f->world),
                       (int64_t)ap.index * f->batch_size * f->world + f->rank,
                       f->world};
    ct_step_result r;
    int have = 0;
    ls->batch = b->index + 1;
    s = f->dp ? ct_dp_train(f->dp, b, &pos, &r, &have) : ct_step_train(f->step, b, &pos, &r, &have);
    if (s != CT_OK) break;
    if (ap.last) ls->step++;
    if (have) s = on_result(f, &r, pg, t0, images);
    if (s == CT_OK && ap.last && f->cfg->max_steps && ls->step >= f->cfg->max_steps) {
      *stop = 1;
      break;
    }
    if (s == CT_OK && ap.last && f->ddp && f->cfg->dist.check_sync > 0 && ls->step % f->cfg->dist.check_sync == 0)
      s = ct_ddp_check_sync(f->ddp, ls->step);
    if (s == CT_OK && ap.last && stop_requested(f, &s)) {
      *stop = 1;
      break;
    }
  }
  if (s == CT_OK && f->ddp) s = ct_ddp_finish(f->ddp);
  if (s == CT_OK && f->dp) s = ct_dp_finish(f->dp);
  for (int have = 1; s == CT_OK && have;) {
    ct_step_result r;
    s = f->dp ? ct_dp_drain(f->dp, &r, &have) : ct_step_drain(f->step, &r, &have);
    if (s == CT_OK && have) s = on_result(f, &r, pg, t0, images);
  }
  return s;
}

/* Once, at the end of the first epoch where it is decided: a graph, or a
 * reason for none. Until the warm-up steps have run neither exists (an
 * epoch of two batches is all warm-up), so the line waits; the last epoch
 * prints it whatever it is. */
static void tell_graph(fit_run *f, ct_progress *pg, int stop) {
  const ct_train_config *cfg = f->cfg;
  if (!ct_step_on_device(f->step) || !cfg->progress || !cfg->cuda_graph || f->graph_told) return;
  const char *note = NULL;
  int on = ct_step_graph_on(f->step, &note);
  if (on || note || stop || f->ls.epoch + 1 >= cfg->epochs) {
    char line[600];
    snprintf(line, sizeof line, "cuda graph: %s%s", on ? "on" : "off: ", on ? "" : note ? note : "not captured");
    if (pg) (void)ct_progress_message(pg, line);
    else fprintf(cfg->progress, "%s\n", line);
    f->graph_told = 1;
  }
}

/* Stopped mid-epoch (max_steps, or a stop request, which skips the
 * validation): checkpoint the position and report. */
static ct_status stop_mid_epoch(fit_run *f) {
  ct_loop_state *ls = &f->ls;
  ct_status s = check_weights(f, "when stopped");
  ct_optimizer *o, *tmp = NULL;
  if (s == CT_OK && f->cfg->checkpoint_dir) s = fit_ckpt_optimizer(f, &o, &tmp);
  if (s == CT_OK && f->cfg->checkpoint_dir && f->lead)
    s = ct_train_state_save(f->cfg->checkpoint_dir, "last.safetensors", f->m, o, f->sch, ls, f->hist, f->cfg,
                            ct_step_scaler(f->step));
  ct_optimizer_destroy(tmp);
  f->res->train_loss = ls->seen ? ls->loss_sum / (double)ls->seen : NAN;
  f->res->train_accuracy = ls->seen ? (double)ls->correct / (double)ls->seen : 0;
  f->res->epochs_run++;
  if (s == CT_OK && f->val && !f->res->stopped_by) {
    s = fit_evaluate(f);
  }
  return s;
}

/* A finished epoch: validation, the epoch's schedule step, history and
 * logs, the progress line (pg is ended), keep-best, early stopping and
 * the epoch's checkpoints. *stop: early stopping or max_steps. */
static ct_status end_epoch(fit_run *f, ct_progress *pg, int64_t epoch, double dt, int *stop) {
  const ct_train_config *cfg = f->cfg;
  ct_loop_state *ls = &f->ls;
  char when[64];
  snprintf(when, sizeof when, "after epoch %lld", (long long)epoch + 1);
  ct_status s = check_weights(f, when);
  if (s != CT_OK) {
    ct_progress_free(pg);
    return s;
  }
  double tl = ls->seen ? ls->loss_sum / (double)ls->seen : NAN, ta = ls->seen ? (double)ls->correct / (double)ls->seen : 0;
  if (f->val) {
    s = fit_evaluate(f);
  }
  double lr = ct_optimizer_get_lr(f->opt);
  double mv = monitored(f->monitor, tl, ta, &f->vres, f->have_val);
  if (s == CT_OK && f->sch && !cfg->sched_per_step) {
    if (ct_scheduler_kind(f->sch) == CT_SCHED_PLATEAU) s = ct_scheduler_step_metric(f->sch, f->opt, mv);
    else s = ct_scheduler_step(f->sch, f->opt);
  }
  if (s == CT_OK && log_epoch(f->hist, f->logs_off ? NULL : f->tb, f->logs_off || !f->lead ? NULL : cfg->log_dir, epoch + 1, tl, ta,
                             f->have_val ? &f->vres : NULL, lr, dt) != CT_OK)
    logs_failed(f);
  if (pg) {
    const char *en[] = {"loss", "accuracy", "val_loss", "val_accuracy"};
    double ev[] = {tl, ta, f->vres.loss, f->vres.accuracy};
    ct_status ps = ct_progress_end(pg, en, ev, f->have_val ? 4 : 2);
    if (s == CT_OK) s = ps;
  }
  if (s != CT_OK) return s;
  int improved = f->maximize ? mv > ls->best + cfg->min_delta : mv < ls->best - cfg->min_delta;
  if (improved) {
    ls->best = mv;
    ls->best_epoch = epoch;
    ls->bad_epochs = 0;
    if (f->best_state) s = copy_state(f->m, f->best_state, 1);
  } else {
    ls->bad_epochs++;
  }
  f->res->train_loss = tl;
  f->res->train_accuracy = ta;
  f->res->epochs_run++;
  ls->epoch = epoch + 1;
  ls->loss_sum = 0;
  ls->correct = ls->top5 = ls->seen = 0;
  if (cfg->patience > 0 && ls->bad_epochs >= cfg->patience) {
    *stop = 1;
    f->res->stopped_early = 1;
  }
  if (cfg->checkpoint_dir) {
    ls->batch = 0;
    ct_optimizer *o, *tmp = NULL;
    if (s == CT_OK) s = fit_ckpt_optimizer(f, &o, &tmp);
    if (s == CT_OK && f->lead) s = save_epoch(f->m, o, f->sch, ls, f->hist, cfg, ct_step_scaler(f->step), epoch + 1, improved);
    ct_optimizer_destroy(tmp);
  }
  if (cfg->max_steps && ls->step >= cfg->max_steps) *stop = 1;
  if (s == CT_OK && stop_requested(f, &s)) *stop = 1;
  return s;
}

/* Restores the best weights when asked, fills the result and frees the
 * run; returns s, or the first error of these. */
static ct_status fit_close(fit_run *f, ct_status s) {
  ct_fit_result *res = f->res;
  if (s == CT_OK && res->resumed_from_epoch >= 0 && !res->epochs_run && f->ls.epoch >= f->cfg->epochs) {
    /* A finished run resumed: its own last numbers, never zeros. */
    res->already_done = 1;
    if (ct_history_get(f->hist, f->ls.epoch, "loss", &res->train_loss) != CT_OK) res->train_loss = NAN;
    if (ct_history_get(f->hist, f->ls.epoch, "accuracy", &res->train_accuracy) != CT_OK) res->train_accuracy = NAN;
    if (f->val) {
      s = fit_evaluate(f);
    }
  }
  if (s == CT_OK && f->best_state && f->ls.best_epoch >= 0 && res->epochs_run > 0) {
    s = copy_state(f->m, f->best_state, 0);
    if (f->val) {
      s = fit_evaluate(f);
    }
  }
  res->steps = f->ls.step;
  res->val = f->vres;
  res->images_per_second = f->ls.train_seconds > 0 ? (double)f->ls.train_images / f->ls.train_seconds : 0;
  /* (the low-precision weight copies are in the plan) */
  res->peak_memory_bytes = ct_model_plan_bytes(f->m) + ct_model_state_bytes(f->m);
  res->device_peak_bytes = ct_device_mem_peak(f->dev);
  const ct_grad_scaler *fgs = f->step ? ct_step_scaler(f->step) : &f->gs;
  res->skipped_steps = fgs->skipped_steps + f->guard_skips;
  res->loss_scale = fgs->scale;
  for (size_t i = 0; f->opt && i < ct_optimizer_state_count(f->opt); i++) {
    const char *sn;
    float *d;
    size_t cnt;
    if (ct_optimizer_state(f->opt, i, &sn, &d, &cnt) == CT_OK) res->peak_memory_bytes += cnt * sizeof(float);
  }
  if (f->tb && ct_tb_close(f->tb) != CT_OK) {
    f->tb = NULL;
    logs_failed(f);
  }
  free(f->best_state);
  res->history = f->hist; /* the caller prints or saves it; freed with the result */
  fit_dist_close(f);
  ct_step_destroy(f->step);
  ct_scheduler_destroy(f->sch);
  ct_optimizer_destroy(f->opt);
  return s;
}

ct_status ct_fit(ct_model *m, ct_device *dev, ct_loader *train, ct_loader *val, const ct_train_config *cfg,
                 ct_fit_result *res) {
  memset(res, 0, sizeof *res);
  res->resumed_from_epoch = -1;
  CT_TRY(fit_check(cfg));
  fit_run f = {.m = m, .dev = dev, .train = train, .val = val, .cfg = cfg, .res = res};
  ct_status s = fit_open(&f);
  for (int stop = 0; s == CT_OK && !stop && f.ls.epoch < cfg->epochs; f.ls.batch = 0) {
    int64_t epoch = f.ls.epoch, images = 0;
    ct_progress *pg = NULL;
    s = ct_loader_start_epoch(train, epoch, f.ls.batch);
    if (s == CT_OK && cfg->progress)
      s = ct_progress_begin(cfg->progress, (int)epoch + 1, cfg->epochs, f.batches, cfg->progress_tty, &pg);
    double t0 = now_s();
    if (s == CT_OK) s = train_epoch(&f, pg, t0, &images, &stop);
    if (s == CT_OK) tell_graph(&f, pg, stop);
    double dt = now_s() - t0;
    f.ls.train_seconds += dt;
    f.ls.train_images += images;
    res->epoch_seconds[res->epochs_run] = dt;
    if (s == CT_OK && f.ls.batch >= f.batches) {
      s = end_epoch(&f, pg, epoch, dt, &stop);
      continue;
    }
    ct_progress_free(pg);
    if (s == CT_OK) s = stop_mid_epoch(&f);
    break;
  }
  return fit_close(&f, s);
}
