/* Binding a model to a device: the memory plan of a step, and the forward
 * and backward passes that run inside it.
 *
 * Timeline: forward of layer i at time i, backward of layer i at time
 * 2L-1-i. Each layer output is one activation buffer (flatten shares its
 * input's), alive from its forward until its last reader: a consumer's
 * forward, a consumer's backward that reads its input, or its own backward
 * when that reads the output. Each output also has a gradient buffer alive
 * from the backward of its last consumer to its own backward; when several
 * consumers send gradients back (residual connections), all but the first
 * write to a temporary that is added in. */
#include <stdlib.h>
#include <string.h>

#include "core/device_impl.h"
#include "nn/device_state.h"
#include "nn/model_impl.h"
#include "nn/fuse.h"
#include "nn/layout.h"

static int saves_input(const ct_layer *l) {
  if (l->cls == &ct_layer_activation) return CT_ACT_BWD_NEEDS_X(l->act);
  return (l->cls->flags & CT_LAYER_SAVES_INPUT) != 0;
}

static int saves_output(const ct_layer *l) {
  if (l->cls == &ct_layer_activation) return CT_ACT_BWD_NEEDS_Y(l->act);
  if (l->act != CT_ACT_NONE) return 1; /* fused activation: backward reads y */
  return (l->cls->flags & CT_LAYER_SAVES_OUTPUT) != 0;
}

void ct_exec_bufs_free(ct_exec_bufs *b) {
  free(b->act), free(b->root), free(b->grad), free(b->ws), free(b->tmp), free(b->xcast), free(b->dxcast), free(b->layout);
  memset(b, 0, sizeof *b);
}

/* The dtype of layer i's output (f32 unless the precision policy chose
 * another), and of the producer of input edge j (-1 = the model input). */
static ct_dtype out_dt(const ct_model *m, int i) { return m->act_dt ? m->act_dt[i] : CT_F32; }
static ct_dtype src_dt(const ct_model *m, int src) { return src < 0 ? CT_F32 : out_dt(m, src); }
/* Input edge j of layer i needs a cast into the layer's dtype. */
static int edge_cast(const ct_model *m, int i, int j) {
  return src_dt(m, m->layers[i].inputs[j]) != out_dt(m, i);
}

static size_t act_bytes(const ct_model *m, const ct_layer *l, int64_t n) {
  return (size_t)(n * ct_shape_numel(l->out_ndim, l->out_shape)) * ct_dtype_size(out_dt(m, l->index));
}

static ct_layout layout_of(const ct_model *m, int i) {
  return i >= 0 ? (ct_layout)m->eb.layout[i] : CT_LAYOUT_PLAIN;
}

/* Sets every layer's x/y descriptors to batch n (data pointers later). */
static void shape_tensors(ct_model *m, int64_t n) {
  for (int i = 0; i < m->n_layers; i++) {
    ct_layer *l = &m->layers[i];
    for (int j = 0; j < l->n_inputs; j++) {
      /* A cast copy keeps its source's element order (casts are elementwise). */
      l->x[j].layout = l->dx[j].layout = layout_of(m, l->inputs[j]);
      l->x[j].dtype = l->dx[j].dtype = out_dt(m, i);
      ct_layer_batch_shape(&l->x[j], n, l->in_ndim[j], l->in_shape[j]);
      ct_layer_batch_shape(&l->dx[j], n, l->in_ndim[j], l->in_shape[j]);
      l->x[j].device = l->dx[j].device = m->dev;
    }
    l->y.layout = l->dy.layout = layout_of(m, i);
    l->y.dtype = l->dy.dtype = out_dt(m, i);
    ct_layer_batch_shape(&l->y, n, l->out_ndim, l->out_shape);
    ct_layer_batch_shape(&l->dy, n, l->out_ndim, l->out_shape);
    l->y.device = l->dy.device = m->dev;
  }
}

