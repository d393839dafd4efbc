/* Self-test of the emulated cuDNN (emu_cudnn.cpp): each call against a
 * direct double-precision computation written here, independently of the
 * emulator's loops, on random inputs.
 *
 * Convolutions: forward, backward data and backward filter for NCHW and
 * NHWC, f32/f16/bf16, groups, stride/pad/dilation, CUDNN_CONVOLUTION (the
 * flipped filter), alpha/beta blending; TF32 (DEFAULT math) against FMA
 * math; backward data and filter also checked through the adjoint identities
 * <conv(x,w), dy> = <x, bwd_data(dy,w)> = <w, bwd_filter(x,dy)>. Algorithm
 * lists and workspace sizes agree, a short workspace is refused. Batch norm:
 * training (outputs, saved and running statistics), inference and backward
 * against the formulas, the backward also against finite differences of the
 * forward, blending factors, epsilon below the minimum refused. Last, a host
 * pointer handed to a convolution is reported (cudaErrorIllegalAddress).
 *
 * Exit status 0 when every check passes. */
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "emu_selftest.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace {


uint64_t rng = 0x9E3779B97F4A7C15ull;
double frand() { /* uniform in [-1, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (double)(rng >> 11) / (double)(1ull << 52) - 1.0;
}

/* ---- the test's own 16-bit conversions (not the emulator's) ---- */
uint16_t to_half(double v) {
  _Float16 h = (_Float16)(float)v;
  uint16_t b;
  memcpy(&b, &h, 2);
  return b;
}
double from_half(uint16_t b) {
  _Float16 h;
  memcpy(&h, &b, 2);
  return (double)(float)h;
}
uint16_t to_bf16(double v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint32_t lsb = (u >> 16) & 1;
  return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}
double from_bf16(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
double tf32(double v) {
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, 4);
  u = (u + 0xfffu + ((u >> 13) & 1)) & ~0x1fffu;
  memcpy(&f, &u, 4);
  return f;
}

/* A device buffer with a host mirror in one dtype; values kept as double. */
struct buf {
  cudnnDataType_t t;
  size_t n;
  void *d = nullptr;
  buf(cudnnDataType_t t_, size_t n_) : t(t_), n(n_) {
    if (cudaMalloc(&d, bytes()) != cudaSuccess) {
      fprintf(stderr, "cudaMalloc failed\n");
      exit(2);
    }
  }
  ~buf() { cudaFree(d); }
  buf(const buf &) = delete;
  buf &operator=(const buf &) = delete;
  size_t es() const { return t == CUDNN_DATA_FLOAT ? 4 : 2; }
  size_t bytes() const { return n * es(); }
  /* writes v (rounded to the dtype) to the device; returns the rounded values */
  std::vector<double> put(const std::vector<double> &v) {
    std::vector<unsigned char> h(bytes());
    std::vector<double> r(n);
    for (size_t i = 0; i < n; i++) {
      if (t == CUDNN_DATA_FLOAT) {
        float f = (float)v[i];
        memcpy(&h[4 * i], &f, 4);
        r[i] = f;
      } else {
        uint16_t b = t == CUDNN_DATA_HALF ? to_half(v[i]) : to_bf16(v[i]);
        memcpy(&h[2 * i], &b, 2);
        r[i] = t == CUDNN_DATA_HALF ? from_half(b) : from_bf16(b);
      }
    }
    cudaMemcpy(d, h.data(), bytes(), cudaMemcpyHostToDevice);
    return r;
  }
  std::vector<double> random() {
    std::vector<double> v(n);
    for (auto &x : v) x = frand();
    return put(v);
  }
  std::vector<double> get() const {
    std::vector<unsigned char> h(bytes());
    cudaMemcpy(h.data(), d, bytes(), cudaMemcpyDeviceToHost);
    std::vector<double> r(n);
    for (size_t i = 0; i < n; i++) {
      if (t == CUDNN_DATA_FLOAT) {
        float f;
        memcpy(&f, &h[4 * i], 4);
        r[i] = f;
      } else {
        uint16_t b;
        memcpy(&b, &h[2 * i], 2);
        r[i] = t == CUDNN_DATA_HALF ? from_half(b) : from_bf16(b);
      }
    }
    return r;
  }
};

/* v rounded to f32, then to t (round to nearest even) */
double round_to(cudnnDataType_t t, double v) {
  const float f = (float)v;
  return t == CUDNN_DATA_FLOAT ? f : t == CUDNN_DATA_HALF ? from_half(to_half(f)) : from_bf16(to_bf16(f));
}

double rel_of(cudnnDataType_t t) {
  return t == CUDNN_DATA_FLOAT ? 1.2e-7 : t == CUDNN_DATA_HALF ? 1.0 / 1024 : 1.0 / 128;
}

/* max over i of |got - want| / (rel * |want| + abs_tol); <= 1 passes */
double worst(const std::vector<double> &got, const std::vector<double> &want, double rel, double abs_tol) {
  double w = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double e = std::fabs(got[i] - want[i]) / (rel * std::fabs(want[i]) + abs_tol);
    if (!(e <= w)) w = std::isnan(e) ? INFINITY : e;
  }
  return w;
}

/* ---- convolution ---- */

struct conv_case {
  const char *name;
  int N, C, H, W, K, R, S, groups, ph, pw, u, v, dh, dw;
  bool nhwc, flip;
  cudnnDataType_t t;
  cudnnMathType_t math;
  float alpha, beta;
};

