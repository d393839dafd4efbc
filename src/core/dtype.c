#include "ctrain/dtype.h"

#include "core/half_portable.h"

#include <string.h>
#include <strings.h>

#if defined(__F16C__)
#include <immintrin.h>
#endif

static const size_t sizes[CT_DTYPE_COUNT] = {4, 2, 2, 4, 8, 1, 8};
static const char *names[CT_DTYPE_COUNT] = {"f32", "f16", "bf16", "i32", "i64", "u8", "f64"};
static const char *st_names[CT_DTYPE_COUNT] = {"F32", "F16", "BF16", "I32", "I64", "U8", "F64"};

size_t ct_dtype_size(ct_dtype t) { return (unsigned)t < CT_DTYPE_COUNT ? sizes[t] : 0; }
const char *ct_dtype_name(ct_dtype t) { return (unsigned)t < CT_DTYPE_COUNT ? names[t] : NULL; }
const char *ct_dtype_safetensors_name(ct_dtype t) { return (unsigned)t < CT_DTYPE_COUNT ? st_names[t] : NULL; }

int ct_dtype_parse(const char *s, ct_dtype *out) {
  static const struct { const char *n; ct_dtype t; } tab[] = {
      {"f32", CT_F32},   {"fp32", CT_F32},  {"float32", CT_F32}, {"f16", CT_F16},      {"fp16", CT_F16},
      {"float16", CT_F16}, {"half", CT_F16}, {"bf16", CT_BF16},  {"bfloat16", CT_BF16}, {"i32", CT_I32},
      {"int32", CT_I32}, {"i64", CT_I64},   {"int64", CT_I64},   {"u8", CT_U8},         {"uint8", CT_U8},
      {"f64", CT_F64},   {"float64", CT_F64}};
  for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
    if (strcasecmp(s, tab[i].n) == 0) {
      *out = tab[i].t;
      return 0;
    }
  return -1;
}

int ct_dtype_from_safetensors(const char *s, ct_dtype *out) {
  for (int i = 0; i < CT_DTYPE_COUNT; i++)
    if (strcmp(s, st_names[i]) == 0) {
      *out = (ct_dtype)i;
      return 0;
    }
  return -1;
}

uint16_t ct_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                                           /* round to nearest even */
  return (uint16_t)(u >> 16);
}

float ct_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* f32 <-> f16 without branches, so that ct_convert's loops vectorise
 * (checked against the branching versions over all 2^32 floats and all
 * 65536 halves). To f16, round to nearest even: normal results add the
 * exponent rebias (-112 << 23) and a rounding constant to the bits;
 * subnormal ones (|f| < 2^-14) come from adding 0.5f, whose ulp is the f16
 * subnormal unit 2^-24, so the FPU rounds to it; |f| >= 65520 gives inf,
 * and a NaN stays a quiet NaN of the same sign. */
