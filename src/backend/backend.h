/* The backend function table.
 *
 * Every device carries one ct_backend. Layers, losses, optimizers and the
 * executor call kernels only through it, so CPU (oneDNN), the portable
 * reference, virtual CPU devices and CUDA plug in the same way.
 *
 * Conventions for every op:
 *  - tensors are dense row-major; images are NCHW (or CT_LAYOUT_C16 / C8 /
 *    CT_LAYOUT_NHWC where the backend's act_layouts say it accepts it); shapes are taken from
 *    the descriptors and checked by the caller (layers), not re-validated;
 *  - outputs are overwritten, except weight/bias gradients, which are
 *    computed as  g = beta * g + grad  with beta 0 or 1 so that gradient
 *    accumulation and shared parameters need no extra buffer;
 *  - the reference backend accepts CT_F32 and CT_F64; fast backends accept
 *    CT_F32 and, where noted by the mixed-precision policy, CT_BF16/CT_F16
 *    inputs with f32 accumulation;
 *  - an op a backend does not implement is NULL; ct_backend_fill_defaults()
 *    fills the required ones from the reference so every table is complete
 *    on the host. Which entries are required, and when the others may be
 *    NULL, is backend_ops.h's list (CT_BACKEND_OPS): every field here has
 *    its line there.
 */
#ifndef CTRAIN_BACKEND_H
#define CTRAIN_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "ctrain/status.h"
#include "ctrain/tensor.h"

typedef struct ct_conv2d_params {
  int stride_h, stride_w;
  int pad_h, pad_w;
  int dil_h, dil_w;
  int groups;
} ct_conv2d_params;

typedef struct ct_pool2d_params {
  int kernel_h, kernel_w;
  int stride_h, stride_w;
  int pad_h, pad_w;
  int ceil_mode;          /* PyTorch ceil_mode */
  int count_include_pad;  /* AvgPool2d only; PyTorch default 1 */
} ct_pool2d_params;

typedef enum ct_act {
  CT_ACT_NONE = 0,
  CT_ACT_RELU,
  CT_ACT_LEAKY_RELU, /* alpha = negative_slope (PyTorch default 0.01) */
  CT_ACT_GELU,       /* exact, erf form (PyTorch approximate='none') */
  CT_ACT_SILU,
  CT_ACT_SIGMOID,
  CT_ACT_TANH,
  CT_ACT_COUNT
} ct_act;

/* Which of x (input) and y (output) an activation's backward reads. */
#define CT_ACT_BWD_NEEDS_X(a) ((a) == CT_ACT_LEAKY_RELU || (a) == CT_ACT_GELU || (a) == CT_ACT_SILU)
#define CT_ACT_BWD_NEEDS_Y(a) ((a) == CT_ACT_RELU || (a) == CT_ACT_SIGMOID || (a) == CT_ACT_TANH)

/* Dropout key: masks are a pure function of these (see rng.h). */
typedef struct ct_dropout_key {
  uint64_t seed;
  uint32_t layer;
  uint32_t step;
  /* The tensor's samples are numbers sample_offset + i x sample_stride of
   * the step's whole batch (ct_step_pos), each masks_per_sample masks
   * long: mask m is drawn as number ct_dropout_mask_index(m), so a batch
   * split over ranks draws what the whole batch would. 0, 0: as is. */
  uint64_t sample_offset, sample_stride;
  int64_t masks_per_sample;
} ct_dropout_key;

#ifdef __CUDACC__
#define CT_HOST_DEVICE __host__ __device__
#else
#define CT_HOST_DEVICE
#endif
/* Whether the key draws mask m as number m (a whole batch). */
CT_HOST_DEVICE static inline int ct_dropout_key_whole(const ct_dropout_key *k) {
  return k->sample_offset == 0 && k->sample_stride <= 1;
}
CT_HOST_DEVICE static inline uint64_t ct_dropout_mask_index(const ct_dropout_key *k, uint64_t m) {
  if (ct_dropout_key_whole(k) || k->masks_per_sample <= 0) return m;
  uint64_t ms = (uint64_t)k->masks_per_sample, s = m / ms;
  return (k->sample_offset + s * k->sample_stride) * ms + m % ms;
}

