/* Model state in device memory: one allocation per prepared model, laid
 * out from the memory plan and the state sizes, and the out-of-memory
 * message built from the same numbers. The host buffers stay allocated
 * (as the staging side of weight loading and the copy a re-prepare on the
 * CPU continues from); on a resident device every view points into the
 * block. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp/amp_model.h"
#include "backend/device_impl.h"
#include "exec/device_state.h"
#include "nn/model_impl.h"
#include "plan/exec_plan.h"

struct ct_model_dstate {
  void *block;
  size_t bytes;
  float *h_params, *h_grads, *h_buffers;
  int64_t *h_counters;
  void *lp_round;      /* O3: the params rounded through the low precision here */
  void *x[CT_STAGE_SLOTS];     /* [max_batch, ...] in the input's dtype each (one buffer for all when shared) */
  int64_t *y[CT_STAGE_SLOTS];  /* [max_batch] each */
  ct_step_stats *stats;
};

size_t ct_mem_total(const ct_mem_numbers *n) {
  return n->arena + n->params + n->grads + n->buffers + n->low_precision + n->optimizer_state + n->staging;
}

static double gib(size_t b) { return (double)b / 1073741824.0; }

void ct_oom_message(const ct_mem_numbers *n, char *buf, size_t cap) {
  if (!cap) return;
  size_t need = ct_mem_total(n), len = 0;
#define PUT(...)                                                          \
  do {                                                                    \
    if (len < cap) len += (size_t)snprintf(buf + len, cap - len, __VA_ARGS__); \
  } while (0)
  /* (the low-precision weight copies are in the step arena; what is left
   * outside is O3's rounding buffer) */
  PUT("out of memory on %s: model '%s' at batch %lld (%s) needs %.3f GiB = step arena %.3f + parameters %.3f + "
      "gradients %.3f + buffers %.3f",
      n->device, n->model, (long long)n->batch, n->precision ? n->precision : "fp32", gib(need), gib(n->arena),
      gib(n->params), gib(n->grads), gib(n->buffers));
  if (n->low_precision) PUT(" + O3 rounding buffer %.3f", gib(n->low_precision));
  PUT(" + optimizer state %.3f + batch staging %.3f GiB", gib(n->optimizer_state), gib(n->staging));
  if (n->dev_total) PUT("; the device has %.3f GiB free of %.3f GiB", gib(n->dev_free), gib(n->dev_total));
  PUT("; try");
  int is16 = n->precision && strcmp(n->precision, "fp32") != 0;
  if (!is16) {
    /* Activations dominate the arena; 16-bit storage halves them. */
    size_t est = need - n->arena / 2 - n->staging / 2 + n->params / 2;
    PUT(" --precision bf16 (about %.3f GiB),", gib(est));
  }
  size_t per = n->batch > 0 ? (n->arena + n->staging) / (size_t)n->batch : 0;
  size_t fixed = need - (n->arena + n->staging);
  if (n->dev_total && per) {
    if (n->dev_free > fixed && (n->dev_free - fixed) / per >= 1) {
      long long fit = (long long)((n->dev_free - fixed) / per);
      if (fit >= n->batch) fit = n->batch - 1;
      PUT(" --batch-size %lld or smaller,", fit > 0 ? fit : 1);
    } else {
      PUT(" a smaller model (parameters, gradients and optimizer state alone need %.3f GiB),", gib(fixed));
    }
  } else {
    PUT(" a smaller --batch-size,");
  }
  /* Accumulation keeps the batch: k micro-batches of B/k need only the
   * per-sample part of one. The smallest divisor k of B that fits (k = B,
   * micro-batches of one, always divides); the device's free memory
   * unknown, k = 2. */
  long long acc_k = 0;
  size_t acc_need = 0;
  for (long long k = 2; per && k <= n->batch && k <= 1024 && !acc_k; k++) {
    size_t est = fixed + per * (size_t)(n->batch / k);
    if (n->batch % k == 0 && (!n->dev_total || est <= n->dev_free)) acc_k = k, acc_need = est;
  }
  if (acc_k)
    PUT(" --batch-size %lld --accumulate %lld (same effective batch %lld, about %.3f GiB),", (long long)n->batch / acc_k,
        acc_k, (long long)n->batch, gib(acc_need));
  if (n->arena_recompute && n->arena_recompute < n->arena)
    PUT(" or --recompute (activation recompute: a step arena of %.3f instead of %.3f GiB, about %.3f GiB)",
        gib(n->arena_recompute), gib(n->arena), gib(need - n->arena + n->arena_recompute));
  else if (len && len < cap && buf[len - 1] == ',')
    buf[--len] = 0; /* the list ended at the previous option */
#undef PUT
}

