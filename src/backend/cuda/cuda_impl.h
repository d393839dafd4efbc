/* Internal to the CUDA backend: the per-device state, the check macros
 * that turn CUDA / cuBLASLt / cuDNN failures into ct_status values with
 * file:line and the library's own error string, and the ops (one .c or .cu
 * file per family). Included from C (gcc) and from .cu files (nvcc, C++),
 * hence the extern "C" block: every op is a plain C symbol that the table in
 * cuda_backend.c points at.
 *
 * Memory: every tensor an op receives lives in device memory of the same
 * device (allocated with ct_device_alloc), including int64/int32 targets,
 * max-pool workspaces and adaptive-pool indices. Ops enqueue work on the
 * device's stream and return without waiting, except those whose contract
 * hands a result to the host (sumsq, nonfinite), which synchronise. */
#ifndef CTRAIN_CUDA_IMPL_H
#define CTRAIN_CUDA_IMPL_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"
#include "backend/cuda/cuda_lt.h"

/* The device object (backend/device_impl.h) uses C11 atomics, which C++17
 * does not have, so only the C files see it; kernels reach the device's
 * stream through cuda_stream(). */
#ifndef __cplusplus
#include "backend/device_impl.h"

/* One open "cuda:N" device. */
typedef struct cuda_dev {
  int ordinal;            /* CUDA device index (after CUDA_VISIBLE_DEVICES) */
  cudaStream_t stream;    /* every op of this device runs on it, in order */
  cublasLtHandle_t lt;
  cudnnHandle_t dnn;      /* created on the first convolution */
  int tf32;               /* 1: f32 matmul/conv may use TF32 tensor cores (CTRAIN_CUDA_TF32, ct_device_set_tf32) */
  /* Scratch: cuDNN/cuBLASLt workspaces and dtype-conversion temporaries.
   * Grows on demand (after a stream sync), never shrinks until close. */
  void *scratch;
  size_t scratch_bytes;
  /* The workspace of the layer pass running now (set_workspace: a buffer
   * of the model's memory plan, sized by conv2d_workspace_bytes); a
   * convolution that needs no more than this runs in it instead of the
   * scratch buffer. NULL/0 outside a planned pass. */
  void *pass_ws;
  size_t pass_ws_bytes;
  /* Sizes of live allocations (open addressing, key = pointer), because
   * ct_device_free() accounts the freed bytes and cudaFree does not say. */
  pthread_mutex_t mu;
  void **keys;
  size_t *sizes;
  size_t cap, count;
  /* Host->device batch copies (copy_h2d_async): their own stream so they
   * overlap compute, and an event the compute stream waits on. */
  cudaStream_t copy_stream;
  cudaEvent_t copy_done;
  /* --cudnn-benchmark: cudnnFind* once per shape instead of the heuristic. */
  int cudnn_benchmark;
  /* --deterministic (ct_device_set_deterministic): convolutions take only
   * the algorithms and engines cuDNN marks deterministic (cuda_conv.c). */
  int deterministic;
  /* CTRAIN_CUDA_CONV_API=graph (the default): convolutions also try
   * cuDNN's graph API (cuda_conv_graph.h); legacy uses the legacy API alone.
   * conv_graph_err: the first failure to build graph plans (those passes
   * run on the legacy API), for describe; empty when none. */
  int conv_graph;
  char conv_graph_err[256];
  /* CTRAIN_CUDA_S2D: space-to-depth for strided convolutions over few
   * channels (cuda_conv.c): 0 off, 1 (the default) auto, 2 wherever it
   * fits (CTRAIN_CUDA_S2D=1). */
  int s2d;
  /* Per-shape convolution plans (descriptors, algorithm, workspace size),
   * cuda_conv.c; freed at close. */
  struct cuda_conv_cache *conv_cache;
  /* Per-shape cuBLASLt plans (cuda_blas.c) and the events of the lagged
   * statistics read-back (cuda_graph.c); freed at close. */
  struct cuda_blas_cache *blas_cache;
  struct cuda_step_events *step_events;
  /* Device address the dropout kernels read the mask step from (NULL: the
   * key's step); set by dropout_step_from around a device training step. */
  const uint32_t *dropout_step;
  /* 1 once cuDNN refused a SPATIAL_PERSISTENT batch norm without the
   * reserve space it asked for: later ones run SPATIAL (cuda_bnorm.c). */
  int bn_spatial_only;
  /* 1 once cuDNN refused a batch norm with a fused activation, or from
   * the start under CTRAIN_CUDA_BN_FUSE=0: later ones run unfused
   * (cuda_bnorm.c). Never goes back to 0 (a backward must not expect a
   * reserve its forward did not write). */
  int bn_act_refused;
  /* The ReLU activation descriptor of the fused batch norm, created on
   * first use (cuda_bnorm.c), destroyed at close. */
  cudnnActivationDescriptor_t bn_relu;
  /* The NCCL communicator with its stream and events (cuda_coll.c); NULL
   * until coll_open. */
  struct cuda_coll *coll;
} cuda_dev;