struct shape {
  int N, C, H, W;
  bool nhwc;
  size_t idx(int n, int c, int h, int w) const {
    return nhwc ? (((size_t)n * H + h) * W + w) * C + c : (((size_t)n * C + c) * H + h) * W + w;
  }
  size_t count() const { return (size_t)N * C * H * W; }
};

/* filter [K][Cg][R][S] logical; KRSC memory when nhwc */
struct fshape {
  int K, Cg, R, S;
  bool nhwc;
  size_t idx(int k, int c, int r, int s) const {
    return nhwc ? (((size_t)k * R + r) * S + s) * Cg + c : (((size_t)k * Cg + c) * R + r) * S + s;
  }
  size_t count() const { return (size_t)K * Cg * R * S; }
};

/* The taps of the convolution, in the most direct form: calls
 * f(x index, w index, y index) for every product. */
template <typename F>
void for_each_tap(const conv_case &k, const shape &xs, const fshape &ws, const shape &ys, F f) {
  const int Cg = k.C / k.groups, Kg = k.K / k.groups;
  for (int n = 0; n < k.N; n++)
    for (int o = 0; o < k.K; o++)
      for (int oh = 0; oh < ys.H; oh++)
        for (int ow = 0; ow < ys.W; ow++)
          for (int c = 0; c < Cg; c++)
            for (int r = 0; r < k.R; r++)
              for (int s = 0; s < k.S; s++) {
                const int ih = oh * k.u - k.ph + r * k.dh, iw = ow * k.v - k.pw + s * k.dw;
                if (ih < 0 || ih >= k.H || iw < 0 || iw >= k.W) continue;
                const int rr = k.flip ? k.R - 1 - r : r, ss = k.flip ? k.S - 1 - s : s;
                f(xs.idx(n, (o / Kg) * Cg + c, ih, iw), ws.idx(o, c, rr, ss), ys.idx(n, o, oh, ow));
              }
}

struct conv_env {
  cudnnHandle_t h;
  cudnnTensorDescriptor_t xd, yd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cv;
};

