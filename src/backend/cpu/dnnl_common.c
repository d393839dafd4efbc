/* Shared oneDNN plumbing for the CPU backend: engine/stream per device,
 * the primitive cache, argument layouts and reorders, error mapping. The
 * device lifetime and op entry/exit that need no oneDNN are in
 * cpu_device.c. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl_debug.h>

#include "backend/cpu/cpu_impl.h"

ct_status cpu_dnnl_error(dnnl_status_t st, const char *what, const char *call) {
  return ct_error(st == dnnl_unimplemented ? CT_ERR_UNSUPPORTED : CT_ERR_BACKEND, "%s: oneDNN %s failed: %s", what,
                  call, dnnl_status2str(st));
}

ct_status cpu_dnnl_open(cpu_dev *cd, const char *name) {
  dnnl_status_t st = dnnl_engine_create(&cd->engine, dnnl_cpu, 0);
  if (st != dnnl_success) return cpu_dnnl_error(st, name, "dnnl_engine_create");
  st = dnnl_stream_create(&cd->stream, cd->engine, dnnl_stream_default_flags);
  if (st != dnnl_success) {
    dnnl_engine_destroy(cd->engine);
    return cpu_dnnl_error(st, name, "dnnl_stream_create");
  }
  return CT_OK;
}

/* Whether a descriptor for op_desc can be created on engine (0 or 1). */
static int pd_ok(dnnl_engine_t engine, const void *op_desc) {
  dnnl_primitive_desc_t pd = NULL;
  if (dnnl_primitive_desc_create(&pd, op_desc, NULL, engine, NULL) != dnnl_success) return 0;
  dnnl_primitive_desc_destroy(pd);
  return 1;
}

/* The three kinds the bf16 fast paths build, on one tiny problem each:
 * a 3x3 convolution (bf16 in, f32 out, as autocast's first layer), a
 * matmul and a 2x2 max pool. */
static int probe_bf16(void) {
  dnnl_engine_t engine;
  if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) return 0;
  dnnl_memory_desc_t x, w, y, a, b, c, p;
  dnnl_dims_t xd = {1, 16, 4, 4}, wd = {16, 16, 3, 3}, one = {1, 1}, zero = {0, 0}, pad = {1, 1}, two = {2, 2};
  dnnl_dims_t pd2 = {1, 16, 2, 2}, ad = {2, 2};
  int ok = dnnl_memory_desc_init_by_tag(&x, 4, xd, dnnl_bf16, dnnl_format_tag_any) == dnnl_success &&
           dnnl_memory_desc_init_by_tag(&w, 4, wd, dnnl_bf16, dnnl_format_tag_any) == dnnl_success &&
           dnnl_memory_desc_init_by_tag(&y, 4, xd, dnnl_f32, dnnl_format_tag_any) == dnnl_success &&
           dnnl_memory_desc_init_by_tag(&a, 2, ad, dnnl_bf16, dnnl_ab) == dnnl_success &&
           dnnl_memory_desc_init_by_tag(&b, 2, ad, dnnl_bf16, dnnl_ab) == dnnl_success &&
           dnnl_memory_desc_init_by_tag(&c, 2, ad, dnnl_f32, dnnl_ab) == dnnl_success;
  dnnl_convolution_desc_t cd;
  dnnl_matmul_desc_t md;
  dnnl_pooling_v2_desc_t pl;
  ok = ok &&
       dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &x, &w, NULL,
                                                  &y, one, zero, pad, pad) == dnnl_success &&
       pd_ok(engine, &cd);
  ok = ok && dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) == dnnl_success && pd_ok(engine, &md);
  /* The pool on plain NCHW tensors: the question is whether bf16 pooling exists at all. */
  ok = ok && dnnl_memory_desc_init_by_tag(&x, 4, xd, dnnl_bf16, dnnl_nchw) == dnnl_success &&
       dnnl_memory_desc_init_by_tag(&p, 4, pd2, dnnl_bf16, dnnl_nchw) == dnnl_success &&
       dnnl_pooling_v2_forward_desc_init(&pl, dnnl_forward_training, dnnl_pooling_max, &x, &p, two, two, zero, zero,
                                         zero) == dnnl_success &&
       pd_ok(engine, &pl);
  dnnl_engine_destroy(engine);
  return ok;
}

