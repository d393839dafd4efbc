/* Segments and the step timeline of activation recompute (see recompute.h). */
#include "nn/recompute.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "nn/model_impl.h"

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
  free(tl->seg), free(tl->rerun), free(tl->rc), free(tl->bwd);
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

ct_status ct_timeline_build(const ct_model *m, const int *root, const size_t *bytes, const size_t *cost, int segments,
                            ct_timeline *tl) {
  int L = m->n_layers;
  memset(tl, 0, sizeof *tl);
  tl->L = L;
  size_t sz = sizeof(int) * (size_t)(L ? L : 1);
  tl->seg = calloc(1, sz), tl->rerun = calloc(1, sz), tl->rc = malloc(sz), tl->bwd = malloc(sz);
  int *cut = malloc(sz), *last_read = malloc(sz), *last_view = malloc(sz);
  ct_status s = CT_OK;
  if (!tl->seg || !tl->rerun || !tl->rc || !tl->bwd || !cut || !last_read || !last_view) {
    s = ct_error(CT_ERR_OUT_OF_MEMORY, "model '%s': out of host memory", m->name);
    goto done;
  }
  tl->nseg = 1;
  if (segments > 1 && ct_recompute_cuts(m, root, cut) > 0) {
    tl->nseg = place_cuts(L, root, cut, cost, segments, tl->seg);
  }
  /* Drop root r when its buffer is used only inside its segment, before the
   * segment's last layer (which may still read it), and the segment is not
   * the last. */
  last_reads(m, root, last_read);
  for (int i = 0; i < L; i++) last_view[i] = i;
  for (int k = 0; k < L; k++) last_view[root[k]] = k > last_view[root[k]] ? k : last_view[root[k]];
  int *end = cut; /* reused: end[s] = last layer of segment s */
  for (int i = 0; i < L; i++) end[tl->seg[i]] = i;
  for (int r = 0; r < L; r++) {
    int sg = tl->seg[r];
    if (root[r] != r || !bytes[r] || sg == tl->nseg - 1) continue;
    if (last_read[r] <= end[sg] && last_view[r] < end[sg]) tl->rerun[r] = 1;
  }
  for (int k = 0; k < L; k++) tl->rerun[k] = tl->rerun[root[k]];
  int t = L;
  for (int sg = tl->nseg - 1; sg >= 0; sg--) {
    int first = sg ? end[sg - 1] + 1 : 0;
    for (int k = first; k <= end[sg]; k++) tl->rc[k] = tl->rerun[k] ? t++ : -1;
    for (int k = end[sg]; k >= first; k--) tl->bwd[k] = t++;
  }
  tl->T = t;
done:
  free(cut), free(last_read), free(last_view);
  if (s != CT_OK) ct_timeline_free(tl);
  return s;
}