ct_status ct_model_prepare(ct_model *m, ct_device *dev, int64_t max_batch, int training) {
  if (max_batch <= 0) return ct_error(CT_ERR_INVALID_ARG, "model '%s': batch size must be positive", m->name);
  /* A resident model first brings its state home; the plan below is
   * built on the host buffers and moved again at the end. */
  ct_model_device_release(m);
  if (m->arena) ct_device_free(m->dev, m->arena);
  m->arena = NULL;
  ct_plan_free(&m->plan);
  ct_plan_init(&m->plan);
  m->dev = dev;
  m->max_batch = max_batch;
  m->training_plan = training;
  m->has_forward = 0;
  for (int i = 0; i < m->n_entries; i++) m->entries[i].value.device = m->entries[i].grad.device = dev;
  for (int i = 0; i < m->n_layers; i++)
    for (int k = 0; k < m->layers[i].n_state; k++) m->layers[i].w[k].device = m->layers[i].g[k].device = dev;
  ct_model_fuse(m);
  CT_TRY(ct_amp_model_plan(m));
  ct_amp_model_bind_weights(m);

  ct_exec_bufs *b = &m->eb;
  ct_exec_bufs_free(b);
  int L = m->n_layers;
  b->act = malloc(sizeof(int) * (size_t)L);
  b->root = malloc(sizeof(int) * (size_t)L);
  b->grad = malloc(sizeof(int) * (size_t)L);
  b->ws = malloc(sizeof(int) * (size_t)L);
  b->tmp = malloc(sizeof(int) * (size_t)L * 2);
  b->xcast = malloc(sizeof(int) * (size_t)L * 2);
  b->dxcast = malloc(sizeof(int) * (size_t)L * 2);
  b->layout = malloc(sizeof(int) * (size_t)L);
  b->out32 = b->dout32 = -1;
  int *last = malloc(sizeof(int) * (size_t)L);
  int *gfirst = malloc(sizeof(int) * (size_t)L);
  if (!b->act || !b->root || !b->grad || !b->ws || !b->tmp || !b->xcast || !b->dxcast || !b->layout || !last || !gfirst) {
    free(last), free(gfirst);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': out of host memory", m->name);
  }
  const int T = 2 * L; /* end of the step */
  ct_status ls = ct_model_choose_layouts(m, b->layout);
  if (ls != CT_OK) {
    free(last), free(gfirst);
    return ls;
  }
  shape_tensors(m, max_batch);
  for (int i = 0; i < L; i++) {
    ct_layer *l = &m->layers[i];
    int alias = (l->cls->flags & CT_LAYER_ALIAS) && l->inputs[0] >= 0;
    b->root[i] = alias ? b->root[l->inputs[0]] : i;
    last[i] = i;
    gfirst[i] = T;
    b->xcast[2 * i] = b->xcast[2 * i + 1] = b->dxcast[2 * i] = b->dxcast[2 * i + 1] = -1;
  }
  /* Lifetimes of activation roots. */
  for (int i = 0; i < L; i++) {
    ct_layer *l = &m->layers[i];
    for (int j = 0; j < l->n_inputs; j++) {
      int src = l->inputs[j];
      if (src < 0) continue;
      int r = b->root[src];
      /* A cast edge reads its source once, at the forward; the backward
       * reads the cast copy. */
      int t = training && saves_input(l) && !edge_cast(m, i, j) ? T - 1 - i : i;
      if (t > last[r]) last[r] = t;
      int gt = T - 1 - i;
      if (gt < gfirst[src]) gfirst[src] = gt;
    }
    if (training && saves_output(l) && T - 1 - i > last[b->root[i]]) last[b->root[i]] = T - 1 - i;
  }
  int out_root = b->root[m->output];
  /* The loss reads the output after forward, and model.h promises callers
   * it stays valid until the next forward: keep it out of backward's reuse. */
  last[out_root] = T;
  for (int i = 0; i < L; i++) {
    ct_layer *l = &m->layers[i];
    /* An alias of the model input (flatten first) has no buffer of its own:
     * bind() points it at the input. */
    int input_alias = (l->cls->flags & CT_LAYER_ALIAS) && l->inputs[0] < 0;
    b->act[i] = b->root[i] == i && !input_alias ? ct_plan_add(&m->plan, act_bytes(m, l, max_batch), i, last[i]) : -1;
    b->grad[i] = b->ws[i] = b->tmp[2 * i] = b->tmp[2 * i + 1] = -1;
    if (!training) continue;
    int gf = i == m->output ? L - 1 : gfirst[i];
    if (gf <= T - 1 - i) b->grad[i] = ct_plan_add(&m->plan, act_bytes(m, l, max_batch), gf, T - 1 - i);
    if (l->cls->workspace_bytes) {
      size_t wsb = l->cls->workspace_bytes(l, &(ct_exec){dev, ct_device_backend(dev), 1, max_batch, 0, 0});
      if (wsb) b->ws[i] = ct_plan_add(&m->plan, wsb, i, T - 1 - i);
    }
  }
  /* Mixed precision: a copy of each input the layer reads in another
   * dtype (kept to the backward when the layer reads its input there), its
   * gradient in the layer's dtype, and fp32 copies of the output and of its
   * gradient for the loss. None of these exist under O0. */
  for (int i = 0; i < L; i++) {
    ct_layer *l = &m->layers[i];
    for (int j = 0; j < l->n_inputs; j++) {
      if (!edge_cast(m, i, j)) continue;
      size_t bytes = (size_t)ct_tensor_nbytes(&l->x[j]);
      b->xcast[2 * i + j] = ct_plan_add(&m->plan, bytes, i, training && saves_input(l) ? T - 1 - i : i);
      if (training && l->inputs[j] >= 0) b->dxcast[2 * i + j] = ct_plan_add(&m->plan, bytes, T - 1 - i, T - 1 - i);
    }
  }
  if (out_dt(m, m->output) != CT_F32) {
    const ct_layer *o = &m->layers[m->output];
    size_t bytes = (size_t)(max_batch * ct_shape_numel(o->out_ndim, o->out_shape)) * sizeof(float);
    b->out32 = ct_plan_add(&m->plan, bytes, L - 1, training ? L : T);
    if (training) b->dout32 = ct_plan_add(&m->plan, bytes, L - 1, L);
  }
  /* Temporaries for the second and later gradient writers of one output,
   * and a scratch dx for batch norm layers reading the model input. */
  if (training) {
    int *seen = calloc((size_t)L + 1, sizeof(int));
    if (!seen) {
      free(last), free(gfirst);
      return ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': out of host memory", m->name);
    }
    for (int i = L - 1; i >= 0; i--) {
      ct_layer *l = &m->layers[i];
      for (int j = 0; j < l->n_inputs; j++) {
        int src = l->inputs[j];
        /* In the producer's dtype: a cast edge's gradient is cast into it. */
        size_t bytes = (size_t)ct_tensor_numel(&l->x[j]) * ct_dtype_size(src_dt(m, src));
        if (src < 0) {
          if (l->cls == &ct_layer_batchnorm) b->tmp[2 * i + j] = ct_plan_add(&m->plan, bytes, T - 1 - i, T - 1 - i);
          continue;
        }
        if (seen[src]++) b->tmp[2 * i + j] = ct_plan_add(&m->plan, bytes, T - 1 - i, T - 1 - i);
      }
    }
    free(seen);
  }
  free(last);
  free(gfirst);
  CT_TRY(ct_plan_solve(&m->plan));
  if (ct_model_device_resident(dev)) return ct_model_device_bind(m, dev);
  m->arena = ct_device_alloc(dev, m->plan.peak ? m->plan.peak : 64);
  if (!m->arena)
    return ct_error(CT_ERR_OUT_OF_MEMORY,
                    "model '%s': the step's memory plan needs %zu bytes for batch %lld and they cannot be allocated; try a smaller --batch-size",
                    m->name, m->plan.peak, (long long)max_batch);
  return CT_OK;
}

