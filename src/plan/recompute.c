/* Segments and the step timeline of activation recompute (see recompute.h). */
#include "plan/recompute.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "plan/exec_plan.h"

/* last_read[r]: the last layer reading root r's buffer (through r or a
 * view of it), r itself when nobody does; the model output counts as read
 * at L (the loss). */
static void last_reads(const ct_model *m, const int *root, int *last_read) {
  int L = m->n_layers;
  for (int i = 0; i < L; i++) last_read[i] = i;
  for (int k = 0; k < L; k++)
    for (int j = 0; j < m->layers[k].n_inputs; j++) {
      int src = m->layers[k].inputs[j];
      if (src >= 0 && k > last_read[root[src]]) last_read[root[src]] = k;
    }
  last_read[root[m->output]] = L;
}

int ct_recompute_cuts(const ct_model *m, const int *root, int *cut) {
  int L = m->n_layers, n = 0;
  int *last_read = malloc(sizeof(int) * (size_t)(L ? L : 1));
  if (!last_read) return 0;
  last_reads(m, root, last_read);
  for (int i = 0; i < L; i++) {
    cut[i] = i < L - 1;
    for (int r = 0; r <= i && cut[i]; r++)
      if (root[r] == r && r != root[i] && last_read[r] > i) cut[i] = 0;
    n += cut[i];
  }
  free(last_read);
  return n;
}

void ct_timeline_free(ct_timeline *tl) {
  free(tl->seg), free(tl->rerun), free(tl->rc_at), free(tl->rc), free(tl->order), free(tl->bwd);
  memset(tl, 0, sizeof *tl);
}

int ct_timeline_seg_end(const ct_timeline *tl, int i) { return i == tl->L - 1 || tl->seg[i + 1] != tl->seg[i]; }

/* Greedy segments under a budget: each segment runs to the furthest clean
 * cut whose internal cost (what the segment's activations but the one its
 * last layer leaves keep for the backward) stays within `budget`, else to
 * the nearest cut. Fills seg[] when non-NULL; returns
 * the segment count, or INT_MAX when some segment exceeds the budget. */
static int greedy_segments(int L, const int *root, const int *cut, const size_t *cost, size_t budget, size_t biggest,
                           int *seg) {
  int n = 0, over = 0;
  for (int s = 0; s < L;) {
    int end = -1, first = -1;
    size_t sum = 0;
    /* Past budget + the largest cost no later cut can come back within it. */
    for (int i = s; i < L && (first < 0 || sum <= budget + biggest); i++) {
      sum += cost[i];
      if (!cut[i] && i != L - 1) continue;
      if (first < 0) first = i;
      if (sum - (root[i] >= s ? cost[root[i]] : 0) <= budget) end = i;
    }
    if (end < 0) end = first, over = 1;
    if (seg)
      for (int i = s; i <= end; i++) seg[i] = n;
    n++;
    s = end + 1;
  }
  return over ? INT_MAX : n;
}

/* Cuts for at most `segments` segments: the smallest budget on a
 * segment's internal cost that the greedy meets with that many (the
 * linear-partition form of Chen et al.'s checkpoint choice). Marks seg[];
 * returns the segment count. */
static int place_cuts(int L, const int *root, const int *cut, const size_t *cost, int segments, int *seg) {
  size_t lo = 0, hi = 0, biggest = 0;
  for (int i = 0; i < L; i++) hi += cost[i], biggest = cost[i] > biggest ? cost[i] : biggest;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (greedy_segments(L, root, cut, cost, mid, biggest, NULL) <= segments) hi = mid;
    else lo = mid + 1;
  }
  return greedy_segments(L, root, cut, cost, lo, biggest, seg);
}

/* What the plain step keeps for the backward: cost[r] = bytes[r] when
 * some layer's backward reads root r's buffer, else 0. */
static void saved_costs(const ct_model *m, const int *root, const size_t *bytes, size_t *cost) {
  int L = m->n_layers;
  memset(cost, 0, sizeof(size_t) * (size_t)L);
  for (int i = 0; i < L; i++) {
    const ct_layer *l = &m->layers[i];
    for (int j = 0; j < l->n_inputs; j++)
      if (l->inputs[j] >= 0 && ct_exec_saves_input(l) && !ct_exec_edge_cast(m, i, j))
        cost[root[l->inputs[j]]] = bytes[root[l->inputs[j]]];
    if (ct_exec_saves_output(l)) cost[root[i]] = bytes[root[i]];
  }
}

/* Segment mode: drop root r when its buffer is used only inside its
 * segment, before the segment's last layer (which may still read it), and
 * the segment is not the last; recompute before the segment end's
 * backward. */
static void drop_in_segments(const ct_model *m, const int *root, const size_t *bytes, ct_timeline *tl, int *scratch) {
  int L = m->n_layers, *last_read = scratch, *last_view = scratch + L, *end = scratch + 2 * L;
  last_reads(m, root, last_read);
  for (int i = 0; i < L; i++) last_view[i] = i;
  for (int k = 0; k < L; k++) last_view[root[k]] = k > last_view[root[k]] ? k : last_view[root[k]];
  for (int i = 0; i < L; i++) end[tl->seg[i]] = i;
  for (int r = 0; r < L; r++) {
    int sg = tl->seg[r];
    if (root[r] != r || !bytes[r] || sg == tl->nseg - 1) continue;
    if (last_read[r] <= end[sg] && last_view[r] < end[sg]) tl->rerun[r] = 1, tl->rc_at[r] = end[sg];
  }
}

