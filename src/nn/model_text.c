/* The model text format (docs/MODEL_FORMAT.md): one layer per line,
 * keyword then positional arguments then key=value options, '#' comments.
 * Top-level layers are named by their index as in nn.Sequential; a
 * `residual` ... [`shortcut` ...] `end` block at index i is one module whose
 * body layers are named i.body.j and shortcut layers i.shortcut.k, and
 * whose output is body(x) + shortcut(x) (shortcut = identity if absent). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file_open.h"
#include "nn/model_impl.h"

#define MAX_TOK 16
#define LIMIT (1 << 20) /* channels, kernel, features: absurd beyond this */
/* Layers in one file (residual adds included), some twenty times
 * ResNet-152's. Unbounded, a megabyte of 'relu' lines was 200,000 layers,
 * which the memory planner takes tens of minutes over. */
#define MAX_LAYERS 4096

typedef struct parser {
  const char *path;
  FILE *f;
  int line;
  char buf[1024];
  char *tok[MAX_TOK];
  int used[MAX_TOK]; /* options taken by opt_val */
  int ntok;
  ct_model *m;
  int have_input;
  int in_nd;
  int64_t in[3];
} parser;

static ct_status perr(parser *p, const char *fmt, const char *a, const char *b) {
  char msg[512];
  snprintf(msg, sizeof msg, fmt, a, b);
  return ct_error(CT_ERR_PARSE, "%s:%d: %s", p->path, p->line, msg);
}

static ct_status too_many_layers(parser *p) {
  char n[16];
  snprintf(n, sizeof n, "%d", MAX_LAYERS);
  return perr(p, "more than %s layers", n, "");
}

/* Reads the next non-empty line into tokens; 0 at end of file. Bytes are
 * read one by one, not with fgets, because a NUL byte looks like the end
 * of fgets' line: the rest of the line was dropped unseen and counted as
 * another line, so later messages named the wrong line. */
static int next_line(parser *p, ct_status *st) {
  *st = CT_OK;
  for (;;) {
    size_t n = 0;
    int ch = 0;
    while (n < sizeof p->buf - 1 && (ch = getc(p->f)) != EOF) {
      p->buf[n++] = (char)ch;
      if (ch == '\n' || ch == 0) break;
    }
    if (n == 0) break;
    p->buf[n] = 0;
    p->line++;
    if (ch == 0) {
      *st = perr(p, "NUL byte (expected text)", "", "");
      return 0;
    }
    if (n == sizeof p->buf - 1 && p->buf[n - 1] != '\n') {
      *st = perr(p, "line longer than %s characters", "1022", "");
      return 0;
    }
    char *c = strchr(p->buf, '#');
    if (c) *c = 0;
    p->ntok = 0;
    for (char *s = strtok(p->buf, " \t\r\n"); s; s = strtok(NULL, " \t\r\n")) {
      if (p->ntok == MAX_TOK) {
        *st = perr(p, "too many words on one line (at most %s)", "16", "");
        return 0;
      }
      p->used[p->ntok] = 0;
      p->tok[p->ntok++] = s;
    }
    if (p->ntok) {
      for (char *s = p->tok[0]; *s; s++) *s = (char)tolower((unsigned char)*s);
      return 1;
    }
  }
  if (ferror(p->f)) *st = ct_error(CT_ERR_IO, "%s: read error: %s", p->path, strerror(errno));
  return 0;
}

/* Positional integer argument i (1-based) or default when absent. */
static ct_status int_arg(parser *p, int i, const char *what, long lo, long hi, int required, long def, int *out) {
  int pos = 0;
  for (int t = 1; t < p->ntok; t++) {
    if (strchr(p->tok[t], '=')) continue;
    if (++pos != i) continue;
    char *end;
    errno = 0;
    long v = strtol(p->tok[t], &end, 10);
    if (*end || end == p->tok[t] || errno) return perr(p, "%s: expected an integer, got '%s'", what, p->tok[t]);
    if (v < lo || v > hi) {
      char rng[64];
      snprintf(rng, sizeof rng, "%ld..%ld", lo, hi);
      return perr(p, "%s: must be in %s", what, rng);
    }
    *out = (int)v;
    return CT_OK;
  }
  if (required) return perr(p, "missing %s (see docs/MODEL_FORMAT.md)", what, "");
  *out = (int)def;
  return CT_OK;
}

