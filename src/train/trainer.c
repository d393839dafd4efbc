/* fit / evaluate / predict. See include/ctrain/trainer.h for the contract.
 *
 * Exact resume: everything a step depends on is either in the checkpoint
 * (model and optimizer state, scheduler scalars, epoch, position in the
 * epoch, the running sums of the epoch's metrics, early-stopping counters,
 * history) or a pure function of the seed and the step (data order,
 * augmentation and dropout masks come from the counter-based RNG), so a
 * resumed run repeats an uninterrupted one bit for bit on the CPU. */
#include "ctrain/trainer.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctrain/checkpoint.h"
#include "ctrain/history.h"
#include "ctrain/progress.h"
#include "ctrain/tensorboard.h"
#include "backend/backend.h"
#include "data/gpu_data.h"
#include "nn/device_state.h"
#include "nn/model_impl.h"
#include "train/accumulate.h"
#include "train/device_step.h"
#include "train/metrics.h"

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

/* Loaders yield [B, C, H, W]; a vector model (linreg, an mlp from a
 * model file with `input F`) takes [B, F], so hand it a flat view. */
static ct_tensor model_input(const ct_model *m, const ct_tensor *x) {
  ct_tensor v = *x;
  if (ct_model_input_ndim(m) == 1 && x->ndim > 2) {
    int64_t f = 1;
    for (int d = 1; d < x->ndim; d++) f *= x->shape[d];
    v.ndim = 2;
    v.shape[1] = f;
  }
  return v;
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

ct_status ct_evaluate(ct_model *m, ct_device *dev, ct_loader *l, ct_loss_kind loss, float ls, ct_eval_result *res) {
  memset(res, 0, sizeof *res);
  double t0 = now_s(), loss_sum = 0;
  int64_t top1 = 0, top5 = 0, n = 0, k = ct_model_output_size(m);
  CT_TRY(ct_loader_start_epoch(l, 0, 0));
  ct_gpu_data *tmp = NULL;
  ct_status s = CT_OK;
  for (int first = 1; s == CT_OK; first = 0) {
    ct_batch *b;
    s = ct_loader_next(l, &b);
    if (s != CT_OK || !b) break;
    if (first) s = gpu_pass_begin(m, dev, l, b, "evaluation", &tmp);
    const ct_tensor *out;
    double lv = 0;
    if (s == CT_OK && ct_model_step_stats(m)) {
      /* Resident on a device: loss and hits computed there, one read-back;
       * raw or index batches are transformed there first (fit's
       * validation pass runs this same call). */
      s = ct_device_eval_batch(m, dev, b, loss, ls, &out, &lv, &top1, &top5);
      if (s == CT_OK) loss_sum += lv * (double)b->n, n += b->n;
    } else if (s == CT_OK) {
      ct_tensor x = model_input(m, &b->x);
      s = ct_model_forward(m, &x, 0, 0, &out);
      if (s == CT_OK) s = ct_loss_forward(dev, loss, out, &b->y, ls, &lv);
      if (s == CT_OK) {
        loss_sum += lv * (double)b->n;
        ct_batch_correct(out->data, b->y.data, b->n, k, &top1, &top5);
        n += b->n;
      }
    }
    ct_loader_release(l, b);
  }
  gpu_pass_end(l, tmp);
  if (s != CT_OK) return s;
  res->samples = n;
  res->loss = n ? loss_sum / (double)n : NAN;
  res->accuracy = n ? (double)top1 / (double)n : 0;
  res->top5 = n && k >= 5 ? (double)top5 / (double)n : 0;
  res->seconds = now_s() - t0;
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
    const ct_tensor *out;
    int resident = ct_model_step_stats(m) != NULL;
    if (s == CT_OK && resident) {
      /* The batch is staged into the model's block (and transformed there
       * in the GPU data modes): the kernels never read host memory. */
      s = ct_device_forward_batch(m, dev, b, &out);
    } else if (s == CT_OK) {
      ct_tensor x = model_input(m, &b->x);
      s = ct_model_forward(m, &x, 0, 0, &out);
    }
    if (s == CT_OK && b->n * k > cap) {
      float *np = realloc(probs, (size_t)(b->n * k) * sizeof(float));
      if (!np) s = ct_error(CT_ERR_OUT_OF_MEMORY, "predict: out of host memory");
      else probs = np, cap = b->n * k;
    }
    if (s == CT_OK && resident) {
      /* Softmax on the device in place over the output (valid until the
       * next forward), then one copy to the host. */
      ct_tensor o = *out;
      s = ct_device_backend(dev)->softmax_fwd(dev, 0, out, &o);
      if (s == CT_OK) s = ct_device_copy(NULL, probs, dev, o.data, (size_t)(b->n * k) * sizeof(float));
    } else if (s == CT_OK) {
      ct_tensor p = ct_tensor_2d(probs, CT_F32, b->n, k);
      s = ct_device_backend(dev)->softmax_fwd(dev, 0, out, &p);
    }
    /* The labels stay on the host in every loader mode. */
    for (int64_t i = 0; s == CT_OK && i < b->n; i++) s = fn(ctx, idx++, probs + i * k, k, ((int64_t *)b->y.data)[i]);
    ct_loader_release(l, b);
  }
  gpu_pass_end(l, tmp);
  free(probs);
  return s;
}

/* ---- checkpoint metadata ---- */

#define META_MAX 96
typedef struct meta {
  int n;
  char key[META_MAX][64];
  char *val[META_MAX];
  const char *kv[2 * META_MAX + 1];
} meta;

