/* 2-D convolution on cuDNN (the legacy descriptor API, which cuDNN 9 still
 * ships): NCHW or NHWC tensors, cross-correlation, groups, dilation. The
 * algorithm is cuDNN's heuristic first choice (cudnnGet*Algorithm_v7, which
 * runs nothing; cudnnFind* under cudnn_benchmark), or the next one when its
 * workspace does not fit or cuDNN refuses to run it, restricted to plain FMA
 * math for f32 unless the device allows TF32 or the f32 operands were
 * widened from 16 bits (below); the workspace is the pass's planned one
 * (set_workspace) when large enough, else the device's scratch buffer.
 * In the deterministic mode (backend option "deterministic", as
 * torch.backends.cudnn.deterministic) only algorithms and engines cuDNN
 * marks deterministic are candidates; without --cudnn-benchmark the
 * heuristics' order then fixes the choice, so runs repeat bit for bit.
 * By default (CTRAIN_CUDA_CONV_API=graph) the graph API's execution plans
 * (cuda_conv_graph.h) are candidates too, ahead of the legacy algorithms
 * or, under cudnn_benchmark, ordered with them by measured time;
 * CTRAIN_CUDA_CONV_API=legacy leaves the legacy algorithms alone. Bias and the
 * fused activation run as one extra elementwise kernel; the bias gradient is
 * a per-channel sum kernel. Backward-data can add into dx instead of
 * overwriting it (cuDNN's beta = 1: cuda_conv2d_bwd_data_acc), which the
 * planner uses for the second gradient reaching a residual block's input.
 *
 * Dtypes: both inputs f32, bf16 or f16 (alike); the output the input dtype
 * (cuDNN computes in f32 either way) or f32. cuDNN's legacy API wants one
 * dtype for x, w and y, so a 16-bit pair with an f32 output runs one of two
 * ways. The weight gradient (autocast's case: 16-bit activations, an fp32
 * gradient) runs in the 16-bit dtype on the tensor cores into scratch and
 * is widened into dw on the way out (dw = beta*dw + dw16), as PyTorch's
 * CUDA autocast computes the 16-bit weight copy's gradient and casts it
 * into the fp32 .grad: one rounding of dw, where widening both operands
 * would copy two activation-sized tensors to f32 and run at f32 rate.
 * Forward and backward-data (and a weight gradient cuDNN offers no 16-bit
 * algorithm for) widen the inputs into scratch and run in f32 with TF32
 * allowed, which loses nothing here: TF32 keeps 10 mantissa bits of each
 * input, as many as f16 has and more than bf16.
 *
 * Layouts: x, y and their gradients may each be CT_LAYOUT_PLAIN or
 * CT_LAYOUT_NHWC (src/plan/layout.h: the first convolution reads the plain
 * model input and writes NHWC, the last one may write plain for a
 * flatten). A call where any of them is NHWC runs entirely channels-last,
 * filter included (KRSC), as PyTorch's channels_last convolutions do:
 * cuDNN's tensor-core kernels want all three operands NHWC, and a mixed
 * call would drop to slower algorithms or none. Plain operands (and the
 * PyTorch-ordered weight and its gradient) are transposed into scratch
 * and back by cuda_relayout, except those whose bytes are the same in
 * both layouts (one channel, or one position: 1x1 filters, two thirds of
 * ResNet-50's), which are used where they lie. Any other layout is
 * refused. A shape for
 * which cuDNN offers no channels-last algorithm runs NCHW instead, every
 * NHWC operand transposed the other way: slower, but it runs, where a
 * model-wide layout choice would otherwise fail on one layer. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_conv_graph.h"

typedef enum conv_kind { CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER } conv_kind;

static const char *kind_name[] = {"conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_weights"};

static cudnnDataType_t dnn_type(ct_dtype t) {
  return t == CT_F32 ? CUDNN_DATA_FLOAT : t == CT_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

static int64_t numel4(const int64_t *s) { return s[0] * s[1] * s[2] * s[3]; }

static size_t round256(size_t b) { return (b + 255) / 256 * 256; }

#define DNN(call)                                                   \
  do {                                                              \
    cudnnStatus_t dnn_e_ = (call);                                  \
    if (dnn_e_ != CUDNN_STATUS_SUCCESS) {                           \
      s = cuda_dnn_fail(dnn_e_, __FILE__, __LINE__, #call);         \
      goto done;                                                    \
    }                                                               \
  } while (0)

/* One algorithm cuDNN offered, as the call runs it: a legacy algorithm,
 * or (gplan set) a graph API execution plan. */
typedef struct conv_cand {
  int algo;
  cudnnMathType_t math; /* set on the descriptor while this candidate runs */
  size_t wsb;           /* workspace bytes */
  float ms;             /* measured time (cudnnFind*'s, or cuda_conv_graph's); < 0 from a heuristic */
  cudnnBackendDescriptor_t gplan; /* owned by the plan's graph */
  long long engine;               /* gplan's engine */
} conv_cand;

/* At most LEGACY_CANDS legacy algorithms (cuDNN names 8 or fewer per
 * pass) and GRAPH_CANDS graph plans, all timed under cudnn_benchmark;
 * without it the heuristic's first GRAPH_FALLBACKS that finalize (each
 * plan costs a finalize, which loads its kernel). */
#define LEGACY_CANDS 8
#define GRAPH_CANDS 8
#define GRAPH_FALLBACKS 3
#define CONV_CANDS (LEGACY_CANDS + GRAPH_CANDS)

/* Why a plan moved past a candidate (conv_plan.left_why, the describe
 * op's "left ..." notes). */
enum { CONV_LEFT_REFUSED = 1, CONV_LEFT_OOM, CONV_LEFT_ALIGN };
#define KEY_LEN 33

/* A convolution plan: the descriptors and the algorithms for one shape,
 * pass, dtype, math type and layout. Built once per shape (heuristic, or
 * cudnnFind* timing runs under --cudnn-benchmark, as
 * torch.backends.cudnn.benchmark does) and reused on every later call.
 * cand[cur] runs; when its workspace does not fit in memory or cuDNN
 * refuses to run it, the plan moves on to the next candidate for good, as
 * PyTorch tries algorithms in turn. ncand 0 (descriptors destroyed) caches
 * "cuDNN has no algorithm here". */
typedef struct conv_plan {
  int key[KEY_LEN];
  cudnnTensorDescriptor_t xd, yd;
  cudnnFilterDescriptor_t wd;
  cudnnConvolutionDescriptor_t cv;
  cuda_conv_graph *graph; /* the graph API candidates' descriptors, or NULL */
  conv_cand cand[CONV_CANDS];
  int ncand, cur;
  /* What cuda_conv_describe reports: why each candidate before cur was
   * left (CONV_LEFT_*), whether a call accumulated (beta != 0), the most
   * memory one call took (workspace and staged operands), how many calls
   * ran, and how many of them took the scratch buffer (the rest needed
   * nothing or ran in the planned workspace). */
  unsigned char left_why[CONV_CANDS];
  int accumulated;
  size_t need_max;
  long long calls, in_scratch;
  /* A space-to-depth plan (key[25] > 0) under cudnn_benchmark's auto
   * choice: 1 taken, -1 the direct pass was faster, 0 not measured; its
   * own time, the staging kernels' and the direct pass's, in ms
   * (s2d_measure; < 0: unknown). */
  int s2d_verdict;
  float s2d_ms, s2d_staging_ms, s2d_direct_ms;
} conv_plan;

struct cuda_conv_cache {
  conv_plan *p;
  int n, cap;
};

static void plan_destroy(conv_plan *c) {
  cuda_conv_graph_free(c->graph);
  c->graph = NULL;
  if (c->cv) cudnnDestroyConvolutionDescriptor(c->cv);
  if (c->wd) cudnnDestroyFilterDescriptor(c->wd);
  if (c->yd) cudnnDestroyTensorDescriptor(c->yd);
  if (c->xd) cudnnDestroyTensorDescriptor(c->xd);
  c->cv = NULL, c->wd = NULL, c->yd = NULL, c->xd = NULL;
}

/* An algorithm query that fails as NOT_SUPPORTED found nothing rather
 * than failed. */
static cudnnStatus_t none_if_unsupported(cudnnStatus_t e, int *n) {
  if (!cuda_dnn_unsupported(e)) return e;
  *n = 0;
  return CUDNN_STATUS_SUCCESS;
}

void cuda_conv_cache_free(ct_device *d) {
  cuda_dev *cd = cuda_dev_of(d);
  struct cuda_conv_cache *c = cd->conv_cache;
  if (!c) return;
  for (int i = 0; i < c->n; i++) plan_destroy(&c->p[i]);
  free(c->p);
  free(c);
  cd->conv_cache = NULL;
}

