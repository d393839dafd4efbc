#define _POSIX_C_SOURCE 200809L
#include "ctrain/progress.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BAR_WIDTH 30
#define TTY_INTERVAL_S 0.1
#define PLAIN_PARTS 10 /* plain-line mode writes one line per tenth */
#define LINE_CAP 4096

struct ct_progress {
  FILE *out;
  int tty;
  int64_t steps;
  int digits; /* width of the step counter, so the bar does not move */
  ct_progress_clock_fn now;
  void *now_ctx;
  double start;
  double last_draw; /* clock time of the last tty redraw; -inf before */
  int64_t last_part; /* plain mode: tenths already reported */
  size_t last_len;   /* tty: length of the line on screen, to blank leftovers */
  double img_per_s;  /* last reported throughput, for the final line */
};

static double monotonic_now(void *ctx) {
  (void)ctx;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A bounded string builder: appends are silently cut at LINE_CAP - 1. */
typedef struct line_buf {
  char s[LINE_CAP];
  size_t n;
} line_buf;

static void add(line_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(line_buf *b, const char *fmt, ...) {
  if (b->n >= LINE_CAP - 1) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(b->s + b->n, LINE_CAP - b->n, fmt, ap);
  va_end(ap);
  if (k > 0) b->n += (size_t)k < LINE_CAP - b->n ? (size_t)k : LINE_CAP - 1 - b->n;
}

static void add_counter_and_bar(line_buf *b, const ct_progress *p, int64_t step) {
  add(b, "%*lld/%lld [", p->digits, (long long)step, (long long)p->steps);
  int filled = (int)((double)step / (double)p->steps * BAR_WIDTH);
  if (step >= p->steps) filled = BAR_WIDTH;
  if (filled > BAR_WIDTH) filled = BAR_WIDTH;
  char bar[BAR_WIDTH + 1];
  for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < filled ? '=' : '.';
  /* The arrow head sits after the filled part while the epoch runs. */
  if (step < p->steps) bar[filled < BAR_WIDTH ? filled : BAR_WIDTH - 1] = '>';
  bar[BAR_WIDTH] = 0;
  add(b, "%s]", bar);
}

/* Keras's ETA format: h:mm:ss above an hour, m:ss above a minute, else Ns. */
static void add_eta(line_buf *b, double eta) {
  long long e = (long long)eta;
  if (eta > 3600) add(b, " - ETA: %lld:%02lld:%02lld", e / 3600, (e % 3600) / 60, e % 60);
  else if (eta > 60) add(b, " - ETA: %lld:%02lld", e / 60, e % 60);
  else add(b, " - ETA: %llds", e);
}

static void add_metrics(line_buf *b, const char *const *names, const double *values, int n) {
  for (int i = 0; i < n; i++) {
    double v = values[i];
    if (fabs(v) > 1e-3 || isnan(v)) add(b, " - %s: %.4f", names[i], v);
    else add(b, " - %s: %.4e", names[i], v);
  }
}

static void add_rate(line_buf *b, double img_per_s) {
  if (img_per_s > 0) add(b, " - %.0f img/s", img_per_s);
}

/* Terminal: return to column 0, draw, blank what a longer previous line
 * left behind. Plain: one line per call. */
static ct_status emit(ct_progress *p, const line_buf *b, int final) {
  FILE *f = p->out;
  if (p->tty) {
    fputc('\r', f);
    fwrite(b->s, 1, b->n, f);
    for (size_t i = b->n; i < p->last_len; i++) fputc(' ', f);
    p->last_len = final ? 0 : b->n;
    if (final) fputc('\n', f);
  } else {
    fwrite(b->s, 1, b->n, f);
    fputc('\n', f);
  }
  if (fflush(f) != 0 || ferror(f)) return ct_error(CT_ERR_IO, "progress: writing to the output stream failed");
  return CT_OK;
}

static int count_digits(int64_t v) {
  int d = 1;
  while (v >= 10) {
    v /= 10;
    d++;
  }
  return d;
}

ct_status ct_progress_begin(FILE *out, int epoch, int epochs, int64_t steps, int is_tty,
                            ct_progress **p) {
  if (!p) return ct_error(CT_ERR_INVALID_ARG, "ct_progress_begin: p is NULL");
  *p = NULL;
  if (!out) return ct_error(CT_ERR_INVALID_ARG, "ct_progress_begin: output stream is NULL");
  if (steps <= 0)
    return ct_error(CT_ERR_INVALID_ARG, "ct_progress_begin: epoch %d has %lld steps, expected > 0", epoch,
                    (long long)steps);
  ct_progress *q = calloc(1, sizeof *q);
  if (!q) return ct_error(CT_ERR_OUT_OF_MEMORY, "ct_progress_begin: out of memory");
  q->out = out;
  q->tty = is_tty < 0 ? isatty(fileno(out)) : is_tty != 0;
  q->steps = steps;
  q->digits = count_digits(steps);
  q->now = monotonic_now;
  q->start = q->now(NULL);
  q->last_draw = -INFINITY;
  if (epochs > 0) fprintf(out, "Epoch %d/%d\n", epoch, epochs);
  else fprintf(out, "Epoch %d\n", epoch);
  if (fflush(out) != 0 || ferror(out)) {
    free(q);
    return ct_error(CT_ERR_IO, "progress: writing to the output stream failed");
  }
  *p = q;
  return CT_OK;
}

void ct_progress_set_clock(ct_progress *p, ct_progress_clock_fn now, void *ctx) {
  if (!p) return;
  p->now = now ? now : monotonic_now;
  p->now_ctx = now ? ctx : NULL;
  p->start = p->now(p->now_ctx);
  p->last_draw = -INFINITY;
}

ct_status ct_progress_update(ct_progress *p, int64_t step, const char *const *names,
                             const double *values, int n, double img_per_s) {
  if (!p) return ct_error(CT_ERR_INVALID_ARG, "ct_progress_update: p is NULL");
  if (step < 0 || step > p->steps)
    return ct_error(CT_ERR_INVALID_ARG, "ct_progress_update: step %lld outside 0..%lld", (long long)step,
                    (long long)p->steps);
  if (n < 0 || (n > 0 && (!names || !values)))
    return ct_error(CT_ERR_INVALID_ARG, "ct_progress_update: %d metrics with NULL names or values", n);
  if (img_per_s > 0) p->img_per_s = img_per_s;
  double t = p->now(p->now_ctx);
  if (p->tty) {
    if (t - p->last_draw < TTY_INTERVAL_S) return CT_OK;
  } else {
    int64_t part = step * PLAIN_PARTS / p->steps;
    if (step >= p->steps || part <= p->last_part) return CT_OK;
    p->last_part = part;
  }
  p->last_draw = t;
  line_buf b;
  b.n = 0;
  b.s[0] = 0;
  add_counter_and_bar(&b, p, step);
  if (step > 0) add_eta(&b, (t - p->start) / (double)step * (double)(p->steps - step));
  add_metrics(&b, names, values, n);
  add_rate(&b, img_per_s);
  return emit(p, &b, 0);
}

ct_status ct_progress_end(ct_progress *p, const char *const *names, const double *values, int n) {
  if (!p) return ct_error(CT_ERR_INVALID_ARG, "ct_progress_end: p is NULL");
  if (n < 0 || (n > 0 && (!names || !values))) {
    ct_progress_free(p);
    return ct_error(CT_ERR_INVALID_ARG, "ct_progress_end: %d metrics with NULL names or values", n);
  }
  double elapsed = p->now(p->now_ctx) - p->start;
  double per_step = elapsed / (double)p->steps;
  line_buf b;
  b.n = 0;
  b.s[0] = 0;
  add_counter_and_bar(&b, p, p->steps);
  add(&b, " - %.0fs", elapsed);
  if (per_step >= 1 || per_step == 0) add(&b, " %.0fs/step", per_step);
  else if (per_step >= 1e-3) add(&b, " %.0fms/step", per_step * 1e3);
  else add(&b, " %.0fus/step", per_step * 1e6);
  add_metrics(&b, names, values, n);
  add_rate(&b, p->img_per_s);
  ct_status s = emit(p, &b, 1);
  free(p);
  return s;
}

ct_status ct_progress_message(ct_progress *p, const char *text) {
  if (p->tty && p->last_len > 0) fputc('\n', p->out);
  p->last_len = 0;
  fputs(text, p->out);
  fputc('\n', p->out);
  if (fflush(p->out) != 0 || ferror(p->out)) return ct_error(CT_ERR_IO, "progress: writing to the output stream failed");
  return CT_OK;
}

void ct_progress_free(ct_progress *p) {
  if (!p) return;
  if (p->tty && p->last_len > 0) {
    fputc('\n', p->out);
    fflush(p->out);
  }
  free(p);
}
