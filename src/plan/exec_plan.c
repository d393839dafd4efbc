/* Binding a model to a device: the memory plan of a step.
 *
 * Timeline (plan/recompute.h): forward of layer i at time i, then the
 * backward phase: per segment, last first, the recompute forwards of its
 * dropped layers and the backwards of its layers (without recompute the
 * backward of layer i is at 2L-1-i). Each layer output is one activation
 * buffer (flatten shares its input's), alive from its forward until its
 * last reader: a consumer's forward, a consumer's recompute forward, a
 * consumer's backward that reads its input, or its own backward when that
 * reads the output. A dropped output has two buffers: one from its forward
 * to its last reader in the forward pass, one from its recompute to its
 * last reader after that. Each output also has a gradient buffer alive from
 * the backward of its last consumer to its own backward; when several
 * consumers send gradients back (residual connections), all but the first
 * write to a temporary that is added in. A residual add passes its output
 * gradient to both inputs unchanged, so an input may have no gradient
 * buffer of its own: its gradient is the add's, kept alive until its
 * backward (grad_alias below), and the add copies into the others only. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp/amp_model.h"
#include "backend/device_impl.h"
#include "plan/exec_plan.h"
#include "plan/fuse.h"
#include "plan/layout.h"

ct_layout ct_exec_layout(const ct_model *m, int i) { return i >= 0 ? (ct_layout)m->eb->layout[i] : m->in_layout; }

/* The layout layer i reads input edge j in: its source's (a cast copy
 * keeps its source's element order), except for the cast copy of the model
 * input that a channels-last convolution reads on a backend whose own
 * layout is NHWC. That cast writes NHWC, so the convolution reads its
 * input where it lies instead of transposing the whole batch in every
 * forward and weight-gradient pass (the first convolution of AlexNet and
 * ResNet-50 under autocast). A narrowed input (ct_model_narrow_input) is
 * no cast edge: it arrives in that layout (m->in_layout). */
ct_layout ct_exec_edge_layout(const ct_model *m, int i, int j) {
  const ct_layer *l = &m->layers[i];
  if (l->inputs[j] < 0 && !m->want_input_grad && l->cls == &ct_layer_conv2d && l->in_ndim[j] == 3 &&
      ct_exec_layout(m, i) == CT_LAYOUT_NHWC &&
      ct_exec_edge_cast(m, i, j) && m->dev && ct_device_backend(m->dev)->act_layout == CT_LAYOUT_NHWC)
    return CT_LAYOUT_NHWC;
  return ct_exec_layout(m, l->inputs[j]);
}

void ct_exec_shape_tensors(ct_model *m, int64_t n) {
  for (int i = 0; i < m->n_layers; i++) {
    ct_layer *l = &m->layers[i];
    for (int j = 0; j < l->n_inputs; j++) {
      l->x[j].layout = l->dx[j].layout = ct_exec_edge_layout(m, i, j);
      l->x[j].dtype = l->dx[j].dtype = ct_exec_out_dt(m, i);
      ct_layer_batch_shape(&l->x[j], n, l->in_ndim[j], l->in_shape[j]);
      ct_layer_batch_shape(&l->dx[j], n, l->in_ndim[j], l->in_shape[j]);
      l->x[j].device = l->dx[j].device = m->dev;
    }
    l->y.layout = l->dy.layout = ct_exec_layout(m, i);
    l->y.dtype = l->dy.dtype = ct_exec_out_dt(m, i);
    ct_layer_batch_shape(&l->y, n, l->out_ndim, l->out_shape);
    ct_layer_batch_shape(&l->dy, n, l->out_ndim, l->out_shape);
    l->y.device = l->dy.device = m->dev;
  }
}

/* n samples of numel elements of es bytes, or SIZE_MAX when the product
 * overflows: the plan then refuses it (a batch of 2^31 samples of 2^31
 * elements wrapped to a small arena that the forward pass overran). */
static size_t batch_bytes(size_t numel, int64_t n, size_t es) {
  if (n > 0 && numel > SIZE_MAX / (size_t)n / es) return SIZE_MAX;
  return (size_t)n * numel * es;
}