static inline uint16_t f32_to_f16_soft(float f) {
  uint32_t x, ax, su;
  float a, s;
  memcpy(&x, &f, 4);
  ax = x & 0x7fffffffu;
  memcpy(&a, &ax, 4);
  s = a + 0.5f;
  memcpy(&su, &s, 4);
  uint32_t sub = su - 0x3f000000u;
  uint32_t nrm = (ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13;
  uint32_t big = ax > 0x7f800000u ? 0x7e00u : 0x7c00u;
  uint32_t h = ax < 0x38800000u ? sub : ax >= 0x477ff000u ? big : nrm;
  return (uint16_t)(((x >> 16) & 0x8000u) | h);
}

/* Exact: rebias the exponent; inf/NaN keep exponent 255 and the payload;
 * a subnormal half is its mantissa as a normal float minus the implicit
 * 2^-14. */
static inline float f16_to_f32_soft(uint16_t h) {
  uint32_t em = (uint32_t)(h & 0x7fffu) << 13, exp = em & 0x0f800000u;
  uint32_t u = em + (112u << 23), su = em + (113u << 23);
  float sub;
  memcpy(&sub, &su, 4);
  sub -= 0x1p-14f;
  memcpy(&su, &sub, 4);
  u = exp == 0x0f800000u ? u + (112u << 23) : exp == 0 ? su : u;
  u |= (uint32_t)(h & 0x8000u) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Where the CPU has F16C (the build is -march=native), its instructions:
 * the same IEEE conversions (round to nearest even, a NaN stays a NaN of
 * its sign), and GCC does not vectorise the loops above, which made the
 * f16 conversions a large part of an fp16 training step
 * (docs/MIXED_PRECISION.md, "Kernels on the CPU"). Scalar and vector paths
 * use the same instructions, so they agree bit for bit, NaN payloads
 * included. */
#if defined(__F16C__)
static inline uint16_t f32_to_f16(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
static inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
#else
static inline uint16_t f32_to_f16(float f) { return f32_to_f16_soft(f); }
static inline float f16_to_f32(uint16_t h) { return f16_to_f32_soft(h); }
#endif

uint16_t ct_f32_to_f16(float f) { return f32_to_f16(f); }
float ct_f16_to_f32(uint16_t h) { return f16_to_f32(h); }
uint16_t ct_f32_to_f16_portable(float f) { return f32_to_f16_soft(f); }
float ct_f16_to_f32_portable(uint16_t h) { return f16_to_f32_soft(h); }

static double load(const void *p, ct_dtype t, size_t i) {
  switch (t) {
    case CT_F32: return ((const float *)p)[i];
    case CT_F64: return ((const double *)p)[i];
    case CT_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    case CT_BF16: return ct_bf16_to_f32(((const uint16_t *)p)[i]);
    case CT_I32: return ((const int32_t *)p)[i];
    case CT_I64: return (double)((const int64_t *)p)[i];
    case CT_U8: return ((const uint8_t *)p)[i];
    default: return 0;
  }
}

static void store(void *p, ct_dtype t, size_t i, double v) {
  switch (t) {
    case CT_F32: ((float *)p)[i] = (float)v; break;
    case CT_F64: ((double *)p)[i] = v; break;
    case CT_F16: ((uint16_t *)p)[i] = f32_to_f16((float)v); break;
    case CT_BF16: ((uint16_t *)p)[i] = ct_f32_to_bf16((float)v); break;
    case CT_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case CT_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case CT_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    default: break;
  }
}

void ct_convert(const void *src, ct_dtype st, void *dst, ct_dtype dt, size_t n) {
  if (st == dt) {
    memmove(dst, src, n * ct_dtype_size(st));
    return;
  }
  /* The hot pairs (the 16-bit widening and rounding around every op)
   * get direct, vectorisable loops; the rest go through double. */
#define DIRECT(S, D, TS, TD, FN)                                  \
  if (st == S && dt == D) {                                       \
    const TS *s = src;                                            \
    TD *d = dst;                                                  \
    _Pragma("omp parallel for if (n > 65536)")                    \
    for (size_t i = 0; i < n; i++) d[i] = FN(s[i]);               \
    return;                                                       \
  }
  DIRECT(CT_F32, CT_BF16, float, uint16_t, ct_f32_to_bf16)
  DIRECT(CT_BF16, CT_F32, uint16_t, float, ct_bf16_to_f32)
#if defined(__F16C__)
  /* Eight at a time; the tail one by one through the same instruction. */
#define F16C_BLOCKS(S, D, TS, TD, FN, VEC)                                                      \
  if (st == S && dt == D) {                                                                   \
    const TS *s = src;                                                                        \
    TD *d = dst;                                                                              \
    const size_t nb = n / 8;                                                                  \
    _Pragma("omp parallel for if (n > 65536)")                                                \
    for (size_t b = 0; b < nb; b++) VEC;                                                      \
    for (size_t i = nb * 8; i < n; i++) d[i] = FN(s[i]);                                      \
    return;                                                                                   \
  }
  F16C_BLOCKS(CT_F32, CT_F16, float, uint16_t, f32_to_f16,
              _mm_storeu_si128((__m128i *)(d + 8 * b),
                               _mm256_cvtps_ph(_mm256_loadu_ps(s + 8 * b), _MM_FROUND_TO_NEAREST_INT)))
  F16C_BLOCKS(CT_F16, CT_F32, uint16_t, float, f16_to_f32,
              _mm256_storeu_ps(d + 8 * b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 8 * b)))))
#undef F16C_BLOCKS
#else
  DIRECT(CT_F32, CT_F16, float, uint16_t, f32_to_f16)
  DIRECT(CT_F16, CT_F32, uint16_t, float, f16_to_f32)
#endif
#undef DIRECT
  if (st == CT_F32 && dt == CT_F64) {
    const float *s = src;
    double *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = s[i];
    return;
  }
  for (size_t i = 0; i < n; i++) store(dst, dt, i, load(src, st, i));
}
