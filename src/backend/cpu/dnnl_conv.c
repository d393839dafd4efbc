/* 2-D convolution through oneDNN: forward with bias and a fused activation
 * post-op, backward data, backward weights (+bias). f32, or bf16 x/w/dy
 * with f32 or bf16 outputs (f32 accumulation inside oneDNN) where oneDNN
 * implements bf16 (cpu_dnnl_bf16: AVX-512); other dtypes, and bf16 below
 * AVX-512, take the widening path (ref_half.c).
 *
 * Layouts: weights are plain OIHW; activations are plain NCHW or, when the
 * executor chose CT_LAYOUT_C16 / C8, nChw16c / nChw8c. By default the primitive is
 * created with format `any` so oneDNN picks its blocked layouts (nChw16c,
 * OIhw16i16o...) and its direct JIT kernels; the entry owns the reorders
 * between those and the tensors' layouts (none for a C16 or C8 activation the
 * kernel also wants as nChw16c). cpu_conv_set_blocked(0) forces plain
 * layouts (gemm-based kernels, no reorders) so the two can be measured.
 *
 * Kernel taps that read only padding at every output position (a 3x3
 * kernel on a 1x1 map) are cropped away before oneDNN sees the shape
 * (cpu_conv_used_taps); the weights are then a strided view of the full
 * kernel, and the dropped taps' weight gradients are zero (beta times the
 * old value when accumulating).
 *
 * Some f32 convolutions do not reach oneDNN, where it was measured slow:
 * those onto maps of a few positions (dnnl_conv_gemm.c, batched GEMMs),
 * and in dnnl_conv_thin.c the weight gradient of a one-channel input and
 * the forward of large kernels on few channels (AlexNet's first layer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/cpu_conv.h"

enum { OP_CONV_FWD = 100, OP_CONV_BWD_DATA, OP_CONV_BWD_W };

static int use_blocked = 1;
void cpu_conv_set_blocked(int on) { use_blocked = on; }
int cpu_conv_blocked(void) { return use_blocked; }

/* The primitive's geometry. Kernel taps that read only padding for every
 * output position are cropped away (see cpu_conv_used_taps): wd then
 * holds the cropped kernel, and the weights (and the weight gradient) are
 * the view of the caller's full kernel at element offset woff with the
 * full kernel's strides wstr. */
typedef struct conv_geom {
  int64_t xd[4], wd[5], yd[4];
  int wnd; /* 4, or 5 with a leading groups dim */
  int cropped;
  int64_t woff;
  dnnl_dims_t wstr;
  dnnl_dims_t strides, dil, pl, pr;
} conv_geom;

/* The taps [*t0, *t1] of one kernel dimension (extent k, stride s, left
 * padding p, dilation d; input extent n, output extent o) that read the
 * input at some output position. Tap t does iff some output j in [0, o)
 * has 0 <= j*s - p + t*d < n. A small input with a large kernel leaves
 * taps that read padding only (ResNet-18 at 32x32: its last 3x3
 * convolutions see 1x1 maps, and only the centre tap reads data); oneDNN
 * would compute them, and on AVX2 it falls back to im2col + GEMM for such
 * shapes, 8x slower than the 1x1 convolution they are. Sets *t0 > *t1
 * when no tap reads data. */
void cpu_conv_used_taps(int64_t n, int64_t o, int64_t k, int64_t s, int64_t p, int64_t d, int64_t *t0, int64_t *t1) {
  *t0 = k, *t1 = -1;
  for (int64_t t = 0; t < k; t++) {
    int64_t lo = t * d - p;                     /* the input row output 0 reads */
    int64_t j = lo >= 0 ? 0 : (-lo + s - 1) / s; /* the first output that reads a row >= 0 */
    if (j < o && lo + j * s < n) {
      if (t < *t0) *t0 = t;
      *t1 = t;
    }
  }
}

