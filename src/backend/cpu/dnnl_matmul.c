/* Dense products through the oneDNN matmul primitive: matmul (with
 * transposes, alpha as output scale, beta as a sum post-op) and the three
 * linear-layer ops. Transposed operands are described with strides, so no
 * copy is made. f32, or bf16 inputs with an f32 or bf16 output where
 * oneDNN implements bf16 (cpu_dnnl_bf16); other dtypes take the widening
 * path. */
#include <string.h>

#include "backend/cpu/cpu_impl.h"

enum { OP_MATMUL = 200 };

/* One product dst[M,N] = alpha * src[M,K] @ wei[K,N] (+ bias[N]) then act,
 * + beta*dst; src/wei may be strided (transposed views). */
typedef struct mm_desc {
  int64_t M, K, N;
  int64_t src_strides[2], wei_strides[2];
  ct_dtype st, wt, dt, bt; /* bt = CT_DTYPE_COUNT for no bias */
  float alpha, beta;
  ct_act act;
} mm_desc;

static int fast_dtypes(ct_dtype a, ct_dtype b, ct_dtype c) {
  if (a != b) return 0;
  if (a == CT_F32) return c == CT_F32;
  return a == CT_BF16 && (c == CT_F32 || c == CT_BF16) && cpu_dnnl_bf16();
}

static ct_status build(cpu_dev *cd, cpu_entry *e, const mm_desc *m, const char *what) {
  dnnl_memory_desc_t sm, wm, dm, bm;
  dnnl_dims_t sd = {m->M, m->K}, wd = {m->K, m->N}, dd = {m->M, m->N}, bd = {1, m->N};
  dnnl_dims_t ss = {m->src_strides[0], m->src_strides[1]}, ws = {m->wei_strides[0], m->wei_strides[1]};
  CPU_DNNL(dnnl_memory_desc_init_by_strides(&sm, 2, sd, cpu_dnnl_dtype(m->st), ss), what);
  CPU_DNNL(dnnl_memory_desc_init_by_strides(&wm, 2, wd, cpu_dnnl_dtype(m->wt), ws), what);
  CPU_DNNL(dnnl_memory_desc_init_by_tag(&dm, 2, dd, cpu_dnnl_dtype(m->dt), dnnl_ab), what);
  int has_bias = m->bt != CT_DTYPE_COUNT;
  if (has_bias) CPU_DNNL(dnnl_memory_desc_init_by_tag(&bm, 2, bd, cpu_dnnl_dtype(m->bt), dnnl_ab), what);
  dnnl_matmul_desc_t md;
  CPU_DNNL(dnnl_matmul_desc_init(&md, &sm, &wm, has_bias ? &bm : NULL, &dm), what);
  dnnl_primitive_attr_t attr;
  CPU_DNNL(dnnl_primitive_attr_create(&attr), what);
  if (m->alpha != 1.f) dnnl_primitive_attr_set_output_scales(attr, 1, 0, &m->alpha);
  dnnl_post_ops_t po;
  dnnl_post_ops_create(&po);
  /* oneDNN applies post-ops in order: the sum (old dst) must come after
   * the activation only for linear, which never has beta; matmul has no act. */
  float a, b;
  dnnl_alg_kind_t alg = cpu_act_alg(m->act, &a, &b);
  if (alg != dnnl_alg_kind_undef) dnnl_post_ops_append_eltwise(po, 1.f, alg, a, b);
  if (m->beta != 0.f) dnnl_post_ops_append_sum(po, m->beta);
  dnnl_primitive_attr_set_post_ops(attr, po);
  dnnl_post_ops_destroy(po);
  ct_status s = cpu_entry_make_pd(cd, e, &md, attr, NULL, what);
  dnnl_primitive_attr_destroy(attr);
  CT_TRY(s);
  CT_TRY(cpu_entry_finish(cd, e, what));
  CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_SRC, &sm, 0, 0, what));
  CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_WEIGHTS, &wm, 0, 0, what));
  if (has_bias) CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_BIAS, &bm, 0, 0, what));
  CT_TRY(cpu_entry_add_arg(cd, e, DNNL_ARG_DST, &dm, 0, 1, what));
  return CT_OK;
}

