/* Every op of struct ct_backend on every backend this build and machine
 * can open, against the reference device on the same random inputs: the
 * families of op_target.h (pooling, batch norm, elementwise ops and
 * dropout and casts, softmax and losses and reductions, convolution and
 * linear and matmul, long bias-gradient sums), one case table each, run on
 * each row of targets[] below. Metric: normwise relative error against the
 * reference in f64 (op_buf.h); what must agree to the bit does (op_target.h).
 *
 * The rows' tolerances and why:
 *  - f32 outside the dense modes 1e-5 (both sum in f32 or better).
 *  - cpu dense f32 1e-5 (oneDNN's direct and GEMM kernels). cuda dense f32
 *    (FMA math, TF32 off) 1e-5 for matmul, linear and the bias gradient (a
 *    double channel sum); 1e-4 for convolutions: cuDNN may still pick
 *    Winograd (F(4x4,3x3) and larger tiles round 10-100x worse than a
 *    direct sum, a few 1e-6 to 1e-5 normwise) or FFT for the 3x3/5x5
 *    stride-1 shapes, and 3e-5 left too little room; TF32 would give
 *    ~5e-4..1e-3, so 1e-4 still tells it from f32, and a wrong convolution
 *    is off by O(1).
 *  - bf16 operands (f32 or bf16 results) 1e-2; f16 operands 2e-3 (unit
 *    roundoff 2^-11 = 4.9e-4; a 16-bit pair with an f32 weight gradient
 *    rounds that gradient once to 16 bits, src/backend/cuda/cuda_conv.c).
 *  - TF32 (a device opened with CTRAIN_CUDA_TF32=1, or switched on with
 *    ct_device_set_tf32 on the device the strict modes ran on) 5e-3; on the
 *    emulator, which rounds to TF32 wherever it is allowed, the switched
 *    mode's worst error must exceed 4x f32's (on a GPU TF32 is a
 *    permission cuDNN may not take).
 *  - 16-bit elementwise storage 1e-2; results that are one rounding of an
 *    f32-accurate value (pooling, loss gradients, a 16-bit convolution's
 *    weight gradient) 4e-3 in bf16 (unit roundoff 2^-9 = 2e-3), 1e-3 in f16.
 *  - cpu f16 pooling against the reference's own f16 path (both widen to
 *    f32 and round back) 1e-3, ||dev - ref|| / ||ref||.
 *  - bias gradients over >= 100000 rows: cuda sums them in double, 1e-5;
 *    the cpu's oneDNN convolutions in f32, which drifts by about
 *    u * sqrt(n/2) relative (1.3e-5 at n = 1e5): 2e-4, as the weight
 *    gradients beside them (op_bias_sum.c).
 *  - sumsq, relative: both sum the exact squares in double in different
 *    orders. The cpu's order differs little from the reference's: 1e-12.
 *    The GPU's per-block partials and tree are off by up to (n-1)*2^-53,
 *    7e-12 for the 64000 values summed, so 1e-12 could fail a correct
 *    kernel; 1e-10 cannot, and a wrong sum is off by far more.
 *
 * Every row runs every case of every family, except where a capability it
 * lacks, a dtype it gives no tolerance or a path it does not have leaves
 * the case out; the cases sized for a GPU (cuDNN's Winograd shapes, 1e8
 * values summed) run on rows with big only, the reference's f64 loops
 * taking seconds over them.
 *
 * CTRAIN_TEST_BACKENDS (comma list of row names; unset: every row) picks
 * the targets, CTRAIN_TEST_OPS (comma list of family names; unset: all)
 * the families. A target whose device does not open (no GPU, a build
 * without CUDA) is skipped; if none opened, exit 77. */
#include "op_target.h"
#if CTRAIN_HAVE_DNNL
#include "backend/cpu/cpu_conv.h"
#endif

int test_failures_, test_checks_;