typedef struct ct_backend ct_backend;

/* Bytes of a collective communicator's id (NCCL's ncclUniqueId). */
#define CT_COLL_ID_BYTES 128
struct ct_step_stats;
struct ct_fused_optim_args;
struct ct_xf_batch;

struct ct_backend {
  const char *name;
  /* Activation layouts (src/plan/layout.h). act_layout is the one the
   * executor keeps activations between convolutions, pools, batch norms,
   * elementwise activations and residual adds in by default (memory
   * format `auto`): CT_LAYOUT_C16 on an AVX-512 cpu, C8 on other x86 cpus, CT_LAYOUT_NHWC on
   * cuda, CT_LAYOUT_PLAIN for none. act_layouts is the set (bit
   * 1u << ct_layout) of non-plain layouts those ops accept here, for
   * activations whose dtype is in act_layout_dtypes (bit 1u << ct_dtype);
   * other ops always get plain tensors. */
  ct_layout act_layout;
  unsigned act_layouts;
  unsigned act_layout_dtypes;
  /* Layouts (bit 1u << ct_layout) in which max pooling also reads its
   * input (and writes its input gradient) while its output and output
   * gradient are plain: such a pool ends a chain of laid-out activations
   * in front of a reader of NCHW (flatten, dropout) instead of the whole
   * chain staying plain. 0 for none. */
  unsigned maxpool_to_plain;

  /* ---- device lifetime and memory (NULL = host memory, no state) ---- */
  /* Sets up backend-private state in the device (engine, stream, handles). */
  ct_status (*open)(ct_device *d);
  void (*close)(ct_device *d);
  void *(*alloc)(ct_device *d, size_t bytes);
  void (*free)(ct_device *d, void *p);
  /* dst_on_dev/src_on_dev say which side is device memory. */
  ct_status (*copy)(ct_device *d, void *dst, int dst_on_dev, const void *src, int src_on_dev, size_t bytes);
  ct_status (*sync)(ct_device *d);

  /* ---- device-resident training (src/math/fused_step.h); NULL on the
   * host backends, whose trainer path calls src/optim and src/amp. Every
   * pointer is device memory; none of these waits for the device. They sit
   * with the lifetime entries (before matmul) because, like those, NULL
   * means "the host does it": ct_backend_fill_defaults() and the
   * reference table's completeness test start at matmul. ---- */
  /* stats->sumsq = sum (g * inv_scale)^2 in double and stats->nonfinite =
   * any inf/NaN in g, with inv_scale from stats->scaler. */
  ct_status (*grad_stats)(ct_device *d, const ct_tensor *grads, struct ct_step_stats *stats);
  /* One fused unscale + clip + SGD/Adam/AdamW pass over a->n parameters
   * (s0..s2 as ct_optim_fused_update_host); skipped on the device when
   * the scaler found inf/NaN. */
  ct_status (*fused_optim_step)(ct_device *d, const struct ct_fused_optim_args *a, float *params,
                                const float *grads, float *s0, float *s1, float *s2,
                                const struct ct_step_stats *stats);
  /* GradScaler.update() on stats->scaler from stats->nonfinite. */
  ct_status (*scaler_update)(ct_device *d, struct ct_step_stats *stats);
  /* stats->top1/top5 = correct predictions of scores [N, K] for int64
   * labels [N] (ct_batch_correct's tie rule). */
  ct_status (*count_correct)(ct_device *d, const ct_tensor *scores, const ct_tensor *labels,
                             struct ct_step_stats *stats);
  /* Pinned (page-locked) host memory for staging buffers; NULL = none. */
  void *(*host_alloc)(ct_device *d, size_t bytes);
  void (*host_free)(ct_device *d, void *p);
  /* Queues a host->device copy on the device's copy stream and makes work
   * queued after it on the compute stream wait for it (an event), so the
   * copy overlaps compute already queued. src must stay untouched until
   * the next ct_device_sync(); pinned src makes it truly asynchronous. */
  ct_status (*copy_h2d_async)(ct_device *d, void *dst, const void *src, size_t bytes);
  /* Backend options by name ("cudnn_benchmark"); CT_ERR_NOT_FOUND for a
   * name the backend does not know. */
  ct_status (*set_option)(ct_device *d, const char *name, int value);
  /* Free and total bytes of the device's memory. */
  ct_status (*mem_info)(ct_device *d, size_t *free_bytes, size_t *total_bytes);
  /* Lines on the backend's choices so far (cuda: the scratch buffer's
   * size and each convolution plan's algorithm, cudnnFind* times,
   * workspace, calls that took scratch, and any candidate it gave up on)
   * into buf, NUL-terminated
   * and cut to n bytes; returns the length of the whole text, as snprintf.
   * NULL where there is nothing to tell. For benchmarks' profiles: the
   * library itself never prints it. */
  size_t (*describe)(ct_device *d, char *buf, size_t n);

