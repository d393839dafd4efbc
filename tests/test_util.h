/* Minimal test harness for the C unit tests: CHECK records a failure and
 * goes on, so one run reports every broken case; a test's main() ends with
 * `return test_summary("name");` (0 if all passed, 1 otherwise). */
#ifndef CTRAIN_TEST_UTIL_H
#define CTRAIN_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/ctrain.h"

/* The counters every CHECK updates. A test built from several files
 * (tests/ops) compiles each with TEST_SHARED_COUNTERS and defines the
 * counters once, in the file with main(). */
#ifdef TEST_SHARED_COUNTERS
extern int test_failures_, test_checks_;
#else
static int test_failures_ = 0, test_checks_ = 0;
#endif

#define CHECK(cond)                                                         \
  do {                                                                      \
    test_checks_++;                                                         \
    if (!(cond)) {                                                          \
      test_failures_++;                                                     \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                       \
  } while (0)

#define CHECK_MSG(cond, ...)                                     \
  do {                                                           \
    test_checks_++;                                              \
    if (!(cond)) {                                               \
      test_failures_++;                                          \
      fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
    }                                                            \
  } while (0)

/* Checks a ct_status is CT_OK and prints ct_last_error() if not. */
#define CHECK_OK(expr)                                                                     \
  do {                                                                                     \
    ct_status s_ = (expr);                                                                 \
    test_checks_++;                                                                        \
    if (s_ != CT_OK) {                                                                     \
      test_failures_++;                                                                    \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr, ct_status_name(s_), ct_last_error()); \
    }                                                                                      \
  } while (0)

/* Largest |a-b| / max(|b|, floor) over n values; floor guards tiny refs. */
static inline double test_max_rel_err_f32(const float *a, const float *b, size_t n, double floor) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    double m = fabs((double)b[i]);
    double r = d / (m > floor ? m : floor);
    if (r > worst || isnan(r)) worst = isnan(r) ? INFINITY : r;
  }
  return worst;
}

/* The whole file at path, malloc'd, its size in *n; NULL if unreadable. */
static inline unsigned char *test_read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = len >= 0 ? (unsigned char *)malloc(len > 0 ? (size_t)len : 1) : NULL;
  *n = b ? fread(b, 1, (size_t)len, f) : 0;
  fclose(f);
  return b;
}

/* Directory for scratch files: $CTRAIN_TEST_TMP or /tmp. */
static inline const char *test_tmpdir(void) {
  const char *d = getenv("CTRAIN_TEST_TMP");
  if (d && *d) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", d);
    if (system(cmd) != 0) return "/tmp";
    return d;
  }
  return "/tmp";
}

/* The tests' quick deterministic stream (xorshift64; *s nonzero): the next
 * state, and a float in [-1, 1) from its top 53 bits. */
static inline uint64_t test_xorshift(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}
static inline float test_frand(uint64_t *s) {
  return (float)((double)(test_xorshift(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Fills a mkstemps template (path, ending in a suffix of suffix_len
 * characters such as ".txt") with a new file holding text. Returns 0, or
 * -1 after recording a failed check. */
static inline int test_write_temp(char *path, int suffix_len, const char *text) {
  int fd = mkstemps(path, suffix_len);
  CHECK_MSG(fd >= 0, "cannot create %s", path);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!f) return -1;
  fputs(text, f);
  return fclose(f) == 0 ? 0 : -1;
}

static inline int test_summary(const char *name) {
  printf("%s: %d checks, %d failed\n", name, test_checks_, test_failures_);
  return test_failures_ ? 1 : 0;
}

#endif