int ct_model_device_resident(const ct_device *dev) {
  return dev && ct_device_get_type(dev) == CT_DEVICE_CUDA && ct_device_backend(dev)->copy != NULL;
}

static size_t al(size_t b) { return (b + 255) / 256 * 256; }

void ct_model_reserve_optimizer_state(ct_model *m, int buffers) { ct_model_reserve_optimizer_shard(m, buffers, 0); }

void ct_model_reserve_optimizer_shard(ct_model *m, int buffers, size_t shard) {
  m->opt_buffers = buffers < 0 ? 0 : buffers;
  m->opt_values = shard;
}

ct_status ct_model_device_bind(ct_model *m, ct_device *dev) {
  const ct_backend *be = ct_device_backend(dev);
  int need_round = m->opt_level == CT_OPT_O3;
  int64_t in_numel = ct_shape_numel(m->in_ndim, m->in_shape);
  size_t o_arena = 0, o_params = o_arena + al(m->plan->peak ? m->plan->peak : 64);
  /* ZeRO-2: the gradients are the strategy's allocation, counted beside. */
  size_t grad_bytes = m->grads_elsewhere ? 0 : al(m->n_params * 4), elsewhere = al(m->grads_elsewhere);
  size_t o_grads = o_params + al(m->n_params * 4), o_buffers = o_grads + grad_bytes;
  /* num_batches_tracked stays in host memory: batch norm's forward counts
   * it on the host, and nothing on the device reads it. */
  size_t o_lp = o_buffers + al(m->n_buffers * 4);
  size_t lp_bytes = need_round ? al(m->n_params * 2) : 0;
  /* The optimizer's state is its own allocation (ct_optimizer_to_device),
   * made when the step starts; it is counted here so a run that cannot fit
   * fails now, with every part named. */
  size_t opt_bytes = al((size_t)m->opt_buffers * (m->opt_values ? m->opt_values : m->n_params) * 4);
  /* Staging: the x buffers (one when shared), then CT_STAGE_SLOTS y. */
  const int nx = m->stage_x_shared ? 1 : CT_STAGE_SLOTS;
  size_t x_bytes = al((size_t)(m->max_batch * in_numel) * ct_dtype_size(m->in_dt)), y_bytes = al((size_t)m->max_batch * 8);
  size_t o_x = o_lp + lp_bytes, o_y = o_x + (size_t)nx * x_bytes;
  size_t o_stats = o_y + CT_STAGE_SLOTS * y_bytes, total = o_stats + al(sizeof(ct_step_stats));

  ct_mem_numbers nums = {ct_device_name(dev), m->name, ct_precision_name(m->precision), m->max_batch,
                         al(m->plan->peak), al(m->n_params * 4), grad_bytes + elsewhere,
                         al(m->n_buffers * 4), lp_bytes, opt_bytes,
                         o_stats - o_x + al(sizeof(ct_step_stats)), 0, 0, 0};
  if (be->mem_info && be->mem_info(dev, &nums.dev_free, &nums.dev_total) != CT_OK) nums.dev_free = nums.dev_total = 0;
  void *block = nums.dev_total && total + opt_bytes + elsewhere > nums.dev_free ? NULL : ct_device_alloc(dev, total);
  if (!block) {
    char msg[1024];
    size_t rc_peak = 0;
    /* Offered unless a recompute that chooses for the smallest arena is
     * on already (auto, or a segment count); the norm and cheap modes
     * leave more to save. */
    const int chosen = m->recompute == CT_RECOMPUTE_AUTO || m->recompute > 1;
    if (m->training_plan && !chosen && ct_model_plan_peak_with_recompute(m, CT_RECOMPUTE_AUTO, &rc_peak) == CT_OK)
      nums.arena_recompute = al(rc_peak);
    ct_oom_message(&nums, msg, sizeof msg);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "%s", msg);
  }
  struct ct_model_dstate *ds = calloc(1, sizeof *ds);
  if (!ds) {
    ct_device_free(dev, block);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': out of host memory", m->name);
  }
  char *b = block;
  ds->block = block;
  ds->bytes = total;
  ds->h_params = m->params, ds->h_grads = m->grads, ds->h_buffers = m->buffers, ds->h_counters = m->counters;
  for (int k = 0; k < CT_STAGE_SLOTS; k++) {
    ds->x[k] = b + o_x + (size_t)(k % nx) * x_bytes;
    ds->y[k] = (int64_t *)(b + o_y + (size_t)k * y_bytes);
  }
  ds->stats = (ct_step_stats *)(b + o_stats);
  ds->lp_round = need_round ? b + o_lp : NULL;
  ct_status s = ct_device_copy(dev, b + o_params, NULL, m->params, m->n_params * 4);
  if (s == CT_OK) s = ct_device_copy(dev, b + o_buffers, NULL, m->buffers, m->n_buffers * 4);
  if (s == CT_OK && grad_bytes) {
    int64_t n = (int64_t)m->n_params;
    ct_tensor g = ct_tensor_view(b + o_grads, CT_F32, 1, &n);
    g.device = dev;
    if (n) s = be->fill(dev, &g, 0.0f);
  }
  if (s != CT_OK) {
    ct_device_free(dev, block);
    free(ds);
    return ct_error_wrap(s, "model '%s': moving the state to %s", m->name, ct_device_name(dev));
  }
  m->params = (float *)(b + o_params);
  m->grads = grad_bytes ? (float *)(b + o_grads) : NULL;
  m->buffers = (float *)(b + o_buffers);
  m->lp_dirty = 1;
  m->grads_clean = 1;
  m->arena = b + o_arena;
  m->dstate = ds;
  m->round_scratch = ds->lp_round;
  ct_model_bind_state(m);
  ct_amp_model_bind_weights(m);
  return CT_OK;
}

