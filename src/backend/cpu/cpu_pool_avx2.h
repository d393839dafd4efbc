/* The AVX2 steps the cpu backend's max-pool loops share
 * (cpu_maxpool_tiles.c, cpu_maxpool_windows.c): the selection rule on 8
 * lanes, and 8 argmax lanes stored as bytes. Include only under __AVX2__.
 * The rule is the reference's: a value replaces the running maximum when
 * it is greater or NaN, so the first maximum wins and the last NaN. */
#ifndef CTRAIN_CPU_POOL_AVX2_H
#define CTRAIN_CPU_POOL_AVX2_H

#include <immintrin.h>
#include <stdint.h>

/* Replace (m, k) by (v, idx) in the lanes where v > m or v is NaN. */
static inline void pool_sel8(__m256 v, int idx, __m256 *m, __m256i *k) {
  __m256 t = _mm256_or_ps(_mm256_cmp_ps(v, *m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  *m = _mm256_blendv_ps(*m, v, t);
  *k = _mm256_blendv_epi8(*k, _mm256_set1_epi32(idx), _mm256_castps_si256(t));
}

/* 8 int32 lanes (values 0..255) as 8 bytes at p. */
static inline void pool_store_k8(uint8_t *p, __m256i k) {
  __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
  _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(w, w));
}

#endif
