/* The fused step's host side: argument rounding, the host reference of the
 * device passes (what the CPU tests check the formulas with), optimizer
 * state in device memory, and the queueing of the three device passes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "optim/optimizer_device.h"
#include "optim/optimizer_impl.h"

void ct_optim_fused_args(const ct_optimizer *o, double max_norm, ct_fused_optim_args *a) {
  const ct_optim_config *c = &o->cfg;
  memset(a, 0, sizeof *a);
  a->kind = (int32_t)c->kind;
  a->n = (int64_t)o->n;
  a->max_norm = max_norm;
  if (c->kind == CT_OPTIM_SGD) {
    a->wd = (float)c->weight_decay;
    a->mom = (float)c->momentum;
    a->damp1 = (float)(1.0 - c->dampening);
    a->neg_lr = (float)(-c->lr);
    a->momentum_on = c->momentum != 0;
    a->first = !o->momentum_buffer_ready;
    a->nesterov = c->nesterov;
    return;
  }
  const double step = (double)(o->steps + 1);
  const double bc1 = 1.0 - pow(c->beta1, step), bc2 = 1.0 - pow(c->beta2, step);
  const int decoupled = c->kind == CT_OPTIM_ADAMW;
  a->neg_step_size = (float)(-(c->lr / bc1));
  a->bc2_sqrt = (float)sqrt(bc2);
  a->b1 = (float)c->beta1, a->omb1 = (float)(1.0 - c->beta1);
  a->b2 = (float)c->beta2, a->omb2 = (float)(1.0 - c->beta2);
  a->eps = (float)c->eps;
  a->l2 = decoupled ? 0.0f : (float)c->weight_decay;
  a->decay = decoupled ? (float)(1.0 - c->lr * c->weight_decay) : 1.0f;
  a->apply_decay = decoupled && c->weight_decay != 0;
  a->amsgrad = c->amsgrad && o->max_exp_avg_sq;
}

void ct_scaler_to_dev(const ct_grad_scaler *s, ct_scaler_dev *d) {
  memset(d, 0, sizeof *d);
  d->scale = s->scale;
  d->growth_factor = s->growth_factor;
  d->backoff_factor = s->backoff_factor;
  d->enabled = s->enabled;
  d->dynamic = s->dynamic;
  d->growth_interval = s->growth_interval;
  d->growth_tracker = s->growth_tracker;
  d->skipped_steps = s->skipped_steps;
}

void ct_scaler_from_dev(const ct_scaler_dev *d, ct_grad_scaler *s) {
  s->scale = d->scale;
  s->growth_tracker = d->growth_tracker;
  s->skipped_steps = d->skipped_steps;
}

void ct_optim_fused_stats_host(const float *grads, size_t n, ct_step_stats *st) {
  const float inv = ct_fused_inv_scale(&st->scaler);
  double acc = 0;
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(grads[i])) bad = 1;
    float g = inv != 1.0f ? grads[i] * inv : grads[i];
    acc += (double)g * (double)g;
  }
  st->sumsq = acc;
  st->nonfinite = bad;
}

void ct_optim_fused_update_host(const ct_fused_optim_args *a, const ct_step_stats *st, float *params,
                                const float *grads, float *s0, float *s1, float *s2) {
  if (ct_fused_skip(st)) return;
  const float inv = ct_fused_inv_scale(&st->scaler);
  float cf = 1.0f;
  const int clip = ct_fused_clip(a, st, &cf);
  for (int64_t i = 0; i < a->n; i++) {
    float g = ct_fused_grad(grads[i], inv, clip, cf);
    if (a->kind == 0)
      ct_fused_sgd_elem(a, &params[i], g, s0 ? &s0[i] : NULL);
    else
      ct_fused_adam_elem(a, &params[i], g, &s0[i], &s1[i], s2 ? &s2[i] : NULL);
  }
}

ct_device *ct_optimizer_device(const ct_optimizer *o) { return o->dev; }

ct_status ct_optimizer_to_device(ct_optimizer *o, ct_device *dev) {
  if (!dev || !ct_device_backend(dev)->alloc || o->dev) return CT_OK;
  float **bufs[] = {&o->momentum_buffer, &o->exp_avg, &o->exp_avg_sq, &o->max_exp_avg_sq};
  size_t k = 0;
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) k += *bufs[i] != NULL;
  float *block = k && o->n ? ct_device_alloc(dev, k * o->n * sizeof(float)) : NULL;
  if (k && o->n && !block)
    return ct_error(CT_ERR_OUT_OF_MEMORY, "optimizer: cannot allocate its state (%zu buffers of %zu floats, %.3f GiB) on %s",
                    k, o->n, (double)(k * o->n * sizeof(float)) / 1073741824.0, ct_device_name(dev));
  /* Every copy first, so a failed one leaves the state whole on the host. */
  float *d = block;
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
    if (!*bufs[i]) continue;
    ct_status s = ct_device_copy(dev, d, NULL, *bufs[i], o->n * sizeof(float));
    if (s != CT_OK) {
      ct_device_free(dev, block);
      return ct_error_wrap(s, "optimizer: moving its state to %s", ct_device_name(dev));
    }
    d += o->n;
  }
  o->dev = dev;
  o->dev_block = block;
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
    if (!*bufs[i]) continue;
    free(*bufs[i]);
    *bufs[i] = block;
    block += o->n;
  }
  return CT_OK;
}

int ct_optim_state_buffers(const ct_optim_config *c) {
  if (c->kind == CT_OPTIM_SGD) return c->momentum != 0;
  return c->amsgrad ? 3 : 2;
}