static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;
static int bf16_native;
static void init_bf16(void) { bf16_native = probe_bf16(); }

int cpu_dnnl_bf16(void) {
  pthread_once(&bf16_once, init_bf16);
  return bf16_native;
}

int cpu_dnnl_avx512(void) {
  return (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
}

void cpu_dnnl_close(cpu_dev *cd) {
  for (int b = 0; b < CPU_CACHE_BUCKETS; b++) {
    cpu_entry *e = cd->buckets[b];
    while (e) {
      cpu_entry *n = e->next;
      cpu_entry_destroy(e);
      e = n;
    }
  }
  dnnl_stream_destroy(cd->stream);
  dnnl_engine_destroy(cd->engine);
}

void cpu_key_init(cpu_key *k, int op) {
  memset(k, 0, sizeof *k);
  k->op = op;
  /* Some oneDNN kernels balance work for the thread count at creation, so
   * a primitive is only reused under the same count. */
  k->nthr = omp_get_max_threads();
}

void cpu_key_add(cpu_key *k, int64_t v) {
  if (k->n < CPU_KEY_WORDS) k->v[k->n] = v;
  k->n++; /* an overflowing key never matches a stored one: n differs */
}

void cpu_key_add_tensor(cpu_key *k, const ct_tensor *t) {
  if (!t) {
    cpu_key_add(k, -1);
    return;
  }
  cpu_key_add(k, (t->layout * 64 + t->dtype) * 16 + t->ndim);
  for (int i = 0; i < t->ndim; i++) cpu_key_add(k, t->shape[i]);
}

static size_t key_hash(const cpu_key *k) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char *p = (const unsigned char *)k;
  for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
  return (size_t)(h % CPU_CACHE_BUCKETS);
}

cpu_entry *cpu_cache_find(cpu_dev *cd, const cpu_key *k) {
  if (k->n > CPU_KEY_WORDS) return NULL;
  for (cpu_entry *e = cd->buckets[key_hash(k)]; e; e = e->next)
    if (memcmp(&e->key, k, sizeof *k) == 0) return e;
  return NULL;
}

cpu_entry *cpu_cache_new(const cpu_key *k) {
  cpu_entry *e = calloc(1, sizeof *e);
  if (!e) {
    ct_error(CT_ERR_OUT_OF_MEMORY, "cpu: cannot allocate a primitive cache entry");
    return NULL;
  }
  e->key = *k;
  return e;
}

void cpu_cache_insert(cpu_dev *cd, cpu_entry *e) {
  if (e->key.n > CPU_KEY_WORDS) return; /* uncacheable: caller destroys it */
  size_t h = key_hash(&e->key);
  e->next = cd->buckets[h];
  cd->buckets[h] = e;
  cd->entries++;
}

cpu_entry *cpu_scratch_entry(cpu_dev *cd, int op) {
  cpu_key k;
  cpu_key_init(&k, op);
  cpu_entry *e = cpu_cache_find(cd, &k);
  if (!e && (e = cpu_cache_new(&k))) cpu_cache_insert(cd, e);
  return e;
}

void cpu_entry_destroy(cpu_entry *e) {
  if (!e) return;
  for (int i = 0; i < e->nargs; i++) {
    cpu_arg *a = &e->args[i];
    if (a->reorder) dnnl_primitive_destroy(a->reorder);
    if (a->prim && a->prim != a->user) dnnl_memory_destroy(a->prim);
    if (a->user) dnnl_memory_destroy(a->user);
    free(a->buf);
  }
  if (e->scratch_mem) dnnl_memory_destroy(e->scratch_mem);
  free(e->scratch);
  for (int i = 0; i < 4; i++) free(e->tmp[i]);
  if (e->prim) dnnl_primitive_destroy(e->prim);
  if (e->pd) dnnl_primitive_desc_destroy(e->pd);
  free(e);
}

static void *alloc64(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64 + 64); }

void *cpu_entry_tmp(cpu_entry *e, int i, size_t bytes) {
  if (e->tmp_bytes[i] < bytes) {
    free(e->tmp[i]);
    e->tmp[i] = alloc64(bytes);
    e->tmp_bytes[i] = e->tmp[i] ? bytes : 0;
  }
  return e->tmp[i];
}