static void meta_set(meta *mt, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void meta_set(meta *mt, const char *key, const char *fmt, ...) {
  if (mt->n == META_MAX) return;
  va_list ap;
  va_start(ap, fmt);
  char *v = NULL;
  if (vasprintf(&v, fmt, ap) < 0) v = NULL;
  va_end(ap);
  snprintf(mt->key[mt->n], sizeof mt->key[0], "%s", key);
  mt->val[mt->n++] = v ? v : strdup("");
}

static const char *const *meta_list(meta *mt) {
  for (int i = 0; i < mt->n; i++) mt->kv[2 * i] = mt->key[i], mt->kv[2 * i + 1] = mt->val[i];
  mt->kv[2 * mt->n] = NULL;
  return mt->kv;
}

static void meta_free(meta *mt) {
  for (int i = 0; i < mt->n; i++) free(mt->val[i]);
  mt->n = 0;
}

/* The loop's own state, all of it saved in checkpoints. */
typedef struct loop_state {
  int64_t epoch, batch, step;
  double loss_sum;
  int64_t correct, top5, seen;
  double best;
  int64_t best_epoch, bad_epochs;
  double train_seconds;
  int64_t train_images;
  /* The current accumulation group's loss sum and samples (for its
   * train/loss_step value). Not checkpointed: a checkpoint never falls
   * inside a group. */
  double group_loss;
  int64_t group_n;
} loop_state;

/* Counts go through doubles when read back: exact up to 2^53. */
#define COUNT_MAX 9007199254740992.0

/* The loop state a checkpoint stores, with the values a save can write:
 * counts are non-negative (best_epoch is -1 before the first), sums and
 * times finite, best may be +-inf (nothing monitored yet) but not NaN. */
static const struct {
  const char *name;
  size_t off;
  int is_int;
  double lo, hi;
} loop_fields[] = {
#define F(x, i, lo, hi) {#x, offsetof(loop_state, x), i, lo, hi}
    F(epoch, 1, 0, COUNT_MAX), F(batch, 1, 0, COUNT_MAX), F(step, 1, 0, COUNT_MAX),
    F(loss_sum, 0, -DBL_MAX, DBL_MAX), F(correct, 1, 0, COUNT_MAX), F(top5, 1, 0, COUNT_MAX),
    F(seen, 1, 0, COUNT_MAX), F(best, 0, -INFINITY, INFINITY), F(best_epoch, 1, -1, COUNT_MAX),
    F(bad_epochs, 1, 0, COUNT_MAX), F(train_seconds, 0, 0, DBL_MAX), F(train_images, 1, 0, COUNT_MAX)
#undef F
};

/* One number of a checkpoint's metadata, as a save writes it: the whole
 * text must parse and lie in [lo, hi] (NaN never does). strtod alone would
 * read "abc" as 0 and "12x" as 12 and resume from a state nobody saved. */
static ct_status meta_number(const char *path, const char *key, const char *v, int integer, double lo, double hi,
                             double *out) {
  char *end = NULL;
  errno = 0;
  double x = integer ? (double)strtoll(v, &end, 10) : strtod(v, &end);
  if (!*v || *end || (integer && errno == ERANGE) || !(x >= lo && x <= hi)) {
    if (integer)
      return ct_error(CT_ERR_PARSE, "%s: metadata '%s' is '%.40s', expected an integer in [%.0f, %.0f]", path, key, v,
                      lo, hi);
    return ct_error(CT_ERR_PARSE, "%s: metadata '%s' is '%.40s', expected a number in [%g, %g]", path, key, v, lo, hi);
  }
  *out = x;
  return CT_OK;
}

/* History as "name,name;epoch,v,v;..." with round-trippable numbers. */
static char *history_text(const ct_history *h) {
  size_t cap = 256, len = 0;
  char *s = malloc(cap);
  if (!s) return NULL;
  s[0] = 0;
#define PUT(...)                                                     \
  do {                                                               \
    int need = snprintf(NULL, 0, __VA_ARGS__);                       \
    while (len + (size_t)need + 1 > cap) {                           \
      char *t = realloc(s, cap *= 2);                                \
      if (!t) { free(s); return NULL; }                              \
      s = t;                                                         \
    }                                                                \
    len += (size_t)snprintf(s + len, cap - len, __VA_ARGS__);        \
  } while (0)
  size_t nc = ct_history_num_columns(h);
  for (size_t c = 0; c < nc; c++) PUT("%s%s", c ? "," : "", ct_history_column_name(h, c));
  for (size_t r = 0; r < ct_history_num_rows(h); r++) {
    int64_t e = ct_history_row_epoch(h, r);
    PUT(";%lld", (long long)e);
    for (size_t c = 0; c < nc; c++) {
      double v = NAN;
      ct_history_get(h, e, ct_history_column_name(h, c), &v);
      PUT(",%.17g", v);
    }
  }
#undef PUT
  return s;
}

/* Reads history_text's format back; a number that does not parse whole,
 * more values than names, or more than 64 names is a corrupt file. */
static ct_status history_restore(ct_history *h, const char *path, const char *text) {
  char *copy = strdup(text ? text : ""), *s1 = NULL, *s2 = NULL;
  if (!copy) return ct_error(CT_ERR_OUT_OF_MEMORY, "resume: out of memory");
  /* The names record runs to the first ';' (empty for an empty history). */
  char *rows = strchr(copy, ';');
  if (rows) *rows++ = 0;
  char *names[64];
  int nn = 0;
  ct_status st = CT_OK;
  for (char *t = strtok_r(copy, ",", &s2); t && st == CT_OK; t = strtok_r(NULL, ",", &s2)) {
    if (nn == 64) st = ct_error(CT_ERR_PARSE, "%s: metadata 'history' has more than 64 metrics", path);
    else names[nn++] = t;
  }
  for (char *rec = rows ? strtok_r(rows, ";", &s1) : NULL; rec && st == CT_OK; rec = strtok_r(NULL, ";", &s1)) {
    char *t = strtok_r(rec, ",", &s2);
    double e = 0;
    st = meta_number(path, "history", t, 1, 0, COUNT_MAX, &e);
    for (int c = 0; st == CT_OK && (t = strtok_r(NULL, ",", &s2)); c++) {
      double v = 0;
      if (c >= nn) {
        st = ct_error(CT_ERR_PARSE, "%s: metadata 'history': epoch %.0f has more values than its %d metric names",
                      path, e, nn);
        break;
      }
      /* nan: a metric without a value at that epoch (history_text). */
      if (!strcmp(t, "nan") || !strcmp(t, "-nan")) continue;
      st = meta_number(path, "history", t, 0, -INFINITY, INFINITY, &v);
      if (st == CT_OK) st = ct_history_add(h, (int64_t)e, names[c], v);
    }
  }
  free(copy);
  return st;
}

static ct_status save_checkpoint(const char *dir, const char *file, ct_model *m, ct_optimizer *o, ct_scheduler *sc,
                                 const loop_state *ls, const ct_history *h, const ct_train_config *cfg,
                                 const ct_grad_scaler *gs) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  meta mt = {0};
  meta_set(&mt, "format", "ctrain-checkpoint-1");
  meta_set(&mt, "model", "%s", ct_model_name(m));
  meta_set(&mt, "config", "%s", cfg->config_id ? cfg->config_id : "");
  meta_set(&mt, "seed", "%llu", (unsigned long long)cfg->seed);
  meta_set(&mt, "accumulate", "%d", cfg->accumulate > 1 ? cfg->accumulate : 1);
  for (size_t i = 0; i < sizeof loop_fields / sizeof loop_fields[0]; i++) {
    char key[64];
    snprintf(key, sizeof key, "loop.%s", loop_fields[i].name);
    const char *p = (const char *)ls + loop_fields[i].off;
    if (loop_fields[i].is_int) meta_set(&mt, key, "%lld", (long long)*(const int64_t *)p);
    else meta_set(&mt, key, "%.17g", *(const double *)p);
  }
  meta_set(&mt, "optim.kind", "%d", (int)ct_optimizer_kind(o));
  meta_set(&mt, "optim.steps", "%lld", (long long)ct_optimizer_steps(o));
  for (size_t i = 0; i < ct_optimizer_scalar_count(o); i++) {
    const char *name;
    double v;
    char key[64];
    if (ct_optimizer_scalar(o, i, &name, &v) != CT_OK) continue;
    snprintf(key, sizeof key, "optim.scalar.%s", name);
    meta_set(&mt, key, "%.17g", v);
  }
  for (size_t i = 0; sc && i < ct_scheduler_state_count(sc); i++) {
    const char *name;
    double v;
    char key[64];
    if (ct_scheduler_state(sc, i, &name, &v) != CT_OK) continue;
    snprintf(key, sizeof key, "sched.%s", name);
    meta_set(&mt, key, "%.17g", v);
  }
  /* The loss scaler: its scale and growth tracker decide the next steps. */
  meta_set(&mt, "scaler.enabled", "%d", gs->enabled);
  meta_set(&mt, "scaler.dynamic", "%d", gs->dynamic);
  meta_set(&mt, "scaler.scale", "%.9g", (double)gs->scale);
  meta_set(&mt, "scaler.growth_tracker", "%lld", (long long)gs->growth_tracker);
  meta_set(&mt, "scaler.skipped_steps", "%lld", (long long)gs->skipped_steps);
  char *ht = history_text(h);
  meta_set(&mt, "history", "%s", ht ? ht : "");
  free(ht);
  ct_status s = ct_checkpoint_save(path, m, o, meta_list(&mt));
  meta_free(&mt);
  return s;
}

