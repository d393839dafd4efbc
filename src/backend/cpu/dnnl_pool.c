/* Max and average 2-D pooling through oneDNN (pooling_v2), forward and
 * backward, f32 or bf16 (where oneDNN implements it: cpu_dnnl_bf16), NCHW
 * or channel-blocked (nChw16c / nChw8c: CT_LAYOUT_C16 / C8, source and
 * destination alike).
 *
 * PyTorch's output size (floor or ceil_mode) is taken from y; oneDNN is
 * given the right padding that produces exactly that size, which for
 * ceil_mode can exceed the declared padding. That is exact for max pooling
 * (padding never wins) and for average pooling that excludes padding (the
 * divisor counts only real elements). Average pooling that counts padding
 * is exact only while no window reaches past the declared padding: PyTorch
 * then divides by the window clipped to H+pad while oneDNN divides by
 * kh*kw, so those ceil_mode cases go to the reference backend.
 *
 * The max-pooling workspace is oneDNN's own (argmax indices in its own
 * type and layout), or the window offsets of the non-overlapping loops in
 * cpu_maxpool_tiles.c; either is only meaningful to this backend's
 * backward. */
#include "backend/cpu/cpu_impl.h"

enum { OP_POOL_FWD = 300, OP_POOL_BWD };

typedef struct pool_geom {
  dnnl_dims_t strides, kernel, dil, pl, pr;
} pool_geom;

static void geom(pool_geom *g, const ct_pool2d_params *p, const ct_tensor *x, const ct_tensor *y) {
  g->strides[0] = p->stride_h;
  g->strides[1] = p->stride_w;
  g->kernel[0] = p->kernel_h;
  g->kernel[1] = p->kernel_w;
  g->dil[0] = g->dil[1] = 0;
  g->pl[0] = p->pad_h;
  g->pl[1] = p->pad_w;
  g->pr[0] = (y->shape[2] - 1) * p->stride_h + p->kernel_h - x->shape[2] - p->pad_h;
  g->pr[1] = (y->shape[3] - 1) * p->stride_w + p->kernel_w - x->shape[3] - p->pad_w;
}

static int fast_dtype(const ct_tensor *a, const ct_tensor *b) {
  return a->dtype == b->dtype && (a->dtype == CT_F32 || (a->dtype == CT_BF16 && cpu_dnnl_bf16())) && a->ndim == 4;
}

/* The own loops (cpu_maxpool_tiles.c, cpu_maxpool_windows.c) come before
 * oneDNN for every dtype they take: bf16 too on CPUs without oneDNN's
 * bf16, where the alternative is the widening path (two whole-tensor f32
 * temporaries per call, far slower). */
static int own_loops(const ct_pool2d_params *p, const ct_tensor *x, const ct_tensor *y) {
  return cpu_maxpool_tiles_ok(p, x, y) || cpu_maxpool_windows_ok(p, x, y);
}

static void pool_key(cpu_key *k, int op, dnnl_alg_kind_t alg, int with_ws, const ct_pool2d_params *p,
                     const ct_tensor *x, const ct_tensor *y) {
  cpu_key_init(k, op);
  cpu_key_add(k, alg);
  cpu_key_add(k, with_ws);
  cpu_key_add(k, p->kernel_h);
  cpu_key_add(k, p->kernel_w);
  cpu_key_add(k, p->stride_h);
  cpu_key_add(k, p->stride_w);
  cpu_key_add(k, p->pad_h);
  cpu_key_add(k, p->pad_w);
  cpu_key_add_tensor(k, x);
  cpu_key_add_tensor(k, y);
}

static ct_status fwd_desc(dnnl_pooling_v2_desc_t *pd, dnnl_prop_kind_t prop, dnnl_alg_kind_t alg,
                          const ct_pool2d_params *p, const ct_tensor *x, const ct_tensor *y, dnnl_memory_desc_t *xm,
                          dnnl_memory_desc_t *ym, const char *what) {
  pool_geom g;
  geom(&g, p, x, y);
  CT_TRY(cpu_md_of(xm, x, what));
  CT_TRY(cpu_md_of(ym, y, what));
  CPU_DNNL(dnnl_pooling_v2_forward_desc_init(pd, prop, alg, xm, ym, g.strides, g.kernel, g.dil, g.pl, g.pr), what);
  return CT_OK;
}