/* beta: the blend a graph plan bakes in (0 where the legacy API runs
 * alone, which takes it per call); s2d: the geometry of a space-to-depth
 * pass (NULL for a direct one): its S and W' shapes could be a direct
 * convolution's, and several convolutions (3 or 4 channels at stride 2,
 * a 7x7 or 8x8 kernel) share them, while the benchmark's verdict kept in
 * the plan belongs to one. */
static void make_key(int *k, conv_kind kind, const ct_conv2d_params *p, const int64_t *xs, const int64_t *wsh,
                     const int64_t *ys, ct_dtype rt, cudnnMathType_t math, int bench, int det, int nhwc, float beta,
                     const cuda_s2d *s2d) {
  memset(k, 0, sizeof(int) * KEY_LEN);
  k[0] = (int)kind, k[1] = (int)rt, k[2] = (int)math, k[3] = bench | det << 1;
  for (int i = 0; i < 4; i++) k[4 + i] = (int)xs[i], k[8 + i] = (int)wsh[i], k[12 + i] = (int)ys[i];
  k[16] = p->stride_h, k[17] = p->stride_w, k[18] = p->pad_h, k[19] = p->pad_w, k[20] = p->dil_h, k[21] = p->dil_w;
  k[22] = p->groups;
  k[23] = nhwc;
  memcpy(&k[24], &beta, sizeof beta);
  if (s2d) {
    const int64_t g[8] = {s2d->s, s2d->C, s2d->KH, s2d->KW, s2d->pad_h, s2d->pad_w, s2d->H, s2d->W};
    for (int i = 0; i < 8; i++) k[25 + i] = (int)g[i];
  }
}

/* cuDNN's legacy API takes two inputs of one f32, bf16 or f16 dtype and
 * writes that dtype or f32 (the output's dtype, or the 16-bit pair's
 * widened weight gradient: the file's header). */
static int conv_dtypes_ok(ct_dtype t1, ct_dtype t2, ct_dtype ot) {
  return cuda_float_dtype(t1) && t1 == t2 && (ot == t1 || ot == CT_F32);
}

