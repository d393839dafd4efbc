/* Activation recompute (src/plan/recompute.h): a training step that drops
 * activations after the forward and recomputes them before the backward
 * gives the plain step's output, parameter gradients, running statistics,
 * num_batches_tracked and (after re-preparing for inference) evaluation
 * output to the last bit, over two steps with an update between them, for
 * sequential and residual zoo models, a model file with average pooling,
 * batch norm and dropout (dropout kept on: its masks must come out the
 * same when regenerated), in fp32, bf16 and fp16, with automatic, 2 and
 * as many segments as there are clean cuts, in the cheap mode (batch
 * norm, activation, add and dropout outputs only), in the norm mode
 * (batch norm outputs only, rebuilt from the saved statistics) and in the
 * selective mode (those and the cheapest convolutions' outputs); and the
 * plan it runs
 * in is smaller. Also: the segments fall on clean cuts only, the timeline puts
 * every recompute before the backwards that need it, and the setter
 * refuses nonsense. */
#include <stdio.h>

#include "test_util.h"

#include "nn/model_impl.h"
#include "plan/exec_plan.h"
#include "step_harness.h"

typedef struct rc_run {
  step_result s;
  int64_t *counters;
  size_t n_counters;
  size_t peak;
  int segments, reruns;
} rc_run;

static void rc_free(rc_run *r) {
  step_result_free(&r->s);
  free(r->counters);
}

/* Every recompute runs after the forward, before the backward it is due
 * at (and so before that of every later-timed reader), and after the
 * recomputes of dropped layers it reads; in segment mode, a segment's
 * recomputes precede all its backwards, segment ends are clean cuts and
 * are kept, and the last segment drops nothing. */
static void check_timeline(const ct_model *m, const char *name) {
  const ct_timeline *tl = &m->eb->tl;
  int L = m->n_layers, n = 0;
  for (int i = 0; i < L; i++) {
    if (!tl->rerun[i]) {
      CHECK_MSG(tl->rc[i] == -1, "%s: layer %d kept but has a recompute time", name, i);
      continue;
    }
    n++;
    CHECK_MSG(tl->rc[i] >= L && tl->rc_at[i] >= i && tl->rc[i] < tl->bwd[tl->rc_at[i]],
              "%s: layer %d recomputed at %d, due before layer %d's backward at %d", name, i, tl->rc[i], tl->rc_at[i],
              tl->bwd[tl->rc_at[i]]);
    for (int j = 0; j < m->layers[i].n_inputs; j++) {
      int p = m->layers[i].inputs[j];
      if (p >= 0 && tl->rerun[p])
        CHECK_MSG(tl->rc[p] < tl->rc[i], "%s: layer %d recomputed before its input %d", name, i, p);
    }
    if (tl->nseg > 1) {
      for (int k = 0; k < L; k++)
        if (tl->seg[k] == tl->seg[i])
          CHECK_MSG(tl->rc[i] < tl->bwd[k], "%s: layer %d recomputed after layer %d's backward", name, i, k);
      CHECK_MSG(tl->seg[i] < tl->nseg - 1, "%s: layer %d of the last segment dropped", name, i);
    }
  }
  CHECK_MSG(n == tl->n_rerun, "%s: %d layers rerun, the timeline counts %d", name, n, tl->n_rerun);
  int seen_end = 0;
  int *cut = calloc((size_t)L, sizeof(int));
  if (!cut) return;
  ct_recompute_cuts(m, m->eb->root, cut);
  for (int i = 0; i < L - 1; i++)
    if (ct_timeline_seg_end(tl, i)) {
      seen_end++;
      CHECK_MSG(!tl->rerun[m->eb->root[i]], "%s: segment end %d dropped", name, i);
      CHECK_MSG(cut[i], "%s: segment ends at %d, not a clean cut", name, i);
    }
  CHECK_MSG(seen_end == tl->nseg - 1, "%s: %d segment ends for %d segments", name, seen_end, tl->nseg);
  free(cut);
}

