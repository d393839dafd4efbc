/* Optimizers (SGD, Adam, AdamW) and gradient clipping on flat buffers.
 *
 * Parameters, gradients and every optimizer state live in flat contiguous
 * f32 buffers of n elements, so one step is one fused pass over all of them
 * (OpenMP parallel for + simd) instead of a loop over tensors. The formulas,
 * defaults and rounding order follow PyTorch 1.13's single-tensor
 * torch.optim.SGD/Adam/AdamW; because PyTorch applies a group's
 * hyperparameters to every tensor alike, a flat pass is the same update.
 *
 * Hyperparameters are doubles, as Python floats are in PyTorch; per-element
 * arithmetic is f32 with scalars rounded to f32 where PyTorch rounds them.
 */
#ifndef CTRAIN_OPTIM_H
#define CTRAIN_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "ctrain/device.h"
#include "ctrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ct_optim_kind {
  CT_OPTIM_SGD = 0,
  CT_OPTIM_ADAM = 1,
  CT_OPTIM_ADAMW = 2
} ct_optim_kind;

/* Hyperparameters of one optimizer. Fields a kind does not use are ignored.
 * Start from ct_optim_config_default(kind) and change what differs. */
typedef struct ct_optim_config {
  ct_optim_kind kind;
  double lr;           /* SGD: no PyTorch default (0.01 here); Adam/AdamW 1e-3 */
  double weight_decay; /* SGD/Adam: L2 added to the gradient; AdamW: decoupled */
  /* SGD */
  double momentum;  /* 0 */
  double dampening; /* 0 */
  int nesterov;     /* 0; needs momentum > 0 and dampening == 0 */
  /* Adam / AdamW */
  double beta1, beta2; /* 0.9, 0.999 */
  double eps;          /* 1e-8 */
  int amsgrad;         /* 0 */
} ct_optim_config;

typedef struct ct_optimizer ct_optimizer;

/* PyTorch 1.13's defaults for kind: SGD lr 0.01 (PyTorch requires one; 0.01
 * is the common choice), momentum/dampening/weight_decay 0, no nesterov;
 * Adam lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0, no amsgrad;
 * AdamW the same with weight_decay 1e-2. An unknown kind gives SGD's. */
ct_optim_config ct_optim_config_default(ct_optim_kind kind);

/* Creates an optimizer for n_params flat f32 parameters and allocates its
 * zeroed state buffers (SGD: "momentum_buffer" when momentum != 0; Adam/AdamW:
 * "exp_avg", "exp_avg_sq", and "max_exp_avg_sq" with amsgrad). Fails with
 * CT_ERR_INVALID_ARG naming the field for a negative lr/eps/weight_decay/
 * momentum, a beta outside [0, 1), nesterov without momentum > 0 and zero
 * dampening, or n_params == 0; CT_ERR_OUT_OF_MEMORY if a buffer cannot be
 * allocated. *out is NULL on failure. */
ct_status ct_optimizer_create(const ct_optim_config *cfg, size_t n_params, ct_optimizer **out);

/* Frees the optimizer and its state buffers; NULL is a no-op. */
void ct_optimizer_destroy(ct_optimizer *o);

/* One update of params[0..n) from grads[0..n) in one fused pass, exactly as
 * PyTorch's optimizer.step() for the configured kind, then increments the
 * step counter. grads is read only (weight decay is applied on the fly).
 * Fails with CT_ERR_INVALID_ARG if a pointer is NULL. */
ct_status ct_optimizer_step(ct_optimizer *o, float *params, const float *grads);

/* The kind and the number of parameters the optimizer was created for. */
ct_optim_kind ct_optimizer_kind(const ct_optimizer *o);
size_t ct_optimizer_size(const ct_optimizer *o);
/* The configuration it was created with, lr and momentum as they are now
 * (a schedule changes them). */
const ct_optim_config *ct_optimizer_get_config(const ct_optimizer *o);
/* Makes dst continue where src is, over part of it: the scalars (step
 * count, lr, momentum, SGD's buffer flag) copied, and count values of
 * each state buffer from src[src_off..] into dst[dst_off..]. For
 * replicas (offsets 0), a shard of a sharded optimizer state (ZeRO), and
 * gathering shards back. The same configuration; either state may live
 * on a device (a GPU replica starts from the state of one), not both;
 * CT_ERR_INVALID_ARG for ranges beyond either optimizer. */
