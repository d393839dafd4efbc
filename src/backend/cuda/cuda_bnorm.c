/* Batch norm on cuDNN (the legacy batch-norm API, which cuDNN 9 still
 * ships): cudnnBatchNormalizationForwardTrainingEx, ForwardInference and
 * BackwardEx with bnOps = CUDNN_BATCHNORM_OPS_BN, and for the backend's
 * batchnorm_act_* (the end of this file) CUDNN_BATCHNORM_OPS_BN_ACTIVATION
 * with ReLU.
 *
 * Layouts: x and y (forward), x, dy and dx (backward) share one layout,
 * CT_LAYOUT_PLAIN or, for 4-D tensors, CT_LAYOUT_NHWC (the executor keeps
 * channels-last activations across batch norms on cuda). 2-D [N, C] and
 * 3-D+ [N, C, ...] plain tensors are described as [N, C, S, 1] with S the
 * product of the trailing extents, which is what SPATIAL mode normalises
 * over. A mixed or any other layout (C16 is the cpu's) is refused with
 * CT_ERR_UNSUPPORTED on every path.
 *
 * Mode: CUDNN_BATCHNORM_SPATIAL_PERSISTENT for training on NHWC bf16/f16
 * (PyTorch's choice for channels-last; cuDNN's fast NHWC kernels), SPATIAL
 * otherwise: in NCHW the persistent kernels use a scaled integer reduction
 * with a smaller range (PyTorch falls back to SPATIAL there for accuracy),
 * and f32 stays on SPATIAL to keep its 1e-5 agreement with the CPU.
 * Training and backward derive the mode from the same inputs, so both use
 * the same one.
 *
 * Semantics as the reference: cuDNN's resultSaveInvVariance is
 * 1/sqrt(var + eps) with the biased batch variance (our save_invstd), its
 * running variance takes the unbiased one, exponentialAverageFactor is
 * PyTorch's momentum. The backward passes the saved statistics, so the
 * epsilon it takes (the contract has none) is not used to recompute them;
 * it gets a valid placeholder.
 *
 * Reserve space for OPS_BN: none. It would have to live from forward to
 * backward, which batchnorm_fwd/bwd have no buffer for (the fused pair
 * takes one from the caller). When cuDNN asks for a
 * reserve (cudnnGetBatchNormalizationTrainingExReserveSpaceSize > 0) both
 * directions pass no workspace and no reserve, which cuDNN documents as
 * behaving exactly like the non-Ex functions; otherwise the workspace comes
 * from the device scratch buffer. Whether SPATIAL_PERSISTENT accepts the
 * missing reserve has not been seen on a GPU yet: if cuDNN answers
 * BAD_PARAM there, the device stops using SPATIAL_PERSISTENT
 * (cuda_dev.bn_spatial_only) and the call runs again in SPATIAL, so both
 * directions keep agreeing on the mode from then on (the saved statistics
 * mean the same in either mode). The emulator's
 * CT_EMU_BN_RESERVE_REQUIRED=1 takes that reading of the documentation;
 * emu_test_gpu_bnorm runs both.
 *
 * Parameters: cuDNN takes f32 scale/bias/statistics for every activation
 * dtype here (checked on the derived descriptor). gamma/beta NULL
 * (affine=False) get ones/zeros in scratch; a NULL dgamma/dbeta, one NULL
 * of the save or running pair, and a NULL dx (cuDNN always writes dx) get
 * scratch stand-ins, so no NULL the caller passed is ever written through.
 *
 * Fallback to the own kernels (cuda_reduce.cu): parameters or statistics
 * not f32, x/y/dy/dx of different dtypes, epsilon below
 * CUDNN_BN_MIN_EPSILON, extents or element counts beyond cuDNN's int
 * descriptors, and CUDNN_STATUS_NOT_SUPPORTED (or one of its cuDNN 9
 * sub-codes) from cuDNN.
 *
 * Tensor descriptors are created and destroyed per call (two host-side
 * allocations; no per-shape cache); the fused path's ReLU descriptor is
 * made once per device. */
#include <limits.h>
#include <string.h>

#include "backend/cuda/cuda_impl.h"

static size_t round256(size_t b) { return (b + 255) / 256 * 256; }