static void conv_geom_init(conv_geom *g, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w,
                           const ct_tensor *y) {
  for (int i = 0; i < 4; i++) g->xd[i] = x->shape[i], g->yd[i] = y->shape[i];
  int G = p->groups > 0 ? p->groups : 1;
  if (G > 1) {
    g->wnd = 5;
    g->wd[0] = G;
    g->wd[1] = w->shape[0] / G;
    for (int i = 1; i < 4; i++) g->wd[i + 1] = w->shape[i];
  } else {
    g->wnd = 4;
    for (int i = 0; i < 4; i++) g->wd[i] = w->shape[i];
  }
  g->wstr[g->wnd - 1] = 1;
  for (int i = g->wnd - 2; i >= 0; i--) g->wstr[i] = g->wstr[i + 1] * g->wd[i + 1];
  const int64_t stride[2] = {p->stride_h, p->stride_w}, pad[2] = {p->pad_h, p->pad_w};
  const int64_t dil[2] = {p->dil_h > 0 ? p->dil_h : 1, p->dil_w > 0 ? p->dil_w : 1};
  g->cropped = 0;
  g->woff = 0;
  for (int a = 0; a < 2; a++) {
    int64_t *k = &g->wd[g->wnd - 2 + a], t0, t1;
    cpu_conv_used_taps(x->shape[2 + a], y->shape[2 + a], *k, stride[a], pad[a], dil[a], &t0, &t1);
    g->pl[a] = pad[a];
    /* Dilation 1 only: then the cropped left padding p - t0 is never
     * negative (the tap before t0 would otherwise read data). */
    if (dil[a] == 1 && t0 <= t1 && (t0 > 0 || t1 < *k - 1)) {
      g->pl[a] = pad[a] - t0;
      g->woff += t0 * g->wstr[g->wnd - 2 + a];
      *k = t1 - t0 + 1;
      g->cropped = 1;
    }
    g->strides[a] = stride[a];
    g->dil[a] = dil[a] - 1; /* oneDNN counts the gaps, PyTorch the step */
    /* PyTorch floors the output size; oneDNN wants the right padding that
     * yields exactly that size (it may be smaller than the left one). */
    g->pr[a] = (y->shape[2 + a] - 1) * stride[a] + (*k - 1) * dil[a] + 1 - x->shape[2 + a] - g->pl[a];
  }
}

/* The caller's weights (or weight gradient) as the primitive sees them:
 * plain, or the cropped view into the full kernel. */
static ct_status weights_md(dnnl_memory_desc_t *md, const conv_geom *g, ct_dtype t, const char *what) {
  if (!g->cropped) return cpu_md_plain(md, g->wnd, g->wd, t, what);
  dnnl_dims_t dd;
  for (int i = 0; i < g->wnd; i++) dd[i] = g->wd[i];
  CPU_DNNL(dnnl_memory_desc_init_by_strides(md, g->wnd, dd, cpu_dnnl_dtype(t), g->wstr), what);
  return CT_OK;
}

/* The address of the first kept tap in a full kernel of dtype t. */
static void *weights_at(const conv_geom *g, void *w, ct_dtype t) {
  return (char *)w + (size_t)g->woff * ct_dtype_size(t);
}

static void key_params(cpu_key *k, const ct_conv2d_params *p) {
  cpu_key_add(k, p->stride_h);
  cpu_key_add(k, p->stride_w);
  cpu_key_add(k, p->pad_h);
  cpu_key_add(k, p->pad_w);
  cpu_key_add(k, p->dil_h);
  cpu_key_add(k, p->dil_w);
  cpu_key_add(k, p->groups);
  cpu_key_add(k, use_blocked);
}

static int fast_dtypes(ct_dtype in, ct_dtype in2, ct_dtype out) {
  if (in != in2) return 0;
  if (in == CT_F32) return out == CT_F32;
  return in == CT_BF16 && (out == CT_F32 || out == CT_BF16) && cpu_dnnl_bf16();
}

/* Descriptors for the primitive: `any` when blocked layouts are on. */
static ct_status prim_md(dnnl_memory_desc_t *md, int nd, const int64_t *dims, ct_dtype t, const char *what) {
  return use_blocked ? cpu_md_any(md, nd, dims, t, what) : cpu_md_plain(md, nd, dims, t, what);
}

/* The forward descriptor used both for the forward op and as the hint the
 * backward ops need. */