static ct_status run_mm(ct_device *d, const mm_desc *m, const void *src, const void *wei, const void *bias, void *dst,
                        const char *what) {
  int prev = cpu_op_begin(d);
  cpu_dev *cd = cpu_dev_of(d);
  cpu_key k;
  cpu_key_init(&k, OP_MATMUL);
  cpu_key_add(&k, m->M);
  cpu_key_add(&k, m->K);
  cpu_key_add(&k, m->N);
  cpu_key_add(&k, m->src_strides[0]);
  cpu_key_add(&k, m->src_strides[1]);
  cpu_key_add(&k, m->wei_strides[0]);
  cpu_key_add(&k, m->wei_strides[1]);
  cpu_key_add(&k, m->st | m->wt << 4 | m->dt << 8 | m->bt << 12);
  uint32_t ab[2];
  memcpy(&ab[0], &m->alpha, 4);
  memcpy(&ab[1], &m->beta, 4);
  cpu_key_add(&k, ab[0]);
  cpu_key_add(&k, ab[1]);
  cpu_key_add(&k, m->act);
  ct_status s = CT_OK;
  cpu_entry *e = cpu_cache_find(cd, &k);
  if (!e) {
    e = cpu_cache_new(&k);
    s = e ? build(cd, e, m, what) : CT_ERR_OUT_OF_MEMORY;
    if (s == CT_OK) {
      cpu_cache_insert(cd, e);
    } else {
      cpu_entry_destroy(e);
      e = NULL;
    }
  }
  if (s == CT_OK) {
    cpu_entry_set(e, DNNL_ARG_SRC, src);
    cpu_entry_set(e, DNNL_ARG_WEIGHTS, wei);
    if (bias) cpu_entry_set(e, DNNL_ARG_BIAS, bias);
    cpu_entry_set(e, DNNL_ARG_DST, dst);
    s = cpu_entry_run(cd, e, what);
  }
  cpu_op_end(d, prev);
  return s;
}

ct_status cpu_matmul(ct_device *d, int trans_a, int trans_b, const ct_tensor *a, const ct_tensor *b, float alpha,
                     float beta, ct_tensor *c) {
  if (!fast_dtypes(a->dtype, b->dtype, c->dtype)) {
    REF_OR(matmul, d, trans_a, trans_b, a, b, alpha, beta, c);
  }
  mm_desc m = {0};
  m.M = c->shape[0];
  m.N = c->shape[1];
  m.K = trans_a ? a->shape[0] : a->shape[1];
  /* a is [M,K] row-major, or [K,M] when transposed: element (i,k) at
   * i*K+k, or k*M+i. Same for b. */
  m.src_strides[0] = trans_a ? 1 : m.K;
  m.src_strides[1] = trans_a ? m.M : 1;
  m.wei_strides[0] = trans_b ? 1 : m.N;
  m.wei_strides[1] = trans_b ? m.K : 1;
  m.st = a->dtype;
  m.wt = b->dtype;
  m.dt = c->dtype;
  m.bt = CT_DTYPE_COUNT;
  m.alpha = alpha;
  m.beta = beta;
  m.act = CT_ACT_NONE;
  return run_mm(d, &m, a->data, b->data, NULL, c->data, "matmul");
}

