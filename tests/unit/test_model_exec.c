/* Executing models: the static memory plan is valid and saves memory, a
 * small CNN learns a separable problem, the cpu and reference devices
 * agree on a full forward/backward, a batch below the planned one runs,
 * gradients accumulate across backward calls, a backward that overwrites
 * them (no zero fill) ignores the NaN and infinities they held, and
 * too-small inputs are refused naming the layer, and every parameter starts
 * at a multiple of CT_STATE_ALIGN bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nn/model_impl.h"
#include "plan/exec_plan.h"
#include "test_util.h"

static ct_model *make(const char *name, int c, int h, int w, int classes, uint64_t seed) {
  ct_model_options o = {c, h, w, classes, seed};
  ct_model *m = NULL;
  ct_status s = ct_model_create(name, &o, &m);
  CHECK_MSG(s == CT_OK, "create %s: %s", name, ct_last_error());
  return m;
}

static void fill_normal(float *p, int64_t n, uint64_t seed) {
  ct_rng r;
  ct_rng_init(&r, seed, CT_RNG_TEST, 7, 0);
  for (int64_t i = 0; i < n; i++) p[i] = (float)ct_rng_normal(&r);
}

/* Max |a-b| / max |b|. */
static double rel(const float *a, const float *b, int64_t n) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]);
    if (e > d || isnan(e)) d = isnan(e) ? INFINITY : e;
    if (fabs(b[i]) > m) m = fabs(b[i]);
  }
  return m > 0 ? d / m : d;
}

/* One training forward + cross-entropy backward; returns the loss. */
static double step(ct_model *m, ct_device *d, ct_tensor *x, ct_tensor *t, const ct_tensor **y) {
  const ct_tensor *out;
  double loss = NAN;
  CHECK_OK(ct_model_forward(m, x, 1, 0, &out));
  CHECK_OK(ct_loss_forward(d, CT_LOSS_CROSS_ENTROPY, out, t, 0.0f, &loss));
  ct_tensor dout;
  CHECK_OK(ct_model_output_grad(m, &dout));
  CHECK_OK(ct_loss_backward(d, CT_LOSS_CROSS_ENTROPY, out, t, 0.0f, 1.0f, &dout));
  CHECK_OK(ct_model_backward(m, &dout));
  if (y) *y = out;
  return loss;
}

/* No two buffers alive at the same time share bytes; reuse makes the peak
 * smaller than the sum. */
static void test_plan(const char *name, int c, int h, int w, int batch) {
  ct_model *m = make(name, c, h, w, 10, 1);
  ct_device *d = NULL;
  CHECK_OK(ct_device_open("cpu", &d));
  if (!m || !d) return;
  CHECK_OK(ct_model_prepare(m, d, batch, 1));
  const ct_plan *p = m->plan;
  int bad = 0;
  size_t top = 0;
  for (int i = 0; i < p->n; i++) {
    const ct_plan_buf *a = &p->bufs[i];
    if (a->bytes && a->offset + a->bytes > top) top = a->offset + a->bytes;
    if (a->offset % CT_PLAN_ALIGN && bad++ < 3) fprintf(stderr, "%s: buffer %d at offset %zu\n", name, i, a->offset);
    for (int j = i + 1; j < p->n; j++) {
      const ct_plan_buf *b = &p->bufs[j];
      int live = a->first <= b->last && b->first <= a->last;
      int overlap = a->bytes && b->bytes && a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
      if (live && overlap && bad++ < 3)
        fprintf(stderr, "%s: buffers %d [%d,%d] @%zu+%zu and %d [%d,%d] @%zu+%zu overlap\n", name, i, a->first,
                a->last, a->offset, a->bytes, j, b->first, b->last, b->offset, b->bytes);
    }
  }
  CHECK_MSG(bad == 0, "%s: %d overlapping live buffer pairs or unaligned offsets", name, bad);
  CHECK_MSG(top <= p->peak && p->peak == ct_model_plan_bytes(m), "%s: peak %zu, highest byte %zu", name, p->peak, top);
  CHECK_MSG(p->peak < p->naive, "%s: peak %zu not below the naive %zu", name, p->peak, p->naive);
  printf("plan %-9s batch %d: %d buffers, peak %.1f MB, naive %.1f MB\n", name, batch, p->n, p->peak / 1048576.0,
         p->naive / 1048576.0);
  ct_model_destroy(m);
  ct_device_close(d);
}

/* Every parameter, gradient, buffer and optimizer state starts at a
 * multiple of CT_STATE_ALIGN bytes, whatever the sizes before it (the
 * parity model's 3x3 convolution over 3 channels has 216 weights and 8
 * biases); the gaps are zero and stay zero through SGD steps with
 * momentum and weight decay; the parameter count leaves the gaps out. */