static size_t act_bytes(const ct_model *m, const ct_layer *l, int64_t n) {
  return batch_bytes((size_t)ct_shape_numel(l->out_ndim, l->out_shape), n, ct_dtype_size(ct_exec_out_dt(m, l->index)));
}

/* Tables indexed per layer (L) or per input edge (2L). */
static void free_plan_tables(ct_exec_bufs *b) {
  free(b->act), free(b->grad), free(b->ws), free(b->tmp), free(b->xcast), free(b->dxcast);
  free(b->act_rc), free(b->ws_rc), free(b->xcast_rc), free(b->pws), free(b->lpw);
  b->act = b->grad = b->ws = b->tmp = b->xcast = b->dxcast = b->act_rc = b->ws_rc = b->xcast_rc = b->pws = NULL;
  b->lpw = b->lpw_bwd = NULL;
  ct_timeline_free(&b->tl);
}

void ct_exec_bufs_free(ct_exec_bufs *b) {
  free_plan_tables(b);
  free(b->root), free(b->layout);
  memset(b, 0, sizeof *b);
}

static int alloc_plan_tables(ct_exec_bufs *b, int L) {
  size_t one = sizeof(int) * (size_t)(L ? L : 1), two = 2 * one;
  b->act = malloc(one), b->grad = malloc(one), b->ws = malloc(one), b->act_rc = malloc(one), b->ws_rc = malloc(one);
  b->tmp = malloc(two), b->xcast = malloc(two), b->dxcast = malloc(two), b->xcast_rc = malloc(two);
  b->pws = malloc(3 * one), b->lpw = malloc(two), b->lpw_bwd = b->lpw ? b->lpw + (L ? L : 1) : NULL;
  if (!b->act || !b->grad || !b->ws || !b->act_rc || !b->ws_rc || !b->tmp || !b->xcast || !b->dxcast || !b->xcast_rc ||
      !b->pws || !b->lpw)
    return 0;
  for (int i = 0; i < L; i++) b->act[i] = b->grad[i] = b->ws[i] = b->act_rc[i] = b->ws_rc[i] = -1;
  for (int i = 0; i < L; i++) b->lpw[i] = b->lpw_bwd[i] = -1;
  for (int i = 0; i < 3 * L; i++) b->pws[i] = -1;
  for (int i = 0; i < 2 * L; i++) b->tmp[i] = b->xcast[i] = b->dxcast[i] = b->xcast_rc[i] = -1;
  b->out32 = b->dout32 = -1;
  b->in_grad = -1;
  return 1;
}

static int max_i(int a, int b) { return a > b ? a : b; }

/* The earliest backward among the layers reading s other than through
 * layer `except` (T when none does). */
static int first_other_reader_bwd(const ct_model *m, const int *bwd, int s, int except, int T) {
  int t = T;
  for (int k = 0; k < m->n_layers; k++)
    for (int j = 0; j < m->layers[k].n_inputs; j++)
      if (k != except && m->layers[k].inputs[j] == s && bwd[k] < t) t = bwd[k];
  return t;
}

/* Input edge j of add i could take the add's gradient buffer: read
 * uncast, in the add's layout, not the model output. */
static int shareable(const ct_model *m, const ct_exec_bufs *b, int i, int j) {
  int s = m->layers[i].inputs[j];
  return s >= 0 && s != m->output && !ct_exec_edge_cast(m, i, j) && b->layout[s] == b->layout[i];
}

