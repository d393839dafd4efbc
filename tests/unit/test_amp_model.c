/* Mixed precision on models: the policy table, O0 bit-identical to a
 * model that never heard of AMP, bf16/fp16 training steps (output and
 * parameter gradients) close to fp32 on random inputs, activation memory
 * that shrinks, and O3's rounded parameters.
 *
 * Two tolerances: a smooth model (conv, batch norm, GELU, average pooling,
 * tanh, residual add, linear: no max or ReLU decisions) must match fp32
 * to the low precision's rounding; zoo models with max pooling and ReLU
 * also see argmax/sign flips near ties, which move whole gradient
 * contributions between positions, so their parameter gradients get a
 * looser bound (PyTorch's autocast shows the same; the parity test
 * compares against it). */
#include "test_util.h"

typedef struct step_out {
  float *out, *grads;
  size_t n_out, n_par;
  size_t plan;
} step_out;

static void rand_fill(float *p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) p[i] = 2.0f * ct_rng_uniform_at(seed, 7, 0, 0, i) - 1.0f;
}

/* One training step of `name` (batch 4) at a precision; set = 0 leaves
 * the model's precision untouched (never calls ct_model_set_precision). */
static int run_step(ct_device *dev, const char *name, int set, ct_precision p, ct_opt_level o, step_out *r) {
  memset(r, 0, sizeof *r);
  ct_model_options opt = {0};
  opt.seed = 5;
  ct_model *m = NULL;
  if (ct_model_create(name, &opt, &m) != CT_OK) return -1;
  if (set && ct_model_set_precision(m, p, o) != CT_OK) return ct_model_destroy(m), -1;
  const int64_t N = 4;
  if (ct_model_prepare(m, dev, N, 1) != CT_OK) return ct_model_destroy(m), -1;
  int c, h, w;
  ct_model_input_shape(m, &c, &h, &w);
  int64_t per = (int64_t)c * h * w, K = ct_model_output_size(m);
  float *x = malloc(sizeof(float) * (size_t)(N * per));
  rand_fill(x, (size_t)(N * per), 11);
  int64_t shape[4] = {N, c, h, w}, tgt[4];
  for (int i = 0; i < N; i++) tgt[i] = (i * 7 + 3) % K;
  ct_tensor xt = ct_model_input_ndim(m) == 3 ? ct_tensor_view(x, CT_F32, 4, shape) : ct_tensor_2d(x, CT_F32, N, c);
  ct_tensor yt = ct_tensor_1d(tgt, CT_I64, N);
  const ct_tensor *out;
  ct_tensor dout;
  double loss;
  ct_status s = ct_model_forward(m, &xt, 1, 0, &out);
  if (s == CT_OK) s = ct_loss_forward(dev, CT_LOSS_CROSS_ENTROPY, out, &yt, 0, &loss);
  if (s == CT_OK) s = ct_model_output_grad(m, &dout);
  if (s == CT_OK) s = ct_model_zero_grad(m);
  if (s == CT_OK) s = ct_loss_backward(dev, CT_LOSS_CROSS_ENTROPY, out, &yt, 0, 1.0f, &dout);
  if (s == CT_OK) {
    r->n_out = (size_t)ct_tensor_numel(out);
    r->out = malloc(r->n_out * sizeof(float));
    memcpy(r->out, out->data, r->n_out * sizeof(float));
    CHECK(out->dtype == CT_F32);
    s = ct_model_backward(m, &dout);
  }
  if (s == CT_OK) {
    float *g = ct_model_grads(m, &r->n_par);
    r->grads = malloc(r->n_par * sizeof(float));
    memcpy(r->grads, g, r->n_par * sizeof(float));
    r->plan = ct_model_plan_bytes(m);
  }
  if (s != CT_OK) fprintf(stderr, "%s %s %s: %s\n", name, ct_precision_name(p), ct_opt_level_name(o), ct_last_error());
  free(x);
  ct_model_destroy(m);
  return s == CT_OK ? 0 : -1;
}

static void step_free(step_out *r) { free(r->out), free(r->grads); }