static void test_state_alignment(void) {
  char path[1024];
  const char *src = __FILE__, *cut = strstr(src, "tests/unit/");
  snprintf(path, sizeof path, "%.*stests/data/models/parity.txt", cut ? (int)(cut - src) : 0, src);
  ct_model_options o = {0};
  ct_model *m = NULL;
  ct_device *d = NULL;
  CHECK_OK(ct_model_create(path, &o, &m));
  CHECK_OK(ct_device_open("cpu", &d));
  if (!m || !d) return;
  const int B = 4;
  CHECK_OK(ct_model_prepare(m, d, B, 1));
  size_t n = 0;
  float *params = ct_model_params(m, &n), *grads = ct_model_grads(m, NULL);
  /* 1 where a parameter lies, 0 in the gaps */
  unsigned char *used = calloc(n, 1);
  int64_t count = 0;
  int bad = 0;
  for (int i = 0; i < ct_model_state_count(m); i++) {
    const ct_state_entry *e = ct_model_state(m, i);
    int64_t k = ct_tensor_numel(&e->value);
    if (e->value.dtype == CT_I64) continue; /* num_batches_tracked: a host counter, never a kernel operand */
    if (((uintptr_t)e->value.data % CT_STATE_ALIGN || (e->grad.data && (uintptr_t)e->grad.data % CT_STATE_ALIGN)) &&
        bad++ < 3)
      fprintf(stderr, "%s at %p, gradient at %p\n", e->name, e->value.data, e->grad.data);
    if (!e->grad.data) continue;
    count += k;
    memset(used + ((float *)e->value.data - params), 1, (size_t)k);
  }
  CHECK_MSG(bad == 0, "%d state entries not at multiples of %d bytes", bad, CT_STATE_ALIGN);
  CHECK_MSG(count == ct_model_param_count(m) && (size_t)count < n,
            "parameter count %lld, the entries hold %lld, the flat buffer %zu", (long long)ct_model_param_count(m),
            (long long)count, n);
  float *x = malloc(sizeof(float) * B * 3 * 20 * 20);
  int64_t t[4] = {0, 3, 7, 9};
  fill_normal(x, B * 3 * 20 * 20, 5);
  ct_tensor xt = ct_tensor_4d(x, CT_F32, B, 3, 20, 20), tt = ct_tensor_1d(t, CT_I64, B);
  xt.device = tt.device = d;
  ct_optim_config cfg = ct_optim_config_default(CT_OPTIM_SGD);
  cfg.lr = 0.01, cfg.momentum = 0.9, cfg.weight_decay = 0.1;
  ct_optimizer *opt = NULL;
  CHECK_OK(ct_optimizer_create(&cfg, n, &opt));
  for (int s = 0; s < 3 && opt; s++) {
    CHECK_OK(ct_model_zero_grad(m));
    step(m, d, &xt, &tt, NULL);
    CHECK_OK(ct_optimizer_step(opt, params, grads));
  }
  const char *sn = "";
  float *mom = NULL;
  size_t mn = 0;
  if (opt) CHECK_OK(ct_optimizer_state(opt, 0, &sn, &mom, &mn));
  CHECK_MSG(mom && mn == n, "optimizer state '%s': %zu floats, expected %zu", sn, mn, n);
  size_t nz = 0, moved = 0;
  for (size_t i = 0; i < n; i++) {
    if (used[i]) moved += grads[i] != 0;
    else nz += params[i] != 0 || grads[i] != 0 || (mom && mn == n && mom[i] != 0);
  }
  CHECK_MSG(nz == 0, "%zu gap elements of the parameters, gradients or momentum are not zero", nz);
  CHECK_MSG(moved > (size_t)count / 2, "only %zu of %lld gradients are non-zero", moved, (long long)count);
  printf("parity model: %lld parameters in a flat buffer of %zu floats, each at a multiple of %d bytes\n",
         (long long)count, n, CT_STATE_ALIGN);
  ct_optimizer_destroy(opt);
  free(x);
  free(used);
  ct_model_destroy(m);
  ct_device_close(d);
}