static ct_status fwd_desc(dnnl_convolution_desc_t *cdesc, const conv_geom *g, ct_dtype xt, ct_dtype wt, ct_dtype yt,
                          const ct_tensor *b, const char *what) {
  dnnl_memory_desc_t xa, wa, ya, bm;
  CT_TRY(prim_md(&xa, 4, g->xd, xt, what));
  CT_TRY(prim_md(&wa, g->wnd, g->wd, wt, what));
  CT_TRY(prim_md(&ya, 4, g->yd, yt, what));
  if (b) CT_TRY(cpu_md_plain(&bm, 1, b->shape, b->dtype, what));
  CPU_DNNL(dnnl_dilated_convolution_forward_desc_init(cdesc, dnnl_forward_training, dnnl_convolution_direct, &xa, &wa,
                                                      b ? &bm : NULL, &ya, g->strides, g->dil, g->pl, g->pr),
           what);
  return CT_OK;
}

static ct_status make_fwd(cpu_dev *cd, cpu_entry *e, const conv_geom *g, const ct_tensor *x, const ct_tensor *w,
                          const ct_tensor *b, ct_act act, const ct_tensor *y, const char *what) {
  dnnl_convolution_desc_t cdesc;
  CT_TRY(fwd_desc(&cdesc, g, x->dtype, w->dtype, y->dtype, b, what));
  dnnl_primitive_attr_t attr;
  CPU_DNNL(dnnl_primitive_attr_create(&attr), what);
  float alpha, beta;
  dnnl_alg_kind_t alg = cpu_act_alg(act, &alpha, &beta);
  if (alg != dnnl_alg_kind_undef) {
    dnnl_post_ops_t po;
    dnnl_post_ops_create(&po);
    dnnl_post_ops_append_eltwise(po, 1.f, alg, alpha, beta);
    dnnl_primitive_attr_set_post_ops(attr, po);
    dnnl_post_ops_destroy(po);
  }
  ct_status s = cpu_entry_make_pd(cd, e, &cdesc, attr, NULL, what);
  dnnl_primitive_attr_destroy(attr);
  CT_TRY(s);
  CT_TRY(cpu_entry_finish(cd, e, what));
  dnnl_memory_desc_t xm, wm, ym, bm;
  CT_TRY(cpu_md_of(&xm, x, what));
  CT_TRY(weights_md(&wm, g, w->dtype, what));
  CT_TRY(cpu_md_of(&ym, y, what));
  CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_SRC, &xm, dnnl_query_src_md, 0, what));
  CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_WEIGHTS, &wm, dnnl_query_weights_md, 0, what));
  if (b) {
    CT_TRY(cpu_md_plain(&bm, 1, b->shape, b->dtype, what));
    CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_BIAS, &bm, 0, 0, what));
  }
  CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_DST, &ym, dnnl_query_dst_md, 1, what));
  return CT_OK;
}

/* Looks up or builds an entry; the builder runs only on a miss. */
#define CONV_ENTRY(cd, k, e, build)                  \
  do {                                               \
    e = cpu_cache_find(cd, &k);                      \
    if (!e) {                                        \
      e = cpu_cache_new(&k);                         \
      if (!e) { s = CT_ERR_OUT_OF_MEMORY; break; }   \
      s = (build);                                   \
      if (s != CT_OK) { cpu_entry_destroy(e); e = NULL; break; } \
      cpu_cache_insert(cd, e);                       \
    }                                                \
  } while (0)

