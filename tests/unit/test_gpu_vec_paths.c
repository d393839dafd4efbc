/* The two paths of the CUDA elementwise kernels give the same bits
 * (src/backend/cuda/cuda_common.cuh, ct_vec_for): 8 elements a step when
 * every pointer is 16-byte aligned, one at a time otherwise. Each op runs
 * on operands at the start of their allocations (aligned: the 8-wide path
 * plus a tail when n % 8 != 0) and again on the same values one element
 * further on (misaligned for every float dtype: the scalar path), and the
 * two outputs are compared bitwise: add with and without its ReLU, every
 * activation forward and backward, axpby (beta 0 and not), fill, dropout
 * (one mask per element and per group), and casts
 * between f32, bf16 and f16, operands of mixed dtypes included; and the
 * fused optimizer pass (SGD with Nesterov momentum and weight decay, Adam,
 * AdamW with amsgrad: parameters and every state buffer bitwise) and the
 * gradient statistics (the same flag, the same sum of squares to 1e-12,
 * an inf found in the 8-wide part and in the tail). Whether
 * the values are right is the op test's business (tests/ops, its cuda
 * row); this test pins the wide path to the scalar one, in every
 * dtype, which it samples. Labelled gpu; exits 77 without a CUDA
 * device. */
#include "optim/optimizer_device.h"
#include "test_gpu_common.h"

/* One operand twice: at the start of allocation `al` and one element into
 * `mis`, holding the same values of dtype dt. */
typedef struct pair {
  void *al, *mis;
  int64_t n;
  ct_dtype dt;
} pair;

static pair pair_make(int64_t n, ct_dtype dt, double scale) {
  pair p = {ct_device_alloc(g_gpu, (size_t)(n + 1) * 4), ct_device_alloc(g_gpu, (size_t)(n + 1) * 4), n, dt};
  CHECK_MSG(p.al && p.mis, "alloc: %s", ct_last_error());
  float *f = malloc((size_t)n * 4);
  void *h = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) f[i] = (float)(ct_rng_normal(&g_rng) * scale);
  f[n / 2] = -0.0f; /* a signed zero through every op */
  ct_convert(f, CT_F32, h, dt, (size_t)n);
  size_t es = ct_dtype_size(dt), bytes = (size_t)n * es;
  CHECK_OK(ct_device_copy(g_gpu, p.al, NULL, h, bytes));
  CHECK_OK(ct_device_copy(g_gpu, (char *)p.mis + es, NULL, h, bytes));
  CHECK_OK(ct_device_sync(g_gpu));
  free(f), free(h);
  return p;
}

static void pair_free(pair *p) { ct_device_free(g_gpu, p->al), ct_device_free(g_gpu, p->mis); }

/* The aligned (mis 0) or misaligned (mis 1) tensor of p. */
static ct_tensor view(const pair *p, int mis) {
  int64_t shape[1] = {p->n};
  ct_tensor t = ct_tensor_view(mis ? (char *)p->mis + ct_dtype_size(p->dt) : p->al, p->dt, 1, shape);
  t.device = g_gpu;
  return t;
}

/* Counts the elements of out whose two copies differ bitwise. */
static int64_t diff(const pair *out) {
  size_t es = ct_dtype_size(out->dt), bytes = (size_t)out->n * es;
  char *a = malloc(bytes + 1), *b = malloc(bytes + 1);
  CHECK_OK(ct_device_sync(g_gpu));
  CHECK_OK(ct_device_copy(NULL, a, g_gpu, out->al, bytes));
  CHECK_OK(ct_device_copy(NULL, b, g_gpu, (char *)out->mis + es, bytes));
  int64_t bad = 0;
  for (int64_t i = 0; i < out->n; i++) bad += memcmp(a + (size_t)i * es, b + (size_t)i * es, es) != 0;
  free(a), free(b);
  return bad;
}

#define SAME(out, ...)                                                                                   \
  do {                                                                                                   \
    int64_t bad_ = diff(out);                                                                            \
    CHECK_MSG(bad_ == 0, "%s: %lld of %lld elements differ between the 8-wide and the scalar path",       \
              case_name(__VA_ARGS__), (long long)bad_, (long long)(out)->n);                             \
  } while (0)

/* Every op with inputs of dtype dt (the second operand of add and the
 * source of axpby in dt2) and outputs of dtype dt. */
