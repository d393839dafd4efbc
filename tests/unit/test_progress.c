/* Progress display: the exact text of every bar drawn, on a fake clock, in
 * terminal mode (in-place redraws at most every 0.1 s, padding over longer
 * lines) and plain mode (a line per tenth of the epoch), plus ETA formats,
 * the final line and argument errors. Expected lines are built here from
 * the format description, not by the library's code. */
#include <stdint.h>

#include "ctrain/progress.h"
#include "test_util.h"

typedef struct fake_clock {
  long long ms;
} fake_clock;

static double fake_now(void *ctx) { return ((fake_clock *)ctx)->ms / 1000.0; }

static char *read_back(FILE *f) {
  fflush(f);
  long n = ftell(f);
  rewind(f);
  char *b = malloc((size_t)n + 1);
  size_t got = fread(b, 1, (size_t)n, f);
  b[got] = 0;
  return b;
}

static void fmt_value(char *out, size_t cap, double v) {
  if (fabs(v) > 1e-3) snprintf(out, cap, "%.4f", v);
  else snprintf(out, cap, "%.4e", v);
}

/* "<step>/<steps> [bar]" padded like the library promises: the counter is
 * as wide as <steps>, the running bar is k '=' + '>' + dots, k = 30*step/steps. */
static void expect_head(char *out, size_t cap, long long step, long long steps) {
  char total[32];
  int w = snprintf(total, sizeof total, "%lld", steps);
  char bar[31];
  long long k = step * 30 / steps;
  for (int i = 0; i < 30; i++) bar[i] = i < k ? '=' : '.';
  if (step < steps) bar[k] = '>';
  bar[30] = 0;
  snprintf(out, cap, "%*lld/%lld [%s]", w, step, steps, bar);
}

static void append_metrics(char *out, size_t cap, const char *const *names, const double *v, int n) {
  for (int i = 0; i < n; i++) {
    char num[64];
    fmt_value(num, sizeof num, v[i]);
    size_t len = strlen(out);
    snprintf(out + len, cap - len, " - %s: %s", names[i], num);
  }
}

static void rstrip(char *s) {
  size_t n = strlen(s);
  while (n && s[n - 1] == ' ') s[--n] = 0;
}

static double urand(void) { return (double)rand() / RAND_MAX; }

static void test_tty(void) {
  enum { STEPS = 469, STEP_MS = 15 };
  FILE *f = tmpfile();
  CHECK(f != NULL);
  if (!f) return;
  fake_clock clk = {1000000};
  ct_progress *p = NULL;
  CHECK_OK(ct_progress_begin(f, 3, 10, STEPS, 1, &p));
  if (!p) return;
  ct_progress_set_clock(p, fake_now, &clk);
  long long t0 = clk.ms;
  const char *names[2] = {"loss", "accuracy"};
  static double vals[STEPS + 1][2], rate[STEPS + 1];
  srand(4242);
  for (int s = 1; s <= STEPS; s++) {
    clk.ms += STEP_MS;
    vals[s][0] = urand() * 2;
    vals[s][1] = s == 5 ? 5e-5 : urand(); /* one value in %.4e range */
    rate[s] = 1000 + urand() * 9000;
    CHECK_OK(ct_progress_update(p, s, names, vals[s], 2, rate[s]));
  }
  const char *end_names[4] = {"loss", "accuracy", "val_loss", "val_accuracy"};
  double end_vals[4] = {urand(), urand(), urand(), urand()};
  CHECK_OK(ct_progress_end(p, end_names, end_vals, 4));
  char *out = read_back(f);
  fclose(f);

  CHECK(!strncmp(out, "Epoch 3/10\n", 11));
  CHECK(strchr(out + 11, '\n') == out + strlen(out) - 1); /* only the final newline */
  /* Redraw schedule from the 0.1 s rule on integer milliseconds. */
  long long last = -1000000;
  int want_draws = 0;
  for (int s = 1; s <= STEPS; s++) {
    long long t = t0 + (long long)s * STEP_MS;
    if (t - last >= 100) {
      want_draws++;
      last = t;
    }
  }
  int draws = 0, bad = 0;
  size_t prev_len = 0;
  char *seg = out + 11;
  while (*seg == '\r') {
    char *next = strpbrk(seg + 1, "\r\n");
    if (!next) break;
    size_t len = (size_t)(next - seg - 1);
    if (*next == '\n') { /* final line */
      char got[4096], want[4096], tail[64];
      memcpy(got, seg + 1, len);
      got[len] = 0;
      CHECK_MSG(len >= prev_len, "final line does not cover the previous bar");
      rstrip(got);
      expect_head(want, sizeof want, STEPS, STEPS);
      strcat(want, " - 7s 15ms/step");
      append_metrics(want, sizeof want, end_names, end_vals, 4);
      snprintf(tail, sizeof tail, " - %.0f img/s", rate[STEPS]);
      strcat(want, tail);
      CHECK_MSG(!strcmp(got, want), "final line\n got: %s\nwant: %s", got, want);
      seg = next;
      break;
    }
    char got[4096], want[4096], tail[64];
    memcpy(got, seg + 1, len);
    got[len] = 0;
    CHECK_MSG(len >= prev_len, "redraw %d shorter than the line before it", draws);
    prev_len = len;
    rstrip(got);
    long long s = strtoll(got, NULL, 10);
    if (s < 1 || s > STEPS) {
      bad++;
      break;
    }
    expect_head(want, sizeof want, s, STEPS);
    double elapsed = (double)(s * STEP_MS) / 1000.0;
    long long eta = (long long)(elapsed / (double)s * (double)(STEPS - s));
    snprintf(want + strlen(want), sizeof want - strlen(want), " - ETA: %llds", eta);
    append_metrics(want, sizeof want, names, vals[s], 2);
    snprintf(tail, sizeof tail, " - %.0f img/s", rate[s]);
    strcat(want, tail);
    if (strcmp(got, want)) {
      if (bad++ < 3) fprintf(stderr, " got: %s\nwant: %s\n", got, want);
    }
    draws++;
    seg = next;
  }
  CHECK(bad == 0);
  CHECK_MSG(draws == want_draws, "%d redraws, expected %d", draws, want_draws);
  CHECK(*seg == '\n' && seg[1] == 0);
  free(out);
}