/* alias[s] = the residual add whose output gradient buffer is layer s's
 * gradient, else -1, as PyTorch's autograd hands one gradient tensor to
 * both inputs of an add. The buffer then serves its layers in backward
 * order: the add (which applies its fused activation's gradient in place),
 * the input that took it first and whatever shares that one's buffer in
 * turn (they read dy_add), then an input with further readers: these add
 * their gradients into the buffer (tmp + add, executor.c) and its own
 * backward reads the sum. So an input s takes the buffer when
 *  - nothing already served changes the buffer (dirty[]): a fused
 *    activation's gradient applied in place, or the gradients of an
 *    input's other readers added in (also an add reading one layer
 *    twice): the later sum needs dy_add intact;
 *  - s's backward and its other readers' backwards all come after the last
 *    backward already served (span[]), which always holds for an input the
 *    add alone reads.
 * Inputs the add alone reads are tried first (they fit at once), each
 * kind in backward order, so that two read-only inputs both fit (a
 * downsampling block's two batch norms: the shortcut's runs first). With
 * both inputs shared, a ResNet block copies nothing, and the blocks of
 * one stage share one gradient buffer along the trunk.
 * Adds are visited in layer order, so the spans and dirt of their inputs
 * (earlier layers) are final. Off with the fusion pass. span and dirty:
 * [L] scratch. */
static void grad_alias(const ct_model *m, const ct_exec_bufs *b, int *alias, int *span, int *dirty) {
  const int L = m->n_layers, T = b->tl.T, *bwd = b->tl.bwd;
  for (int i = 0; i < L; i++) alias[i] = -1;
  if (!ct_fuse_enabled()) return;
  /* An activation layer's act is its op, applied out of place; a max pool
   * that took over its producer's ReLU applies it in place (plan/fuse.h). */
  for (int i = 0; i < L; i++) {
    const ct_layer *l = &m->layers[i];
    span[i] = bwd[i];
    dirty[i] = (ct_layer_bwd_act(l) != CT_ACT_NONE && l->cls != &ct_layer_activation) ||
               l->relu_moved == CT_RELU_MOVED_FROM_INPUT;
  }
  for (int i = 0; i < L; i++) {
    const ct_layer *l = &m->layers[i];
    if (l->cls != &ct_layer_add) continue;
    if (i != m->output && !ct_model_readers(m, i)) continue; /* no gradient reaches it */
    int served_dirty = 0; /* by the inputs that took the buffer so far */
    /* Input edges by backward time (the later layer's comes first). */
    int order[2] = {0, 1};
    if (l->inputs[0] >= 0 && l->inputs[1] >= 0 && bwd[l->inputs[1]] < bwd[l->inputs[0]]) order[0] = 1, order[1] = 0;
    for (int sole = 1; sole >= 0; sole--)
      for (int k = 0; k < l->n_inputs; k++) {
        int j = order[k], s = l->inputs[j];
        if (!shareable(m, b, i, j) || alias[s] >= 0) continue;
        int readers = ct_model_readers(m, s);
        if ((readers == 1) != sole) continue;
        int others = first_other_reader_bwd(m, bwd, s, i, T), after = bwd[s] < others ? bwd[s] : others;
        if (served_dirty || after <= span[i]) continue;
        alias[s] = i;
        span[i] = max_i(span[i], span[s]);
        int changes = dirty[s] || readers > 1;
        dirty[i] |= changes;
        served_dirty |= changes;
      }
  }
}

/* A second (or later) gradient writer of input edge j of layer i can add
 * into the producer's gradient itself rather than through a temporary:
 * a convolution, on a backend with an accumulating backward-data (cuDNN's
 * beta = 1; not oneDNN), over an uncast edge (the gradient is in the
 * producer's dtype and layout). One pass over dx in place of writing the
 * temporary and reading it and dx back for the add. Off with the fusion
 * pass, like the gradient sharing. */
static int dx_accumulates(const ct_model *m, ct_device *dev, int i, int j) {
  return ct_fuse_enabled() && m->layers[i].cls == &ct_layer_conv2d && ct_device_backend(dev)->conv2d_bwd_data_acc &&
         !ct_exec_edge_cast(m, i, j);
}

/* Adds every buffer of the step with timeline b->tl (b->root and b->layout
 * set, descriptors shaped for max_batch) to plan and solves it. */
