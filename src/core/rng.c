/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11) and the small helpers built on it. */
#include "ctrain/rng.h"

#include <math.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
  uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
}

void ct_philox4x32(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; round++) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo(PHILOX_M0, c0, &hi0);
    uint32_t lo1 = mulhilo(PHILOX_M1, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0;
    uint32_t n1 = lo1;
    uint32_t n2 = hi0 ^ c3 ^ k1;
    uint32_t n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += PHILOX_W0;
    k1 += PHILOX_W1;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

void ct_rng_init(ct_rng *r, uint64_t seed, uint32_t kind, uint32_t a, uint32_t b) {
  r->key[0] = (uint32_t)seed;
  r->key[1] = (uint32_t)(seed >> 32);
  r->ctr[0] = 0;
  r->ctr[1] = kind;
  r->ctr[2] = a;
  r->ctr[3] = b;
  r->used = 4;
  r->has_spare = 0;
  r->spare = 0.0;
}

uint32_t ct_rng_u32(ct_rng *r) {
  if (r->used == 4) {
    ct_philox4x32(r->key, r->ctr, r->buf);
    r->ctr[0]++;
    r->used = 0;
  }
  return r->buf[r->used++];
}

/* Word -> value maps shared by the generator and the bulk fills, so both
 * give the same bits. */
static inline float word_uniform(uint32_t w) { return (float)(w >> 8) * (1.0f / 16777216.0f); }

static inline double words_uniform_f64(uint32_t w0, uint32_t w1) {
  uint64_t hi = w0 >> 5, lo = w1 >> 6;
  return (double)(hi * 67108864.0 + lo) * (1.0 / 9007199254740992.0);
}

/* Box-Muller on four words: the first value from the cosine, the second
 * from the sine. */
static inline void box_muller(const uint32_t w[4], double *z0, double *z1) {
  double u1 = words_uniform_f64(w[0], w[1]), u2 = words_uniform_f64(w[2], w[3]);
  if (u1 < 1e-300) u1 = 1e-300;
  double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
  *z0 = rad * cos(th);
  *z1 = rad * sin(th);
}

float ct_rng_uniform(ct_rng *r) { return word_uniform(ct_rng_u32(r)); }

double ct_rng_uniform_f64(ct_rng *r) {
  uint32_t w0 = ct_rng_u32(r);
  return words_uniform_f64(w0, ct_rng_u32(r));
}

double ct_rng_normal(ct_rng *r) {
  if (r->has_spare) {
    r->has_spare = 0;
    return r->spare;
  }
  uint32_t w[4];
  for (int i = 0; i < 4; i++) w[i] = ct_rng_u32(r);
  double z0;
  box_muller(w, &z0, &r->spare);
  r->has_spare = 1;
  return z0;
}

/* The bulk fills work in tasks of FILL_BLOCKS Philox blocks: a fresh
 * generator hands out block k's words as elements 4k..4k+3 (uniform) and
 * turns block k into normals 2k, 2k+1, so a task starting at block k0
 * produces exactly the generator's values there, on any thread. */
enum { FILL_BLOCKS = 1024 };

/* One block's ten rounds are a serial chain of multiplies; with AVX2,
 * eight blocks run side by side, each 32-bit word in a 64-bit lane
 * (vpmuludq gives the full product), which is the same arithmetic as
 * ct_philox4x32. */
void ct_philox4x32_blocks(const uint32_t key[2], uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, int nb,
                          uint32_t *w) {
  int j = 0;
#if defined(__AVX2__)
  const __m256i lo32 = _mm256_set1_epi64x(0xffffffffll), m0 = _mm256_set1_epi64x(PHILOX_M0),
                m1 = _mm256_set1_epi64x(PHILOX_M1);
  for (; j + 8 <= nb; j += 8) {
    __m256i v0[2], v1[2], v2[2], v3[2];
    for (int h = 0; h < 2; h++) {
      const uint32_t f = c0 + (uint32_t)(j + 4 * h);
      v0[h] = _mm256_setr_epi64x(f, (uint32_t)(f + 1), (uint32_t)(f + 2), (uint32_t)(f + 3));
      v1[h] = _mm256_set1_epi64x(c1), v2[h] = _mm256_set1_epi64x(c2), v3[h] = _mm256_set1_epi64x(c3);
    }
    uint32_t r0 = key[0], r1 = key[1];
    for (int round = 0; round < 10; round++) {
      const __m256i kk0 = _mm256_set1_epi64x(r0), kk1 = _mm256_set1_epi64x(r1);
      for (int h = 0; h < 2; h++) {
        const __m256i p0 = _mm256_mul_epu32(v0[h], m0), p1 = _mm256_mul_epu32(v2[h], m1);
        v0[h] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), v1[h]), kk0);
        v2[h] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), v3[h]), kk1);
        v1[h] = _mm256_and_si256(p1, lo32);
        v3[h] = _mm256_and_si256(p0, lo32);
      }
      r0 += PHILOX_W0;
      r1 += PHILOX_W1;
    }
    for (int h = 0; h < 2; h++) {
      uint64_t q0[4], q1[4], q2[4], q3[4];
      _mm256_storeu_si256((__m256i *)q0, v0[h]), _mm256_storeu_si256((__m256i *)q1, v1[h]);
      _mm256_storeu_si256((__m256i *)q2, v2[h]), _mm256_storeu_si256((__m256i *)q3, v3[h]);
      for (int l = 0; l < 4; l++) {
        uint32_t *o = w + 4 * (j + 4 * h + l);
        o[0] = (uint32_t)q0[l], o[1] = (uint32_t)q1[l], o[2] = (uint32_t)q2[l], o[3] = (uint32_t)q3[l];
      }
    }
  }
