/* Activation layouts (src/plan/layout.h) on the cpu device: with the
 * memory format `auto` (channel-blocked: CT_LAYOUT_C16 with AVX-512, C8
 * below it; the _avx2 run caps oneDNN at AVX2) and `channels-last`
 * (CT_LAYOUT_NHWC), a training step (two steps with an update between
 * them), the parameter gradients and a re-prepared inference pass give the
 * same numbers as with every activation plain NCHW (`contiguous`); the
 * layout really is chosen where the rules allow (and only there: never
 * for the model output, dropout or flatten inputs, or, for C16 / C8,
 * channel counts that are not multiples of 16 / 8), in fp32 (to the last bit over two
 * steps where no batch norm takes the layout) and bf16 (one step, within
 * bf16 rounding, or, where rounding is amplified, as close to fp32 as the
 * plain bf16 step: compare() says why). The NHWC runs drive the executor's
 * channels-last paths that the cuda device takes by default. On a CPU
 * without AVX-512, without oneDNN's bf16 there, bf16 activations stay
 * plain in both formats (reachable()); the runs are still compared. */
#include <stdio.h>

#include "test_util.h"

#include "plan/layout.h"
#include "nn/model_impl.h"
#include "step_harness.h"

typedef struct run_out {
  step_result s;
  int blocked;     /* layers whose output is not plain */
  int bad_blocked; /* a layout where the rules forbid it */
} run_out;

/* A C16, C8 or NHWC output that breaks the rules of layout.h. */
static int forbidden(const ct_model *m, int i, ct_layout lay) {
  const ct_layer *l = &m->layers[i];
  if (i == m->output || l->out_ndim != 3 || (lay == CT_LAYOUT_C16 && l->out_shape[0] % 16) ||
      (lay == CT_LAYOUT_C8 && l->out_shape[0] % 8))
    return 1;
  for (int k = 0; k < m->n_layers; k++)
    for (int j = 0; j < m->layers[k].n_inputs; j++)
      if (m->layers[k].inputs[j] == i && (m->layers[k].cls == &ct_layer_dropout ||
                                          m->layers[k].cls == &ct_layer_dropout2d ||
                                          m->layers[k].cls == &ct_layer_flatten))
        return 1;
  return 0;
}

static int run(ct_device *dev, const char *name, int c, int h, int w, int64_t N, ct_precision prec,
               ct_memory_format fmt, int steps, run_out *r) {
  memset(r, 0, sizeof *r);
  ct_model_options opt = {c, h, w, 10, 5};
  ct_model *m = NULL;
  int rc = -1;
  if (ct_model_create(name, &opt, &m) != CT_OK) goto done;
  /* No dropout: its masks are the same either way, but zeros hide errors. */
  for (int i = 0; i < m->n_layers; i++)
    if (m->layers[i].cls == &ct_layer_dropout || m->layers[i].cls == &ct_layer_dropout2d) m->layers[i].fp[0] = 0.0f;
  if (prec != CT_PRECISION_FP32 && ct_model_set_precision(m, prec, CT_OPT_O1) != CT_OK) goto done;
  if (ct_model_set_memory_format(m, fmt) != CT_OK || ct_model_prepare(m, dev, N, 1) != CT_OK) goto done;
  for (int i = 0; i < m->n_layers; i++) {
    ct_layout lay = m->layers[i].y.layout;
    if (lay == CT_LAYOUT_PLAIN) continue;
    r->blocked++;
    r->bad_blocked += forbidden(m, i, lay);
    CHECK_MSG(fmt != CT_MEMORY_FORMAT_CHANNELS_LAST || lay == CT_LAYOUT_NHWC, "%s: layer %d has layout %d under channels-last",
              name, i, (int)lay);
    CHECK_MSG(m->layers[i].dy.layout == lay, "%s: layer %d's gradient is not laid out like its output", name, i);
  }
  rc = step_run(dev, m, c, h, w, N, steps, &r->s);
done:
  ct_model_destroy(m);
  return rc;
}

