/* Internal to the CPU backend: the per-device state, op entry/exit, and,
 * when built with oneDNN (CTRAIN_HAVE_DNNL=1), the primitive cache and the
 * helpers every oneDNN-backed op shares.
 *
 * Each "cpu"/"cpu:N" device owns one oneDNN engine, one stream and one
 * cache of ready-to-run primitives. An op builds a fixed-size key from
 * everything that shapes its primitive (op, dims, params, dtypes, thread
 * count) and looks it up; only a miss creates descriptors and primitives, so
 * a training step after the first creates nothing. Cached entries also own
 * the memory objects (their data handles are re-pointed each call), the
 * scratchpad, and any buffers for oneDNN's preferred blocked layouts, so a
 * hit allocates nothing either. One mutex per device serialises ops on it,
 * because those memory objects are re-pointed per call.
 *
 * Without oneDNN (CTRAIN_HAVE_DNNL=0) the device state is the mutex alone;
 * convolution, matmul, linear and pooling come from the reference table
 * (ct_backend_fill_defaults) and activations stay NCHW. */
#ifndef CTRAIN_CPU_IMPL_H
#define CTRAIN_CPU_IMPL_H

#include <omp.h>
#include <pthread.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/device_impl.h"

/* Set for the library and everything linking it by CMakeLists.txt; a
 * silent default would give an object a different cpu_dev layout. */
#ifndef CTRAIN_HAVE_DNNL
#error "CTRAIN_HAVE_DNNL must be defined (0 or 1) by the build"
#endif

#if CTRAIN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#define CPU_KEY_WORDS 40
#define CPU_MAX_ARGS 10

/* What identifies a primitive: compared bytewise, so always zero it first
 * (cpu_key_init). */
typedef struct cpu_key {
  int64_t op;
  int64_t nthr;
  int64_t n; /* words of v used */
  int64_t v[CPU_KEY_WORDS];
} cpu_key;

/* One argument of a cached primitive. `user` is the caller's plain buffer
 * (handle set per call); `prim` is what the primitive reads/writes. They are
 * the same object unless oneDNN chose another layout, in which case `reorder`
 * moves data user->prim (inputs) or prim->user (outputs) through `buf`. */
typedef struct cpu_arg {
  int arg;
  int is_output;
  dnnl_memory_t user;
  dnnl_memory_t prim;
  dnnl_primitive_t reorder;
  void *buf;
} cpu_arg;

typedef struct cpu_entry {
  cpu_key key;
  struct cpu_entry *next;
  dnnl_primitive_t prim;
  dnnl_primitive_desc_t pd; /* kept for queries (workspace size) */
  cpu_arg args[CPU_MAX_ARGS];
  int nargs;
  dnnl_memory_t scratch_mem;
  void *scratch;
  void *tmp[4];   /* op-specific temporaries (e.g. gradients to accumulate) */
  size_t tmp_bytes[4];
} cpu_entry;

#define CPU_CACHE_BUCKETS 256
#endif /* CTRAIN_HAVE_DNNL */

typedef struct cpu_dev {
#if CTRAIN_HAVE_DNNL
  dnnl_engine_t engine;
  dnnl_stream_t stream;
#endif
  pthread_mutex_t mu;
#if CTRAIN_HAVE_DNNL
  cpu_entry *buckets[CPU_CACHE_BUCKETS];
  size_t entries;
#endif
} cpu_dev;

static inline cpu_dev *cpu_dev_of(ct_device *d) { return (cpu_dev *)d->impl; }

/* Device lifetime (cpu_device.c): allocates the state and, with oneDNN,
 * creates its engine and stream (cpu_dnnl_open); close also frees the
 * primitive cache. */
ct_status cpu_dev_open(ct_device *d);
void cpu_dev_close(ct_device *d);

/* Enters an op: locks the device and applies ct_device_threads(). Returns
 * the previous OpenMP thread count for cpu_op_end. */
int cpu_op_begin(ct_device *d);
void cpu_op_end(ct_device *d, int prev_threads);

/* Refuses a C16, C8 or NHWC f32 tensor on a path that only reads plain ones
 * (the reference fallbacks): the executor only picks those layouts where
 * the fast path runs. A 16-bit tensor passes in any layout: its fallback
 * (ref_half.c) widens it and runs the op on this backend in f32, which
 * reads the layouts. */
ct_status cpu_need_plain(const ct_tensor *a, const ct_tensor *b, const char *what);

/* dst[i] = beta*dst[i] + src[i] over n elements; src is f32, dst f32 or
 * bf16. beta 0 overwrites (so NaN in stale dst does not leak through). */