static int run(ct_device *dev, const char *name, int c, int h, int w, int64_t N, ct_precision prec, int segments,
               rc_run *r) {
  memset(r, 0, sizeof *r);
  ct_model_options opt = {c, h, w, 10, 5};
  ct_model *m = NULL;
  int rc = -1;
  if (ct_model_create(name, &opt, &m) != CT_OK) goto done;
  if (prec != CT_PRECISION_FP32 && ct_model_set_precision(m, prec, CT_OPT_O1) != CT_OK) goto done;
  if (ct_model_set_recompute(m, segments) != CT_OK || ct_model_prepare(m, dev, N, 1) != CT_OK) goto done;
  r->peak = ct_model_plan_bytes(m);
  r->segments = ct_model_recompute_segments(m);
  r->reruns = ct_model_recompute_layers(m);
  check_timeline(m, name);
  if (step_run(dev, m, c, h, w, N, 2, &r->s) != 0) goto done;
  CHECK_MSG(ct_model_recompute_segments(m) == 1, "%s: an inference plan recomputes", name);
  r->n_counters = m->n_counters;
  r->counters = malloc(sizeof(int64_t) * (m->n_counters ? m->n_counters : 1));
  if (r->counters && m->n_counters) memcpy(r->counters, m->counters, sizeof(int64_t) * m->n_counters);
  rc = 0;
done:
  ct_model_destroy(m);
  return rc;
}

static int same(const float *a, const float *b, size_t n) { return n == 0 || memcmp(a, b, n * sizeof(float)) == 0; }

/* Runs the plain step and the step with `segments`; min_reruns: the
 * recompute must drop at least this many layers' outputs. */
static void compare(ct_device *dev, const char *name, int c, int h, int w, int64_t N, ct_precision prec, int segments,
                    int min_reruns) {
  rc_run a, b;
  int ra = run(dev, name, c, h, w, N, prec, 0, &a);
  int rb = run(dev, name, c, h, w, N, prec, segments, &b);
  CHECK_MSG(ra == 0 && rb == 0, "%s: %s", name, ct_last_error());
  if (ra || rb) return;
  const char *pn = ct_precision_name(prec);
  CHECK_MSG(a.segments == 1 && a.reruns == 0, "%s: recompute off but %d segments", name, a.segments);
  CHECK_MSG(b.reruns >= min_reruns, "%s %s segments=%d: %d layers recomputed, expected at least %d", name, pn, segments,
            b.reruns, min_reruns);
  if (segments > 1) CHECK_MSG(b.segments <= segments, "%s: %d segments, asked for %d", name, b.segments, segments);
  CHECK_MSG(same(b.s.out, a.s.out, a.s.n_out), "%s %s segments=%d: training output differs", name, pn, segments);
  CHECK_MSG(same(b.s.grads, a.s.grads, a.s.n_par), "%s %s segments=%d: parameter gradients differ", name, pn, segments);
  CHECK_MSG(same(b.s.bufs, a.s.bufs, a.s.n_buf), "%s %s segments=%d: running statistics differ", name, pn, segments);
  CHECK_MSG(same(b.s.eval_out, a.s.eval_out, a.s.n_eval), "%s %s segments=%d: evaluation output differs", name, pn,
            segments);
  CHECK_MSG(a.n_counters == b.n_counters &&
                (!a.n_counters || memcmp(a.counters, b.counters, a.n_counters * sizeof(int64_t)) == 0),
            "%s %s: num_batches_tracked differs (counted a recompute?)", name, pn);
  double gsum = 0;
  for (size_t i = 0; i < a.s.n_par; i++) gsum += fabs(a.s.grads[i]);
  CHECK_MSG(gsum > 0, "%s: all-zero gradients, the comparison proves nothing", name);
  if (segments == CT_RECOMPUTE_AUTO) CHECK_MSG(b.peak <= a.peak, "%s: auto recompute grew the plan", name);
  if (segments < 0 && min_reruns)
    CHECK_MSG(b.peak < a.peak, "%s: recompute saved nothing (%zu bytes)", name, b.peak);
  printf("%-12s %-5s segments %-4s -> %2d, %3d layers recomputed, arena %8.1f KiB -> %8.1f KiB (%.2fx)\n", name, pn,
         segments == CT_RECOMPUTE_AUTO    ? "auto"
         : segments == CT_RECOMPUTE_CHEAP ? "cheap"
         : segments == CT_RECOMPUTE_NORM  ? "norm"
         : segments == CT_RECOMPUTE_SELECTIVE ? "sel"
         : segments == CT_RECOMPUTE_MAX   ? "max"
                                          : "n",
         b.segments, b.reruns, a.peak / 1024.0, b.peak / 1024.0, (double)b.peak / (double)a.peak);
  rc_free(&a), rc_free(&b);
}

