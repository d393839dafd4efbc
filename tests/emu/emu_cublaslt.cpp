/* The CUDA emulator's cuBLASLt (tests only): the cublasLt* calls that
 * src/backend/cuda/cuda_blas.c and cuda_device.c make, with the documented
 * semantics, run on the CPU (see emu.h for the model).
 *
 * What is implemented: D = epilogue(alpha * op(A) op(B) + beta * C [+ bias])
 * on column-major layouts with leading dimensions and strided batches;
 * op N or T; A and B of one type (f32, f16 or bf16), C and D of one type
 * (that type or f32); compute CUBLAS_COMPUTE_32F or _32F_FAST_TF32 (f32
 * inputs rounded to TF32 as tensor cores read them), scale type f32,
 * alpha/beta host or device pointers; epilogues DEFAULT, RELU, BIAS and
 * RELU_BIAS (bias of D's type, one value per row of D, added before the
 * ReLU). Every other attribute or value is refused with
 * CUBLAS_STATUS_NOT_SUPPORTED, so nothing that would change results is
 * silently ignored; each refusal also says why on stderr.
 *
 * Numerics: products are summed in double from the exact input values,
 * then alpha, beta*C and the bias are applied in double and the result is
 * rounded once to D's type (round to nearest even). beta == 0 does not
 * read C (BLAS semantics: C may hold garbage).
 *
 * What it checks beyond the math: every matrix, the bias, a device-mode
 * alpha/beta and the workspace are device memory (ct_emu::check_device_range,
 * at the call and again when the work runs, since a captured graph may
 * replay after a free); D does not overlap A or B; the algorithm passed in
 * was chosen by the heuristic for the same types, transposes and epilogue,
 * and the pointers are at least as aligned as the preference promised
 * then; the workspace is as large as the heuristic asked for. The
 * workspace is scribbled over at each run, so a workspace that overlaps
 * live data shows.
 *
 * CT_EMU_ALGO_BITS=1 (emu.h): each kernel, told apart by what the
 * heuristic chose it for (types, transposes, epilogue, compute type,
 * operand alignments, workspace), moves its sums by its own few last
 * places of f32, as kernels summing in other orders do.
 *
 * CT_EMU_LT_NO_EPILOGUE=1: the heuristic finds no algorithm for any
 * epilogue but DEFAULT (CUBLAS_STATUS_NOT_SUPPORTED, count 0), as the real
 * one may for a shape, type or alignment, so the caller's fallback runs. */
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "emu.h"

struct cublasLtContext {
  uint32_t magic;
};

namespace {

constexpr uint32_t kHandleMagic = 0x4c54484e;  // "LTHN"
constexpr uint32_t kDescMagic = 0x4c54444d;
constexpr uint32_t kLayoutMagic = 0x4c544c59;
constexpr uint32_t kPrefMagic = 0x4c545052;
constexpr uint32_t kAlgoMagic = 0x4c54414c;

/* Workspace the emulated algorithm asks for when the preference allows it
 * (nonzero so the backend's scratch path is exercised and scribbled on). */
constexpr uint64_t kAlgoWorkspace = 4096;

struct Desc {
  uint32_t magic;
  int32_t compute;
  int32_t scale;
  int32_t pmode;
  int32_t ta, tb;
  uint32_t epi;
  int32_t bias_type;  // -1: D's type
  const void *bias;
  int64_t bias_batch_stride;
};
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t), "Desc must fit cuBLASLt's blob");

struct Layout {
  uint32_t magic;
  uint32_t type;
  int32_t order;
  int32_t batch;
  uint64_t rows, cols;
  int64_t ld;
  int64_t stride;
};
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "Layout must fit cuBLASLt's blob");

struct Pref {
  uint32_t magic;
  uint32_t search;
  uint64_t max_ws;
  uint32_t align[4];  // A, B, C, D
};
static_assert(sizeof(Pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "Pref must fit cuBLASLt's blob");

/* What the fake algorithm was chosen for and what it requires. */
struct Algo {
  uint32_t magic;
  int32_t compute;
  uint32_t types[4];  // A, B, C, D
  uint32_t epi;
  int32_t ta, tb;
  uint32_t align[4];  // minimum pointer alignment of A, B, C, D
  uint32_t bias_align;
  uint64_t ws;
};
static_assert(sizeof(Algo) <= sizeof(cublasLtMatmulAlgo_t), "Algo must fit cuBLASLt's blob");

/* The blobs are uint64_t arrays the caller may own; memcpy in and out keeps
 * clear of aliasing rules. */
template <class T, class B>
T load(const B *blob) {
  T t;
  std::memcpy(&t, blob, sizeof t);
  return t;
}
template <class T, class B>
void store(B *blob, const T &t) {
  std::memset(blob, 0, sizeof *blob);
  std::memcpy(blob, &t, sizeof t);
}

cublasStatus_t refuse(cublasStatus_t st, const char *fn, const char *fmt, ...) {
  std::va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "emu cuBLASLt: %s: ", fn);
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, " (%s)\n", st == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED"
                                  : st == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE"
                                                                      : "error");
  va_end(ap);
  return st;
}