static const op_dense_mode cpu_modes[] = {
    {"f32", CT_F32, CT_F32, 1e-5, 1e-5, OP_TF32_OFF, 0},
    {"bf16->f32", CT_BF16, CT_F32, 1e-2, 1e-2, OP_TF32_OFF, 0},
    {"bf16->bf16", CT_BF16, CT_BF16, 1e-2, 1e-2, OP_TF32_OFF, 0},
};

#if CTRAIN_HAVE_DNNL
/* oneDNN's blocked formats or plain NCHW/OIHW; the batched-GEMM path for
 * small maps (dnnl_conv_gemm.c) and the first-layer paths
 * (dnnl_conv_thin.c) on, or every convolution through oneDNN's
 * primitives. */
static void cpu_plain(void) { cpu_conv_set_blocked(0); }
static void cpu_gemm_thin(void) { cpu_conv_set_gemm(1), cpu_conv_set_thin(1); }
static void cpu_onednn(void) { cpu_conv_set_gemm(0), cpu_conv_set_thin(0); }
static void cpu_defaults(void) { cpu_conv_set_blocked(1), cpu_conv_set_gemm(1), cpu_conv_set_thin(-1); }
static const op_conv_path cpu_paths[] = {
    {"blocked", NULL, OP_PATH_PLAIN},
    {"plain", cpu_plain, OP_PATH_PLAIN},
    {"gemm+thin", cpu_gemm_thin, OP_PATH_LAID_OUT},
    {"oneDNN", cpu_onednn, OP_PATH_LAID_OUT | OP_PATH_PLAIN},
};
#endif

static const op_dense_mode cuda_modes[] = {
    {"f32", CT_F32, CT_F32, 1e-5, 1e-4, OP_TF32_OFF, 0},
    {"bf16->f32", CT_BF16, CT_F32, 1e-2, 1e-2, OP_TF32_OFF, 0},
    {"bf16->bf16", CT_BF16, CT_BF16, 1e-2, 1e-2, OP_TF32_OFF, 0},
    {"f16->f32", CT_F16, CT_F32, 2e-3, 2e-3, OP_TF32_OFF, 0},
    {"f16->f16", CT_F16, CT_F16, 2e-3, 2e-3, OP_TF32_OFF, 0},
    {"tf32", CT_F32, CT_F32, 5e-3, 5e-3, OP_TF32_AT_OPEN, 0},
    {"tf32 (API)", CT_F32, CT_F32, 5e-3, 5e-3, OP_TF32_SWITCH, 4},
};

#define NELEM(a) ((int)(sizeof a / sizeof a[0]))

static const op_target targets[] = {
    {
        .name = "cpu",
        .spec = "cpu",
#if CTRAIN_HAVE_DNNL
        .caps = OP_CAP_F64 | OP_CAP_BN_APPLY_BITS | OP_CAP_CONV_NHWC,
        .paths = cpu_paths,
        .npaths = NELEM(cpu_paths),
        .paths_reset = cpu_defaults,
#else
        /* the reference's convolutions: plain only, one path */
        .caps = OP_CAP_F64 | OP_CAP_BN_APPLY_BITS,
#endif
        .tol = 1e-5,
        .elementwise16 = {1e-2, 1e-2},
        .rounded16 = {4e-3, 1e-3},
        .pool_widened = {.f16 = 1e-3},
        /* its losses take f32 logits (other dtypes go to the reference, which takes f32 and f64) */
        .loss16 = {0, 0},
        .long_sum_tol = 2e-4,
        .sumsq_tol = 1e-12,
        .layouts = {CT_LAYOUT_C16, CT_LAYOUT_C8, CT_LAYOUT_NHWC},
        .layout_dtypes = 1u << CT_F32 | 1u << CT_BF16,
        .modes = cpu_modes,
        .nmodes = NELEM(cpu_modes),
    },
    {
        .name = "cuda",
        .spec = "cuda",
        .caps = OP_CAP_POOL_NHWC | OP_CAP_CONV_NHWC | OP_CAP_DW16_WIDENED,
        .tol = 1e-5,
        .elementwise16 = {1e-2, 1e-2},
        .rounded16 = {4e-3, 1e-3},
        .loss16 = {4e-3, 1e-3},
        .long_sum_tol = 1e-5,
        .sumsq_tol = 1e-10,
        .big = 1,
        .layouts = {CT_LAYOUT_NHWC},
        .layout_dtypes = 1u << CT_F32 | 1u << CT_BF16 | 1u << CT_F16,
        .modes = cuda_modes,
        .nmodes = NELEM(cuda_modes),
    },
};

