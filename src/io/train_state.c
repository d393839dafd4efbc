/* Checkpoint metadata of the training loop (see train_state.h). */
#include "io/train_state.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctrain/checkpoint.h"
#include "ctrain/safetensors.h"


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
#define F(x, i, lo, hi) {#x, offsetof(ct_loop_state, x), i, lo, hi}
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
  long long ll = integer ? strtoll(v, &end, 10) : 0;
  double x = integer ? (double)ll : strtod(v, &end);
  /* An integer is checked as one: 2^53 + 1 would round into range. */
  int out_of_range = integer ? errno == ERANGE || ll < (long long)lo || ll > (long long)hi : !(x >= lo && x <= hi);
  if (!*v || *end || out_of_range) {
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

ct_status ct_train_state_save(const char *dir, const char *file, ct_model *m, ct_optimizer *o, ct_scheduler *sc,
                                 const ct_loop_state *ls, const ct_history *h, const ct_train_config *cfg,
                                 const ct_grad_scaler *gs) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  meta mt = {0};
  meta_set(&mt, "format", "ctrain-checkpoint-1");
  meta_set(&mt, "model", "%s", ct_model_name(m));
  meta_set(&mt, "config", "%s", cfg->config_id ? cfg->config_id : "");
  meta_set(&mt, "seed", "%llu", (unsigned long long)cfg->seed);
  meta_set(&mt, "accumulate", "%d", cfg->accumulate > 1 ? cfg->accumulate : 1);
  meta_set(&mt, "world_size", "%d", ct_comm_size(cfg->dist.comm));
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

/* The loop counters against each other: each in range is not enough (a
 * loop.correct above loop.seen put an accuracy of 390 into the history). */
static ct_status check_loop(const char *path, const ct_loop_state *l) {
#define REFUSE(...) return ct_error(CT_ERR_PARSE, __VA_ARGS__)
  if (l->correct > l->seen || l->top5 > l->seen)
    REFUSE("%s: metadata 'loop.correct' %lld / 'loop.top5' %lld exceed the samples seen, 'loop.seen' %lld", path,
           (long long)l->correct, (long long)l->top5, (long long)l->seen);
  if (l->top5 < l->correct)
    REFUSE("%s: metadata 'loop.top5' %lld is below 'loop.correct' %lld", path, (long long)l->top5, (long long)l->correct);
  if (!l->seen && l->loss_sum != 0)
    REFUSE("%s: metadata 'loop.loss_sum' is %g with no samples seen", path, l->loss_sum);
  if (l->best_epoch >= l->epoch)
    REFUSE("%s: metadata 'loop.best_epoch' %lld is not before 'loop.epoch' %lld", path, (long long)l->best_epoch,
           (long long)l->epoch);
  if (l->bad_epochs > l->epoch)
    REFUSE("%s: metadata 'loop.bad_epochs' %lld exceeds 'loop.epoch' %lld", path, (long long)l->bad_epochs,
           (long long)l->epoch);
  if (l->seen > l->train_images)
    REFUSE("%s: metadata 'loop.seen' %lld exceeds the images trained on, 'loop.train_images' %lld", path,
           (long long)l->seen, (long long)l->train_images);
  if (l->batch > l->train_images)
    REFUSE("%s: metadata 'loop.batch' %lld exceeds 'loop.train_images' %lld", path, (long long)l->batch,
           (long long)l->train_images);
#undef REFUSE
  return CT_OK;
}

/* The settings text without its accumulate= and world_size= words:
 * those two may change together (check_resumable). */
static void without_batching(const char *in, char *out, size_t n) {
  size_t len = 0;
  for (const char *p = in; *p && len + 1 < n;) {
    size_t tl = strcspn(p, " ");
    if (strncmp(p, "accumulate=", 11) && strncmp(p, "world_size=", 11)) {
      len += (size_t)snprintf(out + len, n - len, "%s%.*s", len ? " " : "", (int)tl, p);
      if (len >= n) len = n - 1;
    }
    p += tl;
    while (*p == ' ') p++;
  }
  out[len] = 0;
}

/* Opens the checkpoint and refuses it when it was made with other
 * settings; *out stays open for the caller on success. */
static ct_status check_resumable(const char *path, ct_optimizer *o, const ct_train_config *cfg, ct_safetensors **out) {
  ct_safetensors *st;
  *out = NULL;
  CT_TRY(ct_safetensors_open(path, &st));
  ct_status s = CT_OK;
  const char *v = ct_safetensors_metadata(st, "config");
  char ck_text[2048], run_text[2048];
  if (v) without_batching(v, ck_text, sizeof ck_text);
  if (cfg->config_id) without_batching(cfg->config_id, run_text, sizeof run_text);
  if (cfg->config_id && v && strcmp(ck_text, run_text)) {
    char diff[1024];
    settings_diff(v, cfg->config_id, diff, sizeof diff);
    s = ct_error(CT_ERR_INVALID_ARG,
                 "%s: this checkpoint was made with other settings (%s); resume with the same flags or use a new "
                 "--checkpoint-dir",
                 path, diff[0] ? diff : v);
  }
  /* Another accumulation would regroup the epoch's batches and change what
   * a step means (a checkpoint from before accumulation existed has 1),
   * unless the world size changes with it so that a step still sees the
   * same global batch: 2 ranks x 1 = 1 rank x 2. */
  v = ct_safetensors_metadata(st, "accumulate");
  double x = 1, w = 1;
  if (s == CT_OK && v) s = meta_number(path, "accumulate", v, 1, 1, CT_ACCUMULATE_MAX, &x);
  v = ct_safetensors_metadata(st, "world_size");
  if (s == CT_OK && v) s = meta_number(path, "world_size", v, 1, 1, 1 << 20, &w);
  int ck_acc = (int)x, run_acc = cfg->accumulate > 1 ? cfg->accumulate : 1;
  int ck_world = (int)w, run_world = ct_comm_size(cfg->dist.comm);
  if (s == CT_OK && ck_world == run_world && ck_acc != run_acc)
    s = ct_error(CT_ERR_INVALID_ARG,
                 "%s: this checkpoint was made with --accumulate %d, this run has --accumulate %d; resume with the "
                 "same value or use a new --checkpoint-dir",
                 path, ck_acc, run_acc);
  if (s == CT_OK && ck_world != run_world && (int64_t)ck_acc * ck_world != (int64_t)run_acc * run_world)
    s = ct_error(CT_ERR_INVALID_ARG,
                 "%s: this checkpoint was made by %d rank(s) with --accumulate %d (%d batches a step), this run has "
                 "%d rank(s) with --accumulate %d (%d); ranks x accumulate must stay the same for the global batch",
                 path, ck_world, ck_acc, ck_world * ck_acc, run_world, run_acc, run_world * run_acc);
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
                           ct_loop_state *ls, ct_history *h, ct_grad_scaler *gs) {
  ct_status s = CT_OK;
  const char *v;
  double x = 0;
  ct_loop_state got = *ls;
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
  got.world = 1;
  if (s == CT_OK && (v = ct_safetensors_metadata(st, "world_size")) &&
      (s = meta_number(path, "world_size", v, 1, 1, 1 << 20, &x)) == CT_OK)
    got.world = (int64_t)x;
  if (s == CT_OK) s = check_loop(path, &got);
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

ct_status ct_train_state_restore(const char *dir, ct_model *m, ct_optimizer *o, ct_scheduler *sc, ct_loop_state *ls,
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

/* Walks all older numbers, not just the one that just fell out, so a
 * resume with a smaller --keep-last also drops the surplus. */
void ct_train_state_prune(const char *dir, int64_t epoch, int keep_last) {
  if (keep_last <= 0) return;
  for (int64_t e = epoch - keep_last; e >= 1; e--) {
    char path[4096];
    snprintf(path, sizeof path, "%s/epoch-%04lld.safetensors", dir, (long long)e);
    unlink(path);
  }
}

ct_status ct_ensure_dir(const char *dir) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return ct_error(CT_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return ct_error(CT_ERR_IO, "%s: not a directory", dir);
  return CT_OK;
}