  /* ---- a step without host synchronisation, and CUDA graphs
   * (src/train/device_step.c); NULL on the host backends. ---- */
  /* Queues a copy on the compute stream in order with the ops and returns
   * at once (a device->host copy lands in pinned memory later: wait for an
   * event recorded after it). Host memory on either side must stay valid
   * until the stream has passed the copy. */
  ct_status (*copy_async)(ct_device *d, void *dst, int dst_on_dev, const void *src, int src_on_dev, size_t bytes);
  /* Records event `slot` (0..7) on the compute stream; event_wait blocks
   * the host until the stream has passed the last record of that slot. */
  ct_status (*event_record)(ct_device *d, int slot);
  ct_status (*event_wait)(ct_device *d, int slot);
  /* The loss backwards with the gradient scale read from device memory
   * (stats->scaler: its scale when enabled, else 1), so the device's loss
   * scaler reaches the backward without a read-back. */
  ct_status (*cross_entropy_bwd_dev)(ct_device *d, const ct_tensor *logits, const ct_tensor *targets,
                                     float label_smoothing, const struct ct_step_stats *stats, ct_tensor *dlogits);
  ct_status (*nll_bwd_dev)(ct_device *d, const ct_tensor *targets, const struct ct_step_stats *stats,
                           ct_tensor *dlogp);
  /* fused_optim_step with its scalars read from stats->args (the row
   * matching stats->opt_steps); kind and n fix the launch. */
  ct_status (*fused_optim_step_dev)(ct_device *d, int kind, int64_t n, float *params, const float *grads, float *s0,
                                    float *s1, float *s2, const struct ct_step_stats *stats);
  /* From now on dropout_fwd/dropout_bwd take the mask key's step from
   * device memory *step (a uint32_t the host writes, in stream order,
   * before each step) instead of key.step; NULL switches back. The seed,
   * layer and element index still come from the key, so the masks are the
   * same as with key.step = *step; a CUDA graph captured meanwhile replays
   * with the step current at each launch. */
  ct_status (*dropout_step_from)(ct_device *d, const uint32_t *step);
  /* Stream capture of everything queued on the compute stream between
   * graph_begin and graph_end into an executable graph (*graph; NULL and
   * an error when capture or instantiation failed, the stream then back
   * to normal); graph_launch replays it on the compute stream. A graph is
   * bound to the addresses it captured: graph_launch fails with
   * CT_ERR_INVALID_ARG if the device's scratch buffer (cuDNN/cuBLASLt
   * workspaces, reduction partials) moved since, and the caller captures
   * again. */
  ct_status (*graph_begin)(ct_device *d);
  ct_status (*graph_end)(ct_device *d, void **graph);
  ct_status (*graph_launch)(ct_device *d, void *graph);
  void (*graph_free)(ct_device *d, void *graph);
  /* Fused full-batch linear regression (src/train/linreg.c's math):
   * `steps` steps on x [n, features], y [n], params [features + 1], all
   * device memory, with step k's optimizer scalars args[k] (device array,
   * rounded on the host), optimizer state [3 * (features + 1)] zeroed by
   * the caller, and loss_history[k] (device doubles) the loss before step
   * k's update. Queued without waiting. */
  ct_status (*linreg_fit)(ct_device *d, const float *x, const float *y, int64_t n, int features,
                          const struct ct_fused_optim_args *args, int64_t steps, float *params, float *state,
                          double *loss_history);

