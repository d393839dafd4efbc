/* Channel-blocked activations (src/nn/layout.h): on models where the
 * executor keeps activations between convolutions and max pools as
 * CT_LAYOUT_C16, a training step (two steps with an update between them),
 * the parameter gradients and a re-prepared inference pass give the same
 * numbers as with every activation plain NCHW; the blocked layout really
 * is chosen where the rules allow (and only there: never for the model
 * output, dropout inputs or channel counts that are not multiples of 16),
 * in fp32 (to the last bit over two steps) and bf16 (one step, within
 * bf16 rounding). */
#include <stdio.h>

#include "test_util.h"

#include "nn/layout.h"
#include "nn/model_impl.h"
#include "step_harness.h"

typedef struct run_out {
  step_result s;
  int blocked;     /* layers whose output is C16 */
  int bad_blocked; /* C16 where the rules forbid it */
} run_out;

/* A C16 output that breaks the rules of layout.h. */
static int forbidden(const ct_model *m, int i) {
  const ct_layer *l = &m->layers[i];
  if (i == m->output || l->out_ndim != 3 || l->out_shape[0] % 16) return 1;
  for (int k = 0; k < m->n_layers; k++)
    for (int j = 0; j < m->layers[k].n_inputs; j++)
      if (m->layers[k].inputs[j] == i && (m->layers[k].cls == &ct_layer_dropout ||
                                          m->layers[k].cls == &ct_layer_dropout2d ||
                                          m->layers[k].cls == &ct_layer_flatten))
        return 1;
  return 0;
}

static int run(ct_device *dev, const char *name, int c, int h, int w, int64_t N, ct_precision prec, int blocked,
               int steps, run_out *r) {
  memset(r, 0, sizeof *r);
  ct_layout_set_enabled(blocked);
  ct_model_options opt = {c, h, w, 10, 5};
  ct_model *m = NULL;
  int rc = -1;
  if (ct_model_create(name, &opt, &m) != CT_OK) goto done;
  /* No dropout: its masks are the same either way, but zeros hide errors. */
  for (int i = 0; i < m->n_layers; i++)
    if (m->layers[i].cls == &ct_layer_dropout || m->layers[i].cls == &ct_layer_dropout2d) m->layers[i].fp[0] = 0.0f;
  if (prec != CT_PRECISION_FP32 && ct_model_set_precision(m, prec, CT_OPT_O1) != CT_OK) goto done;
  if (ct_model_prepare(m, dev, N, 1) != CT_OK) goto done;
  for (int i = 0; i < m->n_layers; i++)
    if (m->layers[i].y.layout == CT_LAYOUT_C16) {
      r->blocked++;
      r->bad_blocked += forbidden(m, i);
      CHECK_MSG(m->layers[i].dy.layout == CT_LAYOUT_C16, "%s: layer %d's gradient is not blocked like its output",
                name, i);
    }
  rc = step_run(dev, m, c, h, w, N, steps, &r->s);
done:
  ct_model_destroy(m);
  ct_layout_set_enabled(1);
  return rc;
}

/* ||a - b|| / ||b|| over n values. */
static double norm_rel_err(const float *a, const float *b, size_t n) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
  return r > 0 ? sqrt(d / r) : sqrt(d);
}

static void free_run(run_out *r) { step_result_free(&r->s); }

/* exact: no batch norm takes the layout, so fp32 must agree to the last
 * bit; with batch norm blocked, its sums run in another order (in double
 * there, in float partials on plain tensors) and fp32 agrees normwise. */