/* Copies a fixed-size attribute value, refusing a size mismatch as the
 * library does. */
template <class T>
bool get_attr(const void *buf, size_t size, T *out) {
  if (!buf || size != sizeof(T)) return false;
  std::memcpy(out, buf, sizeof(T));
  return true;
}

size_t elem_size(uint32_t t) {
  return t == CUDA_R_32F ? 4 : (t == CUDA_R_16F || t == CUDA_R_16BF) ? 2 : 0;
}

const char *type_name(uint32_t t) {
  return t == CUDA_R_32F ? "CUDA_R_32F" : t == CUDA_R_16F ? "CUDA_R_16F" : t == CUDA_R_16BF ? "CUDA_R_16BF" : "other";
}

uint32_t align_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > 1 && (a & (al - 1))) al >>= 1;
  return al;
}

/* ---- exact conversions ---- */

double f16_to_double(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = std::ldexp((double)m, -24);
  else
    v = std::ldexp((double)(m | 1024), e - 25);
  return s ? -v : v;
}

double bf16_to_double(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/* Rounds x once, to nearest even, to a binary format with mant explicit
 * mantissa bits and normal exponents emin..emax; returns the rounded value
 * (inf on overflow). Done from double directly: going through float first
 * would round twice. */
double round_format(double x, int mant, int emin, int emax) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = std::ilogb(x);
  if (e < emin) e = emin;  // subnormal: fixed quantum
  double q = std::ldexp(1.0, e - mant);
  double r = std::nearbyint(x / q) * q;  // default rounding mode: nearest even
  double maxv = std::ldexp(2.0 - std::ldexp(1.0, -mant), emax);
  if (std::fabs(r) > maxv) return x > 0 ? INFINITY : -INFINITY;
  return r;
}

uint16_t double_to_f16(double x) {
  if (std::isnan(x)) return 0x7e00;
  double r = round_format(x, 10, -14, 15);
  uint16_t s = std::signbit(r) ? 0x8000 : 0;
  double a = std::fabs(r);
  if (std::isinf(a)) return s | 0x7c00;
  if (a < std::ldexp(1.0, -14)) return s | (uint16_t)(a * std::ldexp(1.0, 24));
  int e = std::ilogb(a);
  uint16_t m = (uint16_t)((std::ldexp(a, -e) - 1.0) * 1024.0);
  return s | (uint16_t)((e + 15) << 10) | m;
}

