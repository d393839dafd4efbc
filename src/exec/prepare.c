/* Binding a model to a device (see ct_model_prepare in
 * include/ctrain/model.h): the state moved home from a previous device,
 * the step's plan built (src/plan), then the arena allocated, or on a
 * device that keeps the model resident the one device block
 * (device_state.c); and the release of all of it. */
#include <stdlib.h>

#include "exec/device_state.h"
#include "plan/exec_plan.h"

ct_status ct_model_prepare(ct_model *m, ct_device *dev, int64_t max_batch, int training) {
  if (max_batch <= 0) return ct_error(CT_ERR_INVALID_ARG, "model '%s': batch size must be positive", m->name);
  /* A resident model first brings its state home; the plan below is
   * built on the host buffers and moved again at the end. */
  ct_model_device_release(m);
  if (m->arena) ct_device_free(m->dev, m->arena);
  m->arena = NULL;
  m->dev = dev;
  m->max_batch = max_batch;
  m->training_plan = training;
  m->has_forward = 0;
  for (int i = 0; i < m->n_entries; i++) m->entries[i].value.device = m->entries[i].grad.device = dev;
  for (int i = 0; i < m->n_layers; i++)
    for (int k = 0; k < m->layers[i].n_state; k++) m->layers[i].w[k].device = m->layers[i].g[k].device = dev;
  ct_status s = ct_exec_plan_build(m, dev, max_batch, training);
  /* A reservation of gradients elsewhere is for this prepare only. */
  if (s == CT_OK && ct_model_device_resident(dev)) s = ct_model_device_bind(m, dev);
  m->grads_elsewhere = 0;
  if (s != CT_OK || ct_model_device_resident(dev)) return s;
  m->arena = ct_device_alloc(dev, m->plan->peak ? m->plan->peak : 64);
  if (!m->arena)
    return ct_error(CT_ERR_OUT_OF_MEMORY,
                    "model '%s': the step's memory plan needs %zu bytes for batch %lld and they cannot be allocated; try a smaller --batch-size",
                    m->name, m->plan->peak, (long long)max_batch);
  return CT_OK;
}

size_t ct_model_plan_bytes(const ct_model *m) { return m->plan ? m->plan->peak : 0; }

void ct_model_destroy(ct_model *m) {
  if (!m) return;
  ct_model_device_release(m);
  if (m->arena) ct_device_free(m->dev, m->arena);
  if (m->eb) ct_exec_bufs_free(m->eb);
  free(m->eb);
  if (m->plan) ct_plan_free(m->plan);
  free(m->plan);
  ct_model_free(m);
}
