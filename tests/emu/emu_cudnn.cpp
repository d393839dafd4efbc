/* The CUDA emulator's cuDNN (tests only): the legacy descriptor API calls
 * that src/backend/cuda/cuda_conv.c and cuda_bnorm.c make, with the
 * signatures of <cudnn.h> (cuDNN 9) and the documented semantics, computed
 * on the CPU in double and rounded to the output type. See emu.h for the
 * emulator's model.
 *
 * What is emulated (anything else is refused with CUDNN_STATUS_NOT_SUPPORTED,
 * never ignored):
 * - 4-D tensor descriptors (NCHW or NHWC packed, as cudnnSetTensor4dDescriptor
 *   builds them; the compute calls honour the strides) and 4-D filter
 *   descriptors (KCRS for NCHW, KRSC for NHWC); FLOAT, HALF and BFLOAT16.
 * - Convolution descriptors: pad/stride/dilation, CUDNN_CROSS_CORRELATION
 *   and CUDNN_CONVOLUTION (the filter flipped), groups, math type; compute
 *   type FLOAT only (the one cuDNN uses for these data types).
 * - Forward, backward data and backward filter: out = alpha * result +
 *   beta * out, where out is not read when beta is 0 (cuDNN documents it may
 *   then hold NaN). Products and sums in double; the blended value goes to
 *   f32 and then to the output type (round to nearest even), as a GPU
 *   epilogue computing in f32 would.
 * - Math (cudnnMathType_t in the cuDNN 9 API reference): on Ampere and
 *   later, CUDNN_DEFAULT_MATH and the tensor-op math types permit TF32
 *   tensor-core kernels for FLOAT data and CUDNN_FMA_MATH does not; the
 *   environment variable NVIDIA_TF32_OVERRIDE=0 disables TF32 for all. The
 *   emulator takes the permission as use (the worst case a test must
 *   tolerate): FLOAT inputs are rounded with ct_emu::round_tf32 before the
 *   products. HALF/BFLOAT16 inputs are exact in any math type.
 * - Algorithms: every query offers two per pass, the first with a workspace
 *   (so the caller's workspace plumbing is exercised: the emulator fills the
 *   workspace with 0xFF bytes before computing, which turns any operand the
 *   caller placed inside it into NaN) and one without. A compute call with
 *   an algorithm not offered is NOT_SUPPORTED; with a workspace smaller than
 *   the query reported it is BAD_PARAM.
 * - Batch norm (SPATIAL, and SPATIAL_PERSISTENT for training and backward;
 *   no z): batch mean, biased
 *   variance for normalising, resultSaveInvVariance = 1/sqrt(var + eps),
 *   running = (1 - factor) * running + factor * batch statistic with the
 *   unbiased variance (M/(M-1), M = N*H*W) for the running variance;
 *   epsilon below CUDNN_BN_MIN_EPSILON is BAD_PARAM. Workspace: SPATIAL
 *   asks for one and no reserve, SPATIAL_PERSISTENT for both (the two paths
 *   cuda_bnorm.c has); workspace NULL with size 0 runs as the non-Ex
 *   function, as documented, unless CT_EMU_BN_RESERVE_REQUIRED=1 makes a
 *   needed reserve mandatory (BAD_PARAM without it).
 * - Batch norm with ReLU fused (bnOps CUDNN_BATCHNORM_OPS_BN_ACTIVATION, a
 *   RELU activation descriptor): taken only where the fused kernels are
 *   known to exist: SPATIAL_PERSISTENT, fully packed NHWC, HALF or
 *   BFLOAT16, C a multiple of 4 (NOT_SUPPORTED otherwise, and always under
 *   CT_EMU_BN_NO_FUSED=1). The reserve is then mandatory and holds, after
 *   the persistent part, one bit per element: the forward's y > 0 before
 *   rounding. The backward needs y and the bias (NULL is BAD_PARAM) and
 *   gates dy with the reserve's bits, not with y, so a reserve the caller
 *   lost between the passes gives wrong gradients.
 * - CT_EMU_DNN_NO_NHWC=1 stands in for a cuDNN build with no channels-last
 *   kernel for a shape: a convolution with an NHWC tensor gets no usable
 *   algorithm (the _v7 heuristics list every entry NOT_SUPPORTED_LAYOUT,
 *   the Find calls fail with that status) and the compute calls refuse it.
 * - CT_EMU_DNN_FIRST_FAILS=1: the compute calls refuse the algorithm every
 *   query ranks first (NOT_SUPPORTED, as cuDNN can at execution for an
 *   entry its heuristics listed as supported); the second still runs.
 * - CT_EMU_DNN_THIN_C_SLOW=<factor>: cudnnFind's times for NHWC
 *   convolutions whose C is not a multiple of 8 multiplied by factor.
 * - CT_EMU_DNN_NONDET=1 stands in for cuDNN's nondeterministic backward
 *   algorithms (backward data 0, backward filter 0 and 3 use atomics): the
 *   backward queries rank the one offered nondeterministic algorithm first
 *   (listed CUDNN_NON_DETERMINISTIC, as always), and each call of it moves
 *   every result element by -1, 0 or +1 relative last place of the output
 *   type, drawn anew per call, so two runs differ unless the caller keeps
 *   to deterministic algorithms. Without it every algorithm is
 *   deterministic here.
 * - CT_EMU_ALGO_BITS=1 (emu.h): each algorithm (legacy) or engine (graph
 *   API) moves its sums by its own fixed few last places of f32, so
 *   two algorithms no longer give the same bits.
 * - CT_EMU_DNN_BIG_WS=1: the first-ranked algorithm asks for a workspace
 *   as large as its largest tensor (f32 sizes) instead of a few KB, as
 *   cuDNN's fast algorithms can, and every call scribbles all of it; a
 *   workspace laid over memory something still reads then shows.
 *
 * Every compute call checks each data pointer (bytes from its descriptor)
 * and the workspace with ct_emu::check_device_range; on a failure it returns
 * CUDNN_STATUS_EXECUTION_FAILED and queues nothing (the runtime keeps the
 * cudaErrorIllegalAddress for the next synchronising call). The work itself
 * is queued on the handle's stream with descriptor contents and alpha/beta
 * copied into the closure. cudnnGetLastErrorString returns why the last
 * refused call was refused. */
#include <cudnn.h>

#include <atomic>
#include <cstdarg>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "ctrain/dtype.h"
#include "emu.h"
#include "emu_dnn.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* ---- descriptor objects ---------------------------------------------- */

struct cudnnContext {
  cudaStream_t stream;
};

namespace {

struct tdesc {
  bool set;
  cudnnDataType_t dt;
  cudnnTensorFormat_t fmt;
  int n, c, h, w;
  int64_t ns, cs, hs, ws;
};

struct fdesc {
  bool set;
  cudnnDataType_t dt;
  cudnnTensorFormat_t fmt;
  int k, c, r, s;
};

struct adesc {
  bool set;
  cudnnActivationMode_t mode;
  double coef;
};

struct cdesc {
  bool set;
  int ph, pw, u, v, dh, dw;
  cudnnConvolutionMode_t mode;
  cudnnDataType_t compute;
  int groups;
  cudnnMathType_t math;
};

}  // namespace

struct cudnnTensorStruct {
  tdesc d;
};
struct cudnnFilterStruct {
  fdesc d;
};
struct cudnnConvolutionStruct {
  cdesc d;
};
struct cudnnActivationStruct {
  adesc d;
};