static ct_status plan_step(ct_model *m, ct_device *dev, int64_t max_batch, int training, ct_exec_bufs *b,
                           ct_plan *plan) {
  const int L = m->n_layers;
  const ct_timeline *tl = &b->tl;
  const int T = tl->T; /* end of the step */
  const int *bwd = tl->bwd, *rc = tl->rc, *rerun = tl->rerun;
  if (!alloc_plan_tables(b, L)) return ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': out of host memory", m->name);
  /* Seven [L] tables in one block: last, last_rc, gfirst, alias, gend,
   * and grad_alias's span and dirty. */
  int *tables = malloc(sizeof(int) * 7 * (size_t)(L ? L : 1));
  if (!tables) return ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': out of host memory", m->name);
  int *last = tables, *last_rc = last + L, *gfirst = last_rc + L, *alias = gfirst + L, *gend = alias + L;
  for (int i = 0; i < L; i++) last[i] = i, last_rc[i] = rc[i], gfirst[i] = T;
  /* A shared gradient buffer lives to the last backward among the layers
   * sharing it (an alias always points at a later layer). */
  grad_alias(m, b, alias, gend + L, gend + 2 * L);
  for (int i = 0; i < L; i++) gend[i] = bwd[i];
  for (int i = 0; i < L; i++) {
    int r = i;
    while (alias[r] >= 0) r = alias[r];
    gend[r] = max_i(gend[r], bwd[i]);
  }
  /* A read of root r at time t after the forward pass: a dropped r is read
   * from its recompute buffer. */
#define READ_LATE(r, t) (rerun[r] ? (last_rc[r] = max_i(last_rc[r], t)) : (last[r] = max_i(last[r], t)))
  for (int i = 0; i < L; i++) {
    ct_layer *l = &m->layers[i];
    for (int j = 0; j < l->n_inputs; j++) {
      int src = l->inputs[j];
      if (src < 0) continue;
      int r = b->root[src];
      last[r] = max_i(last[r], i);
      if (rerun[i]) READ_LATE(r, rc[i]);
      /* A cast edge reads its source at the forward; the backward reads
       * the cast copy. */
      if (training && ct_exec_saves_input(l) && !ct_exec_edge_cast(m, i, j)) READ_LATE(r, bwd[i]);
      if (bwd[i] < gfirst[src]) gfirst[src] = bwd[i];
    }
    if (training && ct_exec_saves_output(l)) READ_LATE(b->root[i], bwd[i]);
  }
#undef READ_LATE
  /* The loss reads the output after forward, and model.h promises callers
   * it stays valid until the next forward: keep it out of backward's reuse. */
  last[b->root[m->output]] = T;
  for (int i = 0; i < L; i++) {
    ct_layer *l = &m->layers[i];
    /* An alias of the model input (flatten first) has no buffer of its own:
     * bind() points it at the input. */
    int input_alias = (l->cls->flags & CT_LAYER_ALIAS) && l->inputs[0] < 0;
    if (b->root[i] == i && !input_alias) {
      b->act[i] = ct_plan_add(plan, act_bytes(m, l, max_batch), i, last[i]);
      if (rerun[i]) b->act_rc[i] = ct_plan_add(plan, act_bytes(m, l, max_batch), rc[i], last_rc[i]);
    }
    if (!training) continue;
    int gf = i == m->output ? L - 1 : gfirst[i];
    if (alias[i] < 0 && gf <= bwd[i]) b->grad[i] = ct_plan_add(plan, act_bytes(m, l, max_batch), gf, gend[i]);
    if (l->cls->workspace_bytes) {
      size_t wsb = l->cls->workspace_bytes(l, &(ct_exec){dev, ct_device_backend(dev), 1, max_batch, 0, 0, 0, NULL, 0, 0, 0, NULL});
      /* A rerun layer's first forward writes a workspace nobody reads,
       * unless its recompute reads it (CT_LAYER_RERUN_READS_WS). */
      const int own_rc = rerun[i] && !(l->cls->flags & CT_LAYER_RERUN_READS_WS);
      if (wsb) b->ws[i] = ct_plan_add(plan, wsb, i, own_rc ? i : bwd[i]);
      if (wsb && own_rc) b->ws_rc[i] = ct_plan_add(plan, wsb, rc[i], bwd[i]);
    }
  }
  /* Low-precision weight copies (amp_model.c). Training: one for the
   * forward alone, and one cast again for the backward-data pass (from
   * the layer's recompute forward when it has one), so that no copy is
   * alive between the two, where the step peaks. Inference: one for the
   * whole step, so that it outlives the step and is cast again only
   * after the weights changed. */
  for (int i = 0; i < L; i++) {
    size_t n = ct_amp_layer_weights(m, i, NULL);
    if (!n) continue;
    b->lpw[i] = ct_plan_add(plan, 2 * n, training ? i : 0, training ? i : T);
    const int dx = m->layers[i].n_inputs > 0 && (m->layers[i].inputs[0] >= 0 || m->want_input_grad);
    if (training && (dx || rerun[i]))
      b->lpw_bwd[i] = ct_plan_add(plan, 2 * n, rerun[i] ? rc[i] : bwd[i], dx ? bwd[i] : rc[i]);
  }
  /* Pass workspaces: each lives at its pass's time only, so the planner
   * lays it over whatever is dead then (cuDNN's workspace on cuda). */
  for (int i = 0; i < L; i++) {
    ct_layer *l = &m->layers[i];
    if (!l->cls->pass_workspace_bytes) continue;
    ct_exec e = {dev, ct_device_backend(dev), training, max_batch, 0, 0, 0, NULL, 0, 0, 0, NULL};
    size_t f = l->cls->pass_workspace_bytes(l, &e, 0), bw = training ? l->cls->pass_workspace_bytes(l, &e, 1) : 0;
    if (f) b->pws[3 * i + CT_PASS_FWD] = ct_plan_add(plan, f, i, i);
    if (f && training && rerun[i]) b->pws[3 * i + CT_PASS_RC] = ct_plan_add(plan, f, rc[i], rc[i]);
    if (bw) b->pws[3 * i + CT_PASS_BWD] = ct_plan_add(plan, bw, bwd[i], bwd[i]);
  }
  /* Mixed precision: a copy of each input the layer reads in another
   * dtype (kept to the backward when the layer reads its input there), its
   * gradient in the layer's dtype, and fp32 copies of the output and of its
   * gradient for the loss. None of these exist under O0. */
  for (int i = 0; i < L; i++) {
    ct_layer *l = &m->layers[i];
    int keep = training && ct_exec_saves_input(l);
    for (int j = 0; j < l->n_inputs; j++) {
      if (!ct_exec_edge_cast(m, i, j)) continue;
      size_t bytes = (size_t)ct_tensor_nbytes(&l->x[j]);
      b->xcast[2 * i + j] = ct_plan_add(plan, bytes, i, keep && !rerun[i] ? bwd[i] : i);
      if (rerun[i]) b->xcast_rc[2 * i + j] = ct_plan_add(plan, bytes, rc[i], keep ? bwd[i] : rc[i]);
      if (training && (l->inputs[j] >= 0 || m->want_input_grad))
        b->dxcast[2 * i + j] = ct_plan_add(plan, bytes, bwd[i], bwd[i]);
    }
  }
  if (ct_exec_out_dt(m, m->output) != CT_F32) {
    const ct_layer *o = &m->layers[m->output];
    size_t bytes = batch_bytes((size_t)ct_shape_numel(o->out_ndim, o->out_shape), max_batch, sizeof(float));
    b->out32 = ct_plan_add(plan, bytes, L - 1, training ? L : T);
    if (training) b->dout32 = ct_plan_add(plan, bytes, L - 1, L);
  }
  if (training)
    for (int i = L - 1; i >= 0; i--)
      if (alias[i] >= 0) b->grad[i] = b->grad[alias[i]];
  /* Temporaries for the second and later gradient writers of one output,
   * and a scratch dx for batch norm layers reading the model input. */
  if (training) {
    int *seen = gfirst; /* reused: gradient writers of layer i so far */
    memset(seen, 0, sizeof(int) * (size_t)L);
    for (int i = L - 1; i >= 0; i--) {
      ct_layer *l = &m->layers[i];
      for (int j = 0; j < l->n_inputs; j++) {
        int src = l->inputs[j];
        /* In the producer's dtype: a cast edge's gradient is cast into it. */
        size_t bytes = batch_bytes((size_t)ct_shape_numel(l->in_ndim[j], l->in_shape[j]), max_batch,
                                   ct_dtype_size(ct_exec_src_dt(m, src)));
        if (src < 0 && m->want_input_grad) {
          /* The first writer (in backward order) writes the input's
           * gradient, the later ones add theirs through a temporary. */
          if (b->in_grad < 0) {
            size_t ib = batch_bytes((size_t)ct_shape_numel(m->in_ndim, m->in_shape), max_batch, sizeof(float));
            b->in_grad = ct_plan_add(plan, ib, bwd[i], T);
          } else {
            b->tmp[2 * i + j] = ct_plan_add(plan, bytes, bwd[i], bwd[i]);
          }
          continue;
        }
        if (src < 0) {
          if (l->cls == &ct_layer_batchnorm) b->tmp[2 * i + j] = ct_plan_add(plan, bytes, bwd[i], bwd[i]);
          continue;
        }
        if (seen[src]++)
          b->tmp[2 * i + j] = dx_accumulates(m, dev, i, j) ? CT_EXEC_DX_ACC : ct_plan_add(plan, bytes, bwd[i], bwd[i]);
      }
    }
  }
  free(tables);
  return ct_plan_solve(plan);
}