ct_status ct_optimizer_copy_state(ct_optimizer *dst, size_t dst_off, const ct_optimizer *src, size_t src_off,
                                  size_t count);

/* Learning rate used by the next step; schedulers set it between steps. */
void ct_optimizer_set_lr(ct_optimizer *o, double lr);
double ct_optimizer_get_lr(const ct_optimizer *o);

/* The momentum a scheduler cycles (OneCycleLR): SGD's momentum, or beta1
 * for Adam/AdamW, as PyTorch's group['momentum'] / group['betas'][0].
 * Setting a non-zero SGD momentum allocates the momentum buffer if absent,
 * hence CT_ERR_OUT_OF_MEMORY; a value outside [0, 1) is CT_ERR_INVALID_ARG
 * for Adam/AdamW and negative values are for SGD. */
ct_status ct_optimizer_set_momentum(ct_optimizer *o, double momentum);
double ct_optimizer_get_momentum(const ct_optimizer *o);

/* Number of optimizer steps taken (PyTorch's state['step']). */
int64_t ct_optimizer_steps(const ct_optimizer *o);

/* Restores the step counter (checkpoint resume); Adam's bias correction
 * depends on it. Negative values are CT_ERR_INVALID_ARG. */
ct_status ct_optimizer_set_steps(ct_optimizer *o, int64_t steps);

/* Number of flat state buffers the optimizer holds now: SGD 0 or 1,
 * Adam/AdamW 2, or 3 with amsgrad. */
size_t ct_optimizer_state_count(const ct_optimizer *o);

/* The i-th state buffer: its PyTorch state name ("momentum_buffer",
 * "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), a writable pointer to its n
 * f32 values and n. Writing the saved bytes back into a fresh optimizer of
 * the same config restores it bit-exactly (with the scalars below). Fails
 * with CT_ERR_NOT_FOUND if i >= ct_optimizer_state_count(o). */
ct_status ct_optimizer_state(ct_optimizer *o, size_t i, const char **name, float **data, size_t *n);

/* Where the buffers of ct_optimizer_state live: NULL while they are host
 * memory (every optimizer until a device-resident training step moves its
 * state to a CUDA device), else that device, whose memory the data
 * pointers then address (copy them out with ct_device_copy; do not read
 * them directly). Checkpoints tag the tensors they save with it. */
ct_device *ct_optimizer_device(const ct_optimizer *o);

/* The optimizer's scalar state as named doubles, for checkpoints: "step",
 * "lr", "momentum" (SGD momentum or Adam beta1, which schedulers change) and
 * for SGD "momentum_buffer_ready" (PyTorch's buffer-is-None flag: the first
 * step with momentum copies the gradient into the buffer). i beyond the
 * count is CT_ERR_NOT_FOUND. */
size_t ct_optimizer_scalar_count(const ct_optimizer *o);
ct_status ct_optimizer_scalar(const ct_optimizer *o, size_t i, const char **name, double *value);

/* Sets the scalar called name (one of the names above). An unknown name is
 * CT_ERR_NOT_FOUND, an invalid value CT_ERR_INVALID_ARG. */
ct_status ct_optimizer_set_scalar(ct_optimizer *o, const char *name, double value);

/* How many per-parameter buffers c's optimizer keeps (SGD with momentum
 * 1, else 0; Adam/AdamW 2; amsgrad 3). */
int ct_optim_state_buffers(const ct_optim_config *c);

/* L2 norm of grads[0..n), accumulated in float64 by an OpenMP reduction,
 * and the sum of squares under the root (what replicas add up before the
 * root is taken: the global norm of data parallel training). */
double ct_grad_norm(const float *grads, size_t n);
double ct_grad_sumsq(const float *grads, size_t n);

/* torch.nn.utils.clip_grad_norm_ on one flat buffer: computes the total L2
 * norm (float64 accumulation) and, when max_norm / (norm + 1e-6) < 1,
 * multiplies every gradient by that coefficient. Returns the norm before
 * clipping. Unlike PyTorch, a non-finite norm leaves grads untouched (and is
 * returned) so the caller can skip the step instead of spreading NaN. */
double ct_clip_grad_norm(float *grads, size_t n, double max_norm);
/* The scaling half of ct_clip_grad_norm for a norm computed elsewhere
 * (a global norm over replicas): the same coefficient and rule. */
void ct_clip_grad_to_norm(float *grads, size_t n, double norm, double max_norm);

#ifdef __cplusplus
}
#endif
#endif