double dot(const std::vector<double> &a, const std::vector<double> &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

/* Runs the three passes of case k; returns the forward output (for the TF32
 * comparison). Checks each pass against the direct computation. */
std::vector<double> run_conv(cudnnHandle_t h, const conv_case &k, uint64_t seed, bool adjoint) {
  rng = seed;
  const cudnnTensorFormat_t fmt = k.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  const int Cg = k.C / k.groups;
  conv_env e{h, nullptr, nullptr, nullptr, nullptr};
  DNN_OK(cudnnCreateTensorDescriptor(&e.xd));
  DNN_OK(cudnnCreateTensorDescriptor(&e.yd));
  DNN_OK(cudnnCreateFilterDescriptor(&e.wd));
  DNN_OK(cudnnCreateConvolutionDescriptor(&e.cv));
  DNN_OK(cudnnSetTensor4dDescriptor(e.xd, fmt, k.t, k.N, k.C, k.H, k.W));
  DNN_OK(cudnnSetFilter4dDescriptor(e.wd, k.t, fmt, k.K, Cg, k.R, k.S));
  DNN_OK(cudnnSetConvolution2dDescriptor(e.cv, k.ph, k.pw, k.u, k.v, k.dh, k.dw,
                                         k.flip ? CUDNN_CONVOLUTION : CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  DNN_OK(cudnnSetConvolutionGroupCount(e.cv, k.groups));
  DNN_OK(cudnnSetConvolutionMathType(e.cv, k.math));
  int on = 0, oc = 0, oh = 0, ow = 0;
  DNN_OK(cudnnGetConvolution2dForwardOutputDim(e.cv, e.xd, e.wd, &on, &oc, &oh, &ow));
  const int eoh = (k.H + 2 * k.ph - (k.R - 1) * k.dh - 1) / k.u + 1, eow = (k.W + 2 * k.pw - (k.S - 1) * k.dw - 1) / k.v + 1;
  EXPECT(on == k.N && oc == k.K && oh == eoh && ow == eow, "%s: output dim %d,%d,%d,%d, expected %d,%d,%d,%d", k.name,
         on, oc, oh, ow, k.N, k.K, eoh, eow);
  DNN_OK(cudnnSetTensor4dDescriptor(e.yd, fmt, k.t, k.N, k.K, oh, ow));

  const shape xs{k.N, k.C, k.H, k.W, k.nhwc}, ys{k.N, k.K, oh, ow, k.nhwc};
  const fshape wsh{k.K, Cg, k.R, k.S, k.nhwc};
  buf x(k.t, xs.count()), w(k.t, wsh.count()), y(k.t, ys.count()), dy(k.t, ys.count()), dx(k.t, xs.count()),
      dw(k.t, wsh.count());
  const std::vector<double> xv = x.random(), wv = w.random(), dyv = dy.random();
  const std::vector<double> y0 = y.random(), dx0 = dx.random(), dw0 = dw.random();
  const bool use_tf32 = k.t == CUDNN_DATA_FLOAT && k.math != CUDNN_FMA_MATH;
  auto in = [&](double v) { return use_tf32 ? tf32(v) : v; };

  /* references: alpha * sum + beta * prior, and the sum of |terms| for the tolerance */
  std::vector<double> ry(ys.count(), 0), ay(ys.count(), 0), rdx(xs.count(), 0), adx(xs.count(), 0),
      rdw(wsh.count(), 0), adw(wsh.count(), 0);
  for_each_tap(k, xs, wsh, ys, [&](size_t xi, size_t wi, size_t yi) {
    ry[yi] += in(xv[xi]) * in(wv[wi]);
    ay[yi] += std::fabs(xv[xi] * wv[wi]);
    rdx[xi] += in(dyv[yi]) * in(wv[wi]);
    adx[xi] += std::fabs(dyv[yi] * wv[wi]);
    rdw[wi] += in(dyv[yi]) * in(xv[xi]);
    adw[wi] += std::fabs(dyv[yi] * xv[xi]);
  });
  const double a = k.alpha, b = k.beta;
  auto blend = [&](std::vector<double> &r, const std::vector<double> &prior, std::vector<double> &abs_sum) {
    for (size_t i = 0; i < r.size(); i++) {
      r[i] = a * r[i] + b * prior[i];
      abs_sum[i] = std::fabs(a) * abs_sum[i] + std::fabs(b * prior[i]);
    }
  };
  blend(ry, y0, ay);
  blend(rdx, dx0, adx);
  blend(rdw, dw0, adw);
  /* within one rounding of the output type, plus double-vs-f32 blending slack */
  auto within = [&](const std::vector<double> &got, const std::vector<double> &want, const std::vector<double> &abs_sum,
                    const char *what) {
    const double rel = rel_of(k.t);
    double wst = 0;
    size_t at = 0;
    for (size_t i = 0; i < got.size(); i++) {
      const double tol = rel * std::fabs(want[i]) + 1e-6 * abs_sum[i] + 1e-30;
      const double err = std::fabs(got[i] - want[i]) / tol;
      if (!(err <= wst)) wst = std::isnan(err) ? INFINITY : err, at = i;
    }
    EXPECT(wst <= 1.0, "%s %s: worst error %.3g tolerances at %zu (got %.9g want %.9g)", k.name, what, wst, at,
           got[at], want[at]);
    /* and exactly the reference rounded to f32 and then to the type, except
     * where the reference sits within double-summation noise of a boundary */
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); i++) {
      const double lo = round_to(k.t, want[i] - 1e-12 * abs_sum[i]), hi = round_to(k.t, want[i] + 1e-12 * abs_sum[i]);
      if (lo == hi && got[i] != lo) bad++;
    }
    EXPECT(bad == 0, "%s %s: %zu outputs not the correctly rounded reference", k.name, what, bad);
  };

  const float alpha = k.alpha, beta = k.beta;
  /* forward: algorithm list, workspace query, a short workspace refused, the call */
  {
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int n = 0;
    DNN_OK(cudnnGetConvolutionForwardAlgorithm_v7(h, e.xd, e.wd, e.cv, e.yd, 8, &n, perf));
    EXPECT(n >= 1 && n <= 8 && perf[0].status == CUDNN_STATUS_SUCCESS, "%s: fwd algo list n=%d", k.name, n);
    int n1 = 0;
    cudnnConvolutionFwdAlgoPerf_t one[1];
    DNN_OK(cudnnFindConvolutionForwardAlgorithm(h, e.xd, e.wd, e.cv, e.yd, 1, &n1, one));
    EXPECT(n1 == 1, "%s: Find with requestedAlgoCount 1 returned %d", k.name, n1);
    for (int i = 0; i < n; i++) {
      size_t wsb = 1;
      DNN_OK(cudnnGetConvolutionForwardWorkspaceSize(h, e.xd, e.wd, e.cv, e.yd, perf[i].algo, &wsb));
      EXPECT(wsb == perf[i].memory, "%s: fwd algo %d memory %zu, workspace query %zu", k.name, (int)perf[i].algo,
             perf[i].memory, wsb);
    }
    /* emulator policy: the first algorithm takes a workspace, so the short-workspace refusal is reachable */
    EXPECT(perf[0].memory > 0, "%s: first forward algorithm has no workspace", k.name);
    const size_t wsb = perf[0].memory;
    buf ws(CUDNN_DATA_FLOAT, wsb / 4 + 1);
    if (wsb > 0) {
      cudnnStatus_t s = cudnnConvolutionForward(h, &alpha, e.xd, x.d, e.wd, w.d, e.cv, perf[0].algo, ws.d, wsb - 1,
                                                &beta, e.yd, y.d);
      EXPECT(s == CUDNN_STATUS_BAD_PARAM, "%s: short workspace gave %s", k.name, cudnnGetErrorString(s));
    }
    DNN_OK(cudnnConvolutionForward(h, &alpha, e.xd, x.d, e.wd, w.d, e.cv, perf[0].algo, ws.d, wsb, &beta, e.yd, y.d));
    within(y.get(), ry, ay, "forward");
  }
  {
    cudnnConvolutionBwdDataAlgoPerf_t perf[8];
    int n = 0;
    DNN_OK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, e.wd, e.yd, e.cv, e.xd, 8, &n, perf));
    EXPECT(n >= 1 && perf[0].status == CUDNN_STATUS_SUCCESS, "%s: bwd-data algo list n=%d", k.name, n);
    size_t wsb = 1;
    DNN_OK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, e.wd, e.yd, e.cv, e.xd, perf[0].algo, &wsb));
    EXPECT(wsb == perf[0].memory, "%s: bwd-data memory %zu vs query %zu", k.name, perf[0].memory, wsb);
    buf ws(CUDNN_DATA_FLOAT, wsb / 4 + 1);
    DNN_OK(cudnnConvolutionBackwardData(h, &alpha, e.wd, w.d, e.yd, dy.d, e.cv, perf[0].algo, ws.d, wsb, &beta, e.xd,
                                        dx.d));
    within(dx.get(), rdx, adx, "backward data");
  }
  {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[8];
    int n = 0;
    DNN_OK(cudnnFindConvolutionBackwardFilterAlgorithm(h, e.xd, e.yd, e.cv, e.wd, 8, &n, perf));
    EXPECT(n >= 1 && perf[0].status == CUDNN_STATUS_SUCCESS, "%s: bwd-filter algo list n=%d", k.name, n);
    size_t wsb = 1;
    DNN_OK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, e.xd, e.yd, e.cv, e.wd, perf[0].algo, &wsb));
    EXPECT(wsb == perf[0].memory, "%s: bwd-filter memory %zu vs query %zu", k.name, perf[0].memory, wsb);
    buf ws(CUDNN_DATA_FLOAT, wsb / 4 + 1);
    DNN_OK(cudnnConvolutionBackwardFilter(h, &alpha, e.xd, x.d, e.yd, dy.d, e.cv, perf[0].algo, ws.d, wsb, &beta,
                                          e.wd, dw.d));
    within(dw.get(), rdw, adw, "backward filter");
  }
  std::vector<double> yout = y.get();

  /* adjoint identities with alpha 1, beta 0, through the emulator only */
  if (adjoint) {
    const float one = 1.f, zero = 0.f;
    cudnnConvolutionFwdAlgoPerf_t pf[2];
    cudnnConvolutionBwdDataAlgoPerf_t pd[2];
    cudnnConvolutionBwdFilterAlgoPerf_t pw[2];
    int n = 0;
    DNN_OK(cudnnGetConvolutionForwardAlgorithm_v7(h, e.xd, e.wd, e.cv, e.yd, 2, &n, pf));
    DNN_OK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, e.wd, e.yd, e.cv, e.xd, 2, &n, pd));
    DNN_OK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, e.xd, e.yd, e.cv, e.wd, 2, &n, pw));
    /* the second algorithm (no workspace) this time */
    const int i = n > 1 ? 1 : 0;
    buf ws(CUDNN_DATA_FLOAT, (pf[i].memory + pd[i].memory + pw[i].memory) / 4 + 1);
    DNN_OK(cudnnConvolutionForward(h, &one, e.xd, x.d, e.wd, w.d, e.cv, pf[i].algo, ws.d, pf[i].memory, &zero, e.yd,
                                   y.d));
    DNN_OK(cudnnConvolutionBackwardData(h, &one, e.wd, w.d, e.yd, dy.d, e.cv, pd[i].algo, ws.d, pd[i].memory, &zero,
                                        e.xd, dx.d));
    DNN_OK(cudnnConvolutionBackwardFilter(h, &one, e.xd, x.d, e.yd, dy.d, e.cv, pw[i].algo, ws.d, pw[i].memory, &zero,
                                          e.wd, dw.d));
    const double lhs = dot(y.get(), dyv), rx = dot(xv, dx.get()), rw = dot(wv, dw.get());
    double scale = 0;
    for (double v : ay) scale += std::fabs(v);
    /* TF32 rounds different operands in each pass: 2^-11 per input */
    const double tol = (use_tf32 ? 2.0 / 1024 : 4 * rel_of(k.t)) * scale + 1e-9;
    EXPECT(std::fabs(lhs - rx) <= tol, "%s: <conv(x,w),dy> %.9g vs <x,bwd_data(dy,w)> %.9g (tol %.3g)", k.name, lhs,
           rx, tol);
    EXPECT(std::fabs(lhs - rw) <= tol, "%s: <conv(x,w),dy> %.9g vs <w,bwd_filter(x,dy)> %.9g (tol %.3g)", k.name,
           lhs, rw, tol);
  }
  cudnnDestroyConvolutionDescriptor(e.cv);
  cudnnDestroyFilterDescriptor(e.wd);
  cudnnDestroyTensorDescriptor(e.yd);
  cudnnDestroyTensorDescriptor(e.xd);
  return yout;
}