static ct_status float_arg(parser *p, int i, const char *what, double lo, double hi, double def, float *out) {
  int pos = 0;
  for (int t = 1; t < p->ntok; t++) {
    if (strchr(p->tok[t], '=')) continue;
    if (++pos != i) continue;
    char *end;
    double v = strtod(p->tok[t], &end);
    if (*end || end == p->tok[t] || !(v >= lo && v <= hi)) return perr(p, "%s: expected a number in range, got '%s'", what, p->tok[t]);
    *out = (float)v;
    return CT_OK;
  }
  *out = (float)def;
  return CT_OK;
}

/* key=value option; marks it used. (A flag, not a byte written into the
 * token: the file may hold that byte itself, and a word starting with it
 * was skipped as a used option.) */
static const char *opt_val(parser *p, const char *key) {
  size_t n = strlen(key);
  for (int t = 1; t < p->ntok; t++)
    if (!p->used[t] && strncmp(p->tok[t], key, n) == 0 && p->tok[t][n] == '=') {
      p->used[t] = 1;
      return p->tok[t] + n + 1;
    }
  return NULL;
}

static ct_status opt_int(parser *p, const char *key, long lo, long hi, int *v) {
  const char *s = opt_val(p, key);
  if (!s) return CT_OK;
  char *end;
  long x = strtol(s, &end, 10);
  if (*end || end == s || x < lo || x > hi) return perr(p, "option %s: expected an integer in range, got '%s'", key, s);
  *v = (int)x;
  return CT_OK;
}

static ct_status opt_bool(parser *p, const char *key, int *v) {
  const char *s = opt_val(p, key);
  if (!s) return CT_OK;
  if (!strcmp(s, "true") || !strcmp(s, "1")) *v = 1;
  else if (!strcmp(s, "false") || !strcmp(s, "0")) *v = 0;
  else return perr(p, "option %s: expected true or false, got '%s'", key, s);
  return CT_OK;
}

static ct_status opt_float(parser *p, const char *key, double lo, double hi, float *v) {
  const char *s = opt_val(p, key);
  if (!s) return CT_OK;
  char *end;
  double x = strtod(s, &end);
  if (*end || end == s || !(x >= lo && x <= hi)) return perr(p, "option %s: expected a number in range, got '%s'", key, s);
  *v = (float)x;
  return CT_OK;
}

/* Every option must have been consumed, and positional args counted. */
static ct_status check_rest(parser *p, int max_pos) {
  int pos = 0;
  for (int t = 1; t < p->ntok; t++) {
    if (p->used[t]) continue;
    if (strchr(p->tok[t], '=')) return perr(p, "unknown option '%s' for %s", p->tok[t], p->tok[0]);
    if (++pos > max_pos) return perr(p, "too many arguments for %s (unexpected '%s')", p->tok[0], p->tok[t]);
  }
  return CT_OK;
}

static ct_status parse_shape(parser *p, const char *s) {
  int64_t v[3];
  int n = 0;
  const char *c = s;
  while (*c && n < 3) {
    char *end;
    long x = strtol(c, &end, 10);
    if (end == c || x <= 0 || x > LIMIT) return perr(p, "input: expected CxHxW or F with positive sizes, got '%s'", s, "");
    v[n++] = x;
    c = end;
    /* An 'x' only between sizes: "3x8x8x" and "8x" were accepted. */
    if (*c == 'x' && n < 3 && c[1]) c++;
    else if (*c) return perr(p, "input: expected CxHxW or F, got '%s'", s, "");
  }
  if (*c || (n != 1 && n != 3)) return perr(p, "input: expected CxHxW or F, got '%s'", s, "");
  if ((n == 3 ? v[0] * v[1] * v[2] : v[0]) > CT_LAYER_MAX_NUMEL) {
    char lim[32];
    snprintf(lim, sizeof lim, "%lld", (long long)CT_LAYER_MAX_NUMEL);
    return perr(p, "input: '%s' is more than %s elements per sample", s, lim);
  }
  p->in_nd = n;
  memcpy(p->in, v, sizeof v);
  p->have_input = 1;
  return CT_OK;
}