/* The value of "key=" (kl bytes, with the '=') in a space-separated
 * key=value text, its length in *vl; NULL when absent. */
static const char *find_setting(const char *text, const char *key, size_t kl, size_t *vl) {
  for (const char *p = text; *p;) {
    size_t tl = strcspn(p, " ");
    if (tl >= kl && !strncmp(p, key, kl)) {
      *vl = tl - kl;
      return p + kl;
    }
    p += tl;
    while (*p == ' ') p++;
  }
  return NULL;
}

/* "key: checkpoint A, this run B" for every key=value setting of run that
 * differs in (or is absent from) ck. */
static void settings_diff(const char *ck, const char *run, char *out, size_t n) {
  out[0] = 0;
  size_t len = 0;
  for (const char *p = run; *p && len + 1 < n;) {
    size_t tl = strcspn(p, " ");
    const char *eq = memchr(p, '=', tl);
    if (eq) {
      size_t kl = (size_t)(eq - p) + 1, rl = tl - kl, cl = 0;
      const char *cv = find_setting(ck, p, kl, &cl);
      if (!cv || cl != rl || strncmp(cv, eq + 1, rl)) {
        len += (size_t)snprintf(out + len, n - len, "%s%.*s: checkpoint %.*s, this run %.*s", len ? "; " : "",
                                (int)(kl - 1), p, cv ? (int)cl : 1, cv ? cv : "?", (int)rl, eq + 1);
        if (len >= n) len = n - 1;
      }
    }
    p += tl;
    while (*p == ' ') p++;
  }
  /* Settings only the checkpoint has (one a run leaves out at its
   * default, such as accumulate). */
  for (const char *p = ck; *p && len + 1 < n;) {
    size_t tl = strcspn(p, " ");
    const char *eq = memchr(p, '=', tl);
    size_t rl = 0;
    if (eq && !find_setting(run, p, (size_t)(eq - p) + 1, &rl)) {
      len += (size_t)snprintf(out + len, n - len, "%s%.*s: checkpoint %.*s, this run default", len ? "; " : "",
                              (int)(eq - p), p, (int)(tl - (size_t)(eq - p) - 1), eq + 1);
      if (len >= n) len = n - 1;
    }
    p += tl;
    while (*p == ' ') p++;
  }
}

/* Opens the checkpoint and refuses it when it was made with other
 * settings; *out stays open for the caller on success. */