void test_conv(cudnnHandle_t h) {
  const cudnnDataType_t F = CUDNN_DATA_FLOAT, H = CUDNN_DATA_HALF, B = CUDNN_DATA_BFLOAT16;
  const cudnnMathType_t FMA = CUDNN_FMA_MATH, DEF = CUDNN_DEFAULT_MATH, TOP = CUDNN_TENSOR_OP_MATH;
  const conv_case cases[] = {
      /* name               N  C  H  W  K  R  S  g ph pw u  v dh dw nhwc  flip  t  math alpha beta */
      {"nchw f32 plain", 2, 3, 6, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, false, false, F, FMA, 1.f, 0.f},
      {"nchw f32 grouped", 2, 6, 7, 9, 4, 3, 2, 2, 1, 0, 2, 1, 1, 2, false, false, F, FMA, 1.5f, 0.5f},
      {"nhwc f32 grouped", 2, 6, 7, 9, 4, 3, 2, 2, 1, 0, 2, 1, 1, 2, true, false, F, FMA, 1.f, 0.f},
      {"nhwc f32 depthwise", 3, 4, 5, 5, 8, 3, 3, 4, 2, 2, 1, 2, 2, 1, true, false, F, FMA, 0.75f, -1.f},
      {"nchw f32 flipped", 1, 2, 5, 6, 3, 2, 3, 1, 0, 1, 1, 1, 1, 1, false, true, F, FMA, 1.f, 0.f},
      {"nhwc f16", 2, 4, 6, 6, 6, 3, 3, 2, 1, 1, 1, 1, 1, 1, true, false, H, TOP, 1.f, 0.f},
      {"nchw f16 beta", 2, 4, 6, 6, 6, 3, 3, 2, 1, 1, 2, 2, 1, 1, false, false, H, TOP, 1.f, 1.f},
      {"nhwc bf16", 2, 4, 6, 5, 4, 1, 3, 1, 0, 1, 1, 1, 1, 1, true, false, B, TOP, 1.f, 0.f},
      {"nchw bf16 dilated", 1, 3, 8, 8, 3, 3, 3, 3, 2, 2, 1, 1, 2, 2, false, false, B, FMA, 2.f, 0.5f},
  };
  uint64_t seed = 12345;
  for (const conv_case &k : cases) run_conv(h, k, seed++ * 0x2545F4914F6CDD1Dull, true);

  /* TF32 (DEFAULT math) against FMA on the same data: the TF32 run matches
   * its own tf32-rounded reference (checked inside), and the two differ but
   * within 2^-10 of the sum of |terms|. */
  conv_case k = {"nchw f32 tf32", 2, 8, 6, 6, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, false, false, F, DEF, 1.f, 0.f};
  const std::vector<double> yt = run_conv(h, k, 777, true);
  k.math = FMA;
  k.name = "nchw f32 fma";
  const std::vector<double> yf = run_conv(h, k, 777, false);
  double maxd = 0, maxrel = 0;
  for (size_t i = 0; i < yt.size(); i++) {
    maxd = std::fmax(maxd, std::fabs(yt[i] - yf[i]));
    maxrel = std::fmax(maxrel, std::fabs(yt[i] - yf[i]) / (k.C * k.R * k.S));
  }
  EXPECT(maxd > 0, "TF32 and FMA math gave identical results on random data");
  EXPECT(maxrel <= 1.0 / 1024, "TF32 vs FMA differ by %.3g per unit of |terms| (> 2^-10)", maxrel);
}

