/* ct_optimizer lifecycle, hyperparameter access and checkpoint state. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optimizer_impl.h"

ct_optim_config ct_optim_config_default(ct_optim_kind kind) {
  ct_optim_config c;
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.eps = 1e-8;
  switch (kind) {
    case CT_OPTIM_ADAM: c.lr = 1e-3; break;
    case CT_OPTIM_ADAMW: c.lr = 1e-3; c.weight_decay = 1e-2; break;
    default: c.kind = CT_OPTIM_SGD; c.lr = 0.01; break;
  }
  return c;
}

static int is_adam(ct_optim_kind k) { return k == CT_OPTIM_ADAM || k == CT_OPTIM_ADAMW; }

static ct_status check_config(const ct_optim_config *c) {
  if (c->kind != CT_OPTIM_SGD && !is_adam(c->kind))
    return ct_error(CT_ERR_INVALID_ARG, "optimizer config: kind %d is not SGD(0), Adam(1) or AdamW(2)", (int)c->kind);
  if (!(c->lr >= 0)) return ct_error(CT_ERR_INVALID_ARG, "optimizer config: lr must be >= 0, got %g", c->lr);
  if (!(c->weight_decay >= 0))
    return ct_error(CT_ERR_INVALID_ARG, "optimizer config: weight_decay must be >= 0, got %g", c->weight_decay);
  if (c->kind == CT_OPTIM_SGD) {
    if (!(c->momentum >= 0))
      return ct_error(CT_ERR_INVALID_ARG, "optimizer config: momentum must be >= 0, got %g", c->momentum);
    if (!isfinite(c->dampening))
      return ct_error(CT_ERR_INVALID_ARG, "optimizer config: dampening must be finite, got %g", c->dampening);
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
      return ct_error(CT_ERR_INVALID_ARG,
                      "optimizer config: nesterov needs momentum > 0 and dampening == 0 (got momentum %g, dampening %g)",
                      c->momentum, c->dampening);
  } else {
    if (!(c->eps >= 0)) return ct_error(CT_ERR_INVALID_ARG, "optimizer config: eps must be >= 0, got %g", c->eps);
    if (!(c->beta1 >= 0 && c->beta1 < 1))
      return ct_error(CT_ERR_INVALID_ARG, "optimizer config: beta1 must be in [0, 1), got %g", c->beta1);
    if (!(c->beta2 >= 0 && c->beta2 < 1))
      return ct_error(CT_ERR_INVALID_ARG, "optimizer config: beta2 must be in [0, 1), got %g", c->beta2);
  }
  return CT_OK;
}

/* Zeroed by writing, not by calloc: calloc's untouched pages map the
 * shared zero page on the first step's read and fault again, with a TLB
 * shootdown across the threads, on its write, which made the first Adam
 * step far slower. The loop is an OpenMP one so that GCC does not fold
 * malloc + memset back into calloc. */
static ct_status alloc_state(float **p, size_t n, const char *name) {
  float *s = n <= SIZE_MAX / sizeof(float) ? malloc((n ? n : 1) * sizeof(float)) : NULL;
  if (!s) return ct_error(CT_ERR_OUT_OF_MEMORY, "optimizer: cannot allocate state '%s' (%zu floats)", name, n);
#pragma omp parallel for schedule(static) if (n > (1 << 20))
  for (size_t i = 0; i < n; i++) s[i] = 0.0f;
  *p = s;
  return CT_OK;
}

ct_status ct_optimizer_create(const ct_optim_config *cfg, size_t n_params, ct_optimizer **out) {
  if (!out) return ct_error(CT_ERR_INVALID_ARG, "ct_optimizer_create: out is NULL");
  *out = NULL;
  if (!cfg) return ct_error(CT_ERR_INVALID_ARG, "ct_optimizer_create: cfg is NULL");
  if (n_params == 0) return ct_error(CT_ERR_INVALID_ARG, "ct_optimizer_create: n_params is 0");
  CT_TRY(check_config(cfg));
  ct_optimizer *o = calloc(1, sizeof *o);
  if (!o) return ct_error(CT_ERR_OUT_OF_MEMORY, "ct_optimizer_create: out of memory");
  o->cfg = *cfg;
  o->n = n_params;
  ct_status s = CT_OK;
  if (cfg->kind == CT_OPTIM_SGD) {
    if (cfg->momentum != 0) s = alloc_state(&o->momentum_buffer, n_params, "momentum_buffer");
  } else {
    s = alloc_state(&o->exp_avg, n_params, "exp_avg");
    if (s == CT_OK) s = alloc_state(&o->exp_avg_sq, n_params, "exp_avg_sq");
    if (s == CT_OK && cfg->amsgrad) s = alloc_state(&o->max_exp_avg_sq, n_params, "max_exp_avg_sq");
  }
  if (s != CT_OK) {
    ct_optimizer_destroy(o);
    return s;
  }
  *out = o;
  return CT_OK;
}

