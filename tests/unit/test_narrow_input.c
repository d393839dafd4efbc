/* The narrowed model input (ct_model_narrow_input, src/plan/exec_plan.c):
 * a model whose input every reader casts into one 16-bit dtype takes the
 * input in that dtype, and the step is the same to the last bit as the
 * model fed f32 and casting it itself: training output, parameter
 * gradients, running statistics and the evaluation output after a
 * re-prepare, over two steps with an update between them (the harness of
 * tests/step_harness.h, which rounds the same x for the narrowed model),
 * for cnn, alexnet and resnet18 in bf16 and fp16 (O1), and with
 * activation recompute (the first convolution's rerun reads the input
 * itself). The plan is smaller by at least the cast copy the backward of
 * the first layer kept (no larger with recompute, where that copy may be
 * rerun instead of kept, and the peak lie where it is not alive: with
 * the weight copies planned, at a linear layer's backward in alexnet). The narrowed model refuses an f32 input with a
 * message naming the dtype it takes; it stays f32 when the request cannot
 * apply: fp32 precision, and mlp, whose flatten reads the input uncast. */
#include <math.h>
#include <stdio.h>

#include "test_util.h"

#include "step_harness.h"

static ct_model *make(const char *name, int c, int h, int w, ct_precision prec, int narrow, int recompute) {
  ct_model_options opt = {c, h, w, 10, 5};
  ct_model *m = NULL;
  CHECK_OK(ct_model_create(name, &opt, &m));
  if (!m) return NULL;
  if (prec != CT_PRECISION_FP32) CHECK_OK(ct_model_set_precision(m, prec, CT_OPT_O1));
  CHECK_OK(ct_model_set_recompute(m, recompute));
  ct_model_narrow_input(m, narrow);
  return m;
}

static int same(const float *a, const float *b, size_t n) { return n == 0 || memcmp(a, b, n * sizeof(float)) == 0; }

static void compare(ct_device *dev, const char *name, int c, int h, int w, int64_t N, ct_precision prec,
                    int recompute) {
  const char *pn = ct_precision_name(prec);
  ct_model *a = make(name, c, h, w, prec, 0, recompute), *b = make(name, c, h, w, prec, 1, recompute);
  if (!a || !b) return;
  CHECK_OK(ct_model_prepare(a, dev, N, 1));
  CHECK_OK(ct_model_prepare(b, dev, N, 1));
  ct_layout la, lb;
  ct_dtype da = ct_model_input_dtype(a, &la), db = ct_model_input_dtype(b, &lb);
  CHECK_MSG(da == CT_F32 && la == CT_LAYOUT_PLAIN, "%s %s: the model not narrowed takes %s", name, pn,
            ct_dtype_name(da));
  CHECK_MSG(db == ct_precision_dtype(prec) && lb == CT_LAYOUT_PLAIN, "%s %s: narrowed input is %s layout %d", name, pn,
            ct_dtype_name(db), (int)lb);
  size_t pa = ct_model_plan_bytes(a), pb = ct_model_plan_bytes(b), cast = (size_t)(N * c * h * w) * 2;
  /* Without recompute the cast copy lives the whole step, so through the
   * peak; with it, the copy may be rerun and the peak lie elsewhere. */
  if (!recompute)
    CHECK_MSG(pb + cast <= pa, "%s %s: plan %zu bytes narrowed, %zu not (the cast copy is %zu)", name, pn, pb, pa, cast);
  else
    CHECK_MSG(pb <= pa, "%s %s recompute: plan %zu bytes narrowed, above the %zu not narrowed", name, pn, pb, pa);

  /* An f32 batch is refused, naming what the model takes. */
  float *x = calloc((size_t)(N * c * h * w), sizeof(float));
  ct_tensor xt = ct_tensor_4d(x, CT_F32, N, c, h, w);
  const ct_tensor *out;
  CHECK(ct_model_forward(b, &xt, 1, 0, &out) == CT_ERR_INVALID_ARG);
  CHECK_MSG(strstr(ct_last_error(), "input must be") && strstr(ct_last_error(), ct_dtype_name(db)),
            "%s: message %s", name, ct_last_error());
  free(x);

  step_result ra, rb;
  int ea = step_run(dev, a, c, h, w, N, 2, &ra), eb = step_run(dev, b, c, h, w, N, 2, &rb);
  CHECK_MSG(ea == 0 && eb == 0, "%s %s: %s", name, pn, ct_last_error());
  if (!ea && !eb) {
    CHECK_MSG(same(ra.out, rb.out, ra.n_out), "%s %s: training output differs", name, pn);
    CHECK_MSG(same(ra.grads, rb.grads, ra.n_par), "%s %s: parameter gradients differ", name, pn);
    CHECK_MSG(same(ra.bufs, rb.bufs, ra.n_buf), "%s %s: running statistics differ", name, pn);
    CHECK_MSG(same(ra.eval_out, rb.eval_out, ra.n_eval), "%s %s: evaluation output differs", name, pn);
    double gsum = 0;
    for (size_t i = 0; i < ra.n_par; i++) gsum += fabs(ra.grads[i]);
    CHECK_MSG(gsum > 0, "%s: all-zero gradients, the comparison proves nothing", name);
  }
  printf("%-9s %-5s recompute %-4s plan %9.1f KiB -> %9.1f KiB narrowed (cast copy %.1f KiB)\n", name, pn,
         recompute == CT_RECOMPUTE_AUTO ? "auto" : recompute ? "2" : "off", pa / 1024.0, pb / 1024.0, cast / 1024.0);
  step_result_free(&ra), step_result_free(&rb);
  ct_model_destroy(a), ct_model_destroy(b);
}

/* Requests that cannot apply leave the input f32. */
static void stays_f32(ct_device *dev, const char *name, int c, int h, int w, ct_precision prec) {
  ct_model *m = make(name, c, h, w, prec, 1, 0);
  if (!m) return;
  CHECK_OK(ct_model_prepare(m, dev, 4, 1));
  ct_layout lay;
  CHECK_MSG(ct_model_input_dtype(m, &lay) == CT_F32 && lay == CT_LAYOUT_PLAIN, "%s %s: input narrowed", name,
            ct_precision_name(prec));
  ct_model_destroy(m);
}

int main(void) {
  ct_device *dev;
  CHECK_OK(ct_device_open("cpu", &dev));
  const ct_precision low[] = {CT_PRECISION_BF16, CT_PRECISION_FP16};
  for (int p = 0; p < 2; p++) {
    compare(dev, "cnn", 1, 28, 28, 8, low[p], 0);
    compare(dev, "alexnet", 3, 64, 64, 2, low[p], 0);
    compare(dev, "resnet18", 3, 32, 32, 4, low[p], 0);
  }
  compare(dev, "resnet18", 3, 32, 32, 4, CT_PRECISION_BF16, CT_RECOMPUTE_AUTO);
  compare(dev, "alexnet", 3, 64, 64, 2, CT_PRECISION_FP16, 2);
  stays_f32(dev, "cnn", 1, 28, 28, CT_PRECISION_FP32);
  stays_f32(dev, "mlp", 1, 28, 28, CT_PRECISION_BF16);
  ct_device_close(dev);
  return test_summary("narrow_input");
}