namespace {

thread_local std::string last_error;

cudnnStatus_t vrefuse(cudnnStatus_t s, const char *fmt, va_list ap) {
  char buf[512];
  vsnprintf(buf, sizeof buf, fmt, ap);
  last_error = buf;
  return s;
}

cudnnStatus_t refuse(cudnnStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudnnStatus_t refuse(cudnnStatus_t s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vrefuse(s, fmt, ap);
  va_end(ap);
  return s;
}

bool supported_type(cudnnDataType_t t) {
  return t == CUDNN_DATA_FLOAT || t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16;
}

size_t type_size(cudnnDataType_t t) { return t == CUDNN_DATA_FLOAT ? 4 : 2; }

/* f16 and bf16 round to nearest even through ctrain's own conversions
 * (src/core/dtype.c, tested against PyTorch), as cuDNN rounds its outputs. */
float half_to_float(uint16_t h) { return ct_f16_to_f32(h); }
uint16_t float_to_half(float f) { return ct_f32_to_f16(f); }
float bf16_to_float(uint16_t b) { return ct_bf16_to_f32(b); }
uint16_t float_to_bf16(float f) { return ct_f32_to_bf16(f); }

double load(const void *p, cudnnDataType_t t, int64_t i) {
  switch (t) {
    case CUDNN_DATA_FLOAT: return ((const float *)p)[i];
    case CUDNN_DATA_HALF: return half_to_float(((const uint16_t *)p)[i]);
    default: return bf16_to_float(((const uint16_t *)p)[i]);
  }
}

void store(void *p, cudnnDataType_t t, int64_t i, double v) {
  const float f = (float)v;
  switch (t) {
    case CUDNN_DATA_FLOAT: ((float *)p)[i] = f; break;
    case CUDNN_DATA_HALF: ((uint16_t *)p)[i] = float_to_half(f); break;
    default: ((uint16_t *)p)[i] = float_to_bf16(f); break;
  }
}

/* Bytes from the first to one past the last element a descriptor reaches. */
size_t tensor_bytes(const tdesc &t) {
  const int64_t last = (int64_t)(t.n - 1) * t.ns + (int64_t)(t.c - 1) * t.cs + (int64_t)(t.h - 1) * t.hs +
                       (int64_t)(t.w - 1) * t.ws;
  return (size_t)(last + 1) * type_size(t.dt);
}

size_t filter_bytes(const fdesc &f) { return (size_t)f.k * f.c * f.r * f.s * type_size(f.dt); }

/* The tensor's elements in canonical NHWC order, as double. */
std::vector<double> gather_nhwc(const void *p, const tdesc &t, bool tf32) {
  std::vector<double> out((size_t)t.n * t.h * t.w * t.c);
  size_t o = 0;
  for (int n = 0; n < t.n; n++)
    for (int h = 0; h < t.h; h++)
      for (int w = 0; w < t.w; w++) {
        const int64_t base = n * t.ns + h * t.hs + w * t.ws;
        for (int c = 0; c < t.c; c++) {
          double v = load(p, t.dt, base + c * t.cs);
          if (tf32) v = ct_emu::round_tf32((float)v);
          out[o++] = v;
        }
      }
  return out;
}

/* out (strided) = alpha * canonical NHWC values + beta * out. */
void scatter_nhwc(void *p, const tdesc &t, const std::vector<double> &v, double alpha, double beta) {
  size_t o = 0;
  for (int n = 0; n < t.n; n++)
    for (int h = 0; h < t.h; h++)
      for (int w = 0; w < t.w; w++) {
        const int64_t base = n * t.ns + h * t.hs + w * t.ws;
        for (int c = 0; c < t.c; c++) {
          const int64_t i = base + c * t.cs;
          double r = alpha * v[o++];
          if (beta != 0.0) r += beta * load(p, t.dt, i);
          store(p, t.dt, i, r);
        }
      }
}

int64_t filter_index(const fdesc &f, int k, int c, int r, int s) {
  if (f.fmt == CUDNN_TENSOR_NHWC) return (((int64_t)k * f.r + r) * f.s + s) * f.c + c;
  return (((int64_t)k * f.c + c) * f.r + r) * f.s + s;
}

/* The filter as canonical [K][R][S][C], flipped for CUDNN_CONVOLUTION. */
std::vector<double> gather_filter(const void *p, const fdesc &f, bool flip, bool tf32) {
  std::vector<double> out((size_t)f.k * f.r * f.s * f.c);
  size_t o = 0;
  for (int k = 0; k < f.k; k++)
    for (int r = 0; r < f.r; r++)
      for (int s = 0; s < f.s; s++)
        for (int c = 0; c < f.c; c++) {
          const int rr = flip ? f.r - 1 - r : r, ss = flip ? f.s - 1 - s : s;
          double v = load(p, f.dt, filter_index(f, k, c, rr, ss));
          if (tf32) v = ct_emu::round_tf32((float)v);
          out[o++] = v;
        }
  return out;
}

void scatter_filter(void *p, const fdesc &f, bool flip, const std::vector<double> &v, double alpha, double beta) {
  size_t o = 0;
  for (int k = 0; k < f.k; k++)
    for (int r = 0; r < f.r; r++)
      for (int s = 0; s < f.s; s++)
        for (int c = 0; c < f.c; c++) {
          const int rr = flip ? f.r - 1 - r : r, ss = flip ? f.s - 1 - s : s;
          const int64_t i = filter_index(f, k, c, rr, ss);
          double x = alpha * v[o++];
          if (beta != 0.0) x += beta * load(p, f.dt, i);
          store(p, f.dt, i, x);
        }
}

/* ---- convolution geometry --------------------------------------------- */

struct geo {
  int N, C, H, W, K, Cg, Kg, G, R, S, OH, OW;
  int ph, pw, u, v, dh, dw;
  bool flip, tf32, nhwc;
  cudnnDataType_t dt;
};

/* CT_EMU_DNN_NO_NHWC=1: no algorithm for a convolution with an NHWC operand. */
bool no_nhwc() {
  static const bool on = ct_emu::env_flag("CT_EMU_DNN_NO_NHWC");
  return on;
}

/* CT_EMU_DNN_BIG_WS=1: the first-ranked algorithm's workspace is the size
 * of its largest tensor. */
bool big_ws() {
  static const bool on = ct_emu::env_flag("CT_EMU_DNN_BIG_WS");
  return on;
}

/* CT_EMU_DNN_THIN_C_SLOW=<factor>: the Find calls' times for an NHWC
 * convolution over a channel count that is not a multiple of 8 are
 * multiplied by factor (read at each call, so one test can switch it):
 * on an H100 such a pass (AlexNet's 3-channel stem) ran at about a tenth
 * of the tensor cores' rate, which is what space-to-depth measures itself
 * against (cuda_conv.c). */
float thin_c_factor(const geo &g) {
  const char *f = getenv("CT_EMU_DNN_THIN_C_SLOW");
  const float v = f ? strtof(f, nullptr) : 0.f;
  return g.nhwc && g.C % 8 && v > 0.f ? v : 1.f;
}

/* CT_EMU_DNN_FIRST_FAILS=1: the first-ranked algorithm refuses to run. */
bool first_fails() {
  static const bool on = ct_emu::env_flag("CT_EMU_DNN_FIRST_FAILS");
  return on;
}

/* CT_EMU_DNN_NONDET=1: the backward passes rank the algorithm cuDNN lists
 * as nondeterministic first (and the graph API's engine 0 carries the note
 * NONDETERMINISTIC for them), and every call of it varies its result
 * (nudge), as atomics adding partial sums in a varying order do. */
bool nondet() {
  static const bool on = ct_emu::env_flag("CT_EMU_DNN_NONDET");
  return on;
}

/* What a nondeterministic algorithm's varying summation order does to its
 * result, made visible in every output type: each element moves by -1, 0
 * or +1 times the type's relative last place, a choice drawn anew for every
 * call (from a call counter that starts at a random value in each process,
 * and the element's index). */
void nudge(std::vector<double> &v, cudnnDataType_t dt) {
  static std::atomic<uint64_t> calls{(uint64_t)std::random_device{}() << 32 ^ std::random_device{}()};
  const uint64_t call = ++calls;
  const double ulp = std::ldexp(1.0, dt == CUDNN_DATA_FLOAT ? -23 : dt == CUDNN_DATA_HALF ? -10 : -7);
  for (size_t i = 0; i < v.size(); i++) v[i] *= 1.0 + (double)((int)(ct_emu::mix64(call, i) % 3) - 1) * ulp;
}

/* What the algorithm with this key does to an exact result r of type out
 * beyond rounding it: its own summation order (CT_EMU_ALGO_BITS, emu.h),
 * and, vary (an atomics-based one under CT_EMU_DNN_NONDET), a different
 * order at every call. */
void as_algorithm(std::vector<double> &r, uint64_t key, bool vary, cudnnDataType_t out) {
  if (vary) nudge(r, out);
  if (!ct_emu::algo_bits_on()) return;
  for (size_t i = 0; i < r.size(); i++) r[i] = ct_emu::algo_bits(r[i], key, i, out != CUDNN_DATA_FLOAT);
}

bool tf32_allowed(cudnnMathType_t m) {
  if (m == CUDNN_FMA_MATH) return false;
  const char *e = getenv("NVIDIA_TF32_OVERRIDE");
  return !(e && !strcmp(e, "0"));
}

cudnnStatus_t out_dim(const cdesc &cv, const tdesc &x, const fdesc &w, int *on, int *oc, int *oh, int *ow,
                      const char *who) {
  if (!cv.set || !x.set || !w.set) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: a descriptor was never set", who);
  if (x.c != w.c * cv.groups)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: input has %d channels, filter %d per group x %d groups", who, x.c, w.c,
                  cv.groups);
  if (w.k % cv.groups)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: %d output channels do not divide into %d groups", who, w.k, cv.groups);
  const int eh = (w.r - 1) * cv.dh + 1, ew = (w.s - 1) * cv.dw + 1;
  const int h = x.h + 2 * cv.ph - eh, wd = x.w + 2 * cv.pw - ew;
  if (h < 0 || wd < 0)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: dilated filter %dx%d larger than padded input %dx%d", who, eh, ew,
                  x.h + 2 * cv.ph, x.w + 2 * cv.pw);
  *on = x.n, *oc = w.k, *oh = h / cv.u + 1, *ow = wd / cv.v + 1;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t conv_geo(const tdesc &x, const fdesc &w, const cdesc &cv, const tdesc &y, geo *g, const char *who) {
  int on, oc, oh, ow;
  cudnnStatus_t s = out_dim(cv, x, w, &on, &oc, &oh, &ow, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (!y.set) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: output descriptor never set", who);
  if (x.dt != w.dt || x.dt != y.dt)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: data types x %d, w %d, y %d differ (emulated: one of FLOAT, HALF, "
                  "BFLOAT16 for all)", who, (int)x.dt, (int)w.dt, (int)y.dt);
  if (cv.compute != CUDNN_DATA_FLOAT)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: compute type %d (emulated: FLOAT)", who, (int)cv.compute);
  if (y.n != on || y.c != oc || y.h != oh || y.w != ow)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: output descriptor [%d,%d,%d,%d], the convolution gives [%d,%d,%d,%d]",
                  who, y.n, y.c, y.h, y.w, on, oc, oh, ow);
  g->N = x.n, g->C = x.c, g->H = x.h, g->W = x.w, g->K = w.k, g->Cg = w.c, g->G = cv.groups, g->Kg = w.k / cv.groups;
  g->R = w.r, g->S = w.s, g->OH = oh, g->OW = ow;
  g->ph = cv.ph, g->pw = cv.pw, g->u = cv.u, g->v = cv.v, g->dh = cv.dh, g->dw = cv.dw;
  g->flip = cv.mode == CUDNN_CONVOLUTION;
  g->dt = x.dt;
  g->nhwc = x.fmt == CUDNN_TENSOR_NHWC || y.fmt == CUDNN_TENSOR_NHWC || w.fmt == CUDNN_TENSOR_NHWC;
  g->tf32 = x.dt == CUDNN_DATA_FLOAT && tf32_allowed(cv.math);
  return CUDNN_STATUS_SUCCESS;
}

/* sum a[c] * b[c] in four interleaved partial sums: a single running sum
 * waits on each add, and the order of a double sum of float products
 * moves the result far below any tolerance the tests apply. */
inline double dot(const double *a, const double *b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int c = 0;
  for (; c + 4 <= n; c += 4) s0 += a[c] * b[c], s1 += a[c + 1] * b[c + 1], s2 += a[c + 2] * b[c + 2], s3 += a[c + 3] * b[c + 3];
  for (; c < n; c++) s0 += a[c] * b[c];
  return (s0 + s1) + (s2 + s3);
}

/* y[n][oh][ow][k] = sum x[n][ih][iw][g*Cg + c] * w[k][r][s][c] */
std::vector<double> conv_fwd(const geo &g, const std::vector<double> &x, const std::vector<double> &w) {
  std::vector<double> y((size_t)g.N * g.OH * g.OW * g.K);
  size_t o = 0;
  for (int n = 0; n < g.N; n++)
    for (int oh = 0; oh < g.OH; oh++)
      for (int ow = 0; ow < g.OW; ow++)
        for (int k = 0; k < g.K; k++) {
          const int gi = k / g.Kg;
          double acc = 0;
          for (int r = 0; r < g.R; r++) {
            const int ih = oh * g.u - g.ph + r * g.dh;
            if (ih < 0 || ih >= g.H) continue;
            for (int s = 0; s < g.S; s++) {
              const int iw = ow * g.v - g.pw + s * g.dw;
              if (iw < 0 || iw >= g.W) continue;
              const double *xp = &x[(((size_t)n * g.H + ih) * g.W + iw) * g.C + (size_t)gi * g.Cg];
              const double *wp = &w[(((size_t)k * g.R + r) * g.S + s) * g.Cg];
              acc += dot(xp, wp, g.Cg);
            }
          }
          y[o++] = acc;
        }
  return y;
}

/* dx[n][ih][iw][g*Cg + c] = sum dy[n][oh][ow][k] * w[k][r][s][c] over the taps that reach it. */
std::vector<double> conv_bwd_data(const geo &g, const std::vector<double> &dy, const std::vector<double> &w) {
  std::vector<double> dx((size_t)g.N * g.H * g.W * g.C, 0.0);
  for (int n = 0; n < g.N; n++)
    for (int oh = 0; oh < g.OH; oh++)
      for (int ow = 0; ow < g.OW; ow++)
        for (int k = 0; k < g.K; k++) {
          const double d = dy[(((size_t)n * g.OH + oh) * g.OW + ow) * g.K + k];
          if (d == 0.0) continue;
          const int gi = k / g.Kg;
          for (int r = 0; r < g.R; r++) {
            const int ih = oh * g.u - g.ph + r * g.dh;
            if (ih < 0 || ih >= g.H) continue;
            for (int s = 0; s < g.S; s++) {
              const int iw = ow * g.v - g.pw + s * g.dw;
              if (iw < 0 || iw >= g.W) continue;
              double *xp = &dx[(((size_t)n * g.H + ih) * g.W + iw) * g.C + (size_t)gi * g.Cg];
              const double *wp = &w[(((size_t)k * g.R + r) * g.S + s) * g.Cg];
              for (int c = 0; c < g.Cg; c++) xp[c] += d * wp[c];
            }
          }
        }
  return dx;
}

/* dw[k][r][s][c] = sum dy[n][oh][ow][k] * x[n][ih][iw][g*Cg + c] */
std::vector<double> conv_bwd_filter(const geo &g, const std::vector<double> &x, const std::vector<double> &dy) {
  std::vector<double> dw((size_t)g.K * g.R * g.S * g.Cg, 0.0);
  for (int n = 0; n < g.N; n++)
    for (int oh = 0; oh < g.OH; oh++)
      for (int ow = 0; ow < g.OW; ow++)
        for (int k = 0; k < g.K; k++) {
          const double d = dy[(((size_t)n * g.OH + oh) * g.OW + ow) * g.K + k];
          if (d == 0.0) continue;
          const int gi = k / g.Kg;
          for (int r = 0; r < g.R; r++) {
            const int ih = oh * g.u - g.ph + r * g.dh;
            if (ih < 0 || ih >= g.H) continue;
            for (int s = 0; s < g.S; s++) {
              const int iw = ow * g.v - g.pw + s * g.dw;
              if (iw < 0 || iw >= g.W) continue;
              const double *xp = &x[(((size_t)n * g.H + ih) * g.W + iw) * g.C + (size_t)gi * g.Cg];
              double *wp = &dw[(((size_t)k * g.R + r) * g.S + s) * g.Cg];
              for (int c = 0; c < g.Cg; c++) wp[c] += d * xp[c];
            }
          }
        }
  return dw;
}

/* ---- algorithms and workspaces ----------------------------------------- */

enum pass { FWD, BWD_DATA, BWD_FILTER };

/* The offered algorithms of a pass, best first: [0] uses a workspace. */
const int offered[3][2] = {
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0},
};
const int algo_count[3] = {CUDNN_CONVOLUTION_FWD_ALGO_COUNT, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                           CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT};