static cudnnDataType_t dnn_type(ct_dtype t) {
  return t == CT_F32 ? CUDNN_DATA_FLOAT : t == CT_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

/* Placeholder epsilon for the backward (see the header comment). */
#define BN_BWD_EPS (CUDNN_BN_MIN_EPSILON > 1e-5 ? CUDNN_BN_MIN_EPSILON : 1e-5)

/* x's [N, C, S] view; S = product of the extents after C. */
static ct_status bn_dims(const char *op, const ct_tensor *x, int64_t *N, int64_t *C, int64_t *S) {
  if (x->ndim < 2 || x->ndim > CT_MAX_DIMS)
    return ct_error(CT_ERR_SHAPE, "cuda %s: x must have 2 to %d dims [N, C, ...], got %d", op, CT_MAX_DIMS, x->ndim);
  *N = x->shape[0];
  *C = x->shape[1];
  *S = 1;
  for (int i = 2; i < x->ndim; i++) *S *= x->shape[i];
  if (*N < 0 || *C < 0 || *S < 0) return ct_error(CT_ERR_SHAPE, "cuda %s: negative extent in x", op);
  return CT_OK;
}

/* *nhwc = 1 when every activation tensor is NHWC (4-D), 0 when all are
 * plain; anything else is refused. acts[0] is x; NULL entries are skipped. */
static ct_status bn_layout(const char *op, const ct_tensor *const *acts, const char *const *names, int n, int *nhwc) {
  const ct_layout l0 = acts[0]->layout;
  for (int i = 0; i < n; i++) {
    const ct_tensor *t = acts[i];
    if (!t) continue;
    if (t->layout != CT_LAYOUT_PLAIN && t->layout != CT_LAYOUT_NHWC)
      return ct_error(CT_ERR_UNSUPPORTED, "cuda %s: %s has layout %d; batch norm takes plain (NCHW) or NHWC tensors",
                      op, names[i], (int)t->layout);
    if (t->layout != l0)
      return ct_error(CT_ERR_UNSUPPORTED,
                      "cuda %s: %s is %s but %s is %s; batch norm needs one layout for all of its activation tensors",
                      op, names[i], t->layout == CT_LAYOUT_NHWC ? "NHWC" : "plain", names[0],
                      l0 == CT_LAYOUT_NHWC ? "NHWC" : "plain");
    if (t->layout == CT_LAYOUT_NHWC && t->ndim != 4)
      return ct_error(CT_ERR_UNSUPPORTED, "cuda %s: %s is NHWC with %d dims; NHWC is only defined for 4-D [N, C, H, W]",
                      op, names[i], t->ndim);
  }
  *nhwc = l0 == CT_LAYOUT_NHWC;
  return CT_OK;
}

/* Activation tensors must have x's element count, parameters C entries:
 * the kernels index them by those counts. */
static ct_status bn_sizes(const char *op, int64_t numel, int64_t C, const ct_tensor *const *acts,
                          const char *const *anames, int na, const ct_tensor *const *params, const char *const *pnames,
                          int np) {
  for (int i = 0; i < na; i++)
    if (acts[i] && ct_tensor_numel(acts[i]) != numel)
      return ct_error(CT_ERR_SHAPE, "cuda %s: %s has %lld elements, x has %lld", op, anames[i],
                      (long long)ct_tensor_numel(acts[i]), (long long)numel);
  for (int i = 0; i < np; i++)
    if (params[i] && ct_tensor_numel(params[i]) != C)
      return ct_error(CT_ERR_SHAPE, "cuda %s: %s has %lld entries, expected %lld (one per channel)", op, pnames[i],
                      (long long)ct_tensor_numel(params[i]), (long long)C);
  return CT_OK;
}

/* 1 when cuDNN can take the call (before asking cuDNN itself). */
static int bn_dnn_eligible(const ct_tensor *x, const ct_tensor *const *acts, int na, const ct_tensor *const *params,
                           int np, double eps, int64_t N, int64_t C, int64_t S) {
  for (int i = 0; i < na; i++)
    if (acts[i] && acts[i]->dtype != x->dtype) return 0;
  for (int i = 0; i < np; i++)
    if (params[i] && params[i]->dtype != CT_F32) return 0;
  if (!(eps >= CUDNN_BN_MIN_EPSILON)) return 0;
  if (N > INT_MAX || C > INT_MAX || S > INT_MAX) return 0;
  /* cuDNN's legacy descriptors hold int strides and element counts */
  if ((double)N * (double)C * (double)S > (double)INT_MAX) return 0;
  return 1;
}

typedef struct bn_desc {
  cudnnTensorDescriptor_t xd; /* x, y, dy, dx */
  cudnnTensorDescriptor_t pd; /* [1, C, 1, 1] scale, bias, statistics */
} bn_desc;

static void bn_desc_destroy(bn_desc *b) {
  if (b->pd) cudnnDestroyTensorDescriptor(b->pd);
  if (b->xd) cudnnDestroyTensorDescriptor(b->xd);
  b->pd = b->xd = NULL;
}

/* Builds the descriptors; *ok = 0 (no error) when the derived parameter
 * descriptor is not f32, which our f32 parameters would not match. */
static ct_status bn_desc_make(bn_desc *b, const ct_tensor *x, int nhwc, int64_t N, int64_t C, int64_t S,
                              cudnnBatchNormMode_t mode, int *ok) {
  memset(b, 0, sizeof *b);
  *ok = 0;
  cudnnStatus_t e;
  const char *call = "";
  int h = (int)S, w = 1;
  if (x->ndim == 4) h = (int)x->shape[2], w = (int)x->shape[3];
#define BN_DNN(c)          \
  do {                     \
    call = #c;             \
    e = (c);               \
    if (e != CUDNN_STATUS_SUCCESS) goto fail; \
  } while (0)
  BN_DNN(cudnnCreateTensorDescriptor(&b->xd));
  BN_DNN(cudnnCreateTensorDescriptor(&b->pd));
  BN_DNN(cudnnSetTensor4dDescriptor(b->xd, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, dnn_type(x->dtype), (int)N,
                                    (int)C, h, w));
  BN_DNN(cudnnDeriveBNTensorDescriptor(b->pd, b->xd, mode));
  {
    cudnnDataType_t pt;
    int n_, c_, h_, w_, s0, s1, s2, s3;
    BN_DNN(cudnnGetTensor4dDescriptor(b->pd, &pt, &n_, &c_, &h_, &w_, &s0, &s1, &s2, &s3));
    *ok = pt == CUDNN_DATA_FLOAT && c_ == (int)C;
  }
#undef BN_DNN
  return CT_OK;
fail:
  bn_desc_destroy(b);
  if (cuda_dnn_unsupported(e)) return CT_OK; /* *ok stays 0: own kernels */
  return cuda_dnn_fail(e, __FILE__, __LINE__, call);
}

static cudnnBatchNormMode_t bn_mode(ct_device *d, int training, int nhwc, ct_dtype t) {
  return training && nhwc && t != CT_F32 && !cuda_dev_of(d)->bn_spatial_only ? CUDNN_BATCHNORM_SPATIAL_PERSISTENT
                                                                              : CUDNN_BATCHNORM_SPATIAL;
}

/* *fallback values: the own kernels (a fused call: the unfused path), the
 * same call again in SPATIAL, or (fused) unfused because the reserve cuDNN
 * asks for is larger than the caller's. */
enum { BN_OWN_KERNELS = 1, BN_RETRY_SPATIAL = 2, BN_RESERVE_SHORT = 3 };

/* A BAD_PARAM from SPATIAL_PERSISTENT run without the reserve it asked for
 * (rsb > 0): that mode needs the reserve on this cuDNN (see the header). */
static int persistent_refused(ct_device *d, cudnnStatus_t e, cudnnBatchNormMode_t mode, size_t rsb) {
  if (e != CUDNN_STATUS_BAD_PARAM || mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT || !rsb) return 0;
  cuda_dev_of(d)->bn_spatial_only = 1;
  return 1;
}

/* Inside the cuDNN paths (it reads the caller's d, mode, rsb and f): a
 * cuDNN call that returns NOT_SUPPORTED sends the op to the own kernels
 * (a fused call, also on BAD_PARAM: to the unfused path, since which data
 * types and shapes cuDNN fuses is not pinned down by its documentation),
 * one that refuses SPATIAL_PERSISTENT for want of a reserve
 * (persistent_refused) asks the caller to repeat it in SPATIAL; any other
 * failure is the op's error. */
#define DNN_OR_FALLBACK(call)                                   \
  do {                                                          \
    cudnnStatus_t e_ = (call);                                  \
    if (cuda_dnn_unsupported(e_) || (f && e_ == CUDNN_STATUS_BAD_PARAM)) { \
      *fallback = BN_OWN_KERNELS;                               \
      goto done;                                                \
    }                                                           \
    if (!f && persistent_refused(d, e_, mode, rsb)) {           \
      *fallback = BN_RETRY_SPATIAL;                             \
      goto done;                                                \
    }                                                           \
    if (e_ != CUDNN_STATUS_SUCCESS) {                           \
      s = cuda_dnn_fail(e_, __FILE__, __LINE__, #call);         \
      goto done;                                                \
    }                                                           \
  } while (0)
#define RT(call)                                                \
  do {                                                          \
    cudaError_t e_ = (call);                                    \
    if (e_ != cudaSuccess) {                                    \
      s = cuda_rt_fail(e_, __FILE__, __LINE__, #call);          \
      goto done;                                                \
    }                                                           \
  } while (0)
#define TRY_DONE(expr)        \
  do {                        \
    s = (expr);               \
    if (s != CT_OK) goto done; \
  } while (0)

/* Writes value into C f32 entries of device memory p (stream order). */
static ct_status fill_f32(ct_device *d, void *p, int64_t C, float value) {
  ct_tensor t = ct_tensor_1d(p, CT_F32, C);
  t.device = d;
  return cuda_fill(d, &t, value);
}

/* The handle, mode and descriptors of one cuDNN batch-norm call (fused:
 * SPATIAL_PERSISTENT, the only mode with fused kernels, which has its
 * reserve then); *fallback = 1 (nothing left to free) when cuDNN cannot
 * describe it. */
static ct_status dnn_begin(ct_device *d, int training, int nhwc, int fused, const ct_tensor *x, int64_t N, int64_t C,
                           int64_t S, cudnnHandle_t *h, cudnnBatchNormMode_t *mode, bn_desc *b, int *fallback) {
  *fallback = 0;
  CT_TRY(cuda_dnn_handle(d, h));
  *mode = fused ? CUDNN_BATCHNORM_SPATIAL_PERSISTENT : bn_mode(d, training, nhwc, x->dtype);
  int ok = 0;
  CT_TRY(bn_desc_make(b, x, nhwc, N, C, S, *mode, &ok));
  if (!ok) {
    bn_desc_destroy(b);
    *fallback = BN_OWN_KERNELS;
  }
  return CT_OK;
}

/* A fused activation for dnn_fwd / dnn_bwd (NULL: OPS_BN): the activation
 * descriptor, the caller's reserve, and for the backward the forward's
 * output y and epsilon (cuDNN documents the forward's for the fused
 * backward; OPS_BN gets the placeholder). */
typedef struct bn_fuse {
  cudnnActivationDescriptor_t ad;
  void *reserve;
  size_t reserve_bytes;
  const void *y;
  double eps;
} bn_fuse;

static ct_status dnn_fwd(ct_device *d, int training, int nhwc, int64_t N, int64_t C, int64_t S, const ct_tensor *x,
                         const ct_tensor *gamma, const ct_tensor *beta, ct_tensor *running_mean,
                         ct_tensor *running_var, float momentum, float eps, ct_tensor *y, ct_tensor *save_mean,
                         ct_tensor *save_invstd, const bn_fuse *f, int *fallback) {
  cudnnHandle_t h;
  cudnnBatchNormMode_t mode;
  bn_desc b;
  CT_TRY(dnn_begin(d, training, nhwc, f != NULL, x, N, C, S, &h, &mode, &b, fallback));
  if (*fallback) return CT_OK;
  ct_status s = CT_OK;
  size_t wsb = 0, rsb = 0;
  const cudnnBatchNormOps_t ops = f ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION : CUDNN_BATCHNORM_OPS_BN;
  const cudnnActivationDescriptor_t ad = f ? f->ad : NULL;
  if (training) {
    DNN_OR_FALLBACK(
        cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, mode, ops, b.xd, NULL, b.xd, b.pd, ad, &wsb));
    DNN_OR_FALLBACK(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, mode, ops, ad, b.xd, &rsb));
    if (f && rsb > f->reserve_bytes) {
      *fallback = BN_RESERVE_SHORT;
      goto done;
    }
    if (rsb && !f) wsb = 0; /* no reserve to keep: run as the non-Ex function */
  }
  /* scratch: [workspace | ones | zeros | save pair | running pair], C f32 each after the workspace */
  const size_t vec = round256((size_t)C * sizeof(float)), off = round256(wsb);
  void *scr = NULL;
  TRY_DONE(cuda_scratch(d, off + 6 * vec, &scr));
  char *base = (char *)scr + off;
  void *ones = base, *zeros = base + vec, *dsave0 = base + 2 * vec, *dsave1 = base + 3 * vec;
  void *drun0 = base + 4 * vec, *drun1 = base + 5 * vec;
  const void *g = gamma ? gamma->data : ones, *bb = beta ? beta->data : zeros;
  if (!gamma) TRY_DONE(fill_f32(d, ones, C, 1.f));
  if (!beta) RT(cudaMemsetAsync(zeros, 0, (size_t)C * sizeof(float), cuda_stream(d)));
  const float one = 1.f, zero = 0.f;
  if (training) {
    /* cuDNN takes both of a pair or neither: a lone NULL gets a stand-in */
    void *sm = save_mean ? save_mean->data : NULL, *si = save_invstd ? save_invstd->data : NULL;
    if (!sm != !si) {
      if (!sm) sm = dsave0;
      if (!si) si = dsave1;
    }
    void *rm = running_mean ? running_mean->data : NULL, *rv = running_var ? running_var->data : NULL;
    if (!rm != !rv) {
      /* the stand-in's old value is blended in: start it from zero */
      if (!rm) rm = drun0;
      if (!rv) rv = drun1;
      RT(cudaMemsetAsync(drun0, 0, 2 * vec, cuda_stream(d)));
    }
    DNN_OR_FALLBACK(cudnnBatchNormalizationForwardTrainingEx(
        h, mode, ops, &one, &zero, b.xd, x->data, NULL, NULL, b.xd, y->data, b.pd, g, bb, (double)momentum, rm, rv,
        (double)eps, sm, si, ad, wsb || f ? scr : NULL, wsb, f && rsb ? f->reserve : NULL, f ? rsb : 0));
  } else {
    DNN_OR_FALLBACK(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, b.xd, x->data,
                                                            b.xd, y->data, b.pd, g, bb, running_mean->data,
                                                            running_var->data, (double)eps));
  }
done:
  bn_desc_destroy(&b);
  return s;
}