/* ---- batch norm ---- */

struct bn_case {
  const char *name;
  int N, C, H, W;
  bool nhwc;
  cudnnDataType_t t;
  cudnnBatchNormMode_t mode;
  float alpha, beta;
};

/* The forward in double on the test's side: y for x (logical values). */
std::vector<double> bn_forward_ref(const bn_case &k, const shape &s, const std::vector<double> &x,
                                   const std::vector<double> &g, const std::vector<double> &b, double eps,
                                   std::vector<double> *mean, std::vector<double> *var) {
  std::vector<double> y(x.size());
  const int M = k.N * k.H * k.W;
  for (int c = 0; c < k.C; c++) {
    double m = 0, v = 0;
    for (int n = 0; n < k.N; n++)
      for (int h = 0; h < k.H; h++)
        for (int w = 0; w < k.W; w++) m += x[s.idx(n, c, h, w)];
    m /= M;
    for (int n = 0; n < k.N; n++)
      for (int h = 0; h < k.H; h++)
        for (int w = 0; w < k.W; w++) v += (x[s.idx(n, c, h, w)] - m) * (x[s.idx(n, c, h, w)] - m);
    v /= M;
    if (mean) (*mean)[c] = m, (*var)[c] = v;
    for (int n = 0; n < k.N; n++)
      for (int h = 0; h < k.H; h++)
        for (int w = 0; w < k.W; w++) {
          const size_t i = s.idx(n, c, h, w);
          y[i] = g[c] * (x[i] - m) / std::sqrt(v + eps) + b[c];
        }
  }
  return y;
}

