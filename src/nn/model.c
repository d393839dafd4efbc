/* Model construction: the graph-building calls, shape inference, the flat
 * state layout in PyTorch state_dict order, and initialisation. */
#include <stdlib.h>
#include <string.h>

#include "nn/model_impl.h"

ct_status ct_model_new(const char *name, ct_model **out) {
  ct_model *m = calloc(1, sizeof *m);
  if (!m) return ct_error(CT_ERR_OUT_OF_MEMORY, "model: out of host memory");
  snprintf(m->name, sizeof m->name, "%s", name);
  m->output = -1;
  *out = m;
  return CT_OK;
}

void ct_model_free(ct_model *m) {
  if (!m) return;
  free(m->act_dt), free(m->act_rule);
  for (int i = 0; i < m->n_entries; i++) free(m->entry_names[i]);
  free(m->entry_names);
  free(m->entries);
  free(m->layers);
  ct_model_def_release(m->def);
  free(m->params);
  free(m->grads);
  free(m->buffers);
  free(m->counters);
  free(m);
}

int ct_g_add_layer(ct_model *m, const ct_layer_class *cls, const char *name, int in0, int in1) {
  if (m->n_layers == m->cap_layers) {
    int cap = m->cap_layers ? m->cap_layers * 2 : 32;
    ct_layer *l = realloc(m->layers, (size_t)cap * sizeof *l);
    if (!l) return -1;
    m->layers = l;
    m->cap_layers = cap;
  }
  int idx = m->n_layers++;
  ct_layer *l = &m->layers[idx];
  memset(l, 0, sizeof *l);
  l->cls = cls;
  l->index = l->rng_index = idx;
  snprintf(l->name, sizeof l->name, "%s", name ? name : "");
  l->inputs[0] = in0;
  l->inputs[1] = in1;
  l->n_inputs = in1 == -2 ? 1 : 2;
  m->output = idx;
  return idx;
}

/* in1 == -2 marks "no second input". */
#define ONE_INPUT -2

int ct_g_linear(ct_model *m, const char *name, int in, int in_f, int out_f, int bias) {
  int i = ct_g_add_layer(m, &ct_layer_linear, name, in, ONE_INPUT);
  if (i >= 0) {
    m->layers[i].ip[0] = in_f;
    m->layers[i].ip[1] = out_f;
    m->layers[i].ip[2] = bias;
  }
  return i;
}

int ct_g_conv2d_rect(ct_model *m, const char *name, int in, int cin, int cout, int kh, int kw, int sh, int sw,
                     int ph, int pw, int dh, int dw, int groups, int bias) {
  int i = ct_g_add_layer(m, &ct_layer_conv2d, name, in, ONE_INPUT);
  if (i >= 0) {
    int *p = m->layers[i].ip;
    p[0] = cin, p[1] = cout, p[2] = kh, p[3] = kw, p[4] = sh, p[5] = sw;
    p[6] = ph, p[7] = pw, p[8] = dh, p[9] = dw, p[10] = groups, p[11] = bias;
  }
  return i;
}

int ct_g_conv2d(ct_model *m, const char *name, int in, int cin, int cout, int k, int stride, int pad, int dil,
                int groups, int bias) {
  return ct_g_conv2d_rect(m, name, in, cin, cout, k, k, stride, stride, pad, pad, dil, dil, groups, bias);
}

static int pool(ct_model *m, const ct_layer_class *cls, const char *name, int in, int k, int stride, int pad,
                int ceil_mode, int cip) {
  int i = ct_g_add_layer(m, cls, name, in, ONE_INPUT);
  if (i >= 0) {
    int *p = m->layers[i].ip;
    p[0] = k, p[1] = k, p[2] = stride ? stride : k, p[3] = stride ? stride : k, p[4] = pad, p[5] = pad;
    p[6] = ceil_mode, p[7] = cip;
  }
  return i;
}

int ct_g_maxpool2d(ct_model *m, const char *name, int in, int k, int stride, int pad, int ceil_mode) {
  return pool(m, &ct_layer_maxpool2d, name, in, k, stride, pad, ceil_mode, 0);
}