static void *at(ct_model *m, int id) { return id < 0 ? NULL : (char *)m->arena + m->plan.bufs[id].offset; }

/* Points every layer's runtime tensors into the arena for batch n. */
static void bind(ct_model *m, ct_exec_bufs *b, const ct_tensor *x, int64_t n) {
  shape_tensors(m, n);
  for (int i = 0; i < m->n_layers; i++) {
    ct_layer *l = &m->layers[i];
    l->y.data = b->root[i] == i ? at(m, b->act[i]) : NULL;
    l->dy.data = at(m, b->grad[i]);
    l->ws = at(m, b->ws[i]);
  }
  for (int i = 0; i < m->n_layers; i++) {
    ct_layer *l = &m->layers[i];
    if (b->root[i] != i || b->act[i] < 0) l->y.data = l->inputs[0] >= 0 ? m->layers[b->root[i]].y.data : x->data;
    for (int j = 0; j < l->n_inputs; j++) {
      int src = l->inputs[j];
      l->x[j].data = src < 0 ? x->data : m->layers[src].y.data;
      l->dx[j].data = b->tmp[2 * i + j] >= 0 ? at(m, b->tmp[2 * i + j]) : src < 0 ? NULL : m->layers[src].dy.data;
      if (b->xcast[2 * i + j] >= 0) l->x[j].data = at(m, b->xcast[2 * i + j]);
      if (b->dxcast[2 * i + j] >= 0) l->dx[j].data = at(m, b->dxcast[2 * i + j]);
    }
  }
  if (b->out32 >= 0) {
    const ct_layer *o = &m->layers[m->output];
    m->out32 = o->y;
    m->out32.dtype = CT_F32;
    m->out32.data = at(m, b->out32);
    m->dout32 = m->out32;
    m->dout32.data = at(m, b->dout32);
  }
}

