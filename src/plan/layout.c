/* Activation layout choice (see layout.h). */
#include "plan/layout.h"
#include "plan/fuse.h"

#include <string.h>

/* Layers whose output takes the layout of their inputs (all of them). An
 * average pool that counts padding under ceil_mode can reach past the
 * declared padding, where the cpu backend's exact result comes from the
 * reference kernel, which reads NCHW only; such a pool stays plain. */
static int keeps_layout(const ct_layer *l) {
  if (l->cls == &ct_layer_avgpool2d) return !(l->ip[6] && l->ip[7]);
  return l->cls == &ct_layer_maxpool2d || l->cls == &ct_layer_activation || l->cls == &ct_layer_batchnorm ||
         l->cls == &ct_layer_add;
}

/* Readers that take their input in any layout: convolutions, and global
 * adaptive pooling (a 1x1 output, plain, which for one pixel is the same
 * bytes in every layout; the backends read its input as it lies). */
static int reads_any_layout(const ct_layer *l) {
  if (l->cls == &ct_layer_adaptive_avgpool2d || l->cls == &ct_layer_adaptive_maxpool2d)
    return l->out_shape[1] == 1 && l->out_shape[2] == 1;
  return l->cls == &ct_layer_conv2d;
}

/* A max pool that reads `want` while its output is plain (the backend's
 * maxpool_to_plain). */
static int pools_to_plain(const ct_layer *l, int to_plain) { return to_plain && l->cls == &ct_layer_maxpool2d; }

static int candidate(const ct_model *m, int i, ct_layout want, unsigned dtypes) {
  const ct_layer *l = &m->layers[i];
  ct_dtype dt = m->act_dt ? m->act_dt[i] : CT_F32;
  if (!(l->cls == &ct_layer_conv2d || keeps_layout(l)) || i == m->output || l->out_ndim != 3) return 0;
  if (!(dtypes >> dt & 1u)) return 0;
  if (want == CT_LAYOUT_C16) return l->out_shape[0] % 16 == 0;
  if (want == CT_LAYOUT_C8) return l->out_shape[0] % 8 == 0;
  return want == CT_LAYOUT_NHWC;
}

void ct_model_choose_layouts_for(const ct_model *m, ct_layout want, unsigned dtypes, unsigned pool_to_plain, int *lay) {
  int L = m->n_layers;
  const int to_plain = (int)(pool_to_plain >> want & 1u);
  for (int i = 0; i < L; i++) lay[i] = candidate(m, i, want, dtypes);
  /* Drop a chosen output while some reader or its own input disagrees;
   * each round only clears flags, so this ends within L rounds. */
  for (int changed = 1; changed;) {
    changed = 0;
    for (int i = 0; i < L; i++) {
      if (!lay[i]) continue;
      const ct_layer *l = &m->layers[i];
      int ok = 1;
      if (keeps_layout(l))
        for (int j = 0; j < l->n_inputs; j++) ok = ok && l->inputs[j] >= 0 && lay[l->inputs[j]];
      for (int k = 0; ok && k < L; k++) {
        const ct_layer *r = &m->layers[k];
        for (int j = 0; j < r->n_inputs; j++)
          if (r->inputs[j] == i && !reads_any_layout(r) && !(keeps_layout(r) && lay[k]) && !pools_to_plain(r, to_plain))
            ok = 0;
      }
      if (!ok) lay[i] = 0, changed = 1;
    }
  }
  /* A folded ReLU is a view of its producer's output. */
  for (int i = 0; i < L; i++)
    if (ct_layer_is_fused(&m->layers[i])) lay[i] = lay[m->layers[i].inputs[0]];
  for (int i = 0; i < L; i++) lay[i] = lay[i] ? (int)want : (int)CT_LAYOUT_PLAIN;
}

ct_status ct_model_choose_layouts(const ct_model *m, int *lay) {
  const ct_backend *be = ct_device_backend(m->dev);
  ct_layout want = CT_LAYOUT_PLAIN;
  if (m->memory_format == CT_MEMORY_FORMAT_AUTO) want = be->act_layout;
  if (m->memory_format == CT_MEMORY_FORMAT_CHANNELS_LAST) {
    if (!(be->act_layouts >> CT_LAYOUT_NHWC & 1u))
      return ct_error(CT_ERR_UNSUPPORTED,
                      "model '%s': memory format channels-last: the %s backend of this build keeps activations "
                      "NCHW only; use --memory-format auto or contiguous",
                      m->name, be->name);
    want = CT_LAYOUT_NHWC;
  }
  ct_model_choose_layouts_for(m, want, be->act_layout_dtypes, be->maxpool_to_plain, lay);
  return CT_OK;
}

ct_status ct_model_set_memory_format(ct_model *m, ct_memory_format f) {
  if (f != CT_MEMORY_FORMAT_AUTO && f != CT_MEMORY_FORMAT_CONTIGUOUS && f != CT_MEMORY_FORMAT_CHANNELS_LAST)
    return ct_error(CT_ERR_INVALID_ARG, "model '%s': memory format %d is not one of auto, contiguous, channels-last",
                    m->name, (int)f);
  m->memory_format = f;
  return CT_OK;
}

static const char *const names[] = {"auto", "contiguous", "channels-last"};

const char *ct_memory_format_name(ct_memory_format f) {
  return (unsigned)f < sizeof names / sizeof *names ? names[f] : "?";
}

ct_status ct_memory_format_parse(const char *s, ct_memory_format *out) {
  static const struct {
    const char *text;
    ct_memory_format f;
  } known[] = {{"auto", CT_MEMORY_FORMAT_AUTO},
               {"contiguous", CT_MEMORY_FORMAT_CONTIGUOUS},
               {"nchw", CT_MEMORY_FORMAT_CONTIGUOUS},
               {"channels-last", CT_MEMORY_FORMAT_CHANNELS_LAST},
               {"channels_last", CT_MEMORY_FORMAT_CHANNELS_LAST},
               {"nhwc", CT_MEMORY_FORMAT_CHANNELS_LAST}};
  for (size_t i = 0; s && i < sizeof known / sizeof *known; i++)
    if (!strcmp(s, known[i].text)) return *out = known[i].f, CT_OK;
  return ct_error(CT_ERR_INVALID_ARG, "memory format '%s': expected auto, contiguous or channels-last", s ? s : "");
}