static void paths(int64_t n, ct_dtype dt, ct_dtype dt2) {
  const char *tn = ct_dtype_name(dt), *tn2 = ct_dtype_name(dt2);
  pair a = pair_make(n, dt, 2.0), b = pair_make(n, dt2, 2.0), y = pair_make(n, dt, 1.0), g = pair_make(n, dt, 1.0);
  pair out = pair_make(n, dt, 1.0);
  for (int m = 0; m < 2; m++) {
    ct_tensor ta = view(&a, m), tb = view(&b, m), to = view(&out, m);
    CHECK_OK(G_->add(g_gpu, &ta, &tb, CT_ACT_NONE, &to));
  }
  SAME(&out, "add n=%lld %s + %s", (long long)n, tn, tn2);
  for (int m = 0; m < 2; m++) {
    ct_tensor ta = view(&a, m), tb = view(&b, m), to = view(&out, m);
    CHECK_OK(G_->add(g_gpu, &ta, &tb, CT_ACT_RELU, &to));
  }
  SAME(&out, "add+relu n=%lld %s + %s", (long long)n, tn, tn2);
  for (int act = 0; act < CT_ACT_COUNT; act++) {
    for (int m = 0; m < 2; m++) {
      ct_tensor ta = view(&a, m), ty = view(&y, m);
      CHECK_OK(G_->act_fwd(g_gpu, (ct_act)act, 0.13f, &ta, &ty));
    }
    SAME(&y, "act %d fwd n=%lld %s", act, (long long)n, tn);
    for (int m = 0; m < 2; m++) {
      ct_tensor ta = view(&a, m), ty = view(&y, m), tg = view(&g, m), to = view(&out, m);
      CHECK_OK(G_->act_bwd(g_gpu, (ct_act)act, 0.13f, CT_ACT_BWD_NEEDS_X(act) ? &ta : NULL,
                           CT_ACT_BWD_NEEDS_Y(act) ? &ty : NULL, &tg, &to));
    }
    SAME(&out, "act %d bwd n=%lld %s", act, (long long)n, tn);
  }
  const float betas[2] = {0.f, 1.3f};
  for (int k = 0; k < 2; k++) {
    for (int m = 0; m < 2; m++) {
      ct_tensor tb = view(&b, m), to = view(&out, m);
      CHECK_OK(G_->axpby(g_gpu, -0.7f, &tb, betas[k], &to));
    }
    SAME(&out, "axpby beta %g n=%lld %s <- %s", betas[k], (long long)n, tn, tn2);
  }
  for (int m = 0; m < 2; m++) {
    ct_tensor to = view(&out, m);
    CHECK_OK(G_->fill(g_gpu, &to, -3.25f));
  }
  SAME(&out, "fill n=%lld %s", (long long)n, tn);
  /* dropout: one mask per element (the wide path draws two Philox blocks
   * for 8 elements) and one per group of 7 */
  const int64_t groups[2] = {1, 7};
  for (int k = 0; k < 2; k++) {
    ct_dropout_key key = {0x0123456789abcdefull, 5, 11, 0, 0, 0};
    for (int m = 0; m < 2; m++) {
      ct_tensor ta = view(&a, m), to = view(&out, m);
      CHECK_OK(G_->dropout_fwd(g_gpu, 0.4f, groups[k], key, &ta, &to));
    }
    SAME(&out, "dropout group %lld n=%lld %s", (long long)groups[k], (long long)n, tn);
  }
  for (int m = 0; m < 2; m++) {
    ct_tensor tb = view(&b, m), to = view(&out, m);
    CHECK_OK(G_->cast(g_gpu, &tb, &to));
  }
  SAME(&out, "cast n=%lld %s -> %s", (long long)n, tn2, tn);
  pair_free(&a), pair_free(&b), pair_free(&y), pair_free(&g), pair_free(&out);
}

/* The statistics of g on both paths into the device blocks st[0..1]. */
static void stats_both(pair *g, ct_step_stats *st[2], ct_step_stats host[2]) {
  for (int m = 0; m < 2; m++) {
    ct_tensor tg = view(g, m);
    CHECK_OK(G_->grad_stats(g_gpu, &tg, st[m]));
  }
  CHECK_OK(ct_device_sync(g_gpu));
  for (int m = 0; m < 2; m++) CHECK_OK(ct_device_copy(NULL, &host[m], g_gpu, st[m], sizeof host[m]));
}

static float *data_of(pair *p, int m) { return (float *)view(p, m).data; }