enum { CUDA_S2D_OFF = 0, CUDA_S2D_AUTO = 1, CUDA_S2D_ALWAYS = 2 };

static inline cuda_dev *cuda_dev_of(ct_device *d) { return (cuda_dev *)d->impl; }
#endif

/* Leaves d's NCCL communicator, if it joined one (cuda_close). */
void cuda_coll_close(ct_device *d);

/* The stream every op of d is queued on. */
cudaStream_t cuda_stream(ct_device *d);

/* Error recording: "<file>:<line>: <call>: <library's message>". Each
 * returns CT_ERR_BACKEND (CT_ERR_OUT_OF_MEMORY for allocation failures). */
ct_status cuda_rt_fail(cudaError_t e, const char *file, int line, const char *call);
ct_status cuda_lt_fail(cublasStatus_t e, const char *file, int line, const char *call);
ct_status cuda_dnn_fail(cudnnStatus_t e, const char *file, int line, const char *call);
/* 1 for a status of cuDNN 9's NOT_SUPPORTED category: the plain code or a
 * sub-code such as NOT_SUPPORTED_LAYOUT (the library's way of saying "no
 * kernel for this", which callers answer with a fallback, not an error). */
static inline int cuda_dnn_unsupported(cudnnStatus_t e) {
  return CUDNN_STATUS_CATEGORY(e) == CUDNN_STATUS_NOT_SUPPORTED;
}

