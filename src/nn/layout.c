/* Activation layout choice (see layout.h). */
#include "nn/layout.h"
#include "nn/fuse.h"

static int enabled = 1;
void ct_layout_set_enabled(int on) { enabled = on; }

/* Layers whose output takes the layout of their (single) input. */
static int keeps_layout(const ct_layer *l) {
  return l->cls == &ct_layer_maxpool2d || l->cls == &ct_layer_activation;
}

static int candidate(const ct_model *m, int i) {
  const ct_layer *l = &m->layers[i];
  ct_dtype dt = m->act_dt ? m->act_dt[i] : CT_F32;
  return (l->cls == &ct_layer_conv2d || keeps_layout(l)) && i != m->output && l->out_ndim == 3 &&
         l->out_shape[0] % 16 == 0 && (dt == CT_F32 || dt == CT_BF16);
}

void ct_model_choose_layouts(const ct_model *m, int *c16) {
  int L = m->n_layers;
  const ct_backend *be = ct_device_backend(m->dev);
  for (int i = 0; i < L; i++) c16[i] = enabled && be->c16_layouts && candidate(m, i);
  /* Drop a C16 output while some reader or its own input disagrees; each
   * round only clears flags, so this ends within L rounds. */
  for (int changed = 1; changed;) {
    changed = 0;
    for (int i = 0; i < L; i++) {
      if (!c16[i]) continue;
      const ct_layer *l = &m->layers[i];
      int ok = !keeps_layout(l) || (l->inputs[0] >= 0 && c16[l->inputs[0]]);
      for (int k = 0; ok && k < L; k++) {
        const ct_layer *r = &m->layers[k];
        for (int j = 0; j < r->n_inputs; j++)
          if (r->inputs[j] == i && r->cls != &ct_layer_conv2d && !(keeps_layout(r) && c16[k])) ok = 0;
      }
      if (!ok) c16[i] = 0, changed = 1;
    }
  }
  /* A folded ReLU is a view of its producer's output. */
  for (int i = 0; i < L; i++)
    if (ct_layer_is_fused(&m->layers[i])) c16[i] = c16[m->layers[i].inputs[0]];
}
