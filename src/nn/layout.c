/* Activation layout choice (see layout.h). */
#include "nn/layout.h"
#include "nn/fuse.h"

static int enabled = 1;
void ct_layout_set_enabled(int on) { enabled = on; }

/* Layers whose output takes the layout of their inputs (all of them). The
 * own CUDA average-pooling kernels read NHWC; oneDNN's path for C16 is only
 * wired for max pooling, so average pooling keeps C16's rules as they were.
 * The cpu backend's batch norm (f32) and the elementwise residual add take
 * C16; the CUDA batch-norm kernels read NCHW only. */
static int keeps_layout(const ct_layer *l, ct_layout want) {
  return l->cls == &ct_layer_maxpool2d || l->cls == &ct_layer_activation ||
         (want == CT_LAYOUT_NHWC && l->cls == &ct_layer_avgpool2d) ||
         (want == CT_LAYOUT_C16 && (l->cls == &ct_layer_batchnorm || l->cls == &ct_layer_add));
}

static int candidate(const ct_model *m, int i, ct_layout want) {
  const ct_layer *l = &m->layers[i];
  ct_dtype dt = m->act_dt ? m->act_dt[i] : CT_F32;
  if (!(l->cls == &ct_layer_conv2d || keeps_layout(l, want)) || i == m->output || l->out_ndim != 3) return 0;
  /* The cpu batch norm's fast loops are f32 (bf16 widens through the
   * reference, which reads NCHW). */
  if (want == CT_LAYOUT_C16 && l->cls == &ct_layer_batchnorm && dt != CT_F32) return 0;
  if (want == CT_LAYOUT_C16) return l->out_shape[0] % 16 == 0 && (dt == CT_F32 || dt == CT_BF16);
  if (want == CT_LAYOUT_NHWC) return dt == CT_F32 || dt == CT_BF16 || dt == CT_F16;
  return 0;
}

void ct_model_choose_layouts_for(const ct_model *m, ct_layout want, int *lay) {
  int L = m->n_layers;
  for (int i = 0; i < L; i++) lay[i] = candidate(m, i, want);
  /* Drop a chosen output while some reader or its own input disagrees;
   * each round only clears flags, so this ends within L rounds. */
  for (int changed = 1; changed;) {
    changed = 0;
    for (int i = 0; i < L; i++) {
      if (!lay[i]) continue;
      const ct_layer *l = &m->layers[i];
      int ok = 1;
      if (keeps_layout(l, want))
        for (int j = 0; j < l->n_inputs; j++) ok = ok && l->inputs[j] >= 0 && lay[l->inputs[j]];
      for (int k = 0; ok && k < L; k++) {
        const ct_layer *r = &m->layers[k];
        for (int j = 0; j < r->n_inputs; j++)
          if (r->inputs[j] == i && r->cls != &ct_layer_conv2d && !(keeps_layout(r, want) && lay[k])) ok = 0;
      }
      if (!ok) lay[i] = 0, changed = 1;
    }
  }
  /* A folded ReLU is a view of its producer's output. */
  for (int i = 0; i < L; i++)
    if (ct_layer_is_fused(&m->layers[i])) lay[i] = lay[m->layers[i].inputs[0]];
  for (int i = 0; i < L; i++) lay[i] = lay[i] ? (int)want : (int)CT_LAYOUT_PLAIN;
}

void ct_model_choose_layouts(const ct_model *m, int *lay) {
  ct_model_choose_layouts_for(m, enabled ? ct_device_backend(m->dev)->act_layout : CT_LAYOUT_PLAIN, lay);
}