void cpu_accumulate_f32(void *dst, ct_dtype dt, const float *src, int64_t n, float beta);

#if CTRAIN_HAVE_DNNL
/* The oneDNN half of the device state (dnnl_common.c): engine and stream
 * on open (name is the device's, for errors); the cache, stream and engine
 * freed on close. */
ct_status cpu_dnnl_open(cpu_dev *cd, const char *name);
void cpu_dnnl_close(cpu_dev *cd);

/* 1 when this oneDNN implements bf16 convolution, matmul and pooling on
 * this CPU. oneDNN 2.x needs AVX-512 (avx512_core) for bf16; below it
 * every bf16 primitive, the reference ones included, is "unimplemented".
 * Probed once per process by creating tiny bf16 primitive descriptors, so
 * it follows ONEDNN_MAX_CPU_ISA too. Without it the bf16 ops take the
 * widening path (ref_half.c: f32 on oneDNN, rounded back) and the backend
 * lays out f32 activations only. */
int cpu_dnnl_bf16(void);
/* 1 when oneDNN's effective ISA (ONEDNN_MAX_CPU_ISA included) has
 * AVX-512 core, whose kernels block channels by 16 (nChw16c). */
int cpu_dnnl_avx512(void);

/* Key building. */
void cpu_key_init(cpu_key *k, int op);
void cpu_key_add(cpu_key *k, int64_t v);
void cpu_key_add_tensor(cpu_key *k, const ct_tensor *t); /* dtype, ndim, dims; NULL ok */

/* Looks up an entry; NULL on a miss. cpu_cache_new() allocates a zeroed
 * entry with the key set; cpu_cache_insert() publishes a finished one. */
cpu_entry *cpu_cache_find(cpu_dev *cd, const cpu_key *k);
cpu_entry *cpu_cache_new(const cpu_key *k);
void cpu_cache_insert(cpu_dev *cd, cpu_entry *e);
/* The entry keyed by op alone (and the thread count), created empty on
 * first use: for ops whose only cached state is scratch (cpu_entry_tmp).
 * NULL when out of memory. */
cpu_entry *cpu_scratch_entry(cpu_dev *cd, int op);
void cpu_entry_destroy(cpu_entry *e);

/* Creates the primitive of e from a descriptor (scratchpad in user mode,
 * so it is allocated once per entry). attr may be NULL. */
ct_status cpu_entry_make_pd(cpu_dev *cd, cpu_entry *e, const void *op_desc, dnnl_primitive_attr_t attr,
                            const_dnnl_primitive_desc_t hint, const char *what);
ct_status cpu_entry_finish(cpu_dev *cd, cpu_entry *e, const char *what);

/* Adds an argument whose caller-side layout is user_md; the primitive's
 * layout is queried from e->pd with `query` (pass 0 to use user_md as is). */
ct_status cpu_entry_add_arg(cpu_dev *cd, cpu_entry *e, int arg, const dnnl_memory_desc_t *user_md,
                            dnnl_query_t query, int is_output, const char *what);

/* Points argument `arg` at a caller buffer for this call. */
void cpu_entry_set(cpu_entry *e, int arg, const void *ptr);

/* Runs input reorders, the primitive, output reorders, and waits. */
ct_status cpu_entry_run(cpu_dev *cd, cpu_entry *e, const char *what);

/* Returns e->tmp[i], growing it to at least bytes (64-byte aligned). */
void *cpu_entry_tmp(cpu_entry *e, int i, size_t bytes);

/* Maps ctrain dtypes to oneDNN's; dnnl_data_type_undef if unsupported. */
dnnl_data_type_t cpu_dnnl_dtype(ct_dtype t);

/* A plain row-major memory descriptor for dims (tag abcd... by ndims). */
ct_status cpu_md_plain(dnnl_memory_desc_t *md, int ndims, const int64_t *dims, ct_dtype t, const char *what);
/* The descriptor of t as it lies in memory: plain, nChw16c for a
 * CT_LAYOUT_C16 tensor, nChw8c for a C8 one, nhwc for a CT_LAYOUT_NHWC one. */
ct_status cpu_md_of(dnnl_memory_desc_t *md, const ct_tensor *t, const char *what);
/* Same shape with dtype/format `any`, letting oneDNN choose. */
ct_status cpu_md_any(dnnl_memory_desc_t *md, int ndims, const int64_t *dims, ct_dtype t, const char *what);

/* Records a oneDNN failure; `what` names the op and shapes. */
ct_status cpu_dnnl_error(dnnl_status_t st, const char *what, const char *call);