static ct_status check_resumable(const char *path, ct_optimizer *o, const ct_train_config *cfg, ct_safetensors **out) {
  ct_safetensors *st;
  *out = NULL;
  CT_TRY(ct_safetensors_open(path, &st));
  ct_status s = CT_OK;
  const char *v = ct_safetensors_metadata(st, "config");
  if (cfg->config_id && v && strcmp(v, cfg->config_id)) {
    char diff[1024];
    settings_diff(v, cfg->config_id, diff, sizeof diff);
    s = ct_error(CT_ERR_INVALID_ARG,
                 "%s: this checkpoint was made with other settings (%s); resume with the same flags or use a new "
                 "--checkpoint-dir",
                 path, diff[0] ? diff : v);
  }
  /* Another accumulation would regroup the epoch's batches and change what
   * a step means (a checkpoint from before accumulation existed has 1). */
  v = ct_safetensors_metadata(st, "accumulate");
  double x = 1;
  if (s == CT_OK && v) s = meta_number(path, "accumulate", v, 1, 1, CT_ACCUMULATE_MAX, &x);
  int ck_acc = (int)x, run_acc = cfg->accumulate > 1 ? cfg->accumulate : 1;
  if (s == CT_OK && ck_acc != run_acc)
    s = ct_error(CT_ERR_INVALID_ARG,
                 "%s: this checkpoint was made with --accumulate %d, this run has --accumulate %d; resume with the "
                 "same value or use a new --checkpoint-dir",
                 path, ck_acc, run_acc);
  v = ct_safetensors_metadata(st, "optim.kind");
  if (s == CT_OK && v) s = meta_number(path, "optim.kind", v, 1, 0, 255, &x);
  if (s == CT_OK && v && (int)x != (int)ct_optimizer_kind(o))
    s = ct_error(CT_ERR_INVALID_ARG, "%s: checkpoint optimizer differs from --optimizer", path);
  if (s != CT_OK) ct_safetensors_close(st);
  else *out = st;
  return s;
}

/* The metadata a checkpoint carries beyond its tensors, read from st. With
 * apply = 0 only checked: the history goes into a scratch one and nothing
 * is changed, so restore_checkpoint can refuse a corrupt file before it
 * loads a tensor. With apply = 1 it goes into the run (the loop state only
 * when all of it reads; a value an optimizer or scheduler setter refuses
 * can still stop it half way). */
static ct_status read_meta(const char *path, ct_safetensors *st, int apply, ct_optimizer *o, ct_scheduler *sc,
                           loop_state *ls, ct_history *h, ct_grad_scaler *gs) {
  ct_status s = CT_OK;
  const char *v;
  double x = 0;
  loop_state got = *ls;
  for (size_t i = 0; s == CT_OK && i < sizeof loop_fields / sizeof loop_fields[0]; i++) {
    char key[64];
    snprintf(key, sizeof key, "loop.%s", loop_fields[i].name);
    v = ct_safetensors_metadata(st, key);
    if (!v) {
      s = ct_error(CT_ERR_PARSE, "%s: metadata '%s' is missing", path, key);
      break;
    }
    s = meta_number(path, key, v, loop_fields[i].is_int, loop_fields[i].lo, loop_fields[i].hi, &x);
    char *p = (char *)&got + loop_fields[i].off;
    if (s == CT_OK && loop_fields[i].is_int) *(int64_t *)p = (int64_t)x;
    else if (s == CT_OK) *(double *)p = x;
  }
  if (s == CT_OK && (v = ct_safetensors_metadata(st, "optim.steps")) &&
      (s = meta_number(path, "optim.steps", v, 1, 0, COUNT_MAX, &x)) == CT_OK && apply)
    s = ct_optimizer_set_steps(o, (int64_t)x);
  for (size_t i = 0; s == CT_OK && i < ct_safetensors_metadata_count(st); i++) {
    const char *k, *val;
    if (ct_safetensors_metadata_at(st, i, &k, &val) != CT_OK) continue;
    int opt = !strncmp(k, "optim.scalar.", 13), sched = sc && !strncmp(k, "sched.", 6);
    if (!opt && !sched) continue;
    /* Each setter checks its own range; a value it refuses is still a
     * fault of the file, not of this run's flags. */
    s = meta_number(path, k, val, 0, -INFINITY, INFINITY, &x);
    if (s == CT_OK && apply) s = opt ? ct_optimizer_set_scalar(o, k + 13, x) : ct_scheduler_set_state(sc, k + 6, x);
    if (s != CT_OK && s != CT_ERR_PARSE && s != CT_ERR_OUT_OF_MEMORY)
      s = ct_error_wrap(CT_ERR_PARSE, "%s: metadata '%s'", path, k);
  }
  ct_history *scratch = NULL;
  if (s == CT_OK && !apply) s = ct_history_create(&scratch);
  if (s == CT_OK) s = history_restore(apply ? h : scratch, path, ct_safetensors_metadata(st, "history"));
  ct_history_free(scratch);
  /* A scaler that was on continues from its state; one that was off (or a
   * checkpoint from before AMP) leaves this run's fresh scaler. */
  v = ct_safetensors_metadata(st, "scaler.enabled");
  double on = 0, scale = 0, tracker = 0, skipped = 0;
  if (s == CT_OK && v) s = meta_number(path, "scaler.enabled", v, 1, 0, 1, &on);
  if (s == CT_OK && gs->enabled && on) {
    const char *sv = ct_safetensors_metadata(st, "scaler.scale");
    const char *tv = ct_safetensors_metadata(st, "scaler.growth_tracker");
    const char *kv = ct_safetensors_metadata(st, "scaler.skipped_steps");
    if (!sv || !tv || !kv) s = ct_error(CT_ERR_PARSE, "%s: loss scaler metadata (scaler.scale, scaler.growth_tracker, scaler.skipped_steps) is incomplete", path);
    /* Any scale a float holds above 0 (--loss-scale takes those, and the
     * dynamic scaler halves without a floor); 0 or inf would zero or
     * overflow every gradient. */
    if (s == CT_OK) s = meta_number(path, "scaler.scale", sv, 0, 0, FLT_MAX, &scale);
    if (s == CT_OK && !((float)scale > 0))
      s = ct_error(CT_ERR_PARSE, "%s: metadata 'scaler.scale' is '%.40s', expected a positive number", path, sv);
    if (s == CT_OK) s = meta_number(path, "scaler.growth_tracker", tv, 1, 0, COUNT_MAX, &tracker);
    if (s == CT_OK) s = meta_number(path, "scaler.skipped_steps", kv, 1, 0, COUNT_MAX, &skipped);
    if (s == CT_OK && apply) {
      gs->scale = (float)scale;
      gs->growth_tracker = (int64_t)tracker;
      gs->skipped_steps = (int64_t)skipped;
    }
  }
  if (s == CT_OK && apply) *ls = got;
  return s;
}