  /* ---- GPU data path (src/math/transform_params.h, src/data/gpu_data.c);
   * NULL on the host backends, whose loader transforms on the CPU (the
   * same arithmetic on the host: ct_xf_batch_host). ---- */
  /* Queues b->dst[i] = the per-sample transform (resize, crop, flip,
   * ToFloat, Normalize) of uint8 image b->src[row i], with the crop and
   * flip drawn from (b->seed, b->epoch, sample id) exactly as
   * ct_transform_apply draws them, and b->labels_out[i] = b->labels[row i]
   * when both are given. Every pointer in b is device memory. */
  ct_status (*transform_u8)(ct_device *d, const struct ct_xf_batch *b);

  /* ---- accumulating variants, NULL where the backend has no native way
   * (oneDNN's backward passes take no sum post-op): the executor then
   * writes a temporary and adds it in (src/plan/exec_plan.c). ---- */
  /* dx += the conv2d_bwd_data result, in one pass over dx (cuDNN's
   * beta = 1): the second gradient arriving at a residual block's input. */
  ct_status (*conv2d_bwd_data_acc)(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy, const ct_tensor *w,
                                   ct_tensor *dx);

  /* ---- planned device workspace, NULL where passes need none ---- */
  /* Device memory one convolution pass needs while it runs (cuDNN's
   * workspace and its operands staged in another dtype or layout), for the
   * algorithm it will run on these operands: pass 0 forward (a = x, b = w,
   * out = y), 1 backward-data (a = dy, b = w, out = dx), 2 backward-weights
   * (a = x, b = dy, out = dw). Shapes, dtypes and layouts are read, data
   * never. Chooses (and caches) the algorithm now, timing the candidates
   * under cudnn_benchmark as the first call would. 0 when it needs none or
   * the question has no answer (the pass then takes its memory as before).
   * NULL on backends whose passes need no device workspace. The planner
   * gives each convolution layer this much for its forward and its backward
   * (src/plan/exec_plan.c) and hands it over with set_workspace. */
  size_t (*conv2d_workspace_bytes)(ct_device *d, int pass, const ct_conv2d_params *p, const ct_tensor *a,
                                   const ct_tensor *b, const ct_tensor *out);
  /* Device memory ops may use as workspace until the next call (p NULL,
   * bytes 0: none); an op needing more takes its own as before. */
  void (*set_workspace)(ct_device *d, void *p, size_t bytes);

  /* ---- training batch norm with its activation fused, NULL where the
   * backend has none: the batch-norm layer then applies act_fwd / act_bwd
   * in place around batchnorm_fwd / batchnorm_bwd (src/nn/layers/
   * batchnorm.c). All three or none. act is one whose gradient needs only
   * y (not CT_ACT_BWD_NEEDS_X), with the layer's alpha 0; parameters and
   * statistics are f32. ---- */
  /* Bytes of reserve batchnorm_act_fwd may keep for batchnorm_act_bwd
   * when x (dtype, layout, shape at the largest batch) is normalised and
   * act applied; 0 when it keeps none. Never fails (0 on any doubt: the
   * ops then take the unfused path). */
  size_t (*batchnorm_act_reserve)(ct_device *d, ct_act act, const ct_tensor *x);
  /* y = act(batchnorm_fwd(training = 1, ...)), act with the fused
   * activations' parameters; arguments otherwise as batchnorm_fwd.
   * reserve: device memory of reserve_bytes (at least what
   * batchnorm_act_reserve answered for this x's dtype, layout and a batch
   * at least as large; NULL with 0 when it answered 0) that the backward of
   * this forward reads back: nothing may write it in between. */
  ct_status (*batchnorm_act_fwd)(ct_device *d, ct_act act, const ct_tensor *x, const ct_tensor *gamma,
                                 const ct_tensor *beta, ct_tensor *running_mean, ct_tensor *running_var,
                                 float momentum, float eps, ct_tensor *y, ct_tensor *save_mean,
                                 ct_tensor *save_invstd, void *reserve, size_t reserve_bytes);
  /* The backward of batchnorm_act_fwd: batchnorm_bwd of act's gradient
   * (from y, the forward's output) times dy. beta, eps and reserve are the
   * forward's (so both passes reach the same decisions). dy may be
   * overwritten. */
  ct_status (*batchnorm_act_bwd)(ct_device *d, ct_act act, const ct_tensor *x, const ct_tensor *y, ct_tensor *dy,
                                 const ct_tensor *gamma, const ct_tensor *beta, float eps, const ct_tensor *save_mean,
                                 const ct_tensor *save_invstd, const void *reserve, size_t reserve_bytes,
                                 ct_tensor *dx, ct_tensor *dgamma, ct_tensor *dbeta, float beta_acc);

