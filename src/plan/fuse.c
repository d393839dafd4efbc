/* ReLU folding (see fuse.h). Why at prepare time and not in the zoo: the
 * model keeps PyTorch's module list (state_dict names, summary rows, model
 * files) and the fusion is an execution detail of the bound step, so the
 * graph the user built stays the one they see. */
#include "plan/fuse.h"

static ct_status noop(ct_layer *l, ct_exec *e) {
  (void)l, (void)e;
  return CT_OK;
}

/* A folded ReLU: CT_LAYER_ALIAS with no inputs, so the executor gives it
 * no buffer (its y is the producer's), no gradient (nothing reads it), and
 * counts no gradient edge into the producer. kind stays "activation" for
 * the precision policy; torch_name is what the summary prints. */
static const ct_layer_class fused_relu = {"activation", "ReLU", CT_LAYER_ALIAS, NULL, NULL, NULL, noop, noop, NULL};

static int enabled = 1, relu_to_pool = 1;
void ct_fuse_set_enabled(int on) { enabled = on; }
int ct_fuse_enabled(void) { return enabled; }
void ct_fuse_set_relu_to_pool(int on) { relu_to_pool = on; }

int ct_layer_is_fused(const ct_layer *l) { return l->cls == &fused_relu; }

static int can_take_act(const ct_layer *p) {
  return p->act == CT_ACT_NONE && (p->cls == &ct_layer_conv2d || p->cls == &ct_layer_linear ||
                                   p->cls == &ct_layer_batchnorm || p->cls == &ct_layer_add);
}

/* 1 if an add reads layer k's output (directly or through views): its
 * gradient may then be the add's shared one (exec_plan.c, grad_alias),
 * which must not be changed in place. */
static int read_by_add(const ct_model *m, int k) {
  for (int r = k + 1; r < m->n_layers; r++) {
    const ct_layer *l = &m->layers[r];
    for (int j = 0; j < l->n_inputs; j++)
      if (l->inputs[j] == k && (l->cls == &ct_layer_add || ((l->cls->flags & CT_LAYER_ALIAS) && read_by_add(m, r))))
        return 1;
  }
  return 0;
}

/* Moves the gradient of a convolution's or batch norm's folded ReLU to
 * the max pool that alone reads its output (fuse.h). Recomputed each
 * time. */
static void move_relus_to_pools(ct_model *m) {
  for (int k = 0; k < m->n_layers; k++) m->layers[k].relu_moved = 0;
  for (int k = 0; k < m->n_layers && relu_to_pool; k++) {
    ct_layer *pool = &m->layers[k];
    int p = pool->inputs[0];
    /* Not the model output: its gradient is the caller's, not to be
     * changed in place. */
    if (pool->cls != &ct_layer_maxpool2d || p < 0 || k == m->output || p == m->output) continue;
    ct_layer *prod = &m->layers[p];
    if ((prod->cls != &ct_layer_conv2d && prod->cls != &ct_layer_batchnorm) || prod->act != CT_ACT_RELU ||
        ct_model_readers(m, p) != 1 || read_by_add(m, k))
      continue;
    prod->relu_moved = CT_RELU_MOVED_TO_POOL;
    pool->relu_moved = CT_RELU_MOVED_FROM_INPUT;
  }
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
  move_relus_to_pools(m);
}
