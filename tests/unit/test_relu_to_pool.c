/* A folded ReLU's gradient moved to the max pool that alone reads its
 * producer's output (src/plan/fuse.c, layers/pool2d.c): the training step
 * is the same to the last bit as with the ReLU's gradient applied by the
 * convolution or batch norm (ct_fuse_set_relu_to_pool(0)), in training
 * output, parameter gradients, running statistics and the evaluation
 * output after a re-prepare, over two steps with an update between them
 * (the harness of tests/step_harness.h), for lenet5, alexnet (convolution
 * ReLUs) and convnet, vgg11_bn, resnet50 (batch-norm ReLUs) in fp32, bf16
 * and fp16 (O1) on the cpu and ref devices, and with recompute; the plan
 * is smaller. The pools that take a ReLU over are the ones the rule
 * names: every max pool right after a convolution's or batch norm's ReLU
 * (lenet5 2, alexnet 3, convnet 2, vgg11_bn 5, resnet50 1: its stem),
 * none in cnn (no ReLU before its pools), and none whose output an add
 * reads (its gradient may be the add's shared one): resnet18's stem pool
 * feeds the first block's add, resnet9 keeps 1 of its 3, and a small
 * graph checks it too. */
#include <math.h>
#include <stdio.h>

#include "test_util.h"

#include "plan/fuse.h"
#include "step_harness.h"

/* conv -> ReLU -> max pool -> add(pool, conv1x1(pool)) -> linear: the pool's
 * output is an add's input. Input 3x8x8, 10 classes. */
static ct_status build_pool_add(ct_model **out) {
  ct_model *m;
  CT_TRY(ct_model_new("pool_add", &m));
  int c = ct_g_act(m, "relu", ct_g_conv2d(m, "c", -1, 3, 4, 3, 1, 1, 1, 1, 1), CT_ACT_RELU, 0.0f);
  int p = ct_g_maxpool2d(m, "pool", c, 2, 2, 0, 0);
  int s = ct_g_conv2d(m, "s", p, 4, 4, 1, 1, 0, 1, 1, 1);
  ct_g_linear(m, "fc", ct_g_flatten(m, "flat", ct_g_add(m, "add", p, s)), 4 * 4 * 4, 10, 1);
  ct_status st = ct_model_finish(m, 3, (const int64_t[]){3, 8, 8}, 5);
  if (st != CT_OK) ct_model_destroy(m), m = NULL;
  *out = m;
  return st;
}

static ct_model *make(ct_device *dev, const char *name, int c, int h, int w, int64_t N, ct_precision prec,
                      int recompute, int move) {
  ct_model_options opt = {c, h, w, 10, 5};
  ct_model *m = NULL;
  ct_fuse_set_relu_to_pool(move);
  ct_status s = !strcmp(name, "pool_add") ? build_pool_add(&m) : ct_model_create(name, &opt, &m);
  if (s == CT_OK && prec != CT_PRECISION_FP32) s = ct_model_set_precision(m, prec, CT_OPT_O1);
  if (s == CT_OK) s = ct_model_set_recompute(m, recompute);
  if (s == CT_OK) s = ct_model_prepare(m, dev, N, 1);
  ct_fuse_set_relu_to_pool(1);
  CHECK_MSG(s == CT_OK, "%s: %s", name, ct_last_error());
  if (s != CT_OK) ct_model_destroy(m), m = NULL;
  return m;
}

/* Max pools that took a ReLU over; 1 if the marks pair up (each such
 * pool reads a convolution or batch norm marked as having moved its
 * ReLU). */
static int moved_pools(const ct_model *m, int *paired) {
  int n = 0;
  *paired = 1;
  for (int i = 0; i < m->n_layers; i++) {
    const ct_layer *l = &m->layers[i];
    if (l->relu_moved != CT_RELU_MOVED_FROM_INPUT) continue;
    n++;
    const ct_layer *p = &m->layers[l->inputs[0]];
    *paired &= l->cls == &ct_layer_maxpool2d && (p->cls == &ct_layer_conv2d || p->cls == &ct_layer_batchnorm) &&
               p->relu_moved == CT_RELU_MOVED_TO_POOL;
  }
  return n;
}

static int same(const float *a, const float *b, size_t n) { return n == 0 || memcmp(a, b, n * sizeof(float)) == 0; }

