/* Batch norm on cuDNN (the legacy batch-norm API, which cuDNN 9 still
 * ships): cudnnBatchNormalizationForwardTrainingEx, ForwardInference and
 * BackwardEx with bnOps = CUDNN_BATCHNORM_OPS_BN (no fused activation).
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
 * Reserve space: none. It would have to live from forward to backward,
 * which the backend contract has no buffer for. When cuDNN asks for a
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
 * Descriptors are created and destroyed per call (two host-side
 * allocations; no per-shape cache). */
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

/* *fallback values: the own kernels, or the same call again in SPATIAL. */
enum { BN_OWN_KERNELS = 1, BN_RETRY_SPATIAL = 2 };

/* A BAD_PARAM from SPATIAL_PERSISTENT run without the reserve it asked for
 * (rsb > 0): that mode needs the reserve on this cuDNN (see the header). */
static int persistent_refused(ct_device *d, cudnnStatus_t e, cudnnBatchNormMode_t mode, size_t rsb) {
  if (e != CUDNN_STATUS_BAD_PARAM || mode != CUDNN_BATCHNORM_SPATIAL_PERSISTENT || !rsb) return 0;
  cuda_dev_of(d)->bn_spatial_only = 1;
  return 1;
}

/* Inside the cuDNN paths (it reads the caller's d, mode and rsb): a cuDNN
 * call that returns NOT_SUPPORTED sends the op to the own kernels, one that
 * refuses SPATIAL_PERSISTENT for want of a reserve (persistent_refused)
 * asks the caller to repeat it in SPATIAL; any other failure is the op's
 * error. */
#define DNN_OR_FALLBACK(call)                                   \
  do {                                                          \
    cudnnStatus_t e_ = (call);                                  \
    if (cuda_dnn_unsupported(e_)) {                             \
      *fallback = BN_OWN_KERNELS;                               \
      goto done;                                                \
    }                                                           \
    if (persistent_refused(d, e_, mode, rsb)) {                 \
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

/* The handle, mode and descriptors of one cuDNN batch-norm call; *fallback
 * = 1 (nothing left to free) when cuDNN cannot describe it. */
static ct_status dnn_begin(ct_device *d, int training, int nhwc, const ct_tensor *x, int64_t N, int64_t C, int64_t S,
                           cudnnHandle_t *h, cudnnBatchNormMode_t *mode, bn_desc *b, int *fallback) {
  *fallback = 0;
  CT_TRY(cuda_dnn_handle(d, h));
  *mode = bn_mode(d, training, nhwc, x->dtype);
  int ok = 0;
  CT_TRY(bn_desc_make(b, x, nhwc, N, C, S, *mode, &ok));
  if (!ok) {
    bn_desc_destroy(b);
    *fallback = BN_OWN_KERNELS;
  }
  return CT_OK;
}

static ct_status dnn_fwd(ct_device *d, int training, int nhwc, int64_t N, int64_t C, int64_t S, const ct_tensor *x,
                         const ct_tensor *gamma, const ct_tensor *beta, ct_tensor *running_mean,
                         ct_tensor *running_var, float momentum, float eps, ct_tensor *y, ct_tensor *save_mean,
                         ct_tensor *save_invstd, int *fallback) {
  cudnnHandle_t h;
  cudnnBatchNormMode_t mode;
  bn_desc b;
  CT_TRY(dnn_begin(d, training, nhwc, x, N, C, S, &h, &mode, &b, fallback));
  if (*fallback) return CT_OK;
  ct_status s = CT_OK;
  size_t wsb = 0, rsb = 0;
  if (training) {
    DNN_OR_FALLBACK(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, mode, CUDNN_BATCHNORM_OPS_BN, b.xd, NULL,
                                                                             b.xd, b.pd, NULL, &wsb));
    DNN_OR_FALLBACK(
        cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, mode, CUDNN_BATCHNORM_OPS_BN, NULL, b.xd, &rsb));
    if (rsb) wsb = 0; /* no reserve to keep: run as the non-Ex function */
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
        h, mode, CUDNN_BATCHNORM_OPS_BN, &one, &zero, b.xd, x->data, NULL, NULL, b.xd, y->data, b.pd, g, bb,
        (double)momentum, rm, rv, (double)eps, sm, si, NULL, wsb ? scr : NULL, wsb, NULL, 0));
  } else {
    DNN_OR_FALLBACK(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, b.xd, x->data,
                                                            b.xd, y->data, b.pd, g, bb, running_mean->data,
                                                            running_var->data, (double)eps));
  }