void run_bn(cudnnHandle_t h, const bn_case &k, uint64_t seed) {
  rng = seed;
  const cudnnTensorFormat_t fmt = k.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  cudnnTensorDescriptor_t xd, pd;
  DNN_OK(cudnnCreateTensorDescriptor(&xd));
  DNN_OK(cudnnCreateTensorDescriptor(&pd));
  DNN_OK(cudnnSetTensor4dDescriptor(xd, fmt, k.t, k.N, k.C, k.H, k.W));
  DNN_OK(cudnnDeriveBNTensorDescriptor(pd, xd, k.mode));
  {
    cudnnDataType_t pt;
    int n, c, hh, w, s0, s1, s2, s3;
    DNN_OK(cudnnGetTensor4dDescriptor(pd, &pt, &n, &c, &hh, &w, &s0, &s1, &s2, &s3));
    EXPECT(pt == CUDNN_DATA_FLOAT && n == 1 && c == k.C && hh == 1 && w == 1, "%s: derived descriptor %d [%d,%d,%d,%d]",
           k.name, (int)pt, n, c, hh, w);
  }
  const shape s{k.N, k.C, k.H, k.W, k.nhwc};
  const size_t cnt = s.count();
  const int M = k.N * k.H * k.W;
  const cudnnDataType_t F = CUDNN_DATA_FLOAT;
  buf x(k.t, cnt), y(k.t, cnt), dy(k.t, cnt), dx(k.t, cnt);
  buf g(F, k.C), b(F, k.C), rm(F, k.C), rv(F, k.C), sm(F, k.C), si(F, k.C), dg(F, k.C), db(F, k.C);
  std::vector<double> xv = x.random();
  for (auto &v : xv) v = v * 2 + 0.5; /* a nonzero mean */
  xv = x.put(xv);
  const std::vector<double> gv = g.random(), bv = b.random(), rm0 = rm.random(), y0 = y.random(), dyv = dy.random();
  std::vector<double> rv0(k.C);
  for (auto &v : rv0) v = 0.5 + std::fabs(frand());
  rv0 = rv.put(rv0);
  const double eps = 1e-3, factor = 0.1;

  /* training forward */
  size_t wsb = 0, rsb = 0;
  DNN_OK(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, k.mode, CUDNN_BATCHNORM_OPS_BN, xd, nullptr, xd,
                                                                  pd, nullptr, &wsb));
  DNN_OK(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, k.mode, CUDNN_BATCHNORM_OPS_BN, nullptr, xd, &rsb));
  buf ws(F, wsb / 4 + 1), rs(F, rsb / 4 + 1);
  const float alpha = k.alpha, beta = k.beta, one = 1.f, zero = 0.f;
  {
    cudnnStatus_t st = cudnnBatchNormalizationForwardTrainingEx(
        h, k.mode, CUDNN_BATCHNORM_OPS_BN, &alpha, &beta, xd, x.d, nullptr, nullptr, xd, y.d, pd, g.d, b.d, factor,
        rm.d, rv.d, -1e-3, sm.d, si.d, nullptr, ws.d, wsb, rs.d, rsb);
    EXPECT(st == CUDNN_STATUS_BAD_PARAM, "%s: negative epsilon gave %s", k.name, cudnnGetErrorString(st));
  }
  DNN_OK(cudnnBatchNormalizationForwardTrainingEx(h, k.mode, CUDNN_BATCHNORM_OPS_BN, &alpha, &beta, xd, x.d, nullptr,
                                                  nullptr, xd, y.d, pd, g.d, b.d, factor, rm.d, rv.d, eps, sm.d, si.d,
                                                  nullptr, ws.d, wsb, rs.d, rsb));
  std::vector<double> mean(k.C), var(k.C);
  std::vector<double> ry = bn_forward_ref(k, s, xv, gv, bv, eps, &mean, &var);
  for (size_t i = 0; i < cnt; i++) ry[i] = alpha * ry[i] + beta * y0[i];
  const double rel = rel_of(k.t);
  EXPECT(worst(y.get(), ry, rel, 1e-6) <= 1, "%s: training y off by %.3g tolerances", k.name,
         worst(y.get(), ry, rel, 1e-6));
  std::vector<double> rinv(k.C), rrm(k.C), rrv(k.C);
  for (int c = 0; c < k.C; c++) {
    rinv[c] = 1 / std::sqrt(var[c] + eps);
    rrm[c] = (1 - factor) * rm0[c] + factor * mean[c];
    rrv[c] = (1 - factor) * rv0[c] + factor * var[c] * M / (M - 1);
  }
  EXPECT(worst(sm.get(), mean, 2e-7, 1e-7) <= 1, "%s: save mean", k.name);
  EXPECT(worst(si.get(), rinv, 2e-7, 1e-7) <= 1, "%s: save inv variance", k.name);
  EXPECT(worst(rm.get(), rrm, 2e-7, 1e-7) <= 1, "%s: running mean", k.name);
  EXPECT(worst(rv.get(), rrv, 2e-7, 1e-7) <= 1, "%s: running variance (unbiased)", k.name);

  /* non-Ex behaviour: no workspace, no reserve, no running stats */
  DNN_OK(cudnnBatchNormalizationForwardTrainingEx(h, k.mode, CUDNN_BATCHNORM_OPS_BN, &one, &zero, xd, x.d, nullptr,
                                                  nullptr, xd, y.d, pd, g.d, b.d, factor, nullptr, nullptr, eps, sm.d,
                                                  si.d, nullptr, nullptr, 0, nullptr, 0));
  const std::vector<double> ry1 = bn_forward_ref(k, s, xv, gv, bv, eps, nullptr, nullptr);
  EXPECT(worst(y.get(), ry1, rel, 1e-6) <= 1, "%s: training y (no workspace)", k.name);
  EXPECT(worst(rm.get(), rrm, 2e-7, 1e-7) <= 1, "%s: running mean changed without running pointers", k.name);

  /* inference (SPATIAL only) with the running statistics */
  if (k.mode == CUDNN_BATCHNORM_SPATIAL) {
    const std::vector<double> erm = rm.get(), erv = rv.get();
    y.put(y0);
    DNN_OK(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, &alpha, &beta, xd, x.d, xd, y.d, pd,
                                                   g.d, b.d, rm.d, rv.d, eps));
    std::vector<double> ri(cnt);
    for (int c = 0; c < k.C; c++)
      for (int n = 0; n < k.N; n++)
        for (int hh = 0; hh < k.H; hh++)
          for (int w = 0; w < k.W; w++) {
            const size_t i = s.idx(n, c, hh, w);
            ri[i] = alpha * (gv[c] * (xv[i] - erm[c]) / std::sqrt(erv[c] + eps) + bv[c]) + beta * y0[i];
          }
    EXPECT(worst(y.get(), ri, rel, 1e-6) <= 1, "%s: inference y", k.name);
  }

  /* backward: dx overwritten (alphaDataDiff a, betaDataDiff 0), dgamma/dbeta accumulated (1, 1) */
  {
    DNN_OK(cudnnBatchNormalizationForwardTrainingEx(h, k.mode, CUDNN_BATCHNORM_OPS_BN, &one, &zero, xd, x.d, nullptr,
                                                    nullptr, xd, y.d, pd, g.d, b.d, factor, nullptr, nullptr, eps,
                                                    sm.d, si.d, nullptr, nullptr, 0, nullptr, 0));
    size_t bwsb = 0;
    DNN_OK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(h, k.mode, CUDNN_BATCHNORM_OPS_BN, xd, xd, xd, nullptr,
                                                             xd, pd, nullptr, &bwsb));
    buf bws(F, bwsb / 4 + 1);
    const std::vector<double> dg0 = dg.random(), db0 = db.random();
    const float ad = k.alpha, bd = 0.f;
    DNN_OK(cudnnBatchNormalizationBackwardEx(h, k.mode, CUDNN_BATCHNORM_OPS_BN, &ad, &bd, &one, &one, xd, x.d,
                                             nullptr, nullptr, xd, dy.d, nullptr, nullptr, xd, dx.d, pd, g.d, nullptr,
                                             dg.d, db.d, eps, sm.d, si.d, nullptr, bws.d, bwsb, nullptr, 0));
    std::vector<double> rdx(cnt), rdg(k.C), rdb(k.C);
    for (int c = 0; c < k.C; c++) {
      double sdy = 0, sdyx = 0;
      const double inv = 1 / std::sqrt(var[c] + eps);
      for (int n = 0; n < k.N; n++)
        for (int hh = 0; hh < k.H; hh++)
          for (int w = 0; w < k.W; w++) {
            const size_t i = s.idx(n, c, hh, w);
            sdy += dyv[i];
            sdyx += dyv[i] * (xv[i] - mean[c]) * inv;
          }
      rdg[c] = dg0[c] + sdyx;
      rdb[c] = db0[c] + sdy;
      for (int n = 0; n < k.N; n++)
        for (int hh = 0; hh < k.H; hh++)
          for (int w = 0; w < k.W; w++) {
            const size_t i = s.idx(n, c, hh, w);
            rdx[i] = ad * gv[c] * inv * (dyv[i] - sdy / M - (xv[i] - mean[c]) * inv * sdyx / M);
          }
    }
    const std::vector<double> gdx = dx.get(), gdg = dg.get(), gdb = db.get();
    EXPECT(worst(gdx, rdx, rel, 1e-5) <= 1, "%s: backward dx off by %.3g", k.name, worst(gdx, rdx, rel, 1e-5));
    EXPECT(worst(gdg, rdg, 1e-6, 1e-6) <= 1, "%s: backward dgamma (accumulated)", k.name);
    EXPECT(worst(gdb, rdb, 1e-6, 1e-6) <= 1, "%s: backward dbeta (accumulated)", k.name);

    /* finite differences of L = sum y * dy (the test's own forward) at a few
     * elements: d L / d x_i = dx_i / ad, d L / d gamma_c = dgamma_c - dg0_c */
    auto loss = [&](const std::vector<double> &xx, const std::vector<double> &gg) {
      const std::vector<double> yy = bn_forward_ref(k, s, xx, gg, bv, eps, nullptr, nullptr);
      return dot(yy, dyv);
    };
    const double hstep = 1e-5;
    for (int t = 0; t < 4; t++) {
      const size_t i = (size_t)(t * 7919) % cnt;
      std::vector<double> xp = xv, xm = xv;
      xp[i] += hstep, xm[i] -= hstep;
      const double fd = (loss(xp, gv) - loss(xm, gv)) / (2 * hstep);
      EXPECT(std::fabs(gdx[i] / ad - fd) <= 4 * rel * std::fabs(fd) + 1e-4, "%s: dx[%zu] %.6g vs finite difference %.6g",
             k.name, i, gdx[i] / ad, fd);
    }
    for (int c = 0; c < k.C; c += 2) {
      std::vector<double> gp = gv, gm = gv;
      gp[c] += hstep, gm[c] -= hstep;
      const double fd = (loss(xv, gp) - loss(xv, gm)) / (2 * hstep);
      EXPECT(std::fabs(gdg[c] - dg0[c] - fd) <= 1e-4 * (1 + std::fabs(fd)), "%s: dgamma[%d] %.6g vs finite difference "
             "%.6g", k.name, c, gdg[c] - dg0[c], fd);
    }
  }
  cudnnDestroyTensorDescriptor(pd);
  cudnnDestroyTensorDescriptor(xd);
}