/* The torchkeras CNN learns "blob top-left vs bottom-right" in 30 SGD steps. */
static void test_train_cnn(void) {
  const int B = 32, steps = 30;
  ct_model *m = make("cnn", 1, 28, 28, 2, 3);
  ct_device *d = NULL;
  CHECK_OK(ct_device_open("cpu", &d));
  if (!m || !d) return;
  CHECK_OK(ct_model_prepare(m, d, B, 1));
  float *x = malloc(sizeof(float) * B * 28 * 28);
  int64_t *t = malloc(sizeof(int64_t) * B);
  ct_rng r;
  ct_rng_init(&r, 11, CT_RNG_TEST, 1, 0);
  for (int n = 0; n < B; n++) {
    t[n] = n % 2;
    for (int i = 0; i < 28 * 28; i++) {
      int yy = i / 28, xx = i % 28;
      int in_blob = t[n] ? (yy >= 16 && xx >= 16 && yy < 26 && xx < 26) : (yy < 12 && xx < 12 && yy >= 2 && xx >= 2);
      x[n * 784 + i] = (float)(0.5 * ct_rng_normal(&r) + (in_blob ? 1.5 : 0.0));
    }
  }
  ct_tensor xt = ct_tensor_4d(x, CT_F32, B, 1, 28, 28), tt = ct_tensor_1d(t, CT_I64, B);
  xt.device = tt.device = d;
  ct_optim_config cfg = ct_optim_config_default(CT_OPTIM_SGD);
  cfg.lr = 0.05;
  cfg.momentum = 0.9;
  ct_optimizer *opt = NULL;
  size_t n;
  float *params = ct_model_params(m, &n);
  CHECK_OK(ct_optimizer_create(&cfg, n, &opt));
  double first = 0, last = 0;
  for (int s = 0; s < steps && opt; s++) {
    CHECK_OK(ct_model_zero_grad(m));
    double l = step(m, d, &xt, &tt, NULL);
    if (s == 0) first = l;
    last = l;
    CHECK_OK(ct_optimizer_step(opt, params, ct_model_grads(m, NULL)));
  }
  printf("cnn training: loss %.4f -> %.4f in %d steps\n", first, last, steps);
  CHECK_MSG(first > 0.5 && last < 0.5 * first, "loss %.4f -> %.4f did not fall by half", first, last);
  ct_optimizer_destroy(opt);
  free(x);
  free(t);
  ct_model_destroy(m);
  ct_device_close(d);
}

/* The trainer's first backward of a step overwrites the gradients
 * without a zero fill (ct_model_overwrite_grads), so whatever they held
 * must not leak in: a step skipped for an overflow leaves infinities and
 * NaNs there. After a step from zeroed gradients, the gradients are set
 * to NaN, +inf and -inf in turn and the same step run again with
 * ct_model_overwrite_grads: every gradient must come out bit for bit the
 * same (each backend's beta 0 writes without reading; batch norm's
 * dgamma/dbeta on the cpu used to compute 0 * old + new). The model and
 * its inputs are the caller's, the step the one above. */
static void check_overwrite(ct_model *m, ct_device *d, ct_tensor *x, ct_tensor *t, const char *what) {
  size_t n;
  float *g = ct_model_grads(m, &n);
  CHECK_OK(ct_model_zero_grad(m));
  step(m, d, x, t, NULL);
  float *want = malloc(n * sizeof *want);
  memcpy(want, g, n * sizeof *want);
  const float junk[3] = {NAN, INFINITY, -INFINITY};
  for (size_t i = 0; i < n; i++) g[i] = junk[i % 3];
  ct_model_overwrite_grads(m);
  step(m, d, x, t, NULL);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += memcmp(&g[i], &want[i], sizeof *g) != 0;
  CHECK_MSG(bad == 0, "%s: %zu of %zu gradients differ after overwriting NaN/inf gradients", what, bad, n);
  free(want);
}