static ct_status parse_seq(parser *p, const char *prefix, int x, int *out, int depth, const char **ended_by);

static ct_status parse_layer(parser *p, const char *name, int x, int *y, int depth) {
  ct_model *m = p->m;
  const char *k = p->tok[0];
  int a = 0, b = 0, c = 0, k2 = -1;
  if (!strcmp(k, "conv2d")) {
    int s = 1, pad = 0, dil = 1, g = 1, bias = 1;
    CT_TRY(int_arg(p, 1, "in_channels", 1, LIMIT, 1, 0, &a));
    CT_TRY(int_arg(p, 2, "out_channels", 1, LIMIT, 1, 0, &b));
    CT_TRY(int_arg(p, 3, "kernel_size", 1, 1024, 1, 0, &c));
    CT_TRY(opt_int(p, "stride", 1, 1024, &s));
    CT_TRY(opt_int(p, "padding", 0, 1024, &pad));
    CT_TRY(opt_int(p, "dilation", 1, 1024, &dil));
    CT_TRY(opt_int(p, "groups", 1, LIMIT, &g));
    CT_TRY(opt_bool(p, "bias", &bias));
    CT_TRY(check_rest(p, 3));
    k2 = ct_g_conv2d(m, name, x, a, b, c, s, pad, dil, g, bias);
  } else if (!strcmp(k, "linear")) {
    int bias = 1;
    CT_TRY(int_arg(p, 1, "in_features", 1, 1 << 28, 1, 0, &a));
    CT_TRY(int_arg(p, 2, "out_features", 1, 1 << 28, 1, 0, &b));
    CT_TRY(opt_bool(p, "bias", &bias));
    CT_TRY(check_rest(p, 2));
    k2 = ct_g_linear(m, name, x, a, b, bias);
  } else if (!strcmp(k, "maxpool2d") || !strcmp(k, "avgpool2d")) {
    int s = 0, pad = 0, ceil = 0, cip = 1;
    CT_TRY(int_arg(p, 1, "kernel_size", 1, 1024, 1, 0, &a));
    CT_TRY(opt_int(p, "stride", 1, 1024, &s));
    CT_TRY(opt_int(p, "padding", 0, 1024, &pad));
    CT_TRY(opt_bool(p, "ceil_mode", &ceil));
    if (k[0] == 'a') CT_TRY(opt_bool(p, "count_include_pad", &cip));
    CT_TRY(check_rest(p, 1));
    k2 = k[0] == 'm' ? ct_g_maxpool2d(m, name, x, a, s, pad, ceil) : ct_g_avgpool2d(m, name, x, a, s, pad, ceil, cip);
  } else if (!strcmp(k, "adaptiveavgpool2d") || !strcmp(k, "adaptivemaxpool2d")) {
    CT_TRY(int_arg(p, 1, "output_size", 1, LIMIT, 1, 0, &a));
    CT_TRY(int_arg(p, 2, "output_width", 1, LIMIT, 0, a, &b));
    CT_TRY(check_rest(p, 2));
    k2 = k[8] == 'a' ? ct_g_adaptive_avgpool2d(m, name, x, a, b) : ct_g_adaptive_maxpool2d(m, name, x, a, b);
  } else if (!strcmp(k, "relu") || !strcmp(k, "gelu") || !strcmp(k, "silu") || !strcmp(k, "sigmoid") ||
             !strcmp(k, "tanh") || !strcmp(k, "leakyrelu")) {
    float alpha = 0.01f;
    ct_act act = !strcmp(k, "relu")      ? CT_ACT_RELU
                 : !strcmp(k, "gelu")    ? CT_ACT_GELU
                 : !strcmp(k, "silu")    ? CT_ACT_SILU
                 : !strcmp(k, "sigmoid") ? CT_ACT_SIGMOID
                 : !strcmp(k, "tanh")    ? CT_ACT_TANH
                                         : CT_ACT_LEAKY_RELU;
    if (act == CT_ACT_LEAKY_RELU) CT_TRY(float_arg(p, 1, "negative_slope", -1e6, 1e6, 0.01, &alpha));
    CT_TRY(check_rest(p, act == CT_ACT_LEAKY_RELU ? 1 : 0));
    k2 = ct_g_act(m, name, x, act, alpha);
  } else if (!strcmp(k, "dropout") || !strcmp(k, "dropout2d")) {
    float pr;
    CT_TRY(float_arg(p, 1, "p", 0.0, 1.0, 0.5, &pr));
    CT_TRY(check_rest(p, 1));
    k2 = ct_g_dropout(m, name, x, pr, k[7] == '2');
  } else if (!strcmp(k, "batchnorm1d") || !strcmp(k, "batchnorm2d")) {
    float eps = 1e-5f, mom = 0.1f;
    int affine = 1;
    CT_TRY(int_arg(p, 1, "num_features", 1, LIMIT, 1, 0, &a));
    CT_TRY(opt_float(p, "eps", 0.0, 1.0, &eps));
    CT_TRY(opt_float(p, "momentum", 0.0, 1.0, &mom));
    CT_TRY(opt_bool(p, "affine", &affine));
    CT_TRY(check_rest(p, 1));
    k2 = ct_g_batchnorm(m, name, x, a, k[9] == '1' ? 1 : 2, eps, mom, affine);
  } else if (!strcmp(k, "flatten")) {
    CT_TRY(check_rest(p, 0));
    k2 = ct_g_flatten(m, name, x);
  } else if (!strcmp(k, "softmax") || !strcmp(k, "logsoftmax")) {
    CT_TRY(check_rest(p, 0));
    k2 = ct_g_softmax(m, name, x, k[0] == 'l');
  } else if (!strcmp(k, "identity")) {
    CT_TRY(check_rest(p, 0));
    k2 = ct_g_add_layer(m, &ct_layer_identity, name, x, -2);
  } else if (!strcmp(k, "residual")) {
    if (depth >= 8) return perr(p, "residual blocks nested deeper than %s", "8", "");
    CT_TRY(check_rest(p, 0));
    int start = p->line;
    char pre[CT_NAME_MAX + 16];
    const char *ended = NULL;
    int body, sc = x;
    snprintf(pre, sizeof pre, "%s.body", name);
    CT_TRY(parse_seq(p, pre, x, &body, depth + 1, &ended));
    if (ended && !strcmp(ended, "shortcut")) {
      snprintf(pre, sizeof pre, "%s.shortcut", name);
      CT_TRY(parse_seq(p, pre, x, &sc, depth + 1, &ended));
    }
    if (!ended || strcmp(ended, "end")) {
      char l[16];
      snprintf(l, sizeof l, "%d", start);
      return perr(p, "the residual block opened on line %s has no 'end'", l, "");
    }
    if (body == x) return perr(p, "empty residual block", "", "");
    /* The add is a layer too; the body's layers were counted as read. */
    if (m->n_layers >= MAX_LAYERS) return too_many_layers(p);
    k2 = ct_g_add(m, name, body, sc); /* its line: the 'end' line, just read */
  } else {
    return perr(p,
                "unknown layer '%s' (expected conv2d, linear, maxpool2d, avgpool2d, adaptiveavgpool2d, "
                "adaptivemaxpool2d, relu, leakyrelu, gelu, silu, sigmoid, tanh, dropout, dropout2d, batchnorm1d, "
                "batchnorm2d, flatten, softmax, logsoftmax, identity, residual%s)",
                k, "");
  }
  /* (The residual branch set its add's line here before this check, and so
   * wrote layers[-1] when out of memory.) */
  if (k2 < 0) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: out of memory", p->path);
  m->layers[k2].line = p->line;
  *y = k2;
  return CT_OK;
}