void test_bn(cudnnHandle_t h) {
  const bn_case cases[] = {
      {"bn nchw f32 spatial", 3, 5, 4, 3, false, CUDNN_DATA_FLOAT, CUDNN_BATCHNORM_SPATIAL, 1.f, 0.f},
      {"bn nchw f32 blend", 2, 3, 5, 2, false, CUDNN_DATA_FLOAT, CUDNN_BATCHNORM_SPATIAL, 0.5f, 0.25f},
      {"bn nhwc f16 persistent", 3, 5, 4, 3, true, CUDNN_DATA_HALF, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, 1.f, 0.f},
      {"bn nhwc bf16 spatial", 4, 6, 2, 3, true, CUDNN_DATA_BFLOAT16, CUDNN_BATCHNORM_SPATIAL, 1.f, 0.f},
      {"bn nchw 2d-as-4d", 16, 7, 1, 1, false, CUDNN_DATA_FLOAT, CUDNN_BATCHNORM_SPATIAL, 1.f, 0.f},
  };
  uint64_t seed = 99;
  for (const bn_case &k : cases) run_bn(h, k, seed++ * 0x9E3779B97F4A7C15ull);
}

/* Output rounding through y = x + 1 * prior with a 1x1 unit filter: ties
 * go to even, overflow to inf, subnormal halves are kept. */