/* Forward entry; with_ws selects training (workspace for max) or inference. */
static ct_status get_fwd(cpu_dev *cd, dnnl_alg_kind_t alg, int with_ws, const ct_pool2d_params *p, const ct_tensor *x,
                         const ct_tensor *y, cpu_entry **out, const char *what) {
  cpu_key k;
  pool_key(&k, OP_POOL_FWD, alg, with_ws, p, x, y);
  cpu_entry *e = cpu_cache_find(cd, &k);
  if (e) {
    *out = e;
    return CT_OK;
  }
  e = cpu_cache_new(&k);
  if (!e) return CT_ERR_OUT_OF_MEMORY;
  dnnl_pooling_v2_desc_t pdesc;
  dnnl_memory_desc_t xm, ym;
  /* Average pooling is always built for training: it doubles as the hint
   * of its backward and has no workspace either way. */
  dnnl_prop_kind_t prop = with_ws || alg != dnnl_pooling_max ? dnnl_forward_training : dnnl_forward_inference;
  ct_status s = fwd_desc(&pdesc, prop, alg, p, x, y, &xm, &ym, what);
  if (s == CT_OK) s = cpu_entry_make_pd(cd, e, &pdesc, NULL, NULL, what);
  if (s == CT_OK) s = cpu_entry_finish(cd, e, what);
  if (s == CT_OK) s = cpu_entry_add_arg(cd, e, DNNL_ARG_SRC, &xm, 0, 0, what);
  if (s == CT_OK) s = cpu_entry_add_arg(cd, e, DNNL_ARG_DST, &ym, 0, 1, what);
  const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(e->pd, dnnl_query_workspace_md, 0);
  if (s == CT_OK && wmd && dnnl_memory_desc_get_size(wmd))
    s = cpu_entry_add_arg(cd, e, DNNL_ARG_WORKSPACE, wmd, 0, 1, what);
  if (s != CT_OK) {
    cpu_entry_destroy(e);
    return s;
  }
  cpu_cache_insert(cd, e);
  *out = e;
  return CT_OK;
}

static ct_status pool_fwd(ct_device *d, dnnl_alg_kind_t alg, const ct_pool2d_params *p, const ct_tensor *x,
                          ct_tensor *y, void *ws, const char *what) {
  int prev = cpu_op_begin(d);
  cpu_dev *cd = cpu_dev_of(d);
  cpu_entry *e;
  int with_ws = alg == dnnl_pooling_max && ws != NULL;
  ct_status s = get_fwd(cd, alg, with_ws, p, x, y, &e, what);
  if (s == CT_OK) {
    cpu_entry_set(e, DNNL_ARG_SRC, x->data);
    cpu_entry_set(e, DNNL_ARG_DST, y->data);
    if (with_ws) cpu_entry_set(e, DNNL_ARG_WORKSPACE, ws);
    s = cpu_entry_run(cd, e, what);
  }
  cpu_op_end(d, prev);
  return s;
}

static ct_status pool_bwd(ct_device *d, dnnl_alg_kind_t alg, const ct_pool2d_params *p, const ct_tensor *dy,
                          const void *ws, ct_tensor *dx, const char *what) {
  int prev = cpu_op_begin(d);
  cpu_dev *cd = cpu_dev_of(d);
  cpu_key k;
  pool_key(&k, OP_POOL_BWD, alg, 0, p, dx, dy);
  ct_status s = CT_OK;
  cpu_entry *e = cpu_cache_find(cd, &k), *hint = NULL;
  if (!e) {
    /* The forward entry (with workspace for max) is the hint and tells the
     * workspace layout; it is cached anyway for the forward pass. */
    s = get_fwd(cd, alg, alg == dnnl_pooling_max, p, dx, dy, &hint, what);
    if (s == CT_OK) {
      e = cpu_cache_new(&k);
      if (!e) s = CT_ERR_OUT_OF_MEMORY;
    }
    if (s == CT_OK) {
      pool_geom g;
      geom(&g, p, dx, dy);
      dnnl_memory_desc_t xm, ym;
      dnnl_pooling_v2_desc_t pdesc;
      s = cpu_md_of(&xm, dx, what);
      if (s == CT_OK) s = cpu_md_of(&ym, dy, what);
      dnnl_status_t st = dnnl_pooling_v2_backward_desc_init(&pdesc, alg, &xm, &ym, g.strides, g.kernel, g.dil, g.pl, g.pr);
      if (s == CT_OK && st != dnnl_success) s = cpu_dnnl_error(st, what, "dnnl_pooling_v2_backward_desc_init");
      if (s == CT_OK) s = cpu_entry_make_pd(cd, e, &pdesc, NULL, hint->pd, what);
      if (s == CT_OK) s = cpu_entry_finish(cd, e, what);
      if (s == CT_OK) s = cpu_entry_add_arg(cd, e, DNNL_ARG_DIFF_DST, &ym, 0, 0, what);
      const dnnl_memory_desc_t *wmd = s == CT_OK ? dnnl_primitive_desc_query_md(hint->pd, dnnl_query_workspace_md, 0) : NULL;
      if (s == CT_OK && alg == dnnl_pooling_max && wmd && dnnl_memory_desc_get_size(wmd))
        s = cpu_entry_add_arg(cd, e, DNNL_ARG_WORKSPACE, wmd, 0, 0, what);
      if (s == CT_OK) s = cpu_entry_add_arg(cd, e, DNNL_ARG_DIFF_SRC, &xm, 0, 1, what);
      if (s == CT_OK) {
        cpu_cache_insert(cd, e);
      } else {
        cpu_entry_destroy(e);
        e = NULL;
      }
    }
  }
  if (s == CT_OK) {
    cpu_entry_set(e, DNNL_ARG_DIFF_DST, dy->data);
    cpu_entry_set(e, DNNL_ARG_WORKSPACE, ws);
    cpu_entry_set(e, DNNL_ARG_DIFF_SRC, dx->data);
    s = cpu_entry_run(cd, e, what);
  }
  cpu_op_end(d, prev);
  return s;
}