ct_status cpu_entry_make_pd(cpu_dev *cd, cpu_entry *e, const void *op_desc, dnnl_primitive_attr_t attr,
                            const_dnnl_primitive_desc_t hint, const char *what) {
  dnnl_primitive_attr_t own = NULL;
  if (!attr) {
    CPU_DNNL(dnnl_primitive_attr_create(&own), what);
    attr = own;
  }
  dnnl_status_t st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  if (st == dnnl_success) st = dnnl_primitive_desc_create(&e->pd, op_desc, attr, cd->engine, hint);
  if (own) dnnl_primitive_attr_destroy(own);
  if (st != dnnl_success) return cpu_dnnl_error(st, what, "dnnl_primitive_desc_create");
  return CT_OK;
}

ct_status cpu_entry_finish(cpu_dev *cd, cpu_entry *e, const char *what) {
  CPU_DNNL(dnnl_primitive_create(&e->prim, e->pd), what);
  const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(e->pd, dnnl_query_scratchpad_md, 0);
  size_t sz = smd ? dnnl_memory_desc_get_size(smd) : 0;
  if (sz) {
    e->scratch = alloc64(sz);
    if (!e->scratch) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of scratchpad", what, sz);
    CPU_DNNL(dnnl_memory_create(&e->scratch_mem, smd, cd->engine, e->scratch), what);
  }
  return CT_OK;
}

ct_status cpu_entry_add_arg(cpu_dev *cd, cpu_entry *e, int arg, const dnnl_memory_desc_t *user_md,
                            dnnl_query_t query, int is_output, const char *what) {
  if (e->nargs == CPU_MAX_ARGS) return ct_error(CT_ERR_INTERNAL, "%s: too many primitive arguments", what);
  cpu_arg *a = &e->args[e->nargs++];
  memset(a, 0, sizeof *a);
  a->arg = arg;
  a->is_output = is_output;
  CPU_DNNL(dnnl_memory_create(&a->user, user_md, cd->engine, DNNL_MEMORY_NONE), what);
  const dnnl_memory_desc_t *pmd = query ? dnnl_primitive_desc_query_md(e->pd, query, 0) : user_md;
  if (!pmd || dnnl_memory_desc_equal(pmd, user_md)) {
    a->prim = a->user;
    return CT_OK;
  }
  size_t sz = dnnl_memory_desc_get_size(pmd);
  a->buf = alloc64(sz);
  if (!a->buf) return ct_error(CT_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes for a blocked layout", what, sz);
  CPU_DNNL(dnnl_memory_create(&a->prim, pmd, cd->engine, a->buf), what);
  dnnl_primitive_desc_t rpd;
  const dnnl_memory_desc_t *from = is_output ? pmd : user_md, *to = is_output ? user_md : pmd;
  CPU_DNNL(dnnl_reorder_primitive_desc_create(&rpd, from, cd->engine, to, cd->engine, NULL), what);
  dnnl_status_t st = dnnl_primitive_create(&a->reorder, rpd);
  dnnl_primitive_desc_destroy(rpd);
  if (st != dnnl_success) return cpu_dnnl_error(st, what, "dnnl_primitive_create(reorder)");
  return CT_OK;
}

void cpu_entry_set(cpu_entry *e, int arg, const void *ptr) {
  for (int i = 0; i < e->nargs; i++)
    if (e->args[i].arg == arg) dnnl_memory_set_data_handle(e->args[i].user, (void *)ptr);
}

static ct_status run_reorder(cpu_dev *cd, cpu_arg *a, const char *what) {
  dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, a->is_output ? a->prim : a->user},
                           {DNNL_ARG_TO, a->is_output ? a->user : a->prim}};
  CPU_DNNL(dnnl_primitive_execute(a->reorder, cd->stream, 2, ra), what);
  return CT_OK;
}