void test_rounding(cudnnHandle_t h) {
  struct tc {
    cudnnDataType_t t;
    float alpha, beta;
    std::vector<double> x, prior;
  };
  const double e11 = std::ldexp(1.0, -11), e10 = std::ldexp(1.0, -10), e8 = std::ldexp(1.0, -8),
               e7 = std::ldexp(1.0, -7), e24 = std::ldexp(1.0, -24);
  const tc cases[] = {
      {CUDNN_DATA_HALF, 1.f, 1.f,
       {1, 1 + e10, -(1 + e10), 2, 65504, 3 * e24, 0.1, 1},
       {e11, e11, -e11, 2 * e11, 65504, 0, 0.2, 3 * e11}},
      {CUDNN_DATA_BFLOAT16, 1.f, 1.f, {1, 1 + e7, -(1 + e7), 4, 0.1, 1}, {e8, e8, -e8, 4 * e8, 0.2, 3 * e8}},
      /* halving into half subnormals (ties to even); beta 0: the NaN prior is never read */
      {CUDNN_DATA_HALF, 0.5f, 0.f, {3 * e24, 5 * e24, 7 * e24, 16384 * e24, 1}, {NAN, NAN, NAN, NAN, NAN}},
  };
  for (const tc &c : cases) {
    const int n = (int)c.x.size();
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cv;
    DNN_OK(cudnnCreateTensorDescriptor(&xd));
    DNN_OK(cudnnCreateTensorDescriptor(&yd));
    DNN_OK(cudnnCreateFilterDescriptor(&wd));
    DNN_OK(cudnnCreateConvolutionDescriptor(&cv));
    DNN_OK(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, c.t, 1, 1, 1, n));
    DNN_OK(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, c.t, 1, 1, 1, n));
    DNN_OK(cudnnSetFilter4dDescriptor(wd, c.t, CUDNN_TENSOR_NCHW, 1, 1, 1, 1));
    DNN_OK(cudnnSetConvolution2dDescriptor(cv, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DNN_OK(cudnnSetConvolutionMathType(cv, CUDNN_TENSOR_OP_MATH));
    buf x(c.t, n), y(c.t, n), w(c.t, 1);
    const std::vector<double> xv = x.put(c.x), pv = y.put(c.prior);
    w.put({1.0});
    DNN_OK(cudnnConvolutionForward(h, &c.alpha, xd, x.d, wd, w.d, cv, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr,
                                   0, &c.beta, yd, y.d));
    const std::vector<double> got = y.get();
    for (int i = 0; i < n; i++) {
      const double want = round_to(c.t, c.alpha * xv[i] + (c.beta != 0.f ? c.beta * pv[i] : 0.0));
      EXPECT(got[i] == want, "rounding %s: %.10g + %.10g gave %.10g, expected %.10g",
             c.t == CUDNN_DATA_HALF ? "f16" : "bf16", xv[i], pv[i], got[i], want);
    }
    cudnnDestroyConvolutionDescriptor(cv);
    cudnnDestroyFilterDescriptor(wd);
    cudnnDestroyTensorDescriptor(yd);
    cudnnDestroyTensorDescriptor(xd);
  }
}

/* a host pointer as x: refused and reported as an illegal address */
void test_host_pointer(cudnnHandle_t h) {
  cudnnTensorDescriptor_t xd, yd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cv;
  DNN_OK(cudnnCreateTensorDescriptor(&xd));
  DNN_OK(cudnnCreateTensorDescriptor(&yd));
  DNN_OK(cudnnCreateFilterDescriptor(&wd));
  DNN_OK(cudnnCreateConvolutionDescriptor(&cv));
  DNN_OK(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 2, 4, 4));
  DNN_OK(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 3, 4, 4));
  DNN_OK(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 3, 2, 3, 3));
  DNN_OK(cudnnSetConvolution2dDescriptor(cv, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  buf w(CUDNN_DATA_FLOAT, 54), y(CUDNN_DATA_FLOAT, 48);
  w.random();
  std::vector<float> hx(32, 1.f);
  const float one = 1.f, zero = 0.f;
  cudaGetLastError(); /* start clean */
  cudnnStatus_t s = cudnnConvolutionForward(h, &one, xd, hx.data(), wd, w.d, cv, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                                            nullptr, 0, &zero, yd, y.d);
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaGetLastError();
  EXPECT(s != CUDNN_STATUS_SUCCESS || e == cudaErrorIllegalAddress, "host pointer x not reported (status %s)",
         cudnnGetErrorString(s));
  EXPECT(e == cudaErrorIllegalAddress, "host pointer x: runtime error %d, expected cudaErrorIllegalAddress", (int)e);
  cudnnDestroyConvolutionDescriptor(cv);
  cudnnDestroyFilterDescriptor(wd);
  cudnnDestroyTensorDescriptor(yd);
  cudnnDestroyTensorDescriptor(xd);
}

}  // namespace

int main() {
  cudnnHandle_t h;
  DNN_OK(cudnnCreate(&h));
  DNN_OK(cudnnSetStream(h, nullptr));
  test_conv(h);
  test_bn(h);
  test_rounding(h);
  test_host_pointer(h); /* last: the illegal address may be sticky */
  cudnnDestroy(h);
  return emu_selftest_summary("emu_selftest_dnn");
}