  /* ---- collectives between processes, one device each (NCCL,
   * src/backend/cuda/cuda_coll.c; src/parallel/ddp.c). NULL on the host
   * backends, whose replicas communicate over MPI. All or none. ---- */
  /* Writes a new communicator id (CT_COLL_ID_BYTES bytes) on one rank;
   * the caller hands it to every rank (over MPI). */
  ct_status (*coll_new_id)(ct_device *d, void *id);
  /* Joins communicator id as rank of size, with a collective stream of
   * its own; blocks until every rank has joined. One per device. */
  ct_status (*coll_open)(ct_device *d, const void *id, int rank, int size);
  /* Queued on the collective stream after everything queued on the
   * compute stream so far (an event), without waiting: the sum of count
   * f32 values at buf over the ranks, in place; bytes bytes from root's
   * buf to every rank's. buf is device memory. */
  ct_status (*coll_allreduce)(ct_device *d, float *buf, size_t count);
  ct_status (*coll_bcast)(ct_device *d, void *buf, size_t bytes, int root);
  /* Compute work queued after the fence waits for every collective queued
   * before it (an event; the host does not wait). */
  ct_status (*coll_fence)(ct_device *d);
  /* Blocks the host until the collectives before the fence `back` fences
   * ago (0: the last; at most 1) have completed, for at most timeout
   * seconds. A timeout, or an error NCCL reports, aborts the communicator
   * and returns CT_ERR_BACKEND naming `what` (every later collective
   * fails). */
  ct_status (*coll_wait)(ct_device *d, int back, double timeout, const char *what);
  /* Leaves the communicator (after the queued collectives). */
  void (*coll_close)(ct_device *d);

  /* ---- dense linear algebra ---- */
  /* c[M,N] = alpha * op(a) @ op(b) + beta * c; op transposes when trans_*.
   * a is [M,K] (or [K,M] transposed), b is [K,N] (or [N,K]). */
  ct_status (*matmul)(ct_device *d, int trans_a, int trans_b, const ct_tensor *a, const ct_tensor *b,
                      float alpha, float beta, ct_tensor *c);
  /* y[N,M] = act(x[N,K] @ w[M,K]^T + b[M]); b may be NULL. */
  ct_status (*linear_fwd)(ct_device *d, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, ct_act act,
                          ct_tensor *y);
  /* dx[N,K] = dy[N,M] @ w[M,K] */
  ct_status (*linear_bwd_data)(ct_device *d, const ct_tensor *dy, const ct_tensor *w, ct_tensor *dx);
  /* dw[M,K] = beta*dw + dy^T @ x ; db[M] = beta*db + sum_n dy (db may be NULL) */
  ct_status (*linear_bwd_weights)(ct_device *d, const ct_tensor *x, const ct_tensor *dy, ct_tensor *dw, ct_tensor *db,
                                  float beta);