ct_status cpu_conv2d_fwd(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *w,
                         const ct_tensor *b, ct_act act, ct_tensor *y) {
  if (!fast_dtypes(x->dtype, w->dtype, y->dtype)) {
    CT_TRY(cpu_need_plain(x, y, "conv2d_fwd"));
    REF_OR(conv2d_fwd, d, p, x, w, b, act, y);
  }
  char what[160], sx[48], sw[48];
  snprintf(what, sizeof what, "conv2d_fwd x%s w%s", ct_shape_str(4, x->shape, sx, sizeof sx),
           ct_shape_str(4, w->shape, sw, sizeof sw));
  int prev = cpu_op_begin(d);
  cpu_dev *cd = cpu_dev_of(d);
  if (cpu_conv_gemm_ok(p, x, w, y, act, 0)) {
    ct_status s = cpu_conv_gemm_fwd(cd, p, x, w, b, act, y, what);
    cpu_op_end(d, prev);
    return s;
  }
  if (cpu_conv_thin_fwd_ok(p, x, w, y, act)) {
    ct_status s = cpu_conv_thin_fwd(cd, p, x, w, b, act, y, what);
    cpu_op_end(d, prev);
    return s;
  }
  cpu_key k;
  cpu_key_init(&k, OP_CONV_FWD);
  key_params(&k, p);
  cpu_key_add(&k, act);
  cpu_key_add_tensor(&k, x);
  cpu_key_add_tensor(&k, w);
  cpu_key_add_tensor(&k, b);
  cpu_key_add_tensor(&k, y);
  conv_geom g;
  conv_geom_init(&g, p, x, w, y);
  ct_status s = CT_OK;
  cpu_entry *e;
  CONV_ENTRY(cd, k, e, make_fwd(cd, e, &g, x, w, b, act, y, what));
  if (s == CT_OK) {
    cpu_entry_set(e, DNNL_ARG_SRC, x->data);
    cpu_entry_set(e, DNNL_ARG_WEIGHTS, weights_at(&g, w->data, w->dtype));
    if (b) cpu_entry_set(e, DNNL_ARG_BIAS, b->data);
    cpu_entry_set(e, DNNL_ARG_DST, y->data);
    s = cpu_entry_run(cd, e, what);
  }
  cpu_op_end(d, prev);
  return s;
}

static ct_status make_hint(cpu_dev *cd, dnnl_primitive_desc_t *hint, const conv_geom *g, ct_dtype xt, ct_dtype wt,
                           ct_dtype yt, const ct_tensor *b, const char *what) {
  dnnl_convolution_desc_t cdesc;
  CT_TRY(fwd_desc(&cdesc, g, xt, wt, yt, b, what));
  CPU_DNNL(dnnl_primitive_desc_create(hint, &cdesc, NULL, cd->engine, NULL), what);
  return CT_OK;
}

static ct_status make_bwd_data(cpu_dev *cd, cpu_entry *e, const conv_geom *g, const ct_tensor *dy, const ct_tensor *w,
                               const ct_tensor *dx, const char *what) {
  dnnl_primitive_desc_t hint;
  /* The hint only steers layouts; it is built in the input dtype since
   * oneDNN has no f32-src/bf16-weights forward. */
  CT_TRY(make_hint(cd, &hint, g, w->dtype, w->dtype, dy->dtype, NULL, what));
  dnnl_memory_desc_t dxa, wa, dya;
  ct_status s = prim_md(&dxa, 4, g->xd, dx->dtype, what);
  if (s == CT_OK) s = prim_md(&wa, g->wnd, g->wd, w->dtype, what);
  if (s == CT_OK) s = prim_md(&dya, 4, g->yd, dy->dtype, what);
  dnnl_convolution_desc_t cdesc;
  dnnl_status_t st = dnnl_dilated_convolution_backward_data_desc_init(&cdesc, dnnl_convolution_direct, &dxa, &wa, &dya,
                                                                     g->strides, g->dil, g->pl, g->pr);
  if (s == CT_OK && st != dnnl_success) s = cpu_dnnl_error(st, what, "dnnl_dilated_convolution_backward_data_desc_init");
  if (s == CT_OK) s = cpu_entry_make_pd(cd, e, &cdesc, NULL, hint, what);
  dnnl_primitive_desc_destroy(hint);
  CT_TRY(s);
  CT_TRY(cpu_entry_finish(cd, e, what));
  dnnl_memory_desc_t dxm, wm, dym;
  CT_TRY(cpu_md_of(&dxm, dx, what));
  CT_TRY(weights_md(&wm, g, w->dtype, what));
  CT_TRY(cpu_md_of(&dym, dy, what));
  CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_DIFF_DST, &dym, dnnl_query_diff_dst_md, 0, what));
  CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_WEIGHTS, &wm, dnnl_query_weights_md, 0, what));
  CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_DIFF_SRC, &dxm, dnnl_query_diff_src_md, 1, what));
  return CT_OK;
}

