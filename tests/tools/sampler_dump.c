/* Prints ctrain's sampler orders for tests/parity/test_sampler_torch.py,
 * which checks them against torch.randperm and DistributedSampler. Reads
 * one query per line from stdin and answers each with one line of
 * space-separated indices (empty for none):
 *
 *   perm N SEED                               ct_randperm(N, SEED)
 *   share N REPLICAS RANK SHUFFLE SEED EPOCH TAIL
 *                                             ct_sampler_indices of that
 *                                             sampler (TAIL 0 pad, 1 drop,
 *                                             2 exact) for EPOCH
 *
 * A query the sampler refuses answers "error: MESSAGE". One process serves
 * a whole test, so thousands of cases cost one start. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/data.h"

static void print_indices(const int64_t *v, int64_t n) {
  for (int64_t i = 0; i < n; i++) printf(i ? " %lld" : "%lld", (long long)v[i]);
  putchar('\n');
}

static int perm(long long n, unsigned long long seed) {
  int64_t *v = malloc(((size_t)n + 1) * sizeof *v);
  if (!v) return 1;
  ct_randperm(n, seed, v);
  print_indices(v, n);
  free(v);
  return 0;
}

static int share(const ct_sampler *s, long long epoch) {
  if (ct_sampler_check(s) != CT_OK) {
    printf("error: %s\n", ct_last_error());
    return 0;
  }
  int64_t count = ct_sampler_count(s);
  int64_t *work = malloc(((size_t)s->n + 1) * sizeof *work);
  int64_t *out = malloc(((size_t)count + 1) * sizeof *out);
  if (!work || !out) return 1;
  ct_sampler_indices(s, epoch, work, out);
  print_indices(out, count);
  free(work);
  free(out);
  return 0;
}

int main(void) {
  char line[512];
  while (fgets(line, sizeof line, stdin)) {
    long long n, epoch;
    unsigned long long seed;
    int replicas, rank, shuffle, tail, rc = 2;
    if (sscanf(line, "perm %lld %llu", &n, &seed) == 2 && n >= 0) {
      rc = perm(n, seed);
    } else if (sscanf(line, "share %lld %d %d %d %llu %lld %d", &n, &replicas, &rank, &shuffle, &seed, &epoch,
                      &tail) == 7 && n >= 0) {
      ct_sampler s = {.n = n, .num_replicas = replicas, .rank = rank, .shuffle = shuffle, .seed = seed, .tail = tail};
      rc = share(&s, epoch);
    } else {
      fprintf(stderr, "sampler_dump: cannot read query: %s", line);
    }
    if (rc != 0) {
      if (rc == 1) fprintf(stderr, "sampler_dump: out of memory\n");
      return rc;
    }
  }
  return fflush(stdout) != 0;
}
