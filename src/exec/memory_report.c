/* What fills the step's memory plan at its peak: the buffers alive at the
 * time the live bytes are largest, by kind and the largest by name. The
 * plan (plan/plan.h) knows sizes and lifetimes only; the executor's tables
 * (ct_exec_bufs) say which layer and role each buffer id serves, so the
 * report maps ids back through them. Read-only: it works on a prepared
 * model and changes nothing. */
#include <stdio.h>
#include <stdlib.h>

#include "nn/model_impl.h"
#include "plan/exec_plan.h"

enum { K_OUT, K_OUT_RC, K_GRAD, K_WS, K_PWS, K_CAST, K_DCAST, K_TMP, K_LOSS, K_LPW, K_COUNT };
static const char *const kind_name[K_COUNT] = {
    "layer outputs",        "recomputed outputs",     "output gradients",
    "kept workspaces",      "pass workspaces (cuDNN)", "cast inputs (autocast)",
    "cast input gradients", "gradient temporaries",   "fp32 output copies for the loss",
    "low-precision weights (autocast)"};
static const char *const kind_what[K_COUNT] = {"output",         "recomputed output", "output gradient",
                                               "workspace",      "pass workspace",    "cast input",
                                               "cast input gradient", "gradient temporary", "fp32 copy for the loss",
                                               "low-precision weights"};

typedef struct owner {
  int kind, layer; /* kind -1: no owner found */
} owner;

static void own(owner *o, int n, int id, int kind, int layer) {
  if (id >= 0 && id < n && o[id].kind < 0) o[id].kind = kind, o[id].layer = layer;
}

/* Who each plan buffer belongs to. Shared ids (an aliased gradient) keep
 * their first owner: the lowest layer index. */
static void owners(const ct_model *m, owner *o) {
  const ct_exec_bufs *b = m->eb;
  const int n = m->plan->n, L = m->n_layers;
  for (int k = 0; k < n; k++) o[k].kind = -1, o[k].layer = -1;
  for (int i = 0; i < L; i++) {
    if (b->act) own(o, n, b->act[i], K_OUT, i);
    if (b->act_rc) own(o, n, b->act_rc[i], K_OUT_RC, i);
    if (b->grad) own(o, n, b->grad[i], K_GRAD, i);
    if (b->ws) own(o, n, b->ws[i], K_WS, i);
    if (b->ws_rc) own(o, n, b->ws_rc[i], K_WS, i);
    if (b->lpw) own(o, n, b->lpw[i], K_LPW, i);
    if (b->lpw_bwd) own(o, n, b->lpw_bwd[i], K_LPW, i);
    for (int p = 0; p < 3 && b->pws; p++) own(o, n, b->pws[3 * i + p], K_PWS, i);
    for (int j = 0; j < 2; j++) {
      if (b->xcast) own(o, n, b->xcast[2 * i + j], K_CAST, i);
      if (b->xcast_rc) own(o, n, b->xcast_rc[2 * i + j], K_CAST, i);
      if (b->dxcast) own(o, n, b->dxcast[2 * i + j], K_DCAST, i);
      if (b->tmp) own(o, n, b->tmp[2 * i + j], K_TMP, i);
    }
  }
  own(o, n, b->out32, K_LOSS, m->output);
  own(o, n, b->dout32, K_LOSS, m->output);
}

/* "forward of layer 3 (features.3)" for time t of the step's timeline. */
static void time_label(const ct_model *m, int t, char *buf, size_t n) {
  const ct_timeline *tl = &m->eb->tl;
  const int L = m->n_layers;
  for (int i = 0; i < L && tl->bwd; i++)
    if (tl->bwd[i] == t) {
      snprintf(buf, n, "the backward of layer %d (%s)", i, m->layers[i].name);
      return;
    }
  for (int i = 0; i < L && tl->rc; i++)
    if (tl->rc[i] == t) {
      snprintf(buf, n, "the recompute of layer %d (%s)", i, m->layers[i].name);
      return;
    }
  if (t >= 0 && t < L) snprintf(buf, n, "the forward of layer %d (%s)", t, m->layers[t].name);
  else snprintf(buf, n, "the end of the step");
}