const ct_optim_config *ct_optimizer_get_config(const ct_optimizer *o) { return &o->cfg; }

ct_status ct_optimizer_copy_state(ct_optimizer *dst, size_t dst_off, const ct_optimizer *src, size_t src_off,
                                  size_t count) {
  if (dst->dev && src->dev)
    return ct_error(CT_ERR_INVALID_ARG, "optimizer: copying state from one device to another (%s, %s) is not supported",
                    ct_device_name(src->dev), ct_device_name(dst->dev));
  if (dst->cfg.kind != src->cfg.kind || dst_off + count > dst->n || src_off + count > src->n)
    return ct_error(CT_ERR_INVALID_ARG, "optimizer: copy of %zu values from [%zu] of %zu into [%zu] of %zu (kinds %d, %d)",
                    count, src_off, src->n, dst_off, dst->n, (int)src->cfg.kind, (int)dst->cfg.kind);
  dst->cfg = src->cfg;
  dst->steps = src->steps;
  dst->momentum_buffer_ready = src->momentum_buffer_ready;
  float *const d[4] = {dst->momentum_buffer, dst->exp_avg, dst->exp_avg_sq, dst->max_exp_avg_sq};
  const float *const s[4] = {src->momentum_buffer, src->exp_avg, src->exp_avg_sq, src->max_exp_avg_sq};
  for (int i = 0; i < 4; i++) {
    if (!d[i] != !s[i]) return ct_error(CT_ERR_INVALID_ARG, "optimizer: the two optimizers hold different state");
    if (d[i]) CT_TRY(ct_device_copy(dst->dev, d[i] + dst_off, src->dev, s[i] + src_off, count * sizeof(float)));
  }
  return CT_OK;
}

void ct_optimizer_destroy(ct_optimizer *o) {
  if (!o) return;
  if (o->dev) {
    if (o->dev_block) ct_device_free(o->dev, o->dev_block);
    if (o->late_momentum) ct_device_free(o->dev, o->late_momentum);
    free(o);
    return;
  }
  free(o->momentum_buffer);
  free(o->exp_avg);
  free(o->exp_avg_sq);
  free(o->max_exp_avg_sq);
  free(o);
}

ct_status ct_optimizer_step(ct_optimizer *o, float *params, const float *grads) {
  if (!o || !params || !grads)
    return ct_error(CT_ERR_INVALID_ARG, "ct_optimizer_step: %s is NULL", !o ? "optimizer" : !params ? "params" : "grads");
  if (o->dev)
    return ct_error(CT_ERR_INVALID_ARG, "ct_optimizer_step: the state lives on %s; use the fused device step",
                    ct_device_name(o->dev));
  if (o->cfg.kind == CT_OPTIM_SGD) {
    /* OneCycleLR may have turned momentum on after creation. */
    if (o->cfg.momentum != 0 && !o->momentum_buffer)
      CT_TRY(alloc_state(&o->momentum_buffer, o->n, "momentum_buffer"));
    ct_optim_sgd_pass(o, params, grads);
    if (o->cfg.momentum != 0) o->momentum_buffer_ready = 1;
    o->steps++;
  } else {
    ct_optim_adam_pass(o, params, grads);
    o->steps++;
  }
  return CT_OK;
}

ct_optim_kind ct_optimizer_kind(const ct_optimizer *o) { return o->cfg.kind; }
size_t ct_optimizer_size(const ct_optimizer *o) { return o->n; }
void ct_optimizer_set_lr(ct_optimizer *o, double lr) { o->cfg.lr = lr; }
double ct_optimizer_get_lr(const ct_optimizer *o) { return o->cfg.lr; }

ct_status ct_optimizer_set_momentum(ct_optimizer *o, double m) {
  if (o->cfg.kind == CT_OPTIM_SGD) {
    if (!(m >= 0)) return ct_error(CT_ERR_INVALID_ARG, "optimizer: SGD momentum must be >= 0, got %g", m);
    if (m != 0 && !o->momentum_buffer && !o->dev) CT_TRY(alloc_state(&o->momentum_buffer, o->n, "momentum_buffer"));
    o->cfg.momentum = m;
  } else {
    if (!(m >= 0 && m < 1)) return ct_error(CT_ERR_INVALID_ARG, "optimizer: Adam beta1 must be in [0, 1), got %g", m);
    o->cfg.beta1 = m;
  }
  return CT_OK;
}