static ct_status restore_checkpoint(const char *dir, ct_model *m, ct_optimizer *o, ct_scheduler *sc, loop_state *ls,
                                    ct_history *h, const ct_train_config *cfg, ct_grad_scaler *gs) {
  char path[4096];
  snprintf(path, sizeof path, "%s/last.safetensors", dir);
  /* Settings and metadata first: a changed optimizer would otherwise
   * surface as missing state tensors, and nothing should be loaded from a
   * refused file. */
  ct_safetensors *st;
  CT_TRY(check_resumable(path, o, cfg, &st));
  ct_status s = read_meta(path, st, 0, o, sc, ls, h, gs);
  ct_safetensors_close(st);
  if (s == CT_OK) s = ct_checkpoint_load(path, m, o, &st);
  if (s != CT_OK) return s == CT_ERR_PARSE ? ct_error_wrap(s, "resuming") : s;
  s = read_meta(path, st, 1, o, sc, ls, h, gs);
  ct_safetensors_close(st);
  /* The messages above name the file already. */
  if (s != CT_OK) return ct_error_wrap(s, "resuming");
  return CT_OK;
}

/* Keeps the newest keep_last epoch checkpoints (epochs epoch-keep_last+1
 * .. epoch). Walks all older numbers, not just the one that just fell out,
 * so a resume with a smaller --keep-last also drops the surplus. */
static void prune(const char *dir, int64_t epoch, int keep_last) {
  if (keep_last <= 0) return;
  for (int64_t e = epoch - keep_last; e >= 1; e--) {
    char path[4096];
    snprintf(path, sizeof path, "%s/epoch-%04lld.safetensors", dir, (long long)e);
    unlink(path);
  }
}

