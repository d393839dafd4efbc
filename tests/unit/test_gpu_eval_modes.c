/* ct_evaluate and ct_predict with the GPU data path (label gpu; exit 77,
 * ctest "Skipped", without a CUDA device): one model resident on cuda,
 * the same random uint8 dataset (resized and normalized, a partial last
 * batch) through a CT_LOADER_FLOAT loader (CPU transform), a
 * CT_LOADER_RAW_U8 loader (uint8 batches, transform on the GPU) and two
 * CT_LOADER_INDICES loaders (split resident, gathered on the GPU; one with
 * its device side attached beforehand as ctrain train does, one attached
 * by the pass itself). Loss, top-1 and top-5 must agree to 1e-5 and every
 * sample's probabilities to 1e-5: the GPU transform is bitwise the CPU
 * loader's, so the model sees the same input. Controls: a RAW_U8 loader
 * with another Normalize mean must give another loss (the comparison can
 * fail), and the cuda result is close to the cpu device's (the model
 * really ran). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "ctrain/ctrain.h"
#include "ctrain/trainer.h"
#include "data/gpu_data.h"
#include "test_util.h"

enum { N = 203, C = 3, H = 16, W = 16, OUT = 20, CLASSES = 10, BATCH = 32 };

typedef struct probs_out {
  int64_t count;
  float p[N * CLASSES];
  int64_t label[N];
} probs_out;

static ct_status keep_probs(void *ctx, int64_t index, const float *probs, int64_t k, int64_t label) {
  probs_out *o = ctx;
  if (index != o->count || index >= N || k != CLASSES)
    return ct_error(CT_ERR_INTERNAL, "predict callback: index %lld (expected %lld), %lld classes", (long long)index,
                    (long long)o->count, (long long)k);
  memcpy(o->p + index * k, probs, (size_t)k * sizeof(float));
  o->label[index] = label;
  o->count++;
  return CT_OK;
}

static ct_loader *make_loader(const ct_dataset *ds, int mode, int workers, float mean0) {
  ct_loader_options o;
  ct_loader_options_default(&o);
  o.batch_size = BATCH, o.workers = workers, o.seed = 9, o.mode = mode;
  o.transform.resize_h = o.transform.resize_w = OUT;
  o.transform.normalize = 1;
  for (int k = 0; k < C; k++) o.transform.mean[k] = 0.45f - 0.05f * k, o.transform.std[k] = 0.22f + 0.03f * k;
  o.transform.mean[0] = mean0;
  ct_loader *l = NULL;
  CHECK_OK(ct_loader_create(ds, &o, &l));
  return l;
}

static ct_model *make_model(ct_device *dev) {
  ct_model_options mo = {C, OUT, OUT, CLASSES, 31};
  ct_model *m = NULL;
  CHECK_OK(ct_model_create("cnn", &mo, &m));
  if (m) CHECK_OK(ct_model_prepare(m, dev, BATCH, 0));
  return m;
}

static int close_to(double a, double b, double tol) { return fabs(a - b) <= tol; }

int main(void) {
  ct_device *gpu = NULL, *cpu = NULL;
  if (ct_device_open("cuda", &gpu) != CT_OK) {
    printf("skipped: %s\n", ct_last_error());
    return 77;
  }
  CHECK_OK(ct_device_open("cpu", &cpu));
  ct_rng g;
  ct_rng_init(&g, 4711, CT_RNG_TEST, 0, 0);
  uint8_t *px = malloc((size_t)N * C * H * W);
  int64_t labels[N];
  for (size_t i = 0; i < (size_t)N * C * H * W; i++) px[i] = (uint8_t)ct_rng_u32(&g);
  for (int i = 0; i < N; i++) labels[i] = (int64_t)ct_rng_below(&g, CLASSES);
  ct_dataset *ds = NULL;
  CHECK_OK(ct_dataset_from_memory("rand", N, C, H, W, CLASSES, px, labels, &ds));
  ct_model *m = make_model(gpu), *mc = make_model(cpu);
  if (!ds || !m || !mc) return test_summary("gpu_eval_modes");

  const float mean0 = 0.45f;
  struct {
    const char *name;
    int mode, workers, attach;
  } cs[] = {
      {"float", CT_LOADER_FLOAT, 1, 0},
      {"raw u8", CT_LOADER_RAW_U8, 2, 0},
      {"indices, attached by the pass", CT_LOADER_INDICES, 0, 0},
      {"indices, attached as ctrain train does", CT_LOADER_INDICES, 1, 1},
  };
  enum { NC = sizeof cs / sizeof cs[0] };
  ct_eval_result er[NC];
  static probs_out po[NC];
  for (int i = 0; i < NC; i++) {
    ct_loader *l = make_loader(ds, cs[i].mode, cs[i].workers, mean0);
    ct_gpu_data *gd = NULL;
    if (cs[i].attach) CHECK_OK(ct_gpu_data_create(gpu, l, "test", &gd));
    memset(&er[i], 0, sizeof er[i]);
    CHECK_OK(ct_evaluate(m, gpu, l, CT_LOSS_CROSS_ENTROPY, 0.0f, &er[i]));
    po[i].count = 0;
    CHECK_OK(ct_predict(m, gpu, l, keep_probs, &po[i]));
    /* Twice: a second pass over the same loader (order re-uploaded or
     * the attachment made again) gives the same numbers. */
    ct_eval_result again;
    CHECK_OK(ct_evaluate(m, gpu, l, CT_LOSS_CROSS_ENTROPY, 0.0f, &again));
    CHECK_MSG(again.loss == er[i].loss && again.accuracy == er[i].accuracy, "%s: second pass %.9g vs %.9g",
              cs[i].name, again.loss, er[i].loss);
    ct_loader_destroy(l);
    ct_gpu_data_destroy(gd);
    CHECK_MSG(er[i].samples == N && po[i].count == N, "%s: %lld evaluated, %lld predicted, expected %d", cs[i].name,
              (long long)er[i].samples, (long long)po[i].count, N);
    printf("%-40s loss %.7f  acc %.4f  top5 %.4f\n", cs[i].name, er[i].loss, er[i].accuracy, er[i].top5);
  }
  for (int i = 1; i < NC; i++) {
    CHECK_MSG(close_to(er[i].loss, er[0].loss, 1e-5) && close_to(er[i].accuracy, er[0].accuracy, 1e-5) &&
                  close_to(er[i].top5, er[0].top5, 1e-5),
              "%s: loss %.9g acc %.6f top5 %.6f, float loader %.9g %.6f %.6f", cs[i].name, er[i].loss, er[i].accuracy,
              er[i].top5, er[0].loss, er[0].accuracy, er[0].top5);
    double worst = 0;
    int labels_ok = 1;
    for (int j = 0; j < N * CLASSES; j++) worst = fmax(worst, fabs((double)po[i].p[j] - (double)po[0].p[j]));
    for (int j = 0; j < N; j++) labels_ok &= po[i].label[j] == labels[j] && po[0].label[j] == labels[j];
    CHECK_MSG(worst <= 1e-5, "%s: probabilities differ from the float loader's by %.3g", cs[i].name, worst);
    CHECK_MSG(labels_ok, "%s: predict handed other labels than the dataset's", cs[i].name);
  }
  /* The probabilities are a distribution (the device softmax ran). */
  double row = 0;
  for (int k = 0; k < CLASSES; k++) row += po[0].p[k];
  CHECK_MSG(fabs(row - 1) < 1e-5, "probabilities of sample 0 sum to %.9g", row);

  /* Negative control: another Normalize mean on the GPU path must show. */
  ct_loader *lneg = make_loader(ds, CT_LOADER_RAW_U8, 0, mean0 + 0.3f);
  ct_eval_result en;
  CHECK_OK(ct_evaluate(m, gpu, lneg, CT_LOSS_CROSS_ENTROPY, 0.0f, &en));
  ct_loader_destroy(lneg);
  CHECK_MSG(fabs(en.loss - er[0].loss) > 1e-4, "changed transform not seen: loss %.9g vs %.9g", en.loss, er[0].loss);

  /* The model really ran: the cpu device agrees to a loose tolerance
   * (cuDNN may pick TF32 or other summation orders). */
  ct_loader *lc = make_loader(ds, CT_LOADER_FLOAT, 1, mean0);
  ct_eval_result ec;
  CHECK_OK(ct_evaluate(mc, cpu, lc, CT_LOSS_CROSS_ENTROPY, 0.0f, &ec));
  ct_loader_destroy(lc);
  CHECK_MSG(fabs(ec.loss - er[0].loss) <= 2e-2 * fabs(ec.loss), "cuda loss %.9g vs cpu %.9g", er[0].loss, ec.loss);

  ct_model_destroy(m);
  ct_model_destroy(mc);
  ct_dataset_close(ds);
  free(px);
  ct_device_close(cpu);
  ct_device_close(gpu);
  return test_summary("gpu_eval_modes");
}