static void compare(ct_device *dev, const char *name, int c, int h, int w, int64_t N, ct_precision prec,
                    int min_blocked, int exact) {
  run_out a, b;
  /* Two steps with an update between them where the results must be
   * equal to the last bit; otherwise one, so that rounding differences are
   * not amplified by an update (batch norm over a handful of values per
   * channel, as in ResNet-18's last stage, turns 1e-7 into 1e-1 in a step;
   * ResNet-18 runs at 64x64 here so that stage sees 16 values). */
  int steps = prec == CT_PRECISION_FP32 && exact ? 2 : 1;
  int ra = run(dev, name, c, h, w, N, prec, 1, steps, &a), rb = run(dev, name, c, h, w, N, prec, 0, steps, &b);
  CHECK_MSG(ra == 0 && rb == 0, "%s: %s", name, ct_last_error());
  if (ra || rb) return;
  CHECK_MSG(a.blocked >= min_blocked, "%s: %d blocked activations, expected at least %d", name, a.blocked,
            min_blocked);
  CHECK_MSG(a.bad_blocked == 0, "%s: %d activations blocked against the rules", name, a.bad_blocked);
  CHECK_MSG(b.blocked == 0, "%s: choice disabled but %d activations blocked", name, b.blocked);
  /* fp32: the same kernels and exact reorders, so equal to the last bit.
   * bf16: oneDNN's max-pool backward is another kernel for nChw16c
   * (jit:avx512_core_bf16 instead of jit:avx512_core) and rounds the sum
   * of overlapping windows' gradients once more (measured: within 1 bf16
   * ulp, where the plain kernel is correctly rounded), so bf16 compares
   * one step, normwise, at bf16's tolerance; a layout mistake gives
   * errors of order 1. */
  int fp32 = prec == CT_PRECISION_FP32 && exact;
  double eo = fp32 ? test_max_rel_err_f32(a.s.out, b.s.out, a.s.n_out, 1e-3) : norm_rel_err(a.s.out, b.s.out, a.s.n_out);
  double eg = fp32 ? test_max_rel_err_f32(a.s.grads, b.s.grads, a.s.n_par, 1e-3)
                   : norm_rel_err(a.s.grads, b.s.grads, a.s.n_par);
  double ee = fp32 ? test_max_rel_err_f32(a.s.eval_out, b.s.eval_out, a.s.n_eval, 1e-3)
                   : norm_rel_err(a.s.eval_out, b.s.eval_out, a.s.n_eval);
  double tol = fp32 ? 1e-6 : prec == CT_PRECISION_FP32 ? 1e-5 : 1e-2;
  CHECK_MSG(eo <= tol, "%s: output differs blocked vs plain (rel %g)", name, eo);
  CHECK_MSG(eg <= tol, "%s: parameter gradients differ (rel %g)", name, eg);
  CHECK_MSG(ee <= tol, "%s: inference output after re-prepare differs (rel %g)", name, ee);
  double gsum = 0;
  for (size_t i = 0; i < a.s.n_par; i++) gsum += fabs(a.s.grads[i]);
  CHECK_MSG(gsum > 0, "%s: all-zero gradients, the comparison proves nothing", name);
  printf("%-12s %s: %d blocked activations, rel err out %.2g grads %.2g eval %.2g\n", name,
         prec == CT_PRECISION_FP32 ? "fp32" : "bf16", a.blocked, eo, eg, ee);
  free_run(&a), free_run(&b);
}

/* conv -> LeakyReLU (not folded) -> max pool (3x3, stride 2, padded:
 * oneDNN's kernel, not the 2x2 tiles) -> conv -> max pool -> dropout:
 * the standalone activation and the padded pool take the layout, the last
 * pool stays plain because dropout reads it, and the 8-channel conv is
 * never blocked. */
static const char *model_text =
    "input 3x20x20\n"
    "conv2d 3 16 3 padding=1\n"
    "leakyrelu 0.1\n"
    "maxpool2d 3 stride=2 padding=1\n"
    "conv2d 16 32 3\n"
    "relu\n"
    "maxpool2d 2\n"
    "conv2d 32 8 1\n"
    "dropout 0.2\n"
    "flatten\n"
    "linear 128 10\n";

int main(void) {
  ct_device *dev;
  CHECK_OK(ct_device_open("cpu", &dev));
  char path[] = "/tmp/ctrain_layout_XXXXXX.txt";
  int fd = mkstemps(path, 4);
  CHECK(fd >= 0);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (f) fputs(model_text, f), fclose(f);
  compare(dev, "cnn", 1, 28, 28, 6, CT_PRECISION_FP32, 2, 1); /* conv1, pool1 */
  compare(dev, "cnn", 1, 28, 28, 6, CT_PRECISION_BF16, 2, 1);
  compare(dev, "alexnet", 3, 64, 64, 2, CT_PRECISION_FP32, 8, 1);
  compare(dev, "alexnet", 3, 64, 64, 2, CT_PRECISION_BF16, 8, 1);
  /* Batch norm (f32) and residual adds take the layout; under bf16 the
   * policy runs batch norm in bf16, which reads plain tensors only. */
  compare(dev, "convnet", 1, 28, 28, 6, CT_PRECISION_FP32, 4, 0);
  compare(dev, "convnet", 1, 28, 28, 6, CT_PRECISION_BF16, 0, 0);
  compare(dev, "resnet18", 3, 64, 64, 4, CT_PRECISION_FP32, 40, 0);
  compare(dev, "resnet18", 3, 64, 64, 4, CT_PRECISION_BF16, 0, 0);
  compare(dev, path, 3, 20, 20, 4, CT_PRECISION_FP32, 4, 1);
  compare(dev, path, 3, 20, 20, 4, CT_PRECISION_BF16, 4, 1);
  remove(path);
  ct_device_close(dev);
  /* The reference device never blocks (its kernels read NCHW only). */
  CHECK_OK(ct_device_open("ref", &dev));
  run_out r;
  CHECK(run(dev, "cnn", 1, 28, 28, 4, CT_PRECISION_FP32, 1, 1, &r) == 0);
  CHECK_MSG(r.blocked == 0, "ref device: %d activations blocked", r.blocked);
  free_run(&r);
  ct_device_close(dev);
  return test_summary("layout");
}