/* ||a - b|| / ||b|| over n values. */
static double norm_rel_err(const float *a, const float *b, size_t n) {
  double d = 0, r = 0;
  for (size_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
  return r > 0 ? sqrt(d / r) : sqrt(d);
}

static void free_run(run_out *r) { step_result_free(&r->s); }

/* The three results (output, parameter gradients, re-prepared inference
 * output) of run a against those of run b: the worst of the three errors,
 * elementwise-relative (exact) or normwise. */
static void errors(const run_out *a, const run_out *b, int exact, double e[3]) {
  e[0] = exact ? test_max_rel_err_f32(a->s.out, b->s.out, a->s.n_out, 1e-3) : norm_rel_err(a->s.out, b->s.out, a->s.n_out);
  e[1] = exact ? test_max_rel_err_f32(a->s.grads, b->s.grads, a->s.n_par, 1e-3)
               : norm_rel_err(a->s.grads, b->s.grads, a->s.n_par);
  e[2] = exact ? test_max_rel_err_f32(a->s.eval_out, b->s.eval_out, a->s.n_eval, 1e-3)
               : norm_rel_err(a->s.eval_out, b->s.eval_out, a->s.n_eval);
}

static const char *const what[3] = {"output", "parameter gradients", "inference output after re-prepare"};

/* How closely a laid-out run must agree with the plain one.
 * - BITWISE: no batch norm and no overlapping max pool takes the layout,
 *   so fp32 must agree to the last bit over two steps with an update
 *   between them. bf16 compares normwise at bf16's tolerance.
 *   Overlapping max pools (AlexNet's 3x3/2, the text model's padded one)
 *   sum the gradients of an input under several windows: ctrain's plain
 *   loops in double, rounded once (as the reference), oneDNN's blocked
 *   kernel in float, so those models compare NORMWISE (measured on AVX2
 *   with C8: 2.8e-6 on AlexNet's output, 4.5e-6 on its gradients).
 * - NORMWISE: batch norm takes the layout and sums in another order (in
 *   double there, in float partials on plain tensors); one step, normwise,
 *   fp32 within 1e-5 (a 2% error in one term of the C16 batch-norm
 *   backward gives 3e-4 in convnet), bf16 within 1e-2.
 * - AMPLIFIED (ResNet-18, ResNet-9): that rounding does not stay rounding. A
 *   gradient goes through discrete choices (a max-pool window's maximum
 *   between values one ulp apart, a ReLU's input at zero) that rounding
 *   flips, and a randomly initialised batch-normed network amplifies a
 *   perturbation on its way back. fp32 gradients then differ by up to 5e-3
 *   normwise (2e-6 when nothing flips), bf16's by up to 0.3, when the bf16
 *   gradients themselves are 0.38 from fp32's; which a build gets depends
 *   on the compiler's FMA contraction, the batch and the image size (all
 *   measured). So fp32 outputs still compare at 1e-5 but gradients at
 *   2e-2, and bf16 must be about as close to the plain fp32 run as the
 *   plain bf16 run is (within 2x + 1e-2: ResNet-9's 40 bf16 logits were
 *   measured 1.44x as far laid out, at 0.95% against 0.66%). A layout
 *   mistake (a permuted channel, a wrong stride) gives errors of order 1;
 *   the subtle ones are NORMWISE's to catch. */
typedef enum { BITWISE, NORMWISE, AMPLIFIED } agreement;

/* min_blocked as the backend can meet it: 0 where it keeps the
 * activations of this format and precision plain (the 16-bit activations
 * of a backend that lays out f32 only, as the cpu one without oneDNN's
 * bf16, where only f32 batch-norm outputs may take the layout). *none is set
 * when nothing may be laid out at all. */
static int reachable(ct_device *dev, ct_memory_format fmt, ct_precision prec, int min_blocked, int *none) {
  const ct_backend *be = ct_device_backend(dev);
  ct_layout want = fmt == CT_MEMORY_FORMAT_CHANNELS_LAST ? CT_LAYOUT_NHWC : be->act_layout;
  ct_dtype dt = prec == CT_PRECISION_BF16 ? CT_BF16 : prec == CT_PRECISION_FP16 ? CT_F16 : CT_F32;
  *none = want == CT_LAYOUT_PLAIN;
  return *none || !(be->act_layout_dtypes >> dt & 1u) ? 0 : min_blocked;
}

static void compare(ct_device *dev, const char *name, int c, int h, int w, int64_t N, ct_precision prec,
                    ct_memory_format fmt, int min_blocked, agreement agree) {
  run_out a, b, ref;
  int none;
  min_blocked = reachable(dev, fmt, prec, min_blocked, &none);
  int fp32 = prec == CT_PRECISION_FP32, bitwise = fp32 && agree == BITWISE, vs_fp32 = !fp32 && agree == AMPLIFIED;
  int steps = bitwise ? 2 : 1;
  int ra = run(dev, name, c, h, w, N, prec, fmt, steps, &a);
  int rb = run(dev, name, c, h, w, N, prec, CT_MEMORY_FORMAT_CONTIGUOUS, steps, &b);
  int rr = vs_fp32 ? run(dev, name, c, h, w, N, CT_PRECISION_FP32, CT_MEMORY_FORMAT_CONTIGUOUS, steps, &ref) : 0;
  CHECK_MSG(ra == 0 && rb == 0 && rr == 0, "%s: %s", name, ct_last_error());
  if (ra || rb || rr) return;
  const char *fn = ct_memory_format_name(fmt);
  CHECK_MSG(a.blocked >= min_blocked, "%s %s: %d laid-out activations, expected at least %d", name, fn, a.blocked,
            min_blocked);
  CHECK_MSG(!none || a.blocked == 0, "%s %s: %d activations laid out where the backend keeps them plain", name, fn,
            a.blocked);
  CHECK_MSG(a.bad_blocked == 0, "%s %s: %d activations laid out against the rules", name, fn, a.bad_blocked);
  CHECK_MSG(b.blocked == 0, "%s: contiguous but %d activations not plain", name, b.blocked);
  double e[3];
  errors(&a, &b, bitwise, e);
  if (vs_fp32) {
    double ea[3], eb[3];
    errors(&a, &ref, 0, ea);
    errors(&b, &ref, 0, eb);
    for (int k = 0; k < 3; k++)
      CHECK_MSG(ea[k] <= 2 * eb[k] + 1e-2, "%s %s bf16: %s %g from fp32's, contiguous's %g", name, fn, what[k],
                ea[k], eb[k]);
    printf("%-12s %-13s bf16 vs fp32: rel err out %.2g/%.2g grads %.2g/%.2g eval %.2g/%.2g (laid out/contiguous)\n",
           name, fn, ea[0], eb[0], ea[1], eb[1], ea[2], eb[2]);
    free_run(&ref);
  } else {
    double tol = bitwise ? 1e-6 : fp32 ? 1e-5 : 1e-2;
    double tol_g = fp32 && agree == AMPLIFIED ? 2e-2 : tol;
    for (int k = 0; k < 3; k++)
      CHECK_MSG(e[k] <= (k == 1 ? tol_g : tol), "%s %s: %s differs from contiguous (rel %g)", name, fn, what[k], e[k]);
  }
  double gsum = 0;
  for (size_t i = 0; i < a.s.n_par; i++) gsum += fabs(a.s.grads[i]);
  CHECK_MSG(gsum > 0, "%s: all-zero gradients, the comparison proves nothing", name);
  printf("%-12s %-13s %s: %2d laid-out activations, rel err out %.2g grads %.2g eval %.2g\n", name, fn,
         fp32 ? "fp32" : "bf16", a.blocked, e[0], e[1], e[2]);
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

/* Average pools (2x2, and 3x3 stride 2 padded, which counts the padding)
 * between convolutions and a batch norm: oneDNN's average pooling on
 * blocked and NHWC tensors, forward and backward. */
static const char *avg_model_text =
    "input 3x20x20\n"
    "conv2d 3 16 3 padding=1\n"
    "relu\n"
    "avgpool2d 2\n"
    "conv2d 16 32 3 padding=1\n"
    "batchnorm2d 32\n"
    "relu\n"
    "avgpool2d 3 stride=2 padding=1\n"
    "conv2d 32 8 1\n"
    "flatten\n"
    "linear 200 10\n";

/* A global max pool reading the last convolution laid out (and its
 * indices driving the backward); no batch norm, so fp32 is exact. */
static const char *global_model_text =
    "input 3x12x12\n"
    "conv2d 3 16 3 padding=1\n"
    "relu\n"
    "conv2d 16 32 3 stride=2\n"
    "leakyrelu 0.1\n"
    "adaptivemaxpool2d 1\n"
    "flatten\n"
    "linear 32 10\n";

int main(void) {
#if !CTRAIN_HAVE_DNNL
  fprintf(stderr, "built without oneDNN: the cpu device keeps activations NCHW: skipping\n");
  return 77;
#endif
  ct_device *dev;
  CHECK_OK(ct_device_open("cpu", &dev));
  char path[] = "/tmp/ctrain_layout_XXXXXX.txt";
  test_write_temp(path, 4, model_text);
  char apath[] = "/tmp/ctrain_layout_avg_XXXXXX.txt";
  test_write_temp(apath, 4, avg_model_text);
  char gpath[] = "/tmp/ctrain_layout_global_XXXXXX.txt";
  test_write_temp(gpath, 4, global_model_text);
  /* Each case runs for `auto` (C16 or C8) and `channels-last` (NHWC). Batch
   * norms (f32 and bf16) and residual adds take either layout. */
  for (int k = 0; k < 2; k++) {
    ct_memory_format f = k ? CT_MEMORY_FORMAT_CHANNELS_LAST : CT_MEMORY_FORMAT_AUTO;
    compare(dev, "cnn", 1, 28, 28, 6, CT_PRECISION_FP32, f, 2, BITWISE); /* conv1, pool1 */
    compare(dev, "cnn", 1, 28, 28, 6, CT_PRECISION_BF16, f, 2, BITWISE);
    /* AlexNet: overlapping max pools (see BITWISE); in NHWC oneDNN's
     * kernels for nhwc memory also round differently (measured 1.9e-6
     * normwise on the output). */
    compare(dev, "alexnet", 3, 64, 64, 2, CT_PRECISION_FP32, f, 8, NORMWISE);
    compare(dev, "alexnet", 3, 64, 64, 2, CT_PRECISION_BF16, f, 8, NORMWISE);
    compare(dev, "convnet", 1, 28, 28, 6, CT_PRECISION_FP32, f, 4, NORMWISE);
    compare(dev, "convnet", 1, 28, 28, 6, CT_PRECISION_BF16, f, 4, NORMWISE);
    /* The last stage too (48 and up): the global average pool reads it
     * laid out. */
    compare(dev, "resnet18", 3, 64, 64, 4, CT_PRECISION_FP32, f, 48, AMPLIFIED);
    compare(dev, "resnet18", 3, 64, 64, 4, CT_PRECISION_BF16, f, 48, AMPLIFIED);
    /* The fast CIFAR network: residual adds, max pools and the global max
     * pool, laid out; its batch norms amplify rounding as ResNet-18's do
     * (fp32 gradients 2.8e-3 apart at batch 4, measured). */
    compare(dev, "resnet9", 3, 32, 32, 4, CT_PRECISION_FP32, f, 21, AMPLIFIED);
    compare(dev, "resnet9", 3, 32, 32, 4, CT_PRECISION_BF16, f, 21, AMPLIFIED);
    compare(dev, path, 3, 20, 20, 4, CT_PRECISION_FP32, f, 6, NORMWISE);
    compare(dev, path, 3, 20, 20, 4, CT_PRECISION_BF16, f, 6, NORMWISE);
    compare(dev, apath, 3, 20, 20, 4, CT_PRECISION_FP32, f, 7, NORMWISE);
    compare(dev, apath, 3, 20, 20, 4, CT_PRECISION_BF16, f, 7, NORMWISE);
    compare(dev, gpath, 3, 12, 12, 4, CT_PRECISION_FP32, f, 3, BITWISE);
    compare(dev, gpath, 3, 12, 12, 4, CT_PRECISION_BF16, f, 3, BITWISE);
  }
  remove(gpath);
  remove(apath);
  remove(path);
  ct_device_close(dev);
  /* The reference device never lays out (its kernels read NCHW only). */
  CHECK_OK(ct_device_open("ref", &dev));
  run_out r;
  CHECK(run(dev, "cnn", 1, 28, 28, 4, CT_PRECISION_FP32, CT_MEMORY_FORMAT_AUTO, 1, &r) == 0);
  CHECK_MSG(r.blocked == 0, "ref device: %d activations blocked", r.blocked);
  free_run(&r);
  ct_device_close(dev);
  return test_summary("layout");
}
