/* ReLU folding (src/plan/fuse.c): on zoo models with ReLU after conv,
 * linear, batch norm and residual adds, a fused training step gives the
 * same output, input gradient path, parameter gradients and batch-norm
 * running stats as the unfused step from identical weights and random
 * inputs (ReLU is exact, so the bound is tight), the ReLU layers are
 * really folded (and the model output never is), the step needs fewer
 * buffer bytes, each residual add's gradient is shared with one of its
 * inputs, and in an identity block with both (exec_plan.c's grad_alias:
 * no copy, no buffer) but not the second when the first applies a fused
 * ReLU's gradient in place (a small "trunk" graph with and without one)
 * or other readers' gradients were added in ("both", "twice"),
 * on the reference device the second gradient reaching a block's input is
 * added in by the convolution itself (conv2d_bwd_data_acc, no temporary),
 * and re-preparing (training, then inference at another batch) keeps
 * results right. */
#include "test_util.h"

#include "plan/fuse.h"
#include "nn/model_impl.h"
#include "plan/exec_plan.h"
#include "step_harness.h"

typedef struct run_out {
  step_result s;
  size_t plan, naive;
  int fused, shared, adds, adds_sharing, acc;
} run_out;

/* A residual add of a branch and its trunk input c0, which one more
 * layer (cb, before the branch) reads:
 *   c0 = conv(x); cb = conv1x1(c0); ca = conv(cb) [+ ReLU]; add(ca, c0).
 * The add's gradient goes to ca first; c0 may share it only if ca leaves
 * it intact (no fused ReLU), since cb's gradient is added in after ca's
 * backward. Input 3x8x8, 10 classes. */
static ct_status build_trunk(int relu, ct_model **out) {
  ct_model *m;
  CT_TRY(ct_model_new(relu ? "trunk_relu" : "trunk", &m));
  int c0 = ct_g_conv2d(m, "c0", -1, 3, 4, 3, 1, 1, 1, 1, 1);
  int cb = ct_g_conv2d(m, "cb", c0, 4, 4, 1, 1, 0, 1, 1, 1);
  int ca = ct_g_conv2d(m, "ca", cb, 4, 4, 3, 1, 1, 1, 1, 1);
  if (relu) ca = ct_g_act(m, "relu", ca, CT_ACT_RELU, 0.0f);
  int f = ct_g_flatten(m, "flat", ct_g_add(m, "add", ca, c0));
  ct_g_linear(m, "fc", f, 4 * 8 * 8, 10, 1);
  ct_status s = ct_model_finish(m, 3, (const int64_t[]){3, 8, 8}, 5);
  if (s != CT_OK) ct_model_destroy(m), m = NULL;
  *out = m;
  return s;
}

/* Graphs where the add's buffer changes before a later input could read
 * it, so that input must not share (input 3x8x8, 10 classes):
 *  "both":  c0 = conv(x); cb = conv(c0); c2 = conv(cb); d = conv(c2);
 *           a1 = add(c2, c0); a2 = add(a1, d). c2 shares a1's buffer and
 *           d's gradient is then added into it: c0 may not share it.
 *  "twice": s2 = conv(x); s = conv(x); a = add(s, s); b = add(a, s2). a's
 *           second edge adds dy into the buffer s shares: s2 may not. */
static ct_status build_changed(int twice, ct_model **out) {
  ct_model *m;
  CT_TRY(ct_model_new(twice ? "twice" : "both", &m));
  int a;
  if (twice) {
    int s2 = ct_g_conv2d(m, "s2", -1, 3, 4, 3, 1, 1, 1, 1, 1);
    int s = ct_g_conv2d(m, "s", -1, 3, 4, 3, 1, 1, 1, 1, 1);
    a = ct_g_add(m, "b", ct_g_add(m, "a", s, s), s2);
  } else {
    int c0 = ct_g_conv2d(m, "c0", -1, 3, 4, 3, 1, 1, 1, 1, 1);
    int cb = ct_g_conv2d(m, "cb", c0, 4, 4, 3, 1, 1, 1, 1, 1);
    int c2 = ct_g_conv2d(m, "c2", cb, 4, 4, 3, 1, 1, 1, 1, 1);
    int d = ct_g_conv2d(m, "d", c2, 4, 4, 3, 1, 1, 1, 1, 1);
    a = ct_g_add(m, "a2", ct_g_add(m, "a1", c2, c0), d);
  }
  ct_g_linear(m, "fc", ct_g_flatten(m, "flat", a), 4 * 8 * 8, 10, 1);
  ct_status s = ct_model_finish(m, 3, (const int64_t[]){3, 8, 8}, 5);
  if (s != CT_OK) ct_model_destroy(m), m = NULL;
  *out = m;
  return s;
}