  /* ---- convolution: x[N,C,H,W], w[O,C/groups,KH,KW], b[O], y[N,O,OH,OW] ---- */
  ct_status (*conv2d_fwd)(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w,
                          const ct_tensor *b, ct_act act, ct_tensor *y);
  ct_status (*conv2d_bwd_data)(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy, const ct_tensor *w,
                               ct_tensor *dx);
  ct_status (*conv2d_bwd_weights)(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *dy,
                                  ct_tensor *dw, ct_tensor *db, float beta);

  /* ---- pooling ---- */
  /* Bytes of workspace max pooling's forward leaves for its backward
   * (backend-specific content; the reference stores int32 argmax indices,
   * one per output element). */
  size_t (*maxpool2d_workspace_bytes)(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, const ct_tensor *y);
  /* ws may be NULL when no backward will follow (inference). */
  ct_status (*maxpool2d_fwd)(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y, void *ws);
  ct_status (*maxpool2d_bwd)(ct_device *d, const ct_pool2d_params *p, const ct_tensor *dy, const void *ws,
                             ct_tensor *dx);
  ct_status (*avgpool2d_fwd)(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y);
  ct_status (*avgpool2d_bwd)(ct_device *d, const ct_pool2d_params *p, const ct_tensor *dy, ct_tensor *dx);
  /* Adaptive pooling with PyTorch's bin rule: start = floor(i*H/OH),
   * end = ceil((i+1)*H/OH). Output size from y. idx: int32 per output
   * element (flat h*W+w within the plane), may be NULL without backward. */
  ct_status (*adaptive_avgpool2d_fwd)(ct_device *d, const ct_tensor *x, ct_tensor *y);
  ct_status (*adaptive_avgpool2d_bwd)(ct_device *d, const ct_tensor *dy, ct_tensor *dx);
  ct_status (*adaptive_maxpool2d_fwd)(ct_device *d, const ct_tensor *x, ct_tensor *y, int32_t *idx);
  ct_status (*adaptive_maxpool2d_bwd)(ct_device *d, const ct_tensor *dy, const int32_t *idx, ct_tensor *dx);

  /* ---- batch norm over dim 1 of x [N,C] / [N,C,L] / [N,C,H,W] ----
   * training: normalises with batch statistics (biased variance), saves
   * mean and 1/sqrt(var+eps) per channel, and updates running stats as
   * PyTorch does: running = (1-momentum)*running + momentum*stat, with the
   * unbiased variance (n/(n-1)). Eval: uses running stats; save_* unused.
   * gamma/beta may be NULL (affine=False); in training the running pair
   * may be NULL too: nothing is updated (a recompute forward). */
  ct_status (*batchnorm_fwd)(ct_device *d, int training, const ct_tensor *x, const ct_tensor *gamma,
                             const ct_tensor *beta, ct_tensor *running_mean, ct_tensor *running_var, float momentum,
                             float eps, ct_tensor *y, ct_tensor *save_mean, ct_tensor *save_invstd);
  /* Backward of training-mode batch norm. dgamma/dbeta accumulate with beta_acc. */
  ct_status (*batchnorm_bwd)(ct_device *d, const ct_tensor *x, const ct_tensor *dy, const ct_tensor *gamma,
                             const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_tensor *dx,
                             ct_tensor *dgamma, ct_tensor *dbeta, float beta_acc);
  /* y = act((x - save_mean) * save_invstd * gamma + beta), act with alpha
   * as act_fwd: a training forward's output again from the statistics it
   * saved, without a pass over x for them (the recompute forward of a
   * batch norm, plan/recompute.h). On the cpu backends the bits are those of
   * batchnorm_fwd(training = 1) followed by act_fwd in place, as the
   * training forward normalises with its saved (f32) statistics; on cuda
   * they are those of its own kernels, not necessarily cuDNN's. Layouts
   * and dtypes as batchnorm_fwd; gamma/beta may be NULL. */
  ct_status (*batchnorm_apply)(ct_device *d, const ct_tensor *x, const ct_tensor *gamma, const ct_tensor *beta,
                               const ct_tensor *save_mean, const ct_tensor *save_invstd, ct_act act, float alpha,
                               ct_tensor *y);