/* The step's timeline and plan with `segments` recompute segments, into
 * b and plan (both emptied first). */
static ct_status plan_with_segments(ct_model *m, ct_device *dev, int64_t max_batch, int training, int segments,
                                    ct_exec_bufs *b, ct_plan *plan) {
  free_plan_tables(b);
  ct_plan_free(plan);
  ct_plan_init(plan);
  const int L = m->n_layers;
  size_t *bytes = calloc((size_t)(L ? L : 1), sizeof *bytes);
  if (!bytes) return ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': out of host memory", m->name);
  for (int i = 0; i < L; i++) {
    const ct_layer *l = &m->layers[i];
    int input_alias = (l->cls->flags & CT_LAYER_ALIAS) && l->inputs[0] < 0;
    if (b->root[i] == i && !input_alias) bytes[i] = act_bytes(m, l, max_batch);
  }
  ct_status s = ct_timeline_build(m, b->root, bytes, training ? segments : 0, &b->tl);
  free(bytes);
  if (s == CT_OK) s = plan_step(m, dev, max_batch, training, b, plan);
  return s;
}

/* The peak of a training plan with `segments` (the model's bound plan
 * untouched). */
static ct_status trial_peak(ct_model *m, ct_device *dev, int64_t max_batch, int segments, size_t *peak) {
  ct_exec_bufs trial = {0};
  trial.root = m->eb->root;
  trial.layout = m->eb->layout;
  ct_plan p;
  ct_plan_init(&p);
  ct_status s = plan_with_segments(m, dev, max_batch, 1, segments, &trial, &p);
  *peak = p.peak;
  free_plan_tables(&trial);
  ct_plan_free(&p);
  return s;
}