static void optim_paths(int64_t n, ct_optim_kind kind, int variant) {
  ct_optim_config c = ct_optim_config_default(kind);
  if (kind == CT_OPTIM_SGD) c.momentum = 0.9, c.nesterov = 1, c.weight_decay = 1e-2;
  if (kind == CT_OPTIM_ADAMW) c.amsgrad = 1;
  ct_optimizer *o;
  CHECK_OK(ct_optimizer_create(&c, n, &o));
  ct_fused_optim_args a;
  ct_optim_fused_args(o, 0.0, &a);
  a.first = variant; /* SGD: the first momentum step, then a later one */
  pair p = pair_make(n, CT_F32, 1.0), g = pair_make(n, CT_F32, 3.0), s[3];
  for (int k = 0; k < 3; k++) s[k] = pair_make(n, CT_F32, k == 0 ? 0.1 : 0.01);
  for (int k = 1; k < 3; k++) { /* Adam's second moments are squares */
    for (int m = 0; m < 2; m++) {
      ct_tensor t = view(&s[k], m);
      CHECK_OK(G_->act_fwd(g_gpu, CT_ACT_RELU, 0.f, &t, &t));
    }
  }
  ct_step_stats hs, host[2], *st[2];
  memset(&hs, 0, sizeof hs);
  ct_grad_scaler gs;
  ct_grad_scaler_init(&gs, 1, 1, 1024.0);
  ct_scaler_to_dev(&gs, &hs.scaler);
  for (int m = 0; m < 2; m++) {
    st[m] = ct_device_alloc(g_gpu, sizeof hs);
    CHECK_OK(ct_device_copy(g_gpu, st[m], NULL, &hs, sizeof hs));
  }
  stats_both(&g, st, host);
  CHECK_MSG(host[0].nonfinite == 0 && host[1].nonfinite == 0, "finite gradients flagged");
  CHECK_MSG(fabs(host[0].sumsq - host[1].sumsq) <= 1e-12 * host[1].sumsq, "sumsq n=%lld: %.17g vs %.17g",
            (long long)n, host[0].sumsq, host[1].sumsq);
  const int adam = kind != CT_OPTIM_SGD;
  for (int m = 0; m < 2; m++)
    CHECK_OK(G_->fused_optim_step(g_gpu, &a, data_of(&p, m), data_of(&g, m), data_of(&s[0], m),
                                  adam ? data_of(&s[1], m) : NULL, c.amsgrad ? data_of(&s[2], m) : NULL, st[0]));
  SAME(&p, "optim %d params n=%lld", (int)kind, (long long)n);
  SAME(&s[0], "optim %d state 0 n=%lld", (int)kind, (long long)n);
  if (adam) SAME(&s[1], "optim %d state 1 n=%lld", (int)kind, (long long)n);
  if (c.amsgrad) SAME(&s[2], "optim %d state 2 n=%lld", (int)kind, (long long)n);
  /* an inf among the 8-wide groups, then one in the tail (n % 8 != 0) */
  const int64_t at[2] = {n / 16 * 8 + 3, n - 1};
  for (int k = 0; k < (n % 8 ? 2 : 1); k++) {
    const float inf = INFINITY;
    for (int m = 0; m < 2; m++) CHECK_OK(ct_device_copy(g_gpu, data_of(&g, m) + at[k], NULL, &inf, 4));
    stats_both(&g, st, host);
    CHECK_MSG(host[0].nonfinite == 1 && host[1].nonfinite == 1, "inf at %lld of %lld: flags %d (8-wide) %d (scalar)",
              (long long)at[k], (long long)n, host[0].nonfinite, host[1].nonfinite);
    const float one = 1.f;
    for (int m = 0; m < 2; m++) CHECK_OK(ct_device_copy(g_gpu, data_of(&g, m) + at[k], NULL, &one, 4));
  }
  ct_device_free(g_gpu, st[0]), ct_device_free(g_gpu, st[1]);
  pair_free(&p), pair_free(&g);
  for (int k = 0; k < 3; k++) pair_free(&s[k]);
  ct_optimizer_destroy(o);
}

int main(void) {
  gpu_test_setup(11);
  const ct_dtype dts[3] = {CT_F32, CT_BF16, CT_F16};
  const int64_t ns[3] = {8, 61, 4099}; /* one group; 7 + a tail of 5; 512 groups + 3 */
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 3; k++) paths(ns[k], dts[i], dts[j]);
  for (int k = 0; k < 3; k++) {
    optim_paths(ns[k], CT_OPTIM_SGD, 1);
    optim_paths(ns[k], CT_OPTIM_SGD, 0);
    optim_paths(ns[k], CT_OPTIM_ADAM, 0);
    optim_paths(ns[k], CT_OPTIM_ADAMW, 0);
  }
  gpu_test_teardown();
  return test_summary("test_gpu_vec_paths");
}