#endif
  for (; j < nb; j++) {
    const uint32_t ctr[4] = {c0 + (uint32_t)j, c1, c2, c3};
    ct_philox4x32(key, ctr, w + 4 * j);
  }
}

/* One task loop for both fills: a block gives 4 uniforms or 2 normals
 * (vpb values); a task covers FILL_BLOCKS blocks. */
static void fill(float *out, int64_t n, int normal, double scale, uint64_t seed, uint32_t kind, uint32_t a,
                 uint32_t b) {
  const int vpb = normal ? 2 : 4;
  const int64_t per = (int64_t)vpb * FILL_BLOCKS, tasks = (n + per - 1) / per;
#pragma omp parallel for schedule(static) if (n > 16384 * vpb)
  for (int64_t t = 0; t < tasks; t++) {
    uint32_t w[4 * FILL_BLOCKS];
    const int64_t i0 = t * per, m = n - i0 < per ? n - i0 : per;
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    ct_philox4x32_blocks(key, (uint32_t)(i0 / vpb), kind, a, b, (int)((m + vpb - 1) / vpb), w);
    if (!normal) {
      for (int64_t i = 0; i < m; i++) out[i0 + i] = word_uniform(w[i]);
      continue;
    }
    for (int64_t i = 0; i < m; i += 2) {
      double z0, z1;
      box_muller(w + 2 * i, &z0, &z1);
      out[i0 + i] = (float)(z0 * scale);
      if (i + 1 < m) out[i0 + i + 1] = (float)(z1 * scale);
    }
  }
}

void ct_rng_fill_uniform(float *out, int64_t n, uint64_t seed, uint32_t kind, uint32_t a, uint32_t b) {
  fill(out, n, 0, 1.0, seed, kind, a, b);
}

void ct_rng_fill_normal(float *out, int64_t n, double scale, uint64_t seed, uint32_t kind, uint32_t a, uint32_t b) {
  fill(out, n, 1, scale, seed, kind, a, b);
}

uint32_t ct_rng_below(ct_rng *r, uint32_t n) {
  /* Lemire's multiply-shift with rejection: unbiased. */
  uint64_t m = (uint64_t)ct_rng_u32(r) * n;
  uint32_t l = (uint32_t)m;
  if (l < n) {
    uint32_t t = (uint32_t)(-n) % n;
    while (l < t) {
      m = (uint64_t)ct_rng_u32(r) * n;
      l = (uint32_t)m;
    }
  }
  return (uint32_t)(m >> 32);
}

float ct_rng_uniform_at(uint64_t seed, uint32_t kind, uint32_t a, uint32_t b, uint64_t i) {
  /* Element i lives in block i/4, word i%4; the block index's high bits go
   * into the kind word so tensors beyond 2^34 elements stay distinct. */
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  uint64_t blk = i >> 2;
  uint32_t ctr[4] = {(uint32_t)blk, kind ^ ((uint32_t)(blk >> 32) << 8), a, b};
  uint32_t out[4];
  ct_philox4x32(key, ctr, out);
  return word_uniform(out[i & 3]);
}