ct_status cpu_entry_run(cpu_dev *cd, cpu_entry *e, const char *what) {
  dnnl_exec_arg_t ea[CPU_MAX_ARGS + 1];
  int n = 0;
  for (int i = 0; i < e->nargs; i++) {
    cpu_arg *a = &e->args[i];
    if (a->reorder && !a->is_output) CT_TRY(run_reorder(cd, a, what));
    ea[n].arg = a->arg;
    ea[n].memory = a->prim;
    n++;
  }
  if (e->scratch_mem) {
    ea[n].arg = DNNL_ARG_SCRATCHPAD;
    ea[n].memory = e->scratch_mem;
    n++;
  }
  CPU_DNNL(dnnl_primitive_execute(e->prim, cd->stream, n, ea), what);
  for (int i = 0; i < e->nargs; i++) {
    cpu_arg *a = &e->args[i];
    if (a->reorder && a->is_output) CT_TRY(run_reorder(cd, a, what));
  }
  CPU_DNNL(dnnl_stream_wait(cd->stream), what);
  return CT_OK;
}

dnnl_data_type_t cpu_dnnl_dtype(ct_dtype t) {
  switch (t) {
    case CT_F32: return dnnl_f32;
    case CT_BF16: return dnnl_bf16;
    case CT_F16: return dnnl_f16;
    case CT_I32: return dnnl_s32;
    case CT_U8: return dnnl_u8;
    default: return dnnl_data_type_undef;
  }
}

static const dnnl_format_tag_t plain_tags[] = {dnnl_format_tag_undef, dnnl_a, dnnl_ab, dnnl_abc, dnnl_abcd, dnnl_abcde};

ct_status cpu_md_plain(dnnl_memory_desc_t *md, int ndims, const int64_t *dims, ct_dtype t, const char *what) {
  dnnl_dims_t dd;
  for (int i = 0; i < ndims; i++) dd[i] = dims[i];
  CPU_DNNL(dnnl_memory_desc_init_by_tag(md, ndims, dd, cpu_dnnl_dtype(t), plain_tags[ndims]), what);
  return CT_OK;
}

ct_status cpu_md_of(dnnl_memory_desc_t *md, const ct_tensor *t, const char *what) {
  if (t->layout == CT_LAYOUT_PLAIN) return cpu_md_plain(md, t->ndim, t->shape, t->dtype, what);
  if (t->ndim != 4 || (t->layout == CT_LAYOUT_C16 && t->shape[1] % 16) || (t->layout == CT_LAYOUT_C8 && t->shape[1] % 8) ||
      (t->layout != CT_LAYOUT_C16 && t->layout != CT_LAYOUT_C8 && t->layout != CT_LAYOUT_NHWC))
    return ct_error(CT_ERR_INTERNAL,
                    "%s: a C16, C8 or NHWC tensor must be 4-D (C16 / C8: channels a multiple of 16 / 8)", what);
  dnnl_dims_t dd;
  for (int i = 0; i < 4; i++) dd[i] = t->shape[i];
  CPU_DNNL(dnnl_memory_desc_init_by_tag(md, 4, dd, cpu_dnnl_dtype(t->dtype),
                                        t->layout == CT_LAYOUT_C16  ? dnnl_aBcd16b
                                        : t->layout == CT_LAYOUT_C8 ? dnnl_aBcd8b
                                                                    : dnnl_acdb),
           what);
  return CT_OK;
}

ct_status cpu_md_any(dnnl_memory_desc_t *md, int ndims, const int64_t *dims, ct_dtype t, const char *what) {
  dnnl_dims_t dd;
  for (int i = 0; i < ndims; i++) dd[i] = dims[i];
  CPU_DNNL(dnnl_memory_desc_init_by_tag(md, ndims, dd, cpu_dnnl_dtype(t), dnnl_format_tag_any), what);
  return CT_OK;
}

dnnl_alg_kind_t cpu_act_alg(ct_act act, float *alpha, float *beta) {
  *alpha = 0.f;
  *beta = 0.f;
  switch (act) {
    case CT_ACT_RELU: return dnnl_eltwise_relu;
    case CT_ACT_LEAKY_RELU: *alpha = 0.01f; return dnnl_eltwise_relu; /* PyTorch default slope */
    case CT_ACT_GELU: return dnnl_eltwise_gelu_erf;
    case CT_ACT_SILU: *alpha = 1.f; return dnnl_eltwise_swish;
    case CT_ACT_SIGMOID: return dnnl_eltwise_logistic;
    case CT_ACT_TANH: return dnnl_eltwise_tanh;
    default: return dnnl_alg_kind_undef;
  }
}