static void compare(ct_device *dev, const char *name, int c, int h, int w, int64_t N, ct_precision prec, int recompute,
                    int want_moved) {
  const char *pn = ct_precision_name(prec);
  ct_model *a = make(dev, name, c, h, w, N, prec, recompute, 0), *b = make(dev, name, c, h, w, N, prec, recompute, 1);
  if (!a || !b) {
    ct_model_destroy(a), ct_model_destroy(b);
    return;
  }
  int pa, pb, na = moved_pools(a, &pa), nb = moved_pools(b, &pb);
  CHECK_MSG(na == 0, "%s: the move switched off, yet %d pools took a ReLU over", name, na);
  CHECK_MSG(nb == want_moved && pb, "%s on %s: %d max pools took a ReLU over (paired %d), expected %d", name,
            ct_device_name(dev), nb, pb, want_moved);
  size_t plan_a = ct_model_plan_bytes(a), plan_b = ct_model_plan_bytes(b);
  if (want_moved && !recompute)
    CHECK_MSG(plan_b < plan_a, "%s %s: plan %zu bytes with the move, %zu without", name, pn, plan_b, plan_a);
  step_result ra, rb;
  int ea = step_run(dev, a, c, h, w, N, 2, &ra), eb = step_run(dev, b, c, h, w, N, 2, &rb);
  CHECK_MSG(ea == 0 && eb == 0, "%s %s: %s", name, pn, ct_last_error());
  if (!ea && !eb) {
    CHECK_MSG(same(ra.out, rb.out, ra.n_out), "%s %s on %s: training output differs", name, pn, ct_device_name(dev));
    CHECK_MSG(same(ra.grads, rb.grads, ra.n_par), "%s %s on %s: parameter gradients differ", name, pn,
              ct_device_name(dev));
    CHECK_MSG(same(ra.bufs, rb.bufs, ra.n_buf), "%s %s: running statistics differ", name, pn);
    CHECK_MSG(same(ra.eval_out, rb.eval_out, ra.n_eval), "%s %s: evaluation output differs", name, pn);
    double gsum = 0;
    for (size_t i = 0; i < ra.n_par; i++) gsum += fabs(ra.grads[i]);
    CHECK_MSG(gsum > 0, "%s: all-zero gradients, the comparison proves nothing", name);
  }
  printf("%-8s %-4s %-5s recompute %-4s %d pools took a ReLU over, plan %8.1f -> %8.1f KiB\n", name,
         ct_device_name(dev), pn, recompute == CT_RECOMPUTE_AUTO    ? "auto"
         : recompute == CT_RECOMPUTE_CHEAP ? "cheap"
         : recompute                       ? "2"
                                           : "off", nb,
         plan_a / 1024.0, plan_b / 1024.0);
  step_result_free(&ra), step_result_free(&rb);
  ct_model_destroy(a), ct_model_destroy(b);
}

int main(void) {
  ct_device *cpu, *ref;
  CHECK_OK(ct_device_open("cpu", &cpu));
  CHECK_OK(ct_device_open("ref", &ref));
  const ct_precision precs[] = {CT_PRECISION_FP32, CT_PRECISION_BF16, CT_PRECISION_FP16};
  for (int p = 0; p < 3; p++) {
    compare(cpu, "lenet5", 1, 28, 28, 8, precs[p], 0, 2);
    compare(cpu, "cnn", 1, 28, 28, 8, precs[p], 0, 0); /* torchkeras' cnn: no ReLU before its pools */
    compare(cpu, "alexnet", 3, 64, 64, 2, precs[p], 0, 3);
    compare(ref, "lenet5", 1, 28, 28, 4, precs[p], 0, 2);
  }
  compare(ref, "alexnet", 3, 64, 64, 2, CT_PRECISION_BF16, 0, 3);
  compare(cpu, "alexnet", 3, 64, 64, 2, CT_PRECISION_BF16, 2, 3);
  compare(cpu, "alexnet", 3, 64, 64, 2, CT_PRECISION_FP32, CT_RECOMPUTE_AUTO, 3);
  for (int p = 0; p < 3; p++) {
    compare(cpu, "convnet", 1, 28, 28, 8, precs[p], 0, 2);
    compare(ref, "convnet", 1, 28, 28, 4, precs[p], 0, 2);
  }
  compare(cpu, "vgg11_bn", 3, 32, 32, 2, CT_PRECISION_BF16, 0, 5);
  compare(cpu, "resnet50", 3, 32, 32, 2, CT_PRECISION_FP32, 0, 1);
  compare(cpu, "resnet50", 3, 32, 32, 2, CT_PRECISION_BF16, CT_RECOMPUTE_CHEAP, 1);
  compare(cpu, "convnet", 1, 28, 28, 8, CT_PRECISION_BF16, CT_RECOMPUTE_AUTO, 2);
  compare(cpu, "resnet9", 3, 32, 32, 4, CT_PRECISION_FP32, 0, 1);
  compare(cpu, "resnet18", 3, 32, 32, 4, CT_PRECISION_FP32, 0, 0);
  compare(cpu, "pool_add", 3, 8, 8, 4, CT_PRECISION_FP32, 0, 0);
  ct_device_close(ref);
  ct_device_close(cpu);
  return test_summary("relu_to_pool");
}