/* cpu (oneDNN) and the reference kernels agree on resnet9's whole step. */
static void test_ref_vs_cpu(void) {
#if defined(__SANITIZE_ADDRESS__)
  const int B = 1; /* the reference kernels under ASan: most of the sanitizer run; one sample reaches every line */
#else
  const int B = 2;
#endif
  ct_model *m[2] = {make("resnet9", 3, 32, 32, 10, 5), make("resnet9", 3, 32, 32, 10, 5)};
  ct_device *d[2] = {NULL, NULL};
  CHECK_OK(ct_device_open("cpu", &d[0]));
  CHECK_OK(ct_device_open("ref", &d[1]));
  if (!m[0] || !m[1] || !d[0] || !d[1]) return;
  float *x = malloc(sizeof(float) * B * 3 * 32 * 32);
  fill_normal(x, B * 3 * 32 * 32, 21);
  int64_t t[2] = {3, 8};
  const ct_tensor *y[2];
  double loss[2];
  for (int k = 0; k < 2; k++) {
    CHECK_OK(ct_model_prepare(m[k], d[k], B, 1));
    ct_tensor xt = ct_tensor_4d(x, CT_F32, B, 3, 32, 32), tt = ct_tensor_1d(t, CT_I64, B);
    xt.device = tt.device = d[k];
    loss[k] = step(m[k], d[k], &xt, &tt, &y[k]);
  }
  double e = rel(y[0]->data, y[1]->data, ct_tensor_numel(y[1]));
  CHECK_MSG(e <= 1e-4, "resnet9 output cpu vs ref: %.3g", e);
  CHECK_MSG(fabs(loss[0] - loss[1]) <= 1e-4 * fabs(loss[1]), "loss %.8f vs %.8f", loss[0], loss[1]);
  double worst = 0;
  for (int i = 0; i < ct_model_state_count(m[0]); i++) {
    const ct_state_entry *a = ct_model_state(m[0], i), *b = ct_model_state(m[1], i);
    if (a->value.dtype != CT_F32) continue;
    int64_t n = ct_tensor_numel(&a->value);
    e = rel(a->value.data, b->value.data, n);
    CHECK_MSG(e <= 1e-4, "state %s cpu vs ref: %.3g", a->name, e);
    if (a->is_buffer) continue;
    e = rel(a->grad.data, b->grad.data, n);
    CHECK_MSG(e <= 1e-4, "grad %s cpu vs ref: %.3g", a->name, e);
    if (e > worst) worst = e;
  }
  printf("resnet9 cpu vs ref: worst gradient rel err %.2e\n", worst);
  for (int k = 0; k < 2; k++) {
    ct_tensor xt = ct_tensor_4d(x, CT_F32, B, 3, 32, 32), tt = ct_tensor_1d(t, CT_I64, B);
    xt.device = tt.device = d[k];
    check_overwrite(m[k], d[k], &xt, &tt, k ? "resnet9 fp32 on ref" : "resnet9 fp32 on cpu");
  }
  /* and the cpu's bf16 (O1) kernels: oneDNN's and the widening path's */
  ct_model *mb = make("resnet9", 3, 32, 32, 10, 5);
  if (mb) {
    CHECK_OK(ct_model_set_precision(mb, CT_PRECISION_BF16, CT_OPT_O1));
    CHECK_OK(ct_model_prepare(mb, d[0], B, 1));
    ct_tensor xt = ct_tensor_4d(x, CT_F32, B, 3, 32, 32), tt = ct_tensor_1d(t, CT_I64, B);
    xt.device = tt.device = d[0];
    check_overwrite(mb, d[0], &xt, &tt, "resnet9 bf16 on cpu");
    ct_model_destroy(mb);
  }
  free(x);
  for (int k = 0; k < 2; k++) ct_model_destroy(m[k]), ct_device_close(d[k]);
}

/* Planned for 8, run with 3: the same as a model planned for 3. Then a
 * second backward without zero_grad doubles every gradient. */
static void test_small_batch_and_accumulation(void) {
  ct_model *a = make("resnet9", 3, 16, 16, 10, 9), *b = make("resnet9", 3, 16, 16, 10, 9);
  ct_device *d = NULL;
  CHECK_OK(ct_device_open("cpu", &d));
  if (!a || !b || !d) return;
  CHECK_OK(ct_model_prepare(a, d, 8, 1));
  CHECK_OK(ct_model_prepare(b, d, 3, 1));
  float x[3 * 3 * 16 * 16];
  fill_normal(x, 3 * 3 * 16 * 16, 33);
  int64_t t[3] = {1, 4, 9};
  ct_tensor xt = ct_tensor_4d(x, CT_F32, 3, 3, 16, 16), tt = ct_tensor_1d(t, CT_I64, 3);
  xt.device = tt.device = d;
  const ct_tensor *ya, *yb;
  double la = step(a, d, &xt, &tt, &ya), lb = step(b, d, &xt, &tt, &yb);
  CHECK_MSG(ya->shape[0] == 3, "output batch %lld", (long long)ya->shape[0]);
  CHECK_MSG(rel(ya->data, yb->data, 30) <= 1e-6 && fabs(la - lb) <= 1e-6 * fabs(lb),
            "batch 3 on a plan for 8 differs from a plan for 3 (loss %.8f vs %.8f)", la, lb);
  size_t n;
  float *ga = ct_model_grads(a, &n), *gb = ct_model_grads(b, NULL);
  CHECK_MSG(rel(ga, gb, (int64_t)n) <= 1e-6, "gradients differ between plans: %.3g", rel(ga, gb, (int64_t)n));

  /* Accumulation: a second identical step adds the same gradient again.
   * (BN running stats move between the two, but train-mode outputs use
   * batch statistics, so the second gradient equals the first.) */
  float *g1 = malloc(n * sizeof *g1);
  memcpy(g1, ga, n * sizeof *g1);
  step(a, d, &xt, &tt, NULL);
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs(ga[i] - 2.0 * g1[i]);
    if (e > worst) worst = e;
  }
  double scale = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(g1[i]));
  CHECK_MSG(worst <= 1e-5 * scale && scale > 0, "second backward: max |g - 2 g1| = %.3g (scale %.3g)", worst, scale);
  CHECK_OK(ct_model_zero_grad(a));
  step(a, d, &xt, &tt, NULL);
  CHECK_MSG(rel(ga, g1, (int64_t)n) <= 1e-5, "after zero_grad: %.3g", rel(ga, g1, (int64_t)n));
  free(g1);

  /* A batch above the plan is refused. */
  float big[9 * 3 * 16 * 16] = {0};
  ct_tensor bx = ct_tensor_4d(big, CT_F32, 9, 3, 16, 16);
  bx.device = d;
  const ct_tensor *y;
  CHECK(ct_model_forward(a, &bx, 1, 0, &y) == CT_ERR_SHAPE);
  ct_model_destroy(a);
  ct_model_destroy(b);
  ct_device_close(d);
}

