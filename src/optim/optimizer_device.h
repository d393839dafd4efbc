/* Optimizers on a device: state buffers in device memory and the fused
 * step (unscale + inf/NaN check + clip + SGD/Adam/AdamW + loss-scaler
 * update) as backend kernels, plus the host reference of that fused step
 * that the CPU tests compare with the four-call CPU path. Internal. */
#ifndef CTRAIN_OPTIM_OPTIMIZER_DEVICE_H
#define CTRAIN_OPTIM_OPTIMIZER_DEVICE_H

#include <stddef.h>

#include "ctrain/amp.h"
#include "ctrain/device.h"
#include "ctrain/optim.h"
#include "ctrain/sched.h"
#include "math/fused_step.h"

/* Fills a with the scalars of o's next step (Adam's bias corrections use
 * steps + 1, PyTorch's increment-then-correct order), rounded exactly as
 * ct_optimizer_step rounds them, and the clipping threshold max_norm (<= 0
 * turns clipping off). */
void ct_optim_fused_args(const ct_optimizer *o, double max_norm, ct_fused_optim_args *a);

/* The scaler's host state as the device block keeps it, and back (the
 * host copy follows the device after every read-back). */
void ct_scaler_to_dev(const ct_grad_scaler *s, ct_scaler_dev *d);
void ct_scaler_from_dev(const ct_scaler_dev *d, ct_grad_scaler *s);

/* Host reference of the device passes, on host memory: the statistics pass
 * (sumsq of the unscaled gradients and the inf/NaN flag, into st, with
 * st->scaler giving the scale), the fused update of params and the state
 * buffers s0..s2 (SGD: s0 = momentum buffer; Adam: s0 = exp_avg, s1 =
 * exp_avg_sq, s2 = max_exp_avg_sq) that does nothing when the step is
 * skipped, and the scaler update. grads are read only. Sums run in index
 * order; the device's tree order may change the last bits of the clip
 * norm. */
void ct_optim_fused_stats_host(const float *grads, size_t n, ct_step_stats *st);
void ct_optim_fused_update_host(const ct_fused_optim_args *a, const ct_step_stats *st, float *params,
                                const float *grads, float *s0, float *s1, float *s2);

/* Moves o's state buffers to dev (copying their contents) into one
 * device allocation that o owns, so a step runs there; later
 * ct_optimizer_state() hands out device pointers and ct_optimizer_device()
 * says where they live. Host backends (no alloc hook) keep host memory
 * and this is a no-op. Fails with CT_ERR_OUT_OF_MEMORY naming the size. */
ct_status ct_optimizer_to_device(ct_optimizer *o, ct_device *dev);
/* ct_optimizer_device, the device holding o's state, and ct_optim_state_buffers
 * are public (ctrain/optim.h). */

/* Queues one fused step on dev (the device's backend must have
 * grad_stats, fused_optim_step and scaler_update): params, grads and o's
 * state in dev memory, stats a device ct_step_stats whose scaler block is
 * current. Nothing waits; after reading stats back the caller calls
 * ct_optimizer_commit_step with the skip decision so the host-side
 * counters (step, SGD's first-momentum flag) follow. */
ct_status ct_optimizer_step_device(ct_optimizer *o, ct_device *dev, float *params, const float *grads,
                                   ct_step_stats *stats, double max_norm);
void ct_optimizer_commit_step(ct_optimizer *o, int skipped);

/* The argument table of o's next step (see ct_step_args): row j as
 * ct_optim_fused_args would fill it after j more taken steps (steps + j;
 * SGD's momentum buffer counted as started once a step with momentum was
 * taken) and, with a per-step schedule sch (else NULL), after j more steps
 * of sch (its learning rate and momentum/beta1). Used when the host queues
 * a step before it has read whether the previous ones were skipped.
 * Assumes SGD's momentum does not switch from 0 to non-zero inside the lag
 * window. A row sch cannot reach (a OneCycle schedule past its last step)
 * repeats the row before it: only a run that would fail at its read-back
 * (ct_scheduler_step refusing that step) takes it. */
void ct_optim_step_args(const ct_optimizer *o, const ct_scheduler *sch, double max_norm, ct_step_args *t);

/* o as it would be after `ahead` more ct_scheduler_step calls of s, into
 * *out: a shallow copy of o (only its scalars, the learning rate and the
 * momentum or Adam's beta1, may differ), s and o unchanged. Fails as the
 * last of those calls would. (scheduler.c, for ct_optim_step_args.) */
ct_status ct_scheduler_peek(const ct_scheduler *s, const ct_optimizer *o, int ahead, ct_optimizer *out);
/* Queues the copy of that table into stats->args (before the step, and
 * outside a captured graph, so a replay reads this step's values). */
ct_status ct_optimizer_write_step_args(ct_optimizer *o, ct_device *dev, ct_step_stats *stats, double max_norm);
/* The two halves of a fused step, for a step with work between them (a
 * strategy's global reduction of the statistics): the statistics pass
 * (the unscaled gradients' sum of squares and the inf/NaN flag, into
 * stats), then the fused update and the scaler update that read them.
 * host_args: the scalars from the host's counters as
 * ct_optimizer_step_device takes them (max_norm the clip threshold; it
 * also creates an SGD momentum buffer switched on late); else from
 * stats->args as ct_optimizer_step_device_args. */
ct_status ct_optimizer_grad_stats_device(ct_optimizer *o, ct_device *dev, const float *grads, ct_step_stats *stats);
ct_status ct_optimizer_update_device(ct_optimizer *o, ct_device *dev, float *params, const float *grads,
                                     ct_step_stats *stats, int host_args, double max_norm);
/* ct_optimizer_step_device with the scalars taken from stats->args on the
 * device (the row matching stats->opt_steps): nothing of the launch
 * depends on the step, so it can be captured in a CUDA graph. Refuses an
 * SGD momentum buffer that does not exist yet (ct_optimizer_step_device
 * creates it). */
ct_status ct_optimizer_step_device_args(ct_optimizer *o, ct_device *dev, float *params, const float *grads,
                                        ct_step_stats *stats);

#endif