/* Parses layers until end of file or a block keyword (shortcut/end), which
 * is returned in *ended_by. */
static ct_status parse_seq(parser *p, const char *prefix, int x, int *out, int depth, const char **ended_by) {
  ct_status st;
  int idx = 0;
  *ended_by = NULL;
  while (next_line(p, &st)) {
    const char *k = p->tok[0];
    if (!strcmp(k, "end") || !strcmp(k, "shortcut")) {
      if (depth == 0) return perr(p, "'%s' outside a residual block", k, "");
      *ended_by = !strcmp(k, "end") ? "end" : "shortcut";
      *out = x;
      return CT_OK;
    }
    if (!strcmp(k, "input")) {
      if (depth || p->m->n_layers) return perr(p, "'input' must come before the first layer", "", "");
      if (p->ntok != 2) return perr(p, "input: expected one argument CxHxW or F", "", "");
      CT_TRY(parse_shape(p, p->tok[1]));
      continue;
    }
    if (p->m->n_layers >= MAX_LAYERS) return too_many_layers(p);
    char name[CT_NAME_MAX];
    snprintf(name, sizeof name, "%s%s%d", prefix, prefix[0] ? "." : "", idx++);
    CT_TRY(parse_layer(p, name, x, &x, depth));
  }
  if (st != CT_OK) return st;
  *out = x;
  return CT_OK;
}