uint16_t double_to_bf16(double x) {
  if (std::isnan(x)) return 0x7fc0;
  /* bf16 values are floats with 16 zero low bits: the float conversion of
   * the once-rounded value is exact. */
  float f = (float)round_format(x, 7, -126, 127);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

double read_elem(const void *p, size_t i, uint32_t t) {
  if (t == CUDA_R_32F) return ((const float *)p)[i];
  if (t == CUDA_R_16F) return f16_to_double(((const uint16_t *)p)[i]);
  return bf16_to_double(((const uint16_t *)p)[i]);
}

void write_elem(void *p, size_t i, uint32_t t, double v) {
  if (t == CUDA_R_32F)
    ((float *)p)[i] = (float)v;  // double -> float rounds to nearest even
  else if (t == CUDA_R_16F)
    ((uint16_t *)p)[i] = double_to_f16(v);
  else
    ((uint16_t *)p)[i] = double_to_bf16(v);
}

/* Bytes a layout's elements span (the last column need only hold rows
 * elements), batches included. */
size_t extent_bytes(const Layout &l) {
  if (!l.rows || !l.cols) return 0;
  uint64_t one = (uint64_t)l.ld * (l.cols - 1) + l.rows;
  return (size_t)(((uint64_t)l.stride * (uint64_t)(l.batch - 1) + one) * elem_size(l.type));
}

bool overlap(const void *a, size_t na, const void *b, size_t nb) {
  if (!a || !b || !na || !nb) return false;
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return x < y + nb && y < x + na;
}

/* A validated problem: everything the computation needs, by value. */
struct Problem {
  Desc desc;
  Layout a, b, c, d;
  uint64_t m, n, k;
  uint32_t bias_type;
};

bool valid_layout(const cublasLtMatrixLayout_t l) { return l && load<Layout>(l).magic == kLayoutMagic; }

/* Checks the descriptor and layouts against what is implemented; fills p. */
cublasStatus_t check_problem(const char *fn, cublasLtMatmulDesc_t dd, cublasLtMatrixLayout_t al,
                             cublasLtMatrixLayout_t bl, cublasLtMatrixLayout_t cl, cublasLtMatrixLayout_t dl,
                             Problem *p) {
  if (!dd || load<Desc>(dd).magic != kDescMagic)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "matmul descriptor is NULL or not initialized");
  if (!valid_layout(al) || !valid_layout(bl) || !valid_layout(cl) || !valid_layout(dl))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "a matrix layout is NULL or not initialized");
  p->desc = load<Desc>(dd);
  p->a = load<Layout>(al);
  p->b = load<Layout>(bl);
  p->c = load<Layout>(cl);
  p->d = load<Layout>(dl);
  const Desc &de = p->desc;
  const Layout *ls[4] = {&p->a, &p->b, &p->c, &p->d};
  const char *names = "ABCD";
  for (int i = 0; i < 4; i++) {
    const Layout &l = *ls[i];
    if (!elem_size(l.type))
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "matrix %c: data type %u (emulated: 32F, 16F, 16BF)", names[i],
                    l.type);
    if (l.ld < (int64_t)l.rows || l.ld < 1)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "matrix %c: ld %lld < rows %llu", names[i], (long long)l.ld,
                    (unsigned long long)l.rows);
    if (l.batch != p->d.batch)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "matrix %c: batch count %d, D has %d", names[i], l.batch,
                    p->d.batch);
  }
  if (p->a.type != p->b.type)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "A is %s, B is %s (emulated: one input type)", type_name(p->a.type),
                  type_name(p->b.type));
  if (p->c.type != p->d.type)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "C is %s, D is %s (emulated: C and D alike)", type_name(p->c.type),
                  type_name(p->d.type));
  if (p->d.type != p->a.type && p->d.type != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%s inputs to %s output (emulated: the input type or 32F)",
                  type_name(p->a.type), type_name(p->d.type));
  if (de.compute != CUBLAS_COMPUTE_32F && de.compute != CUBLAS_COMPUTE_32F_FAST_TF32)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "compute type %d (emulated: 32F, 32F_FAST_TF32)", de.compute);
  if (de.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && p->a.type != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "32F_FAST_TF32 with %s inputs", type_name(p->a.type));
  if (de.scale != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "scale type %d (emulated: CUDA_R_32F)", de.scale);
  p->m = de.ta == CUBLAS_OP_N ? p->a.rows : p->a.cols;
  p->k = de.ta == CUBLAS_OP_N ? p->a.cols : p->a.rows;
  uint64_t kb = de.tb == CUBLAS_OP_N ? p->b.rows : p->b.cols;
  p->n = de.tb == CUBLAS_OP_N ? p->b.cols : p->b.rows;
  if (kb != p->k || p->c.rows != p->m || p->c.cols != p->n || p->d.rows != p->m || p->d.cols != p->n)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                  "shapes do not chain: op(A) %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu",
                  (unsigned long long)p->m, (unsigned long long)p->k, (unsigned long long)kb,
                  (unsigned long long)p->n, (unsigned long long)p->c.rows, (unsigned long long)p->c.cols,
                  (unsigned long long)p->d.rows, (unsigned long long)p->d.cols);
  if (p->k == 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "k = 0");
  p->bias_type = de.bias_type < 0 ? p->d.type : (uint32_t)de.bias_type;
  if (p->bias_type != p->d.type)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "bias type %s with D %s (emulated: D's type)",
                  type_name(p->bias_type), type_name(p->d.type));
  return CUBLAS_STATUS_SUCCESS;
}

bool epi_has_bias(uint32_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS; }
bool epi_has_relu(uint32_t e) { return e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS; }

/* Everything one queued matmul needs, captured by value. */
struct Job {
  Problem p;
  const void *A, *B, *C, *alpha_p, *beta_p;
  void *D, *ws;
  size_t ws_size;
  double alpha, beta;
  bool device_scalars;
  uint64_t kernel; /* the "kernel" the heuristic chose: CT_EMU_ALGO_BITS's key */
};