void ct_model_device_release(ct_model *m) {
  struct ct_model_dstate *ds = m->dstate;
  if (!ds) return;
  /* Teardown cannot fail; a failed copy leaves the host's last values. */
  (void)ct_device_sync(m->dev);
  (void)ct_device_copy(NULL, ds->h_params, m->dev, m->params, m->n_params * 4);
  (void)ct_device_copy(NULL, ds->h_buffers, m->dev, m->buffers, m->n_buffers * 4);
  memset(ds->h_grads, 0, m->n_params * 4);
  m->params = ds->h_params, m->grads = ds->h_grads, m->buffers = ds->h_buffers, m->counters = ds->h_counters;
  m->grad_place = NULL, m->grad_place_ctx = NULL;
  m->lp_dirty = 1;
  m->grads_clean = 1;
  ct_device_free(m->dev, ds->block);
  m->arena = NULL;
  m->dstate = NULL;
  m->round_scratch = NULL;
  free(ds);
  ct_model_bind_state(m);
  ct_amp_model_bind_weights(m);
}

void *ct_model_stage_x(ct_model *m) { return ct_model_stage_x_at(m, 0); }
int64_t *ct_model_stage_y(ct_model *m) { return ct_model_stage_y_at(m, 0); }
void *ct_model_stage_x_at(ct_model *m, int k) {
  return m->dstate && k >= 0 && k < CT_STAGE_SLOTS ? m->dstate->x[k] : NULL;
}
int64_t *ct_model_stage_y_at(ct_model *m, int k) {
  return m->dstate && k >= 0 && k < CT_STAGE_SLOTS ? m->dstate->y[k] : NULL;
}
ct_step_stats *ct_model_step_stats(ct_model *m) { return m->dstate ? m->dstate->stats : NULL; }


void ct_model_share_stage_x(ct_model *m, int on) { m->stage_x_shared = on != 0; }
int ct_model_stage_x_shared(const ct_model *m) { return m->stage_x_shared; }

void ct_model_reserve_grads_elsewhere(ct_model *m, size_t bytes) { m->grads_elsewhere = bytes ? bytes : 1; }

ct_status ct_model_prepare_grads_elsewhere(ct_model *m, size_t bytes) {
  if (!m->dstate) return ct_error(CT_ERR_INVALID_ARG, "model '%s': not resident on a device", m->name);
  ct_model_reserve_grads_elsewhere(m, bytes);
  return ct_model_prepare(m, m->dev, m->max_batch, m->training_plan);
}

void ct_model_place_grads(ct_model *m, float *(*place)(void *ctx, size_t offset, size_t count), void *ctx) {
  m->grad_place = place, m->grad_place_ctx = ctx;
  ct_model_bind_state(m);
}