#define CUDA_TRY(call)                                                              \
  do {                                                                              \
    cudaError_t cuda_e_ = (call);                                                   \
    if (cuda_e_ != cudaSuccess) return cuda_rt_fail(cuda_e_, __FILE__, __LINE__, #call); \
  } while (0)
#define CUBLAS_TRY(call)                                                               \
  do {                                                                                 \
    cublasStatus_t cublas_e_ = (call);                                                 \
    if (cublas_e_ != CUBLAS_STATUS_SUCCESS) return cuda_lt_fail(cublas_e_, __FILE__, __LINE__, #call); \
  } while (0)
#define CUDNN_TRY(call)                                                              \
  do {                                                                               \
    cudnnStatus_t cudnn_e_ = (call);                                                 \
    if (cudnn_e_ != CUDNN_STATUS_SUCCESS) return cuda_dnn_fail(cudnn_e_, __FILE__, __LINE__, #call); \
  } while (0)
/* After a kernel launch: launch-configuration errors surface here;
 * faults inside the kernel surface at the next synchronising call. */
#define CUDA_LAUNCHED(what) CT_TRY(cuda_launched((what), __FILE__, __LINE__))
ct_status cuda_launched(const char *what, const char *file, int line);

/* Makes d's GPU current on this thread (ops may be called from any
 * thread; cudaSetDevice is cheap when nothing changes). */
ct_status cuda_enter(ct_device *d);

/* Returns d's scratch buffer, grown to at least bytes. Work already queued
 * may still use the old buffer, so growing synchronises the stream first. */
ct_status cuda_scratch(ct_device *d, size_t bytes, void **out);

/* cuDNN handle of d, created and bound to d's stream on first use. */
ct_status cuda_dnn_handle(ct_device *d, cudnnHandle_t *out);

/* 1 for the float dtypes device kernels take (f32, bf16, f16). */
static inline int cuda_float_dtype(ct_dtype t) { return t == CT_F32 || t == CT_BF16 || t == CT_F16; }
/* Fails with CT_ERR_UNSUPPORTED naming op and the tensor's position when
 * t is not a device float dtype. NULL tensors pass. */
ct_status cuda_check_float(const char *op, const ct_tensor *t, int pos);

/* cuda_<op> for every entry of backend_ops.def, one file per family:
 * lifetime and memory, the step's copies and events, options
 * (cuda_device.c, cuda_graph.c); cuBLASLt (cuda_blas.c); cuDNN
 * convolution (cuda_conv.c); pooling (cuda_pool.cu); batch norm
 * (cuda_bnorm.c, cuda_reduce.cu); softmax, losses and reductions
 * (cuda_reduce.cu); elementwise (cuda_elementwise.cu); the device-resident
 * update (cuda_optim.cu); collectives (cuda_coll.c); the GPU data path
 * (cuda_transform.cu). The table is cuda_backend.c's. */
struct ct_step_stats;
struct ct_fused_optim_args;
struct ct_xf_batch;
#define CT_OP(rule, ret, name, params) ret cuda_##name params;
#include "backend/backend_ops.def"
#undef CT_OP

/* Space-to-depth staging (cuda_s2d.cu): a convolution of x [N, C, H, W]
 * with w [O, C, KH, KW] at stride s and padding pad_h/pad_w run as a
 * stride-1 convolution of S [N, Cp, Hs, Ws] with W' [O, Cp, KHs, KWs],
 * KHs = ceil(KH / s), Hs = OH + KHs - 1, Cp = C*s*s rounded up to 8 (the
 * file's header has the index maps). S and W' are channels-last, in
 * dtypes of their own; x plain or NHWC, w and dw plain. */
typedef struct cuda_s2d {
  int64_t s, pad_h, pad_w;
  int64_t N, C, H, W, O, KH, KW; /* x and w */
  int64_t Cp, Hs, Ws, KHs, KWs;  /* S and W' */
} cuda_s2d;
/* S from x (S 16-byte aligned); W' from w; dw = beta * dw + dW' folded. */
ct_status cuda_s2d_input(ct_device *d, const cuda_s2d *g, const void *x, ct_dtype xt, int x_nhwc, void *S,
                         ct_dtype st);
ct_status cuda_s2d_weight(ct_device *d, const cuda_s2d *g, const void *w, ct_dtype wt, void *Wz, ct_dtype zt);
ct_status cuda_s2d_weight_grad(ct_device *d, const cuda_s2d *g, const void *dWz, ct_dtype zt, void *dw, ct_dtype dt,
                               float beta);

/* Batch norm: the backend's batchnorm_fwd/bwd take x, y (dy, dx) all
 * plain or all NHWC (4-D), cuDNN where it takes the call (cuda_bnorm.c);
 * batchnorm_act_* fuse ReLU by cuDNN where it can (NHWC 16-bit), else
 * batch norm and the own activation kernel. The own kernels behind them
 * (cuda_reduce.cu), for what cuDNN refuses: the same
 * contracts on x viewed as [N, C, S] (S = product of the extents after C),
 * nhwc 1 for channels-last element order ((n*S + s)*C + c), any float
 * dtype per tensor. Arguments are validated by the callers in
 * cuda_bnorm.c (dtypes, layout, sizes, eval with running stats). */
ct_status cuda_bn_fwd_kernels(ct_device *d, int training, int nhwc, int64_t N, int64_t C, int64_t S,
                              const ct_tensor *x, const ct_tensor *gamma, const ct_tensor *beta,
                              ct_tensor *running_mean, ct_tensor *running_var, float momentum, float eps,
                              ct_tensor *y, ct_tensor *save_mean, ct_tensor *save_invstd);
ct_status cuda_bn_apply_kernels(ct_device *d, int nhwc, int64_t N, int64_t C, int64_t S, const ct_tensor *x,
                                const ct_tensor *gamma, const ct_tensor *beta, const ct_tensor *save_mean,
                                const ct_tensor *save_invstd, ct_act act, float alpha, ct_tensor *y);
ct_status cuda_bn_bwd_kernels(ct_device *d, int nhwc, int64_t N, int64_t C, int64_t S, const ct_tensor *x,
                              const ct_tensor *dy, const ct_tensor *gamma, const ct_tensor *save_mean,
                              const ct_tensor *save_invstd, ct_tensor *dx, ct_tensor *dgamma, ct_tensor *dbeta,
                              float beta_acc);

/* Helpers the cuBLASLt/cuDNN ops share (cuda_elementwise.cu):
 * y[i] = act(y[i] + b[(i / inner) % channels]) in place over n elements of
 * y (b may be NULL; fused activations use PyTorch's default leaky slope
 * 0.01), and out[c] = beta*out[c] + sum_{o,s} x[(o*channels + c)*inner + s]
 * over `outer` leading blocks, accumulated in double. */
ct_status cuda_bias_act(ct_device *d, void *y, ct_dtype yt, int64_t n, const void *b, ct_dtype bt, int64_t channels,
                        int64_t inner, ct_act act);
ct_status cuda_channel_sum(ct_device *d, const void *x, ct_dtype xt, int64_t outer, int64_t channels, int64_t inner,
                           void *out, ct_dtype ot, float beta);
/* dst (dt) = src (st) converted elementwise, n elements, float dtypes. */
ct_status cuda_convert(ct_device *d, const void *src, ct_dtype st, void *dst, ct_dtype dt, int64_t n);
/* dst = beta * dst + src over a [N, C, HW] tensor, each side in its own
 * order (plain: [N][C][HW]; nhwc: [N][HW][C]) and float dtype, converted
 * through f32 (exact for beta 0); cuda_relayout.cu. */
ct_status cuda_relayout(ct_device *d, const void *src, ct_dtype st, int src_nhwc, void *dst, ct_dtype dt,
                        int dst_nhwc, int64_t N, int64_t C, int64_t HW, float beta);

/* Frees the convolution plan cache (cuda_conv.c). */
void cuda_conv_cache_free(ct_device *d);
/* The backend's describe op: the scratch size, then one line per cached
 * convolution plan. */
size_t cuda_conv_describe(ct_device *d, char *buf, size_t n);
/* Frees the cuBLASLt plan cache (cuda_blas.c) and the step events
 * (cuda_graph.c). */
void cuda_blas_cache_free(ct_device *d);
void cuda_step_events_free(ct_device *d);
/* The step the dropout kernels read (cuda_dropout_step_from's). */
const uint32_t *cuda_dropout_step(ct_device *d);

/* Describes every visible GPU (see device_impl.h). */
int cuda_list_devices(char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