ct_status cpu_linear_fwd(ct_device *d, const ct_tensor *x, const ct_tensor *w, const ct_tensor *b, ct_act act,
                         ct_tensor *y) {
  if (!fast_dtypes(x->dtype, w->dtype, y->dtype) || (b && b->dtype != CT_F32 && b->dtype != CT_BF16)) {
    REF_OR(linear_fwd, d, x, w, b, act, y);
  }
  mm_desc m = {0};
  m.M = x->shape[0];
  m.K = x->shape[1];
  m.N = w->shape[0];
  m.src_strides[0] = m.K;
  m.src_strides[1] = 1;
  m.wei_strides[0] = 1; /* w^T: element (k,n) at n*K+k */
  m.wei_strides[1] = m.K;
  m.st = x->dtype;
  m.wt = w->dtype;
  m.dt = y->dtype;
  m.bt = b ? b->dtype : CT_DTYPE_COUNT;
  m.alpha = 1.f;
  m.act = act;
  return run_mm(d, &m, x->data, w->data, b ? b->data : NULL, y->data, "linear_fwd");
}

ct_status cpu_linear_bwd_data(ct_device *d, const ct_tensor *dy, const ct_tensor *w, ct_tensor *dx) {
  if (!fast_dtypes(dy->dtype, w->dtype, dx->dtype)) {
    REF_OR(linear_bwd_data, d, dy, w, dx);
  }
  mm_desc m = {0};
  m.M = dy->shape[0];
  m.K = dy->shape[1];
  m.N = w->shape[1];
  m.src_strides[0] = m.K;
  m.src_strides[1] = 1;
  m.wei_strides[0] = m.N;
  m.wei_strides[1] = 1;
  m.st = dy->dtype;
  m.wt = w->dtype;
  m.dt = dx->dtype;
  m.bt = CT_DTYPE_COUNT;
  m.alpha = 1.f;
  return run_mm(d, &m, dy->data, w->data, NULL, dx->data, "linear_bwd_data");
}

/* db[m] = beta*db[m] + sum_n dy[n,m]; accumulated in double per column so
 * large batches do not lose bits. */
static void bias_grad(const ct_tensor *dy, ct_tensor *db, float beta) {
  int64_t N = dy->shape[0], M = dy->shape[1];
#pragma omp parallel for if (N * M > 65536)
  for (int64_t j = 0; j < M; j++) {
    double acc = 0;
    if (dy->dtype == CT_F32) {
      const float *p = (const float *)dy->data + j;
      for (int64_t n = 0; n < N; n++) acc += p[n * M];
    } else {
      const uint16_t *p = (const uint16_t *)dy->data + j;
      for (int64_t n = 0; n < N; n++) acc += ct_bf16_to_f32(p[n * M]);
    }
    if (db->dtype == CT_F32) {
      float *o = (float *)db->data + j;
      *o = beta == 0.f ? (float)acc : (float)(beta * *o + acc);
    } else {
      uint16_t *o = (uint16_t *)db->data + j;
      *o = ct_f32_to_bf16(beta == 0.f ? (float)acc : (float)(beta * ct_bf16_to_f32(*o) + acc));
    }
  }
}

ct_status cpu_linear_bwd_weights(ct_device *d, const ct_tensor *x, const ct_tensor *dy, ct_tensor *dw, ct_tensor *db,
                                 float beta) {
  if (!fast_dtypes(x->dtype, dy->dtype, dw->dtype) || (db && db->dtype != CT_F32 && db->dtype != CT_BF16)) {
    REF_OR(linear_bwd_weights, d, x, dy, dw, db, beta);
  }
  mm_desc m = {0};
  m.M = dy->shape[1];
  m.K = dy->shape[0];
  m.N = x->shape[1];
  m.src_strides[0] = 1; /* dy^T: element (i=m, k=n) at n*M+m */
  m.src_strides[1] = m.M;
  m.wei_strides[0] = m.N;
  m.wei_strides[1] = 1;
  m.st = dy->dtype;
  m.wt = x->dtype;
  m.dt = dw->dtype;
  m.bt = CT_DTYPE_COUNT;
  m.alpha = 1.f;
  m.beta = beta;
  CT_TRY(run_mm(d, &m, dy->data, x->data, NULL, dw->data, "linear_bwd_weights"));
  if (db) bias_grad(dy, db, beta);
  return CT_OK;
}
