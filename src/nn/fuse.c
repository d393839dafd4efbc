/* ReLU folding (see fuse.h). Why at prepare time and not in the zoo: the
 * model keeps PyTorch's module list (state_dict names, summary rows, model
 * files) and the fusion is an execution detail of the bound step, so the
 * graph the user built stays the one they see. */
#include "nn/fuse.h"

static ct_status noop(ct_layer *l, ct_exec *e) {
  (void)l, (void)e;
  return CT_OK;
}

/* A folded ReLU: CT_LAYER_ALIAS with no inputs, so the executor gives it
 * no buffer (its y is the producer's), no gradient (nothing reads it), and
 * counts no gradient edge into the producer. kind stays "activation" for
 * the precision policy; torch_name is what the summary prints. */
static const ct_layer_class fused_relu = {"activation", "ReLU", CT_LAYER_ALIAS, NULL, NULL, NULL, noop, noop, NULL};

static int enabled = 1;
void ct_fuse_set_enabled(int on) { enabled = on; }
int ct_fuse_enabled(void) { return enabled; }

int ct_layer_is_fused(const ct_layer *l) { return l->cls == &fused_relu; }

static int can_take_act(const ct_layer *p) {
  return p->act == CT_ACT_NONE && (p->cls == &ct_layer_conv2d || p->cls == &ct_layer_linear ||
                                   p->cls == &ct_layer_batchnorm || p->cls == &ct_layer_add);
}

void ct_model_fuse(ct_model *m) {
  int L = m->n_layers;
  if (!enabled) return;
  for (int i = 0; i < L; i++) {
    ct_layer *r = &m->layers[i];
    if (r->cls != &ct_layer_activation || r->act != CT_ACT_RELU || i == m->output) continue;
    int p = r->inputs[0];
    if (p < 0 || p == m->output || !can_take_act(&m->layers[p])) continue;
    /* The producer's pre-activation output must have no other reader. */
    if (ct_model_readers(m, p) != 1) continue;
    m->layers[p].act = CT_ACT_RELU;
    for (int k = i + 1; k < L; k++)
      for (int j = 0; j < m->layers[k].n_inputs; j++)
        if (m->layers[k].inputs[j] == i) m->layers[k].inputs[j] = p;
    r->cls = &fused_relu;
    r->n_inputs = 0; /* inputs[0] stays p: the executor roots the view there */
  }
}
