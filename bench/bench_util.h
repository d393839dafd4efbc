/* Timing helpers shared by the benchmark programs: wall and process CPU
 * clocks, and sorting/medians of sample arrays.
 *
 * Both clocks are printed by every program: on a shared, loaded machine
 * wall time is inflated by preemption, while CPU time / threads (with idle
 * OpenMP threads sleeping soon, as the ctrain command arranges) estimates
 * the uncontended wall time. */
#ifndef CTRAIN_BENCH_UTIL_H
#define CTRAIN_BENCH_UTIL_H

#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

/* Monotonic wall clock, seconds. */
static inline double bench_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Process CPU seconds, user + system, all threads. */
static inline double bench_cpu_now(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_sec +
         1e-6 * (double)u.ru_stime.tv_usec;
}

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Sorts v[0..n) ascending. */
static inline void bench_sort(double *v, int n) { qsort(v, (size_t)n, sizeof *v, bench_cmp_double); }

/* Median of v[0..n), n > 0; sorts v. */
static inline double bench_median(double *v, int n) {
  bench_sort(v, n);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