  /* ---- elementwise ---- */
  ct_status (*act_fwd)(ct_device *d, ct_act act, float alpha, const ct_tensor *x, ct_tensor *y);
  /* x or y may be NULL if CT_ACT_BWD_NEEDS_* says the act does not read it. */
  ct_status (*act_bwd)(ct_device *d, ct_act act, float alpha, const ct_tensor *x, const ct_tensor *y,
                       const ct_tensor *dy, ct_tensor *dx);
  /* Dropout with keep probability 1-p, scaling kept values by 1/(1-p).
   * group = elements sharing one mask bit: 1 for Dropout, H*W for
   * Dropout2d. Mask element j (j = flat index / group) is dropped iff
   * ct_rng_uniform_at(seed, CT_RNG_DROPOUT, layer, step, j) < p. */
  ct_status (*dropout_fwd)(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *x,
                           ct_tensor *y);
  ct_status (*dropout_bwd)(ct_device *d, float p, int64_t group, ct_dropout_key key, const ct_tensor *dy,
                           ct_tensor *dx);
  /* y = act(a + b) (same shapes), act with the fused activations'
   * parameters (leaky slope 0.01, as conv2d_fwd and linear_fwd): a residual
   * add with its ReLU in one pass. */
  ct_status (*add)(ct_device *d, const ct_tensor *a, const ct_tensor *b, ct_act act, ct_tensor *y);
  /* y = alpha * x + beta * y (beta 0 overwrites). */
  ct_status (*axpby)(ct_device *d, float alpha, const ct_tensor *x, float beta, ct_tensor *y);
  ct_status (*fill)(ct_device *d, ct_tensor *x, float value);
  /* y = x converted to y's dtype (same numel), in the same layout. A
   * backend whose act_layout is CT_LAYOUT_NHWC also converts a 4-D plain
   * x into an NHWC y (the executor's cast of the model input for a
   * channels-last first convolution); other layout pairs are refused. */
  ct_status (*cast)(ct_device *d, const ct_tensor *x, ct_tensor *y);

  /* ---- softmax over the last dim of a 2-D tensor [N,C] ---- */
  ct_status (*softmax_fwd)(ct_device *d, int log, const ct_tensor *x, ct_tensor *y);
  ct_status (*softmax_bwd)(ct_device *d, int log, const ct_tensor *y, const ct_tensor *dy, ct_tensor *dx);

  /* ---- losses; mean reduction; loss is a 1-element f32 tensor on the
   * device; grad_scale multiplies the gradient (dL/dloss, or the loss
   * scale under mixed precision). targets are int64 class indices. ---- */
  ct_status (*cross_entropy_fwd)(ct_device *d, const ct_tensor *logits, const ct_tensor *targets,
                                 float label_smoothing, ct_tensor *loss);
  ct_status (*cross_entropy_bwd)(ct_device *d, const ct_tensor *logits, const ct_tensor *targets,
                                 float label_smoothing, float grad_scale, ct_tensor *dlogits);
  ct_status (*nll_fwd)(ct_device *d, const ct_tensor *logp, const ct_tensor *targets, ct_tensor *loss);
  ct_status (*nll_bwd)(ct_device *d, const ct_tensor *targets, float grad_scale, ct_tensor *dlogp);
  ct_status (*mse_fwd)(ct_device *d, const ct_tensor *pred, const ct_tensor *target, ct_tensor *loss);
  ct_status (*mse_bwd)(ct_device *d, const ct_tensor *pred, const ct_tensor *target, float grad_scale,
                       ct_tensor *dpred);

  /* ---- reductions used by optimizers ---- */
  /* *out = sum(x^2) in double (host pointer). */
  ct_status (*sumsq)(ct_device *d, const ct_tensor *x, double *out);
  /* *out = 1 if any element is inf or NaN, else 0. */
  ct_status (*nonfinite)(ct_device *d, const ct_tensor *x, int *out);
};

/* Completes a table: every NULL op is taken from the reference backend. */
void ct_backend_fill_defaults(ct_backend *b);

const ct_backend *ct_device_backend(const ct_device *d);

#endif