/* Largest first, then by id: an insertion sort (a few hundred ids at
 * most). */
static void sort_ids(int *ids, int n, const ct_plan_buf *p) {
  for (int i = 1; i < n; i++) {
    int v = ids[i], j = i;
    while (j > 0 && (p[ids[j - 1]].bytes < p[v].bytes || (p[ids[j - 1]].bytes == p[v].bytes && ids[j - 1] > v)))
      ids[j] = ids[j - 1], j--;
    ids[j] = v;
  }
}

ct_status ct_model_memory_report(ct_model *m, int top, FILE *out) {
  if (!m->arena || !m->eb->root)
    return ct_error(CT_ERR_INVALID_ARG, "memory report: prepare the model first (ct_model_prepare)");
  const ct_plan *plan = m->plan;
  const double mb = 1024.0 * 1024.0;
  int T = 0;
  for (int k = 0; k < plan->n; k++)
    if (plan->bufs[k].last > T) T = plan->bufs[k].last;
  /* The time with the most live bytes (the first of equals). The arena can
   * exceed it: first-fit placement leaves gaps. */
  size_t best = 0;
  int t_peak = 0;
  for (int t = 0; t <= T; t++) {
    size_t live = 0;
    for (int k = 0; k < plan->n; k++)
      if (plan->bufs[k].first <= t && t <= plan->bufs[k].last) live += plan->bufs[k].bytes;
    if (live > best) best = live, t_peak = t;
  }
  owner *o = malloc(sizeof(owner) * (size_t)(plan->n ? plan->n : 1));
  int *ids = malloc(sizeof(int) * (size_t)(plan->n ? plan->n : 1));
  if (!o || !ids) {
    free(o), free(ids);
    return ct_error(CT_ERR_OUT_OF_MEMORY, "memory report: out of host memory");
  }
  owners(m, o);
  size_t kb[K_COUNT] = {0}, other = 0;
  int kn[K_COUNT] = {0}, n_live = 0, n_other = 0;
  for (int k = 0; k < plan->n; k++) {
    const ct_plan_buf *p = &plan->bufs[k];
    if (p->bytes == 0 || p->first > t_peak || t_peak > p->last) continue;
    ids[n_live++] = k;
    if (o[k].kind >= 0) kb[o[k].kind] += p->bytes, kn[o[k].kind]++;
    else other += p->bytes, n_other++;
  }
  sort_ids(ids, n_live, plan->bufs);
  char when[224];
  time_label(m, t_peak, when, sizeof when);
  fprintf(out, "Memory plan of %s step: arena %.2f MB; at its peak, during %s,\n",
          m->training_plan ? "a training" : "an inference", plan->peak / mb, when);
  fprintf(out, "%d buffers hold %.2f MB (the arena's gaps: %.2f MB)\n", n_live, best / mb,
          (plan->peak > best ? plan->peak - best : 0) / mb);
  for (int k = 0; k < K_COUNT; k++)
    if (kn[k]) fprintf(out, "  %-34s %10.2f MB  (%d)\n", kind_name[k], kb[k] / mb, kn[k]);
  if (n_other) fprintf(out, "  %-34s %10.2f MB  (%d)\n", "other", other / mb, n_other);
  if (top > 0 && n_live) fprintf(out, "Largest live buffers:\n");
  for (int r = 0; r < n_live && r < top; r++) {
    const ct_plan_buf *p = &plan->bufs[ids[r]];
    const owner *w = &o[ids[r]];
    char until[224];
    time_label(m, p->last, until, sizeof until);
    if (w->kind < 0) {
      fprintf(out, "  %10.2f MB  buffer %d, until %s\n", p->bytes / mb, ids[r], until);
      continue;
    }
    const ct_layer *l = &m->layers[w->layer];
    fprintf(out, "  %10.2f MB  %s of layer %d (%s, %s), until %s\n", p->bytes / mb, kind_what[w->kind], w->layer,
            l->name, l->cls->kind, until);
  }
  free(o), free(ids);
  return CT_OK;
}
