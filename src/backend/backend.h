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
 *    on the host. The entries, with the rule for when each may be NULL,
 *    are backend_ops.def's lines: the struct's fields are generated from
 *    them.
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
/* Points coll_record and coll_await take. */
#define CT_COLL_POINTS 4
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


  /* The function entries, generated from backend_ops.def (the contract
   * of each is its comment there). */
#define CT_OP(rule, ret, name, params) ret(*name) params;
#include "backend/backend_ops.def"
#undef CT_OP
};

/* Completes a table: every NULL op is taken from the reference backend. */
void ct_backend_fill_defaults(ct_backend *b);
/* The argument checks of batchnorm_sync_stats and _grads (backend_ops.def),
 * shared by the backends; who names the backend in the message. */
ct_status ct_bn_sync_stats_args(const char *who, const ct_tensor *mean, const ct_tensor *invstd,
                                const ct_tensor *running_mean, const ct_tensor *running_var);
ct_status ct_bn_sync_grads_args(const char *who, int stage, const ct_tensor *gamma, const ct_tensor *invstd,
                                const ct_tensor *dgamma, const ct_tensor *dbeta, const ct_tensor *a,
                                const ct_tensor *b);

const ct_backend *ct_device_backend(const ct_device *d);

#endif