ct_status cpu_conv2d_bwd_data(ct_device *d, const ct_conv2d_params *p, const ct_tensor *dy, const ct_tensor *w,
                              ct_tensor *dx) {
  if (!fast_dtypes(dy->dtype, w->dtype, dx->dtype)) {
    CT_TRY(cpu_need_plain(dy, dx, "conv2d_bwd_data"));
    REF_OR(conv2d_bwd_data, d, p, dy, w, dx);
  }
  char what[160], sx[48], sw[48];
  snprintf(what, sizeof what, "conv2d_bwd_data dx%s w%s", ct_shape_str(4, dx->shape, sx, sizeof sx),
           ct_shape_str(4, w->shape, sw, sizeof sw));
  int prev = cpu_op_begin(d);
  cpu_dev *cd = cpu_dev_of(d);
  if (cpu_conv_gemm_ok(p, dx, w, dy, CT_ACT_NONE, 1)) {
    ct_status s = cpu_conv_gemm_bwd_data(cd, p, dy, w, dx, what);
    cpu_op_end(d, prev);
    return s;
  }
  cpu_key k;
  cpu_key_init(&k, OP_CONV_BWD_DATA);
  key_params(&k, p);
  cpu_key_add_tensor(&k, dy);
  cpu_key_add_tensor(&k, w);
  cpu_key_add_tensor(&k, dx);
  conv_geom g;
  conv_geom_init(&g, p, dx, w, dy);
  ct_status s = CT_OK;
  cpu_entry *e;
  CONV_ENTRY(cd, k, e, make_bwd_data(cd, e, &g, dy, w, dx, what));
  if (s == CT_OK) {
    cpu_entry_set(e, DNNL_ARG_DIFF_DST, dy->data);
    cpu_entry_set(e, DNNL_ARG_WEIGHTS, weights_at(&g, w->data, w->dtype));
    cpu_entry_set(e, DNNL_ARG_DIFF_SRC, dx->data);
    s = cpu_entry_run(cd, e, what);
  }
  cpu_op_end(d, prev);
  return s;
}

/* Weight and bias gradients are produced in f32 into entry temporaries and
 * then folded into the caller's buffers with beta (oneDNN overwrites and
 * has no sum post-op for backward weights); they are small next to x. */
static ct_status make_bwd_w(cpu_dev *cd, cpu_entry *e, const conv_geom *g, const ct_tensor *x, const ct_tensor *dy,
                            const ct_tensor *db, const char *what) {
  dnnl_primitive_desc_t hint;
  int64_t O = g->yd[1];
  dnnl_memory_desc_t bm;
  if (db) CT_TRY(cpu_md_plain(&bm, 1, &O, CT_F32, what));
  ct_tensor bt = ct_tensor_1d(NULL, CT_F32, O);
  CT_TRY(make_hint(cd, &hint, g, x->dtype, x->dtype, dy->dtype, db ? &bt : NULL, what));
  dnnl_memory_desc_t xa, dwa, dya;
  ct_status s = prim_md(&xa, 4, g->xd, x->dtype, what);
  if (s == CT_OK) s = prim_md(&dwa, g->wnd, g->wd, CT_F32, what);
  if (s == CT_OK) s = prim_md(&dya, 4, g->yd, dy->dtype, what);
  dnnl_convolution_desc_t cdesc;
  dnnl_status_t st = dnnl_dilated_convolution_backward_weights_desc_init(
      &cdesc, dnnl_convolution_direct, &xa, &dwa, db ? &bm : NULL, &dya, g->strides, g->dil, g->pl, g->pr);
  if (s == CT_OK && st != dnnl_success)
    s = cpu_dnnl_error(st, what, "dnnl_dilated_convolution_backward_weights_desc_init");
  if (s == CT_OK) s = cpu_entry_make_pd(cd, e, &cdesc, NULL, hint, what);
  dnnl_primitive_desc_destroy(hint);
  CT_TRY(s);
  CT_TRY(cpu_entry_finish(cd, e, what));
  dnnl_memory_desc_t xm, dwm, dym;
  CT_TRY(cpu_md_of(&xm, x, what));
  CT_TRY(weights_md(&dwm, g, CT_F32, what));
  CT_TRY(cpu_md_of(&dym, dy, what));
  CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_SRC, &xm, dnnl_query_src_md, 0, what));
  CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_DIFF_DST, &dym, dnnl_query_diff_dst_md, 0, what));
  CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_DIFF_WEIGHTS, &dwm, dnnl_query_diff_weights_md, 1, what));
  if (db) CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_DIFF_BIAS, &bm, 0, 1, what));
  /* The full kernel's gradient: a cropped one writes only its view, and
   * the dropped taps' zeros stay. */
  size_t wn = (size_t)(g->wd[0] * g->wstr[0]);
  if (!cpu_entry_tmp(e, 0, wn * sizeof(float)) || (db && !cpu_entry_tmp(e, 1, (size_t)O * sizeof(float))))
    return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate gradient temporaries", what);
  memset(e->tmp[0], 0, wn * sizeof(float));
  return CT_OK;
}