/* ||a - b|| / ||b||. */
static double rel_l2(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - b[i];
    num += d * d;
    den += (double)b[i] * b[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void test_policy(void) {
  CHECK(ct_amp_policy_rule(CT_OPT_O0, "conv2d") == CT_AMP_FP32);
  CHECK(ct_amp_policy_rule(CT_OPT_O1, "conv2d") == CT_AMP_LOWER);
  CHECK(ct_amp_policy_rule(CT_OPT_O1, "linear") == CT_AMP_LOWER);
  CHECK(ct_amp_policy_rule(CT_OPT_O1, "softmax") == CT_AMP_FP32);
  CHECK(ct_amp_policy_rule(CT_OPT_O1, "logsoftmax") == CT_AMP_FP32);
  CHECK(ct_amp_policy_rule(CT_OPT_O1, "activation") == CT_AMP_FOLLOW);
  CHECK(ct_amp_policy_rule(CT_OPT_O1, "batchnorm") == CT_AMP_FOLLOW);
  CHECK(ct_amp_policy_rule(CT_OPT_O1, "add") == CT_AMP_PROMOTE);
  CHECK(ct_amp_policy_rule(CT_OPT_O2, "softmax") == CT_AMP_LOWER);
  CHECK(ct_amp_policy_rule(CT_OPT_O2, "maxpool2d") == CT_AMP_LOWER);
  CHECK(ct_amp_policy_rule(CT_OPT_O2, "batchnorm") == CT_AMP_FOLLOW);
  ct_dtype mixed[2] = {CT_BF16, CT_F32}, halves[2] = {CT_BF16, CT_F16}, same[2] = {CT_F16, CT_F16};
  CHECK(ct_amp_rule_dtype(CT_AMP_PROMOTE, mixed, 2, CT_BF16) == CT_F32);
  CHECK(ct_amp_rule_dtype(CT_AMP_PROMOTE, halves, 2, CT_BF16) == CT_F32);
  CHECK(ct_amp_rule_dtype(CT_AMP_PROMOTE, same, 2, CT_F16) == CT_F16);
  CHECK(ct_amp_rule_dtype(CT_AMP_FOLLOW, mixed, 1, CT_F16) == CT_BF16);
  CHECK(ct_amp_rule_dtype(CT_AMP_LOWER, mixed, 1, CT_F16) == CT_F16);
  ct_precision p;
  ct_opt_level o;
  CHECK(ct_precision_parse("bf16", &p) == 0 && p == CT_PRECISION_BF16);
  CHECK(ct_precision_parse("fp16", &p) == 0 && p == CT_PRECISION_FP16);
  CHECK(ct_precision_parse("int8", &p) != 0);
  CHECK(ct_opt_level_parse("O2", &o) == 0 && o == CT_OPT_O2);
  CHECK(ct_opt_level_parse("O4", &o) != 0);
}

static void test_set_precision_errors(void) {
  ct_model_options opt = {0};
  ct_model *m = NULL;
  CHECK_OK(ct_model_create("mlp", &opt, &m));
  CHECK(ct_model_set_precision(m, CT_PRECISION_FP32, CT_OPT_O2) == CT_ERR_INVALID_ARG);
  CHECK(strstr(ct_last_error(), "O2") != NULL);
  CHECK(ct_model_set_precision(m, CT_PRECISION_BF16, CT_OPT_O0) == CT_ERR_INVALID_ARG);
  ct_model_destroy(m);
}

/* The training plan of `name` at batch 64 (0 when it cannot be made);
 * *low: its low-precision weight copies. */
static size_t plan_at_64(ct_device *dev, const char *name, ct_precision p, ct_opt_level o, size_t *low) {
  ct_model_options opt = {0};
  ct_model *m = NULL;
  size_t b = 0;
  if (ct_model_create(name, &opt, &m) == CT_OK && (p == CT_PRECISION_FP32 || ct_model_set_precision(m, p, o) == CT_OK) &&
      ct_model_prepare(m, dev, 64, 1) == CT_OK)
    b = ct_model_plan_bytes(m), *low = ct_model_low_precision_bytes(m);
  ct_model_destroy(m);
  return b;
}

/* O2 stores the activations in 16 bits: the plan, which also holds the
 * weight copies (at most all of them at its peak), is below 3/4 of fp32's
 * plus those copies. At batch 64, where the activations outweigh the
 * copies (at the steps' batch 4 they need not). */
static void check_o2_plan(ct_device *dev, const char *name) {
  size_t low = 0, none = 0, p16 = plan_at_64(dev, name, CT_PRECISION_BF16, CT_OPT_O2, &low),
         p32 = plan_at_64(dev, name, CT_PRECISION_FP32, CT_OPT_O0, &none);
  CHECK_MSG(p16 && p32 && low < p32 / 4, "%s: plans %zu (O2) and %zu (fp32) at batch 64, %zu bytes of weight copies", name,
            p16, p32, low);
  CHECK_MSG(p16 < p32 * 3 / 4 + low, "%s O2: plan %zu not below 3/4 of fp32 %zu + %zu of weight copies", name, p16, p32,
            low);
}

static void test_model(ct_device *dev, const char *name) {
  step_out base, o0;
  if (run_step(dev, name, 0, CT_PRECISION_FP32, CT_OPT_O0, &base) || run_step(dev, name, 1, CT_PRECISION_FP32, CT_OPT_O0, &o0)) {
    CHECK_MSG(0, "%s: fp32 step failed", name);
    return;
  }
  CHECK_MSG(!memcmp(base.out, o0.out, base.n_out * 4) && !memcmp(base.grads, o0.grads, base.n_par * 4) &&
                base.plan == o0.plan,
            "%s: O0 is not bit-identical to the default", name);
  struct { ct_precision p; ct_opt_level o; double tol; } cases[] = {
      {CT_PRECISION_BF16, CT_OPT_O1, 0.03}, {CT_PRECISION_BF16, CT_OPT_O2, 0.03}, {CT_PRECISION_BF16, CT_OPT_O3, 0.04},
      {CT_PRECISION_FP16, CT_OPT_O1, 0.004}, {CT_PRECISION_FP16, CT_OPT_O2, 0.004}};
  int smooth = strstr(name, "amp_smooth") != NULL;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    step_out r;
    double gtol = smooth ? cases[c].tol : cases[c].p == CT_PRECISION_BF16 ? 0.35 : 0.15;
    if (run_step(dev, name, 1, cases[c].p, cases[c].o, &r)) {
      CHECK_MSG(0, "%s %s %s: step failed", name, ct_precision_name(cases[c].p), ct_opt_level_name(cases[c].o));
      continue;
    }
    double eo = rel_l2(r.out, base.out, base.n_out), eg = rel_l2(r.grads, base.grads, base.n_par);
    printf("%-9s %s %s: output rel err %.2e, grad rel err %.2e, plan %zu vs %zu bytes\n", name,
           ct_precision_name(cases[c].p), ct_opt_level_name(cases[c].o), eo, eg, r.plan, base.plan);
    CHECK_MSG(eo < cases[c].tol && eg < gtol, "%s %s %s: output %.3g grads %.3g (tol %.3g / %.3g)", name,
              ct_precision_name(cases[c].p), ct_opt_level_name(cases[c].o), eo, eg, cases[c].tol, gtol);
    /* Something really ran in low precision: not bit-equal to fp32. */
    CHECK_MSG(eo > 0 || eg > 0, "%s %s: identical to fp32", name, ct_precision_name(cases[c].p));
    if (cases[c].o == CT_OPT_O2 && strcmp(name, "mlp")) check_o2_plan(dev, name);
    step_free(&r);
  }
  step_free(&base);
  step_free(&o0);
}

static void test_o3_rounds(ct_device *dev) {
  ct_model_options opt = {0};
  ct_model *m = NULL;
  CHECK_OK(ct_model_create("cnn", &opt, &m));
  CHECK_OK(ct_model_set_precision(m, CT_PRECISION_BF16, CT_OPT_O3));
  CHECK_OK(ct_model_prepare(m, dev, 2, 1));
  size_t n;
  float *p = ct_model_params(m, &n);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += ct_bf16_to_f32(ct_f32_to_bf16(p[i])) != p[i];
  CHECK_MSG(bad == 0, "%zu parameters not bf16-representable under O3", bad);
  /* Every parameter of the cnn has a 16-bit copy (the gaps inside a
   * layer's span too, those between layers not). */
  const size_t lp = ct_model_low_precision_bytes(m);
  CHECK_MSG(lp >= (size_t)ct_model_param_count(m) * 2 && lp <= n * 2, "16-bit copies %zu bytes, %lld parameters", lp,
            (long long)ct_model_param_count(m));
  /* The summary reports per-layer dtypes. */
  int convs = 0;
  for (int i = 0; i < 64; i++) convs += ct_model_layer_dtype(m, i) == CT_BF16;
  CHECK(convs > 3);
  ct_model_destroy(m);
}

/* The smooth model, written where the test may write. */
static const char *smooth_model(char *path, size_t n) {
  snprintf(path, n, "%s/amp_smooth.txt", test_tmpdir());
  FILE *f = fopen(path, "w");
  if (!f) return NULL;
  fputs("input 3x12x12\n"
        "conv2d 3 16 3 padding=1\n"
        "batchnorm2d 16\n"
        "gelu\n"
        "residual\n"
        "  conv2d 16 16 3 padding=1\n"
        "  tanh\n"
        "end\n"
        "avgpool2d 2 stride=2\n"
        "conv2d 16 8 3\n"
        "sigmoid\n"
        "flatten\n"
        "linear 128 10\n"
        "logsoftmax\n",
        f);
  fclose(f);
  return path;
}

int main(void) {
  test_policy();
  test_set_precision_errors();
  ct_device *dev;
  CHECK_OK(ct_device_open("cpu", &dev));
  char sp[1024];
  const char *models[] = {smooth_model(sp, sizeof sp), "mlp", "cnn", "convnet", "lenet5", "resnet9"};
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) test_model(dev, models[i]);
  test_o3_rounds(dev);
  ct_device_close(dev);
  return test_summary("test_amp_model");
}