/* Cheap mode: the layers whose forward costs little next to the memory it
 * writes (batch norm, activations, residual adds, dropout). Norm mode:
 * batch norm alone, whose recompute is one elementwise pass from the
 * statistics its forward saved (nn/layers/batchnorm.c). Selective mode:
 * batch norm and the convolutions of at most CT_RECOMPUTE_SELECTIVE_MACS
 * multiply-adds per output element, a GEMM pass that writes as many bytes
 * as it saves; a 3x3 convolution of 64 channels costs 576. */
static int droppable(const ct_layer *l, int mode) {
  if (l->cls == &ct_layer_batchnorm) return 1;
  if (mode == CT_RECOMPUTE_SELECTIVE && l->cls == &ct_layer_conv2d)
    return (int64_t)(l->ip[0] / l->ip[10]) * l->ip[2] * l->ip[3] <= CT_RECOMPUTE_SELECTIVE_MACS;
  return mode == CT_RECOMPUTE_CHEAP && (l->cls == &ct_layer_activation || l->cls == &ct_layer_add ||
                                        l->cls == &ct_layer_dropout || l->cls == &ct_layer_dropout2d);
}

/* Cheap, norm and selective modes: drop a droppable layer's output that
 * the plain step keeps for a backward, when each of its inputs is the
 * model input, kept for a backward anyway, or itself a droppable output
 * that can be dropped (cheap mode: a batch norm before a residual add;
 * selective: the batch norm + ReLU before a 1x1 convolution); recompute
 * it just before the first backward that reads it (or before the
 * recompute of a dropped reader). */
static void drop_cheap(const ct_model *m, const int *root, const size_t *bytes, const size_t *cost, int mode,
                       ct_timeline *tl) {
  int L = m->n_layers, out_root = root[m->output];
  int *drop = tl->rerun;
  for (int r = 0; r < L; r++)
    drop[r] = root[r] == r && bytes[r] && cost[r] && r != out_root && droppable(&m->layers[r], mode);
  /* To a fixpoint: an input that is neither kept nor droppable undrops the
   * reader; a droppable one not kept joins the dropped. */
  for (int changed = 1; changed;) {
    changed = 0;
    for (int r = 0; r < L; r++) {
      if (!drop[r]) continue;
      const ct_layer *l = &m->layers[r];
      for (int j = 0; j < l->n_inputs && drop[r]; j++) {
        if (l->inputs[j] < 0) continue;
        int p = root[l->inputs[j]];
        if (drop[p] || cost[p]) continue;
        if (bytes[p] && p != out_root && droppable(&m->layers[p], mode)) drop[p] = 1;
        else drop[r] = 0;
        changed = 1;
      }
    }
  }
  /* Last reader in the backward phase first: layers go back from L-1, so
   * the highest index among the readers runs its backward first. A reader
   * that is itself dropped reads r at its recompute. */
  for (int r = L - 1; r >= 0; r--) {
    if (!drop[r]) continue;
    int at = ct_exec_saves_output(&m->layers[r]) ? r : -1;
    for (int k = r + 1; k < L; k++) {
      const ct_layer *l = &m->layers[k];
      for (int j = 0; j < l->n_inputs; j++) {
        if (l->inputs[j] < 0 || root[l->inputs[j]] != r) continue;
        if (ct_exec_saves_input(l) && !ct_exec_edge_cast(m, k, j) && k > at) at = k;
        if (drop[root[k]] && tl->rc_at[root[k]] > at) at = tl->rc_at[root[k]];
      }
    }
    tl->rc_at[r] = at;
    if (at < 0) drop[r] = 0; /* nothing reads it after the forward */
  }
}

ct_status ct_timeline_build(const ct_model *m, const int *root, const size_t *bytes, int segments, ct_timeline *tl) {
  int L = m->n_layers;
  memset(tl, 0, sizeof *tl);
  tl->L = L;
  size_t sz = sizeof(int) * (size_t)(L ? L : 1);
  tl->seg = calloc(1, sz), tl->rerun = calloc(1, sz), tl->rc_at = malloc(sz), tl->rc = malloc(sz), tl->bwd = malloc(sz);
  tl->order = malloc(sz);
  int *scratch = malloc(3 * sz);
  size_t *cost = malloc(sizeof(size_t) * (size_t)(L ? L : 1));
  ct_status s = CT_OK;
  if (!tl->seg || !tl->rerun || !tl->rc_at || !tl->rc || !tl->bwd || !tl->order || !scratch || !cost) {
    s = ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': out of host memory", m->name);
    goto done;
  }
  for (int i = 0; i < L; i++) tl->rc_at[i] = -1;
  saved_costs(m, root, bytes, cost);
  tl->nseg = 1;
  tl->mode = ct_recompute_layer_mode(segments) ? segments : 0;
  if (tl->mode) {
    drop_cheap(m, root, bytes, cost, segments, tl);
  } else if (segments > 1 && ct_recompute_cuts(m, root, scratch) > 0) {
    tl->nseg = place_cuts(L, root, scratch, cost, segments, tl->seg);
    drop_in_segments(m, root, bytes, tl, scratch);
    tl->mode = tl->nseg;
  }
  /* Only roots rerun: a view (flatten, a folded ReLU) computes nothing
   * and follows its root's buffer wherever that is bound. */
  int t = L;
  for (int i = 0; i < L; i++) tl->rc[i] = -1;
  for (int i = L - 1; i >= 0; i--) {
    for (int r = 0; r <= i; r++)
      if (tl->rerun[r] && tl->rc_at[r] == i) tl->rc[r] = t++, tl->order[tl->n_rerun++] = r;
    tl->bwd[i] = t++;
  }
  tl->T = t;
done:
  free(scratch), free(cost);
  if (s != CT_OK) ct_timeline_free(tl);
  return s;
}