/* beta: the forward's bias, read by the fused backward only. */
static ct_status dnn_bwd(ct_device *d, int nhwc, int64_t N, int64_t C, int64_t S, const ct_tensor *x,
                         const ct_tensor *dy, const ct_tensor *gamma, const ct_tensor *beta,
                         const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_tensor *dx, ct_tensor *dgamma,
                         ct_tensor *dbeta, float beta_acc, const bn_fuse *f, int *fallback) {
  cudnnHandle_t h;
  cudnnBatchNormMode_t mode;
  bn_desc b;
  CT_TRY(dnn_begin(d, 1, nhwc, f != NULL, x, N, C, S, &h, &mode, &b, fallback));
  if (*fallback) return CT_OK;
  ct_status s = CT_OK;
  size_t wsb = 0, rsb = 0;
  const cudnnBatchNormOps_t ops = f ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION : CUDNN_BATCHNORM_OPS_BN;
  const cudnnActivationDescriptor_t ad = f ? f->ad : NULL;
  /* the same descriptors and argument pattern as PyTorch's cudnn_batch_norm_backward */
  DNN_OR_FALLBACK(
      cudnnGetBatchNormalizationBackwardExWorkspaceSize(h, mode, ops, b.xd, b.xd, b.xd, NULL, b.xd, b.pd, ad, &wsb));
  DNN_OR_FALLBACK(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, mode, ops, ad, b.xd, &rsb));
  if (f && rsb > f->reserve_bytes) {
    *fallback = BN_RESERVE_SHORT; /* as the forward found: unfused */
    goto done;
  }
  if (rsb && !f) wsb = 0; /* the forward ran as the non-Ex function too */
  /* scratch: [workspace | ones | dgamma stand-in | dbeta stand-in | zeros | dx stand-in] */
  const size_t vec = round256((size_t)C * sizeof(float)), off = round256(wsb);
  const size_t dxb = dx ? 0 : round256((size_t)(N * C * S) * ct_dtype_size(x->dtype));
  void *scr = NULL;
  TRY_DONE(cuda_scratch(d, off + 4 * vec + dxb, &scr));
  char *base = (char *)scr + off;
  void *ones = base, *ddg = base + vec, *ddb = base + 2 * vec, *zeros = base + 3 * vec, *ddx = base + 4 * vec;
  const void *g = gamma ? gamma->data : ones, *bb = beta ? beta->data : zeros;
  if (!gamma) TRY_DONE(fill_f32(d, ones, C, 1.f));
  if (f && !beta) RT(cudaMemsetAsync(zeros, 0, (size_t)C * sizeof(float), cuda_stream(d)));
  /* Both parameter gradients share betaParamDiff: a stand-in must hold a
   * finite value for beta_acc 1 (its result is thrown away). */
  if (!dgamma || !dbeta) RT(cudaMemsetAsync(ddg, 0, 2 * vec, cuda_stream(d)));
  const float one = 1.f, zero = 0.f, pbeta = beta_acc;
  /* y and the bias only with the activation (PyTorch passes NULL for OPS_BN);
   * a fused call always gets a workspace pointer: NULL with size 0 means
   * "as the non-Ex function", which has no activation */
  DNN_OR_FALLBACK(cudnnBatchNormalizationBackwardEx(
      h, mode, ops, &one, &zero, &one, &pbeta, b.xd, x->data, f ? b.xd : NULL, f ? f->y : NULL, b.xd, dy->data, NULL,
      NULL, b.xd, dx ? dx->data : (void *)ddx, b.pd, g, f ? bb : NULL, dgamma ? dgamma->data : ddg,
      dbeta ? dbeta->data : ddb, f ? f->eps : BN_BWD_EPS, save_mean->data, save_invstd->data, ad,
      wsb || f ? scr : NULL, wsb, f && rsb ? f->reserve : NULL, f ? rsb : 0));