double ct_optimizer_get_momentum(const ct_optimizer *o) {
  return o->cfg.kind == CT_OPTIM_SGD ? o->cfg.momentum : o->cfg.beta1;
}

int64_t ct_optimizer_steps(const ct_optimizer *o) { return o->steps; }

ct_status ct_optimizer_set_steps(ct_optimizer *o, int64_t steps) {
  if (steps < 0) return ct_error(CT_ERR_INVALID_ARG, "optimizer: step counter must be >= 0, got %lld", (long long)steps);
  o->steps = steps;
  return CT_OK;
}

/* State buffers in a fixed order so index i is stable for one config. */
static size_t collect_states(ct_optimizer *o, const char *names[3], float *bufs[3]) {
  size_t k = 0;
  if (o->momentum_buffer) names[k] = "momentum_buffer", bufs[k++] = o->momentum_buffer;
  if (o->exp_avg) names[k] = "exp_avg", bufs[k++] = o->exp_avg;
  if (o->exp_avg_sq) names[k] = "exp_avg_sq", bufs[k++] = o->exp_avg_sq;
  if (o->max_exp_avg_sq) names[k] = "max_exp_avg_sq", bufs[k++] = o->max_exp_avg_sq;
  return k;
}

size_t ct_optimizer_state_count(const ct_optimizer *o) {
  const char *names[4];
  float *bufs[4];
  return collect_states((ct_optimizer *)o, names, bufs);
}

ct_status ct_optimizer_state(ct_optimizer *o, size_t i, const char **name, float **data, size_t *n) {
  const char *names[4];
  float *bufs[4];
  size_t k = collect_states(o, names, bufs);
  if (i >= k) return ct_error(CT_ERR_NOT_FOUND, "optimizer: state index %zu out of range (it has %zu buffers)", i, k);
  if (name) *name = names[i];
  if (data) *data = bufs[i];
  if (n) *n = o->n;
  return CT_OK;
}

static const char *const scalar_names[] = {"step", "lr", "momentum", "momentum_buffer_ready"};

size_t ct_optimizer_scalar_count(const ct_optimizer *o) { return o->cfg.kind == CT_OPTIM_SGD ? 4 : 3; }

ct_status ct_optimizer_scalar(const ct_optimizer *o, size_t i, const char **name, double *value) {
  size_t k = ct_optimizer_scalar_count(o);
  if (i >= k) return ct_error(CT_ERR_NOT_FOUND, "optimizer: scalar index %zu out of range (it has %zu)", i, k);
  double v = 0;
  switch (i) {
    case 0: v = (double)o->steps; break;
    case 1: v = o->cfg.lr; break;
    case 2: v = ct_optimizer_get_momentum(o); break;
    default: v = o->momentum_buffer_ready; break;
  }
  if (name) *name = scalar_names[i];
  if (value) *value = v;
  return CT_OK;
}

ct_status ct_optimizer_set_scalar(ct_optimizer *o, const char *name, double value) {
  if (!name) return ct_error(CT_ERR_INVALID_ARG, "ct_optimizer_set_scalar: name is NULL");
  if (!strcmp(name, "step")) {
    if (!(value >= 0 && value <= 9007199254740992.0 && value == floor(value)))
      return ct_error(CT_ERR_INVALID_ARG, "optimizer scalar 'step': expected a non-negative integer, got %g", value);
    o->steps = (int64_t)value;
    return CT_OK;
  }
  if (!strcmp(name, "lr")) {
    if (!(value >= 0)) return ct_error(CT_ERR_INVALID_ARG, "optimizer scalar 'lr': expected >= 0, got %g", value);
    o->cfg.lr = value;
    return CT_OK;
  }
  if (!strcmp(name, "momentum")) return ct_optimizer_set_momentum(o, value);
  if (!strcmp(name, "momentum_buffer_ready") && o->cfg.kind == CT_OPTIM_SGD) {
    if (value != 0 && value != 1)
      return ct_error(CT_ERR_INVALID_ARG, "optimizer scalar 'momentum_buffer_ready': expected 0 or 1, got %g", value);
    if (value == 1 && !o->momentum_buffer && !o->dev) CT_TRY(alloc_state(&o->momentum_buffer, o->n, "momentum_buffer"));
    o->momentum_buffer_ready = (int)value;
    return CT_OK;
  }
  return ct_error(CT_ERR_NOT_FOUND, "optimizer: no scalar named '%s' (expected step, lr, momentum%s)", name,
                  o->cfg.kind == CT_OPTIM_SGD ? ", momentum_buffer_ready" : "");
}