bool check_job_ranges(const Job &j, const char *who) {
  bool ok = ct_emu::check_device_range(j.A, extent_bytes(j.p.a), who, "A");
  ok = ok && ct_emu::check_device_range(j.B, extent_bytes(j.p.b), who, "B");
  if (j.C) ok = ok && ct_emu::check_device_range(j.C, extent_bytes(j.p.c), who, "C");
  ok = ok && ct_emu::check_device_range(j.D, extent_bytes(j.p.d), who, "D");
  if (epi_has_bias(j.p.desc.epi)) {
    size_t nb = (size_t)(j.p.m + (uint64_t)j.p.desc.bias_batch_stride * (uint64_t)(j.p.d.batch - 1)) *
                elem_size(j.p.bias_type);
    ok = ok && ct_emu::check_device_range(j.p.desc.bias, nb, who, "bias (CUBLASLT_MATMUL_DESC_BIAS_POINTER)");
  }
  if (j.device_scalars) {
    ok = ok && ct_emu::check_device_range(j.alpha_p, 4, who, "alpha (device pointer mode)");
    ok = ok && ct_emu::check_device_range(j.beta_p, 4, who, "beta (device pointer mode)");
  }
  if (j.ws && j.ws_size) ok = ok && ct_emu::check_device_range(j.ws, j.ws_size, who, "workspace");
  return ok;
}

void run_job(const Job &j) {
  if (!check_job_ranges(j, "cublasLtMatmul (at execution)")) return;
  const Problem &p = j.p;
  double alpha = j.alpha, beta = j.beta;
  if (j.device_scalars) {
    float f;
    std::memcpy(&f, j.alpha_p, 4);
    alpha = f;
    std::memcpy(&f, j.beta_p, 4);
    beta = f;
  }
  /* The real library uses its workspace as scratch: leave garbage there. */
  if (j.ws && j.ws_size) std::memset(j.ws, 0xff, j.ws_size);
  const bool tf32 = p.desc.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  const size_t M = p.m, N = p.n, K = p.k;
  const bool narrow = p.d.type != CUDA_R_32F;
  /* op(B) by columns, whole; op(A) by rows, a block of rows at a time
   * (a 4096 x 25088 weight as doubles would be 822 MB, allocated fresh at
   * every call). Both buffers are kept for the next call: fresh pages cost
   * more than the products here. Every D element is still one dot
   * product over K in the same order. */
  static thread_local std::vector<double> a, b;
  const size_t rows = std::max<size_t>(1, std::min<size_t>(M, ((size_t)1 << 21) / K));
  if (a.size() < rows * K) a.resize(rows * K);
  if (b.size() < N * K) b.resize(N * K);
  for (int bt = 0; bt < p.d.batch; bt++) {
    const size_t oa = (size_t)p.a.stride * bt, ob = (size_t)p.b.stride * bt;
    const size_t oc = (size_t)p.c.stride * bt, od = (size_t)p.d.stride * bt;
    for (size_t c = 0; c < N; c++)
      for (size_t q = 0; q < K; q++) {
        size_t idx = ob + (p.desc.tb == CUBLAS_OP_N ? c * p.b.ld + q : q * p.b.ld + c);
        double v = read_elem(j.B, idx, p.b.type);
        if (tf32) v = ct_emu::round_tf32((float)v);
        b[c * K + q] = v;
      }
    const bool bias = epi_has_bias(p.desc.epi), relu = epi_has_relu(p.desc.epi);
    const size_t obias = (size_t)p.desc.bias_batch_stride * bt;
    for (size_t i0 = 0; i0 < M; i0 += rows) {
      const size_t i1 = std::min(M, i0 + rows);
      for (size_t i = i0; i < i1; i++)
        for (size_t q = 0; q < K; q++) {
          size_t idx = oa + (p.desc.ta == CUBLAS_OP_N ? q * p.a.ld + i : i * p.a.ld + q);
          double v = read_elem(j.A, idx, p.a.type);
          if (tf32) v = ct_emu::round_tf32((float)v);
          a[(i - i0) * K + q] = v;
        }
      /* Products for four columns at a time: independent sums keep the
       * floating-point pipeline full (the order of a double sum of f32
       * products moves the result far less than any tolerance). */
      double acc4[4];
      for (size_t c0 = 0; c0 < N; c0 += 4)
        for (size_t i = i0; i < i1; i++) {
          const size_t nc = N - c0 < 4 ? N - c0 : 4;
          const double *ar = &a[(i - i0) * K];
          if (nc == 4) {
            const double *b0 = &b[c0 * K], *b1 = b0 + K, *b2 = b1 + K, *b3 = b2 + K;
            double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (size_t q = 0; q < K; q++) {
              const double x = ar[q];
              s0 += x * b0[q], s1 += x * b1[q], s2 += x * b2[q], s3 += x * b3[q];
            }
            acc4[0] = s0, acc4[1] = s1, acc4[2] = s2, acc4[3] = s3;
          } else {
            for (size_t u = 0; u < nc; u++) {
              const double *bc = &b[(c0 + u) * K];
              double t = 0;
              for (size_t q = 0; q < K; q++) t += ar[q] * bc[q];
              acc4[u] = t;
            }
          }
          for (size_t u = 0; u < nc; u++) {
            const size_t c = c0 + u;
            const double acc = ct_emu::algo_bits(acc4[u], j.kernel, ((uint64_t)bt * N + c) * M + i, narrow);
            double v = alpha * acc;
            if (beta != 0) v += beta * read_elem(j.C, oc + c * p.c.ld + i, p.c.type);
            if (bias) v += read_elem(p.desc.bias, obias + i, p.bias_type);
            if (relu) v = v > 0 ? v : 0;
            write_elem(j.D, od + c * p.d.ld + i, p.d.type, v);
          }
        }
    }
  }
}

}  // namespace

