/* Flag parsing shared by the subcommands: --name VALUE or --name=VALUE;
 * unknown flags, missing values and malformed numbers are usage errors. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

int cli_exit_code(ct_status s) {
  switch (s) {
    case CT_OK: return CLI_EXIT_OK;
    case CT_ERR_INVALID_ARG: return CLI_EXIT_USAGE;
    case CT_ERR_IO:
    case CT_ERR_NOT_FOUND: return CLI_EXIT_IO;
    case CT_ERR_PARSE: return CLI_EXIT_BAD_INPUT;
    case CT_ERR_OUT_OF_MEMORY: return CLI_EXIT_NO_MEMORY;
    case CT_ERR_NO_DEVICE:
    case CT_ERR_UNSUPPORTED: return CLI_EXIT_NO_DEVICE;
    case CT_ERR_SHAPE: return CLI_EXIT_SHAPE;
    default: return CLI_EXIT_ERROR;
  }
}

int cli_fail(ct_status s) {
  fprintf(stderr, "ctrain: error: %s\n", ct_last_error()[0] ? ct_last_error() : ct_status_name(s));
  return cli_exit_code(s);
}

static int usage_err(const char *cmd, const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "ctrain %s: ", cmd);
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, " (see 'ctrain %s --help')\n", cmd);
  return CLI_EXIT_USAGE;
}

static int parse_i64(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (!*v || *end || errno || x < lo || x > hi) {
    char msg[160];
    snprintf(msg, sizeof msg, "--%s expects an integer in [%lld, %lld], got '%%s'%%s", flag, (long long)lo, (long long)hi);
    return usage_err(cmd, msg, v, "");
  }
  *out = x;
  return 0;
}

static int parse_f64(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (!*v || *end || errno || !(x >= lo && x <= hi)) {
    char msg[160];
    snprintf(msg, sizeof msg, "--%s expects a number in [%g, %g], got '%%s'%%s", flag, lo, hi);
    return usage_err(cmd, msg, v, "");
  }
  *out = x;
  return 0;
}

static int parse_shape(const char *cmd, const char *v, cli_opts *o) {
  int c = 0, h = 0, w = 0;
  char tail;
  if (sscanf(v, "%dx%dx%d%c", &c, &h, &w, &tail) == 3 && c > 0 && h > 0 && w > 0 && c <= 4096 && h <= 16384 && w <= 16384) {
    o->in_c = c, o->in_h = h, o->in_w = w;
    return 0;
  }
  if (sscanf(v, "%d%c", &c, &tail) == 1 && c > 0 && c <= 1 << 24) {
    o->in_c = c, o->in_h = o->in_w = 0;
    return 0;
  }
  return usage_err(cmd, "--input expects CxHxW (e.g. 3x227x227) or F, got '%s'%s", v, "");
}

/* Whether w is one of list's space-separated words. An empty w (from
 * `--` or `--=x`) would match at every position without advancing. */
static int has_word(const char *list, const char *w) {
  size_t n = strlen(w);
  if (n == 0 || strchr(w, ' ')) return 0;
  for (const char *p = list; (p = strstr(p, w)); p += n)
    if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return 1;
  return 0;
}