/* Average pools, batch norm, a residual-free chain and dropout in the middle. */
static const char *model_text =
    "input 3x20x20\n"
    "conv2d 3 16 3 padding=1\n"
    "batchnorm2d 16\n"
    "relu\n"
    "avgpool2d 2\n"
    "conv2d 16 32 3 padding=1\n"
    "relu\n"
    "dropout 0.3\n"
    "conv2d 32 32 3 padding=1\n"
    "batchnorm2d 32\n"
    "relu\n"
    "avgpool2d 3 stride=2 padding=1\n"
    "conv2d 32 8 1\n"
    "flatten\n"
    "linear 200 10\n";

/* The auto count is the plan's best where that saves 1/16 (these models:
 * 30% and more): no count the cuts allow does better. */
static void check_auto_is_best(ct_device *dev, const char *name, int c, int h, int w, int64_t N) {
  rc_run best;
  if (run(dev, name, c, h, w, N, CT_PRECISION_FP32, CT_RECOMPUTE_AUTO, &best) != 0) {
    CHECK_MSG(0, "%s: %s", name, ct_last_error());
    return;
  }
  ct_model_options opt = {c, h, w, 10, 5};
  ct_model *m = NULL;
  CHECK_OK(ct_model_create(name, &opt, &m));
  for (int k = CT_RECOMPUTE_SELECTIVE; m && k <= 40; k++) {
    if (k >= CT_RECOMPUTE_AUTO && k <= 1) continue;
    CHECK_OK(ct_model_set_recompute(m, k));
    CHECK_OK(ct_model_prepare(m, dev, N, 1));
    CHECK_MSG(ct_model_plan_bytes(m) >= best.peak, "%s: mode %d gives %zu bytes, auto %zu", name, k,
              ct_model_plan_bytes(m), best.peak);
  }
  ct_model_destroy(m);
  rc_free(&best);
}

/* auto keeps the plain step where the best plan saves under 1/16 of it:
 * AlexNet-227, whose max pools took its ReLU gradients over, has about 1%
 * to gain (3 segments, 4 layers rerun). */
static void check_auto_declines(ct_device *dev) {
  ct_model_options opt = {3, 227, 227, 10, 5};
  ct_model *m = NULL;
  CHECK_OK(ct_model_create("alexnet", &opt, &m));
  if (!m) return;
  CHECK_OK(ct_model_prepare(m, dev, 1, 1));
  size_t plain = ct_model_plan_bytes(m), best = plain;
  for (int k = CT_RECOMPUTE_SELECTIVE; k <= 40; k++) {
    if (k >= CT_RECOMPUTE_AUTO && k <= 1) continue;
    CHECK_OK(ct_model_set_recompute(m, k));
    CHECK_OK(ct_model_prepare(m, dev, 1, 1));
    if (ct_model_plan_bytes(m) < best) best = ct_model_plan_bytes(m);
  }
  CHECK_MSG(best < plain && best > plain - plain / 16, "alexnet-227: best plan %zu bytes, plain %zu: not a small gain",
            best, plain);
  CHECK_OK(ct_model_set_recompute(m, CT_RECOMPUTE_AUTO));
  CHECK_OK(ct_model_prepare(m, dev, 1, 1));
  CHECK_MSG(ct_model_plan_bytes(m) == plain && ct_model_recompute_segments(m) == 1 && ct_model_recompute_layers(m) == 0,
            "alexnet-227 auto: plan %zu bytes (plain %zu), %d segments, %d layers rerun", ct_model_plan_bytes(m), plain,
            ct_model_recompute_segments(m), ct_model_recompute_layers(m));
  ct_model_destroy(m);
}