static int run(ct_device *dev, const char *name, int c, int h, int w, int64_t N, int fuse, run_out *r) {
  memset(r, 0, sizeof *r);
  ct_fuse_set_enabled(fuse);
  ct_model_options opt = {c, h, w, 10, 5};
  ct_model *m = NULL;
  int rc = -1;
  ct_status s = !strncmp(name, "trunk", 5)                       ? build_trunk(!strcmp(name, "trunk_relu"), &m)
                : !strcmp(name, "both") || !strcmp(name, "twice") ? build_changed(!strcmp(name, "twice"), &m)
                                                                  : ct_model_create(name, &opt, &m);
  if (s != CT_OK) goto done;
  if (ct_model_prepare(m, dev, N, 1) != CT_OK) goto done;
  for (int i = 0; i < m->n_layers; i++) r->fused += ct_layer_is_fused(&m->layers[i]);
  CHECK(!ct_layer_is_fused(&m->layers[m->output]));
  r->plan = ct_model_plan_bytes(m);
  r->naive = m->plan->naive;
  /* Two steps, so the second forward sees weights the first backward
   * produced; the inference re-prepare runs the pass again, which must
   * not refold. */
  for (int i = 0; i < m->n_layers; i++) {
    const ct_layer *l = &m->layers[i];
    if (l->cls != &ct_layer_add) continue;
    r->adds++;
    int shared = 0;
    for (int j = 0; j < l->n_inputs; j++)
      shared += l->inputs[j] >= 0 && m->eb->grad[i] >= 0 && m->eb->grad[l->inputs[j]] == m->eb->grad[i];
    r->shared += shared;
    r->adds_sharing += shared > 0;
  }
  for (int e = 0; e < 2 * m->n_layers; e++) r->acc += m->eb->tmp[e] == CT_EXEC_DX_ACC;
  rc = step_run(dev, m, c, h, w, N, 2, &r->s);
done:
  ct_model_destroy(m);
  ct_fuse_set_enabled(1);
  return rc;
}

static void free_run(run_out *r) { step_result_free(&r->s); }

/* max |a - b| / max |b| (floor unused: test_max_rel_err_f32's signature). */
static double normwise(const float *a, const float *b, size_t n, double floor) {
  (void)floor;
  double d = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - (double)b[i]);
    if (!(e <= d)) d = e;
    if (fabs((double)b[i]) > m) m = fabs((double)b[i]);
  }
  return m > 0 ? d / m : d;
}

/* shared: the input edges expected to share their add's gradient; acc:
 * the convolutions expected to add their input gradient into a buffer
 * another reader wrote (on a backend with conv2d_bwd_data_acc). */