size_t cpu_maxpool2d_workspace_bytes(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, const ct_tensor *y) {
  if (own_loops(p, x, y)) return (size_t)ct_tensor_numel(y);
  if (!fast_dtype(x, y)) {
    if (cpu_need_plain(x, y, "maxpool2d_workspace_bytes") != CT_OK) return 0;
    const ct_backend *r = ct_ref_backend();
    return r->maxpool2d_workspace_bytes ? r->maxpool2d_workspace_bytes(d, p, x, y) : 0;
  }
  int prev = cpu_op_begin(d);
  cpu_entry *e;
  size_t bytes = 0;
  if (get_fwd(cpu_dev_of(d), dnnl_pooling_max, 1, p, x, y, &e, "maxpool2d_workspace_bytes") == CT_OK) {
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(e->pd, dnnl_query_workspace_md, 0);
    bytes = wmd ? dnnl_memory_desc_get_size(wmd) : 0;
  }
  cpu_op_end(d, prev);
  return bytes;
}

ct_status cpu_maxpool2d_fwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y, void *ws) {
  if (cpu_maxpool_tiles_ok(p, x, y)) {
    int prev = cpu_op_begin(d);
    cpu_maxpool_tiles_fwd(p, x, y, ws);
    cpu_op_end(d, prev);
    return CT_OK;
  }
  if (cpu_maxpool_windows_ok(p, x, y)) {
    int prev = cpu_op_begin(d);
    ct_status s = cpu_maxpool_windows_fwd(p, x, y, ws);
    cpu_op_end(d, prev);
    return s;
  }
  if (!fast_dtype(x, y)) {
    CT_TRY(cpu_need_plain(x, y, "maxpool2d_fwd"));
    REF_OR(maxpool2d_fwd, d, p, x, y, ws);
  }
  return pool_fwd(d, dnnl_pooling_max, p, x, y, ws, "maxpool2d_fwd");
}

ct_status cpu_maxpool2d_bwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *dy, const void *ws,
                            ct_tensor *dx) {
  /* Every path reads the forward's argmax (the reference's too). */
  if (!ws) return ct_error(CT_ERR_INVALID_ARG, "maxpool2d_bwd: no workspace (the forward ran without one)");
  if (cpu_maxpool_tiles_ok(p, dx, dy)) {
    int prev = cpu_op_begin(d);
    cpu_maxpool_tiles_bwd(p, dy, ws, dx);
    cpu_op_end(d, prev);
    return CT_OK;
  }
  if (cpu_maxpool_windows_ok(p, dx, dy)) {
    int prev = cpu_op_begin(d);
    ct_status s = cpu_maxpool_windows_bwd(p, dy, ws, dx);
    cpu_op_end(d, prev);
    return s;
  }
  if (!fast_dtype(dx, dy)) {
    CT_TRY(cpu_need_plain(dx, dy, "maxpool2d_bwd"));
    REF_OR(maxpool2d_bwd, d, p, dy, ws, dx);
  }
  return pool_bwd(d, dnnl_pooling_max, p, dy, ws, dx, "maxpool2d_bwd");
}

/* Whether oneDNN's divisor equals PyTorch's for this average pooling. */
static int avg_exact(const ct_pool2d_params *p, const ct_tensor *x, const ct_tensor *y) {
  if (!p->count_include_pad) return 1;
  pool_geom g;
  geom(&g, p, x, y);
  return g.pr[0] <= p->pad_h && g.pr[1] <= p->pad_w;
}

static dnnl_alg_kind_t avg_alg(const ct_pool2d_params *p) {
  return p->count_include_pad ? dnnl_pooling_avg_include_padding : dnnl_pooling_avg_exclude_padding;
}

ct_status cpu_avgpool2d_fwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y) {
  if (!fast_dtype(x, y) || !avg_exact(p, x, y)) {
    CT_TRY(cpu_need_plain(x, y, "avgpool2d_fwd"));
    REF_OR(avgpool2d_fwd, d, p, x, y);
  }
  return pool_fwd(d, avg_alg(p), p, x, y, NULL, "avgpool2d_fwd");
}

ct_status cpu_avgpool2d_bwd(ct_device *d, const ct_pool2d_params *p, const ct_tensor *dy, ct_tensor *dx) {
  if (!fast_dtype(dx, dy) || !avg_exact(p, dx, dy)) {
    CT_TRY(cpu_need_plain(dx, dy, "avgpool2d_bwd"));
    REF_OR(avgpool2d_bwd, d, p, dy, dx);
  }
  return pool_bwd(d, avg_alg(p), p, dy, NULL, dx, "avgpool2d_bwd");
}