/* The selective mode reruns exactly the convolutions of at most
 * CT_RECOMPUTE_SELECTIVE_MACS multiply-adds per output element whose
 * output a backward keeps: in resnet50 the nine 1x1 convolutions over 64
 * or 128 channels (layer1's three expansions, its first block's
 * reduction and downsampling, layer2's four expansions), none of the
 * 3x3s (576 and more) and not the stem (147). */
static void check_selective_convs(ct_device *dev) {
  ct_model_options opt = {3, 32, 32, 10, 5};
  ct_model *m = NULL;
  CHECK_OK(ct_model_create("resnet50", &opt, &m));
  if (!m) return;
  CHECK_OK(ct_model_set_recompute(m, CT_RECOMPUTE_SELECTIVE));
  CHECK_OK(ct_model_prepare(m, dev, 2, 1));
  int convs = 0;
  for (int i = 0; i < m->n_layers; i++) {
    const ct_layer *l = &m->layers[i];
    if (l->cls != &ct_layer_conv2d || !m->eb->tl.rerun[i]) continue;
    int64_t macs = (int64_t)(l->ip[0] / l->ip[10]) * l->ip[2] * l->ip[3];
    CHECK_MSG(macs <= CT_RECOMPUTE_SELECTIVE_MACS && l->ip[2] == 1 && l->ip[3] == 1,
              "resnet50 selective: %s reruns at %lld multiply-adds per output", l->name, (long long)macs);
    convs++;
  }
  CHECK_MSG(convs == 9, "resnet50 selective: %d convolutions rerun, expected 9", convs);
  ct_model_destroy(m);
}