/* CT_RECOMPUTE_AUTO: the norm, cheap and selective modes and every
 * segment count the clean cuts allow, keeping the smallest peak; among
 * equal peaks the least rerun work: the norm mode (batch norms only), the
 * cheap mode (no convolution twice), the selective mode (cheap
 * convolutions twice), then the fewest segments. 1 when that saves less
 * than 1/16 of the plain plan. */
static ct_status choose_segments(ct_model *m, ct_device *dev, int64_t max_batch, int *segments) {
  const int L = m->n_layers;
  int *cut = malloc(sizeof(int) * (size_t)(L ? L : 1));
  if (!cut) return ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': out of host memory", m->name);
  int n_cuts = ct_recompute_cuts(m, m->eb->root, cut);
  free(cut);
  size_t plain, best, peak;
  CT_TRY(trial_peak(m, dev, max_batch, 0, &plain));
  best = plain, *segments = 1;
  const int modes[] = {CT_RECOMPUTE_NORM, CT_RECOMPUTE_CHEAP, CT_RECOMPUTE_SELECTIVE};
  for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
    CT_TRY(trial_peak(m, dev, max_batch, modes[k], &peak));
    if (peak < best) best = peak, *segments = modes[k];
  }
  for (int k = 2; k <= n_cuts + 1 && k <= CT_RECOMPUTE_MAX; k++) {
    CT_TRY(trial_peak(m, dev, max_batch, k, &peak));
    if (peak < best) best = peak, *segments = k;
  }
  /* Rerunning layers for next to nothing is a bad trade (AlexNet-227
   * batch 32 on the cpu: 3 segments saved 1% of the arena for 1.19x the
   * step). An explicit count still gets what it asks for. */
  if (best > plain - plain / 16) *segments = 1;
  return CT_OK;
}