/* Inputs too small for a model name the layer that cannot take them. */
static void test_too_small(void) {
  ct_model_options o = {3, 8, 8, 10, 0};
  ct_model *m = NULL;
  ct_status s = ct_model_create("alexnet", &o, &m);
  CHECK_MSG(s == CT_ERR_SHAPE, "alexnet 3x8x8: %s", ct_status_name(s));
  CHECK_MSG(strstr(ct_last_error(), "features.") != NULL && strstr(ct_last_error(), "alexnet") != NULL,
            "alexnet 3x8x8 message does not name the layer: %s", ct_last_error());
  printf("alexnet 3x8x8: %s\n", ct_last_error());
  CHECK(m == NULL);
  ct_model_options o2 = {1, 4, 4, 10, 0};
  s = ct_model_create("lenet5", &o2, &m);
  CHECK_MSG(s == CT_ERR_SHAPE && strstr(ct_last_error(), "lenet5") && strstr(ct_last_error(), "layer"),
            "lenet5 1x4x4: %s %s", ct_status_name(s), ct_last_error());
  CHECK(m == NULL);
}

/* A batch whose activations' bytes overflow size_t is refused by the plan
 * (it once wrapped to a small arena that the forward pass overran). */
static void test_absurd_batch(void) {
  ct_model *m = make("cnn", 1, 28, 28, 10, 1);
  ct_device *d = NULL;
  CHECK_OK(ct_device_open("cpu", &d));
  if (!m || !d) return;
  ct_status s = ct_model_prepare(m, d, INT64_C(1) << 50, 1);
  CHECK_MSG(s == CT_ERR_OUT_OF_MEMORY && strstr(ct_last_error(), "2^62"), "%s: %s", ct_status_name(s),
            ct_last_error());
  CHECK_OK(ct_model_prepare(m, d, 4, 1)); /* and the model is still usable */
  ct_model_destroy(m);
  /* 2^31 samples of 2^31 fp32 elements: every buffer's bytes were exactly
   * 2^64, which wrapped to 0, and the plan came out empty. */
  char path[600];
  snprintf(path, sizeof path, "%s/wrap_%d.txt", test_tmpdir(), (int)getpid());
  FILE *f = fopen(path, "w");
  if (f) fputs("input 2048x1024x1024\nflatten\nrelu\n", f), fclose(f);
  m = make(path, 0, 0, 0, 0, 1);
  remove(path);
  if (m) {
    s = ct_model_prepare(m, d, INT64_C(1) << 31, 1);
    CHECK_MSG(s == CT_ERR_OUT_OF_MEMORY, "2^64-byte buffers planned: %s: %s", ct_status_name(s), ct_last_error());
    ct_model_destroy(m);
  }
  ct_device_close(d);
}

int main(void) {
  test_absurd_batch();
  test_plan("cnn", 1, 28, 28, 16);
  test_plan("cnn", 1, 27, 27, 3); /* odd sizes: offsets stay CT_PLAN_ALIGN multiples */
  test_plan("resnet18", 3, 64, 64, 4);
  test_plan("resnet9", 3, 32, 32, 8);
  test_plan("vgg11_bn", 3, 32, 32, 2);
  test_state_alignment();
  test_too_small();
  test_small_batch_and_accumulation();
  test_ref_vs_cpu();
  test_train_cnn();
  return test_summary("test_model_exec");
}
