/* Private layout of ct_optimizer, shared by the lifecycle/state code
 * (optimizer.c) and the fused update passes (optimizer_step.c). */
#ifndef CTRAIN_OPTIM_OPTIMIZER_IMPL_H
#define CTRAIN_OPTIM_OPTIMIZER_IMPL_H

#include "ctrain/device.h"
#include "ctrain/optim.h"

struct ct_optimizer {
  ct_optim_config cfg; /* lr and momentum/beta1 change under a scheduler */
  size_t n;
  int64_t steps;
  int momentum_buffer_ready; /* SGD: PyTorch's "buffer is not None" */
  float *momentum_buffer;    /* SGD, [n] or NULL */
  float *exp_avg;            /* Adam/AdamW, [n] */
  float *exp_avg_sq;         /* Adam/AdamW, [n] */
  float *max_exp_avg_sq;     /* amsgrad, [n] or NULL */
  ct_device *dev;            /* NULL: state in host memory; else on this device (optimizer_fused.c) */
  void *dev_block;           /* on a device: the one allocation holding the buffers moved there */
  float *late_momentum;      /* an SGD momentum buffer created on the device after the move, or NULL */
};

/* The fused passes (optimizer_step.c); the caller has validated pointers
 * and increments o->steps after the pass: the arguments are those of step
 * o->steps + 1, as for the device (ct_optim_fused_args). */
void ct_optim_sgd_pass(struct ct_optimizer *o, float *params, const float *grads);
void ct_optim_adam_pass(struct ct_optimizer *o, float *params, const float *grads);

#endif