done:
  bn_desc_destroy(&b);
  return s;
}

/* The forward's checks; *N, *C, *S and *nhwc describe x. */
static ct_status fwd_args(const char *op, int training, const ct_tensor *x, const ct_tensor *gamma,
                          const ct_tensor *beta, const ct_tensor *running_mean, const ct_tensor *running_var,
                          const ct_tensor *y, const ct_tensor *save_mean, const ct_tensor *save_invstd, int64_t *N,
                          int64_t *C, int64_t *S, int *nhwc) {
  if (!x || !y) return ct_error(CT_ERR_INVALID_ARG, "cuda %s: x and y are required", op);
  const ct_tensor *all[] = {x, gamma, beta, running_mean, running_var, y, save_mean, save_invstd};
  for (int i = 0; i < 8; i++) CT_TRY(cuda_check_float(op, all[i], i + 1));
  CT_TRY(bn_dims(op, x, N, C, S));
  const ct_tensor *acts[] = {x, y};
  static const char *const anames[] = {"x", "y"};
  CT_TRY(bn_layout(op, acts, anames, 2, nhwc));
  const ct_tensor *params[] = {gamma, beta, running_mean, running_var, save_mean, save_invstd};
  static const char *const pnames[] = {"gamma", "beta", "running_mean", "running_var", "save_mean", "save_invstd"};
  CT_TRY(bn_sizes(op, *N * *C * *S, *C, acts, anames, 2, params, pnames, 6));
  if (!training && (!running_mean || !running_var))
    return ct_error(CT_ERR_INVALID_ARG, "cuda %s: eval mode needs running_mean and running_var", op);
  if (training && *N * *S < 2 && *N * *C * *S > 0)
    return ct_error(CT_ERR_INVALID_ARG,
                    "cuda %s: expected more than 1 value per channel when training (input has %lld); use a larger "
                    "batch or eval mode",
                    op, (long long)(*N * *S));
  return CT_OK;
}