static ct_status ensure_dir(const char *dir) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return ct_error(CT_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return ct_error(CT_ERR_IO, "%s: not a directory", dir);
  return CT_OK;
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
static void count_batch(loop_state *ls, double lv, int64_t n, int64_t top1, int64_t top5, int64_t *images) {
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

/* The host's bookkeeping of one step resident on a device, run when its
 * statistics arrive (one step after it was queued with the lagged
 * read-back): the same sums, checks, logs and progress as the host path,
 * for the step r.step. The batch is released here, not at queue time: the
 * device may still be copying from it until then. */
static ct_status device_result(ct_loader *train, const ct_step_result *r, loop_state *ls, const ct_grad_scaler *gs,
                               const ct_optimizer *opt, const ct_train_config *cfg, ct_tb_writer *tb, ct_progress *pg,
                               const char *const *names, double t0, int64_t *images) {
  int64_t pos = r->batch->index + 1;
  ct_loader_release(train, r->batch);
  double lv = r->loss;
  if (!isfinite(lv) && !gs->enabled)
    return ct_error(CT_ERR_INVALID_ARG, "fit: the loss became %g at step %lld; lower --lr or use gradient clipping", lv,
                    (long long)r->step);
  /* A per-step schedule was stepped by the device trainer when this
   * result arrived (if the step was taken), so the LR logged is the one
   * after it, as on the host path. */
  ct_status s = CT_OK;
  count_batch(ls, lv, r->n, r->top1, r->top5, images);
  if (tb && !r->micro) {
    double gl = cfg->accumulate > 1 ? ls->group_loss / (double)ls->group_n : lv;
    ct_tb_scalar(tb, "train/loss_step", r->step + 1, gl);
    ct_tb_scalar(tb, "train/lr", r->step + 1, ct_optimizer_get_lr(opt));
  }
  if (!r->micro) ls->group_loss = 0, ls->group_n = 0;
  if (s == CT_OK && pg) {
    double vals[2] = {ls->loss_sum / (double)ls->seen, (double)ls->correct / (double)ls->seen};
    double el = now_s() - t0;
    s = ct_progress_update(pg, pos, names, vals, 2, el > 0 ? (double)*images / el : 0);
  }
  return s;
}

ct_status ct_fit(ct_model *m, ct_device *dev, ct_loader *train, ct_loader *val, const ct_train_config *cfg,
                 ct_fit_result *res) {
  memset(res, 0, sizeof *res);
  res->resumed_from_epoch = -1;
  if (cfg->epochs <= 0) return ct_error(CT_ERR_INVALID_ARG, "fit: epochs must be positive");
  if (cfg->loss == CT_LOSS_MSE) return ct_error(CT_ERR_UNSUPPORTED, "fit: the trainer trains classifiers (cross_entropy or nll)");
  if (cfg->monitor && strcmp(cfg->monitor, "loss") && strcmp(cfg->monitor, "accuracy") &&
      strcmp(cfg->monitor, "val_loss") && strcmp(cfg->monitor, "val_accuracy"))
    return ct_error(CT_ERR_INVALID_ARG, "fit: monitor '%s' is not one of loss, accuracy, val_loss, val_accuracy", cfg->monitor);
  if (cfg->accumulate < 0 || cfg->accumulate > CT_ACCUMULATE_MAX)
    return ct_error(CT_ERR_INVALID_ARG, "fit: accumulate must be in [0, %d] (0 or 1 = off), got %d", CT_ACCUMULATE_MAX,
                    cfg->accumulate);
  const int acc = cfg->accumulate > 1 ? cfg->accumulate : 1;
  size_t np;
  float *params = ct_model_params(m, &np), *grads = ct_model_grads(m, NULL);
  int64_t k = ct_model_output_size(m);
  ct_optimizer *opt = NULL;
  ct_scheduler *sch = NULL;
  ct_history *hist = NULL;
  ct_tb_writer *tb = NULL;
  float *best_state = NULL;
  size_t nb = 0;
  ct_status s = ct_optimizer_create(&cfg->optim, np, &opt);
  if (s == CT_OK && cfg->use_scheduler) s = ct_scheduler_create(&cfg->sched, opt, &sch);
  if (s == CT_OK) s = ct_history_create(&hist);
  const char *monitor = cfg->monitor ? cfg->monitor : "val_loss";
  int maximize = cfg->monitor_max || strstr(monitor, "accuracy") != NULL;
  loop_state ls = {0};
  ct_grad_scaler gs = cfg->scaler;
  if (!gs.enabled) ct_grad_scaler_init(&gs, 0, 0, 1.0);
  ls.best = maximize ? -INFINITY : INFINITY;
  ls.best_epoch = -1;
  if (s == CT_OK && cfg->checkpoint_dir) s = ensure_dir(cfg->checkpoint_dir);
  if (s == CT_OK && cfg->resume) {
    if (!cfg->checkpoint_dir) s = ct_error(CT_ERR_INVALID_ARG, "fit: resume needs a checkpoint directory");
    else s = restore_checkpoint(cfg->checkpoint_dir, m, opt, sch, &ls, hist, cfg, &gs);
    if (s == CT_OK) res->resumed_from_epoch = (int)ls.epoch;
  }
  /* A model resident on a device trains there: the optimizer state moves
   * into its block after any restore loaded it on the host. */
  int on_device = ct_model_step_stats(m) != NULL;
  if (s == CT_OK && on_device) s = ct_device_train_begin(m, dev, opt, &gs);
  ct_device_trainer *pipe = NULL;
  if (s == CT_OK && cfg->cuda_graph && !on_device)
    s = ct_error(CT_ERR_INVALID_ARG, "fit: --cuda-graph needs a model resident on a CUDA device (--device cuda), not %s",
                 ct_device_name(dev));
  if (s == CT_OK && on_device) {
    /* The read-back runs one step behind (the host never waits for the
     * GPU inside an epoch); the graph, when asked for, after two eager
     * warm-up steps. */
    ct_device_train_opts dto = {1, cfg->cuda_graph, 0};
    s = ct_device_trainer_create(m, dev, opt, &gs, cfg->loss, cfg->label_smoothing, cfg->clip_grad_norm,
                                 cfg->sched_per_step ? sch : NULL, &dto, &pipe);
    if (s == CT_OK) ct_device_trainer_set_accumulate(pipe, acc);
  }
  if (s == CT_OK && cfg->log_dir) s = ensure_dir(cfg->log_dir);
  if (s == CT_OK && cfg->log_dir) s = ct_tb_open(cfg->log_dir, &tb);
  if (s == CT_OK && tb && cfg->settings_text) s = ct_tb_text(tb, "settings", ls.step, cfg->settings_text);
  if (s == CT_OK && cfg->restore_best) {
    /* A host copy of parameters and buffers at the best epoch. */
    for (int i = 0; i < ct_model_state_count(m); i++) nb += ct_tensor_nbytes(&ct_model_state(m, i)->value);
    best_state = malloc(nb ? nb : 1);
    if (!best_state) s = ct_error(CT_ERR_OUT_OF_MEMORY, "fit: cannot keep a copy of the best weights (%zu bytes)", nb);
  }
  res->epoch_seconds = calloc((size_t)cfg->epochs + 1, sizeof(double));
  if (s == CT_OK && !res->epoch_seconds) s = ct_error(CT_ERR_OUT_OF_MEMORY, "fit: out of host memory");
  int64_t batches = ct_loader_batches_per_epoch(train), batch_size = ct_loader_get_options(train)->batch_size;
  if (s == CT_OK && ls.batch % acc != 0 && ls.batch < batches)
    s = ct_error(CT_ERR_INVALID_ARG, "fit: the checkpoint stopped at batch %lld, inside a group of --accumulate %d",
                 (long long)ls.batch, acc);
  int stop = 0, graph_told = 0;
  ct_eval_result vres = {0};
  int have_val = 0;
  const char *names[2] = {"loss", "accuracy"};
  for (; s == CT_OK && !stop && ls.epoch < cfg->epochs; ls.batch = 0) {
    int64_t epoch = ls.epoch;
    ct_progress *pg = NULL;
    s = ct_loader_start_epoch(train, epoch, ls.batch);
    if (s == CT_OK && cfg->progress) s = ct_progress_begin(cfg->progress, (int)epoch + 1, cfg->epochs, batches, cfg->progress_tty, &pg);
    double t0 = now_s();
    int64_t images = 0;
    while (s == CT_OK) {
      ct_batch *b;
      s = ct_loader_next(train, &b);
      if (s != CT_OK || !b) break;
      double lv = 0;
      int64_t hit1 = 0, hit5 = 0; /* this batch's top-1 / top-5 hits */
      int found_inf = 0;
      /* The micro-batch's place in its accumulation group (one group of
       * one, factor exactly 1, without accumulation). */
      ct_accum_pos ap = ct_accum_position(acc, b->index, b->n, batches, b->order_n, batch_size);
      uint32_t key = (uint32_t)(ls.step * acc + ap.index);
      if (on_device) {
        /* Unscale, check, clip, update and the scaler's decision in fused
         * device passes; the statistics of the step queued before this one
         * arrive here (device_result), so losses, accuracy, logs and
         * progress run one step behind the queue. */
        ct_step_result r;
        int have = 0;
        ls.batch = b->index + 1;
        ct_micro_step ms = {ls.step, key, ap.first, ap.last, (float)ap.factor};
        s = ct_device_trainer_step_micro(pipe, b, &ms, &r, &have);
        if (s != CT_OK) break;
        if (ap.last) ls.step++;
        if (have) s = device_result(train, &r, &ls, &gs, opt, cfg, tb, pg, names, t0, &images);
        if (s != CT_OK) break;
        if (ap.last && cfg->max_steps && ls.step >= cfg->max_steps) {
          stop = 1;
          break;
        }
        continue;
      } else {
      const ct_tensor *out;
      ct_tensor dout;
      ct_tensor x = model_input(m, &b->x);
      s = ct_model_forward(m, &x, 1, key, &out);
      if (s == CT_OK) s = ct_loss_forward(dev, cfg->loss, out, &b->y, cfg->label_smoothing, &lv);
      if (s == CT_OK) {
        ct_batch_correct(out->data, b->y.data, b->n, k, &hit1, &hit5);
        s = ct_model_output_grad(m, &dout);
      }
      /* A group's first backward writes every gradient with beta 0, as the
       * device step's does: no zero fill (AlexNet: 244 MB, 10-14 ms of a
       * CPU step). */
      if (s == CT_OK && ap.first) ct_model_overwrite_grads(m);
      /* The group's share rides on the loss gradient (with the scale, the
       * same for the whole group): the backward adds into the gradients
       * after the group's first micro-batch. factor is exactly 1 without
       * accumulation, so that path multiplies by the scale alone. */
      float gscale = ap.factor == 1.0 ? gs.scale : (float)((double)gs.scale * ap.factor);
      if (s == CT_OK) s = ct_loss_backward(dev, cfg->loss, out, &b->y, cfg->label_smoothing, gscale, &dout);
      if (s == CT_OK) s = ct_model_backward(m, &dout);
      if (s == CT_OK && !ap.last) {
        /* Not the group's end: no optimizer step yet. */
        int64_t n = b->n;
        ls.batch = b->index + 1;
        ct_loader_release(train, b);
        if (!isfinite(lv) && !gs.enabled) {
          s = ct_error(CT_ERR_INVALID_ARG, "fit: the loss became %g at step %lld; lower --lr or use gradient clipping",
                       lv, (long long)ls.step);
          break;
        }
        count_batch(&ls, lv, n, hit1, hit5, &images);
        if (pg) {
          double vals[2] = {ls.loss_sum / (double)ls.seen, (double)ls.correct / (double)ls.seen};
          double el = now_s() - t0;
          s = ct_progress_update(pg, ls.batch, names, vals, 2, el > 0 ? (double)images / el : 0);
        }
        continue;
      }
      /* GradScaler's order: unscale (and check) before clipping; a step
       * with inf/NaN gradients moves neither the weights nor the schedule. */
      if (s == CT_OK) s = ct_grad_scaler_unscale(&gs, dev, grads, np, &found_inf);
      if (s == CT_OK && !found_inf && cfg->clip_grad_norm > 0) ct_clip_grad_norm(grads, np, cfg->clip_grad_norm);
      if (s == CT_OK && !found_inf) s = ct_optimizer_step(opt, params, grads);
      if (s == CT_OK && !found_inf && sch && cfg->sched_per_step) s = ct_scheduler_step(sch, opt);
      if (s == CT_OK && !found_inf) s = ct_model_round_params(m);
      if (s == CT_OK) ct_grad_scaler_update(&gs, found_inf);
      }
      int64_t n = b->n;
      ls.batch = b->index + 1;
      ct_loader_release(train, b);
      if (s != CT_OK) break;
      if (!isfinite(lv) && !gs.enabled) {
        s = ct_error(CT_ERR_INVALID_ARG, "fit: the loss became %g at step %lld; lower --lr or use gradient clipping", lv,
                     (long long)ls.step);
        break;
      }
      ls.step++;
      count_batch(&ls, lv, n, hit1, hit5, &images);
      if (tb) {
        ct_tb_scalar(tb, "train/loss_step", ls.step, acc > 1 ? ls.group_loss / (double)ls.group_n : lv);
        ct_tb_scalar(tb, "train/lr", ls.step, ct_optimizer_get_lr(opt));
      }
      ls.group_loss = 0, ls.group_n = 0;
      if (pg) {
        double vals[2] = {ls.loss_sum / (double)ls.seen, (double)ls.correct / (double)ls.seen};
        double el = now_s() - t0;
        s = ct_progress_update(pg, ls.batch, names, vals, 2, el > 0 ? (double)images / el : 0);
      }
      if (cfg->max_steps && ls.step >= cfg->max_steps) {
        stop = 1;
        break;
      }
    }
    /* The steps still in flight finish the epoch's numbers. */
    for (int have = 1; s == CT_OK && pipe && have;) {
      ct_step_result r;
      s = ct_device_trainer_drain(pipe, &r, &have);
      if (s == CT_OK && have)
        s = device_result(train, &r, &ls, &gs, opt, cfg, tb, pg, names, t0, &images);
    }
    /* Once, at the end of the first epoch where it is decided: a graph,
     * or a reason for none. Until the warm-up steps have run neither
     * exists (an epoch of two batches is all warm-up), so the line waits;
     * the last epoch prints it whatever it is. */
    if (s == CT_OK && pipe && cfg->progress && cfg->cuda_graph && !graph_told) {
      const char *note = NULL;
      int on = ct_device_trainer_graph_on(pipe, &note);
      if (on || note || stop || ls.epoch + 1 >= cfg->epochs) {
        fprintf(cfg->progress, "cuda graph: %s%s\n", on ? "on" : "off: ", on ? "" : note ? note : "not captured");
        graph_told = 1;
      }
    }
    double dt = now_s() - t0;
    ls.train_seconds += dt;
    ls.train_images += images;
    res->epoch_seconds[res->epochs_run] = dt;
    if (s != CT_OK) {
      if (pg) ct_progress_free(pg);
      break;
    }
    int finished_epoch = ls.batch >= batches;
    if (!finished_epoch) {
      /* Stopped by max_steps mid-epoch: checkpoint the position and report. */
      if (pg) ct_progress_free(pg);
      if (cfg->checkpoint_dir) s = save_checkpoint(cfg->checkpoint_dir, "last.safetensors", m, opt, sch, &ls, hist, cfg, &gs);
      res->train_loss = ls.seen ? ls.loss_sum / (double)ls.seen : NAN;
      res->train_accuracy = ls.seen ? (double)ls.correct / (double)ls.seen : 0;
      res->epochs_run++;
      if (s == CT_OK && val) {
        s = ct_evaluate(m, dev, val, cfg->loss, cfg->label_smoothing, &vres);
        have_val = s == CT_OK;
      }
      break;
    }
    double tl = ls.seen ? ls.loss_sum / (double)ls.seen : NAN, ta = ls.seen ? (double)ls.correct / (double)ls.seen : 0;
    if (val) {
      s = ct_evaluate(m, dev, val, cfg->loss, cfg->label_smoothing, &vres);
      have_val = s == CT_OK;
    }
    double lr = ct_optimizer_get_lr(opt);
    double mv = monitored(monitor, tl, ta, &vres, have_val);
    if (s == CT_OK && sch && !cfg->sched_per_step) {
      if (ct_scheduler_kind(sch) == CT_SCHED_PLATEAU) s = ct_scheduler_step_metric(sch, opt, mv);
      else s = ct_scheduler_step(sch, opt);
    }
    if (s == CT_OK) {
      const char *hn[] = {"loss", "accuracy", "val_loss", "val_accuracy", "lr", "seconds"};
      double hv[] = {tl, ta, have_val ? vres.loss : NAN, have_val ? vres.accuracy : NAN, lr, dt};
      s = ct_history_add_row(hist, epoch + 1, hn, hv, have_val ? 6 : 2);
      if (s == CT_OK && !have_val) {
        s = ct_history_add(hist, epoch + 1, "lr", lr);
        if (s == CT_OK) s = ct_history_add(hist, epoch + 1, "seconds", dt);
      }
    }
    if (s == CT_OK && cfg->log_dir) {
      char path[4096];
      snprintf(path, sizeof path, "%s/history.csv", cfg->log_dir);
      s = ct_history_write_csv(hist, path);
      snprintf(path, sizeof path, "%s/history.json", cfg->log_dir);
      if (s == CT_OK) s = ct_history_write_json(hist, path);
    }
    if (s == CT_OK && tb) {
      ct_tb_scalar(tb, "epoch/loss", epoch + 1, tl);
      ct_tb_scalar(tb, "epoch/accuracy", epoch + 1, ta);
      ct_tb_scalar(tb, "epoch/lr", epoch + 1, lr);
      if (have_val) {
        ct_tb_scalar(tb, "epoch/val_loss", epoch + 1, vres.loss);
        ct_tb_scalar(tb, "epoch/val_accuracy", epoch + 1, vres.accuracy);
      }
      s = ct_tb_flush(tb);
    }
    if (pg) {
      const char *en[] = {"loss", "accuracy", "val_loss", "val_accuracy"};
      double ev[] = {tl, ta, vres.loss, vres.accuracy};
      ct_status ps = ct_progress_end(pg, en, ev, have_val ? 4 : 2);
      if (s == CT_OK) s = ps;
    }
    if (s != CT_OK) break;
    /* Keep-best, early stopping. */
    int improved = maximize ? mv > ls.best + cfg->min_delta : mv < ls.best - cfg->min_delta;
    if (improved) {
      ls.best = mv;
      ls.best_epoch = epoch;
      ls.bad_epochs = 0;
      if (best_state) {
        char *p = (char *)best_state;
        for (int i = 0; i < ct_model_state_count(m); i++) {
          const ct_tensor *t = &ct_model_state(m, i)->value;
          if (s == CT_OK) s = ct_device_copy(NULL, p, t->device, t->data, ct_tensor_nbytes(t));
          p += ct_tensor_nbytes(t);
        }
      }
    } else {
      ls.bad_epochs++;
    }
    res->train_loss = tl;
    res->train_accuracy = ta;
    res->epochs_run++;
    ls.epoch = epoch + 1;
    ls.loss_sum = 0;
    ls.correct = ls.top5 = ls.seen = 0;
    if (cfg->patience > 0 && ls.bad_epochs >= cfg->patience) {
      stop = 1;
      res->stopped_early = 1;
    }
    if (cfg->checkpoint_dir) {
      ls.batch = 0;
      char file[64];
      snprintf(file, sizeof file, "epoch-%04lld.safetensors", (long long)epoch + 1);
      s = save_checkpoint(cfg->checkpoint_dir, file, m, opt, sch, &ls, hist, cfg, &gs);
      if (s == CT_OK) s = save_checkpoint(cfg->checkpoint_dir, "last.safetensors", m, opt, sch, &ls, hist, cfg, &gs);
      if (s == CT_OK && improved) s = save_checkpoint(cfg->checkpoint_dir, "best.safetensors", m, opt, sch, &ls, hist, cfg, &gs);
      if (s == CT_OK) prune(cfg->checkpoint_dir, epoch + 1, cfg->keep_last);
    }
    if (cfg->max_steps && ls.step >= cfg->max_steps) stop = 1;
  }
  if (s == CT_OK && best_state && ls.best_epoch >= 0 && res->epochs_run > 0) {
    const char *p = (const char *)best_state;
    for (int i = 0; i < ct_model_state_count(m); i++) {
      const ct_tensor *t = &ct_model_state(m, i)->value;
      if (s == CT_OK) s = ct_device_copy(t->device, t->data, NULL, p, ct_tensor_nbytes(t));
      p += ct_tensor_nbytes(t);
    }
    if (val) {
      s = ct_evaluate(m, dev, val, cfg->loss, cfg->label_smoothing, &vres);
      have_val = s == CT_OK;
    }
  }
  res->steps = ls.step;
  res->val = vres;
  res->images_per_second = ls.train_seconds > 0 ? (double)ls.train_images / ls.train_seconds : 0;
  /* (the low-precision weight copies are in the plan) */
  res->peak_memory_bytes = ct_model_plan_bytes(m) + ct_model_state_bytes(m);
  res->device_peak_bytes = ct_device_mem_peak(dev);
  res->skipped_steps = gs.skipped_steps;
  res->loss_scale = gs.scale;
  for (size_t i = 0; opt && i < ct_optimizer_state_count(opt); i++) {
    const char *sn;
    float *d;
    size_t cnt;
    if (ct_optimizer_state(opt, i, &sn, &d, &cnt) == CT_OK) res->peak_memory_bytes += cnt * sizeof(float);
  }
  if (tb) {
    ct_status ts = ct_tb_close(tb);
    if (s == CT_OK) s = ts;
  }
  free(best_state);
  res->history = hist; /* the caller prints or saves it; freed with the result */
  ct_device_trainer_destroy(pipe);
  ct_scheduler_destroy(sch);
  ct_optimizer_destroy(opt);
  return s;
}