/* CT_RECOMPUTE_NORM, _CHEAP or _SELECTIVE only where its plan is smaller
 * than the plain one (AlexNet's only cheap output is a dropout's, and it
 * has no batch norm and no convolution cheap enough: nothing to gain). */
static ct_status mode_if_smaller(ct_model *m, ct_device *dev, int64_t max_batch, int *segments) {
  size_t plain, with;
  CT_TRY(trial_peak(m, dev, max_batch, 0, &plain));
  CT_TRY(trial_peak(m, dev, max_batch, *segments, &with));
  if (with >= plain) *segments = 0;
  return CT_OK;
}

/* What ct_model_narrow_input asks for: when every edge reading the model
 * input casts it into one 16-bit dtype and reads it in one layout, the
 * input arrives so (m->in_dt, m->in_layout) and no edge casts it, which
 * leaves no cast copy in the plan. Otherwise, or when not asked, the input
 * stays f32 plain. Needs the dtypes and layouts chosen. */
static void choose_input_format(ct_model *m) {
  m->in_dt = CT_F32, m->in_layout = CT_LAYOUT_PLAIN;
  if (!m->narrow_input || m->want_input_grad) return; /* a stage's input gradient is f32 */
  ct_dtype dt = CT_F32;
  ct_layout lay = CT_LAYOUT_PLAIN;
  int n = 0;
  for (int i = 0; i < m->n_layers; i++) {
    const ct_layer *l = &m->layers[i];
    for (int j = 0; j < l->n_inputs; j++) {
      if (l->inputs[j] >= 0) continue;
      ct_dtype d = ct_exec_out_dt(m, i);
      ct_layout e = ct_exec_edge_layout(m, i, j);
      if (!ct_exec_edge_cast(m, i, j) || (n && (d != dt || e != lay))) return;
      dt = d, lay = e, n++;
    }
  }
  if (n && ct_dtype_size(dt) == 2) m->in_dt = dt, m->in_layout = lay;
}

void ct_model_narrow_input(ct_model *m, int on) { m->narrow_input = on != 0; }

ct_dtype ct_model_input_dtype(const ct_model *m, ct_layout *layout) {
  if (layout) *layout = m->in_layout;
  return m->in_dt;
}