static void run_plain(int steps, int expect_lines) {
  FILE *f = tmpfile();
  CHECK(f != NULL);
  if (!f) return;
  fake_clock clk = {0};
  ct_progress *p = NULL;
  CHECK_OK(ct_progress_begin(f, 1, 0, steps, 0, &p));
  if (!p) return;
  ct_progress_set_clock(p, fake_now, &clk);
  const char *names[1] = {"loss"};
  double *vals = malloc(sizeof(double) * (size_t)(steps + 1));
  for (int s = 1; s <= steps; s++) {
    clk.ms += 7;
    vals[s] = urand() * 3;
    CHECK_OK(ct_progress_update(p, s, names, &vals[s], 1, 0));
  }
  double fin = urand();
  CHECK_OK(ct_progress_end(p, names, &fin, 1));
  char *out = read_back(f);
  fclose(f);
  CHECK(strchr(out, '\r') == NULL);
  CHECK(!strncmp(out, "Epoch 1\n", 8));
  char *line = out + 8;
  int lines = 0, last_part = 0, bad = 0;
  while (*line) {
    char *nl = strchr(line, '\n');
    if (!nl) {
      bad++;
      break;
    }
    *nl = 0;
    long long s = strtoll(line, NULL, 10);
    char want[4096];
    expect_head(want, sizeof want, s, steps);
    if (s == steps) {
      char tmp[64];
      snprintf(tmp, sizeof tmp, " - %.0fs %.0fms/step", steps * 0.007, 7.0);
      strcat(want, tmp);
      append_metrics(want, sizeof want, names, &fin, 1);
      CHECK_MSG(nl[1] == 0, "final line is not last");
    } else {
      /* A line is due exactly when another tenth of the epoch is done. */
      int part = (int)(s * 10 / steps);
      CHECK_MSG(part > last_part && (s == 1 || (s - 1) * 10 / steps < part), "line at step %lld", s);
      last_part = part;
      double elapsed = s * 0.007;
      snprintf(want + strlen(want), sizeof want - strlen(want), " - ETA: %llds",
               (long long)(elapsed / (double)s * (double)(steps - s)));
      append_metrics(want, sizeof want, names, &vals[s], 1);
      lines++;
    }
    if (strcmp(line, want)) {
      if (bad++ < 3) fprintf(stderr, " got: %s\nwant: %s\n", line, want);
    }
    line = nl + 1;
  }
  CHECK(bad == 0);
  CHECK_MSG(lines == expect_lines, "steps=%d: %d progress lines, expected %d", steps, lines, expect_lines);
  free(vals);
  free(out);
}