int ct_g_avgpool2d(ct_model *m, const char *name, int in, int k, int stride, int pad, int ceil_mode,
                   int count_include_pad) {
  return pool(m, &ct_layer_avgpool2d, name, in, k, stride, pad, ceil_mode, count_include_pad);
}

static int adaptive(ct_model *m, const ct_layer_class *cls, const char *name, int in, int oh, int ow) {
  int i = ct_g_add_layer(m, cls, name, in, ONE_INPUT);
  if (i >= 0) m->layers[i].ip[0] = oh, m->layers[i].ip[1] = ow;
  return i;
}

int ct_g_adaptive_avgpool2d(ct_model *m, const char *name, int in, int oh, int ow) {
  return adaptive(m, &ct_layer_adaptive_avgpool2d, name, in, oh, ow);
}

int ct_g_adaptive_maxpool2d(ct_model *m, const char *name, int in, int oh, int ow) {
  return adaptive(m, &ct_layer_adaptive_maxpool2d, name, in, oh, ow);
}

int ct_g_act(ct_model *m, const char *name, int in, ct_act act, float alpha) {
  int i = ct_g_add_layer(m, &ct_layer_activation, name, in, ONE_INPUT);
  if (i >= 0) m->layers[i].act = act, m->layers[i].fp[0] = alpha;
  return i;
}

int ct_g_dropout(ct_model *m, const char *name, int in, float p, int two_d) {
  int i = ct_g_add_layer(m, two_d ? &ct_layer_dropout2d : &ct_layer_dropout, name, in, ONE_INPUT);
  if (i >= 0) m->layers[i].fp[0] = p;
  return i;
}

int ct_g_batchnorm(ct_model *m, const char *name, int in, int features, int dims, float eps, float momentum,
                   int affine) {
  int i = ct_g_add_layer(m, &ct_layer_batchnorm, name, in, ONE_INPUT);
  if (i >= 0) {
    m->layers[i].ip[0] = features, m->layers[i].ip[1] = dims, m->layers[i].ip[2] = affine;
    m->layers[i].fp[0] = eps, m->layers[i].fp[1] = momentum;
  }
  return i;
}

int ct_g_flatten(ct_model *m, const char *name, int in) {
  return ct_g_add_layer(m, &ct_layer_flatten, name, in, ONE_INPUT);
}

int ct_g_add(ct_model *m, const char *name, int a, int b) { return ct_g_add_layer(m, &ct_layer_add, name, a, b); }

int ct_g_softmax(ct_model *m, const char *name, int in, int log) {
  return ct_g_add_layer(m, log ? &ct_layer_log_softmax : &ct_layer_softmax, name, in, ONE_INPUT);
}

int ct_layer_declare(ct_layer *l, const char *suffix, int is_buffer, ct_dtype dt, int ndim, const int64_t *shape) {
  int k = l->n_state++;
  ct_state_decl *s = &l->state[k];
  memset(s, 0, sizeof *s);
  snprintf(s->suffix, sizeof s->suffix, "%s", suffix);
  s->is_buffer = is_buffer;
  s->dtype = dt;
  s->ndim = ndim;
  for (int i = 0; i < ndim; i++) s->shape[i] = shape[i];
  return k;
}

int64_t ct_shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

void ct_layer_batch_shape(ct_tensor *t, int64_t n, int ndim, const int64_t *shape) {
  t->ndim = ndim + 1;
  t->shape[0] = n;
  for (int i = 0; i < ndim; i++) t->shape[i + 1] = shape[i];
}

static ct_status add_entry(ct_model *m, const char *name, int is_buffer) {
  if (m->n_entries == m->cap_entries) {
    int cap = m->cap_entries ? m->cap_entries * 2 : 64;
    ct_state_entry *e = realloc(m->entries, (size_t)cap * sizeof *e);
    if (!e) return ct_error(CT_ERR_OUT_OF_MEMORY, "model: out of host memory");
    m->entries = e;
    char **nm = realloc(m->entry_names, (size_t)cap * sizeof *nm);
    if (!nm) return ct_error(CT_ERR_OUT_OF_MEMORY, "model: out of host memory");
    m->entry_names = nm;
    m->cap_entries = cap;
  }
  char *s = strdup(name);
  if (!s) return ct_error(CT_ERR_OUT_OF_MEMORY, "model: out of host memory");
  m->entry_names[m->n_entries] = s;
  memset(&m->entries[m->n_entries], 0, sizeof m->entries[0]);
  m->entries[m->n_entries].name = s;
  m->entries[m->n_entries].is_buffer = is_buffer;
  m->n_entries++;
  return CT_OK;
}