/* Workspace of algorithm algo; -1 when it is not offered. A shape-dependent
 * size (an index table per filter tap and channel, as a precomputed-offset
 * kernel would keep), so callers cannot get by with a constant. */
int64_t algo_workspace(pass p, int algo, const geo &g) {
  if (algo == offered[p][1]) return 0;
  if (algo != offered[p][0]) return -1;
  if (big_ws()) {
    const int64_t x = (int64_t)g.N * g.C * g.H * g.W, y = (int64_t)g.N * g.K * g.OH * g.OW;
    return 256 + 4 * (x > y ? x : y);
  }
  return 256 + (int64_t)g.R * g.S * g.Cg * 8;
}

bool deterministic(pass p, int algo) {
  if (p == BWD_DATA) return algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
  if (p == BWD_FILTER) return algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 && algo != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
  return true;
}

/* The math type an offered algorithm is listed with: FMA stays FMA;
 * otherwise tensor-op kernels rank first (TF32 for FLOAT on Ampere+). */
cudnnMathType_t listed_math(cudnnMathType_t m) {
  return m == CUDNN_DEFAULT_MATH ? CUDNN_TENSOR_OP_MATH : m;
}

template <typename Perf, typename Algo>
cudnnStatus_t list_algos(pass p, const geo &g, cudnnMathType_t math, bool measured, int requested, int *returned,
                         Perf *perf, const char *who) {
  if (requested < 1 || !returned || !perf)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: requestedAlgoCount %d (must be >= 1) or a NULL output", who, requested);
  const bool refused = g.nhwc && no_nhwc();
  if (refused && measured)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, "%s: no NHWC algorithm (CT_EMU_DNN_NO_NHWC)", who);
  const int n = requested < 2 ? requested : 2;
  for (int i = 0; i < n; i++) {
    Perf q;
    memset(&q, 0, sizeof q);
    const int algo = offered[p][nondet() && p != FWD ? 1 - i : i];
    q.algo = (Algo)algo;
    q.status = refused ? CUDNN_STATUS_NOT_SUPPORTED_LAYOUT : CUDNN_STATUS_SUCCESS;
    q.time = measured ? 0.01f * (float)(i + 1) * thin_c_factor(g) : -1.0f;
    q.memory = (size_t)algo_workspace(p, algo, g);
    q.determinism = deterministic(p, algo) ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
    q.mathType = listed_math(math);
    perf[i] = q;
  }
  *returned = n;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t workspace_size(pass p, const geo &g, int algo, size_t *size, const char *who) {
  if (!size) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: sizeInBytes is NULL", who);
  if (algo < 0 || algo >= algo_count[p]) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: algorithm %d out of range", who, algo);
  const int64_t ws = algo_workspace(p, algo, g);
  if (ws < 0) return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: algorithm %d is not one the emulator offers", who, algo);
  *size = (size_t)ws;
  return CUDNN_STATUS_SUCCESS;
}

float scalar(const void *p) { return *(const float *)p; }

bool dev(const void *p, size_t bytes, const char *who, const char *what) {
  return ct_emu::check_device_range(p, bytes, who, what);
}

/* The checks common to the three compute calls: handle, scalars, algorithm,
 * workspace (size, then device range). *need is the workspace to scribble. */
cudnnStatus_t check_call(cudnnHandle_t h, const void *alpha, const void *beta, pass p, const geo &g, int algo,
                         void *ws, size_t wsb, size_t *need, const char *who) {
  if (!h) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle", who);
  if (!alpha || !beta) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL alpha or beta", who);
  if (algo < 0 || algo >= algo_count[p]) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: algorithm %d out of range", who, algo);
  const int64_t req = algo_workspace(p, algo, g);
  if (req < 0) return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: algorithm %d is not one the emulator offers", who, algo);
  if (g.nhwc && no_nhwc())
    return refuse(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, "%s: algorithm %d has no NHWC kernel (CT_EMU_DNN_NO_NHWC)", who, algo);
  if (algo == offered[p][0] && first_fails())
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: algorithm %d refuses to run (CT_EMU_DNN_FIRST_FAILS)", who, algo);
  if (wsb < (size_t)req)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: workspace of %zu bytes, algorithm %d needs %lld", who, wsb, algo,
                  (long long)req);
  if (wsb > 0 && !ws) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL workspace with size %zu", who, wsb);
  *need = (size_t)req;
  return CUDNN_STATUS_SUCCESS;
}

/* ---- batch norm --------------------------------------------------------- */

struct bn_geo {
  tdesc x;
  int M; /* N*H*W per channel */
};

cudnnStatus_t bn_check_mode(cudnnBatchNormMode_t mode, bool persistent_ok, const char *who) {
  if (mode == CUDNN_BATCHNORM_SPATIAL || (persistent_ok && mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT))
    return CUDNN_STATUS_SUCCESS;
  return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: batch-norm mode %d (emulated: SPATIAL%s)", who, (int)mode,
                persistent_ok ? ", SPATIAL_PERSISTENT" : "");
}

/* CT_EMU_BN_NO_FUSED=1 stands in for a cuDNN with no fused batch-norm
 * kernel at all. */
bool no_fused() {
  static const bool on = ct_emu::env_flag("CT_EMU_BN_NO_FUSED");
  return on;
}

/* OPS_BN without an activation descriptor, or OPS_BN_ACTIVATION with a
 * RELU one in SPATIAL_PERSISTENT mode (*fused = true). */
cudnnStatus_t bn_check_ops(cudnnBatchNormOps_t ops, cudnnActivationDescriptor_t act, cudnnBatchNormMode_t mode,
                           bool *fused, const char *who) {
  *fused = ops == CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
  if (ops == CUDNN_BATCHNORM_OPS_BN && !act) return CUDNN_STATUS_SUCCESS;
  if (*fused && act && act->d.set && act->d.mode == CUDNN_ACTIVATION_RELU &&
      mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT && !no_fused())
    return CUDNN_STATUS_SUCCESS;
  return refuse(CUDNN_STATUS_NOT_SUPPORTED,
                "%s: bnOps %d / activation descriptor %p in mode %d (emulated: OPS_BN without an activation, "
                "OPS_BN_ACTIVATION with RELU in SPATIAL_PERSISTENT%s)",
                who, (int)ops, (void *)act, (int)mode, no_fused() ? ", not under CT_EMU_BN_NO_FUSED" : "");
}