/* Refuses a device without the fused kernels or state that is not on it. */
static ct_status check_fused(const ct_optimizer *o, ct_device *dev, int by_args) {
  const ct_backend *be = ct_device_backend(dev);
  int fused = by_args ? be->fused_optim_step_dev != NULL : be->fused_optim_step != NULL;
  if (!be->grad_stats || !fused || !be->scaler_update)
    return ct_error(CT_ERR_UNSUPPORTED, "optimizer: device %s has no fused optimizer kernels", ct_device_name(dev));
  if (o->dev != dev) return ct_error(CT_ERR_INVALID_ARG, "optimizer: state is not on %s; call ct_optimizer_to_device", ct_device_name(dev));
  return CT_OK;
}

ct_status ct_optimizer_grad_stats_device(ct_optimizer *o, ct_device *dev, const float *grads, ct_step_stats *stats) {
  CT_TRY(check_fused(o, dev, 0));
  int64_t n = (int64_t)o->n;
  ct_tensor g = ct_tensor_view((void *)grads, CT_F32, 1, &n);
  g.device = dev;
  return ct_device_backend(dev)->grad_stats(dev, &g, stats);
}

ct_status ct_optimizer_update_device(ct_optimizer *o, ct_device *dev, float *params, const float *grads,
                                     ct_step_stats *stats, int host_args, double max_norm) {
  const ct_backend *be = ct_device_backend(dev);
  CT_TRY(check_fused(o, dev, !host_args));
  float *s0;
  if (host_args) {
    if (o->cfg.kind == CT_OPTIM_SGD && o->cfg.momentum != 0 && !o->momentum_buffer) {
      /* OneCycleLR turned momentum on after creation: a zeroed device buffer. */
      o->momentum_buffer = o->late_momentum = ct_device_alloc(dev, o->n * sizeof(float));
      if (!o->momentum_buffer) return ct_error_wrap(CT_ERR_OUT_OF_MEMORY, "optimizer: momentum_buffer on %s", ct_device_name(dev));
      int64_t n = (int64_t)o->n;
      ct_tensor t = ct_tensor_view(o->momentum_buffer, CT_F32, 1, &n);
      t.device = dev;
      CT_TRY(be->fill(dev, &t, 0.0f));
    }
    ct_fused_optim_args a;
    ct_optim_fused_args(o, max_norm, &a);
    s0 = o->cfg.kind == CT_OPTIM_SGD ? o->momentum_buffer : o->exp_avg;
    CT_TRY(be->fused_optim_step(dev, &a, params, grads, s0, o->exp_avg_sq, o->max_exp_avg_sq, stats));
  } else {
    if (o->cfg.kind == CT_OPTIM_SGD && o->cfg.momentum != 0 && !o->momentum_buffer)
      return ct_error(CT_ERR_INVALID_ARG,
                      "optimizer: SGD momentum %g on %s without a momentum buffer (momentum switched on after the state "
                      "moved); this step must run through ct_optimizer_step_device",
                      o->cfg.momentum, ct_device_name(dev));
    s0 = o->cfg.kind == CT_OPTIM_SGD ? o->momentum_buffer : o->exp_avg;
    CT_TRY(be->fused_optim_step_dev(dev, (int)o->cfg.kind, (int64_t)o->n, params, grads, s0, o->exp_avg_sq,
                                    o->max_exp_avg_sq, stats));
  }
  return be->scaler_update(dev, stats);
}

ct_status ct_optimizer_step_device(ct_optimizer *o, ct_device *dev, float *params, const float *grads,
                                   ct_step_stats *stats, double max_norm) {
  CT_TRY(check_fused(o, dev, 0));
  CT_TRY(ct_optimizer_grad_stats_device(o, dev, grads, stats));
  return ct_optimizer_update_device(o, dev, params, grads, stats, 1, max_norm);
}

void ct_optimizer_commit_step(ct_optimizer *o, int skipped) {
  if (skipped) return;
  if (o->cfg.kind == CT_OPTIM_SGD && o->cfg.momentum != 0) o->momentum_buffer_ready = 1;
  o->steps++;
}

void ct_optim_step_args(const ct_optimizer *o, const ct_scheduler *sch, double max_norm, ct_step_args *t) {
  memset(t, 0, sizeof *t);
  t->base_steps = o->steps;
  for (int j = 0; j <= CT_STEP_LAG_MAX; j++) {
    /* A shallow copy as o will be after j more taken steps (what
     * ct_optimizer_commit_step, and the schedule, would do j times); only
     * scalars are read. */
    ct_optimizer c = *o;
    if (sch && ct_scheduler_peek(sch, o, j, &c) != CT_OK) {
      t->row[j] = t->row[j - 1]; /* j >= 1: peeking 0 steps cannot fail */
      continue;
    }
    c.steps = o->steps + j;
    if (j > 0 && c.cfg.kind == CT_OPTIM_SGD && c.cfg.momentum != 0) c.momentum_buffer_ready = 1;
    ct_optim_fused_args(&c, max_norm, &t->row[j]);
  }
}

ct_status ct_optimizer_write_step_args(ct_optimizer *o, ct_device *dev, ct_step_stats *stats, double max_norm) {
  ct_step_args t;
  ct_optim_step_args(o, NULL, max_norm, &t);
  /* A pageable source is staged before the copy call returns, so t may go
   * out of scope; the copy stays in stream order before the step. */
  return ct_device_copy(dev, &stats->args, NULL, &t, sizeof t);
}

ct_status ct_optimizer_step_device_args(ct_optimizer *o, ct_device *dev, float *params, const float *grads,
                                        ct_step_stats *stats) {
  CT_TRY(check_fused(o, dev, 1));
  CT_TRY(ct_optimizer_grad_stats_device(o, dev, grads, stats));
  return ct_optimizer_update_device(o, dev, params, grads, stats, 0, 0.0);
}