ct_status ct_model_parse_file(const char *path, const ct_model_options *opt, ct_model **out) {
  parser p;
  memset(&p, 0, sizeof p);
  p.path = path;
  CT_TRY(ct_fopen_regular(path, "model file", "r", &p.f));
  const char *base = strrchr(path, '/');
  ct_status s = ct_model_new(base ? base + 1 : path, &p.m);
  const char *ended = NULL;
  int y;
  if (s == CT_OK) s = parse_seq(&p, "", -1, &y, 0, &ended);
  fclose(p.f);
  if (s == CT_OK && p.m->n_layers == 0) s = ct_error(CT_ERR_PARSE, "%s: no layers", path);
  if (s == CT_OK) {
    int64_t in[3] = {p.in[0], p.in[1], p.in[2]};
    int nd = p.have_input ? p.in_nd : 0;
    if (opt->in_channels) { /* --input overrides the file */
      in[0] = opt->in_channels;
      nd = opt->height ? 3 : 1;
      in[1] = opt->height, in[2] = opt->width;
    }
    if (!nd) s = ct_error(CT_ERR_PARSE, "%s: no input shape: add a line 'input CxHxW' (or F) or pass --input", path);
    else {
      s = ct_model_finish(p.m, nd, in, opt->seed);
      if (s != CT_OK) {
        /* A size the model refuses is the file's content (exit 4), as a
         * syntax error is; shape disagreements stay shape errors. */
        if (s == CT_ERR_INVALID_ARG) s = CT_ERR_PARSE;
        /* Point at the offending line when the failing layer is known. */
        int line = 0;
        for (int i = 0; i < p.m->n_layers && !line; i++)
          if (p.m->layers[i].n_state == 0 && p.m->layers[i].out_ndim == 0) line = p.m->layers[i].line;
        s = line ? ct_error_wrap(s, "%s:%d", path, line) : ct_error_wrap(s, "%s", path);
      }
    }
  }
  if (s != CT_OK) {
    ct_model_free(p.m);
    return s;
  }
  *out = p.m;
  return CT_OK;
}