static void compare(ct_device *dev, const char *name, int c, int h, int w, int64_t N, int min_fused, int shared,
                    int acc) {
  run_out a, b;
  int ra = run(dev, name, c, h, w, N, 1, &a), rb = run(dev, name, c, h, w, N, 0, &b);
  CHECK_MSG(ra == 0 && rb == 0, "%s: %s", name, ct_last_error());
  if (ra || rb) return;
  CHECK_MSG(a.fused >= min_fused, "%s: %d ReLU layers folded, expected at least %d", name, a.fused, min_fused);
  CHECK_MSG(b.fused == 0, "%s: pass disabled but %d layers folded", name, b.fused);
  CHECK_MSG(a.adds_sharing == a.adds, "%s: %d of %d residual adds share their gradient with an input", name,
            a.adds_sharing, a.adds);
  CHECK_MSG(a.shared == shared, "%s: %d add inputs share the add's gradient, expected %d", name, a.shared, shared);
  CHECK_MSG(b.shared == 0, "%s: pass disabled but %d add gradients shared", name, b.shared);
  CHECK_MSG(a.acc == acc, "%s on %s: %d convolutions accumulate their input gradient, expected %d", name,
            ct_device_name(dev), a.acc, acc);
  CHECK_MSG(b.acc == 0, "%s: pass disabled but %d convolutions accumulate", name, b.acc);
  /* Fewer bytes of buffers in total; the peak after packing may move
   * either way by a little (lifetimes change). */
  CHECK_MSG(a.naive < b.naive, "%s: fused buffers %zu bytes, not fewer than unfused %zu", name, a.naive, b.naive);
  /* Not bit-exact by contract: oneDNN may pick another kernel for a conv
   * with a post-op, with another summation order. An accumulating
   * backward-data rounds each sum once where the temporary and the add
   * round twice; through two steps and batch norms that moves small
   * entries by more than 1e-4 of themselves (2.7e-3 on a 1e-3 entry of
   * ResNet-18), so those runs compare normwise (max |a - b| / max |b|; a
   * lost or doubled contribution is O(1) either way). */
  double (*err)(const float *, const float *, size_t, double) = a.acc ? normwise : test_max_rel_err_f32;
  double eo = err(a.s.out, b.s.out, a.s.n_out, 1e-3);
  double eg = err(a.s.grads, b.s.grads, a.s.n_par, 1e-3);
  double eb = a.s.n_buf ? err(a.s.bufs, b.s.bufs, a.s.n_buf, 1e-3) : 0;
  double ee = err(a.s.eval_out, b.s.eval_out, a.s.n_eval, 1e-3);
  CHECK_MSG(eo < 1e-5, "%s: output differs fused vs unfused (rel %g)", name, eo);
  CHECK_MSG(eg < 1e-4, "%s: parameter gradients differ (rel %g)", name, eg);
  CHECK_MSG(eb < 1e-5, "%s: running stats differ (rel %g)", name, eb);
  CHECK_MSG(ee < 1e-5, "%s: inference output after re-prepare differs (rel %g)", name, ee);
  double gsum = 0;
  for (size_t i = 0; i < a.s.n_par; i++) gsum += fabs(a.s.grads[i]);
  CHECK_MSG(gsum > 0, "%s: all-zero gradients, the comparison proves nothing", name);
  printf("%-9s %-3s folded %d ReLU, %d add gradients shared, %d accumulating dx, buffers %zu -> %zu bytes (peak %zu -> %zu), rel err out %.2g grads %.2g\n", name,
         ct_device_name(dev), a.fused, a.shared, a.acc, b.naive, a.naive, b.plan, a.plan, eo, eg);
  free_run(&a), free_run(&b);
}

int main(void) {
  ct_device *dev, *ref;
  CHECK_OK(ct_device_open("cpu", &dev));
  CHECK_OK(ct_device_open("ref", &ref));
  compare(dev, "mlp", 1, 28, 28, 6, 2, 0, 0);        /* linear + ReLU */
  compare(dev, "convnet", 1, 28, 28, 6, 3, 0, 0);    /* batchnorm + ReLU, linear + ReLU */
  compare(dev, "lenet5", 1, 28, 28, 6, 4, 0, 0);     /* conv + ReLU */
  /* Batch norm / residual add + ReLU. Shared: both inputs of all 8 blocks
   * (the last batch norm and the block input, or the shortcut's batch
   * norm in the 3 downsampling blocks). oneDNN has no
   * accumulating backward-data: the cpu device adds through temporaries. */
  compare(dev, "resnet18", 3, 32, 32, 6, 17, 16, 0);
  compare(dev, "resnet18", 3, 64, 64, 2, 17, 16, 0);
  compare(dev, "trunk", 3, 8, 8, 6, 0, 2, 0);
  compare(dev, "trunk_relu", 3, 8, 8, 6, 1, 1, 0);
  compare(dev, "both", 3, 8, 8, 6, 0, 2, 0);  /* c2 into a1, a1 into a2 */
  compare(dev, "twice", 3, 8, 8, 6, 0, 3, 0); /* both edges of a, a into b */
  /* The reference accumulates: every block's first convolution adds into
   * the gradient the add (identity) or the shortcut convolution wrote;
   * in the trunk graph cb adds into c0's. */
  compare(ref, "resnet18", 3, 32, 32, 6, 17, 16, 8);
  compare(ref, "trunk", 3, 8, 8, 6, 0, 2, 1);
  compare(ref, "trunk_relu", 3, 8, 8, 6, 1, 1, 1);
  compare(ref, "both", 3, 8, 8, 6, 0, 2, 2);  /* cb into c0's, d into c2's */
  ct_device_close(ref);
  ct_device_close(dev);
  return test_summary("fuse");
}