/* The data the fused kernels take: fully packed NHWC HALF/BFLOAT16, C a
 * multiple of 4 (every activation tensor: the mask bits are numbered by
 * y's element index). */
cudnnStatus_t bn_check_fused(const tdesc &x, const char *who) {
  const bool nhwc = x.cs == 1 && x.ws == x.c && x.hs == (int64_t)x.w * x.c && x.ns == (int64_t)x.h * x.w * x.c;
  if (nhwc && (x.dt == CUDNN_DATA_HALF || x.dt == CUDNN_DATA_BFLOAT16) && x.c % 4 == 0) return CUDNN_STATUS_SUCCESS;
  return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: fused batch norm on [%d,%d,%d,%d] type %d %s (emulated: packed NHWC "
                "HALF/BFLOAT16, C a multiple of 4)", who, x.n, x.c, x.h, x.w, (int)x.dt, nhwc ? "NHWC" : "not NHWC");
}

cudnnStatus_t bn_check_fused(const cudnnTensorDescriptor_t *acts, int n, const char *who) {
  for (int i = 0; i < n; i++) {
    cudnnStatus_t s = bn_check_fused(acts[i]->d, who);
    if (s != CUDNN_STATUS_SUCCESS) return s;
  }
  return CUDNN_STATUS_SUCCESS;
}

/* x-like descriptors alike, the parameter descriptor 1xCx1x1 FLOAT. */
cudnnStatus_t bn_check_descs(const cudnnTensorDescriptor_t *acts, int na, cudnnTensorDescriptor_t pd, bn_geo *g,
                             const char *who) {
  for (int i = 0; i < na; i++)
    if (!acts[i] || !acts[i]->d.set) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: tensor descriptor %d not set", who, i);
  const tdesc &x = acts[0]->d;
  if (!supported_type(x.dt)) return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: data type %d", who, (int)x.dt);
  for (int i = 1; i < na; i++) {
    const tdesc &t = acts[i]->d;
    if (t.n != x.n || t.c != x.c || t.h != x.h || t.w != x.w || t.dt != x.dt)
      return refuse(CUDNN_STATUS_BAD_PARAM, "%s: tensor %d is [%d,%d,%d,%d] type %d, x is [%d,%d,%d,%d] type %d", who,
                    i, t.n, t.c, t.h, t.w, (int)t.dt, x.n, x.c, x.h, x.w, (int)x.dt);
  }
  if (!pd || !pd->d.set) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: parameter descriptor not set", who);
  const tdesc &p = pd->d;
  if (p.n != 1 || p.c != x.c || p.h != 1 || p.w != 1 || p.dt != CUDNN_DATA_FLOAT)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: parameter descriptor [%d,%d,%d,%d] type %d, expected [1,%d,1,1] FLOAT",
                  who, p.n, p.c, p.h, p.w, (int)p.dt, x.c);
  g->x = x;
  g->M = x.n * x.h * x.w;
  return CUDNN_STATUS_SUCCESS;
}

/* The channel's values in (n, h, w) order and their element indices. */
void bn_channel(const tdesc &t, int c, std::vector<int64_t> &idx) {
  idx.clear();
  for (int n = 0; n < t.n; n++)
    for (int h = 0; h < t.h; h++)
      for (int w = 0; w < t.w; w++) idx.push_back(n * t.ns + c * t.cs + h * t.hs + w * t.ws);
}

void blend_param(float *p, int c, double alpha, double beta, double v) {
  double r = alpha * v;
  if (beta != 0.0) r += beta * p[c];
  p[c] = (float)r;
}

int64_t bn_workspace(cudnnBatchNormMode_t mode, const tdesc &x) {
  (void)mode;
  return 256 + (int64_t)x.c * 2 * (int64_t)sizeof(double);
}

/* The persistent part of the reserve. */
int64_t bn_reserve_base(cudnnBatchNormMode_t mode, const tdesc &x) {
  return mode == CUDNN_BATCHNORM_SPATIAL_PERSISTENT ? 256 + (int64_t)x.c * 2 * (int64_t)sizeof(float) : 0;
}

/* Fused: the base, then one mask bit per element. */
int64_t bn_reserve(cudnnBatchNormMode_t mode, const tdesc &x, bool fused) {
  const int64_t elems = (int64_t)x.n * x.c * x.h * x.w;
  return bn_reserve_base(mode, x) + (fused ? (elems + 7) / 8 : 0);
}

uint8_t *bn_mask(void *reserve, cudnnBatchNormMode_t mode, const tdesc &x) {
  return (uint8_t *)reserve + bn_reserve_base(mode, x);
}

/* CT_EMU_BN_RESERVE_REQUIRED=1: the stricter reading of cuDNN's
 * documentation, under which a call that asks for a reserve space
 * (SPATIAL_PERSISTENT here) refuses to run without one. */
bool reserve_required() {
  static const bool on = ct_emu::env_flag("CT_EMU_BN_RESERVE_REQUIRED");
  return on;
}

/* Workspace and reserve: NULL with 0 bytes is the non-Ex behaviour (not
 * for a needed reserve under reserve_required()); otherwise at least the
 * queried size, in device memory. */
cudnnStatus_t bn_check_space(const char *who, const char *what, void *p, size_t bytes, int64_t need, bool *ok,
                             bool mandatory = false) {
  *ok = true;
  if (!p && need > 0 && (mandatory || (reserve_required() && !strcmp(what, "reserveSpace"))))
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: %s NULL, %lld bytes needed (CT_EMU_BN_RESERVE_REQUIRED)", who, what,
                  (long long)need);
  if (!p && bytes == 0) return CUDNN_STATUS_SUCCESS;
  if (!p || bytes < (size_t)need)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: %s %p of %zu bytes, %lld needed", who, what, p, bytes, (long long)need);
  *ok = dev(p, bytes, who, what);
  return CUDNN_STATUS_SUCCESS;
}

/* The trace line of a batch-norm call (emu.h: CT_EMU_TRACE). */
void trace_bn(cudnnHandle_t h, const char *who, const tdesc &x, bool fused = false) {
  ct_emu::trace(h->stream, "cudnn %s x %d,%d,%d,%d%s dtype %d", who, x.n, x.c, x.h, x.w, fused ? " relu" : "",
                (int)x.dt);
}

/* What the three compute calls share after their geometry: the call
 * checks, every operand (then the workspace) in device memory, and
 * compute(alpha, beta) queued on the handle's stream behind a workspace
 * overwritten with garbage, as the library uses it as scratch. */