done:
  bn_desc_destroy(&b);
  return s;
}

static ct_status dnn_bwd(ct_device *d, int nhwc, int64_t N, int64_t C, int64_t S, const ct_tensor *x,
                         const ct_tensor *dy, const ct_tensor *gamma, const ct_tensor *save_mean,
                         const ct_tensor *save_invstd, ct_tensor *dx, ct_tensor *dgamma, ct_tensor *dbeta,
                         float beta_acc, int *fallback) {
  cudnnHandle_t h;
  cudnnBatchNormMode_t mode;
  bn_desc b;
  CT_TRY(dnn_begin(d, 1, nhwc, x, N, C, S, &h, &mode, &b, fallback));
  if (*fallback) return CT_OK;
  ct_status s = CT_OK;
  size_t wsb = 0, rsb = 0;
  /* the same descriptors and argument pattern as PyTorch's cudnn_batch_norm_backward */
  DNN_OR_FALLBACK(cudnnGetBatchNormalizationBackwardExWorkspaceSize(h, mode, CUDNN_BATCHNORM_OPS_BN, b.xd, b.xd, b.xd,
                                                                    NULL, b.xd, b.pd, NULL, &wsb));
  DNN_OR_FALLBACK(
      cudnnGetBatchNormalizationTrainingExReserveSpaceSize(h, mode, CUDNN_BATCHNORM_OPS_BN, NULL, b.xd, &rsb));
  if (rsb) wsb = 0; /* the forward ran as the non-Ex function too */
  /* scratch: [workspace | ones | dgamma stand-in | dbeta stand-in | dx stand-in] */
  const size_t vec = round256((size_t)C * sizeof(float)), off = round256(wsb);
  const size_t dxb = dx ? 0 : round256((size_t)(N * C * S) * ct_dtype_size(x->dtype));
  void *scr = NULL;
  TRY_DONE(cuda_scratch(d, off + 3 * vec + dxb, &scr));
  char *base = (char *)scr + off;
  void *ones = base, *ddg = base + vec, *ddb = base + 2 * vec, *ddx = base + 3 * vec;
  const void *g = gamma ? gamma->data : ones;
  if (!gamma) TRY_DONE(fill_f32(d, ones, C, 1.f));
  /* Both parameter gradients share betaParamDiff: a stand-in must hold a
   * finite value for beta_acc 1 (its result is thrown away). */
  if (!dgamma || !dbeta) RT(cudaMemsetAsync(ddg, 0, 2 * vec, cuda_stream(d)));
  const float one = 1.f, zero = 0.f, pbeta = beta_acc;
  DNN_OR_FALLBACK(cudnnBatchNormalizationBackwardEx(
      h, mode, CUDNN_BATCHNORM_OPS_BN, &one, &zero, &one, &pbeta, b.xd, x->data, NULL, NULL, b.xd, dy->data, NULL, NULL,
      b.xd, dx ? dx->data : (void *)ddx, b.pd, g, NULL, dgamma ? dgamma->data : ddg, dbeta ? dbeta->data : ddb,
      BN_BWD_EPS, save_mean->data, save_invstd->data, NULL, wsb ? scr : NULL, wsb, NULL, 0));
done:
  bn_desc_destroy(&b);
  return s;
}

