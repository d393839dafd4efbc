/* The deterministic mutation loop behind the fuzz targets' ctest twins
 * (fuzz/README.md): libFuzzer needs clang, so each target's body is also
 * compiled into a unit test that feeds it valid seed inputs damaged in ways
 * parsers tend to mishandle: bits flipped, bytes replaced (by random,
 * boundary or format-significant values), big-endian 32-bit fields nudged,
 * the input cut short, extended, or a slice repeated or removed. Most
 * damage lands in the first `hot` bytes, where headers live. The body must
 * return 0 when an input is either rejected with a message or accepted and
 * usable, and nonzero on anything else; crashes, hangs and out-of-bounds
 * accesses show up as the test dying (ASan/valgrind make them certain).
 * CT_MUTATE_ITERS=N runs longer; the seed stream never changes, so a
 * failure reproduces with the same N. CT_FUZZ_SEED_DIR=DIR writes the
 * seeds there as a starting corpus for the libFuzzer target. */
#ifndef CTRAIN_TESTS_MUTATE_UTIL_H
#define CTRAIN_TESTS_MUTATE_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/ctrain.h"

typedef struct mutate_seed {
  const uint8_t *data;
  size_t n;
} mutate_seed;

typedef struct mutate_spec {
  const mutate_seed *seeds;
  int n_seeds;
  size_t hot;        /* bytes at the front that take most of the damage */
  const char *sig;   /* format-significant characters to write, or NULL */
  size_t cap;        /* largest mutated input */
  long iters;        /* default count; CT_MUTATE_ITERS overrides */
  /* A format's own damage, applied to one input in eight (or NULL). */
  void (*extra)(ct_rng *rng, uint8_t *buf, size_t n);
  /* The target's body: 0 when the input was handled consistently. */
  int (*one)(const uint8_t *data, size_t n);
} mutate_spec;

/* Applies one to four random mutations to buf[0..*n) in place (capacity
 * cap). */
static inline void mutate_once(ct_rng *rng, uint8_t *buf, size_t *n_io, size_t cap, size_t hot, const char *sig) {
  static const uint8_t edge[] = {0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff};
  size_t n = *n_io;
  int nmut = 1 + (int)ct_rng_below(rng, 4);
  for (int m = 0; m < nmut; m++) {
    uint32_t kind = ct_rng_below(rng, 9);
    size_t pos = n ? ct_rng_below(rng, (uint32_t)n) : 0;
    size_t h = hot < n ? hot : n;
    if (h && ct_rng_below(rng, 4) != 0) pos = ct_rng_below(rng, (uint32_t)h);
    switch (kind) {
      case 0: if (n) buf[pos] ^= (uint8_t)(1u << ct_rng_below(rng, 8)); break;
      case 1: if (n) buf[pos] = (uint8_t)ct_rng_u32(rng); break;
      case 2: if (n) buf[pos] = edge[ct_rng_below(rng, sizeof edge)]; break;
      case 3: /* a character the format gives meaning to */
        if (n && sig && sig[0]) buf[pos] = (uint8_t)sig[ct_rng_below(rng, (uint32_t)strlen(sig))];
        break;
      case 4: { /* a big-endian 32-bit field off by a little, or extreme */
        size_t at = pos & ~(size_t)3;
        if (at + 4 > n) break;
        uint32_t v = (uint32_t)buf[at] << 24 | (uint32_t)buf[at + 1] << 16 | (uint32_t)buf[at + 2] << 8 | buf[at + 3];
        uint32_t r = ct_rng_below(rng, 4);
        v = r == 0 ? 0u : r == 1 ? 0xffffffffu : r == 2 ? v * 2u : v + (uint32_t)((int)ct_rng_below(rng, 9) - 4);
        for (int k = 0; k < 4; k++) buf[at + (size_t)k] = (uint8_t)(v >> (24 - 8 * k));
        break;
      }
      case 5: n = pos; break; /* cut short */
      case 6: { /* extend with random bytes */
        size_t add = 1 + ct_rng_below(rng, 64);
        for (size_t k = 0; k < add && n < cap; k++) buf[n++] = (uint8_t)ct_rng_u32(rng);
        break;
      }
      case 7: { /* repeat a slice */
        size_t len = 1 + ct_rng_below(rng, 32);
        if (pos + len <= n && n + len <= cap) {
          memmove(buf + pos + len, buf + pos, n - pos);
          n += len;
        }
        break;
      }
      case 8: { /* remove a slice */
        size_t len = 1 + ct_rng_below(rng, 32);
        if (pos + len <= n) {
          memmove(buf + pos, buf + pos + len, n - pos - len);
          n -= len;
        }
        break;
      }
    }
  }
  *n_io = n;
}