/* The backward's checks (y and beta: the fused backward's, may be NULL). */
static ct_status bwd_args(const char *op, const ct_tensor *x, const ct_tensor *y, const ct_tensor *dy,
                          const ct_tensor *gamma, const ct_tensor *beta, const ct_tensor *save_mean,
                          const ct_tensor *save_invstd, const ct_tensor *dx, const ct_tensor *dgamma,
                          const ct_tensor *dbeta, int64_t *N, int64_t *C, int64_t *S, int *nhwc) {
  if (!x || !dy) return ct_error(CT_ERR_INVALID_ARG, "cuda %s: x and dy are required", op);
  const ct_tensor *all[] = {x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, y, beta};
  for (int i = 0; i < 10; i++) CT_TRY(cuda_check_float(op, all[i], i + 1));
  if (!save_mean || !save_invstd)
    return ct_error(CT_ERR_INVALID_ARG, "cuda %s: save_mean and save_invstd from the training forward are required",
                    op);
  CT_TRY(bn_dims(op, x, N, C, S));
  const ct_tensor *acts[] = {x, dy, dx, y};
  static const char *const anames[] = {"x", "dy", "dx", "y"};
  CT_TRY(bn_layout(op, acts, anames, 4, nhwc));
  const ct_tensor *params[] = {gamma, save_mean, save_invstd, dgamma, dbeta, beta};
  static const char *const pnames[] = {"gamma", "save_mean", "save_invstd", "dgamma", "dbeta", "beta"};
  CT_TRY(bn_sizes(op, *N * *C * *S, *C, acts, anames, 4, params, pnames, 6));
  return CT_OK;
}