struct operand {
  const void *p;
  size_t bytes;
  const char *name;
};
template <class F>
cudnnStatus_t queue_conv(cudnnHandle_t handle, const void *alpha, const void *beta, pass ps, const geo &g, int algo,
                         void *ws, size_t wsb, std::initializer_list<operand> ops, const char *who, F compute) {
  size_t need = 0;
  cudnnStatus_t s = check_call(handle, alpha, beta, ps, g, algo, ws, wsb, &need, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  bool ok = true;
  for (const operand &o : ops) ok = ok && dev(o.p, o.bytes, who, o.name);
  if (!ok || !dev(ws, wsb, who, "workSpace"))
    return refuse(CUDNN_STATUS_EXECUTION_FAILED, "%s: an argument is not device memory", who);
  const double a = scalar(alpha), b = scalar(beta);
  ct_emu::trace(handle->stream, "cudnn %s x %d,%d,%d,%d w %d,%d,%d,%d y %d,%d groups %d %s dtype %d flops %.0f", who,
                g.N, g.C, g.H, g.W, g.K, g.Cg, g.R, g.S, g.OH, g.OW, g.G, g.nhwc ? "nhwc" : "nchw", (int)g.dt,
                2.0 * g.N * g.K * g.OH * g.OW * g.Cg * g.R * g.S);
  ct_emu::enqueue(handle->stream, [=] {
    if (need) memset(ws, 0xff, need);
    compute(a, b);
  });
  return CUDNN_STATUS_SUCCESS;
}

/* The legacy descriptors that describe a graph-API convolution. */
cudnnStatus_t graph_descs(const ct_emu::dnn_conv &c, tdesc *x, fdesc *w, cdesc *cv, tdesc *y, const char *who) {
  if (!supported_type(c.dt))
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: data type %d (emulated: FLOAT, HALF, BFLOAT16)", who, (int)c.dt);
  const int64_t *dims[3] = {c.x, c.w, c.y};
  for (const int64_t *d : dims)
    for (int i = 0; i < 4; i++)
      if (d[i] < 1 || d[i] > INT_MAX)
        return refuse(CUDNN_STATUS_BAD_PARAM, "%s: dimension %lld out of 1..INT_MAX", who, (long long)d[i]);
  auto tensor = [&](const int64_t *d, const int64_t *s) {
    tdesc t;
    t.set = true, t.dt = c.dt, t.fmt = s[1] == 1 && d[1] > 1 ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    t.n = (int)d[0], t.c = (int)d[1], t.h = (int)d[2], t.w = (int)d[3];
    t.ns = s[0], t.cs = s[1], t.hs = s[2], t.ws = s[3];
    return t;
  };
  *x = tensor(c.x, c.xs), *y = tensor(c.y, c.ys);
  const int64_t K = c.w[0], C = c.w[1], R = c.w[2], S = c.w[3];
  const int64_t *st = c.wst;
  const bool kcrs = st[0] == C * R * S && st[1] == R * S && st[2] == S && st[3] == 1;
  const bool krsc = st[0] == R * S * C && st[1] == 1 && st[2] == S * C && st[3] == C;
  if (!kcrs && !krsc)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: filter strides %lld,%lld,%lld,%lld are neither packed KCRS nor KRSC",
                  who, (long long)st[0], (long long)st[1], (long long)st[2], (long long)st[3]);
  *w = fdesc{true, c.dt, kcrs ? CUDNN_TENSOR_NCHW : CUDNN_TENSOR_NHWC, (int)K, (int)C, (int)R, (int)S};
  if (x->c % w->c)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: %d input channels, filter %d per group", who, x->c, w->c);
  for (int i = 0; i < 2; i++)
    if (c.pad[i] < 0 || c.stride[i] < 1 || c.dil[i] < 1)
      return refuse(CUDNN_STATUS_BAD_PARAM, "%s: pad %lld stride %lld dilation %lld", who, (long long)c.pad[i],
                    (long long)c.stride[i], (long long)c.dil[i]);
  cdesc d;
  d.set = true;
  d.ph = (int)c.pad[0], d.pw = (int)c.pad[1], d.u = (int)c.stride[0], d.v = (int)c.stride[1];
  d.dh = (int)c.dil[0], d.dw = (int)c.dil[1];
  d.mode = c.cross ? CUDNN_CROSS_CORRELATION : CUDNN_CONVOLUTION;
  d.compute = CUDNN_DATA_FLOAT;
  d.groups = x->c / w->c;
  d.math = c.tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
  *cv = d;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

namespace ct_emu {

cudnnStatus_t dnn_refuse(cudnnStatus_t s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vrefuse(s, fmt, ap);
  va_end(ap);
  return s;
}

bool dnn_no_nhwc() { return no_nhwc(); }
bool dnn_big_ws() { return big_ws(); }
bool dnn_first_fails() { return first_fails(); }
bool dnn_nondet() { return nondet(); }

cudnnStatus_t conv_check(const dnn_conv &c, const char *who) {
  tdesc x, y;
  fdesc w;
  cdesc cv;
  geo g{};
  cudnnStatus_t s = graph_descs(c, &x, &w, &cv, &y, who);
  return s != CUDNN_STATUS_SUCCESS ? s : conv_geo(x, w, cv, y, &g, who);
}

cudnnStatus_t conv_queue(cudnnHandle_t h, const dnn_conv &c, void *x, void *w, void *y, double alpha, double beta,
                         void *ws, size_t ws_need, const char *who) {
  tdesc xd, yd;
  fdesc wd;
  cdesc cv;
  geo g{};
  cudnnStatus_t s = graph_descs(c, &xd, &wd, &cv, &yd, who);
  if (s == CUDNN_STATUS_SUCCESS) s = conv_geo(xd, wd, cv, yd, &g, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (!h) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle", who);
  const char *names[3][3] = {{"x", "w", "y"}, {"dx", "w", "dy"}, {"x", "dw", "dy"}};
  const char *const *nm = names[c.pass];
  if (!dev(x, tensor_bytes(xd), who, nm[0]) || !dev(w, filter_bytes(wd), who, nm[1]) ||
      !dev(y, tensor_bytes(yd), who, nm[2]) || !dev(ws, ws_need, who, "workspace"))
    return refuse(CUDNN_STATUS_EXECUTION_FAILED, "%s: an argument is not device memory", who);
  ct_emu::trace(h->stream, "cudnn %s x %d,%d,%d,%d w %d,%d,%d,%d y %d,%d groups %d %s dtype %d flops %.0f", who, g.N,
                g.C, g.H, g.W, g.K, g.Cg, g.R, g.S, g.OH, g.OW, g.G, g.nhwc ? "nhwc" : "nchw", (int)g.dt,
                2.0 * g.N * g.K * g.OH * g.OW * g.Cg * g.R * g.S);
  const int pass = c.pass;
  const bool vary = c.nondet;
  const uint64_t key = 1000 + (uint64_t)c.engine * 4 + (uint64_t)pass; /* apart from the legacy algorithms' keys */
  ct_emu::enqueue(h->stream, [=] {
    if (ws_need) memset(ws, 0xff, ws_need);
    if (pass == 0) {
      std::vector<double> r = conv_fwd(g, gather_nhwc(x, xd, g.tf32), gather_filter(w, wd, g.flip, g.tf32));
      as_algorithm(r, key, false, yd.dt);
      scatter_nhwc(y, yd, r, alpha, beta);
    } else if (pass == 1) {
      std::vector<double> r = conv_bwd_data(g, gather_nhwc(y, yd, g.tf32), gather_filter(w, wd, g.flip, g.tf32));
      as_algorithm(r, key, vary, xd.dt);
      scatter_nhwc(x, xd, r, alpha, beta);
    } else {
      std::vector<double> r = conv_bwd_filter(g, gather_nhwc(x, xd, g.tf32), gather_nhwc(y, yd, g.tf32));
      as_algorithm(r, key, vary, wd.dt);
      scatter_filter(w, wd, g.flip, r, alpha, beta);
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace ct_emu

/* ---- the API ------------------------------------------------------------ */

extern "C" {

const char *CUDNNWINAPI cudnnGetErrorString(cudnnStatus_t status) {
  switch ((int)status) {
#define S(x) \
  case x: return #x;
    S(CUDNN_STATUS_SUCCESS)
    S(CUDNN_STATUS_NOT_INITIALIZED)
    S(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH)
    S(CUDNN_STATUS_DEPRECATED)
    S(CUDNN_STATUS_BAD_PARAM)
    S(CUDNN_STATUS_BAD_PARAM_NULL_POINTER)
    S(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND)
    S(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT)
    S(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH)
    S(CUDNN_STATUS_NOT_SUPPORTED)
    S(CUDNN_STATUS_NOT_SUPPORTED_SHAPE)
    S(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE)
    S(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT)
    S(CUDNN_STATUS_INTERNAL_ERROR)
    S(CUDNN_STATUS_EXECUTION_FAILED)
#undef S
    default: return "CUDNN_STATUS_UNKNOWN (emulated cuDNN)";
  }
}

void CUDNNWINAPI cudnnGetLastErrorString(char *message, size_t max_size) {
  if (!message || !max_size) return;
  snprintf(message, max_size, "%s", last_error.c_str());
  last_error.clear();
}

size_t CUDNNWINAPI cudnnGetVersion(void) { return CUDNN_VERSION; }

cudnnStatus_t CUDNNWINAPI cudnnCreate(cudnnHandle_t *handle) {
  if (!handle) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnCreate: NULL handle pointer");
  *handle = new cudnnContext{nullptr};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroy(cudnnHandle_t handle) {
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
  if (!handle) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: NULL handle");
  handle->stream = streamId;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnGetStream(cudnnHandle_t handle, cudaStream_t *streamId) {
  if (!handle || !streamId) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnGetStream: NULL argument");
  *streamId = handle->stream;
  return CUDNN_STATUS_SUCCESS;
}

/* tensors */

cudnnStatus_t CUDNNWINAPI cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc) {
  if (!tensorDesc) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnCreateTensorDescriptor: NULL pointer");
  *tensorDesc = new cudnnTensorStruct();
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc) {
  delete tensorDesc;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t t, cudnnTensorFormat_t format,
                                                     cudnnDataType_t dataType, int n, int c, int h, int w) {
  static const char *who = "cudnnSetTensor4dDescriptor";
  if (!t) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL descriptor", who);
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: dims [%d,%d,%d,%d] must be positive", who, n, c, h, w);
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: format %d (emulated: NCHW, NHWC)", who, (int)format);
  if (!supported_type(dataType))
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: data type %d (emulated: FLOAT, HALF, BFLOAT16)", who, (int)dataType);
  if ((double)n * c * h * w > (double)INT_MAX)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: [%d,%d,%d,%d] exceeds 2^31-1 elements", who, n, c, h, w);
  tdesc d;
  d.set = true, d.dt = dataType, d.fmt = format, d.n = n, d.c = c, d.h = h, d.w = w;
  if (format == CUDNN_TENSOR_NCHW) d.ws = 1, d.hs = w, d.cs = (int64_t)h * w, d.ns = (int64_t)c * h * w;
  else d.cs = 1, d.ws = c, d.hs = (int64_t)w * c, d.ns = (int64_t)h * w * c;
  t->d = d;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t t, cudnnDataType_t *dataType,
                                                     int *n, int *c, int *h, int *w, int *nStride, int *cStride,
                                                     int *hStride, int *wStride) {
  if (!t || !t->d.set) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnGetTensor4dDescriptor: descriptor not set");
  if (!dataType || !n || !c || !h || !w || !nStride || !cStride || !hStride || !wStride)
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnGetTensor4dDescriptor: NULL output");
  const tdesc &d = t->d;
  *dataType = d.dt, *n = d.n, *c = d.c, *h = d.h, *w = d.w;
  *nStride = (int)d.ns, *cStride = (int)d.cs, *hStride = (int)d.hs, *wStride = (int)d.ws;
  return CUDNN_STATUS_SUCCESS;
}

/* filters */

cudnnStatus_t CUDNNWINAPI cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *filterDesc) {
  if (!filterDesc) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnCreateFilterDescriptor: NULL pointer");
  *filterDesc = new cudnnFilterStruct();
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc) {
  delete filterDesc;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t f, cudnnDataType_t dataType,
                                                     cudnnTensorFormat_t format, int k, int c, int h, int w) {
  static const char *who = "cudnnSetFilter4dDescriptor";
  if (!f) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL descriptor", who);
  if (k <= 0 || c <= 0 || h <= 0 || w <= 0)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: dims [%d,%d,%d,%d] must be positive", who, k, c, h, w);
  if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: format %d (emulated: NCHW = KCRS, NHWC = KRSC)", who, (int)format);
  if (!supported_type(dataType))
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: data type %d (emulated: FLOAT, HALF, BFLOAT16)", who, (int)dataType);
  if ((double)k * c * h * w > (double)INT_MAX)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: [%d,%d,%d,%d] exceeds 2^31-1 elements", who, k, c, h, w);
  f->d = fdesc{true, dataType, format, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}

/* convolutions */

cudnnStatus_t CUDNNWINAPI cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *convDesc) {
  if (!convDesc) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnCreateConvolutionDescriptor: NULL pointer");
  *convDesc = new cudnnConvolutionStruct();
  (*convDesc)->d.groups = 1;
  (*convDesc)->d.math = CUDNN_DEFAULT_MATH;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc) {
  delete convDesc;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t *activationDesc) {
  if (!activationDesc) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnCreateActivationDescriptor: NULL pointer");
  *activationDesc = new cudnnActivationStruct();
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetActivationDescriptor(cudnnActivationDescriptor_t activationDesc,
                                                       cudnnActivationMode_t mode, cudnnNanPropagation_t reluNanOpt,
                                                       double coef) {
  (void)reluNanOpt;
  if (!activationDesc) return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnSetActivationDescriptor: NULL descriptor");
  activationDesc->d = adesc{true, mode, coef};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t activationDesc) {
  delete activationDesc;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t cv, int pad_h, int pad_w,
                                                          int u, int v, int dilation_h, int dilation_w,
                                                          cudnnConvolutionMode_t mode, cudnnDataType_t computeType) {
  static const char *who = "cudnnSetConvolution2dDescriptor";
  if (!cv) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL descriptor", who);
  if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: pad %d,%d stride %d,%d dilation %d,%d", who, pad_h, pad_w, u, v,
                  dilation_h, dilation_w);
  if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: mode %d", who, (int)mode);
  if (computeType != CUDNN_DATA_FLOAT)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: compute type %d (emulated: FLOAT)", who, (int)computeType);
  cdesc &d = cv->d;
  d.set = true;
  d.ph = pad_h, d.pw = pad_w, d.u = u, d.v = v, d.dh = dilation_h, d.dw = dilation_w;
  d.mode = mode, d.compute = computeType;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t cv, int groupCount) {
  if (!cv || groupCount < 1)
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionGroupCount: group count %d", groupCount);
  cv->d.groups = groupCount;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t cv, cudnnMathType_t mathType) {
  if (!cv || (mathType != CUDNN_DEFAULT_MATH && mathType != CUDNN_TENSOR_OP_MATH &&
              mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION && mathType != CUDNN_FMA_MATH))
    return refuse(CUDNN_STATUS_BAD_PARAM, "cudnnSetConvolutionMathType: math type %d", (int)mathType);
  cv->d.math = mathType;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t cv,
                                                                const cudnnTensorDescriptor_t x,
                                                                const cudnnFilterDescriptor_t w, int *n, int *c,
                                                                int *h, int *wo) {
  static const char *who = "cudnnGetConvolution2dForwardOutputDim";
  if (!cv || !x || !w || !n || !c || !h || !wo) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL argument", who);
  return out_dim(cv->d, x->d, w->d, n, c, h, wo, who);
}

/* algorithm queries */

#define GEO_OR_RETURN(xd, wd, cvd, yd, who)                      \
  geo g{};                                                       \
  if (!(xd) || !(wd) || !(cvd) || !(yd))                         \
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL descriptor", who); \
  {                                                              \
    cudnnStatus_t s_ = conv_geo((xd)->d, (wd)->d, (cvd)->d, (yd)->d, &g, who); \
    if (s_ != CUDNN_STATUS_SUCCESS) return s_;                   \
  }

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t x,
                                                                 const cudnnFilterDescriptor_t w,
                                                                 const cudnnConvolutionDescriptor_t cv,
                                                                 const cudnnTensorDescriptor_t y, const int requested,
                                                                 int *returned, cudnnConvolutionFwdAlgoPerf_t *perf) {
  static const char *who = "cudnnGetConvolutionForwardAlgorithm_v7";
  if (!handle) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle", who);
  GEO_OR_RETURN(x, w, cv, y, who);
  return list_algos<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(FWD, g, cv->d.math, false, requested,
                                                                              returned, perf, who);
}

cudnnStatus_t CUDNNWINAPI cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t handle, const cudnnTensorDescriptor_t x,
                                                               const cudnnFilterDescriptor_t w,
                                                               const cudnnConvolutionDescriptor_t cv,
                                                               const cudnnTensorDescriptor_t y, const int requested,
                                                               int *returned, cudnnConvolutionFwdAlgoPerf_t *perf) {
  static const char *who = "cudnnFindConvolutionForwardAlgorithm";
  if (!handle) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle", who);
  GEO_OR_RETURN(x, w, cv, y, who);
  return list_algos<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(FWD, g, cv->d.math, true, requested,
                                                                              returned, perf, who);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t cv, const cudnnTensorDescriptor_t dx, const int requested, int *returned,
    cudnnConvolutionBwdDataAlgoPerf_t *perf) {
  static const char *who = "cudnnGetConvolutionBackwardDataAlgorithm_v7";
  if (!handle) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle", who);
  GEO_OR_RETURN(dx, w, cv, dy, who);
  return list_algos<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(BWD_DATA, g, cv->d.math, false,
                                                                                      requested, returned, perf, who);
}

cudnnStatus_t CUDNNWINAPI cudnnFindConvolutionBackwardDataAlgorithm(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t cv, const cudnnTensorDescriptor_t dx, const int requested, int *returned,
    cudnnConvolutionBwdDataAlgoPerf_t *perf) {
  static const char *who = "cudnnFindConvolutionBackwardDataAlgorithm";
  if (!handle) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle", who);
  GEO_OR_RETURN(dx, w, cv, dy, who);
  return list_algos<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(BWD_DATA, g, cv->d.math, true,
                                                                                      requested, returned, perf, who);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t cv, const cudnnFilterDescriptor_t dw, const int requested, int *returned,
    cudnnConvolutionBwdFilterAlgoPerf_t *perf) {
  static const char *who = "cudnnGetConvolutionBackwardFilterAlgorithm_v7";
  if (!handle) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle", who);
  GEO_OR_RETURN(x, dw, cv, dy, who);
  return list_algos<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      BWD_FILTER, g, cv->d.math, false, requested, returned, perf, who);
}

cudnnStatus_t CUDNNWINAPI cudnnFindConvolutionBackwardFilterAlgorithm(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t cv, const cudnnFilterDescriptor_t dw, const int requested, int *returned,
    cudnnConvolutionBwdFilterAlgoPerf_t *perf) {
  static const char *who = "cudnnFindConvolutionBackwardFilterAlgorithm";
  if (!handle) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle", who);
  GEO_OR_RETURN(x, dw, cv, dy, who);
  return list_algos<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      BWD_FILTER, g, cv->d.math, true, requested, returned, perf, who);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle,
                                                                  const cudnnTensorDescriptor_t x,
                                                                  const cudnnFilterDescriptor_t w,
                                                                  const cudnnConvolutionDescriptor_t cv,
                                                                  const cudnnTensorDescriptor_t y,
                                                                  cudnnConvolutionFwdAlgo_t algo, size_t *size) {
  static const char *who = "cudnnGetConvolutionForwardWorkspaceSize";
  if (!handle) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle", who);
  GEO_OR_RETURN(x, w, cv, y, who);
  return workspace_size(FWD, g, (int)algo, size, who);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle,
                                                                       const cudnnFilterDescriptor_t w,
                                                                       const cudnnTensorDescriptor_t dy,
                                                                       const cudnnConvolutionDescriptor_t cv,
                                                                       const cudnnTensorDescriptor_t dx,
                                                                       cudnnConvolutionBwdDataAlgo_t algo,
                                                                       size_t *size) {
  static const char *who = "cudnnGetConvolutionBackwardDataWorkspaceSize";
  if (!handle) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle", who);
  GEO_OR_RETURN(dx, w, cv, dy, who);
  return workspace_size(BWD_DATA, g, (int)algo, size, who);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle,
                                                                         const cudnnTensorDescriptor_t x,
                                                                         const cudnnTensorDescriptor_t dy,
                                                                         const cudnnConvolutionDescriptor_t cv,
                                                                         const cudnnFilterDescriptor_t dw,
                                                                         cudnnConvolutionBwdFilterAlgo_t algo,
                                                                         size_t *size) {
  static const char *who = "cudnnGetConvolutionBackwardFilterWorkspaceSize";
  if (!handle) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle", who);
  GEO_OR_RETURN(x, dw, cv, dy, who);
  return workspace_size(BWD_FILTER, g, (int)algo, size, who);
}

/* convolution compute */

cudnnStatus_t CUDNNWINAPI cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
                                                  const cudnnTensorDescriptor_t xDesc, const void *x,
                                                  const cudnnFilterDescriptor_t wDesc, const void *w,
                                                  const cudnnConvolutionDescriptor_t convDesc,
                                                  cudnnConvolutionFwdAlgo_t algo, void *workSpace,
                                                  size_t workSpaceSizeInBytes, const void *beta,
                                                  const cudnnTensorDescriptor_t yDesc, void *y) {
  static const char *who = "cudnnConvolutionForward";
  GEO_OR_RETURN(xDesc, wDesc, convDesc, yDesc, who);
  const tdesc xd = xDesc->d, yd = yDesc->d;
  const fdesc wd = wDesc->d;
  return queue_conv(handle, alpha, beta, FWD, g, (int)algo, workSpace, workSpaceSizeInBytes,
                    {{x, tensor_bytes(xd), "x"}, {w, filter_bytes(wd), "w"}, {y, tensor_bytes(yd), "y"}}, who,
                    [=](double a, double b) {
                      const std::vector<double> xv = gather_nhwc(x, xd, g.tf32),
                                                wv = gather_filter(w, wd, g.flip, g.tf32);
                      std::vector<double> r = conv_fwd(g, xv, wv);
                      as_algorithm(r, FWD * 64 + (int)algo, false, yd.dt);
                      scatter_nhwc(y, yd, r, a, b);
                    });
}

cudnnStatus_t CUDNNWINAPI cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
                                                       const cudnnFilterDescriptor_t wDesc, const void *w,
                                                       const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                                       const cudnnConvolutionDescriptor_t convDesc,
                                                       cudnnConvolutionBwdDataAlgo_t algo, void *workSpace,
                                                       size_t workSpaceSizeInBytes, const void *beta,
                                                       const cudnnTensorDescriptor_t dxDesc, void *dx) {
  static const char *who = "cudnnConvolutionBackwardData";
  GEO_OR_RETURN(dxDesc, wDesc, convDesc, dyDesc, who);
  const tdesc dxd = dxDesc->d, dyd = dyDesc->d;
  const fdesc wd = wDesc->d;
  return queue_conv(handle, alpha, beta, BWD_DATA, g, (int)algo, workSpace, workSpaceSizeInBytes,
                    {{w, filter_bytes(wd), "w"}, {dy, tensor_bytes(dyd), "dy"}, {dx, tensor_bytes(dxd), "dx"}}, who,
                    [=](double a, double b) {
                      const std::vector<double> dyv = gather_nhwc(dy, dyd, g.tf32),
                                                wv = gather_filter(w, wd, g.flip, g.tf32);
                      std::vector<double> r = conv_bwd_data(g, dyv, wv);
                      as_algorithm(r, BWD_DATA * 64 + (int)algo, nondet() && !deterministic(BWD_DATA, (int)algo),
                                   dxd.dt);
                      scatter_nhwc(dx, dxd, r, a, b);
                    });
}

cudnnStatus_t CUDNNWINAPI cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
                                                         const cudnnTensorDescriptor_t xDesc, const void *x,
                                                         const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                                         const cudnnConvolutionDescriptor_t convDesc,
                                                         cudnnConvolutionBwdFilterAlgo_t algo, void *workSpace,
                                                         size_t workSpaceSizeInBytes, const void *beta,
                                                         const cudnnFilterDescriptor_t dwDesc, void *dw) {
  static const char *who = "cudnnConvolutionBackwardFilter";
  GEO_OR_RETURN(xDesc, dwDesc, convDesc, dyDesc, who);
  const tdesc xd = xDesc->d, dyd = dyDesc->d;
  const fdesc wd = dwDesc->d;
  return queue_conv(handle, alpha, beta, BWD_FILTER, g, (int)algo, workSpace, workSpaceSizeInBytes,
                    {{x, tensor_bytes(xd), "x"}, {dy, tensor_bytes(dyd), "dy"}, {dw, filter_bytes(wd), "dw"}}, who,
                    [=](double a, double b) {
                      const std::vector<double> xv = gather_nhwc(x, xd, g.tf32), dyv = gather_nhwc(dy, dyd, g.tf32);
                      std::vector<double> r = conv_bwd_filter(g, xv, dyv);
                      as_algorithm(r, BWD_FILTER * 64 + (int)algo,
                                   nondet() && !deterministic(BWD_FILTER, (int)algo), wd.dt);
                      scatter_filter(dw, wd, g.flip, r, a, b);
                    });
}

/* batch norm */

cudnnStatus_t CUDNNWINAPI cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derived,
                                                        const cudnnTensorDescriptor_t xDesc,
                                                        cudnnBatchNormMode_t mode) {
  static const char *who = "cudnnDeriveBNTensorDescriptor";
  if (!derived || !xDesc || !xDesc->d.set) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: descriptor not set", who);
  cudnnStatus_t s = bn_check_mode(mode, true, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  /* HALF/BFLOAT16/FLOAT data take FLOAT parameters */
  return cudnnSetTensor4dDescriptor(derived, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, xDesc->d.c, 1, 1);
}

cudnnStatus_t CUDNNWINAPI cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const cudnnTensorDescriptor_t xDesc,
    const cudnnTensorDescriptor_t zDesc, const cudnnTensorDescriptor_t yDesc,
    const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const cudnnActivationDescriptor_t activationDesc,
    size_t *sizeInBytes) {
  static const char *who = "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize";
  if (!handle || !sizeInBytes) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL argument", who);
  bool fused = false;
  cudnnStatus_t s = bn_check_mode(mode, true, who);
  if (s == CUDNN_STATUS_SUCCESS) s = bn_check_ops(bnOps, activationDesc, mode, &fused, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (zDesc) return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: zDesc (emulated: no add)", who);
  const cudnnTensorDescriptor_t acts[] = {xDesc, yDesc};
  bn_geo g{};
  s = bn_check_descs(acts, 2, bnScaleBiasMeanVarDesc, &g, who);
  if (s == CUDNN_STATUS_SUCCESS && fused) s = bn_check_fused(acts, 2, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  *sizeInBytes = (size_t)bn_workspace(mode, g.x);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const cudnnTensorDescriptor_t xDesc,
    const cudnnTensorDescriptor_t yDesc, const cudnnTensorDescriptor_t dyDesc, const cudnnTensorDescriptor_t dzDesc,
    const cudnnTensorDescriptor_t dxDesc, const cudnnTensorDescriptor_t dBnScaleBiasDesc,
    const cudnnActivationDescriptor_t activationDesc, size_t *sizeInBytes) {
  static const char *who = "cudnnGetBatchNormalizationBackwardExWorkspaceSize";
  if (!handle || !sizeInBytes) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL argument", who);
  bool fused = false;
  cudnnStatus_t s = bn_check_mode(mode, true, who);
  if (s == CUDNN_STATUS_SUCCESS) s = bn_check_ops(bnOps, activationDesc, mode, &fused, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (dzDesc) return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: dzDesc (emulated: no add)", who);
  /* yDesc is only read with an activation */
  const cudnnTensorDescriptor_t acts[] = {xDesc, dyDesc, dxDesc, yDesc};
  bn_geo g{};
  s = bn_check_descs(acts, fused ? 4 : 3, dBnScaleBiasDesc, &g, who);
  if (s == CUDNN_STATUS_SUCCESS && fused) s = bn_check_fused(acts, 4, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  *sizeInBytes = (size_t)bn_workspace(mode, g.x);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps,
    const cudnnActivationDescriptor_t activationDesc, const cudnnTensorDescriptor_t xDesc, size_t *sizeInBytes) {
  static const char *who = "cudnnGetBatchNormalizationTrainingExReserveSpaceSize";
  if (!handle || !sizeInBytes || !xDesc || !xDesc->d.set)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL argument or unset descriptor", who);
  bool fused = false;
  cudnnStatus_t s = bn_check_mode(mode, true, who);
  if (s == CUDNN_STATUS_SUCCESS) s = bn_check_ops(bnOps, activationDesc, mode, &fused, who);
  if (s == CUDNN_STATUS_SUCCESS && fused) s = bn_check_fused(xDesc->d, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  *sizeInBytes = (size_t)bn_reserve(mode, xDesc->d, fused);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnBatchNormalizationForwardTrainingEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *xData, const cudnnTensorDescriptor_t zDesc, const void *zData,
    const cudnnTensorDescriptor_t yDesc, void *yData, const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc,
    const void *bnScale, const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    void *resultRunningVariance, double epsilon, void *resultSaveMean, void *resultSaveInvVariance,
    cudnnActivationDescriptor_t activationDesc, void *workspace, size_t workSpaceSizeInBytes, void *reserveSpace,
    size_t reserveSpaceSizeInBytes) {
  static const char *who = "cudnnBatchNormalizationForwardTrainingEx";
  if (!handle || !alpha || !beta) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle, alpha or beta", who);
  bool fused = false;
  cudnnStatus_t s = bn_check_mode(mode, true, who);
  if (s == CUDNN_STATUS_SUCCESS) s = bn_check_ops(bnOps, activationDesc, mode, &fused, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (zDesc || zData) return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: z (emulated: no add)", who);
  const cudnnTensorDescriptor_t acts[] = {xDesc, yDesc};
  bn_geo g{};
  s = bn_check_descs(acts, 2, bnScaleBiasMeanVarDesc, &g, who);
  if (s == CUDNN_STATUS_SUCCESS && fused) s = bn_check_fused(acts, 2, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (!(epsilon >= CUDNN_BN_MIN_EPSILON))
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: epsilon %g below CUDNN_BN_MIN_EPSILON %g", who, epsilon,
                  (double)CUDNN_BN_MIN_EPSILON);
  if (!bnScale || !bnBias || !xData || !yData) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL data pointer", who);
  if (!resultRunningMean != !resultRunningVariance)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: resultRunningMean and resultRunningVariance must both be NULL or not",
                  who);
  if (!resultSaveMean != !resultSaveInvVariance)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: resultSaveMean and resultSaveInvVariance must both be NULL or not", who);
  const bool running = resultRunningMean, save = resultSaveMean;
  if (running && g.M < 2)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: %d value(s) per channel: no unbiased variance for the running "
                  "statistics", who, g.M);
  const tdesc xd = xDesc->d, yd = yDesc->d;
  const size_t pb = (size_t)xd.c * sizeof(float);
  bool ok = true, ok2 = true;
  s = bn_check_space(who, "workspace", workspace, workSpaceSizeInBytes, bn_workspace(mode, xd), &ok);
  if (s == CUDNN_STATUS_SUCCESS)
    s = bn_check_space(who, "reserveSpace", reserveSpace, reserveSpaceSizeInBytes, bn_reserve(mode, xd, fused), &ok2,
                       fused);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (!ok || !ok2 || !dev(xData, tensor_bytes(xd), who, "x") || !dev(yData, tensor_bytes(yd), who, "y") ||
      !dev(bnScale, pb, who, "bnScale") || !dev(bnBias, pb, who, "bnBias") ||
      (running && (!dev(resultRunningMean, pb, who, "resultRunningMean") ||
                   !dev(resultRunningVariance, pb, who, "resultRunningVariance"))) ||
      (save && (!dev(resultSaveMean, pb, who, "resultSaveMean") ||
                !dev(resultSaveInvVariance, pb, who, "resultSaveInvVariance"))))
    return refuse(CUDNN_STATUS_EXECUTION_FAILED, "%s: an argument is not device memory", who);
  const double a = scalar(alpha), b = scalar(beta), f = exponentialAverageFactor, eps = epsilon;
  const size_t wsb = workspace ? workSpaceSizeInBytes : 0;
  const int M = g.M;
  uint8_t *mask = fused ? bn_mask(reserveSpace, mode, xd) : nullptr;
  trace_bn(handle, who, xd, fused);
  ct_emu::enqueue(handle->stream, [=] {
    if (wsb) memset(workspace, 0xff, wsb);
    std::vector<int64_t> xi, yi;
    for (int c = 0; c < xd.c; c++) {
      bn_channel(xd, c, xi);
      bn_channel(yd, c, yi);
      double sum = 0;
      for (int64_t i : xi) sum += load(xData, xd.dt, i);
      const double mean = sum / M;
      double sq = 0;
      for (int64_t i : xi) {
        const double d = load(xData, xd.dt, i) - mean;
        sq += d * d;
      }
      const double var = sq / M, inv = 1.0 / std::sqrt(var + eps);
      const double gm = ((const float *)bnScale)[c], bt = ((const float *)bnBias)[c];
      for (size_t j = 0; j < xi.size(); j++) {
        double v = gm * (load(xData, xd.dt, xi[j]) - mean) * inv + bt;
        if (fused) {
          /* y's element index (packed NHWC) numbers the mask bits */
          const int64_t e = yi[j];
          if (v > 0) mask[e / 8] |= (uint8_t)(1u << (e % 8));
          else mask[e / 8] &= (uint8_t)~(1u << (e % 8));
          if (!(v > 0)) v = std::isnan(v) ? v : 0.0;
        }
        double r = a * v;
        if (b != 0.0) r += b * load(yData, yd.dt, yi[j]);
        store(yData, yd.dt, yi[j], r);
      }
      if (running) {
        float *rm = (float *)resultRunningMean, *rv = (float *)resultRunningVariance;
        rm[c] = (float)((1.0 - f) * rm[c] + f * mean);
        rv[c] = (float)((1.0 - f) * rv[c] + f * var * M / (M - 1));
      }
      if (save) {
        ((float *)resultSaveMean)[c] = (float)mean;
        ((float *)resultSaveInvVariance)[c] = (float)inv;
      }
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnBatchNormalizationForwardInference(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xDesc, const void *x, const cudnnTensorDescriptor_t yDesc, void *y,
    const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale, const void *bnBias,
    const void *estimatedMean, const void *estimatedVariance, double epsilon) {
  static const char *who = "cudnnBatchNormalizationForwardInference";
  if (!handle || !alpha || !beta) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle, alpha or beta", who);
  cudnnStatus_t s = bn_check_mode(mode, false, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  const cudnnTensorDescriptor_t acts[] = {xDesc, yDesc};
  bn_geo g{};
  s = bn_check_descs(acts, 2, bnScaleBiasMeanVarDesc, &g, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (!(epsilon >= CUDNN_BN_MIN_EPSILON))
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: epsilon %g below CUDNN_BN_MIN_EPSILON %g", who, epsilon,
                  (double)CUDNN_BN_MIN_EPSILON);
  if (!x || !y || !bnScale || !bnBias || !estimatedMean || !estimatedVariance)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL data pointer", who);
  const tdesc xd = xDesc->d, yd = yDesc->d;
  const size_t pb = (size_t)xd.c * sizeof(float);
  if (!dev(x, tensor_bytes(xd), who, "x") || !dev(y, tensor_bytes(yd), who, "y") || !dev(bnScale, pb, who, "bnScale") ||
      !dev(bnBias, pb, who, "bnBias") || !dev(estimatedMean, pb, who, "estimatedMean") ||
      !dev(estimatedVariance, pb, who, "estimatedVariance"))
    return refuse(CUDNN_STATUS_EXECUTION_FAILED, "%s: an argument is not device memory", who);
  const double a = scalar(alpha), b = scalar(beta), eps = epsilon;
  trace_bn(handle, who, xd);
  ct_emu::enqueue(handle->stream, [=] {
    std::vector<int64_t> xi, yi;
    for (int c = 0; c < xd.c; c++) {
      bn_channel(xd, c, xi);
      bn_channel(yd, c, yi);
      const double mean = ((const float *)estimatedMean)[c], var = ((const float *)estimatedVariance)[c];
      const double inv = 1.0 / std::sqrt(var + eps);
      const double gm = ((const float *)bnScale)[c], bt = ((const float *)bnBias)[c];
      for (size_t j = 0; j < xi.size(); j++) {
        double r = a * (gm * (load(x, xd.dt, xi[j]) - mean) * inv + bt);
        if (b != 0.0) r += b * load(y, yd.dt, yi[j]);
        store(y, yd.dt, yi[j], r);
      }
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnBatchNormalizationBackwardEx(
    cudnnHandle_t handle, cudnnBatchNormMode_t mode, cudnnBatchNormOps_t bnOps, const void *alphaDataDiff,
    const void *betaDataDiff, const void *alphaParamDiff, const void *betaParamDiff,
    const cudnnTensorDescriptor_t xDesc, const void *xData, const cudnnTensorDescriptor_t yDesc, const void *yData,
    const cudnnTensorDescriptor_t dyDesc, const void *dyData, const cudnnTensorDescriptor_t dzDesc, void *dzData,
    const cudnnTensorDescriptor_t dxDesc, void *dxData, const cudnnTensorDescriptor_t dBnScaleBiasDesc,
    const void *bnScaleData, const void *bnBiasData, void *dBnScaleData, void *dBnBiasData, double epsilon,
    const void *savedMean, const void *savedInvVariance, cudnnActivationDescriptor_t activationDesc, void *workSpace,
    size_t workSpaceSizeInBytes, void *reserveSpace, size_t reserveSpaceSizeInBytes) {
  static const char *who = "cudnnBatchNormalizationBackwardEx";
  if (!handle || !alphaDataDiff || !betaDataDiff || !alphaParamDiff || !betaParamDiff)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle or scaling factor", who);
  bool fused = false;
  cudnnStatus_t s = bn_check_mode(mode, true, who);
  if (s == CUDNN_STATUS_SUCCESS) s = bn_check_ops(bnOps, activationDesc, mode, &fused, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (dzDesc || dzData) return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: dz (emulated: no add)", who);
  if (!fused && yData) return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: y data with OPS_BN (emulated: NULL)", who);
  if (fused && (!yData || !bnBiasData))
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: the fused backward needs y and the bias", who);
  const cudnnTensorDescriptor_t acts[] = {xDesc, dyDesc, dxDesc, yDesc};
  bn_geo g{};
  s = bn_check_descs(acts, fused ? 4 : 3, dBnScaleBiasDesc, &g, who);
  if (s == CUDNN_STATUS_SUCCESS && fused) s = bn_check_fused(acts, 4, who);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (!(epsilon >= CUDNN_BN_MIN_EPSILON))
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: epsilon %g below CUDNN_BN_MIN_EPSILON %g", who, epsilon,
                  (double)CUDNN_BN_MIN_EPSILON);
  if (!xData || !dyData || !dxData || !bnScaleData || !dBnScaleData || !dBnBiasData)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: NULL data pointer", who);
  if (!savedMean != !savedInvVariance)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: savedMean and savedInvVariance must both be NULL or not", who);
  const bool saved = savedMean;
  const tdesc xd = xDesc->d, dyd = dyDesc->d, dxd = dxDesc->d;
  const size_t pb = (size_t)xd.c * sizeof(float);
  bool ok = true, ok2 = true;
  s = bn_check_space(who, "workSpace", workSpace, workSpaceSizeInBytes, bn_workspace(mode, xd), &ok);
  if (s == CUDNN_STATUS_SUCCESS)
    s = bn_check_space(who, "reserveSpace", reserveSpace, reserveSpaceSizeInBytes, bn_reserve(mode, xd, fused), &ok2,
                       fused);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  if (!ok || !ok2 || !dev(xData, tensor_bytes(xd), who, "x") || !dev(dyData, tensor_bytes(dyd), who, "dy") ||
      !dev(dxData, tensor_bytes(dxd), who, "dx") || !dev(bnScaleData, pb, who, "bnScale") ||
      (fused && (!dev(yData, tensor_bytes(yDesc->d), who, "y") || !dev(bnBiasData, pb, who, "bnBias"))) ||
      !dev(dBnScaleData, pb, who, "dBnScale") || !dev(dBnBiasData, pb, who, "dBnBias") ||
      (saved && (!dev(savedMean, pb, who, "savedMean") || !dev(savedInvVariance, pb, who, "savedInvVariance"))))
    return refuse(CUDNN_STATUS_EXECUTION_FAILED, "%s: an argument is not device memory", who);
  const double ad = scalar(alphaDataDiff), bd = scalar(betaDataDiff), ap = scalar(alphaParamDiff),
               bp = scalar(betaParamDiff), eps = epsilon;
  const size_t wsb = workSpace ? workSpaceSizeInBytes : 0;
  const int M = g.M;
  const uint8_t *mask = fused ? bn_mask(reserveSpace, mode, xd) : nullptr;
  const tdesc yd = fused ? yDesc->d : xd;
  trace_bn(handle, who, xd, fused);
  ct_emu::enqueue(handle->stream, [=] {
    if (wsb) memset(workSpace, 0xff, wsb);
    std::vector<int64_t> xi, dyi, dxi, yi;
    for (int c = 0; c < xd.c; c++) {
      bn_channel(xd, c, xi);
      bn_channel(dyd, c, dyi);
      bn_channel(dxd, c, dxi);
      bn_channel(yd, c, yi);
      /* dy through the ReLU: the forward's mask bits (numbered by y's index) */
      auto grad = [&](size_t j) {
        const double d = load(dyData, dyd.dt, dyi[j]);
        return !mask || (mask[yi[j] / 8] >> (yi[j] % 8) & 1) ? d : 0.0;
      };
      double mean, inv;
      if (saved) {
        mean = ((const float *)savedMean)[c];
        inv = ((const float *)savedInvVariance)[c];
      } else {
        double sum = 0, sq = 0;
        for (int64_t i : xi) sum += load(xData, xd.dt, i);
        mean = sum / M;
        for (int64_t i : xi) {
          const double d = load(xData, xd.dt, i) - mean;
          sq += d * d;
        }
        inv = 1.0 / std::sqrt(sq / M + eps);
      }
      double sdy = 0, sdyx = 0;
      for (size_t j = 0; j < xi.size(); j++) {
        const double d = grad(j);
        sdy += d;
        sdyx += d * (load(xData, xd.dt, xi[j]) - mean) * inv;
      }
      const double gm = ((const float *)bnScaleData)[c];
      for (size_t j = 0; j < xi.size(); j++) {
        const double xh = (load(xData, xd.dt, xi[j]) - mean) * inv;
        const double d = grad(j);
        double r = ad * (gm * inv / M * (M * d - sdy - xh * sdyx));
        if (bd != 0.0) r += bd * load(dxData, dxd.dt, dxi[j]);
        store(dxData, dxd.dt, dxi[j], r);
      }
      blend_param((float *)dBnScaleData, c, ap, bp, sdyx);
      blend_param((float *)dBnBiasData, c, ap, bp, sdy);
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