ct_status ct_exec_plan_build(ct_model *m, ct_device *dev, int64_t max_batch, int training) {
  if (!m->plan) m->plan = calloc(1, sizeof *m->plan);
  if (!m->eb) m->eb = calloc(1, sizeof *m->eb);
  if (!m->plan || !m->eb) return ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': out of host memory", m->name);
  ct_plan_free(m->plan);
  ct_plan_init(m->plan);
  ct_model_fuse(m);
  CT_TRY(ct_amp_model_plan(m));
  ct_amp_model_bind_weights(m);

  ct_exec_bufs *b = m->eb;
  ct_exec_bufs_free(b);
  const int L = m->n_layers;
  b->root = malloc(sizeof(int) * (size_t)(L ? L : 1));
  b->layout = malloc(sizeof(int) * (size_t)(L ? L : 1));
  if (!b->root || !b->layout) return ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': out of host memory", m->name);
  m->in_dt = CT_F32, m->in_layout = CT_LAYOUT_PLAIN;
  CT_TRY(ct_model_choose_layouts(m, b->layout));
  choose_input_format(m);
  ct_exec_shape_tensors(m, max_batch);
  for (int i = 0; i < L; i++) {
    ct_layer *l = &m->layers[i];
    int alias = (l->cls->flags & CT_LAYER_ALIAS) && l->inputs[0] >= 0;
    b->root[i] = alias ? b->root[l->inputs[0]] : i;
  }
  int segments = training ? m->recompute : 0;
  /* auto's choice is smaller than plain already; an asked-for mode is checked */
  if (segments == CT_RECOMPUTE_AUTO) CT_TRY(choose_segments(m, dev, max_batch, &segments));
  else if (ct_recompute_layer_mode(segments))
    CT_TRY(mode_if_smaller(m, dev, max_batch, &segments));
  return plan_with_segments(m, dev, max_batch, training, segments, b, m->plan);
}

ct_status ct_model_plan_peak_with_recompute(ct_model *m, int segments, size_t *peak) {
  *peak = 0;
  if (!m->eb || !m->eb->root || !m->training_plan) return ct_error(CT_ERR_INVALID_ARG, "model '%s': no training plan", m->name);
  if (segments == CT_RECOMPUTE_AUTO) CT_TRY(choose_segments(m, m->dev, m->max_batch, &segments));
  return trial_peak(m, m->dev, m->max_batch, segments, peak);
}

ct_status ct_model_set_recompute(ct_model *m, int segments) {
  if (segments != CT_RECOMPUTE_AUTO && !ct_recompute_layer_mode(segments) &&
      (segments < 0 || segments > CT_RECOMPUTE_MAX))
    return ct_error(CT_ERR_INVALID_ARG,
                    "model '%s': recompute segments must be 0 (off), auto, cheap, norm, selective or 2..%d, got %d",
                    m->name, CT_RECOMPUTE_MAX, segments);
  m->recompute = segments;
  return CT_OK;
}

int ct_model_recompute_segments(const ct_model *m) { return m->eb && m->eb->tl.nseg ? m->eb->tl.nseg : 1; }

int ct_model_recompute_mode(const ct_model *m) { return m->eb && m->eb->tl.n_rerun ? m->eb->tl.mode : 0; }

ct_status ct_recompute_parse(const char *s, int *out) {
  static const struct {
    const char *name;
    int mode;
  } named[] = {{"auto", CT_RECOMPUTE_AUTO},
               {"cheap", CT_RECOMPUTE_CHEAP},
               {"norm", CT_RECOMPUTE_NORM},
               {"selective", CT_RECOMPUTE_SELECTIVE},
               {"off", 0}};
  for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
    if (!strcmp(s, named[i].name)) return *out = named[i].mode, CT_OK;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (!*s || *end || errno || v < 0 || v > CT_RECOMPUTE_MAX)
    return ct_error(CT_ERR_INVALID_ARG,
                    "recompute: expected auto, cheap, norm, selective, off or a segment count 0..%d, got '%s'",
                    CT_RECOMPUTE_MAX, s);
  *out = v <= 1 ? 0 : (int)v;
  return CT_OK;
}

const char *ct_recompute_mode_str(int mode, char *buf, size_t n) {
  const char *name = mode == CT_RECOMPUTE_NORM        ? "norm"
                     : mode == CT_RECOMPUTE_CHEAP     ? "cheap"
                     : mode == CT_RECOMPUTE_SELECTIVE ? "selective"
                     : mode == CT_RECOMPUTE_AUTO      ? "auto"
                     : mode <= 1                      ? "off"
                                                      : NULL;
  if (name) snprintf(buf, n, "%s", name);
  else snprintf(buf, n, "%d segments", mode);
  return buf;
}

int ct_model_recompute_layers(const ct_model *m) { return m->eb ? m->eb->tl.n_rerun : 0; }