/* ETA in h:mm:ss, m:ss and Ns, and padding when the line gets shorter. */
static void test_eta_formats(void) {
  FILE *f = tmpfile();
  if (!f) return;
  fake_clock clk = {0};
  ct_progress *p = NULL;
  CHECK_OK(ct_progress_begin(f, 2, 5, 1000, 1, &p));
  if (!p) return;
  ct_progress_set_clock(p, fake_now, &clk);
  const int at[3] = {1, 990, 995};
  const char *want_eta[3] = {" - ETA: 2:46:30", " - ETA: 1:40", " - ETA: 50s"};
  for (int i = 0; i < 3; i++) {
    clk.ms = 10000LL * at[i]; /* 10 s per step */
    CHECK_OK(ct_progress_update(p, at[i], NULL, NULL, 0, 0));
  }
  ct_progress_free(p); /* aborted epoch: the bar line gets its newline */
  char *out = read_back(f);
  fclose(f);
  char *seg = out;
  for (int i = 0; i < 3; i++) {
    seg = strchr(seg, '\r');
    CHECK(seg != NULL);
    if (!seg) break;
    seg++;
    char head[256];
    expect_head(head, sizeof head, at[i], 1000);
    CHECK_MSG(!strncmp(seg, head, strlen(head)), "redraw %d head", i);
    CHECK_MSG(!strncmp(seg + strlen(head), want_eta[i], strlen(want_eta[i])), "redraw %d: %.80s", i, seg);
  }
  /* The last redraw is shorter than the one before it, so it ends in blanks. */
  size_t n = strlen(out);
  CHECK(n > 2 && !strcmp(out + n - 2, " \n"));
  free(out);
}

static void test_errors(void) {
  FILE *f = tmpfile();
  if (!f) return;
  ct_progress *p = (ct_progress *)1;
  CHECK(ct_progress_begin(f, 1, 1, 0, 0, &p) == CT_ERR_INVALID_ARG);
  CHECK(p == NULL);
  CHECK(ct_progress_begin(NULL, 1, 1, 10, 0, &p) == CT_ERR_INVALID_ARG);
  CHECK_OK(ct_progress_begin(f, 1, 1, 10, 0, &p));
  CHECK(ct_progress_update(p, 11, NULL, NULL, 0, 0) == CT_ERR_INVALID_ARG);
  CHECK_MSG(strstr(ct_last_error(), "11") != NULL, "%s", ct_last_error());
  CHECK(ct_progress_update(p, 1, NULL, NULL, 2, 0) == CT_ERR_INVALID_ARG);
  CHECK(ct_progress_end(p, NULL, NULL, 0) == CT_OK);
  ct_progress_free(NULL);
  fclose(f);
}

/* A message during the epoch gets a line of its own, on a terminal too
 * (the bar drawn before it is ended, and the next draw starts after it). */
static void test_message(void) {
  for (int tty = 0; tty <= 1; tty++) {
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f) return;
    fake_clock clk = {0};
    ct_progress *p = NULL;
    CHECK_OK(ct_progress_begin(f, 1, 1, 4, tty, &p));
    if (!p) return;
    ct_progress_set_clock(p, fake_now, &clk);
    for (int s = 1; s <= 3; s++) {
      clk.ms += 1000;
      CHECK_OK(ct_progress_update(p, s, NULL, NULL, 0, 0));
      if (s == 2) CHECK_OK(ct_progress_message(p, "cuda graph: on"));
    }
    CHECK_OK(ct_progress_end(p, NULL, NULL, 0));
    char *out = read_back(f);
    fclose(f);
    const char *m = strstr(out, "cuda graph: on");
    CHECK_MSG(m && m[-1] == '\n' && m[14] == '\n', "tty %d: the message shares a line: %s", tty, out);
    CHECK_MSG(m && strstr(m, "4/4") != NULL, "tty %d: no bar after the message: %s", tty, out);
    free(out);
  }
}

int main(void) {
  test_tty();
  test_message();
  srand(99);
  run_plain(100, 9);
  run_plain(7, 6);
  run_plain(1, 0);
  run_plain(25, 9);
  test_eta_formats();
  test_errors();
  return test_summary("test_progress");
}