/* An `extra` for formats led by a little-endian u64 length (safetensors'
 * header size): that length off by a little. */
static inline void mutate_le64_prefix(ct_rng *rng, uint8_t *buf, size_t n) {
  uint64_t v = 0;
  for (int k = 7; k >= 0; k--) v = v << 8 | (n > (size_t)k ? buf[k] : 0);
  v += (uint64_t)((int)ct_rng_below(rng, 17) - 8);
  for (int k = 0; k < 8 && (size_t)k < n; k++) buf[k] = (uint8_t)(v >> (8 * k));
}

/* Runs the body on each seed unmodified, then on `iters` mutated copies.
 * Returns the number of inputs it reported as inconsistent. (Whether the
 * seeds are accepted is for the caller to check: the body only says an
 * input was handled consistently.) */
static inline int mutate_run(const char *name, const mutate_spec *sp) {
  ct_rng rng;
  ct_rng_init(&rng, 5, CT_RNG_TEST, 4, 0);
  int failures = 0;
  size_t cap = sp->cap;
  for (int i = 0; i < sp->n_seeds; i++) {
    if (sp->seeds[i].n > cap) cap = sp->seeds[i].n;
    ct_error_clear();
    if (sp->one(sp->seeds[i].data, sp->seeds[i].n) != 0) {
      printf("%s: seed %d: inconsistent result: %s\n", name, i, ct_last_error());
      failures++;
    }
  }
  /* CT_FUZZ_SEED_DIR=DIR: the seeds also go there, a libFuzzer corpus. */
  const char *seed_dir = getenv("CT_FUZZ_SEED_DIR");
  for (int i = 0; seed_dir && i < sp->n_seeds; i++) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s-%d", seed_dir, name, i);
    FILE *f = fopen(p, "wb");
    if (f) fwrite(sp->seeds[i].data, 1, sp->seeds[i].n, f), fclose(f);
  }
  long iters = sp->iters;
  const char *env = getenv("CT_MUTATE_ITERS");
  if (env) iters = atol(env);
  uint8_t *buf = malloc(cap + 1);
  if (!buf) return failures + 1;
  for (long it = 0; it < iters; it++) {
    const mutate_seed *s = &sp->seeds[ct_rng_below(&rng, (uint32_t)sp->n_seeds)];
    size_t n = s->n;
    memcpy(buf, s->data, n);
    mutate_once(&rng, buf, &n, cap, sp->hot, sp->sig);
    if (sp->extra && ct_rng_below(&rng, 8) == 0) sp->extra(&rng, buf, n);
    /* An exact-size copy, as libFuzzer hands over: a read past the input's
     * end then leaves the allocation, where ASan and valgrind see it. */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) break;
    memcpy(exact, buf, n);
    ct_error_clear();
    if (sp->one(exact, n) != 0 && failures++ < 5)
      printf("%s: iteration %ld: inconsistent result: %s\n", name, it, ct_last_error());
    free(exact);
  }
  free(buf);
  printf("%s: %d seeds, %ld mutated inputs, %d inconsistent\n", name, sp->n_seeds, iters, failures);
  return failures;
}

#endif