#define CPU_DNNL(call, what)                                   \
  do {                                                         \
    dnnl_status_t cpu_st_ = (call);                            \
    if (cpu_st_ != dnnl_success) return cpu_dnnl_error(cpu_st_, (what), #call); \
  } while (0)

/* oneDNN eltwise post-op for an activation (alg undef for none). */
dnnl_alg_kind_t cpu_act_alg(ct_act act, float *alpha, float *beta);
#endif /* CTRAIN_HAVE_DNNL */

/* Where the elements of a 4-D activation lie in any of its layouts (plain
 * NCHW, C16, C8, NHWC): (n, c, h, w) is at cpu_act_chan(&a, n, c) +
 * h*a.sh + w*a.sw. sh = W*sw in every layout, so pixel q = h*W + w of a
 * channel is at q*sw from its start. */
typedef struct cpu_act_strides {
  int64_t sn, scb, sc, sh, sw, b; /* c lies at (c/b)*scb + (c%b)*sc */
} cpu_act_strides;

static inline cpu_act_strides cpu_act_strides_of(const ct_tensor *t) {
  int64_t C = t->shape[1], H = t->shape[2], W = t->shape[3];
  cpu_act_strides a = {C * H * W, 0, H * W, W, 1, C};
  if (t->layout == CT_LAYOUT_C16 || t->layout == CT_LAYOUT_C8) {
    a.b = t->layout == CT_LAYOUT_C16 ? 16 : 8;
    a.scb = H * W * a.b, a.sc = 1, a.sh = W * a.b, a.sw = a.b;
  } else if (t->layout == CT_LAYOUT_NHWC) {
    a.sc = 1, a.sh = W * C, a.sw = C;
  }
  return a;
}

/* The offset of channel c of image n, pixel (0, 0). */
static inline int64_t cpu_act_chan(const cpu_act_strides *a, int64_t n, int64_t c) {
  return n * a->sn + c / a->b * a->scb + c % a->b * a->sc;
}

/* bf16 <-> f32 inline, so loops over them vectorise. Rounding is
 * ct_f32_to_bf16's (nearest even, NaN kept quiet), bit for bit, so a native
 * bf16 loop gives exactly what the widening reference path gives. */
static inline float cpu_bf16_ld(uint16_t h) {
  union { uint32_t u; float f; } v;
  v.u = (uint32_t)h << 16;
  return v.f;
}
static inline uint16_t cpu_bf16_st(float f) {
  union { uint32_t u; float f; } v;
  v.f = f;
  uint32_t u = v.u, r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

/* cpu_<op> for every entry of backend_ops.def, one file per family; the
 * table (cpu_backend.c) takes those this backend defines and the
 * reference's for the rest. */
#define CT_OP(rule, ret, name, params) ret cpu_##name params;
#include "backend/backend_ops.def"
#undef CT_OP

/* Non-overlapping max pooling on plain NCHW (cpu_maxpool_tiles.c): whether
 * p/x/y qualify, and the two directions; the workspace is one byte per
 * output element. Callers hold the device (cpu_op_begin). */
int cpu_maxpool_tiles_ok(const ct_pool2d_params *p, const ct_tensor *x, const ct_tensor *y);
void cpu_maxpool_tiles_fwd(const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y, uint8_t *ws);
void cpu_maxpool_tiles_bwd(const ct_pool2d_params *p, const ct_tensor *dy, const uint8_t *ws, ct_tensor *dx);
/* Any other max pooling on plain NCHW, and any on C8 (cpu_maxpool_windows.c:
 * overlapping windows, padding), and from C8 to a plain y in AVX2 builds,
 * with the same one-byte workspace (laid out as y); they fail only when
 * they cannot allocate their per-thread tiles or accumulators. */
int cpu_maxpool_windows_ok(const ct_pool2d_params *p, const ct_tensor *x, const ct_tensor *y);
ct_status cpu_maxpool_windows_fwd(const ct_pool2d_params *p, const ct_tensor *x, ct_tensor *y, uint8_t *ws);
/* The layouts (bit set) whose x these loops take with a plain y: C8 in
 * AVX2 builds (the backend's maxpool_to_plain), else none. */
unsigned cpu_maxpool_windows_to_plain(void);
ct_status cpu_maxpool_windows_bwd(const ct_pool2d_params *p, const ct_tensor *dy, const uint8_t *ws, ct_tensor *dx);

/* Threads for an OpenMP region on this device (0 = the runtime's). */
static inline int cpu_nthreads(const ct_device *d) { return d->threads > 0 ? d->threads : omp_get_max_threads(); }

/* Inputs a fast path does not take (dtypes, layouts) go to the reference,
 * whose table is complete (test_ref_ops checks every entry). */
#define REF_OR(op, ...) return ct_ref_backend()->op(__VA_ARGS__)

#endif