ct_status cuda_batchnorm_fwd(ct_device *d, int training, const ct_tensor *x, const ct_tensor *gamma,
                             const ct_tensor *beta, ct_tensor *running_mean, ct_tensor *running_var, float momentum,
                             float eps, ct_tensor *y, ct_tensor *save_mean, ct_tensor *save_invstd) {
  static const char *op = "batchnorm_fwd";
  if (!x || !y) return ct_error(CT_ERR_INVALID_ARG, "cuda batchnorm_fwd: x and y are required");
  const ct_tensor *all[] = {x, gamma, beta, running_mean, running_var, y, save_mean, save_invstd};
  for (int i = 0; i < 8; i++) CT_TRY(cuda_check_float(op, all[i], i + 1));
  int64_t N = 0, C = 0, S = 0;
  CT_TRY(bn_dims(op, x, &N, &C, &S));
  const ct_tensor *acts[] = {x, y};
  static const char *const anames[] = {"x", "y"};
  int nhwc = 0;
  CT_TRY(bn_layout(op, acts, anames, 2, &nhwc));
  if (!training) save_mean = save_invstd = NULL; /* unused in eval, per the contract */
  const ct_tensor *params[] = {gamma, beta, running_mean, running_var, save_mean, save_invstd};
  static const char *const pnames[] = {"gamma", "beta", "running_mean", "running_var", "save_mean", "save_invstd"};
  CT_TRY(bn_sizes(op, N * C * S, C, acts, anames, 2, params, pnames, 6));
  if (!training && (!running_mean || !running_var))
    return ct_error(CT_ERR_INVALID_ARG, "cuda batchnorm_fwd: eval mode needs running_mean and running_var");
  if (training && N * S < 2 && N * C * S > 0)
    return ct_error(CT_ERR_INVALID_ARG,
                    "cuda batchnorm_fwd: expected more than 1 value per channel when training (input has %lld); use "
                    "a larger batch or eval mode",
                    (long long)(N * S));
  CT_TRY(cuda_enter(d));
  if (C == 0 || N == 0 || S == 0) return CT_OK;
  if (bn_dnn_eligible(x, acts, 2, params, 6, (double)eps, N, C, S)) {
    int fallback = 0;
    do {
      CT_TRY(dnn_fwd(d, training, nhwc, N, C, S, x, gamma, beta, running_mean, running_var, momentum, eps, y,
                     save_mean, save_invstd, &fallback));
    } while (fallback == BN_RETRY_SPATIAL);
    if (!fallback) return CT_OK;
  }
  return cuda_bn_fwd_kernels(d, training, nhwc, N, C, S, x, gamma, beta, running_mean, running_var, momentum, eps, y,
                             save_mean, save_invstd);
}

ct_status cuda_batchnorm_bwd(ct_device *d, const ct_tensor *x, const ct_tensor *dy, const ct_tensor *gamma,
                             const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_tensor *dx,
                             ct_tensor *dgamma, ct_tensor *dbeta, float beta_acc) {
  static const char *op = "batchnorm_bwd";
  if (!x || !dy) return ct_error(CT_ERR_INVALID_ARG, "cuda batchnorm_bwd: x and dy are required");
  const ct_tensor *all[] = {x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta};
  for (int i = 0; i < 8; i++) CT_TRY(cuda_check_float(op, all[i], i + 1));
  if (!save_mean || !save_invstd)
    return ct_error(CT_ERR_INVALID_ARG,
                    "cuda batchnorm_bwd: save_mean and save_invstd from the training forward are required");
  int64_t N = 0, C = 0, S = 0;
  CT_TRY(bn_dims(op, x, &N, &C, &S));
  const ct_tensor *acts[] = {x, dy, dx};
  static const char *const anames[] = {"x", "dy", "dx"};
  int nhwc = 0;
  CT_TRY(bn_layout(op, acts, anames, 3, &nhwc));
  const ct_tensor *params[] = {gamma, save_mean, save_invstd, dgamma, dbeta};
  static const char *const pnames[] = {"gamma", "save_mean", "save_invstd", "dgamma", "dbeta"};
  CT_TRY(bn_sizes(op, N * C * S, C, acts, anames, 3, params, pnames, 5));
  CT_TRY(cuda_enter(d));
  if (C == 0 || N == 0 || S == 0) return CT_OK;
  /* nothing to compute: cuDNN would still need every output */
  if (!dx && !dgamma && !dbeta) return CT_OK;
  if (bn_dnn_eligible(x, acts, 3, params, 5, BN_BWD_EPS, N, C, S)) {
    int fallback = 0;
    do {
      CT_TRY(dnn_bwd(d, nhwc, N, C, S, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, beta_acc, &fallback));
    } while (fallback == BN_RETRY_SPATIAL);
    if (!fallback) return CT_OK;
  }
  return cuda_bn_bwd_kernels(d, nhwc, N, C, S, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, beta_acc);
}
