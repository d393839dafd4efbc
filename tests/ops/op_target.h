/* The op test (test_ops_vs_ref.c): every op of struct ct_backend, on every
 * backend in the table of targets there that this build and machine can
 * open, against the reference device on the same inputs. A target is one
 * row: the device spec, the tolerance of each dtype, what the backend can
 * do beyond the common ops (caps), and the variants its convolutions have
 * (dense modes, path switches); the op families (one file each, op_*.c)
 * read only the row, so a new backend is covered by adding its row.
 *
 * Metric: normwise relative error max_i |dev_i - ref_i| / max_i |ref_i|
 * against the f64 reference (op_buf.h), held to the row's tolerance for
 * the result's dtype (pooling, losses and the long sums also check that
 * the reference is not all zero). Ops that select or copy values (max
 * pooling's output, dropout masks, casts, batch norm's apply where the
 * row claims it) must match to the bit. */
#ifndef CTRAIN_TEST_OP_TARGET_H
#define CTRAIN_TEST_OP_TARGET_H

#include <stdarg.h>

#include "op_buf.h"

/* Tolerances for results stored in bf16 and f16; 0 leaves the dtype out. */
typedef struct op_tol16 {
  double bf16, f16;
} op_tol16;

static inline double op_tol16_of(const op_tol16 *t, ct_dtype dt) {
  return dt == CT_BF16 ? t->bf16 : dt == CT_F16 ? t->f16 : 0;
}

/* How a dense mode's device computes f32 convolutions and matmuls. */
typedef enum op_tf32 {
  OP_TF32_OFF,     /* the target's device as opened (FMA math) */
  OP_TF32_AT_OPEN, /* a device of the same spec opened with CTRAIN_CUDA_TF32=1 */
  OP_TF32_SWITCH   /* the target's device after ct_device_set_tf32(dev, 1) */
} op_tf32;

/* A precision the convolutions, linear layers and matmuls run in. */
typedef struct op_dense_mode {
  const char *name;
  ct_dtype in, out;     /* operands; results and gradients */
  double tol, conv_tol; /* matmul, linear and bias gradients; convolutions */
  op_tf32 tf32;
  /* > 0: on the emulator (CTRAIN_TEST_EMU), this mode's worst error must
   * exceed this many times the first mode's (TF32 rounding in effect). */
  double emu_worse_than_first;
} op_dense_mode;

/* A setting of the target's convolution path switches. The first mode
 * runs under each path; the other modes under the first path, which must
 * be the defaults (enter NULL). */
enum { OP_PATH_PLAIN = 1, OP_PATH_LAID_OUT = 2 };
typedef struct op_conv_path {
  const char *name;
  void (*enter)(void); /* NULL: the defaults */
  unsigned runs;       /* OP_PATH_PLAIN: plain activations; LAID_OUT: each of the row's layouts */
} op_conv_path;

enum {
  OP_CAP_POOL_NHWC = 1u << 0,     /* pooling and adaptive pooling of NHWC tensors */
  OP_CAP_F64 = 1u << 1,           /* f64 tensors (cast) */
  OP_CAP_BN_APPLY_BITS = 1u << 2, /* batchnorm_apply repeats the training forward's bits */
  OP_CAP_CONV_NHWC = 1u << 3,     /* convolutions of NHWC tensors (plain weights) */
  OP_CAP_DW16_WIDENED = 1u << 4,  /* a 16-bit convolution's f32 weight gradient is its 16-bit result widened */
};

typedef struct op_target {
  const char *name;       /* as CTRAIN_TEST_BACKENDS names it */
  const char *spec;       /* ct_device_open's */
  unsigned caps;          /* OP_CAP_* */
  double tol;             /* f32 results outside the dense modes */
  op_tol16 elementwise16; /* activations, add, axpby, fill in 16-bit storage */
  op_tol16 rounded16;     /* one rounding of an f32-accurate value: pooling,
                           * 16-bit weight gradients */
  op_tol16 pool_widened;  /* 16-bit pooling against the reference's own 16-bit
                           * run, ||dev - ref|| / ||ref|| (L2) */
  op_tol16 loss16;        /* loss gradients from 16-bit logits (0: f32 logits only) */
  double long_sum_tol;    /* bias gradients summed over >= 100000 rows */
  double sumsq_tol;       /* relative, sumsq against the reference's */
  int big;                /* also the cases sized for a GPU (marked big in their
                           * tables): seconds of the reference's f64 loops each */
  ct_layout layouts[4];   /* activation layouts besides plain, at most 3, 0-terminated */
  unsigned layout_dtypes; /* 1 << dtype for each dtype laid out */
  const op_dense_mode *modes;
  int nmodes;
  const op_conv_path *paths; /* none: the defaults, plain */
  int npaths;
  void (*paths_reset)(void);
} op_target;

/* An opened target and its reference. */
typedef struct op_env {
  const op_target *t;
  ct_device *dev, *ref;
  const ct_backend *be, *rb;
  uint64_t seed; /* the running family's: rng starts there */
  ct_rng rng;
  double worst[CT_DTYPE_COUNT]; /* worst error per result dtype */
  double *mode_worst;           /* the dense mode running, else NULL */
} op_env;

/* The case being checked, prefixed with the target's name (one buffer per
 * file: valid until the next call). */
static char op_case_buf[256];
static inline const char *op_case(const op_env *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline const char *op_case(const op_env *e, const char *fmt, ...) {
  int k = snprintf(op_case_buf, sizeof op_case_buf, "%s: ", e->t->name);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(op_case_buf + k, sizeof op_case_buf - (size_t)k, fmt, ap);
  va_end(ap);
  return op_case_buf;
}

/* Downloads t and returns its error (ob_err), recorded as the worst of its
 * dtype or of the dense mode running; *den as ob_err's. */
static inline double op_err(op_env *e, obuf *t, double *den) {
  double err = ob_err(t, den);
  double *w = e->mode_worst ? e->mode_worst : &e->worst[t->dt];
  if (!(err <= *w)) *w = err;
  return err;
}

/* Checks t against its f64 view: the error at most tol. */
#define CHECK_ERR(e, t, tol, ...)                                                    \
  do {                                                                               \
    const char *nm_ = op_case(e, __VA_ARGS__);                                       \
    double e_ = op_err(e, t, NULL);                                                  \
    CHECK_MSG(e_ <= (tol), "%s: err %.3g (tolerance %.3g)", nm_, e_, (double)(tol)); \
  } while (0)

/* The same, and (a check of its own) a reference not all zero: for
 * results that never are, where zeros would mean the case tests nothing. */
#define CHECK_ERR_NZ(e, t, tol, ...)                                                    \
  do {                                                                                  \
    const char *nm_ = op_case(e, __VA_ARGS__);                                          \
    double den_, e_ = op_err(e, t, &den_);                                              \
    CHECK_MSG(den_ > 0, "%s: the reference is all zero; the comparison is blind", nm_); \
    CHECK_MSG(e_ <= (tol), "%s: err %.3g (tolerance %.3g)", nm_, e_, (double)(tol));    \
  } while (0)

/* The families, each over every case of its table that the row admits. */
void op_pool(op_env *e);        /* max, average and adaptive pooling */
void op_batchnorm(op_env *e);   /* batch norm: training, eval, backward, apply */
void op_elementwise(op_env *e); /* activations, dropout, add, axpby, fill, cast */
void op_loss(op_env *e);        /* softmax, the losses, sumsq, nonfinite */
void op_dense(op_env *e);       /* convolution, linear, matmul in each dense mode */
void op_bias_sum(op_env *e);    /* bias gradients summed over >= 100000 rows */

#endif