int main(void) {
  ct_device *dev;
  CHECK_OK(ct_device_open("cpu", &dev));
  char path[] = "/tmp/ctrain_recompute_XXXXXX.txt";
  test_write_temp(path, 4, model_text);
  const int segs[] = {CT_RECOMPUTE_AUTO, 2, CT_RECOMPUTE_MAX};
  /* cnn keeps nothing recompute could save (its first conv output is
   * read by a max pool that keeps indices), so auto leaves it alone; a
   * sequential net cut at every layer has little inside its segments;
   * residual blocks always drop their insides. */
  for (int k = 0; k < 3; k++) {
    compare(dev, "cnn", 1, 28, 28, 8, CT_PRECISION_FP32, segs[k], segs[k] == CT_RECOMPUTE_AUTO ? 0 : 1);
    compare(dev, "alexnet", 3, 64, 64, 2, CT_PRECISION_FP32, segs[k], 2);
    compare(dev, "resnet18", 3, 32, 32, 4, CT_PRECISION_FP32, segs[k], 7);
    compare(dev, path, 3, 20, 20, 4, CT_PRECISION_FP32, segs[k], segs[k] == CT_RECOMPUTE_MAX ? 0 : 2);
  }
  /* convnet's batch-norm ReLUs hand their gradient to the max pools
   * (plan/fuse.h), so its batch-norm outputs are not kept in any mode. */
  compare(dev, "convnet", 1, 28, 28, 6, CT_PRECISION_FP32, 3, 2);
  compare(dev, "vgg11_bn", 3, 32, 32, 2, CT_PRECISION_FP32, CT_RECOMPUTE_AUTO, 4);
  compare(dev, "resnet50", 3, 32, 32, 2, CT_PRECISION_FP32, CT_RECOMPUTE_AUTO, 50);
  /* Mixed precision: cast edges (the input into bf16, the loss's fp32
   * copy) and 16-bit activations, recomputed. */
  compare(dev, "cnn", 1, 28, 28, 8, CT_PRECISION_BF16, 2, 1);
  compare(dev, "resnet18", 3, 32, 32, 4, CT_PRECISION_BF16, CT_RECOMPUTE_AUTO, 4);
  compare(dev, path, 3, 20, 20, 4, CT_PRECISION_BF16, 2, 1);
  compare(dev, path, 3, 20, 20, 4, CT_PRECISION_FP16, 3, 1);
  /* Cheap mode: batch norm, activation, add and dropout outputs rebuilt
   * from the kept convolution outputs (no segments). */
  compare(dev, "resnet18", 3, 32, 32, 4, CT_PRECISION_FP32, CT_RECOMPUTE_CHEAP, 20);
  compare(dev, "resnet18", 3, 32, 32, 4, CT_PRECISION_BF16, CT_RECOMPUTE_CHEAP, 20);
  compare(dev, "resnet50", 3, 32, 32, 2, CT_PRECISION_FP32, CT_RECOMPUTE_CHEAP, 40);
  compare(dev, "vgg11_bn", 3, 32, 32, 2, CT_PRECISION_FP32, CT_RECOMPUTE_CHEAP, 4);
  /* nothing left for the cheap mode in convnet: the same step */
  compare(dev, "convnet", 1, 28, 28, 6, CT_PRECISION_FP32, CT_RECOMPUTE_CHEAP, 0);
  compare(dev, path, 3, 20, 20, 4, CT_PRECISION_FP32, CT_RECOMPUTE_CHEAP, 1);
  compare(dev, path, 3, 20, 20, 4, CT_PRECISION_FP16, CT_RECOMPUTE_CHEAP, 1);
  /* Norm mode: batch-norm outputs alone, rebuilt from the kept
   * convolution outputs and the saved statistics (batchnorm_apply, the
   * forward's bits on the cpu). */
  compare(dev, "resnet18", 3, 32, 32, 4, CT_PRECISION_FP32, CT_RECOMPUTE_NORM, 8);
  compare(dev, "resnet18", 3, 32, 32, 4, CT_PRECISION_BF16, CT_RECOMPUTE_NORM, 8);
  compare(dev, path, 3, 20, 20, 4, CT_PRECISION_FP16, CT_RECOMPUTE_NORM, 0);
  /* Selective mode: norm, and the convolutions of at most 128
   * multiply-adds per output element run again (resnet18's layer2
   * downsample, resnet50's early 1x1 expansions, the file's first and
   * last convolutions), with the rebuilt batch norms they read. */
  compare(dev, "resnet18", 3, 32, 32, 4, CT_PRECISION_FP32, CT_RECOMPUTE_SELECTIVE, 9);
  compare(dev, "resnet18", 3, 32, 32, 4, CT_PRECISION_BF16, CT_RECOMPUTE_SELECTIVE, 9);
  compare(dev, "resnet50", 3, 32, 32, 2, CT_PRECISION_FP32, CT_RECOMPUTE_SELECTIVE, 37);
  compare(dev, "vgg11_bn", 3, 32, 32, 2, CT_PRECISION_FP32, CT_RECOMPUTE_SELECTIVE, 2);
  compare(dev, path, 3, 20, 20, 4, CT_PRECISION_FP32, CT_RECOMPUTE_SELECTIVE, 2);
  compare(dev, path, 3, 20, 20, 4, CT_PRECISION_FP16, CT_RECOMPUTE_SELECTIVE, 2);
  check_auto_is_best(dev, "resnet18", 3, 32, 32, 4);
  check_auto_is_best(dev, "alexnet", 3, 64, 64, 2);
  check_auto_declines(dev);
  check_selective_convs(dev);
  remove(path);
  ct_device_close(dev);

  /* The reference device (plain layouts, its own kernels) too. */
  CHECK_OK(ct_device_open("ref", &dev));
  compare(dev, "cnn", 1, 28, 28, 4, CT_PRECISION_FP32, 2, 1);
  ct_device_close(dev);

  ct_model_options opt = {1, 28, 28, 10, 5};
  ct_model *m = NULL;
  CHECK_OK(ct_model_create("cnn", &opt, &m));
  CHECK(ct_model_set_recompute(m, -5) == CT_ERR_INVALID_ARG);
  CHECK_OK(ct_model_set_recompute(m, CT_RECOMPUTE_SELECTIVE));
  CHECK(ct_model_set_recompute(m, CT_RECOMPUTE_MAX + 1) == CT_ERR_INVALID_ARG);
  CHECK_OK(ct_model_set_recompute(m, 1)); /* one segment: nothing dropped */
  ct_model_destroy(m);
  return test_summary("recompute");
}