/* Each family reseeds, so its inputs do not depend on which others ran. */
static const struct family {
  const char *name;
  void (*run)(op_env *e);
  uint64_t seed;
} families[] = {
    {"pool", op_pool, 7}, {"batchnorm", op_batchnorm, 7}, {"elementwise", op_elementwise, 7},
    {"loss", op_loss, 7}, {"dense", op_dense, 42},        {"bias", op_bias_sum, 2025},
};

/* Whether name is in the comma-separated list (unset: every name is). */
static int listed(const char *list, const char *name) {
  if (!list) return 1;
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    size_t k = strcspn(p, ",");
    if (k == n && !strncmp(p, name, n)) return 1;
    p += k + (p[k] == ',');
  }
  return 0;
}

/* 0, printing why, when the list in variable var names something not in
 * names[n]: a misspelt selection must not pass by running nothing. */
static int known(const char *var, const char *list, const char *const *names, int n) {
  if (!list) return 1;
  for (const char *p = list; *p;) {
    size_t k = strcspn(p, ",");
    int found = 0;
    for (int i = 0; i < n; i++) found |= strlen(names[i]) == k && !strncmp(p, names[i], k);
    if (!found) {
      fprintf(stderr, "%s: unknown name '%.*s'\n", var, (int)k, p);
      return 0;
    }
    p += k + (p[k] == ',');
  }
  return 1;
}

int main(void) {
  unsetenv("CTRAIN_CUDA_TF32"); /* the f32 tolerances assume FMA math; the TF32 modes ask for it */
  const char *backends = getenv("CTRAIN_TEST_BACKENDS"), *ops = getenv("CTRAIN_TEST_OPS");
  const char *tnames[NELEM(targets)], *fnames[NELEM(families)];
  for (int i = 0; i < NELEM(targets); i++) tnames[i] = targets[i].name;
  for (int i = 0; i < NELEM(families); i++) fnames[i] = families[i].name;
  if (!known("CTRAIN_TEST_BACKENDS", backends, tnames, NELEM(targets)) ||
      !known("CTRAIN_TEST_OPS", ops, fnames, NELEM(families)))
    return 1;
  ct_device *ref;
  if (ct_device_open("ref", &ref) != CT_OK) {
    fprintf(stderr, "cannot open the ref device: %s\n", ct_last_error());
    return 1;
  }
  int opened = 0;
  for (int i = 0; i < NELEM(targets); i++) {
    const op_target *t = &targets[i];
    if (!listed(backends, t->name)) continue;
    op_env e;
    memset(&e, 0, sizeof e);
    e.t = t, e.ref = ref, e.rb = ct_device_backend(ref);
    if (ct_device_open(t->spec, &e.dev) != CT_OK) {
      printf("%s: skipped: %s\n", t->name, ct_last_error());
      continue;
    }
    opened++;
    e.be = ct_device_backend(e.dev);
    for (int f = 0; f < NELEM(families); f++) {
      if (!listed(ops, families[f].name)) continue;
      e.seed = families[f].seed;
      ct_rng_init(&e.rng, e.seed, CT_RNG_TEST, 0, 0);
      families[f].run(&e);
    }
    printf("%s: worst normwise relative error outside the dense modes: f32 %.3g, bf16 %.3g, f16 %.3g\n", t->name,
           e.worst[CT_F32], e.worst[CT_BF16], e.worst[CT_F16]);
    ct_device_close(e.dev);
  }
  ct_device_close(ref);
  if (!opened) {
    printf("skipped: no selected backend could be opened\n");
    return 77;
  }
  return test_summary("test_ops_vs_ref");
}