/* 1 for the math types that use tensor cores. */
static int tensor_op_math(cudnnMathType_t m) {
  return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

/* One entry of cuDNN's ranked list, whichever pass it came from. */
typedef struct conv_ranked {
  int ok, algo, nondet;
  cudnnMathType_t math;
  size_t mem;
  float ms;
} conv_ranked;

/* The heuristic's entries carry no time (cuDNN fills -1); bench: the
 * list came from cudnnFind*, whose times are real. */
#define RANKED(perf, n, bench)                                                                   \
  for (int i_ = 0; i_ < (n); i_++) {                                                             \
    r[i_].ok = (perf)[i_].status == CUDNN_STATUS_SUCCESS, r[i_].algo = (int)(perf)[i_].algo;     \
    r[i_].nondet = (perf)[i_].determinism == CUDNN_NON_DETERMINISTIC;                            \
    r[i_].math = (perf)[i_].mathType, r[i_].mem = (perf)[i_].memory;                             \
    r[i_].ms = (bench) ? (perf)[i_].time : -1.f;                                                 \
  }

/* 1 for the algorithms that trade accuracy for speed: FFT and the
 * non-fused Winograd transforms. cuDNN's heuristics can rank one first,
 * and its gradients then stray far from PyTorch's (docs/GPU.md, "cuDNN
 * plans"). */
static int lossy_algo(conv_kind kind, int a) {
  if (kind == CONV_FWD)
    return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
  if (kind == CONV_BWD_DATA)
    return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

/* The candidates from cuDNN's ranked list (heuristic or measured), best
 * first: its supported entries in its order, each under the math type it
 * was ranked with. Strict f32 (FMA) is the exception: every entry runs
 * under the FMA descriptor, which keeps it off the tensor cores; the
 * entries ranked without tensor cores come first (whether cuDNN labels
 * those FMA or DEFAULT is not documented, so both count), and the lossy
 * algorithms last, so that f32 means f32 accuracy (they stay as a last
 * resort when nothing else runs). With det, the entries cuDNN lists as
 * CUDNN_NON_DETERMINISTIC (the atomics of backward-data algorithm 0 and
 * backward-filter 0 and 3) are left out. */
static int order_cands(const conv_ranked *r, int n, conv_kind kind, cudnnMathType_t math, int det, conv_cand *out) {
  int k = 0;
  for (int pass = 0; pass < 3; pass++)
    for (int i = 0; i < n && k < LEGACY_CANDS; i++) {
      if (!r[i].ok || (det && r[i].nondet)) continue;
      int rank = 0;
      if (math == CUDNN_FMA_MATH) rank = lossy_algo(kind, r[i].algo) ? 2 : tensor_op_math(r[i].math) ? 1 : 0;
      if (rank != pass) continue;
      conv_cand c = {r[i].algo, math == CUDNN_FMA_MATH ? math : r[i].math, r[i].mem, r[i].ms, NULL, -1};
      int dup = 0;
      for (int j = 0; j < k; j++) dup |= out[j].algo == c.algo && out[j].math == c.math;
      if (!dup) out[k++] = c;
    }
  return k;
}

/* The candidate's workspace: the larger of its list entry's and
 * cudnnGet*WorkspaceSize's under the math type it runs with. */
static cudnnStatus_t cand_workspace(cudnnHandle_t h, conv_kind kind, const conv_plan *c, conv_cand *k) {
  size_t b = 0;
  cudnnStatus_t e = cudnnSetConvolutionMathType(c->cv, k->math);
  if (e != CUDNN_STATUS_SUCCESS) return e;
  if (kind == CONV_FWD)
    e = cudnnGetConvolutionForwardWorkspaceSize(h, c->xd, c->wd, c->cv, c->yd, (cudnnConvolutionFwdAlgo_t)k->algo, &b);
  else if (kind == CONV_BWD_DATA)
    e = cudnnGetConvolutionBackwardDataWorkspaceSize(h, c->wd, c->yd, c->cv, c->xd,
                                                     (cudnnConvolutionBwdDataAlgo_t)k->algo, &b);
  else
    e = cudnnGetConvolutionBackwardFilterWorkspaceSize(h, c->xd, c->yd, c->cv, c->wd,
                                                       (cudnnConvolutionBwdFilterAlgo_t)k->algo, &b);
  if (e == CUDNN_STATUS_SUCCESS && b > k->wsb) k->wsb = b;
  return e;
}

/* Graph API plans ahead of the legacy candidates in c (under bench, all
 * in order of measured time, the untimed last), for passes the graph
 * path takes: CTRAIN_CUDA_CONV_API=graph (the default), no groups, not strict f32 (its
 * engines are chosen by numerical notes the legacy FMA math type
 * already settles). The graph API only adds candidates: a failure to
 * build its plans leaves the pass to the legacy ones (the first such
 * failure is kept for describe), except running out of memory. */
static ct_status add_graph_cands(ct_device *d, cudnnHandle_t h, conv_kind kind, const ct_conv2d_params *p,
                                 const int64_t *xs, const int64_t *wsh, const int64_t *ys, ct_dtype rt,
                                 cudnnMathType_t math, int bench, int nhwc, float beta, conv_plan *c) {
  if (!cuda_dev_of(d)->conv_graph || p->groups != 1 || math == CUDNN_FMA_MATH) return CT_OK;
  cuda_graph_plan gp[GRAPH_CANDS];
  int ng = 0;
  const cuda_conv_desc cd = {(int)kind, p, xs, wsh, ys, rt, nhwc, beta, cuda_dev_of(d)->deterministic};
  ct_status s = cuda_conv_graph_build(d, h, &cd, bench, gp, bench ? GRAPH_CANDS : GRAPH_FALLBACKS, &ng, &c->graph);
  if (s == CT_ERR_OUT_OF_MEMORY) return s;
  if (s != CT_OK) {
    cuda_dev *dv = cuda_dev_of(d);
    if (!dv->conv_graph_err[0]) snprintf(dv->conv_graph_err, sizeof dv->conv_graph_err, "%s", ct_last_error());
    return CT_OK;
  }
  conv_cand all[CONV_CANDS];
  int k = 0;
  for (int i = 0; i < ng; i++) {
    conv_cand g = {-1, math, gp[i].wsb, gp[i].ms, gp[i].plan, gp[i].engine};
    all[k++] = g;
  }
  for (int i = 0; i < c->ncand && k < CONV_CANDS; i++) all[k++] = c->cand[i];
  /* insertion sort: stable, so equal times keep the graph plans first */
  for (int i = 1; bench && i < k; i++)
    for (int j = i; j > 0; j--) {
      const float a = all[j - 1].ms, b = all[j].ms;
      if (!(b >= 0 && (a < 0 || b < a))) break;
      conv_cand t = all[j];
      all[j] = all[j - 1], all[j - 1] = t;
    }
  memcpy(c->cand, all, sizeof all[0] * (size_t)k);
  c->ncand = k;
  return CT_OK;
}

static ct_status plan_build(ct_device *d, cudnnHandle_t h, conv_kind kind, const ct_conv2d_params *p,
                            const int64_t *xs, const int64_t *wsh, const int64_t *ys, ct_dtype rt,
                            cudnnMathType_t math, int bench, int nhwc, float beta, const cuda_s2d *s2d, conv_plan *out) {
  const char *op = kind_name[kind];
  const cudnnDataType_t dt = dnn_type(rt);
  const cudnnTensorFormat_t fmt = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  ct_status s = CT_OK;
  conv_plan c;
  memset(&c, 0, sizeof c);
  const int det = cuda_dev_of(d)->deterministic;
  make_key(c.key, kind, p, xs, wsh, ys, rt, math, bench, det, nhwc, beta, s2d);
  DNN(cudnnCreateTensorDescriptor(&c.xd));
  DNN(cudnnCreateTensorDescriptor(&c.yd));
  DNN(cudnnCreateFilterDescriptor(&c.wd));
  DNN(cudnnCreateConvolutionDescriptor(&c.cv));
  DNN(cudnnSetTensor4dDescriptor(c.xd, fmt, dt, (int)xs[0], (int)xs[1], (int)xs[2], (int)xs[3]));
  DNN(cudnnSetTensor4dDescriptor(c.yd, fmt, dt, (int)ys[0], (int)ys[1], (int)ys[2], (int)ys[3]));
  DNN(cudnnSetFilter4dDescriptor(c.wd, dt, fmt, (int)wsh[0], (int)wsh[1], (int)wsh[2], (int)wsh[3]));
  DNN(cudnnSetConvolution2dDescriptor(c.cv, p->pad_h, p->pad_w, p->stride_h, p->stride_w, p->dil_h, p->dil_w,
                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  DNN(cudnnSetConvolutionGroupCount(c.cv, p->groups));
  DNN(cudnnSetConvolutionMathType(c.cv, math));
  {
    int on, oc, oh, ow;
    DNN(cudnnGetConvolution2dForwardOutputDim(c.cv, c.xd, c.wd, &on, &oc, &oh, &ow));
    if (on != ys[0] || oc != ys[1] || oh != ys[2] || ow != ys[3]) {
      s = ct_error(CT_ERR_SHAPE, "cuda %s: output [%lld, %lld, %lld, %lld], but these parameters give [%d, %d, %d, %d]",
                   op, (long long)ys[0], (long long)ys[1], (long long)ys[2], (long long)ys[3], on, oc, oh, ow);
      goto done;
    }
  }
  {
    int n = 0;
    conv_ranked r[16];
    /* The Find calls run every candidate on cuDNN-allocated buffers: the
     * stream must be idle, and they cost a few ms per shape, once. */
    if (bench) {
      cudaError_t e = cudaStreamSynchronize(cuda_stream(d));
      if (e != cudaSuccess) {
        s = cuda_rt_fail(e, __FILE__, __LINE__, "cudaStreamSynchronize before cudnnFind*");
        goto done;
      }
    }
    if (kind == CONV_FWD) {
      cudnnConvolutionFwdAlgoPerf_t perf[16];
      if (bench)
        DNN(none_if_unsupported(cudnnFindConvolutionForwardAlgorithm(h, c.xd, c.wd, c.cv, c.yd, 16, &n, perf), &n));
      else
        DNN(none_if_unsupported(cudnnGetConvolutionForwardAlgorithm_v7(h, c.xd, c.wd, c.cv, c.yd, 16, &n, perf), &n));
      RANKED(perf, n, bench);
    } else if (kind == CONV_BWD_DATA) {
      cudnnConvolutionBwdDataAlgoPerf_t perf[16];
      if (bench)
        DNN(none_if_unsupported(cudnnFindConvolutionBackwardDataAlgorithm(h, c.wd, c.yd, c.cv, c.xd, 16, &n, perf), &n));
      else
        DNN(none_if_unsupported(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c.wd, c.yd, c.cv, c.xd, 16, &n, perf), &n));
      RANKED(perf, n, bench);
    } else {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[16];
      if (bench)
        DNN(none_if_unsupported(cudnnFindConvolutionBackwardFilterAlgorithm(h, c.xd, c.yd, c.cv, c.wd, 16, &n, perf), &n));
      else
        DNN(none_if_unsupported(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c.xd, c.yd, c.cv, c.wd, 16, &n, perf), &n));
      RANKED(perf, n, bench);
    }
    conv_cand all[LEGACY_CANDS];
    int na = order_cands(r, n, kind, math, det, all);
    /* A candidate whose workspace query is NOT_SUPPORTED is dropped. */
    for (int i = 0; i < na; i++) {
      cudnnStatus_t e = cand_workspace(h, kind, &c, &all[i]);
      if (e == CUDNN_STATUS_SUCCESS) c.cand[c.ncand++] = all[i];
      else if (!cuda_dnn_unsupported(e)) DNN(e);
    }
  }
  s = add_graph_cands(d, h, kind, p, xs, wsh, ys, rt, math, bench, nhwc, beta, &c);
  if (s != CT_OK) goto done;
  if (c.ncand) DNN(cudnnSetConvolutionMathType(c.cv, c.cand[0].math));
  else plan_destroy(&c);
done:
  if (s != CT_OK) {
    plan_destroy(&c);
    return s;
  }
  *out = c;
  return CT_OK;
}

/* The cached plan for this call, built on a miss. */
static ct_status plan_get(ct_device *d, cudnnHandle_t h, conv_kind kind, const ct_conv2d_params *p,
                          const int64_t *xs, const int64_t *wsh, const int64_t *ys, ct_dtype rt,
                          cudnnMathType_t math, int nhwc, float beta, const cuda_s2d *s2d, conv_plan **out) {
  cuda_dev *cd = cuda_dev_of(d);
  int key[KEY_LEN];
  make_key(key, kind, p, xs, wsh, ys, rt, math, cd->cudnn_benchmark, cd->deterministic, nhwc, beta, s2d);
  struct cuda_conv_cache *c = cd->conv_cache;
  for (int i = 0; c && i < c->n; i++)
    if (!memcmp(c->p[i].key, key, sizeof key)) {
      *out = &c->p[i];
      return CT_OK;
    }
  if (!c) {
    c = calloc(1, sizeof *c);
    if (!c) return ct_error(CT_ERR_OUT_OF_MEMORY, "cuda conv: out of host memory for the plan cache");
    cd->conv_cache = c;
  }
  if (c->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 32;
    conv_plan *np = realloc(c->p, sizeof *np * (size_t)cap);
    if (!np) return ct_error(CT_ERR_OUT_OF_MEMORY, "cuda conv: out of host memory for the plan cache");
    c->p = np;
    c->cap = cap;
  }
  CT_TRY(plan_build(d, h, kind, p, xs, wsh, ys, rt, math, cd->cudnn_benchmark, nhwc, beta, s2d, &c->p[c->n]));
  *out = &c->p[c->n++];
  return CT_OK;
}

/* One operand of a pass: data, dtype, layout (1 = NHWC) and its shape as
 * [N, C, HW] for cuda_relayout. */
typedef struct conv_arg {
  const void *p;
  ct_dtype t;
  int nhwc;
  int64_t n, c, hw;
} conv_arg;

static conv_arg arg_of(const void *p, ct_dtype t, int nhwc, const int64_t *s) {
  conv_arg a = {p, t, nhwc, s[0], s[1], s[2] * s[3]};
  return a;
}

/* a as the pass in layout nhwc sees it: an operand with one channel or one
 * spatial position (a 1x1 filter, a single-channel image) has the same
 * bytes in NCHW and NHWC, so it needs no transpose, only a cast when its
 * dtype is not the pass's. */
static conv_arg in_layout(conv_arg a, int nhwc) {
  if (a.c == 1 || a.hw == 1) a.nhwc = nhwc;
  return a;
}

/* Space-to-depth (cuda_s2d.cu, whose header has the index maps). cuDNN
 * runs a strided convolution over a few input channels far below the
 * tensor cores' rate (docs/GPU.md, "Space-to-depth stems"), and PyTorch's
 * trace shows cuDNN padding the channels itself. Such a pass
 * runs as a stride-1 convolution over Cp = C*s*s channels instead:
 * AlexNet's stem as 3x3 over 48, ResNet's 7x7/2 as 4x4 over 16 (12
 * padded to a multiple of 8). Forward and weight-gradient passes only:
 * backward-data, which a model's first layer never runs, stays direct.
 * S and W' (or dW') are staged in the pass's memory after the rest. */
typedef struct s2d_pass {
  cuda_s2d g;
  ct_conv2d_params p;    /* stride 1, no padding, no dilation, one group */
  int64_t xs[4], wsh[4]; /* S [N, Cp, Hs, Ws], W' [O, Cp, KHs, KWs] */
  conv_arg x, w;         /* the call's x, and its w (forward) or dw (weight gradient) */
  float beta;            /* the weight gradient's blend, which the fold applies */
} s2d_pass;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* 1 when this pass may run space-to-depth by its shape (z's geometry
 * filled): forward or weight gradient, a stride s >= 2 alike in both
 * directions, one group, no dilation, C not a multiple of 8, a kernel at
 * least s wide, Cp at most 64, and no more multiply-adds than the direct
 * convolution with its channels padded to 8 (what cuDNN's channels-last
 * tensor-core kernels run for such a C): AlexNet's stem 432 against 968
 * per output, ResNet's 256 against 392. Shapes that do not agree (x, w
 * and y of another convolution) are left to the direct pass, whose
 * checks refuse them: S and W' would agree by construction. */
static int s2d_fits(conv_kind kind, const ct_conv2d_params *p, const int64_t *xs, const int64_t *wsh,
                    const int64_t *ys, s2d_pass *z) {
  const int64_t s = p->stride_h, C = xs[1], KH = wsh[2], KW = wsh[3];
  if (kind == CONV_BWD_DATA || s < 2 || p->stride_w != s || p->groups != 1 || p->dil_h != 1 || p->dil_w != 1 ||
      C % 8 == 0 || KH < s || KW < s || p->pad_h < 0 || p->pad_w < 0)
    return 0;
  if (wsh[1] != C || ys[0] != xs[0] || ys[1] != wsh[0] || xs[2] + 2 * p->pad_h < KH || xs[3] + 2 * p->pad_w < KW ||
      ys[2] != (xs[2] + 2 * p->pad_h - KH) / s + 1 || ys[3] != (xs[3] + 2 * p->pad_w - KW) / s + 1)
    return 0;
  cuda_s2d g = {s, p->pad_h, p->pad_w, xs[0], C, xs[2], xs[3], wsh[0], KH, KW, 0, 0, 0, 0, 0};
  g.Cp = ceil_div(C * s * s, 8) * 8;
  g.KHs = ceil_div(KH, s), g.KWs = ceil_div(KW, s);
  g.Hs = ys[2] + g.KHs - 1, g.Ws = ys[3] + g.KWs - 1;
  if (g.Cp > 64 || g.Cp * g.KHs * g.KWs > ceil_div(C, 8) * 8 * KH * KW) return 0;
  memset(z, 0, sizeof *z);
  z->g = g;
  const ct_conv2d_params one = {1, 1, 0, 0, 1, 1, 1};
  z->p = one;
  const int64_t S[4] = {g.N, g.Cp, g.Hs, g.Ws}, Wz[4] = {g.O, g.Cp, g.KHs, g.KWs};
  memcpy(z->xs, S, sizeof S), memcpy(z->wsh, Wz, sizeof Wz);
  return 1;
}

/* The operands cuDNN sees in a space-to-depth pass, S and W' (forward) or
 * S and dW' (weight gradient; dy stays), channels-last in dtype t. */
static void s2d_args(const s2d_pass *z, conv_kind kind, ct_dtype t, conv_arg *in1, conv_arg *in2, conv_arg *oa) {
  *in1 = arg_of(NULL, t, 1, z->xs);
  if (kind == CONV_FWD) *in2 = arg_of(NULL, t, 1, z->wsh);
  else *oa = arg_of(NULL, t, 1, z->wsh);
}

/* What one call of candidate k takes: its workspace, then each operand
 * staged in the pass's dtype rt and layout nhwc (those already in both are
 * used where they lie), then a space-to-depth pass's S and W' (z; NULL
 * for a direct pass); off* give the offsets. The operands as in_layout
 * (and s2d_args) leave them for this pass. */
typedef struct conv_layout {
  int st1, st2, sto;        /* staged: first and second input, output */
  size_t off1, off2, offo;  /* their offsets after the workspace */
  size_t offs, offw;        /* S and W' (or dW') */
  size_t total;             /* bytes of it all */
} conv_layout;

static conv_layout conv_need(const conv_cand *k, int nhwc, ct_dtype rt, conv_arg in1, conv_arg in2, conv_arg oa,
                             const s2d_pass *z) {
  const size_t es = ct_dtype_size(rt);
  conv_layout L;
  L.st1 = in1.t != rt || in1.nhwc != nhwc, L.st2 = in2.t != rt || in2.nhwc != nhwc;
  L.sto = oa.t != rt || oa.nhwc != nhwc;
  L.off1 = round256(k->wsb);
  L.off2 = L.off1 + (L.st1 ? round256((size_t)(in1.n * in1.c * in1.hw) * es) : 0);
  L.offo = L.off2 + (L.st2 ? round256((size_t)(in2.n * in2.c * in2.hw) * es) : 0);
  L.offs = L.offo + (L.sto ? round256((size_t)(oa.n * oa.c * oa.hw) * es) : 0);
  L.offw = L.offs + (z ? round256((size_t)numel4(z->xs) * es) : 0);
  L.total = L.offw + (z ? round256((size_t)numel4(z->wsh) * es) : 0);
  return L;
}

/* One attempt with the plan's current candidate: scratch (workspace and
 * staged operands), inputs staged, the cuDNN call, a staged output back.
 * *retry says whether the next candidate may succeed where this failed:
 * the scratch did not fit in memory, cuDNN refused to run the algorithm
 * (NOT_SUPPORTED), or (*retry = CONV_LEFT_ALIGN) a graph engine met an
 * operand that is not 16-byte aligned. Nothing but scratch is written
 * before the cuDNN call, so a retry starts clean. A space-to-depth pass (z) stages
 * S and W' first and folds dW' into the call's dw last (beta 0 here:
 * the fold blends). */
static ct_status conv_try(ct_device *d, cudnnHandle_t h, conv_kind kind, conv_plan *c, int nhwc, ct_dtype rt,
                          conv_arg in1, conv_arg in2, void *out, conv_arg oa, float beta, const s2d_pass *z,
                          int *retry) {
  if (z) s2d_args(z, kind, rt, &in1, &in2, &oa);
  in1 = in_layout(in1, nhwc), in2 = in_layout(in2, nhwc), oa = in_layout(oa, nhwc);
  const conv_cand *k = &c->cand[c->cur];
  const conv_layout L = conv_need(k, nhwc, rt, in1, in2, oa, z);
  const size_t wsb = k->wsb;
  const ct_dtype t1 = in1.t, t2 = in2.t, ot = oa.t;
  const int st1 = L.st1, st2 = L.st2, sto = L.sto;
  const int64_t n1 = in1.n * in1.c * in1.hw, n2 = in2.n * in2.c * in2.hw;
  const size_t off1 = L.off1, off2 = L.off2, offo = L.offo, total = L.total;
  void *scr = NULL;
  *retry = 0;
  if (total) {
    /* The layer's planned workspace (set_workspace) when it is large
     * enough, else the device's scratch buffer. */
    const cuda_dev *cd = cuda_dev_of(d);
    if (total <= cd->pass_ws_bytes) {
      scr = cd->pass_ws;
    } else {
      ct_status s = cuda_scratch(d, total, &scr);
      *retry = s == CT_ERR_OUT_OF_MEMORY;
      CT_TRY(s);
      c->in_scratch++;
    }
  }
  c->calls++;
  if (beta != 0.f || (z && z->beta != 0.f)) c->accumulated = 1;
  if (total > c->need_max) c->need_max = total;
  void *ws = wsb ? scr : NULL;
  void *zw = NULL;
  if (z) {
    void *S = (char *)scr + L.offs;
    zw = (char *)scr + L.offw;
    CT_TRY(cuda_s2d_input(d, &z->g, z->x.p, z->x.t, z->x.nhwc, S, rt));
    in1.p = S;
    if (kind == CONV_FWD) {
      CT_TRY(cuda_s2d_weight(d, &z->g, z->w.p, z->w.t, zw, rt));
      in2.p = zw;
    } else {
      out = zw;
    }
  }
  const void *a = in1.p, *b = in2.p;
  void *dst = out;
  if (st1) {
    void *sa = (char *)scr + off1;
    if (in1.nhwc == nhwc) CT_TRY(cuda_convert(d, in1.p, t1, sa, rt, n1));
    else CT_TRY(cuda_relayout(d, in1.p, t1, in1.nhwc, sa, rt, nhwc, in1.n, in1.c, in1.hw, 0.f));
    a = sa;
  }
  if (st2) {
    void *sb = (char *)scr + off2;
    if (in2.nhwc == nhwc) CT_TRY(cuda_convert(d, in2.p, t2, sb, rt, n2));
    else CT_TRY(cuda_relayout(d, in2.p, t2, in2.nhwc, sb, rt, nhwc, in2.n, in2.c, in2.hw, 0.f));
    b = sb;
  }
  if (sto) dst = (char *)scr + offo;
  const float one = 1.f, zero = 0.f;
  /* A staged output is written whole here and accumulated on the way out. */
  const float *pbeta = beta != 0.f && !sto ? &beta : &zero;
  cudnnStatus_t e;
  if (k->gplan) {
    /* x, w, y as cuDNN names them for this pass (the plan baked in *pbeta) */
    void *px = kind == CONV_BWD_DATA ? dst : (void *)a, *pw = kind == CONV_BWD_FILTER ? dst : (void *)b;
    void *py = kind == CONV_FWD ? dst : kind == CONV_BWD_DATA ? (void *)a : (void *)b;
    if (((uintptr_t)px | (uintptr_t)pw | (uintptr_t)py | (uintptr_t)ws) % CUDA_CONV_GRAPH_ALIGN) {
      *retry = CONV_LEFT_ALIGN;
      return ct_error(CT_ERR_UNSUPPORTED, "cuda %s: cuDNN engine %lld: an operand is not %d-byte aligned",
                      kind_name[kind], k->engine, CUDA_CONV_GRAPH_ALIGN);
    }
    e = cuda_conv_graph_run(h, k->gplan, px, pw, py, ws);
    if (e != CUDNN_STATUS_SUCCESS) {
      /* Anything but a failed execution (which may have left the context
       * broken) hands the pass to the next candidate: the legacy ones
       * come after the graph plans. */
      *retry = CUDNN_STATUS_CATEGORY(e) != CUDNN_STATUS_EXECUTION_FAILED;
      return ct_error(CT_ERR_BACKEND, "cuda %s: cuDNN engine %lld (graph API, %zu bytes of workspace): %s",
                      kind_name[kind], k->engine, wsb, cudnnGetErrorString(e));
    }
  } else if (kind == CONV_FWD)
    e = cudnnConvolutionForward(h, &one, c->xd, a, c->wd, b, c->cv, (cudnnConvolutionFwdAlgo_t)k->algo, ws, wsb, &zero,
                                c->yd, dst);
  else if (kind == CONV_BWD_DATA)
    e = cudnnConvolutionBackwardData(h, &one, c->wd, b, c->yd, a, c->cv, (cudnnConvolutionBwdDataAlgo_t)k->algo, ws,
                                     wsb, pbeta, c->xd, dst);
  else
    e = cudnnConvolutionBackwardFilter(h, &one, c->xd, a, c->yd, b, c->cv, (cudnnConvolutionBwdFilterAlgo_t)k->algo, ws,
                                       wsb, pbeta, c->wd, dst);
  if (!k->gplan && e != CUDNN_STATUS_SUCCESS) {
    *retry = cuda_dnn_unsupported(e);
    return ct_error(CT_ERR_BACKEND, "cuda %s: cuDNN algorithm %d (%s math, %zu bytes of workspace): %s", kind_name[kind],
                    k->algo, k->math == CUDNN_FMA_MATH ? "FMA" : tensor_op_math(k->math) ? "tensor-op" : "default",
                    wsb, cudnnGetErrorString(e));
  }
  if (sto) CT_TRY(cuda_relayout(d, dst, rt, nhwc, out, ot, oa.nhwc, oa.n, oa.c, oa.hw, beta));
  if (z && kind == CONV_BWD_FILTER) return cuda_s2d_weight_grad(d, &z->g, zw, rt, (void *)z->w.p, z->w.t, z->beta);
  return CT_OK;
}

/* The math type for a pass run in dtype rt on inputs of dtype in: tensor
 * cores for 16-bit; for f32, TF32 when the device allows it or the inputs
 * were widened from 16 bits (TF32 holds them exactly), else plain FMA. */
static cudnnMathType_t conv_math(const cuda_dev *cd, ct_dtype rt, ct_dtype in) {
  if (rt != CT_F32) return CUDNN_TENSOR_OP_MATH;
  return cd->tf32 || in != CT_F32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

/* The beta cuDNN itself applies in a pass run in dtype rt and layout
 * nhwc, as conv_try calls it (a staged output is blended on the way
 * back), where a graph plan must bake it in; 0 with the legacy API alone,
 * which takes it per call, so one plan serves every beta. */
static float plan_beta(const cuda_dev *cd, float beta, conv_arg oa, ct_dtype rt, int nhwc) {
  oa = in_layout(oa, nhwc);
  return cd->conv_graph && oa.t == rt && oa.nhwc == nhwc ? beta : 0.f;
}

/* The plan for dtype rt in the layout *nhwc asks for, or NCHW (*nhwc
 * cleared) when cuDNN has no channels-last algorithm for it; a plan with
 * no candidates when neither has one. s2d: as make_key. */
static ct_status plan_for(ct_device *d, cudnnHandle_t h, conv_kind kind, const ct_conv2d_params *p,
                          const int64_t *xs, const int64_t *wsh, const int64_t *ys, ct_dtype rt,
                          cudnnMathType_t math, conv_arg oa, float beta, const cuda_s2d *s2d, int *nhwc, conv_plan **c) {
  const cuda_dev *cd = cuda_dev_of(d);
  CT_TRY(plan_get(d, h, kind, p, xs, wsh, ys, rt, math, *nhwc, plan_beta(cd, beta, oa, rt, *nhwc), s2d, c));
  if (!(*c)->ncand && *nhwc) {
    *nhwc = 0;
    CT_TRY(plan_get(d, h, kind, p, xs, wsh, ys, rt, math, 0, plan_beta(cd, beta, oa, rt, 0), s2d, c));
  }
  return CT_OK;
}

/* The plan a pass runs with (*c), its dtype (*rt) and layout (*nhwc), from
 * the operands' dtypes and layouts; *h the device's cuDNN handle. */
static ct_status conv_resolve(ct_device *d, conv_kind kind, const ct_conv2d_params *p, const int64_t *xs,
                              const int64_t *wsh, const int64_t *ys, conv_arg in1, conv_arg in2, conv_arg oa,
                              float beta, const cuda_s2d *s2d, cudnnHandle_t *h, conv_plan **c, ct_dtype *rt, int *nhwc) {
  const char *op = kind_name[kind];
  cuda_dev *cd = cuda_dev_of(d);
  const ct_dtype t1 = in1.t, t2 = in2.t, ot = oa.t;
  if (!conv_dtypes_ok(t1, t2, ot))
    return ct_error(CT_ERR_UNSUPPORTED,
                    "cuda %s: dtypes %s, %s -> %s; cuDNN takes two f32, bf16 or f16 inputs of one dtype and writes "
                    "that dtype or f32",
                    op, ct_dtype_name(t1) ? ct_dtype_name(t1) : "?", ct_dtype_name(t2) ? ct_dtype_name(t2) : "?",
                    ct_dtype_name(ot) ? ct_dtype_name(ot) : "?");
  if (p->groups < 1 || xs[1] % p->groups || wsh[0] % p->groups || wsh[1] * p->groups != xs[1])
    return ct_error(CT_ERR_SHAPE, "cuda %s: %lld input channels, weight [%lld, %lld, ...] and groups %d do not agree", op,
                    (long long)xs[1], (long long)wsh[0], (long long)wsh[1], p->groups);
  for (int i = 0; i < 4; i++)
    if (xs[i] > INT_MAX || wsh[i] > INT_MAX || ys[i] > INT_MAX || xs[i] < 1 || wsh[i] < 1 || ys[i] < 1)
      return ct_error(CT_ERR_SHAPE, "cuda %s: every extent must be in 1..INT_MAX for cuDNN (x [%lld,%lld,%lld,%lld])",
                      op, (long long)xs[0], (long long)xs[1], (long long)xs[2], (long long)xs[3]);
  CT_TRY(cuda_enter(d));
  CT_TRY(cuda_dnn_handle(d, h));

  /* The dtype cuDNN runs in (the header says why). */
  *rt = kind == CONV_BWD_FILTER && t1 != CT_F32 ? t1 : ot;
  const int any_nhwc = in1.nhwc || in2.nhwc || oa.nhwc;
  *nhwc = any_nhwc;
  CT_TRY(plan_for(d, *h, kind, p, xs, wsh, ys, *rt, conv_math(cd, *rt, t1), oa, beta, s2d, nhwc, c));
  if (!(*c)->ncand && *rt != ot) {
    *rt = ot;
    *nhwc = any_nhwc;
    CT_TRY(plan_for(d, *h, kind, p, xs, wsh, ys, *rt, conv_math(cd, *rt, t1), oa, beta, s2d, nhwc, c));
  }
  if (!(*c)->ncand)
    return ct_error(CT_ERR_UNSUPPORTED, "cuda %s: cuDNN offers no %salgorithm for x [%lld, %lld, %lld, %lld] w [%lld, "
                    "%lld, %lld, %lld] groups %d in %s (tried %s)%s",
                    op, cd->deterministic ? "deterministic " : "", (long long)xs[0], (long long)xs[1],
                    (long long)xs[2], (long long)xs[3], (long long)wsh[0], (long long)wsh[1], (long long)wsh[2],
                    (long long)wsh[3], p->groups, ct_dtype_name(*rt), any_nhwc ? "NHWC, then NCHW" : "NCHW",
                    cd->deterministic ? "; without --deterministic the nondeterministic ones are candidates too" : "");
  return CT_OK;
}

/* A pass as it runs: direct, or space-to-depth (z set) with its own
 * parameters, shapes, operands (S, W', dW' as s2d_args gives them, in
 * the call's dtype until conv_try knows the pass's) and beta. */
typedef struct conv_call {
  const ct_conv2d_params *p;
  const int64_t *xs, *wsh;
  conv_arg in1, in2, oa;
  float beta;
  const s2d_pass *z;
} conv_call;

static conv_call direct_call(const ct_conv2d_params *p, const int64_t *xs, const int64_t *wsh, conv_arg in1,
                             conv_arg in2, conv_arg oa, float beta) {
  conv_call cc = {p, xs, wsh, in1, in2, oa, beta, NULL};
  return cc;
}

static conv_call s2d_call(const s2d_pass *z, conv_kind kind, conv_arg in1, conv_arg in2, conv_arg oa) {
  s2d_args(z, kind, in1.t, &in1, &in2, &oa);
  conv_call cc = {&z->p, z->xs, z->wsh, in1, in2, oa, 0.f, z};
  return cc;
}

static ct_status resolve_call(ct_device *d, conv_kind kind, const conv_call *cc, const int64_t *ys, cudnnHandle_t *h,
                              conv_plan **c, ct_dtype *rt, int *nhwc) {
  return conv_resolve(d, kind, cc->p, cc->xs, cc->wsh, ys, cc->in1, cc->in2, cc->oa, cc->beta,
                      cc->z ? &cc->z->g : NULL, h, c, rt, nhwc);
}

/* The time of the kernels a space-to-depth pass adds (S, and W' or the
 * fold of dW'), in ms: one warm-up, then the mean of three between two
 * events, on buffers of their own (outside a stream capture, as
 * cudnnFind's; taken from the device's allocator, so its peak counts
 * them while they live, as the graph plans' timing buffers). -1 when
 * those buffers do not fit. */
static ct_status s2d_time_staging(ct_device *d, conv_kind kind, const s2d_pass *z, ct_dtype rt, float *ms) {
  const cuda_s2d *g = &z->g;
  const size_t es = ct_dtype_size(rt);
  const size_t bx = round256((size_t)(g->N * g->C * g->H * g->W) * ct_dtype_size(z->x.t));
  const size_t bs = round256((size_t)numel4(z->xs) * es), bz = round256((size_t)numel4(z->wsh) * es);
  const size_t bw = round256((size_t)(g->O * g->C * g->KH * g->KW) * ct_dtype_size(z->w.t));
  *ms = -1.f;
  CT_TRY(cuda_enter(d));
  char *buf = ct_device_alloc(d, bx + bs + bz + bw);
  if (!buf) {
    ct_error_clear();
    return CT_OK;
  }
  cudaStream_t st = cuda_stream(d);
  cudaEvent_t ev[2] = {NULL, NULL};
  ct_status s = CT_OK;
  cudaError_t ce = cudaMemsetAsync(buf, 0, bx + bs + bz + bw, st);
  if (ce == cudaSuccess) ce = cudaEventCreate(&ev[0]);
  if (ce == cudaSuccess) ce = cudaEventCreate(&ev[1]);
  if (ce != cudaSuccess) s = cuda_rt_fail(ce, __FILE__, __LINE__, "timing space-to-depth staging");
  for (int run = 0; s == CT_OK && run < 4; run++) {
    if (run == 1 && (ce = cudaEventRecord(ev[0], st)) != cudaSuccess) {
      s = cuda_rt_fail(ce, __FILE__, __LINE__, "cudaEventRecord");
      break;
    }
    s = cuda_s2d_input(d, g, buf, z->x.t, z->x.nhwc, buf + bx, rt);
    if (s == CT_OK && kind == CONV_FWD) s = cuda_s2d_weight(d, g, buf + bx + bs + bz, z->w.t, buf + bx + bs, rt);
    else if (s == CT_OK) s = cuda_s2d_weight_grad(d, g, buf + bx + bs, rt, buf + bx + bs + bz, z->w.t, z->beta);
  }
  if (s == CT_OK) {
    ce = cudaEventRecord(ev[1], st);
    if (ce == cudaSuccess) ce = cudaEventSynchronize(ev[1]);
    if (ce == cudaSuccess) ce = cudaEventElapsedTime(ms, ev[0], ev[1]);
    if (ce == cudaSuccess) *ms /= 3.f;
    else s = cuda_rt_fail(ce, __FILE__, __LINE__, "timing space-to-depth staging");
  }
  (void)cudaStreamSynchronize(st);
  for (int i = 0; i < 2; i++)
    if (ev[i]) (void)cudaEventDestroy(ev[i]);
  ct_device_free(d, buf);
  return s;
}

/* cudnn_benchmark's auto choice for a space-to-depth pass: taken when
 * cuDNN's measured time for it plus its staging beats the direct pass's
 * measured time (or either is unknown), recorded in the space-to-depth
 * plan (s2d_verdict) so it is measured once per shape. */
static ct_status s2d_measure(ct_device *d, conv_kind kind, const conv_call *direct, const conv_call *zc,
                             const int64_t *ys) {
  cudnnHandle_t h;
  conv_plan *c;
  ct_dtype rt;
  int nhwc;
  float direct_ms = -1.f, staging_ms = -1.f;
  ct_status s = resolve_call(d, kind, direct, ys, &h, &c, &rt, &nhwc);
  if (s == CT_OK) direct_ms = c->cand[c->cur].ms;
  else if (s != CT_ERR_UNSUPPORTED) return s;
  else ct_error_clear(); /* no direct algorithm: not an error here */
  /* the space-to-depth plan again: resolving the direct one may have
   * moved the cache */
  CT_TRY(resolve_call(d, kind, zc, ys, &h, &c, &rt, &nhwc));
  CT_TRY(s2d_time_staging(d, kind, zc->z, rt, &staging_ms));
  const float z_ms = c->cand[c->cur].ms;
  c->s2d_ms = z_ms, c->s2d_direct_ms = direct_ms, c->s2d_staging_ms = staging_ms;
  /* Unknown times: no direct algorithm (or an untimed one) leaves
   * space-to-depth; staging buffers that did not fit leave the direct
   * pass, which needs less memory; an untimed space-to-depth plan is
   * taken, as without the benchmark. */
  if (direct_ms < 0) c->s2d_verdict = 1;
  else if (staging_ms < 0) c->s2d_verdict = -1;
  else c->s2d_verdict = z_ms < 0 || z_ms + staging_ms < direct_ms ? 1 : -1;
  return CT_OK;
}

/* How this pass runs (*cc) and the plan it runs with (*c, its dtype *rt
 * and layout *nhwc, as conv_resolve): space-to-depth where s2d_fits, the
 * device's CTRAIN_CUDA_S2D allows it (cuda_dev.s2d) and cuDNN has an
 * algorithm for it; under the default (auto) with cudnn_benchmark, only
 * where s2d_measure found it faster. Otherwise direct. zbuf holds the
 * space-to-depth geometry cc points at. */
static ct_status conv_route(ct_device *d, conv_kind kind, const ct_conv2d_params *p, const int64_t *xs,
                            const int64_t *wsh, const int64_t *ys, conv_arg in1, conv_arg in2, conv_arg oa, float beta,
                            s2d_pass *zbuf, conv_call *cc, cudnnHandle_t *h, conv_plan **c, ct_dtype *rt, int *nhwc) {
  const cuda_dev *cd = cuda_dev_of(d);
  *cc = direct_call(p, xs, wsh, in1, in2, oa, beta);
  /* the direct pass's dtype rule first: S, W' and dW', typed as x, would
   * pass it whatever the call's operands */
  if (cd->s2d == CUDA_S2D_OFF || !conv_dtypes_ok(in1.t, in2.t, oa.t) || !(in1.nhwc || in2.nhwc || oa.nhwc) ||
      !s2d_fits(kind, p, xs, wsh, ys, zbuf))
    return resolve_call(d, kind, cc, ys, h, c, rt, nhwc);
  zbuf->x = in1, zbuf->w = kind == CONV_FWD ? in2 : oa, zbuf->beta = beta;
  const conv_call zc = s2d_call(zbuf, kind, in1, in2, oa);
  ct_status s = resolve_call(d, kind, &zc, ys, h, c, rt, nhwc);
  if (s == CT_OK && cd->s2d == CUDA_S2D_AUTO && cd->cudnn_benchmark && !(*c)->s2d_verdict) {
    s = s2d_measure(d, kind, cc, &zc, ys);
    if (s == CT_OK) s = resolve_call(d, kind, &zc, ys, h, c, rt, nhwc);
  }
  if (s != CT_OK) {
    /* No algorithm for S, or its plan or measurement failed: the direct
     * pass, which reports its own errors (a broken context among them). */
    ct_error_clear();
    return resolve_call(d, kind, cc, ys, h, c, rt, nhwc);
  }
  if (cd->s2d == CUDA_S2D_AUTO && cd->cudnn_benchmark && (*c)->s2d_verdict < 0)
    return resolve_call(d, kind, cc, ys, h, c, rt, nhwc);
  *cc = zc;
  return CT_OK;
}

/* Runs one convolution pass. Shapes: xs = x [N,C,H,W], wsh = w
 * [O,C/groups,KH,KW], ys = y [N,O,OH,OW]. Operands by kind:
 *   fwd:         in1 = x,  in2 = w,  out = y
 *   bwd_data:    in1 = dy, in2 = w,  out = dx (out = beta*out + grad)
 *   bwd_filter:  in1 = x,  in2 = dy, out = dw (out = beta*out + grad)
 * (fwd: beta 0). A staged output is accumulated as it is copied back.
 * Each operand carries its own layout; the pass runs NHWC when any does
 * (NCHW when cuDNN has no NHWC algorithm for it), and operands in the
 * other layout or another dtype than the pass's are staged in scratch
 * (inputs before, the output after the cuDNN call). conv_route decides
 * whether it runs space-to-depth. */
static ct_status conv_exec(ct_device *d, conv_kind kind, const ct_conv2d_params *p, const int64_t *xs,
                           const int64_t *wsh, const int64_t *ys, conv_arg in1, conv_arg in2, void *out, conv_arg oa,
                           float beta) {
  s2d_pass z;
  conv_call cc;
  cudnnHandle_t h;
  conv_plan *c;
  ct_dtype rt;
  int nhwc;
  CT_TRY(conv_route(d, kind, p, xs, wsh, ys, in1, in2, oa, beta, &z, &cc, &h, &c, &rt, &nhwc));
  if (cc.z && kind == CONV_BWD_FILTER) out = NULL; /* conv_try writes dW', the fold dw */
  for (;;) {
    int retry = 0;
    ct_status s = conv_try(d, h, kind, c, nhwc, rt, cc.in1, cc.in2, out, cc.oa, cc.beta, cc.z, &retry);
    if (s == CT_OK || !retry || c->cur + 1 >= c->ncand) return s;
    c->left_why[c->cur] = retry == CONV_LEFT_ALIGN ? CONV_LEFT_ALIGN
                          : s == CT_ERR_OUT_OF_MEMORY ? CONV_LEFT_OOM
                                                      : CONV_LEFT_REFUSED;
    c->cur++;
    cudnnStatus_t e = cudnnSetConvolutionMathType(c->cv, c->cand[c->cur].math);
    if (e != CUDNN_STATUS_SUCCESS) return cuda_dnn_fail(e, __FILE__, __LINE__, "cudnnSetConvolutionMathType");
  }
}

/* Math type names for cuda_conv_describe. */
static const char *math_name(cudnnMathType_t m) {
  return m == CUDNN_FMA_MATH ? "fma" : tensor_op_math(m) ? "tensor-op" : "default";
}

/* "algo 1 tensor-op" or "engine 12 (graph)". */
static void cand_name(const conv_cand *k, char *buf, size_t n) {
  if (k->gplan) snprintf(buf, n, "engine %lld (graph)", k->engine);
  else snprintf(buf, n, "algo %d %s", k->algo, math_name(k->math));
}

size_t cuda_conv_describe(ct_device *d, char *buf, size_t n) {
  const struct cuda_conv_cache *cc = cuda_dev_of(d)->conv_cache;
  size_t len = 0;
#define PUT(...)                                                                          \
  do {                                                                                    \
    int w_ = snprintf(len < n ? buf + len : NULL, len < n ? n - len : 0, __VA_ARGS__);    \
    if (w_ > 0) len += (size_t)w_;                                                        \
  } while (0)
  PUT("scratch buffer %.1f MB (cuBLASLt's and batch norm's workspaces, partial sums, and convolution calls that "
      "needed more than was planned); convolutions through cuDNN's %s API%s\n",
      cuda_dev_of(d)->scratch_bytes / 1048576.0, cuda_dev_of(d)->conv_graph ? "graph and legacy" : "legacy",
      cuda_dev_of(d)->deterministic ? ", deterministic algorithms only" : "");
  if (cuda_dev_of(d)->conv_graph_err[0])
    PUT("graph API plans failed (those passes ran on the legacy API): %s\n", cuda_dev_of(d)->conv_graph_err);
  for (int i = 0; cc && i < cc->n; i++) {
    const conv_plan *c = &cc->p[i];
    const int *k = c->key;
    float kb; /* the beta graph plans baked in (plan_beta) */
    memcpy(&kb, &k[24], sizeof kb);
    char beta[32] = "", s2d[80] = "";
    if (kb != 0.f) snprintf(beta, sizeof beta, " (graph beta %g)", kb);
    if (k[25])
      snprintf(s2d, sizeof s2d, " space-to-depth %d of %dx%dx%d k %dx%d pad %d", k[25], k[26], k[31], k[32], k[27],
               k[28], k[29]);
    PUT("%-18s %-4s %s x %dx%dx%dx%d w %dx%dx%dx%d stride %d pad %d groups %d%s%s:", kind_name[k[0]],
        ct_dtype_name((ct_dtype)k[1]), k[23] ? "nhwc" : "nchw", k[4], k[5], k[6], k[7], k[8], k[9], k[10], k[11],
        k[16], k[18], k[22], s2d, beta);
    if (!c->ncand) {
      PUT(" no algorithm\n");
      continue;
    }
    const conv_cand *a = &c->cand[c->cur];
    char nm[48];
    cand_name(a, nm, sizeof nm);
    PUT(" %s, workspace %.1f MB, %.1f MB a call with staging, %lld calls (%lld in scratch)%s", nm,
        a->wsb / 1048576.0, c->need_max / 1048576.0, c->calls, c->in_scratch, c->accumulated ? ", accumulating" : "");
    if (c->graph || a->ms >= 0) {
      /* every candidate, the one running starred: engine e<N>, algorithm a<N>, time when measured */
      PUT("; %s:", a->ms >= 0 ? "timed (ms)" : "ranked");
      for (int j = 0; j < c->ncand; j++) {
        const conv_cand *q = &c->cand[j];
        PUT(" %s%c%lld", j == c->cur ? "*" : "", q->gplan ? 'e' : 'a', q->gplan ? q->engine : (long long)q->algo);
        if (q->ms >= 0) PUT("=%.3f", q->ms);
      }
    }
    for (int j = 0; j < c->cur; j++) {
      cand_name(&c->cand[j], nm, sizeof nm);
      PUT("; left %s: %s", nm,
          c->left_why[j] == CONV_LEFT_OOM     ? "out of memory"
          : c->left_why[j] == CONV_LEFT_ALIGN ? "an operand not aligned for the graph API"
                                              : "cuDNN refused it");
    }
    if (c->s2d_verdict)
      PUT("; %s: %.3f ms + staging %.3f ms against the direct pass's %.3f ms", c->s2d_verdict > 0 ? "taken" : "not taken",
          c->s2d_ms, c->s2d_staging_ms, c->s2d_direct_ms);
    PUT("\n");
  }
#undef PUT
  return len;
}

/* 1 for NHWC, 0 for plain; anything else (C16 is the cpu's) is refused. */
static ct_status nhwc_of(const char *op, const char *what, const ct_tensor *t, int *out) {
  if (t->layout != CT_LAYOUT_PLAIN && t->layout != CT_LAYOUT_NHWC)
    return ct_error(CT_ERR_UNSUPPORTED, "cuda %s: %s has layout %d; cuDNN here takes NCHW (plain) or NHWC", op, what,
                    (int)t->layout);
  *out = t->layout == CT_LAYOUT_NHWC;
  return CT_OK;
}

static ct_status check4(const char *op, const ct_tensor *a, const ct_tensor *b, const ct_tensor *c) {
  if (a->ndim != 4 || b->ndim != 4 || c->ndim != 4)
    return ct_error(CT_ERR_SHAPE, "cuda %s: expected 4-D tensors (x NCHW, w [O, C/groups, KH, KW], y NCHW)", op);
  return CT_OK;
}

ct_status cuda_conv2d_fwd(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w,
                          const ct_tensor *b, ct_act act, ct_tensor *y) {
  CT_TRY(check4("conv2d_fwd", x, w, y));
  CT_TRY(cuda_check_float("conv2d_fwd", b, 3));
  if ((int)act < 0 || act >= CT_ACT_COUNT)
    return ct_error(CT_ERR_INVALID_ARG, "cuda conv2d_fwd: unknown activation %d", (int)act);
  int xn = 0, yn = 0, wn = 0;
  CT_TRY(nhwc_of("conv2d_fwd", "x", x, &xn));
  CT_TRY(nhwc_of("conv2d_fwd", "y", y, &yn));
  CT_TRY(nhwc_of("conv2d_fwd", "w", w, &wn));
  if (wn) return ct_error(CT_ERR_UNSUPPORTED, "cuda conv2d_fwd: the weight must be plain [O, C/groups, KH, KW]");
  CT_TRY(conv_exec(d, CONV_FWD, p, x->shape, w->shape, y->shape, arg_of(x->data, x->dtype, xn, x->shape),
                   arg_of(w->data, w->dtype, 0, w->shape), y->data, arg_of(y->data, y->dtype, yn, y->shape), 0.f));
  /* Channel of element i: (i / HW) % C in NCHW, i % C in NHWC. */
  return cuda_bias_act(d, y->data, y->dtype, ct_tensor_numel(y), b ? b->data : NULL, b ? b->dtype : CT_F32,
                       y->shape[1], yn ? 1 : y->shape[2] * y->shape[3], act);
}

/* dx = beta * dx + the gradient: cuDNN's own blend (beta 0 or 1). */
static ct_status bwd_data(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy, const ct_tensor *w,
                          ct_tensor *dx, float beta) {
  CT_TRY(check4("conv2d_bwd_data", dx, w, dy));
  int dyn = 0, dxn = 0, wn = 0;
  CT_TRY(nhwc_of("conv2d_bwd_data", "dy", dy, &dyn));
  CT_TRY(nhwc_of("conv2d_bwd_data", "dx", dx, &dxn));
  CT_TRY(nhwc_of("conv2d_bwd_data", "w", w, &wn));
  if (wn) return ct_error(CT_ERR_UNSUPPORTED, "cuda conv2d_bwd_data: the weight must be plain [O, C/groups, KH, KW]");
  return conv_exec(d, CONV_BWD_DATA, p, dx->shape, w->shape, dy->shape, arg_of(dy->data, dy->dtype, dyn, dy->shape),
                   arg_of(w->data, w->dtype, 0, w->shape), dx->data, arg_of(dx->data, dx->dtype, dxn, dx->shape), beta);
}

ct_status cuda_conv2d_bwd_data(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy, const ct_tensor *w,
                               ct_tensor *dx) {
  return bwd_data(d, p, dy, w, dx, 0.f);
}

ct_status cuda_conv2d_bwd_data_acc(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy, const ct_tensor *w,
                                   ct_tensor *dx) {
  return bwd_data(d, p, dy, w, dx, 1.f);
}

ct_status cuda_conv2d_bwd_weights(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *dy,
                                  ct_tensor *dw, ct_tensor *db, float beta) {
  CT_TRY(check4("conv2d_bwd_weights", x, dw, dy));
  CT_TRY(cuda_check_float("conv2d_bwd_weights", db, 4));
  int xn = 0, dyn = 0, wn = 0;
  CT_TRY(nhwc_of("conv2d_bwd_weights", "x", x, &xn));
  CT_TRY(nhwc_of("conv2d_bwd_weights", "dy", dy, &dyn));
  CT_TRY(nhwc_of("conv2d_bwd_weights", "dw", dw, &wn));
  if (wn) return ct_error(CT_ERR_UNSUPPORTED, "cuda conv2d_bwd_weights: dw must be plain [O, C/groups, KH, KW]");
  CT_TRY(conv_exec(d, CONV_BWD_FILTER, p, x->shape, dw->shape, dy->shape, arg_of(x->data, x->dtype, xn, x->shape),
                   arg_of(dy->data, dy->dtype, dyn, dy->shape), dw->data, arg_of(dw->data, dw->dtype, 0, dw->shape),
                   beta));
  if (!db) return CT_OK;
  /* NHWC dy is [N*OH*OW][O]: the channel sum over one block of one. */
  if (dyn)
    return cuda_channel_sum(d, dy->data, dy->dtype, dy->shape[0] * dy->shape[2] * dy->shape[3], dy->shape[1], 1,
                            db->data, db->dtype, beta);
  return cuda_channel_sum(d, dy->data, dy->dtype, dy->shape[0], dy->shape[1], dy->shape[2] * dy->shape[3], db->data,
                          db->dtype, beta);
}

size_t cuda_conv2d_workspace_bytes(ct_device *d, int pass, const ct_conv2d_params *p, const ct_tensor *a,
                                   const ct_tensor *b, const ct_tensor *out) {
  if (pass < 0 || pass > 2 || a->ndim != 4 || b->ndim != 4 || out->ndim != 4) return 0;
  const conv_kind kind = (conv_kind)pass;
  /* x, w and y shapes by pass, as the ops pass them to conv_exec */
  const ct_tensor *x = kind == CONV_BWD_DATA ? out : a, *y = kind == CONV_FWD ? out : kind == CONV_BWD_DATA ? a : b;
  const ct_tensor *w = kind == CONV_BWD_FILTER ? out : b;
  int an = 0, bn = 0, on = 0;
  if (nhwc_of(kind_name[kind], "a", a, &an) != CT_OK || nhwc_of(kind_name[kind], "b", b, &bn) != CT_OK ||
      nhwc_of(kind_name[kind], "out", out, &on) != CT_OK || w->layout != CT_LAYOUT_PLAIN)
    return 0;
  conv_arg in1 = arg_of(NULL, a->dtype, an, a->shape), in2 = arg_of(NULL, b->dtype, bn, b->shape);
  conv_arg oa = arg_of(NULL, out->dtype, on, out->shape);
  /* A backward pass may accumulate (beta 1), for which graph plans are
   * built apart: the larger need of the two. */
  size_t most = 0;
  for (int acc = 0; acc < (kind != CONV_FWD && cuda_dev_of(d)->conv_graph ? 2 : 1); acc++) {
    s2d_pass z;
    conv_call cc;
    cudnnHandle_t h;
    conv_plan *c;
    ct_dtype rt;
    int nhwc;
    if (conv_route(d, kind, p, x->shape, w->shape, y->shape, in1, in2, oa, (float)acc, &z, &cc, &h, &c, &rt, &nhwc) !=
        CT_OK)
      return 0;
    if (cc.z) s2d_args(cc.z, kind, rt, &cc.in1, &cc.in2, &cc.oa);
    const size_t need = conv_need(&c->cand[c->cur], nhwc, rt, in_layout(cc.in1, nhwc), in_layout(cc.in2, nhwc),
                                  in_layout(cc.oa, nhwc), cc.z).total;
    if (need > most) most = need;
  }
  return most;
}
