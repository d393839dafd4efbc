/* The passes of a bound model: forward, backward (with the recompute
 * forwards of dropped activations, plan/recompute.h) and the output
 * gradient, all inside the arena of the plan exec_plan.c built. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amp/amp_model.h"
#include "backend/device_impl.h"
#include "exec/exec_impl.h"

static void *at(ct_model *m, int id) { return id < 0 ? NULL : (char *)m->arena + m->plan->bufs[id].offset; }

/* Buffer `id`, or in the backward phase its recompute twin when it has one. */
static void *at2(ct_model *m, int id, int id_rc, int late) { return at(m, late && id_rc >= 0 ? id_rc : id); }

/* Points every layer's runtime tensors into the arena for batch n. late:
 * the backward phase, where a dropped output, its workspace and its layer's
 * cast inputs are the recompute's buffers. */
static void bind(ct_model *m, ct_exec_bufs *b, const ct_tensor *x, int64_t n, int late) {
  ct_exec_shape_tensors(m, n);
  for (int i = 0; i < m->n_layers; i++) {
    ct_layer *l = &m->layers[i];
    l->y.data = b->root[i] == i ? at2(m, b->act[i], b->act_rc[i], late) : NULL;
    l->dy.data = at(m, b->grad[i]);
    l->ws = at2(m, b->ws[i], b->ws_rc[i], late);
  }
  for (int i = 0; i < m->n_layers; i++) {
    ct_layer *l = &m->layers[i];
    if (b->root[i] != i || b->act[i] < 0) l->y.data = l->inputs[0] >= 0 ? m->layers[b->root[i]].y.data : x->data;
    for (int j = 0; j < l->n_inputs; j++) {
      int src = l->inputs[j], e = 2 * i + j;
      l->x[j].data = src < 0 ? x->data : m->layers[src].y.data;
      l->dx[j].data = b->tmp[e] >= 0 ? at(m, b->tmp[e]) : src < 0 ? at(m, b->in_grad) : m->layers[src].dy.data;
      l->dx_acc[j] = b->tmp[e] == CT_EXEC_DX_ACC;
      if (b->xcast[e] >= 0) l->x[j].data = at2(m, b->xcast[e], b->xcast_rc[e], late);
      if (b->dxcast[e] >= 0) l->dx[j].data = at(m, b->dxcast[e]);
    }
  }
  if (b->in_grad >= 0) {
    m->in_grad = ct_tensor_view(at(m, b->in_grad), CT_F32, 1, &n);
    ct_layer_batch_shape(&m->in_grad, n, m->in_ndim, m->in_shape);
    m->in_grad.device = m->dev;
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

void ct_exec_pass_workspace(ct_model *m, int i, int pass, ct_exec *e) {
  const ct_backend *be = ct_device_backend(m->dev);
  const int id = pass >= 0 && m->eb->pws ? m->eb->pws[3 * i + pass] : -1;
  e->pass_ws = id >= 0 ? at(m, id) : NULL;
  e->pass_ws_bytes = id >= 0 ? m->plan->bufs[id].bytes : 0;
  if (be->set_workspace) be->set_workspace(m->dev, e->pass_ws, e->pass_ws_bytes);
}

/* The tensor input edge j of layer l reads from (before any cast). */
static ct_tensor edge_source(const ct_model *m, const ct_layer *l, int j, const ct_tensor *x) {
  ct_tensor t = l->x[j];
  int src = l->inputs[j];
  t.dtype = ct_exec_src_dt(m, src);
  t.layout = ct_exec_layout(m, src);
  t.data = src < 0 ? x->data : m->layers[src].y.data;
  return t;
}

/* Points layer i's weights at its low-precision copy `id` (a plan buffer;
 * none: nothing to do) and casts the fp32 weights into it when cast. */
static ct_status low_weights(ct_model *m, int i, int id, int cast) {
  return id < 0 ? CT_OK : ct_amp_layer_copy(m, i, at(m, id), cast);
}

/* Layer i's forward: its low-precision weight copy (a recompute forward
 * casts the backward's; an inference plan's copy outlives the step and is
 * cast again only after the weights changed), its cast inputs, then the
 * layer. */
static ct_status forward_layer(ct_model *m, int i, ct_exec *e, const ct_tensor *x) {
  ct_layer *l = &m->layers[i];
  const ct_exec_bufs *b = m->eb;
  ct_status s = CT_OK;
  if (b->lpw)
    s = e->recompute ? low_weights(m, i, b->lpw_bwd[i], 1) : low_weights(m, i, b->lpw[i], m->training_plan || m->lp_dirty);
  for (int j = 0; j < l->n_inputs && s == CT_OK; j++)
    if (m->eb->xcast[2 * i + j] >= 0) {
      ct_tensor src = edge_source(m, l, j, x);
      s = e->be->cast(e->dev, &src, &l->x[j]);
    }
  if (s == CT_OK) {
    ct_exec_pass_workspace(m, i, e->recompute ? CT_PASS_RC : CT_PASS_FWD, e);
    s = l->cls->forward(l, e);
    ct_exec_pass_workspace(m, i, -1, e);
  }
  if (s != CT_OK)
    return ct_error_wrap(s, "model '%s', %s of layer %d (%s %s)", m->name, e->recompute ? "recompute forward" : "forward",
                         i, l->cls->kind, l->name);
  return CT_OK;
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
  if (x->dtype != m->in_dt || x->layout != m->in_layout)
    return ct_error(CT_ERR_INVALID_ARG, "model '%s': input must be %s%s, got %s%s", m->name, ct_dtype_name(m->in_dt),
                    m->in_layout == CT_LAYOUT_NHWC ? " channels-last" : "",
                    ct_dtype_name(x->dtype) ? ct_dtype_name(x->dtype) : "?",
                    x->layout == CT_LAYOUT_PLAIN ? "" : x->layout == CT_LAYOUT_NHWC ? " channels-last" : " blocked");
  ct_exec_bufs *b = m->eb;
  bind(m, b, x, n, 0);
  ct_exec e = {m->dev, ct_device_backend(m->dev), training, n, m->seed, step, 0, NULL, 0, m->sample_offset,
               m->sample_stride, m->norm_sync};
  for (int i = 0; i < m->n_layers; i++) CT_TRY(forward_layer(m, i, &e, x));
  m->lp_dirty = 0;
  m->input = *x;
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

/* Calls hook with the span of layer l's parameters in the flat buffer
 * (they are laid out in layer order: one contiguous span). */
static ct_status grads_span(ct_model *m, const ct_layer *l, ct_model_grad_hook hook) {
  size_t lo = SIZE_MAX, hi = 0;
  for (int k = 0; k < l->n_state; k++) {
    const ct_state_decl *d = &l->state[k];
    if (d->is_buffer || d->dtype != CT_F32) continue;
    size_t n = (size_t)ct_shape_numel(d->ndim, d->shape);
    if (d->offset < lo) lo = d->offset;
    if (d->offset + n > hi) hi = d->offset + n;
  }
  return lo < hi ? hook(m->grad_hook_ctx, l->index, lo, hi - lo) : CT_OK;
}

void ct_model_set_sample_span(ct_model *m, int64_t offset, int64_t stride) {
  m->sample_offset = offset;
  m->sample_stride = stride;
}

void ct_model_set_norm_sync(ct_model *m, ct_norm_sync *sync) { m->norm_sync = sync; }

void ct_model_set_grad_hooks(ct_model *m, ct_model_grad_hook need, ct_model_grad_hook final, void *ctx) {
  m->grad_need = need;
  m->grad_hook = final;
  m->grad_hook_ctx = ctx;
}

ct_status ct_model_set_input_grad(ct_model *m, int on) {
  m->want_input_grad = on != 0;
  return CT_OK;
}

ct_status ct_model_input_grad(ct_model *m, ct_tensor *dx) {
  if (!m->arena || m->eb->in_grad < 0)
    return ct_error(CT_ERR_INVALID_ARG, "model '%s': no input gradient (call ct_model_set_input_grad before a training "
                    "ct_model_prepare)", m->name);
  *dx = m->in_grad;
  return CT_OK;
}

ct_status ct_model_backward(ct_model *m, const ct_tensor *dout) {
  if (!m->has_forward)
    return ct_error(CT_ERR_INVALID_ARG, "model '%s': backward needs a training forward pass first", m->name);
  ct_exec_bufs *b = m->eb;
  ct_layer *o = &m->layers[m->output];
  if (ct_tensor_numel(dout) != ct_tensor_numel(&o->y))
    return ct_error(CT_ERR_SHAPE, "model '%s': output gradient has %lld elements, output has %lld", m->name,
                    (long long)ct_tensor_numel(dout), (long long)ct_tensor_numel(&o->y));
  ct_exec e = {m->dev, ct_device_backend(m->dev), 1, m->last_batch, m->seed, m->last_step, 0, NULL, 0, m->sample_offset,
               m->sample_stride, m->norm_sync};
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
  const ct_timeline *tl = &b->tl;
  /* Recompute: dropped outputs (and whatever reads them) now live in the
   * recompute buffers; the dropped layers due before layer i's backward
   * (a whole segment's, or one cheap layer's) run forward again first, in
   * layer order. */
  if (tl->n_rerun) bind(m, b, &m->input, m->last_batch, 1);
  ct_exec rc = e;
  rc.recompute = 1;
  int next = 0; /* into tl->order, the recomputes in the order they run */
  for (int i = m->n_layers - 1; i >= 0; i--) {
    ct_layer *l = &m->layers[i];
    for (; next < tl->n_rerun && tl->rc_at[tl->order[next]] == i; next++)
      CT_TRY(forward_layer(m, tl->order[next], &rc, &m->input));
    l->grad_beta = beta;
    /* backward-data's copy of the weights (a recompute forward cast it) */
    if (b->lpw && !tl->rerun[i]) CT_TRY(low_weights(m, i, b->lpw_bwd[i], 1));
    if (m->grad_need && l->n_state) CT_TRY(grads_span(m, l, m->grad_need));
    ct_exec_pass_workspace(m, i, CT_PASS_BWD, &e);
    ct_status s = l->cls->backward(l, &e);
    ct_exec_pass_workspace(m, i, -1, &e);
    if (s != CT_OK) return ct_error_wrap(s, "model '%s', backward of layer %d (%s %s)", m->name, i, l->cls->kind, l->name);
    for (int j = 0; j < l->n_inputs; j++) {
      /* The producer's gradient (the model input's for a stage). */
      ct_tensor *sdy = l->inputs[j] >= 0 ? &m->layers[l->inputs[j]].dy : b->in_grad >= 0 ? &m->in_grad : NULL;
      if (!sdy) continue;
      if (b->dxcast[2 * i + j] >= 0) {
        /* Back into the producer's dtype: straight into its gradient when
         * this is its first writer, else through the temporary. */
        ct_tensor to = *sdy;
        ct_layer_batch_shape(&to, m->last_batch, l->in_ndim[j], l->in_shape[j]);
        if (b->tmp[2 * i + j] >= 0) to.data = at(m, b->tmp[2 * i + j]);
        CT_TRY(e.be->cast(e.dev, &l->dx[j], &to));
        if (b->tmp[2 * i + j] >= 0) {
          ct_tensor acc = to;
          acc.data = sdy->data;
          CT_TRY(e.be->add(e.dev, &acc, &to, CT_ACT_NONE, &acc));
        }
      } else if (b->tmp[2 * i + j] >= 0) {
        CT_TRY(e.be->add(e.dev, sdy, &l->dx[j], CT_ACT_NONE, sdy));
      }
    }
    if (m->grad_hook && l->n_state) CT_TRY(grads_span(m, l, m->grad_hook));
  }
  m->grads_clean = 0;
  m->has_forward = 0;
  return CT_OK;
}

ct_status ct_model_output_grad(ct_model *m, ct_tensor *dout) {
  if (!m->has_forward) return ct_error(CT_ERR_INVALID_ARG, "model '%s': no training forward pass to take a gradient of", m->name);
  *dout = m->eb->out32 >= 0 ? m->dout32 : m->layers[m->output].dy;
  return CT_OK;
}

ct_status ct_model_rerun_layer(ct_model *m, int i, int backward) {
  if (i < 0 || i >= m->n_layers) return ct_error(CT_ERR_INVALID_ARG, "model '%s': no layer %d", m->name, i);
  if (!m->arena || !m->training_plan || !m->last_batch)
    return ct_error(CT_ERR_INVALID_ARG, "model '%s': rerunning a layer needs a training step first", m->name);
  ct_layer *l = &m->layers[i];
  ct_exec e = {m->dev, ct_device_backend(m->dev), 1, m->last_batch, m->seed, 0, 0, NULL, 0, m->sample_offset,
               m->sample_stride, m->norm_sync};
  if (backward) l->grad_beta = 1.0f;
  /* Each pass as the step runs it: with its planned workspace. */
  ct_exec_pass_workspace(m, i, backward ? CT_PASS_BWD : CT_PASS_FWD, &e);
  ct_status s = backward ? l->cls->backward(l, &e) : l->cls->forward(l, &e);
  ct_exec_pass_workspace(m, i, -1, &e);
  return s;
}