/* ---- handle ---- */

extern "C" cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  if (!h) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate", "handle pointer is NULL");
  *h = new cublasLtContext{kHandleMagic};
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (!h || h->magic != kHandleMagic)
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy", "handle is NULL or not initialized");
  h->magic = 0;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" const char *cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

extern "C" const char *cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "licensing error";
  }
  return "unknown error";
}

/* ---- matmul descriptor ---- */

extern "C" cublasStatus_t cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t d, size_t size,
                                                          cublasComputeType_t compute, cudaDataType_t scale) {
  if (!d || size < sizeof(Desc))
    return refuse(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtMatmulDescInit", "blob NULL or too small (%zu bytes)", size);
  Desc de{};
  de.magic = kDescMagic;
  de.compute = compute;
  de.scale = scale;
  de.pmode = CUBLASLT_POINTER_MODE_HOST;
  de.ta = de.tb = CUBLAS_OP_N;
  de.epi = CUBLASLT_EPILOGUE_DEFAULT;
  de.bias_type = -1;
  store(d, de);
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                                   cudaDataType_t scale) {
  if (!d) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate", "descriptor pointer is NULL");
  cublasLtMatmulDesc_t nd = new cublasLtMatmulDescOpaque_t;
  cublasLtMatmulDescInit_internal(nd, sizeof *nd, compute, scale);
  *d = nd;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  if (!d) return CUBLAS_STATUS_SUCCESS;
  std::memset(d, 0, sizeof *d);
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                         const void *buf, size_t size) {
  const char *fn = "cublasLtMatmulDescSetAttribute";
  if (!d || load<Desc>(d).magic != kDescMagic)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "descriptor is NULL or not initialized");
  Desc de = load<Desc>(d);
  int32_t i32;
  uint32_t u32;
  int64_t i64;
  const void *ptr;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      if (!get_attr(buf, size, &i32)) goto bad_size;
      de.compute = i32;  // validated at the heuristic/matmul
      break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      if (!get_attr(buf, size, &i32)) goto bad_size;
      de.scale = i32;
      break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      if (!get_attr(buf, size, &i32)) goto bad_size;
      if (i32 != CUBLASLT_POINTER_MODE_HOST && i32 != CUBLASLT_POINTER_MODE_DEVICE)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "pointer mode %d (emulated: HOST, DEVICE)", i32);
      de.pmode = i32;
      break;
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
      if (!get_attr(buf, size, &i32)) goto bad_size;
      if (i32 != CUBLAS_OP_N && i32 != CUBLAS_OP_T)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "operation %d (emulated: CUBLAS_OP_N, CUBLAS_OP_T)", i32);
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? de.ta : de.tb) = i32;
      break;
    case CUBLASLT_MATMUL_DESC_TRANSC:
      if (!get_attr(buf, size, &i32)) goto bad_size;
      if (i32 != CUBLAS_OP_N) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "TRANSC %d (only CUBLAS_OP_N)", i32);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      if (!get_attr(buf, size, &u32)) goto bad_size;
      if (u32 != CUBLASLT_EPILOGUE_DEFAULT && u32 != CUBLASLT_EPILOGUE_RELU && u32 != CUBLASLT_EPILOGUE_BIAS &&
          u32 != CUBLASLT_EPILOGUE_RELU_BIAS)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "epilogue %u (emulated: DEFAULT, RELU, BIAS, RELU_BIAS)", u32);
      de.epi = u32;
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      if (!get_attr(buf, size, &ptr)) goto bad_size;
      de.bias = ptr;
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      if (!get_attr(buf, size, &i32)) goto bad_size;
      de.bias_type = i32;  // checked against D's type at the heuristic/matmul
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
      if (!get_attr(buf, size, &i64)) goto bad_size;
      if (i64 < 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "negative bias batch stride");
      de.bias_batch_stride = i64;
      break;
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "attribute %d is not emulated", (int)attr);
  }
  store(d, de);
  return CUBLAS_STATUS_SUCCESS;