ct_status cpu_conv2d_bwd_weights(ct_device *d, const ct_conv2d_params *p, const ct_tensor *x, const ct_tensor *dy,
                                 ct_tensor *dw, ct_tensor *db, float beta) {
  char what[160], sx[48], sw[48];
  snprintf(what, sizeof what, "conv2d_bwd_weights x%s dw%s", ct_shape_str(4, x->shape, sx, sizeof sx),
           ct_shape_str(4, dw->shape, sw, sizeof sw));
  /* First layers, bf16 too where oneDNN has none (before the widening
   * path: the thin loop converts as it reads). */
  if (cpu_conv_thin_ok(p, x, dy, dw, db)) {
    int prev = cpu_op_begin(d);
    ct_status s = cpu_conv_thin_wgrad(cpu_dev_of(d), p, x, dy, dw, db, beta, what);
    cpu_op_end(d, prev);
    return s;
  }
  if (!fast_dtypes(x->dtype, dy->dtype, dw->dtype) || (db && db->dtype != CT_F32 && db->dtype != CT_BF16)) {
    CT_TRY(cpu_need_plain(x, dy, "conv2d_bwd_weights"));
    REF_OR(conv2d_bwd_weights, d, p, x, dy, dw, db, beta);
  }
  int prev = cpu_op_begin(d);
  cpu_dev *cd = cpu_dev_of(d);
  if (cpu_conv_gemm_ok(p, x, dw, dy, CT_ACT_NONE, 0) && (!db || db->dtype == CT_F32)) {
    ct_status s = cpu_conv_gemm_bwd_weights(cd, p, x, dy, dw, db, beta, what);
    cpu_op_end(d, prev);
    return s;
  }
  cpu_key k;
  cpu_key_init(&k, OP_CONV_BWD_W);
  key_params(&k, p);
  cpu_key_add_tensor(&k, x);
  cpu_key_add_tensor(&k, dy);
  cpu_key_add_tensor(&k, dw);
  cpu_key_add(&k, db != NULL);
  conv_geom g;
  conv_geom_init(&g, p, x, dw, dy);
  ct_status s = CT_OK;
  cpu_entry *e;
  CONV_ENTRY(cd, k, e, make_bwd_w(cd, e, &g, x, dy, db, what));
  if (s == CT_OK) {
    cpu_entry_set(e, DNNL_ARG_SRC, x->data);
    cpu_entry_set(e, DNNL_ARG_DIFF_DST, dy->data);
    cpu_entry_set(e, DNNL_ARG_DIFF_WEIGHTS, weights_at(&g, e->tmp[0], CT_F32));
    if (db) cpu_entry_set(e, DNNL_ARG_DIFF_BIAS, e->tmp[1]);
    s = cpu_entry_run(cd, e, what);
  }
  if (s == CT_OK) {
    cpu_accumulate_f32(dw->data, dw->dtype, e->tmp[0], ct_tensor_numel(dw), beta);
    if (db) cpu_accumulate_f32(db->data, db->dtype, e->tmp[1], ct_tensor_numel(db), beta);
  }
  cpu_op_end(d, prev);
  return s;
}
