/* Elementwise ops of the CPU backend as OpenMP loops: activations and
 * their gradients, dropout, add, axpby, fill, cast. Activations, dropout
 * and add take f32 and bf16 natively (mixed precision's hot path), fill
 * and cast any dtype, axpby f32; other dtypes go to the reference. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"
#include "ctrain/rng.h"

/* Below this many elements a parallel region costs more than it saves. */
#define PAR_MIN 32768

static inline float gelu(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
static inline float sigm(float x) { return 1.f / (1.f + expf(-x)); }

/* f32 and bf16 (any mix per tensor) run the same f32 loop over chunks of
 * CHUNK elements: a bf16 operand is widened into a per-thread stack buffer
 * that stays in L1, and a bf16 result is rounded back from one. Unlike the
 * reference's widening path (whole-tensor f32 copies, allocated per call),
 * that costs no allocation and no extra trip through memory. */
#define CHUNK 2048

static int f32_or_bf16(const ct_tensor *t) { return !t || t->dtype == CT_F32 || t->dtype == CT_BF16; }

static const float *chunk_in(const ct_tensor *t, int64_t lo, int64_t len, float *buf) {
  if (!t) return NULL;
  if (t->dtype == CT_F32) return (const float *)t->data + lo;
  const uint16_t *s = (const uint16_t *)t->data + lo;
#pragma omp simd
  for (int64_t i = 0; i < len; i++) buf[i] = cpu_bf16_ld(s[i]);
  return buf;
}

static float *chunk_out(ct_tensor *t, int64_t lo, float *buf) {
  return t->dtype == CT_F32 ? (float *)t->data + lo : buf;
}

static void chunk_done(ct_tensor *t, int64_t lo, int64_t len, const float *buf) {
  if (t->dtype == CT_F32) return;
  uint16_t *o = (uint16_t *)t->data + lo;
#pragma omp simd
  for (int64_t i = 0; i < len; i++) o[i] = cpu_bf16_st(buf[i]);
}

static void act_span(ct_act act, float alpha, const float *in, float *out, int64_t n) {
  switch (act) {
    case CT_ACT_NONE:
      if (out != in) memmove(out, in, (size_t)n * 4);
      break;
    case CT_ACT_RELU:
#pragma omp simd
      for (int64_t i = 0; i < n; i++) out[i] = in[i] > 0.f || in[i] != in[i] ? in[i] : 0.f; /* NaN stays NaN */
      break;
    case CT_ACT_LEAKY_RELU:
#pragma omp simd
      for (int64_t i = 0; i < n; i++) out[i] = in[i] > 0.f ? in[i] : alpha * in[i];
      break;
    case CT_ACT_GELU:
#pragma omp simd
      for (int64_t i = 0; i < n; i++) out[i] = gelu(in[i]);
      break;
    case CT_ACT_SILU:
#pragma omp simd
      for (int64_t i = 0; i < n; i++) out[i] = in[i] * sigm(in[i]);
      break;
    case CT_ACT_SIGMOID:
#pragma omp simd
      for (int64_t i = 0; i < n; i++) out[i] = sigm(in[i]);
      break;
    case CT_ACT_TANH:
#pragma omp simd
      for (int64_t i = 0; i < n; i++) out[i] = tanhf(in[i]);
      break;
    default:
      break;
  }
}

ct_status cpu_act_fwd(ct_device *d, ct_act act, float alpha, const ct_tensor *x, ct_tensor *y) {
  if (!f32_or_bf16(x) || !f32_or_bf16(y)) REF_OR(act_fwd, d, act, alpha, x, y);
  if ((int)act < 0 || act >= CT_ACT_COUNT)
    return ct_error(CT_ERR_INVALID_ARG, "act_fwd: unknown activation %d", (int)act);
  int64_t n = ct_tensor_numel(x), nc = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(cpu_nthreads(d)) if (n > PAR_MIN) schedule(static)
  for (int64_t c = 0; c < nc; c++) {
    float bi[CHUNK], bo[CHUNK];
    int64_t lo = c * CHUNK, len = n - lo < CHUNK ? n - lo : CHUNK;
    float *o = chunk_out(y, lo, bo);
    act_span(act, alpha, chunk_in(x, lo, len, bi), o, len);
    chunk_done(y, lo, len, o);
  }
  return CT_OK;
}

static void act_bwd_span(ct_act act, float alpha, const float *xi, const float *yo, const float *g, float *o,
                         int64_t n) {
  switch (act) {
    case CT_ACT_NONE:
      if (o != g) memmove(o, g, (size_t)n * 4);
      break;
    case CT_ACT_RELU:
#pragma omp simd
      for (int64_t i = 0; i < n; i++) o[i] = !(yo[i] <= 0.f) ? g[i] : 0.f; /* torch: y <= 0 ? 0 : dy, NaN passes */
      break;
    case CT_ACT_LEAKY_RELU:
#pragma omp simd
      for (int64_t i = 0; i < n; i++) o[i] = xi[i] > 0.f ? g[i] : alpha * g[i];
      break;
    case CT_ACT_GELU:
#pragma omp simd
      for (int64_t i = 0; i < n; i++) {
        float v = xi[i];
        float cdf = 0.5f * (1.f + erff(v * 0.70710678118654752f));
        float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
        o[i] = g[i] * (cdf + v * pdf);
      }
      break;
    case CT_ACT_SILU:
#pragma omp simd
      for (int64_t i = 0; i < n; i++) {
        float s = sigm(xi[i]);
        o[i] = g[i] * s * (1.f + xi[i] * (1.f - s));
      }
      break;
    case CT_ACT_SIGMOID:
#pragma omp simd
      for (int64_t i = 0; i < n; i++) o[i] = g[i] * yo[i] * (1.f - yo[i]);
      break;
    case CT_ACT_TANH:
#pragma omp simd
      for (int64_t i = 0; i < n; i++) o[i] = g[i] * (1.f - yo[i] * yo[i]);
      break;
    default:
      break;
  }
}

ct_status cpu_act_bwd(ct_device *d, ct_act act, float alpha, const ct_tensor *x, const ct_tensor *y,
                      const ct_tensor *dy, ct_tensor *dx) {
  if (!f32_or_bf16(x) || !f32_or_bf16(y) || !f32_or_bf16(dy) || !f32_or_bf16(dx))
    REF_OR(act_bwd, d, act, alpha, x, y, dy, dx);
  if ((int)act < 0 || act >= CT_ACT_COUNT)
    return ct_error(CT_ERR_INVALID_ARG, "act_bwd: unknown activation %d", (int)act);
  if ((CT_ACT_BWD_NEEDS_X(act) && !x) || (CT_ACT_BWD_NEEDS_Y(act) && !y))
    return ct_error(CT_ERR_INVALID_ARG, "act_bwd: activation %d needs its %s", (int)act,
                    CT_ACT_BWD_NEEDS_X(act) ? "input x" : "output y");
  /* Only what the activation reads is widened. */
  const ct_tensor *xs = CT_ACT_BWD_NEEDS_X(act) ? x : NULL, *ys = CT_ACT_BWD_NEEDS_Y(act) ? y : NULL;
  int64_t n = ct_tensor_numel(dy), nc = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(cpu_nthreads(d)) if (n > PAR_MIN) schedule(static)
  for (int64_t c = 0; c < nc; c++) {
    float bx[CHUNK], by[CHUNK], bg[CHUNK], bo[CHUNK];
    int64_t lo = c * CHUNK, len = n - lo < CHUNK ? n - lo : CHUNK;
    float *o = chunk_out(dx, lo, bo);
    act_bwd_span(act, alpha, chunk_in(xs, lo, len, bx), chunk_in(ys, lo, len, by), chunk_in(dy, lo, len, bg), o,
                 len);
    chunk_done(dx, lo, len, o);
  }
  return CT_OK;
}

/* Applies the dropout mask of (key) to in -> out. Philox block b gives
 * the uniforms of mask elements 4b..4b+3, exactly as ct_rng_uniform_at()
 * computes them one by one; a task draws DROP_BLOCKS blocks at once
 * (ct_philox4x32_blocks: eight side by side with AVX2), and a mask of
 * one element per value is applied in a vectorised loop (keep_f32 below),
 * far faster than one block at a time with a branch per element
 * (docs/ARCHITECTURE.md, "Dropout masks are regenerated"). Tasks start
 * at multiples of DROP_BLOCKS, so a task's blocks share the counter's
 * high word (b >> 32, packed into ctr[1]). Kept values are scaled in
 * double and rounded once, as the reference does, so the results are
 * bit-identical and not just within tolerance (bf16: then rounded to bf16
 * once more, as the widening path would). LD/ST read and write one
 * element of the tensor's dtype, KEEP masks a stored one; group > 1 shares one mask element among
 * that many consecutive values. */
enum { DROP_BLOCKS = 256 };
/* A value's bits and'ed with an all-ones or all-zeros mask: +0 where the
 * mask drops it. A select of 0 or the value would not vectorise: under
 * gcc's default trapping math it does not compute the scaled value for
 * an element it drops, so the loop keeps a branch and runs several times
 * slower. */
static inline float keep_f32(float v, uint32_t mask) {
  uint32_t b;
  memcpy(&b, &v, sizeof b);
  b &= mask;
  memcpy(&v, &b, sizeof v);
  return v;
}
static inline uint16_t keep_bf16(uint16_t v, uint32_t mask) { return (uint16_t)(v & mask); }
#define DROPOUT_APPLY(NAME, T, LD, ST, KEEP)                                                                     \
  static void NAME(int nt, float p, int64_t group, ct_dropout_key key, const T *in, T *out, int64_t n) {         \
    if (group < 1) group = 1;                                                                                    \
    const int64_t nm = (n + group - 1) / group, nb = (nm + 3) / 4;                                               \
    const int64_t tasks = (nb + DROP_BLOCKS - 1) / DROP_BLOCKS;                                                  \
    const double scale = p < 1.f ? 1.0 / (1.0 - (double)p) : 0.0;                                                \
    const uint32_t k[2] = {(uint32_t)key.seed, (uint32_t)(key.seed >> 32)};                                      \
    _Pragma("omp parallel for num_threads(nt) if (n > PAR_MIN) schedule(static)")                               \
    for (int64_t t = 0; t < tasks; t++) {                                                                        \
      uint32_t r[4 * DROP_BLOCKS];                                                                               \
      const int64_t b0 = t * DROP_BLOCKS, nbt = nb - b0 < DROP_BLOCKS ? nb - b0 : DROP_BLOCKS;                   \
      ct_philox4x32_blocks(k, (uint32_t)b0, CT_RNG_DROPOUT ^ ((uint32_t)(b0 >> 32) << 8), key.layer, key.step,  \
                           (int)nbt, r);                                                                         \
      const int64_t j0 = 4 * b0, j1 = j0 + 4 * nbt < nm ? j0 + 4 * nbt : nm;                                     \
      if (group == 1) {                                                                                          \
        const T *restrict ip = in + j0;                                                                          \
        T *restrict op = out + j0;                                                                               \
        for (int64_t j = 0; j < j1 - j0; j++) {                                                                  \
          const float u = (float)(r[j] >> 8) * (1.0f / 16777216.0f);                                            \
          op[j] = KEEP(ST((float)((double)LD(ip[j]) * scale)), -(uint32_t)!(u < p));                             \
        }                                                                                                        \
        continue;                                                                                                \
      }                                                                                                          \
      for (int64_t j = j0; j < j1; j++) {                                                                        \
        const float u = (float)(r[j - j0] >> 8) * (1.0f / 16777216.0f);                                         \
        const int64_t lo = j * group, hi = lo + group < n ? lo + group : n;                                      \
        if (u < p) {                                                                                             \
          for (int64_t i = lo; i < hi; i++) out[i] = ST(0.f);                                                    \
        } else {                                                                                                 \
          for (int64_t i = lo; i < hi; i++) out[i] = ST((float)((double)LD(in[i]) * scale));                     \
        }                                                                                                        \
      }                                                                                                          \
    }                                                                                                            \
  }

#define F32_ID(v) (v)
DROPOUT_APPLY(dropout_f32, float, F32_ID, F32_ID, keep_f32)
DROPOUT_APPLY(dropout_bf16, uint16_t, cpu_bf16_ld, cpu_bf16_st, keep_bf16)

/* A batch that is part of a step's whole batch (data parallel): its
 * masks are drawn by number, one counter block each; 4x the Philox work
 * of the whole-batch kernels, on what is one rank's share of it. */
#define DROPOUT_SPAN(NAME, T, LD, ST)                                                                          \
  static void NAME(int nt, float p, int64_t group, ct_dropout_key key, const T *in, T *out, int64_t n) {       \
    if (group < 1) group = 1;                                                                                  \
    const int64_t nm = (n + group - 1) / group;                                                                \
    const double scale = p < 1.f ? 1.0 / (1.0 - (double)p) : 0.0;                                              \
    _Pragma("omp parallel for num_threads(nt) if (n > PAR_MIN) schedule(static)")                             \
    for (int64_t j = 0; j < nm; j++) {                                                                         \
      const float u = ct_rng_uniform_at(key.seed, CT_RNG_DROPOUT, key.layer, key.step,                          \
                                        ct_dropout_mask_index(&key, (uint64_t)j));                              \
      const int64_t lo = j * group, hi = lo + group < n ? lo + group : n;                                      \
      for (int64_t i = lo; i < hi; i++) out[i] = u < p ? ST(0.f) : ST((float)((double)LD(in[i]) * scale));     \
    }                                                                                                          \
  }
DROPOUT_SPAN(dropout_span_f32, float, F32_ID, F32_ID)
DROPOUT_SPAN(dropout_span_bf16, uint16_t, cpu_bf16_ld, cpu_bf16_st)

static ct_status dropout_run(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *x,
                             ct_tensor *y) {
  if (!ct_dropout_key_whole(&key) && p > 0.f && p < 1.f) {
    if (x->dtype == CT_F32) dropout_span_f32(cpu_nthreads(d), p, group, key, x->data, y->data, ct_tensor_numel(x));
    else dropout_span_bf16(cpu_nthreads(d), p, group, key, x->data, y->data, ct_tensor_numel(x));
    return CT_OK;
  }
  if (x->dtype == CT_F32)
    dropout_f32(cpu_nthreads(d), p, group, key, x->data, y->data, ct_tensor_numel(x));
  else
    dropout_bf16(cpu_nthreads(d), p, group, key, x->data, y->data, ct_tensor_numel(x));
  return CT_OK;
}

static int dropout_ok(const ct_tensor *x, const ct_tensor *y) {
  return x->dtype == y->dtype && (x->dtype == CT_F32 || x->dtype == CT_BF16);
}

ct_status cpu_dropout_fwd(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *x,
                          ct_tensor *y) {
  if (!dropout_ok(x, y)) REF_OR(dropout_fwd, d, p, group, key, x, y);
  return dropout_run(d, p, group, key, x, y);
}

ct_status cpu_dropout_bwd(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *dy,
                          ct_tensor *dx) {
  if (!dropout_ok(dy, dx)) REF_OR(dropout_bwd, d, p, group, key, dy, dx);
  return dropout_run(d, p, group, key, dy, dx);
}

ct_status cpu_add(ct_device *d, const ct_tensor *a, const ct_tensor *b, ct_act act, ct_tensor *y) {
  if (!f32_or_bf16(a) || !f32_or_bf16(b) || !f32_or_bf16(y)) REF_OR(add, d, a, b, act, y);
  if ((int)act < 0 || act >= CT_ACT_COUNT) return ct_error(CT_ERR_INVALID_ARG, "add: unknown activation %d", (int)act);
  int64_t n = ct_tensor_numel(y), nc = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(cpu_nthreads(d)) if (n > PAR_MIN) schedule(static)
  for (int64_t c = 0; c < nc; c++) {
    float ba[CHUNK], bb[CHUNK], bo[CHUNK];
    int64_t lo = c * CHUNK, len = n - lo < CHUNK ? n - lo : CHUNK;
    const float *pa = chunk_in(a, lo, len, ba), *pb = chunk_in(b, lo, len, bb);
    float *o = chunk_out(y, lo, bo);
#pragma omp simd
    for (int64_t i = 0; i < len; i++) o[i] = pa[i] + pb[i];
    act_span(act, 0.01f, o, o, len); /* the fused activations' leaky slope, as the reference */
    chunk_done(y, lo, len, o);
  }
  return CT_OK;
}

ct_status cpu_axpby(ct_device *d, float alpha, const ct_tensor *x, float beta, ct_tensor *y) {
  if (x->dtype != CT_F32 || y->dtype != CT_F32) REF_OR(axpby, d, alpha, x, beta, y);
  const float *px = x->data;
  float *py = y->data;
  int64_t n = ct_tensor_numel(y);
  int nt = cpu_nthreads(d);
  if (beta == 0.f) {
#pragma omp parallel for simd num_threads(nt) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) py[i] = alpha * px[i];
  } else {
#pragma omp parallel for simd num_threads(nt) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) py[i] = alpha * px[i] + beta * py[i];
  }
  return CT_OK;
}

ct_status cpu_fill(ct_device *d, ct_tensor *x, float value) {
  int64_t n = ct_tensor_numel(x);
  int nt = cpu_nthreads(d);
  if (x->dtype == CT_F32) {
    float *p = x->data;
#pragma omp parallel for simd num_threads(nt) if (n > PAR_MIN)
    for (int64_t i = 0; i < n; i++) p[i] = value;
    return CT_OK;
  }
  size_t es = ct_dtype_size(x->dtype);
  unsigned char one[8];
  ct_convert(&value, CT_F32, one, x->dtype, 1);
  unsigned char *p = x->data;
#pragma omp parallel for num_threads(nt) if (n > PAR_MIN)
  for (int64_t i = 0; i < n; i++) memcpy(p + (size_t)i * es, one, es);
  return CT_OK;
}

ct_status cpu_cast(ct_device *d, const ct_tensor *x, ct_tensor *y) {
  int64_t n = ct_tensor_numel(x);
  if (n != ct_tensor_numel(y))
    return ct_error(CT_ERR_SHAPE, "cast: %lld elements into %lld", (long long)n, (long long)ct_tensor_numel(y));
  if (x->layout != y->layout)
    return ct_error(CT_ERR_UNSUPPORTED, "cast: layout %d into %d; the cpu's cast keeps the layout", (int)x->layout,
                    (int)y->layout);
  size_t si = ct_dtype_size(x->dtype), so = ct_dtype_size(y->dtype);
  int nt = cpu_nthreads(d);
  const int64_t chunk = 16384;
  int64_t nc = (n + chunk - 1) / chunk;
#pragma omp parallel for num_threads(nt) if (n > PAR_MIN)
  for (int64_t c = 0; c < nc; c++) {
    int64_t lo = c * chunk, len = lo + chunk < n ? chunk : n - lo;
    ct_convert((const char *)x->data + (size_t)lo * si, x->dtype, (char *)y->data + (size_t)lo * so, y->dtype,
               (size_t)len);
  }
  return CT_OK;
}