bad_size:
  return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d: buffer NULL or size %zu is wrong", (int)attr, size);
}

/* ---- matrix layouts ---- */

extern "C" cublasStatus_t cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t l, size_t size, cudaDataType type,
                                                            uint64_t rows, uint64_t cols, int64_t ld) {
  if (!l || size < sizeof(Layout))
    return refuse(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtMatrixLayoutInit", "blob NULL or too small (%zu bytes)", size);
  Layout la{};
  la.magic = kLayoutMagic;
  la.type = (uint32_t)type;
  la.order = CUBLASLT_ORDER_COL;
  la.batch = 1;
  la.rows = rows;
  la.cols = cols;
  la.ld = ld;
  store(l, la);
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows,
                                                     uint64_t cols, int64_t ld) {
  if (!l) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate", "layout pointer is NULL");
  cublasLtMatrixLayout_t nl = new cublasLtMatrixLayoutOpaque_t;
  cublasLtMatrixLayoutInit_internal(nl, sizeof *nl, type, rows, cols, ld);
  *l = nl;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  if (!l) return CUBLAS_STATUS_SUCCESS;
  std::memset(l, 0, sizeof *l);
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                           cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                           size_t size) {
  const char *fn = "cublasLtMatrixLayoutSetAttribute";
  if (!valid_layout(l)) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "layout is NULL or not initialized");
  Layout la = load<Layout>(l);
  int32_t i32;
  uint32_t u32;
  uint64_t u64;
  int64_t i64;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
      if (!get_attr(buf, size, &u32)) goto bad_size;
      la.type = u32;
      break;
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      if (!get_attr(buf, size, &i32)) goto bad_size;
      if (i32 != CUBLASLT_ORDER_COL)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "order %d (emulated: CUBLASLT_ORDER_COL)", i32);
      break;
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
    case CUBLASLT_MATRIX_LAYOUT_COLS:
      if (!get_attr(buf, size, &u64)) goto bad_size;
      (attr == CUBLASLT_MATRIX_LAYOUT_ROWS ? la.rows : la.cols) = u64;
      break;
    case CUBLASLT_MATRIX_LAYOUT_LD:
      if (!get_attr(buf, size, &i64)) goto bad_size;
      la.ld = i64;
      break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      if (!get_attr(buf, size, &i32)) goto bad_size;
      if (i32 < 1) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "batch count %d", i32);
      la.batch = i32;
      break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      if (!get_attr(buf, size, &i64)) goto bad_size;
      if (i64 < 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "negative batch stride %lld", (long long)i64);
      la.stride = i64;
      break;
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET:
      if (!get_attr(buf, size, &i64)) goto bad_size;
      if (i64 != 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "planar complex layouts are not emulated");
      break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE:
      if (!get_attr(buf, size, &u32)) goto bad_size;
      if (u32 != CUBLASLT_BATCH_MODE_STRIDED)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "batch mode %u (emulated: STRIDED)", u32);
      break;
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "attribute %d is not emulated", (int)attr);
  }
  store(l, la);
  return CUBLAS_STATUS_SUCCESS;
bad_size:
  return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d: buffer NULL or size %zu is wrong", (int)attr, size);
}

/* ---- heuristic preference ---- */

extern "C" cublasStatus_t cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t p, size_t size) {
  if (!p || size < sizeof(Pref))
    return refuse(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtMatmulPreferenceInit", "blob NULL or too small (%zu bytes)",
                  size);
  Pref pr{};
  pr.magic = kPrefMagic;
  pr.search = CUBLASLT_SEARCH_BEST_FIT;
  pr.max_ws = 0;
  for (uint32_t &a : pr.align) a = 256;
  store(p, pr);
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
  if (!p) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate", "pointer is NULL");
  cublasLtMatmulPreference_t np = new cublasLtMatmulPreferenceOpaque_t;
  cublasLtMatmulPreferenceInit_internal(np, sizeof *np);
  *p = np;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  if (!p) return CUBLAS_STATUS_SUCCESS;
  std::memset(p, 0, sizeof *p);
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                               cublasLtMatmulPreferenceAttributes_t attr,
                                                               const void *buf, size_t size) {
  const char *fn = "cublasLtMatmulPreferenceSetAttribute";
  if (!p || load<Pref>(p).magic != kPrefMagic)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "preference is NULL or not initialized");
  Pref pr = load<Pref>(p);
  uint32_t u32;
  uint64_t u64;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
      if (!get_attr(buf, size, &u32)) goto bad_size;
      if (u32 != CUBLASLT_SEARCH_BEST_FIT)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "search mode %u (emulated: BEST_FIT)", u32);
      break;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      if (!get_attr(buf, size, &u64)) goto bad_size;
      pr.max_ws = u64;
      break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      if (!get_attr(buf, size, &u32)) goto bad_size;
      if (!u32 || (u32 & (u32 - 1)))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "alignment %u is not a power of two", u32);
      pr.align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = u32;
      break;
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "attribute %d is not emulated", (int)attr);
  }
  store(p, pr);
  return CUBLAS_STATUS_SUCCESS;