/* Where the gradient of the count values at offset of the flat layout
 * is: where a strategy placed it, else in the flat buffer (none when the
 * model has none). */
static float *grad_at(ct_model *m, size_t offset, size_t count) {
  if (m->grad_place) return m->grad_place(m->grad_place_ctx, offset, count);
  return m->grads ? m->grads + offset : NULL;
}

/* Points every state entry's value/grad views (and the layers' w/g views)
 * at the flat storage. */
static void bind_state(ct_model *m) {
  for (int li = 0; li < m->n_layers; li++) {
    ct_layer *l = &m->layers[li];
    for (int k = 0; k < l->n_state; k++) {
      ct_state_decl *s = &l->state[k];
      ct_state_entry *e = &m->entries[s->entry];
      void *base;
      if (s->dtype == CT_I64)
        base = m->counters + s->offset;
      else
        base = (s->is_buffer ? m->buffers : m->params) + s->offset;
      e->value = ct_tensor_view(base, s->dtype, s->ndim, s->shape);
      /* Counters stay in host memory on a device-resident model
       * (device_state.c); NULL marks host memory. */
      e->value.device = s->dtype == CT_I64 && m->dstate ? NULL : m->dev;
      size_t n = (size_t)ct_shape_numel(s->ndim, s->shape);
      e->grad = ct_tensor_view(s->is_buffer ? NULL : grad_at(m, s->offset, n), s->dtype, s->ndim, s->shape);
      e->grad.device = m->dev;
      l->w[k] = e->value;
      l->g[k] = e->grad;
      if (s->dtype == CT_I64) l->counter = base;
    }
  }
}

void ct_model_bind_state(ct_model *m) { bind_state(m); }

/* Elements of a per-sample shape: 0 if a dimension is below 1, INT64_MAX
 * if the product overflows. */
static int64_t sample_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] <= 0) return 0;
    if (n > INT64_MAX / shape[i]) return INT64_MAX;
    n *= shape[i];
  }
  return n;
}

/* After a layer's setup: its output is neither empty nor beyond
 * CT_LAYER_MAX_NUMEL per sample, and the model's parameters so far
 * (*params) stay within CT_MODEL_MAX_PARAMS. Refused before anything is
 * allocated. */
static ct_status check_sizes(const ct_layer *l, int64_t *params) {
  char shape[96];
  int64_t n = sample_numel(l->out_ndim, l->out_shape);
  if (n == 0) return ct_error(CT_ERR_SHAPE, "output is empty for this input size");
  if (n > CT_LAYER_MAX_NUMEL) {
    ct_shape_str(l->out_ndim, l->out_shape, shape, sizeof shape);
    return ct_error(CT_ERR_SHAPE, "output %s per sample is more than %lld elements; use a smaller input or fewer channels",
                    shape, (long long)CT_LAYER_MAX_NUMEL);
  }
  for (int k = 0; k < l->n_state; k++)
    if (!l->state[k].is_buffer) *params += ct_shape_numel(l->state[k].ndim, l->state[k].shape);
  if (*params > CT_MODEL_MAX_PARAMS)
    return ct_error(CT_ERR_INVALID_ARG, "the model's parameters come to %lld with this layer, more than %lld in all",
                    (long long)*params, (long long)CT_MODEL_MAX_PARAMS);
  return CT_OK;
}

/* The f32 offset of the next parameter or buffer after n elements: a
 * multiple of CT_STATE_ALIGN bytes, as each tensor of PyTorch's caching
 * allocator is, so a parameter, its gradient and its optimizer state start
 * where cuDNN's graph engines (16 bytes), cuBLASLt's widest kernels (256)
 * and vector loads want them, whatever sizes the layers before it have. */
static size_t state_align(size_t n) {
  const size_t per = CT_STATE_ALIGN / sizeof(float);
  return (n + per - 1) / per * per;
}