static ct_status bn_fwd(ct_device *d, int training, int nhwc, int64_t N, int64_t C, int64_t S, const ct_tensor *x,
                        const ct_tensor *gamma, const ct_tensor *beta, ct_tensor *running_mean,
                        ct_tensor *running_var, float momentum, float eps, ct_tensor *y, ct_tensor *save_mean,
                        ct_tensor *save_invstd) {
  if (C == 0 || N == 0 || S == 0) return CT_OK;
  const ct_tensor *acts[] = {x, y}, *params[] = {gamma, beta, running_mean, running_var, save_mean, save_invstd};
  if (bn_dnn_eligible(x, acts, 2, params, 6, (double)eps, N, C, S)) {
    int fallback = 0;
    do {
      CT_TRY(dnn_fwd(d, training, nhwc, N, C, S, x, gamma, beta, running_mean, running_var, momentum, eps, y,
                     save_mean, save_invstd, NULL, &fallback));
    } while (fallback == BN_RETRY_SPATIAL);
    if (!fallback) return CT_OK;
  }
  return cuda_bn_fwd_kernels(d, training, nhwc, N, C, S, x, gamma, beta, running_mean, running_var, momentum, eps, y,
                             save_mean, save_invstd);
}

static ct_status bn_bwd(ct_device *d, int nhwc, int64_t N, int64_t C, int64_t S, const ct_tensor *x,
                        const ct_tensor *dy, const ct_tensor *gamma, const ct_tensor *save_mean,
                        const ct_tensor *save_invstd, ct_tensor *dx, ct_tensor *dgamma, ct_tensor *dbeta,
                        float beta_acc) {
  if (C == 0 || N == 0 || S == 0) return CT_OK;
  /* nothing to compute: cuDNN would still need every output */
  if (!dx && !dgamma && !dbeta) return CT_OK;
  const ct_tensor *acts[] = {x, dy, dx}, *params[] = {gamma, save_mean, save_invstd, dgamma, dbeta};
  if (bn_dnn_eligible(x, acts, 3, params, 5, BN_BWD_EPS, N, C, S)) {
    int fallback = 0;
    do {
      CT_TRY(dnn_bwd(d, nhwc, N, C, S, x, dy, gamma, NULL, save_mean, save_invstd, dx, dgamma, dbeta, beta_acc, NULL,
                     &fallback));
    } while (fallback == BN_RETRY_SPATIAL);
    if (!fallback) return CT_OK;
  }
  return cuda_bn_bwd_kernels(d, nhwc, N, C, S, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, beta_acc);
}

ct_status cuda_batchnorm_fwd(ct_device *d, int training, const ct_tensor *x, const ct_tensor *gamma,
                             const ct_tensor *beta, ct_tensor *running_mean, ct_tensor *running_var, float momentum,
                             float eps, ct_tensor *y, ct_tensor *save_mean, ct_tensor *save_invstd) {
  if (!training) save_mean = save_invstd = NULL; /* unused in eval, per the contract */
  int64_t N = 0, C = 0, S = 0;
  int nhwc = 0;
  CT_TRY(cuda_enter(d));
  CT_TRY(fwd_args("batchnorm_fwd", training, x, gamma, beta, running_mean, running_var, y, save_mean, save_invstd,
                  &N, &C, &S, &nhwc));
  return bn_fwd(d, training, nhwc, N, C, S, x, gamma, beta, running_mean, running_var, momentum, eps, y, save_mean,
                save_invstd);
}

ct_status cuda_batchnorm_bwd(ct_device *d, const ct_tensor *x, const ct_tensor *dy, const ct_tensor *gamma,
                             const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_tensor *dx,
                             ct_tensor *dgamma, ct_tensor *dbeta, float beta_acc) {
  int64_t N = 0, C = 0, S = 0;
  int nhwc = 0;
  CT_TRY(bwd_args("batchnorm_bwd", x, NULL, dy, gamma, NULL, save_mean, save_invstd, dx, dgamma, dbeta, &N, &C, &S,
                  &nhwc));
  CT_TRY(cuda_enter(d));
  return bn_bwd(d, nhwc, N, C, S, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, beta_acc);
}