/* The tensor input edge j of layer l reads from (before any cast). */
static ct_tensor edge_source(const ct_model *m, const ct_layer *l, int j, const ct_tensor *x) {
  ct_tensor t = l->x[j];
  int src = l->inputs[j];
  t.dtype = src_dt(m, src);
  t.data = src < 0 ? x->data : m->layers[src].y.data;
  return t;
}

ct_status ct_model_forward(ct_model *m, const ct_tensor *x, int training, uint32_t step, const ct_tensor **out) {
  if (!m->arena) return ct_error(CT_ERR_INVALID_ARG, "model '%s': call ct_model_prepare() before forward", m->name);
  if (training && !m->training_plan)
    return ct_error(CT_ERR_INVALID_ARG, "model '%s': prepared for inference only, cannot run a training pass", m->name);
  int64_t n = x->shape[0];
  if (x->ndim != m->in_ndim + 1 || n <= 0 || n > m->max_batch)
    return ct_error(CT_ERR_SHAPE, "model '%s': input must be [N<=%lld, ...] with %d dims, got %d dims, N=%lld",
                    m->name, (long long)m->max_batch, m->in_ndim + 1, x->ndim, (long long)n);
  for (int i = 0; i < m->in_ndim; i++)
    if (x->shape[i + 1] != m->in_shape[i]) {
      char got[64], want[64];
      return ct_error(CT_ERR_SHAPE, "model '%s': input per-sample shape %s, expected %s", m->name,
                      ct_shape_str(x->ndim - 1, x->shape + 1, got, sizeof got),
                      ct_shape_str(m->in_ndim, m->in_shape, want, sizeof want));
    }
  if (x->dtype != CT_F32) return ct_error(CT_ERR_INVALID_ARG, "model '%s': input must be f32", m->name);
  ct_exec_bufs *b = &m->eb;
  CT_TRY(ct_amp_model_refresh(m, training));
  bind(m, b, x, n);
  ct_exec e = {m->dev, ct_device_backend(m->dev), training, n, m->seed, step};
  for (int i = 0; i < m->n_layers; i++) {
    ct_layer *l = &m->layers[i];
    ct_status s = CT_OK;
    for (int j = 0; j < l->n_inputs && s == CT_OK; j++)
      if (b->xcast[2 * i + j] >= 0) {
        ct_tensor src = edge_source(m, l, j, x);
        s = e.be->cast(e.dev, &src, &l->x[j]);
      }
    if (s == CT_OK) s = l->cls->forward(l, &e);
    if (s != CT_OK) return ct_error_wrap(s, "model '%s', forward of layer %d (%s %s)", m->name, i, l->cls->kind, l->name);
  }
  m->input = x;
  m->last_batch = n;
  m->last_step = step;
  m->has_forward = training;
  *out = &m->layers[m->output].y;
  if (b->out32 >= 0) {
    CT_TRY(e.be->cast(e.dev, *out, &m->out32));
    *out = &m->out32;
  }
  return CT_OK;
}