/* An allocation of at least `bytes`, a whole number of CT_STATE_ALIGN
 * (aligned_alloc's rule) and never zero. */
static size_t bytes_up(size_t bytes) { return (bytes / CT_STATE_ALIGN + 1) * CT_STATE_ALIGN; }

ct_status ct_model_finish_state(ct_model *m, int ndim, const int64_t *in_shape, uint64_t seed) {
  if (m->n_layers == 0) return ct_error(CT_ERR_INVALID_ARG, "model '%s': no layers", m->name);
  m->in_ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    if (in_shape[i] <= 0 || in_shape[i] > 1 << 20)
      return ct_error(CT_ERR_INVALID_ARG, "model '%s': input dimension %d is %lld (expected 1..%d)", m->name, i,
                      (long long)in_shape[i], 1 << 20);
    m->in_shape[i] = in_shape[i];
  }
  if (sample_numel(ndim, in_shape) > CT_LAYER_MAX_NUMEL)
    return ct_error(CT_ERR_INVALID_ARG, "model '%s': the input is %lld elements per sample, more than %lld", m->name,
                    (long long)sample_numel(ndim, in_shape), (long long)CT_LAYER_MAX_NUMEL);
  int64_t params = 0;
  for (int li = 0; li < m->n_layers; li++) {
    ct_layer *l = &m->layers[li];
    for (int j = 0; j < l->n_inputs; j++) {
      int src = l->inputs[j];
      if (src >= li || src < -1)
        return ct_error(CT_ERR_INTERNAL, "model '%s': layer %d reads layer %d", m->name, li, src);
      if (src == -1) {
        l->in_ndim[j] = ndim;
        memcpy(l->in_shape[j], in_shape, (size_t)ndim * sizeof *in_shape);
      } else {
        l->in_ndim[j] = m->layers[src].out_ndim;
        memcpy(l->in_shape[j], m->layers[src].out_shape, sizeof l->in_shape[j]);
      }
    }
    l->n_state = 0;
    ct_status s = l->cls->setup(l);
    if (s == CT_OK) s = check_sizes(l, &params);
    if (s != CT_OK) {
      /* Leave the layer as before its setup (conv2d's sets the output
       * shape before its parameter check fails): ct_model_parse_file names
       * the line of the first layer without an output shape, and named the
       * next layer's line, or none, for such a failure. */
      l->out_ndim = 0;
      l->n_state = 0;
      return ct_error_wrap(s, "model '%s', layer %d (%s%s%s)", m->name, li, l->cls->kind, l->name[0] ? " " : "",
                           l->name);
    }
  }
  /* Lay out state in registration order: names are "prefix.suffix". */
  m->n_params = m->n_buffers = m->n_counters = 0;
  m->param_count = 0;
  for (int li = 0; li < m->n_layers; li++) {
    ct_layer *l = &m->layers[li];
    for (int k = 0; k < l->n_state; k++) {
      ct_state_decl *s = &l->state[k];
      char full[CT_NAME_MAX + 32];
      snprintf(full, sizeof full, "%s%s%s", l->name, l->name[0] ? "." : "", s->suffix);
      s->entry = m->n_entries;
      CT_TRY(add_entry(m, full, s->is_buffer));
      size_t n = (size_t)ct_shape_numel(s->ndim, s->shape);
      if (s->dtype == CT_I64)
        s->offset = m->n_counters, m->n_counters += n;
      else if (s->is_buffer)
        s->offset = state_align(m->n_buffers), m->n_buffers = s->offset + n;
      else
        s->offset = state_align(m->n_params), m->n_params = s->offset + n, m->param_count += n;
    }
  }
  /* One flat buffer each, its gaps zero (nothing writes them, the
   * optimizers keep them at zero). */
  size_t pb = bytes_up(m->n_params * 4), bb = bytes_up(m->n_buffers * 4), cb = bytes_up(m->n_counters * 8);
  m->params = aligned_alloc(CT_STATE_ALIGN, pb);
  m->grads = aligned_alloc(CT_STATE_ALIGN, pb);
  m->buffers = aligned_alloc(CT_STATE_ALIGN, bb);
  m->counters = aligned_alloc(CT_STATE_ALIGN, cb);
  if (!m->params || !m->grads || !m->buffers || !m->counters)
    return ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': cannot allocate %zu parameters", m->name, m->param_count);
  memset(m->params, 0, pb);
  memset(m->buffers, 0, bb);
  memset(m->grads, 0, pb);
  m->grads_clean = 1;
  m->seed = seed;
  memset(m->counters, 0, cb);
  bind_state(m);
  for (int li = 0; li < m->n_layers; li++) {
    ct_layer *l = &m->layers[li];
    if (!l->cls->init || !l->n_state) continue;
    float *st[CT_LAYER_MAX_STATE];
    int64_t *ct[CT_LAYER_MAX_STATE];
    for (int k = 0; k < l->n_state; k++) {
      st[k] = l->state[k].dtype == CT_I64 ? NULL : (float *)l->w[k].data;
      ct[k] = l->state[k].dtype == CT_I64 ? (int64_t *)l->w[k].data : NULL;
    }
    /* Each layer gets its own init stream so adding a layer does not change
     * the others' initial values. */
    l->cls->init(l, seed ^ ((uint64_t)li * 0x9E3779B97F4A7C15ull), st, ct);
  }
  return CT_OK;
}