/* Always the own kernels: cuDNN has no call that normalises with given
 * batch statistics (its inference call takes a variance, and
 * 1/sqrt(var + eps) from one would not give save_invstd's bits back). */
ct_status cuda_batchnorm_apply(ct_device *d, const ct_tensor *x, const ct_tensor *gamma, const ct_tensor *beta,
                               const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_act act, float alpha,
                               ct_tensor *y) {
  if (!save_mean || !save_invstd)
    return ct_error(CT_ERR_INVALID_ARG, "cuda batchnorm_apply: save_mean and save_invstd from the training forward are required");
  int64_t N = 0, C = 0, S = 0;
  int nhwc = 0;
  CT_TRY(cuda_enter(d));
  CT_TRY(fwd_args("batchnorm_apply", 1, x, gamma, beta, NULL, NULL, y, save_mean, save_invstd, &N, &C, &S, &nhwc));
  return cuda_bn_apply_kernels(d, nhwc, N, C, S, x, gamma, beta, save_mean, save_invstd, act, alpha, y);
}

/* ---- batch norm with its activation fused ----
 *
 * cuDNN fuses ReLU into batch norm (bnOps CUDNN_BATCHNORM_OPS_BN_ACTIVATION)
 * in SPATIAL_PERSISTENT mode on NHWC data, keeping a reserve (a mask, in
 * effect) from the forward for the backward; its backward takes the
 * forward's y and bias. The output is read once less and written once
 * less in the forward, and the backward's dy is not rewritten. That path
 * is taken for ReLU on NHWC 16-bit training data whose channel count is a
 * multiple of 4 (the shapes the fused kernels are known to be built for),
 * always in SPATIAL_PERSISTENT mode (with its reserve, so bn_spatial_only
 * does not apply), when the reserve cuDNN asks for fits in the caller's.
 * Anything else, and any refusal of the fused calls (NOT_SUPPORTED or
 * BAD_PARAM), takes the unfused path: batch norm, then the own activation
 * kernel in place (dy too in the backward). A refusal turns fusion off on
 * the device for good (bn_act_refused), so a backward can never expect a
 * reserve its forward did not write: the forward of the same tensor ran
 * before it, under the same tests (a reserve too small for cuDNN's ask is
 * the same test in both passes), and the unfused backward needs only y,
 * which both forwards write alike. */

/* The fused pair decides in both passes from what both see; parameters
 * and statistics of another dtype (which would send only the forward to
 * the own kernels) are refused outright, as the contract allows. */
static ct_status params_f32(const char *op, const ct_tensor *const *p, int n) {
  for (int i = 0; i < n; i++)
    if (p[i] && p[i]->dtype != CT_F32)
      return ct_error(CT_ERR_UNSUPPORTED, "cuda %s: parameters and statistics must be f32, got %s", op,
                      ct_dtype_name(p[i]->dtype));
  return CT_OK;
}

static int act_fusable(ct_device *d, ct_act act, int nhwc, const ct_tensor *x, int64_t C) {
  return act == CT_ACT_RELU && nhwc && x->dtype != CT_F32 && C % 4 == 0 && !cuda_dev_of(d)->bn_act_refused;
}

/* The device's ReLU descriptor (one per device: it never changes). */
static ct_status relu_desc(ct_device *d, cudnnActivationDescriptor_t *ad) {
  cuda_dev *cd = cuda_dev_of(d);
  if (!cd->bn_relu) {
    cudnnActivationDescriptor_t a = NULL;
    CUDNN_TRY(cudnnCreateActivationDescriptor(&a));
    /* ReLU passes NaN through, as the own kernel and PyTorch's do */
    cudnnStatus_t e = cudnnSetActivationDescriptor(a, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0);
    if (e != CUDNN_STATUS_SUCCESS) {
      cudnnDestroyActivationDescriptor(a);
      return cuda_dnn_fail(e, __FILE__, __LINE__, "cudnnSetActivationDescriptor");
    }
    cd->bn_relu = a;
  }
  *ad = cd->bn_relu;
  return CT_OK;
}

/* After a fused attempt: 1 when it ran; a refusal by cuDNN turns fusion
 * off on the device (a reserve too short only skips this call). */
static int fused_ran(ct_device *d, int fallback) {
  if (fallback == BN_OWN_KERNELS) cuda_dev_of(d)->bn_act_refused = 1;
  return !fallback;
}