bad_size:
  return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d: buffer NULL or size %zu is wrong", (int)attr, size);
}

/* ---- heuristic ---- */

extern "C" cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc,
                                                         cublasLtMatrixLayout_t al, cublasLtMatrixLayout_t bl,
                                                         cublasLtMatrixLayout_t cl, cublasLtMatrixLayout_t dl,
                                                         cublasLtMatmulPreference_t pref, int requested,
                                                         cublasLtMatmulHeuristicResult_t results[], int *count) {
  const char *fn = "cublasLtMatmulAlgoGetHeuristic";
  if (!h || h->magic != kHandleMagic) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, fn, "handle not initialized");
  if (requested <= 0 || !results || !count)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "requestedAlgoCount %d, results or count NULL", requested);
  if (!pref || load<Pref>(pref).magic != kPrefMagic)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "preference is NULL or not initialized");
  *count = 0;
  Problem p;
  cublasStatus_t st = check_problem(fn, desc, al, bl, cl, dl, &p);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  Pref pr = load<Pref>(pref);
  const uint32_t types[4] = {p.a.type, p.b.type, p.c.type, p.d.type};
  for (int i = 0; i < 4; i++)
    if (pr.align[i] < elem_size(types[i]))
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "matrix %c: minimum alignment %u below the element size",
                    "ABCD"[i], pr.align[i]);
  Algo a{};
  a.magic = kAlgoMagic;
  a.compute = p.desc.compute;
  for (int i = 0; i < 4; i++) a.types[i] = types[i], a.align[i] = pr.align[i];
  a.epi = p.desc.epi;
  a.ta = p.desc.ta;
  a.tb = p.desc.tb;
  /* The bias pointer set now tells the heuristic its alignment (header:
   * "depend on its value to determine expected pointer alignment"); the
   * emulated kernel needs as much of it as a 16-byte vector load would. */
  a.bias_align = (uint32_t)elem_size(p.bias_type);
  if (epi_has_bias(p.desc.epi) && p.desc.bias) {
    uint32_t b = align_of(p.desc.bias);
    a.bias_align = b < 16 ? b : 16;
  }
  static const bool no_epilogue = ct_emu::env_flag("CT_EMU_LT_NO_EPILOGUE");
  if (no_epilogue && a.epi != CUBLASLT_EPILOGUE_DEFAULT)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "no algorithm for epilogue %d (CT_EMU_LT_NO_EPILOGUE)", (int)a.epi);
  a.ws = pr.max_ws >= kAlgoWorkspace ? kAlgoWorkspace : 0;
  std::memset(&results[0], 0, sizeof results[0]);
  store(&results[0].algo, a);
  results[0].workspaceSize = (size_t)a.ws;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

/* ---- matmul ---- */

