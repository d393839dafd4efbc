/* A model's precision: the dtype of every layer (from the policy), the
 * low-precision copies of the weights of layers that compute in the low
 * precision, and O3's rounding of the fp32 parameters. The executor
 * (src/exec/executor.c) plans and binds buffers by these dtypes.
 *
 * The weight copies are buffers of the memory plan (exec_plan.c): in a
 * training plan a layer's copy is cast from the fp32 weights for its
 * forward alone, and a second one again for its backward-data pass (from
 * its recompute forward when it has one), so that no copy is alive
 * between a layer's forward and its backward, where a step's memory
 * peaks; the weight gradient does not read a copy. An inference plan
 * keeps one copy per layer for the whole step and casts it again only
 * after the weights changed. The price is a second cast of the weights a
 * training step, for a smaller peak than with the copies in one block
 * beside the plan (docs/MIXED_PRECISION.md, "Autocast policy"). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amp/amp_model.h"
#include "backend/device_impl.h"
#include "nn/model_impl.h"

ct_status ct_model_set_precision(ct_model *m, ct_precision p, ct_opt_level o) {
  if (p < CT_PRECISION_FP32 || p > CT_PRECISION_FP16 || o < CT_OPT_O0 || o > CT_OPT_O3)
    return ct_error(CT_ERR_INVALID_ARG, "model '%s': invalid precision %d / opt level %d", m->name, (int)p, (int)o);
  if (p == CT_PRECISION_FP32 && o != CT_OPT_O0)
    return ct_error(CT_ERR_INVALID_ARG,
                    "model '%s': opt level %s needs a low precision (bf16 or fp16); fp32 runs at O0", m->name,
                    ct_opt_level_name(o));
  if (p != CT_PRECISION_FP32 && o == CT_OPT_O0)
    return ct_error(CT_ERR_INVALID_ARG, "model '%s': opt level O0 is fp32; %s needs O1, O2 or O3", m->name,
                    ct_precision_name(p));
  m->precision = p;
  m->opt_level = o;
  return CT_OK;
}

ct_precision ct_model_precision(const ct_model *m) { return m->precision; }
ct_opt_level ct_model_opt_level(const ct_model *m) { return m->opt_level; }

ct_dtype ct_model_layer_dtype(const ct_model *m, int i) {
  return m->act_dt && i >= 0 && i < m->n_layers ? m->act_dt[i] : CT_F32;
}

ct_amp_rule ct_model_layer_rule(const ct_model *m, int i) {
  return m->act_rule && i >= 0 && i < m->n_layers ? m->act_rule[i] : CT_AMP_FP32;
}

void ct_model_weights_changed(ct_model *m) { m->lp_dirty = 1; }

/* Layers whose weights a low-precision copy serves. */
static int uses_low_weights(const ct_model *m, int i) {
  const ct_layer *l = &m->layers[i];
  return m->act_dt && m->opt_level != CT_OPT_O0 && m->act_dt[i] != CT_F32 &&
         (l->cls == &ct_layer_conv2d || l->cls == &ct_layer_linear);
}

/* A parameter of layer i that its low-precision copy holds. */
static int low_state(const ct_state_decl *s) { return !s->is_buffer && s->dtype == CT_F32; }

size_t ct_amp_layer_weights(const ct_model *m, int i, size_t *first) {
  if (!uses_low_weights(m, i)) return 0;
  const ct_layer *l = &m->layers[i];
  size_t lo = SIZE_MAX, hi = 0;
  for (int k = 0; k < l->n_state; k++) {
    const ct_state_decl *s = &l->state[k];
    if (!low_state(s)) continue;
    size_t n = (size_t)ct_tensor_numel(&m->entries[s->entry].value);
    if (s->offset < lo) lo = s->offset;
    if (s->offset + n > hi) hi = s->offset + n;
  }
  if (lo >= hi) return 0;
  if (first) *first = lo;
  return hi - lo;
}

size_t ct_model_low_precision_bytes(const ct_model *m) {
  size_t n = 0;
  for (int i = 0; m->act_dt && i < m->n_layers; i++) n += ct_amp_layer_weights(m, i, NULL);
  return n * 2;
}

void ct_amp_model_free(ct_model *m) {
  free(m->act_dt), free(m->act_rule);
  m->act_dt = NULL, m->act_rule = NULL;
}

