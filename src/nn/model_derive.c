/* Replicas and stages: new states of a model's definition (shared, the
 * graph as built before any prepare rewrote it) with a copy of its
 * current parameters, buffers and settings, each then prepared on a
 * device of its own. */
#include <stdlib.h>
#include <string.h>

#include "nn/model_impl.h"

/* Copies every state entry of dst from the entry of src with the same
 * name, wherever src's state lives now (host or a device). */
static ct_status copy_state(ct_model *dst, const ct_model *src) {
  for (int i = 0; i < dst->n_entries; i++) {
    ct_state_entry *d = &dst->entries[i];
    int k = ct_model_state_find(src, d->name);
    if (k < 0) return ct_error(CT_ERR_INTERNAL, "model '%s': no state entry '%s' to copy", src->name, d->name);
    const ct_tensor *v = &src->entries[k].value;
    CT_TRY(ct_device_copy(NULL, d->value.data, v->device, v->data, ct_tensor_nbytes(&d->value)));
  }
  return CT_OK;
}

/* This model's layer k, or -1 for an index before it (its input). */
static int local_index(int k, int first) { return k < first ? -1 : k - first; }

/* Layers [first, last] of src (its own indices) as a new state of src's
 * definition. */
static ct_status derive(const ct_model *src, int first, int last, ct_model **out) {
  *out = NULL;
  const ct_model_def *d = src->def;
  if (!d) return ct_error(CT_ERR_INVALID_ARG, "model '%s' is not finished", src->name);
  const int f = src->def_first + first, n = last - first + 1;
  ct_model *m;
  CT_TRY(ct_model_new(src->name, &m));
  m->layers = malloc((size_t)n * sizeof *m->layers);
  if (!m->layers) {
    ct_model_free(m);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': out of host memory", src->name);
  }
  m->def = ct_model_def_retain(src->def);
  m->def_first = f;
  m->cap_layers = m->n_layers = n;
  for (int i = 0; i < n; i++) {
    ct_layer *l = &m->layers[i];
    *l = d->layers[f + i];
    l->index = i;
    l->n_state = 0;
    for (int j = 0; j < l->n_inputs; j++) l->inputs[j] = local_index(l->inputs[j], f);
  }
  m->output = n - 1;
  int ndim = d->in_ndim;
  int64_t shape[4] = {0};
  memcpy(shape, d->in_shape, sizeof d->in_shape);
  if (f > 0) {
    const ct_layer *p = &d->layers[f - 1];
    ndim = p->out_ndim;
    memcpy(shape, p->out_shape, (size_t)ndim * sizeof *shape);
  }
  ct_status s = ndim > 3 ? ct_error(CT_ERR_UNSUPPORTED, "model '%s': a stage input of %d dimensions per sample", src->name, ndim)
                         : ct_model_finish_state(m, ndim, shape, d->seed);
  if (s == CT_OK) s = copy_state(m, src);
  if (s != CT_OK) {
    ct_model_free(m);
    return s;
  }
  m->seed = src->seed;
  m->precision = src->precision;
  m->opt_level = src->opt_level;
  m->memory_format = src->memory_format;
  m->recompute = src->recompute;
  m->opt_buffers = src->opt_buffers, m->opt_values = src->opt_values;
  *out = m;
  return CT_OK;
}

ct_status ct_model_replicate(const ct_model *m, ct_model **out) { return derive(m, 0, m->n_layers - 1, out); }

int ct_model_layer_count(const ct_model *m) { return m->n_layers; }

ct_status ct_model_stage(const ct_model *m, int first, int last, ct_model **out) {
  *out = NULL;
  if (!m->def || first < 0 || last < first || last >= m->n_layers)
    return ct_error(CT_ERR_INVALID_ARG, "model '%s': stage [%d, %d] is not a range of its %d layers", m->name, first,
                    last, m->n_layers);
  const ct_layer *d = m->def->layers + m->def_first;
  /* One activation crosses each cut: the layers of the stage read only
   * each other and layer first - 1 (the model input for the first
   * stage), and the layers after it read only its last layer's output. */
  for (int i = first; i <= last; i++)
    for (int j = 0; j < d[i].n_inputs; j++) {
      int src = local_index(d[i].inputs[j], m->def_first);
      if (src < first && src != first - 1)
        return ct_error(CT_ERR_INVALID_ARG,
                        "model '%s': stage [%d, %d] cannot start at layer %d: layer %d (%s) reads %s%d, before the cut",
                        m->name, first, last, first, i, d[i].name, src < 0 ? "the model input, layer " : "layer ", src);
    }
  for (int i = last + 1; i < m->n_layers; i++)
    for (int j = 0; j < d[i].n_inputs; j++) {
      int src = local_index(d[i].inputs[j], m->def_first);
      if (src != last && src >= first - 1 && src <= last)
        return ct_error(CT_ERR_INVALID_ARG,
                        "model '%s': stage [%d, %d] cannot end at layer %d: layer %d (%s) reads layer %d inside it",
                        m->name, first, last, last, i, d[i].name, src);
      if (src < first - 1)
        return ct_error(CT_ERR_INVALID_ARG,
                        "model '%s': stage [%d, %d]: layer %d (%s) after it reads layer %d before it", m->name, first,
                        last, i, d[i].name, src);
    }
  return derive(m, first, last, out);
}