extern "C" cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha,
                                         const void *A, cublasLtMatrixLayout_t al, const void *B,
                                         cublasLtMatrixLayout_t bl, const void *beta, const void *C,
                                         cublasLtMatrixLayout_t cl, void *D, cublasLtMatrixLayout_t dl,
                                         const cublasLtMatmulAlgo_t *algo, void *workspace, size_t ws_size,
                                         cudaStream_t stream) {
  const char *fn = "cublasLtMatmul";
  if (!h || h->magic != kHandleMagic) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, fn, "handle not initialized");
  Job j{};
  cublasStatus_t st = check_problem(fn, desc, al, bl, cl, dl, &j.p);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const Problem &p = j.p;
  if (!alpha || !beta) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "alpha or beta is NULL");
  if (!A || !B || !D) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "A, B or D is NULL");
  j.device_scalars = p.desc.pmode == CUBLASLT_POINTER_MODE_DEVICE;
  if (!j.device_scalars) {
    float f;
    std::memcpy(&f, alpha, 4);
    j.alpha = f;
    std::memcpy(&f, beta, 4);
    j.beta = f;
    if (j.beta != 0 && !C) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "beta != 0 with C NULL");
  } else if (!C) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "C is NULL (device pointer mode: beta unknown at the call)");
  }
  if (C == D && (p.c.ld != p.d.ld || p.c.stride != p.d.stride))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "in-place (C == D) with different C and D layouts");
  if (epi_has_bias(p.desc.epi) && !p.desc.bias)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "bias epilogue without CUBLASLT_MATMUL_DESC_BIAS_POINTER");
  const size_t nd = extent_bytes(p.d);
  if (overlap(D, nd, A, extent_bytes(p.a)) || overlap(D, nd, B, extent_bytes(p.b)))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "D overlaps %s: the result would race with its inputs",
                  overlap(D, nd, A, extent_bytes(p.a)) ? "A" : "B");
  /* The kernel (CT_EMU_ALGO_BITS's key): without an algo, the one the
   * library would choose for this descriptor and these pointers. */
  Algo chosen{};
  chosen.compute = p.desc.compute, chosen.epi = p.desc.epi, chosen.ta = p.desc.ta, chosen.tb = p.desc.tb;
  const uint32_t types[4] = {p.a.type, p.b.type, p.c.type, p.d.type};
  std::memcpy(chosen.types, types, sizeof types);
  const void *ptrs[4] = {A, B, C, D};
  for (int i = 0; i < 4; i++) chosen.align[i] = ptrs[i] ? align_of(ptrs[i]) : 0;
  if (algo) {
    Algo a = load<Algo>(algo);
    if (a.magic != kAlgoMagic)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "algo was not returned by cublasLtMatmulAlgoGetHeuristic");
    if (a.compute != p.desc.compute || std::memcmp(a.types, types, sizeof types) || a.epi != p.desc.epi ||
        a.ta != p.desc.ta || a.tb != p.desc.tb)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                    "algo was chosen for other types, transposes or epilogue than this descriptor's");
    for (int i = 0; i < 4; i++)
      if (ptrs[i] && align_of(ptrs[i]) < a.align[i])
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                      "matrix %c is %u-byte aligned; the algo was chosen for a preference of %u bytes", "ABCD"[i],
                      align_of(ptrs[i]), a.align[i]);
    if (epi_has_bias(p.desc.epi) && align_of(p.desc.bias) < a.bias_align)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                    "bias is %u-byte aligned; the heuristic saw a bias pointer aligned to %u bytes",
                    align_of(p.desc.bias), a.bias_align);
    if (ws_size < a.ws || (a.ws && !workspace))
      return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "workspace %p of %zu bytes; the algo needs %llu", workspace,
                    ws_size, (unsigned long long)a.ws);
    chosen = a;
  }
  {
    const uint64_t f[] = {(uint64_t)(uint32_t)chosen.compute, chosen.types[0], chosen.types[1], chosen.types[2],
                          chosen.types[3], chosen.epi, (uint64_t)(uint32_t)chosen.ta, (uint64_t)(uint32_t)chosen.tb,
                          chosen.align[0], chosen.align[1], chosen.align[2], chosen.align[3], chosen.bias_align,
                          chosen.ws};
    uint64_t k = 1469598103934665603ull;
    for (uint64_t x : f) k = (k ^ x) * 1099511628211ull;
    j.kernel = k;
  }
  if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
  j.A = A;
  j.B = B;
  j.C = (j.device_scalars || j.beta != 0) ? C : nullptr;
  j.D = D;
  j.alpha_p = alpha;
  j.beta_p = beta;
  j.ws = workspace;
  j.ws_size = workspace ? ws_size : 0;
  /* A fault on a real device is asynchronous: the launch succeeds and the
   * error shows at the next synchronisation (check_device_range records
   * it). The work is not queued then. */
  if (!check_job_ranges(j, fn)) return CUBLAS_STATUS_SUCCESS;
  ct_emu::trace(stream, "cublasLt %s m %llu n %llu k %llu batch %d types %u,%u,%u epilogue %u flops %.0f", fn,
                (unsigned long long)p.m, (unsigned long long)p.n, (unsigned long long)p.k, (int)p.d.batch, p.a.type,
                p.b.type, p.d.type, (unsigned)p.desc.epi, 2.0 * p.m * p.n * p.k * p.d.batch);
  ct_emu::enqueue(stream, [j] { run_job(j); });
  return CUBLAS_STATUS_SUCCESS;
}
