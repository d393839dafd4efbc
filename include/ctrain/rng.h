/* Counter-based random numbers (Philox4x32-10).
 *
 * Every random number in ctrain is a pure function of (seed, stream, counter):
 * the stream packs what is being randomised (a layer's dropout at a given
 * step, the data order of an epoch, the initialisation of one parameter) and
 * the counter is the element index. The same mask is therefore produced on
 * any device, under any parallel strategy and after a resume, with no state
 * to carry beyond the seed and the step number.
 */
#ifndef CTRAIN_RNG_H
#define CTRAIN_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One Philox4x32-10 block: 4 random 32-bit words for (key, counter). */
void ct_philox4x32(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]);

/* nb consecutive blocks: block j (counter {c0 + j, c1, c2, c3}, c0 + j
 * wrapping in 32 bits) into out[4j .. 4j+3], the words ct_philox4x32
 * gives; with AVX2 eight blocks at a time. For bulk draws (fills,
 * dropout masks). */
void ct_philox4x32_blocks(const uint32_t key[2], uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, int nb,
                          uint32_t *out);

/* Stream identifiers: what a random draw is for. */
enum {
  CT_RNG_INIT = 1,     /* parameter initialisation: a = parameter index */
  CT_RNG_DROPOUT = 2,  /* dropout masks: a = layer index, b = step */
  CT_RNG_SHUFFLE = 3,  /* data order: a = epoch */
  CT_RNG_AUGMENT = 4,  /* data augmentation: a = epoch, b = sample */
  CT_RNG_DATA = 5,     /* synthetic data: a = sample */
  CT_RNG_TEST = 6
};

/* A generator positioned at element 0 of one stream. */
typedef struct ct_rng {
  uint32_t key[2];   /* from the seed */
  uint32_t ctr[4];   /* ctr[0] = element block, ctr[1] = kind, ctr[2..3] = a, b */
  uint32_t buf[4];
  int used;          /* words of buf already handed out (4 = empty) */
  int has_spare;     /* normal(): cached second Box-Muller value */
  double spare;
} ct_rng;

void ct_rng_init(ct_rng *r, uint64_t seed, uint32_t kind, uint32_t a, uint32_t b);
uint32_t ct_rng_u32(ct_rng *r);
/* Uniform in [0, 1) with 24 random bits (float) / 53 bits (double). */
float ct_rng_uniform(ct_rng *r);
double ct_rng_uniform_f64(ct_rng *r);
/* Standard normal by Box-Muller. */
double ct_rng_normal(ct_rng *r);
/* Bulk forms: out[i] is the i-th value a fresh generator
 * (ct_rng_init(seed, kind, a, b)) would give, bit for bit - the uniform
 * float, or the normal times scale rounded to float - computed a thousand
 * Philox blocks at a time and split across OpenMP threads. */
void ct_rng_fill_uniform(float *out, int64_t n, uint64_t seed, uint32_t kind, uint32_t a, uint32_t b);
void ct_rng_fill_normal(float *out, int64_t n, double scale, uint64_t seed, uint32_t kind, uint32_t a, uint32_t b);
/* Uniform integer in [0, n). */
uint32_t ct_rng_below(ct_rng *r, uint32_t n);

/* Random-access form used by kernels: the uniform float of element i of a
 * stream, without a generator object. Four consecutive elements share one
 * Philox block, so kernels that walk elements in order call it per element
 * at small cost; GPU kernels compute the same function. */
float ct_rng_uniform_at(uint64_t seed, uint32_t kind, uint32_t a, uint32_t b, uint64_t i);

#ifdef __cplusplus
}
#endif
#endif