ct_status ct_amp_model_plan(ct_model *m) {
  int L = m->n_layers;
  ct_amp_model_free(m);
  m->act_dt = malloc(sizeof *m->act_dt * (size_t)L);
  m->act_rule = malloc(sizeof *m->act_rule * (size_t)L);
  if (!m->act_dt || !m->act_rule) return ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': out of host memory", m->name);
  ct_dtype low = ct_precision_dtype(m->precision);
  for (int i = 0; i < L; i++) {
    ct_layer *l = &m->layers[i];
    ct_dtype in[CT_LAYER_MAX_IN];
    for (int j = 0; j < l->n_inputs; j++) in[j] = l->inputs[j] < 0 ? CT_F32 : m->act_dt[l->inputs[j]];
    ct_amp_rule r = ct_amp_policy_rule(m->opt_level, l->cls->kind);
    m->act_rule[i] = r;
    m->act_dt[i] = m->opt_level == CT_OPT_O0 ? CT_F32 : ct_amp_rule_dtype(r, in, l->n_inputs, low);
    /* A view shares its root's buffer, so it cannot change the dtype (a
     * folded ReLU keeps inputs[0] with no input edge). */
    if (l->cls->flags & CT_LAYER_ALIAS) {
      m->act_rule[i] = CT_AMP_FOLLOW;
      m->act_dt[i] = l->inputs[0] >= 0 ? m->act_dt[l->inputs[0]] : CT_F32;
    }
  }
  m->lp_dirty = 1;
  if (m->opt_level == CT_OPT_O3) CT_TRY(ct_model_round_params(m));
  return CT_OK;
}

void ct_amp_model_bind_weights(ct_model *m) {
  for (int i = 0; i < m->n_layers; i++) {
    ct_layer *l = &m->layers[i];
    for (int k = 0; k < l->n_state; k++) {
      l->w[k] = m->entries[l->state[k].entry].value;
      l->w[k].device = m->dev;
    }
    (void)ct_amp_layer_copy(m, i, NULL, 0);
  }
}

ct_status ct_amp_layer_copy(ct_model *m, int i, void *copy, int cast) {
  size_t first = 0;
  int64_t n = (int64_t)ct_amp_layer_weights(m, i, &first);
  if (!n) return CT_OK;
  const ct_dtype low = ct_precision_dtype(m->precision);
  ct_layer *l = &m->layers[i];
  for (int k = 0; k < l->n_state; k++) {
    const ct_state_decl *s = &l->state[k];
    if (!low_state(s)) continue;
    l->w[k].data = copy ? (uint16_t *)copy + (s->offset - first) : NULL;
    l->w[k].dtype = low;
  }
  if (!cast || !copy) return CT_OK;
  ct_tensor src = ct_tensor_view(m->params + first, CT_F32, 1, &n);
  ct_tensor dst = ct_tensor_view(copy, low, 1, &n);
  src.device = dst.device = m->dev;
  return ct_device_backend(m->dev)->cast(m->dev, &src, &dst);
}

ct_status ct_model_round_params(ct_model *m) {
  if (m->opt_level != CT_OPT_O3) return CT_OK;
  if (m->dstate) {
    /* On the device: f32 -> low -> f32 with the backend's cast, the same
     * round-to-nearest-even as the host conversion below. */
    int64_t n = (int64_t)m->n_params;
    void *low = m->round_scratch;
    ct_tensor p32 = ct_tensor_view(m->params, CT_F32, 1, &n), p16 = ct_tensor_view(low, ct_precision_dtype(m->precision), 1, &n);
    p32.device = p16.device = m->dev;
    const ct_backend *be = ct_device_backend(m->dev);
    CT_TRY(be->cast(m->dev, &p32, &p16));
    CT_TRY(be->cast(m->dev, &p16, &p32));
    m->lp_dirty = 1;
    return CT_OK;
  }
  int bf = m->precision == CT_PRECISION_BF16;
  float *p = m->params;
  int64_t n = (int64_t)m->n_params;
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; i++) p[i] = bf ? ct_bf16_to_f32(ct_f32_to_bf16(p[i])) : ct_f16_to_f32(ct_f32_to_f16(p[i]));
  m->lp_dirty = 1;
  return CT_OK;
}