int cli_parse(int argc, char **argv, const char *cmd, const char *allowed, cli_opts *o) {
  memset(o, 0, sizeof *o);
  o->device = "cpu";
  o->recompute = CLI_RECOMPUTE_DEFAULT;
  o->epochs = 1;
  o->batch_size = 64;
  o->optimizer = "sgd";
  o->scheduler = "none";
  o->augment = "none";
  o->loss = "cross_entropy";
  o->workers = 1;
  o->keep_last = 3;
  o->top = 3;
  o->monitor = "val_loss";
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2) != 0)
      return usage_err(cmd, "unexpected argument '%s'%s", a, "");
    char name[64];
    const char *val = NULL;
    const char *eq = strchr(a + 2, '=');
    size_t n = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
    if (n >= sizeof name) return usage_err(cmd, "unknown flag '%s'%s", a, "");
    memcpy(name, a + 2, n);
    name[n] = 0;
    if (!has_word(allowed, name)) return usage_err(cmd, "unknown flag '--%s'%s", name, "");
    static const char *booleans = "resume no-shuffle restore-best channels-last memory";
    if (has_word(booleans, name)) {
      if (eq) return usage_err(cmd, "--%s takes no value%s", name, "");
      if (!strcmp(name, "resume")) o->resume = 1;
      else if (!strcmp(name, "no-shuffle")) o->no_shuffle = 1;
      else if (!strcmp(name, "channels-last")) o->memory_format = "channels-last";
      else if (!strcmp(name, "memory")) o->memory_report = 1;
      else o->restore_best = 1;
      continue;
    }
    if (eq) val = eq + 1;
    else if (!strcmp(name, "recompute") && (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2))) val = "auto";
    else if (i + 1 < argc) val = argv[++i];
    else return usage_err(cmd, "--%s needs a value%s", name, "");
    int64_t iv;
    int r = 0;
    if (!strcmp(name, "model")) o->model = val;
    else if (!strcmp(name, "data")) o->data = val;
    else if (!strcmp(name, "device")) o->device = val;
    else if (!strcmp(name, "init")) o->init = val;
    else if (!strcmp(name, "save")) o->save = val;
    else if (!strcmp(name, "weights")) o->weights = val;
    else if (!strcmp(name, "checkpoint-dir")) o->checkpoint_dir = val;
    else if (!strcmp(name, "log-dir")) o->log_dir = val;
    else if (!strcmp(name, "metrics-json")) o->metrics_json = val;
    else if (!strcmp(name, "images")) o->images = val;
    else if (!strcmp(name, "monitor")) {
      o->monitor = val;
      if (strcmp(val, "val_loss") && strcmp(val, "val_accuracy") && strcmp(val, "loss") && strcmp(val, "accuracy"))
        return usage_err(cmd, "--monitor expects val_loss, val_accuracy, loss or accuracy, got '%s'%s", val, "");
    }
    else if (!strcmp(name, "loss")) o->loss = val;
    else if (!strcmp(name, "optimizer")) {
      o->optimizer = val;
      if (strcmp(val, "sgd") && strcmp(val, "adam") && strcmp(val, "adamw"))
        return usage_err(cmd, "--optimizer expects sgd, adam or adamw, got '%s'%s", val, "");
    } else if (!strcmp(name, "scheduler")) {
      o->scheduler = val;
      if (strcmp(val, "none") && strcmp(val, "plateau") && strcmp(val, "step") && strcmp(val, "cosine") && strcmp(val, "onecycle"))
        return usage_err(cmd, "--scheduler expects none, plateau, step, cosine or onecycle, got '%s'%s", val, "");
    } else if (!strcmp(name, "on-nonfinite")) {
      if (strcmp(val, "stop") && strcmp(val, "skip"))
        return usage_err(cmd, "--on-nonfinite expects stop or skip, got '%s'%s", val, "");
      o->skip_nonfinite = !strcmp(val, "skip");
    } else if (!strcmp(name, "augment")) {
      o->augment = val;
      if (strcmp(val, "none") && strcmp(val, "flip") && strcmp(val, "crop-flip"))
        return usage_err(cmd, "--augment expects none, flip or crop-flip, got '%s'%s", val, "");
    } else if (!strcmp(name, "input")) r = parse_shape(cmd, val, o);
    else if (!strcmp(name, "epochs")) { r = parse_i64(cmd, name, val, 1, 100000, &iv); o->epochs = (int)iv; }
    else if (!strcmp(name, "batch-size")) r = parse_i64(cmd, name, val, 1, 1 << 20, &o->batch_size);
    else if (!strcmp(name, "accumulate")) { r = parse_i64(cmd, name, val, 1, 1024, &iv); o->accumulate = (int)iv; }
    else if (!strcmp(name, "recompute")) {
      _Static_assert(CT_RECOMPUTE_MAX == 4096, "the message below names the limit");
      if (ct_recompute_parse(val, &o->recompute) != CT_OK)
        return usage_err(cmd, "--recompute expects auto, cheap, norm, selective, off or a segment count 0..4096, got '%s'%s", val, "");
    }
    else if (!strcmp(name, "max-steps")) r = parse_i64(cmd, name, val, 1, INT64_C(1) << 40, &o->max_steps);
    else if (!strcmp(name, "threads")) { r = parse_i64(cmd, name, val, 1, 1024, &iv); o->threads = (int)iv; }
    else if (!strcmp(name, "workers")) { r = parse_i64(cmd, name, val, 0, 64, &iv); o->workers = (int)iv; }
    else if (!strcmp(name, "classes")) { r = parse_i64(cmd, name, val, 1, 1 << 20, &iv); o->classes = (int)iv; }
    else if (!strcmp(name, "resize")) { r = parse_i64(cmd, name, val, 1, 8192, &iv); o->resize = (int)iv; }
    else if (!strcmp(name, "patience")) { r = parse_i64(cmd, name, val, 0, 100000, &iv); o->patience = (int)iv; }
    else if (!strcmp(name, "keep-last")) { r = parse_i64(cmd, name, val, 1, 100000, &iv); o->keep_last = (int)iv; }
    else if (!strcmp(name, "lr-patience")) { r = parse_i64(cmd, name, val, 0, 100000, &iv); o->lr_patience = (int)iv; if (!iv) o->lr_patience = -1; }
    else if (!strcmp(name, "lr-factor")) r = parse_f64(cmd, name, val, 1e-9, 0.999999, &o->lr_factor);
    else if (!strcmp(name, "step-size")) { r = parse_i64(cmd, name, val, 1, 1000000, &iv); o->step_size = (int)iv; }
    else if (!strcmp(name, "top")) { r = parse_i64(cmd, name, val, 1, 1000, &iv); o->top = (int)iv; }
    else if (!strcmp(name, "seed")) { r = parse_i64(cmd, name, val, 0, INT64_MAX, &iv); o->seed = (uint64_t)iv; }
    else if (!strcmp(name, "lr")) { r = parse_f64(cmd, name, val, 0, 1e6, &o->lr); o->have_lr = 1; }
    else if (!strcmp(name, "momentum")) { r = parse_f64(cmd, name, val, 0, 1, &o->momentum); o->have_momentum = 1; }
    else if (!strcmp(name, "weight-decay")) { r = parse_f64(cmd, name, val, 0, 1e3, &o->weight_decay); o->have_wd = 1; }
    else if (!strcmp(name, "clip-grad-norm")) r = parse_f64(cmd, name, val, 0, 1e12, &o->clip);
    else if (!strcmp(name, "label-smoothing")) r = parse_f64(cmd, name, val, 0, 1, &o->label_smoothing);
    else if (!strcmp(name, "min-delta")) r = parse_f64(cmd, name, val, 0, 1e12, &o->min_delta);
    else if (!strcmp(name, "warmup")) r = parse_f64(cmd, name, val, 0, 1e9, &o->warmup);
    else if (!strcmp(name, "precision")) o->precision = val;
    else if (!strcmp(name, "memory-format")) {
      ct_memory_format f;
      if (ct_memory_format_parse(val, &f) != CT_OK)
        return usage_err(cmd, "--memory-format expects auto, contiguous or channels-last, got '%s'%s", val, "");
      o->memory_format = val;
    }
    else if (!strcmp(name, "opt-level")) o->opt_level = val;
    else if (!strcmp(name, "loss-scale")) o->loss_scale = val;
    else if (!strcmp(name, "loss-scale-init")) {
      r = parse_f64(cmd, name, val, 1e-30, 3.4e38, &o->loss_scale_init);
      o->have_loss_scale_init = 1;
    }
    else return usage_err(cmd, "unknown flag '--%s'%s", name, "");
    if (r) return r;
  }
  return 0;
}

int cli_recompute(const cli_opts *o) {
  if (o->recompute != CLI_RECOMPUTE_DEFAULT) return o->recompute;
  return strncmp(o->device, "cuda", 4) == 0 ? CT_RECOMPUTE_SELECTIVE : 0;
}