ct_status ct_model_backward(ct_model *m, const ct_tensor *dout) {
  if (!m->has_forward)
    return ct_error(CT_ERR_INVALID_ARG, "model '%s': backward needs a training forward pass first", m->name);
  ct_exec_bufs *b = &m->eb;
  ct_layer *o = &m->layers[m->output];
  if (ct_tensor_numel(dout) != ct_tensor_numel(&o->y))
    return ct_error(CT_ERR_SHAPE, "model '%s': output gradient has %lld elements, output has %lld", m->name,
                    (long long)ct_tensor_numel(dout), (long long)ct_tensor_numel(&o->y));
  ct_exec e = {m->dev, ct_device_backend(m->dev), 1, m->last_batch, m->seed, m->last_step};
  if (b->out32 >= 0) {
    if (dout->dtype != CT_F32) return ct_error(CT_ERR_INVALID_ARG, "model '%s': output gradient must be f32", m->name);
    ct_tensor d32 = o->dy;
    d32.dtype = CT_F32;
    d32.data = dout->data;
    CT_TRY(e.be->cast(e.dev, &d32, &o->dy));
  } else if (dout->data != o->dy.data) {
    CT_TRY(ct_device_copy(m->dev, o->dy.data, m->dev, dout->data, ct_tensor_nbytes(&o->y)));
  }
  float beta = m->grads_clean ? 0.0f : 1.0f;
  for (int i = m->n_layers - 1; i >= 0; i--) {
    ct_layer *l = &m->layers[i];
    l->grad_beta = beta;
    ct_status s = l->cls->backward(l, &e);
    if (s != CT_OK) return ct_error_wrap(s, "model '%s', backward of layer %d (%s %s)", m->name, i, l->cls->kind, l->name);
    for (int j = 0; j < l->n_inputs; j++) {
      if (l->inputs[j] < 0) continue;
      ct_layer *src = &m->layers[l->inputs[j]];
      if (b->dxcast[2 * i + j] >= 0) {
        /* Back into the producer's dtype: straight into its gradient when
         * this is its first writer, else through the temporary. */
        ct_tensor to = src->dy;
        ct_layer_batch_shape(&to, m->last_batch, l->in_ndim[j], l->in_shape[j]);
        if (b->tmp[2 * i + j] >= 0) to.data = at(m, b->tmp[2 * i + j]);
        CT_TRY(e.be->cast(e.dev, &l->dx[j], &to));
        if (b->tmp[2 * i + j] >= 0) {
          ct_tensor acc = to;
          acc.data = src->dy.data;
          CT_TRY(e.be->add(e.dev, &acc, &to, &acc));
        }
      } else if (b->tmp[2 * i + j] >= 0) {
        CT_TRY(e.be->add(e.dev, &src->dy, &l->dx[j], &src->dy));
      }
    }
  }
  m->grads_clean = 0;
  m->has_forward = 0;
  return CT_OK;
}

ct_status ct_model_output_grad(ct_model *m, ct_tensor *dout) {
  if (!m->has_forward) return ct_error(CT_ERR_INVALID_ARG, "model '%s': no training forward pass to take a gradient of", m->name);
  *dout = m->eb.out32 >= 0 ? m->dout32 : m->layers[m->output].dy;
  return CT_OK;
}