size_t cuda_batchnorm_act_reserve(ct_device *d, ct_act act, const ct_tensor *x) {
  if (!x || x->ndim != 4 || x->layout != CT_LAYOUT_NHWC || x->dtype == CT_F32) return 0;
  const int64_t N = x->shape[0], C = x->shape[1], S = x->shape[2] * x->shape[3];
  const ct_tensor *acts[] = {x};
  if (!act_fusable(d, act, 1, x, C) || N * S < 2 || !bn_dnn_eligible(x, acts, 1, NULL, 0, 1e-5, N, C, S)) return 0;
  cudnnHandle_t h;
  if (cuda_enter(d) != CT_OK || cuda_dnn_handle(d, &h) != CT_OK) return 0;
  bn_desc b;
  int ok = 0;
  if (bn_desc_make(&b, x, 1, N, C, S, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, &ok) != CT_OK || !ok) {
    bn_desc_destroy(&b);
    return 0;
  }
  cudnnActivationDescriptor_t ad;
  size_t rsb = 0;
  if (relu_desc(d, &ad) != CT_OK ||
      cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
                                                           CUDNN_BATCHNORM_OPS_BN_ACTIVATION, ad, b.xd,
                                                           &rsb) != CUDNN_STATUS_SUCCESS)
    rsb = 0;
  bn_desc_destroy(&b);
  return rsb;
}

ct_status cuda_batchnorm_act_fwd(ct_device *d, ct_act act, const ct_tensor *x, const ct_tensor *gamma,
                                 const ct_tensor *beta, ct_tensor *running_mean, ct_tensor *running_var,
                                 float momentum, float eps, ct_tensor *y, ct_tensor *save_mean, ct_tensor *save_invstd,
                                 void *reserve, size_t reserve_bytes) {
  int64_t N = 0, C = 0, S = 0;
  int nhwc = 0;
  CT_TRY(cuda_enter(d));
  CT_TRY(fwd_args("batchnorm_act_fwd", 1, x, gamma, beta, running_mean, running_var, y, save_mean, save_invstd, &N,
                  &C, &S, &nhwc));
  const ct_tensor *f32s[] = {gamma, beta, running_mean, running_var, save_mean, save_invstd};
  CT_TRY(params_f32("batchnorm_act_fwd", f32s, 6));
  if (C == 0 || N == 0 || S == 0) return CT_OK;
  const ct_tensor *acts[] = {x, y}, *params[] = {gamma, beta, running_mean, running_var, save_mean, save_invstd};
  if (act_fusable(d, act, nhwc, x, C) && bn_dnn_eligible(x, acts, 2, params, 6, (double)eps, N, C, S)) {
    bn_fuse f = {NULL, reserve, reserve ? reserve_bytes : 0, NULL, (double)eps};
    int fallback = 0;
    CT_TRY(relu_desc(d, &f.ad));
    CT_TRY(dnn_fwd(d, 1, nhwc, N, C, S, x, gamma, beta, running_mean, running_var, momentum, eps, y, save_mean,
                   save_invstd, &f, &fallback));
    if (fused_ran(d, fallback)) return CT_OK;
  }
  CT_TRY(bn_fwd(d, 1, nhwc, N, C, S, x, gamma, beta, running_mean, running_var, momentum, eps, y, save_mean,
                save_invstd));
  return act == CT_ACT_NONE ? CT_OK : cuda_act_fwd(d, act, 0.f, y, y);
}

ct_status cuda_batchnorm_act_bwd(ct_device *d, ct_act act, const ct_tensor *x, const ct_tensor *y, ct_tensor *dy,
                                 const ct_tensor *gamma, const ct_tensor *beta, float eps, const ct_tensor *save_mean,
                                 const ct_tensor *save_invstd, const void *reserve, size_t reserve_bytes,
                                 ct_tensor *dx, ct_tensor *dgamma, ct_tensor *dbeta, float beta_acc) {
  int64_t N = 0, C = 0, S = 0;
  int nhwc = 0;
  CT_TRY(bwd_args("batchnorm_act_bwd", x, y, dy, gamma, beta, save_mean, save_invstd, dx, dgamma, dbeta, &N, &C, &S,
                  &nhwc));
  if (act != CT_ACT_NONE && !y)
    return ct_error(CT_ERR_INVALID_ARG, "cuda batchnorm_act_bwd: y (the forward's output) is required");
  const ct_tensor *f32s[] = {gamma, beta, save_mean, save_invstd, dgamma, dbeta};
  CT_TRY(params_f32("batchnorm_act_bwd", f32s, 6));
  CT_TRY(cuda_enter(d));
  if (C == 0 || N == 0 || S == 0 || (!dx && !dgamma && !dbeta)) return CT_OK;
  const ct_tensor *acts[] = {x, dy, dx, y}, *params[] = {gamma, beta, save_mean, save_invstd, dgamma, dbeta};
  if (act_fusable(d, act, nhwc, x, C) && bn_dnn_eligible(x, acts, 4, params, 6, (double)eps, N, C, S)) {
    bn_fuse f = {NULL, (void *)reserve, reserve ? reserve_bytes : 0, y->data, (double)eps};
    int fallback = 0;
    CT_TRY(relu_desc(d, &f.ad));
    CT_TRY(dnn_bwd(d, nhwc, N, C, S, x, dy, gamma, beta, save_mean, save_invstd, dx, dgamma, dbeta, beta_acc, &f,
                   &fallback));
    if (fused_ran(d, fallback)) return CT_OK;
  }
  if (act != CT_ACT_NONE) CT_TRY(cuda_act_bwd(d, act, 0.f, NULL, y, dy, dy));
  return bn_bwd(d, nhwc, N, C, S, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, beta_acc);
}