ct_status ct_model_finish(ct_model *m, int ndim, const int64_t *in_shape, uint64_t seed) {
  CT_TRY(ct_model_finish_state(m, ndim, in_shape, seed));
  /* The definition as built, before any prepare rewrites the graph
   * (fusion): replicas and stages share it. */
  ct_model_def *d;
  ct_status s = ct_model_def_new(ndim, in_shape, m->layers, m->n_layers, seed, &d);
  if (s != CT_OK) return ct_error_wrap(s, "model '%s'", m->name);
  ct_model_def_release(m->def);
  m->def = d;
  m->def_first = 0;
  return CT_OK;
}

const char *ct_model_name(const ct_model *m) { return m->name; }

void ct_model_input_shape(const ct_model *m, int *c, int *h, int *w) {
  *c = (int)m->in_shape[0];
  *h = m->in_ndim == 3 ? (int)m->in_shape[1] : 1;
  *w = m->in_ndim == 3 ? (int)m->in_shape[2] : 1;
}

int ct_model_input_ndim(const ct_model *m) { return m->in_ndim; }

int64_t ct_model_output_size(const ct_model *m) {
  const ct_layer *l = &m->layers[m->output];
  return ct_shape_numel(l->out_ndim, l->out_shape);
}

int ct_model_state_count(const ct_model *m) { return m->n_entries; }
const ct_state_entry *ct_model_state(const ct_model *m, int i) {
  return i >= 0 && i < m->n_entries ? &m->entries[i] : NULL;
}

int ct_model_state_find(const ct_model *m, const char *name) {
  for (int i = 0; i < m->n_entries; i++)
    if (strcmp(m->entries[i].name, name) == 0) return i;
  return -1;
}

float *ct_model_params(ct_model *m, size_t *n) {
  if (n) *n = m->n_params;
  return m->params;
}

float *ct_model_grads(ct_model *m, size_t *n) {
  if (n) *n = m->n_params;
  return m->grads;
}

int64_t ct_model_param_count(const ct_model *m) { return (int64_t)m->param_count; }

size_t ct_model_state_bytes(const ct_model *m) {
  return m->n_params * 8 + m->n_buffers * 4 + m->n_counters * 8;
}

void ct_model_overwrite_grads(ct_model *m) { m->grads_clean = 1; }

ct_status ct_model_zero_grad(ct_model *m) {
  if (m->dstate) {
    int64_t n = (int64_t)m->n_params;
    ct_tensor g = ct_tensor_view(m->grads, CT_F32, 1, &n);
    g.device = m->dev;
    /* (no buffer: the gradients are a strategy's, ZeRO-2) */
    if (n && m->grads) CT_TRY(ct_device_backend(m->dev)->fill(m->dev, &g, 0.0f));
    m->grads_clean = 1;
    return CT_OK;
  }
  memset(m->grads, 0, m->n_params * sizeof(float));
  m->grads_clean = 1;
  return CT_OK;
}
